"""Opening suites: reproducible balanced generation with real Stockfish, and file input errors."""

from __future__ import annotations

import chess
import pytest

from chessgrpo.board.openings import Opening, generate_openings, read_openings
from chessgrpo.engine import EnginePool

NODES = 500
MAX_CP = 60


@pytest.fixture(scope="module")
def centipawns():
    with EnginePool(processes=2, nodes=NODES) as pool:

        def evaluate(boards):
            return [e.cp if e.mate is None else None for e in pool.evaluate(boards)]

        yield evaluate


def test_generated_openings_are_balanced_distinct_and_reproducible(centipawns):
    first = generate_openings(6, centipawns, seed=7, max_cp=MAX_CP)
    again = generate_openings(6, centipawns, seed=7, max_cp=MAX_CP)
    other = generate_openings(6, centipawns, seed=8, max_cp=MAX_CP)
    assert first == again
    assert [o.fen for o in first] != [o.fen for o in other]
    assert len({chess.Board(o.fen).epd() for o in first}) == 6
    for opening in first:
        board = opening.board()
        assert board.fen() == opening.fen and 4 <= len(opening.moves) <= 8
        assert not board.is_game_over() and opening.source == "generated"
        assert opening.cp is not None and abs(opening.cp) < MAX_CP
    # The kept evaluations are real: re-evaluating gives the same balanced numbers.
    assert centipawns([chess.Board(o.fen) for o in first]) == [o.cp for o in first]


def test_generation_gives_up_with_a_clear_error(centipawns):
    with pytest.raises(RuntimeError, match="found only 0 of 3 balanced openings"):
        generate_openings(3, lambda boards: [500] * len(boards), max_candidates=20)
    with pytest.raises(ValueError):
        generate_openings(3, centipawns, min_plies=5, max_plies=4)


def test_read_fen_and_epd_lines(tmp_path):
    path = tmp_path / "openings.epd"
    path.write_text(
        "# a comment\n\n"
        "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1\n"
        'rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - bm Nf3; id "open game";\n'
    )
    openings = read_openings(path)
    assert [o.source for o in openings] == [f"{path}:3", f"{path}:4"]
    assert openings[1].fen == "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 1"
    assert openings[0].board().turn == chess.BLACK


def test_read_pgn_keeps_moves(tmp_path):
    path = tmp_path / "openings.pgn"
    path.write_text(
        '[Event "a"]\n\n1. e4 c5 2. Nf3 *\n\n'
        '[Event "b"]\n[SetUp "1"]\n[FEN "4k3/8/8/8/8/8/4P3/4K3 w - - 0 1"]\n\n1. e4 Kd7 *\n'
    )
    sicilian, endgame = read_openings(path)
    assert sicilian.moves == ("e2e4", "c7c5", "g1f3")
    assert sicilian.board().fen() == sicilian.fen and sicilian.source == f"{path}:1"
    assert endgame.moves == () and endgame.fen == "8/3k4/8/8/4P3/8/8/4K3 w - - 1 2"
    assert endgame.source == f"{path}:5"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "bad.epd",
            "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1\nnot a fen at all\n",
            r"bad\.epd:2: malformed FEN",
        ),
        ("nokings.fen", "8/8/8/8/8/8/8/8 w - - 0 1\n", r"nokings\.fen:1: invalid position"),
        ("mated.txt", "# mate\n7k/6Q1/6K1/8/8/8/8/8 b - - 0 1\n", r"mated\.txt:2: the game is already over"),
        (
            "illegal.pgn",
            '[Event "ok"]\n\n1. e4 e5 *\n\n[Event "bad"]\n\n1. e4 e4 *\n',
            r"illegal\.pgn:5: PGN game 2 is malformed",
        ),
        ("empty.epd", "# nothing here\n", r"empty\.epd: no openings found"),
    ],
)
def test_bad_opening_files_name_the_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_openings(path)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_openings(tmp_path / "nope.epd")
    binary = tmp_path / "binary.epd"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        read_openings(binary)


def test_opening_board_without_moves():
    opening = Opening(fen="4k3/8/8/8/8/8/4P3/4K3 w - - 0 1")
    assert opening.board().fen() == opening.fen and not opening.board().move_stack
