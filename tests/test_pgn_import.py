"""`data import-pgn` (data/pgn_import.py) on small real PGN files (plain, gzip, zstd) with the real Stockfish."""

from __future__ import annotations

import collections
import gzip
import io
import logging

import chess
import chess.pgn
import pyarrow as pa
import pytest

from chessgrpo.board import move_to_action
from chessgrpo.cli import main
from chessgrpo.data import schema
from chessgrpo.data.pgn_import import ImportPgnConfig, import_pgn, open_pgn
from chessgrpo.engine import EnginePool

NODES, MULTIPV = 200, 3

OPERA_GAME = """[Event "Paris"]
[White "Paul Morphy"]
[Black "Duke Karl / Count Isouard"]
[Result "1-0"]
[WhiteElo "2690"]
[BlackElo "2100"]

1. e4 e5 2. Nf3 d6 3. d4 Bg4 4. dxe5 Bxf3 5. Qxf3 dxe5 6. Bc4 Nf6 7. Qb3 Qe7
8. Nc3 c6 9. Bg5 b5 10. Nxb5 cxb5 11. Bxb5+ Nbd7 12. O-O-O Rd8 13. Rxd7 Rxd7
14. Rd1 Qe6 15. Bxd7+ Nxd7 16. Qb8+ Nxb8 17. Rd8# 1-0
"""
LEGALS_MATE = """[Event "Paris"]
[White "Legal de Kermeur"]
[Black "Saint Brie"]
[Result "1-0"]
[WhiteElo "2200"]
[BlackElo "2050"]

1. e4 e5 2. Nf3 d6 3. Bc4 Bg4 4. Nc3 g6 5. Nxe5 Bxd1 6. Bxf7+ Ke7 7. Nd5# 1-0
"""
SCHOLARS_MATE_LOW_ELO = """[Event "Club"]
[White "A"]
[Black "B"]
[Result "1-0"]
[WhiteElo "900"]
[BlackElo "2400"]

1. e4 e5 2. Qh5 Nc6 3. Bc4 Nf6 4. Qxf7# 1-0
"""
ILLEGAL_MOVE = """[Event "Broken"]
[White "C"]
[Black "D"]
[Result "*"]
[WhiteElo "2500"]
[BlackElo "2500"]

1. e4 e5 2. Ke3 Nc6 *
"""
PGN_TEXT = "\n".join([OPERA_GAME, LEGALS_MATE, SCHOLARS_MATE_LOW_ELO, ILLEGAL_MOVE])


def game_keys(pgn_text: str) -> set[str]:
    """Position keys of every non-terminal mainline position, computed directly with python-chess."""
    game = chess.pgn.read_game(io.StringIO(pgn_text))
    board, keys = game.board(), set()
    for move in [*game.mainline_moves(), None]:
        if not board.is_game_over():
            keys.add(schema.position_key(board.fen()))
        if move is not None:
            board.push(move)
    return keys


@pytest.fixture(scope="module")
def pool():
    with EnginePool(processes=2, nodes=NODES) as engine_pool:
        yield engine_pool


@pytest.fixture()
def pgn_files(tmp_path):
    plain = tmp_path / "games.pgn"
    plain.write_text(PGN_TEXT)
    gz = tmp_path / "games.pgn.gz"
    gz.write_bytes(gzip.compress(PGN_TEXT.encode()))
    zst = tmp_path / "games.pgn.zst"
    with pa.CompressedOutputStream(str(zst), "zstd") as stream:
        stream.write(PGN_TEXT.encode())
    return {"pgn": plain, "gz": gz, "zst": zst}


def config(pgn, out, **changes) -> ImportPgnConfig:
    settings = dict(pgn=str(pgn), out=str(out), nodes=NODES, multipv=MULTIPV, min_elo=2000, positions_per_game=None)
    settings.update(changes)
    return ImportPgnConfig(**settings)


