"""EPD test suites (`chessgrpo eval epd`): bm/am parsing, scoring, bad lines, the CLI."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import chess
import pytest

from chessgrpo.eval.epd import parse_epd, read_epd, solve_epd

SUITE = Path(__file__).resolve().parent / "data" / "epd_suite.epd"

# The suite written out by hand, independent of the EPD parser: id -> (FEN, bm moves, am moves) in UCI.
EXPECTED = {
    "backrank.white": ("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", {"a1a8"}, set()),
    "backrank.black": ("r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1", {"a8a1"}, set()),
    "lichess.8SSQX": ("6r1/p4p1k/5Pp1/1p4P1/5PKq/3p3R/7P/8 w - - 0 1", {"h3h4"}, set()),
    "lichess.VT6HX": ("Q3q1k1/6p1/3p1pPp/2p2P1P/3p4/8/3P4/4K3 w - - 0 1", {"a8e8"}, set()),
    "lichess.usGrm": ("7k/7P/2p1p1KN/2PpP3/3P4/8/1pn5/8 w - - 0 1", {"h6f7"}, set()),
    "scholar": ("r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 0 1", {"h5f7"}, {"h5e5"}),
    "fool.mate": ("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 1", {"d8h4"}, set()),
    "fool.blunder": ("rnbqkbnr/pppp1ppp/8/4p3/8/5P2/PPPPP1PP/RNBQKBNR w KQkq - 0 1", set(), {"g2g4"}),
    "queen.hangs": ("rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 0 1", set(), {"d8h4"}),
}
MATES = {name for name, (_, best, _) in EXPECTED.items() if best}


def tiny_checkpoint(directory: Path) -> Path:
    import torch

    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True)), directory)


def argmax_moves(checkpoint: Path, boards: list[chess.Board]) -> list[chess.Move]:
    """The model's own argmax over each board's legal moves, read off its logits one move at a time."""
    import torch

    from chessgrpo.board import move_to_action
    from chessgrpo.models.policy import load_policy

    model = load_policy(checkpoint).eval()
    moves = []
    with torch.no_grad():
        for board in boards:
            tokens, _ = model.inputs([board])
            logits = model(tokens)[0]
            moves.append(max(board.legal_moves, key=lambda move: float(logits[move_to_action(move)])))
    return moves


def test_the_suite_parses_and_its_answers_hold():
    suite = read_epd(SUITE)
    assert suite.skipped == () and [p.id for p in suite.positions] == list(EXPECTED)
    for position in suite.positions:
        fen, best, avoid = EXPECTED[position.id]
        assert position.board.fen() == fen
        assert {m.uci() for m in position.best} == best and {m.uci() for m in position.avoid} == avoid
        mates = set()
        for move in position.board.legal_moves:
            position.board.push(move)
            if position.board.is_checkmate():
                mates.add(move.uci())
            position.board.pop()
        assert mates == best or not best  # every bm is the only mate in one
    scholar = parse_epd("r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - bm Qxf7#; am Qxe5+;")
    assert scholar.solved_by(chess.Move.from_uci("h5f7")) and not scholar.solved_by(chess.Move.from_uci("h5e5"))
    assert not scholar.solved_by(chess.Move.from_uci("c4b5"))  # not a bm move
    only_avoid = parse_epd("rnbqkbnr/pppp1ppp/8/4p3/8/5P2/PPPPP1PP/RNBQKBNR w KQkq - am g4;")
    assert only_avoid.id is None and only_avoid.solved_by(chess.Move.from_uci("b1c3"))
    counters = parse_epd('6k1/5ppp/8/8/8/8/8/R5K1 w - - 3 40 bm Ra8#; id "full fen";')  # six position fields
    assert counters.board.fen() == "6k1/5ppp/8/8/8/8/8/R5K1 w - - 3 40" and counters.id == "full fen"


def test_cli_epd_solved_count_is_the_models_own_argmax_count(cli, tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    boards = [chess.Board(fen) for fen, _, _ in EXPECTED.values()]
    chosen = argmax_moves(checkpoint, boards)
    solved = [
        (not best or move.uci() in best) and move.uci() not in avoid
        for move, (_, best, avoid) in zip(chosen, EXPECTED.values())
    ]
    expected = sum(solved)
    assert 0 < expected < len(EXPECTED)  # the suite tells this model's moves apart

    output = tmp_path / "epd.json"
    code, out, err = cli.main(
        "eval",
        "epd",
        "--checkpoint",
        str(checkpoint),
        "--epd",
        str(SUITE),
        "--json",
        "baselines=false",
        f"output={output}",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["solved_count"] == expected and report["solved"]["n"] == len(EXPECTED)
    assert report["solved"]["value"] == pytest.approx(expected / len(EXPECTED))
    assert report["solved"]["low"] <= report["solved"]["value"] <= report["solved"]["high"]
    assert report["epd"] == {"source": str(SUITE), "n": len(EXPECTED), "skipped": 0} and report["search"] is None
    records = json.loads(output.read_text())["records"]["player"]
    assert [r["id"] for r in records] == list(EXPECTED)
    assert [r["move"] for r in records] == [m.uci() for m in chosen] and [r["solved"] for r in records] == solved

    code, out, err = cli.main(
        "eval", "epd", "--checkpoint", str(checkpoint), "--epd", str(SUITE), "-v", "baselines=false"
    )
    assert code == 0, err
    assert f"{expected}/{len(EXPECTED)}" in out and "Wilson" in out
    lines = [line for line in out.splitlines() if line.startswith(("  solved  ", "  missed  "))]
    assert len(lines) == len(EXPECTED) and sum(line.startswith("  solved") for line in lines) == expected
    assert "  missed  scholar: played" in out or "  solved  scholar: played" in out
    assert "(bm Qxf7#; am Qxe5+)" in out


def test_cli_epd_with_search_mates_in_one(cli, tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    result = cli.run(
        "eval",
        "epd",
        "--checkpoint",
        str(checkpoint),
        "--epd",
        str(SUITE),
        "--search-nodes",
        "8",
        "--json",
        "baselines=false",
        "engine.syzygy_path=null",
        f"output={tmp_path / 'out.json'}",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["player"] == f"{checkpoint} (puct 8 nodes)" and report["search"]["nodes"] == 8
    records = json.loads((tmp_path / "out.json").read_text())["records"]["player"]
    assert all(r["solved"] for r in records if r["id"] in MATES)  # a search scores a mate in one exactly


def test_bad_lines_are_skipped_with_a_warning_naming_file_and_line(cli, tmp_path, caplog):
    good = SUITE.read_text().splitlines()[-1]  # queen.hangs
    long_fen = "8/" * 3000 + "8 w - -"
    lines = [
        "# a comment",  # 1
        "",  # 2
        good,  # 3
        "not an epd line",  # 4
        '6k1/5ppp/8/8/8/8/8/R5K1 w - - id "no bm or am";',  # 5
        '6k1/5ppp/8/8/8/8/8/R5K1 w - - bm Qa8#; id "illegal";',  # 6
        f"{long_fen} bm e4;",  # 7
        "R5k1/8/8/8/8/8/8/6K1 w - - bm Kf2;",  # 8: the side not to move is in check
        '7k/5Q2/6K1/8/8/8/8/8 b - - id "stalemate";',  # 9: no legal move
        "6k1/5ppp/8/8/8/8/8/R5K1 w - - bm Ra8#; am Ra8#;",  # 10: bm all avoided
    ]
    path = tmp_path / "bad.epd"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="chessgrpo.eval.epd"):
        suite = read_epd(path)
    assert [p.line for p in suite.positions] == [3]
    assert [s.line for s in suite.skipped] == [4, 5, 6, 7, 8, 9, 10]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for number in (4, 5, 6, 7, 8, 9, 10):
        [message] = [w for w in warnings if w.startswith(f"{path}:{number}: skipped: ")]
        assert "\n" not in message and len(message) < len(str(path)) + 400, message
    assert "illegal san: 'Qa8#'" in suite.skipped[2].reason and "no bm or am" in suite.skipped[1].reason
    assert (
        f"({len(lines[6])} characters)" in suite.skipped[3].reason and len(suite.skipped[3].reason) < 400
    )  # a short echo
    assert suite.skipped[4].reason.startswith("invalid position") and "opposite check" in suite.skipped[4].reason
    assert "no legal moves" in suite.skipped[5].reason and "every bm move is also an am move" in suite.skipped[6].reason
    assert any("skipped 7 bad EPD lines" in w for w in warnings)
    with pytest.raises(ValueError, match=r"bad.epd:4: not an EPD record"):
        read_epd(path, strict=True)

    only_bad = tmp_path / "only_bad.epd"
    only_bad.write_text("not an epd line\n")
    with pytest.raises(ValueError, match="holds no usable record"):
        read_epd(only_bad)
    with pytest.raises(FileNotFoundError, match="missing.epd"):
        read_epd(tmp_path / "missing.epd")

    # The command scores what is left and says how many lines it skipped.
    code, out, err = cli.main("eval", "epd", "--policy", "random", "--epd", str(path), "baselines=false")
    assert code == 0, err
    assert f"epd: 1 positions from {path} (7 bad lines skipped)" in out


def test_compressed_suite_and_random_player(tmp_path):
    import pyarrow as pa

    from chessgrpo.play.players import RandomPlayer

    zst = tmp_path / "suite.epd.zst"
    with pa.CompressedOutputStream(str(zst), "zstd") as stream:
        stream.write(SUITE.read_bytes())
    suite = read_epd(zst)
    assert [p.id for p in suite.positions] == list(EXPECTED)
    result = solve_epd(RandomPlayer(0), suite.positions, batch_size=4)
    assert result.solved.n == len(EXPECTED) and len(result.records) == len(EXPECTED)
    assert result.solved_count == sum(
        (not EXPECTED[r.id][1] or r.move in EXPECTED[r.id][1]) and r.move not in EXPECTED[r.id][2]
        for r in result.records
    )
