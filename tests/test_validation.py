"""Untrusted positions and moves are parsed and validated with one clear error."""

from __future__ import annotations

import chess
import pytest

from chessgrpo.board import parse_board, parse_move, random_playout_positions, read_fen_file


def test_valid_fens_and_boards():
    board = parse_board("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1")
    assert board.turn == chess.BLACK
    original = chess.Board()
    copy = parse_board(original)
    copy.push_san("e4")
    assert original.fen() == chess.STARTING_FEN  # the caller's board is never mutated
    assert parse_board("8/8/8/4k3/8/8/8/3QK3 w - -").fullmove_number == 1  # 4-field EPD style


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "8/8/8/8/8/8/8/K6k w - - 0 1\nquit",
        "8/8/8/8/8/8/8/K6k w - - 0 1\rgo",
        "8/8/8/8/8/8/8/8 w - - 0 1",  # no kings
        "K7/8/8/8/8/8/8/K6k w - - 0 1",  # two white kings
        "P3k3/8/8/8/8/8/8/4K3 w - - 0 1",  # pawn on the back rank
        "4k3/8/8/8/8/8/8/4K2R w - - 0 1 extra",
        "4k3/8/8/8/8/8/8/4K2R x - - 0 1",
        "4k3/8/8/9/8/8/8/4K2R w - - 0 1",
        "4k3/4R3/8/8/8/8/8/4K3 w - - 0 1",  # side not to move is in check
        "x" * 200,
    ],
)
def test_bad_fens_raise_valueerror_naming_the_input(bad):
    with pytest.raises(ValueError) as raised:
        parse_board(bad)
    assert repr(bad)[:30] in str(raised.value)


def test_non_string_input():
    with pytest.raises(ValueError, match="expected a FEN"):
        parse_board(None)  # type: ignore[arg-type]


def test_parse_move():
    board = chess.Board()
    assert parse_move(board, "e2e4") == chess.Move.from_uci("e2e4")
    for bad in ["e2e5", "e7e5", "zz", "e2e4\nquit", "a1a1"]:
        with pytest.raises(ValueError, match="move"):
            parse_move(board, bad)


def test_random_playouts_are_reproducible_distinct_and_playable():
    first = random_playout_positions(50, seed=1)
    second = random_playout_positions(50, seed=1)
    other = random_playout_positions(50, seed=2)
    assert [b.fen() for b in first] == [b.fen() for b in second]
    assert [b.fen() for b in first] != [b.fen() for b in other]
    assert len({b.epd() for b in first}) == 50
    assert all(not b.is_game_over() for b in first)


def test_fen_file_with_epd_comments_and_a_bad_line(tmp_path):
    path = tmp_path / "positions.epd"
    path.write_text(
        "# a comment\n\n"
        "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1\n"
        'r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - bm Bb5; id "x";\n'
    )
    boards = list(read_fen_file(path))
    assert len(boards) == 2 and boards[1].piece_at(chess.C6) == chess.Piece.from_symbol("n")
    path.write_text("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1\nnot a fen\n")
    with pytest.raises(ValueError, match=r"positions.epd:2"):
        list(read_fen_file(path))