def test_every_ply_of_the_games_above_the_elo_filter(pool, pgn_files, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="chessgrpo.data.pgn_import"):
        summary = import_pgn(config(pgn_files["pgn"], tmp_path / "out"), pool=pool)
    counts = summary.games
    assert (counts.games_read, counts.games_used, counts.skipped_elo, counts.skipped_malformed) == (4, 2, 1, 1)
    # The malformed game is named (its number, players, event) with the illegal move, in one warning.
    [warning] = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert "game 4 (" in warning and "Broken" in warning and "illegal san: 'Ke3'" in warning
    rows = schema.read_positions(tmp_path / "out").to_pylist()
    expected = game_keys(OPERA_GAME) | game_keys(LEGALS_MATE)  # the shared opening counted once
    assert {schema.position_key(row["fen"]) for row in rows} == expected and len(rows) == len(expected) == summary.total
    for row in rows:
        board = chess.Board(row["fen"])
        assert row["source"] == "pgn" and row["best_move"] == row["moves"][0]
        assert row["best_action"] == move_to_action(row["best_move"])
        assert all(chess.Move.from_uci(move) in board.legal_moves for move in row["moves"])
        assert all(a >= b for a, b in zip(row["win_probs"], row["win_probs"][1:]))
    for split in schema.SPLITS:
        split_fens = schema.read_positions(tmp_path / "out", split).column("fen").to_pylist()
        assert all(schema.split_of(fen, 0.05) == split for fen in split_fens)
    # Legal's mate before 7. Nd5# (White to move) and before 6...Ke7 (Black, forced): known labels.
    game = chess.pgn.read_game(io.StringIO(LEGALS_MATE))
    by_key = {schema.position_key(row["fen"]): row for row in rows}
    mate_next = by_key[schema.position_key(game.end().parent.board().fen())]
    assert (mate_next["best_move"], mate_next["value"]) == ("c3d5", 1.0)
    only_move = by_key[schema.position_key(game.end().parent.parent.board().fen())]
    assert only_move["moves"] == ["e8e7"] and only_move["value"] < 0.1  # Black's only legal move
    # Each row keeps the move played from it and the players' ratings (first game read for shared positions;
    # tests/test_human_moves.py checks every game column ply by ply).
    expected_game: dict[str, tuple] = {}
    for text, elos in ((OPERA_GAME, (2690, 2100)), (LEGALS_MATE, (2200, 2050))):
        game = chess.pgn.read_game(io.StringIO(text))
        board = game.board()
        for move in [*game.mainline_moves(), None]:
            mover = elos[0] if board.turn == chess.WHITE else elos[1]
            expected_game.setdefault(schema.position_key(board.fen()), (move.uci() if move else None, mover, "1-0"))
            if move is not None:
                board.push(move)
    for row in rows:
        assert (row["human_move"], row["mover_rating"], row["result"]) == expected_game[schema.position_key(row["fen"])]
    assert sum(row["human_move"] is None for row in rows) == 0  # both games end in mate: no last position to label
    manifest = schema.read_manifest(tmp_path / "out")
    assert manifest["complete"] and manifest["games"]["skipped_malformed"] == 1 and manifest["positions"] == len(rows)
    # A rerun finds the import complete and changes nothing.
    again = import_pgn(config(pgn_files["pgn"], tmp_path / "out"), pool=pool)
    assert again.already_complete and again.added == 0 and again.total == len(rows)


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_compressed_files_give_the_same_positions(pool, pgn_files, tmp_path, kind):
    import_pgn(config(pgn_files[kind], tmp_path / kind), pool=pool)
    fens = sorted(schema.read_positions(tmp_path / kind).column("fen").to_pylist())
    assert fens and fens == sorted(
        [
            fen
            for split in schema.SPLITS
            for fen in schema.read_positions(tmp_path / kind, split).column("fen").to_pylist()
        ]
    )
    expected = game_keys(OPERA_GAME) | game_keys(LEGALS_MATE)
    assert {schema.position_key(fen) for fen in fens} == expected


def test_sampling_per_game_is_reproducible_and_max_games_stops(pool, pgn_files, tmp_path):
    first = import_pgn(config(pgn_files["pgn"], tmp_path / "a", positions_per_game=4, min_elo=None, seed=3), pool=pool)
    second = import_pgn(config(pgn_files["gz"], tmp_path / "b", positions_per_game=4, min_elo=None, seed=3), pool=pool)
    fens_a = sorted(schema.read_positions(tmp_path / "a").column("fen").to_pylist())
    assert fens_a == sorted(schema.read_positions(tmp_path / "b").column("fen").to_pylist())
    assert first.games.games_used == 3 and first.total <= 12 and second.total == first.total
    one = import_pgn(config(pgn_files["pgn"], tmp_path / "c", max_games=1), pool=pool)
    assert one.games.games_read == 1 and one.total == len(game_keys(OPERA_GAME))


def test_bad_inputs_give_one_clear_error(tmp_path, pgn_files, capsys):
    truncated = tmp_path / "truncated.pgn.gz"
    truncated.write_bytes(pgn_files["gz"].read_bytes()[:60])
    not_pgn = tmp_path / "noise.pgn"
    not_pgn.write_bytes(bytes(range(256)) * 4)
    cases = [
        ([str(tmp_path / "missing.pgn"), "--out", str(tmp_path / "o1")], "missing.pgn"),
        ([str(truncated), "--out", str(tmp_path / "o2")], "truncated.pgn.gz"),
        ([str(not_pgn), "--out", str(tmp_path / "o3")], "noise.pgn"),
        ([str(pgn_files["pgn"]), "--out", str(pgn_files["gz"])], "is a file"),
        ([str(pgn_files["pgn"]), "--out", str(tmp_path / "o4"), "--positions-per-game", "0"], "positions_per_game"),
    ]
    for args, message in cases:
        assert main(["data", "import-pgn", *args, "--nodes", str(NODES)]) == 2, args
        assert message in capsys.readouterr().err
    # The malformed game is counted, not fatal, through the command too.
    assert (
        main(
            [
                "data",
                "import-pgn",
                str(pgn_files["pgn"]),
                "--out",
                str(tmp_path / "ok"),
                "--nodes",
                str(NODES),
                "--multipv",
                str(MULTIPV),
                "--every-ply",
                "engine.processes=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "read 4 games (3 used" in out and "1 malformed" in out
    assert collections.Counter(schema.read_positions(tmp_path / "ok").column("source").to_pylist()).keys() == {"pgn"}


def test_a_latin1_file_imports_the_same_positions_and_says_it_is_not_utf8(pool, tmp_path, caplog):
    """Older PGN files are ISO-8859-1, the PGN standard's character set: their bytes that are not
    UTF-8 are read as Latin-1 (names intact), the games are not lost, and a warning names the file."""
    text = OPERA_GAME.replace("Duke Karl / Count Isouard", "Herzog Karl von Braunschweig-Lüneburg")
    latin1 = tmp_path / "latin1.pgn"
    latin1.write_bytes(text.encode("latin-1"))
    utf8 = tmp_path / "utf8.pgn"
    utf8.write_text(text, encoding="utf-8")
    with caplog.at_level("WARNING"):
        from_latin1 = import_pgn(config(latin1, tmp_path / "a"), pool=pool)
    assert "latin1.pgn" in caplog.text and "ISO-8859-1" in caplog.text
    from_utf8 = import_pgn(config(utf8, tmp_path / "b"), pool=pool)
    assert from_latin1.games.games_used == 1 == from_utf8.games.games_used
    fens = {key: sorted(schema.read_positions(tmp_path / key).column("fen").to_pylist()) for key in ("a", "b")}
    assert fens["a"] == fens["b"] and len(fens["a"]) == len(game_keys(OPERA_GAME))
    with open_pgn(latin1) as handle:
        assert "Braunschweig-Lüneburg" in chess.pgn.read_game(handle).headers["Black"]
