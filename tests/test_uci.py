"""`chessgrpo uci`: driven by python-chess's engine client, through a raw pipe and in-process
(`UciEngine` over `io.StringIO`); search with a value-head checkpoint, policy-only play without."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import chess
import chess.engine
import pytest
import torch
from helpers import SYZYGY_DIR

from chessgrpo.eval.uci_engine import MAX_NODES, GoLimits, UciEngine, clock_seconds, movetime_seconds, parse_go, parse_position
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

STARTUP_TIMEOUT_S = 60.0  # torch import on a busy 2-core machine


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path_factory.mktemp("uci") / "ckpt")


@pytest.fixture(scope="module")
def value_checkpoint(tmp_path_factory):
    """A tiny untrained policy with a value head: search finds mates through exact terminal values."""
    torch.manual_seed(0)
    policy = ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True))
    return save_policy(policy, tmp_path_factory.mktemp("uci_value") / "ckpt")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """As `chessgrpo uci` does: on a busy 2-core machine, torch's threads only slow small batches down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def command(checkpoint, *extra: str) -> list[str]:
    return [sys.executable, "-m", "chessgrpo.cli", "uci", "--checkpoint", str(checkpoint), *extra]


def test_python_chess_plays_legal_moves(checkpoint):
    engine = chess.engine.SimpleEngine.popen_uci(command(checkpoint), timeout=STARTUP_TIMEOUT_S)
    try:
        assert engine.id["name"] == "chessgrpo ckpt" and engine.id["author"] == "chessgrpo"
        assert engine.options["Temperature"].default == "0" and engine.options["Device"].default == "cpu"
        assert engine.options["Search"].default == "puct" and engine.options["Nodes"].default == 256
        board = chess.Board()
        result = engine.play(board, chess.engine.Limit(time=0.1))
        assert result.move in board.legal_moves
        # A position given as FEN + moves (python-chess sends "position fen ... moves ...").
        board = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
        for move in ["f1c4", "g8f6", "d2d3"]:
            board.push_uci(move)
        for limit in (chess.engine.Limit(depth=3), chess.engine.Limit(nodes=100), chess.engine.Limit(white_clock=10, black_clock=10)):
            result = engine.play(board, limit)
            assert result.move in board.legal_moves
        engine.configure({"Temperature": "1.5"})
        for _ in range(3):
            assert engine.play(board, chess.engine.Limit(time=0.1)).move in board.legal_moves
        # A whole short game against itself stays legal.
        board = chess.Board()
        for _ in range(12):
            move = engine.play(board, chess.engine.Limit(time=0.01)).move
            assert move in board.legal_moves
            board.push(move)
    finally:
        engine.quit()


def test_raw_pipe_survives_malformed_commands(checkpoint):
    script = "\n".join(
        [
            "uci",
            "isready",
            "position startpos moves e2e4 e7e5",
            "position fen 8/8/8/8 w - - 0 1",  # bad FEN: keeps 1. e4 e5
            "position startpos moves e2e4 e2e4",  # illegal move: keeps 1. e4 e5
            "position fen rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 garbage",
            "position banana",
            "go wtime 1000 btime 1000",
            "setoption name Temperature value -3",
            "setoption name Device value not-a-device",
            "setoption name Nonsense value 1",
            "setoption",
            "frobnicate the engine",
            "\x00\x01\xff garbage",
            "go movetime 10",
            "stop",
            "position fen 7k/6Q1/6K1/8/8/8/8/8 b - - 0 1",  # Black is checkmated
            "go infinite",
            "isready",
            "quit",
        ]
    )
    completed = subprocess.run(command(checkpoint), input=script + "\n", capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines.count("readyok") == 2 and "uciok" in lines
    assert "option name Temperature type string default 0" in lines
    bestmoves = [line.split()[1] for line in lines if line.startswith("bestmove")]
    assert len(bestmoves) == 3
    after_e4_e5 = chess.Board()
    for move in ["e2e4", "e7e5"]:
        after_e4_e5.push_uci(move)
    assert chess.Move.from_uci(bestmoves[0]) in after_e4_e5.legal_moves
    assert chess.Move.from_uci(bestmoves[1]) in after_e4_e5.legal_moves
    assert bestmoves[2] == "0000"
    errors = [line for line in lines if line.startswith("info string error")]
    assert len(errors) >= 6  # two bad FENs, an illegal move, a bad setup, two bad option values, ...
    assert any("unknown command ignored: frobnicate" in line for line in lines)
    assert sum(line.startswith("info depth") for line in lines) == 2


def test_python_chess_searches_with_a_value_head(value_checkpoint):
    engine = chess.engine.SimpleEngine.popen_uci(command(value_checkpoint, "--nodes", "32"), timeout=STARTUP_TIMEOUT_S)
    try:
        assert engine.options["Nodes"].default == 32 and engine.options["MultiPV"].max == 16
        board = chess.Board()
        for move in ["e2e4", "e7e5", "g1f3"]:
            board.push_uci(move)
        result = engine.play(board, chess.engine.Limit(nodes=64), info=chess.engine.INFO_ALL)
        assert result.move in board.legal_moves
        assert result.info["nodes"] <= 64 and result.info["pv"][0] == result.move
        assert result.info["score"].relative.score() is not None
        mate = chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")
        result = engine.play(mate, chess.engine.Limit(nodes=200), info=chess.engine.INFO_SCORE)
        assert result.move == chess.Move.from_uci("a1a8") and result.info["score"].relative == chess.engine.Mate(1)
        infos = engine.analyse(board, chess.engine.Limit(nodes=64), multipv=3)
        assert [info["multipv"] for info in infos] == [1, 2, 3]
        engine.configure({"Search": "alphabeta"})
        assert engine.play(board, chess.engine.Limit(time=0.2)).move in board.legal_moves
    finally:
        engine.quit()


# ------------------------------------------------------------------------------------------------
# In process: `UciEngine` over StringIO


def talk(checkpoint, *commands: str, **options) -> list[str]:
    """The engine's output lines for `commands` (then quit)."""
    output = io.StringIO()
    engine = UciEngine(checkpoint, input=io.StringIO("\n".join([*commands, "quit"]) + "\n"), output=output, **options)
    assert engine.run() == 0
    return output.getvalue().splitlines()


def bestmoves(lines: list[str]) -> list[str]:
    return [line.split()[1] for line in lines if line.startswith("bestmove")]


def search_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("info depth") and " multipv " in line]


MATE_IN_ONE = "position fen 6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"


def test_uci_lists_the_search_options(value_checkpoint):
    lines = talk(value_checkpoint, "uci")
    for option in (
        "option name Search type combo default puct var puct var alphabeta var none",
        f"option name Nodes type spin default 256 min 1 max {MAX_NODES}",
        "option name MultiPV type spin default 1 min 1 max 16",
        "option name SyzygyPath type string default <empty>",
        "option name Temperature type string default 0",
        "option name Device type string default cpu",
    ):
        assert option in lines
    assert lines[-1] == "uciok"


def test_search_finds_mate_in_one_and_reports_multipv(value_checkpoint):
    lines = talk(value_checkpoint, MATE_IN_ONE, "go nodes 200")
    assert bestmoves(lines) == ["a1a8"]
    [first] = search_lines(lines)  # a mate in one at the root is played without searching
    assert " multipv 1 score mate 1 " in first and first.endswith(" pv a1a8")
    lines = talk(value_checkpoint, "setoption name MultiPV value 3", "position startpos", "go nodes 200")
    multipv = search_lines(lines)
    assert [line.split(" multipv ")[1].split()[0] for line in multipv] == ["1", "2", "3"]
    assert len({line.split(" pv ")[1].split()[0] for line in multipv}) == 3
    assert multipv[0].split(" pv ")[1].split()[0] == bestmoves(lines)[0]
    for line in multipv:  # an untrained network: some centipawn score
        assert " score cp " in line and " nodes 200 " in line and " nps " in line and " time " in line


def test_time_limits_and_alphabeta(value_checkpoint):
    started = time.perf_counter()
    lines = talk(value_checkpoint, "position startpos moves e2e4", "go movetime 200", "go wtime 3000 btime 3000 winc 0 binc 0")
    assert time.perf_counter() - started < 10  # ~0.4 s of search plus loading, on a busy machine
    after_e4 = chess.Board()
    after_e4.push_uci("e2e4")
    moves = bestmoves(lines)
    assert len(moves) == 2 and all(chess.Move.from_uci(move) in after_e4.legal_moves for move in moves)
    assert len(search_lines(lines)) == 2
    lines = talk(value_checkpoint, "setoption name Search value alphabeta", MATE_IN_ONE, "go nodes 100", "go movetime 100")
    assert bestmoves(lines) == ["a1a8", "a1a8"] and " score mate 1 " in search_lines(lines)[0]


def test_search_sees_the_game_history(value_checkpoint):
    """With the moves, Kg8-h8 repeats the first position: an exact draw, never expanded (its PV
    stops there); from the FEN alone the same move is searched like any other."""
    fen = "7k/8/8/8/8/8/8/R6K w - - 0 1"
    with_history = talk(value_checkpoint, "setoption name MultiPV value 5", f"position fen {fen} moves a1a2 h8g8 a2a1", "go nodes 200")
    board = chess.Board(fen)
    for move in ["a1a2", "h8g8", "a2a1"]:
        board.push_uci(move)
    without = talk(value_checkpoint, "setoption name MultiPV value 5", f"position fen {board.fen()}", "go nodes 200")
    repeat = [line for line in search_lines(with_history) if " pv g8h8" in line]
    assert len(repeat) == 1 and " score cp 0 " in repeat[0] and repeat[0].endswith(" pv g8h8")
    fresh = [line for line in search_lines(without) if " pv g8h8" in line]
    assert len(fresh) == 1 and len(fresh[0].split(" pv ")[1].split()) > 1


def test_search_none_and_no_value_head_play_the_policy(value_checkpoint, checkpoint):
    lines = talk(value_checkpoint, "setoption name Search value none", "position startpos", "go nodes 200")
    assert not search_lines(lines) and any(line.startswith("info depth 1 seldepth 1 nodes 1 ") for line in lines)
    assert chess.Move.from_uci(bestmoves(lines)[0]) in chess.Board().legal_moves
    lines = talk(value_checkpoint, "setoption name Search value none", "setoption name Search value PUCT", MATE_IN_ONE, "go nodes 200")
    assert bestmoves(lines) == ["a1a8"] and search_lines(lines)
    # `checkpoint` has no value head: one info string, then policy moves; never a crash.
    lines = talk(checkpoint, "uci", "position startpos", "go nodes 50", "position startpos moves e2e4", "go movetime 50")
    notices = [line for line in lines if "no value head" in line]
    assert len(notices) == 1 and notices[0].startswith("info string ") and "error" not in notices[0]
    assert not search_lines(lines) and len(bestmoves(lines)) == 2
    assert chess.Move.from_uci(bestmoves(lines)[0]) in chess.Board().legal_moves


def test_bad_options_are_refused_and_good_ones_taken(value_checkpoint, tmp_path):
    lines = talk(
        value_checkpoint,
        f"setoption name SyzygyPath value {tmp_path / 'missing'}",
        f"setoption name SyzygyPath value {tmp_path}",  # a directory without tables
        "setoption name Search value minimax",
        "setoption name Nodes value 0",
        "setoption name Nodes value lots",
        "setoption name MultiPV value 17",
        "go nodes many",
        "uci",
    )
    errors = [line for line in lines if line.startswith("info string error")]
    assert len(errors) == 7 and all("SyzygyPath refused" in line for line in errors[:2])
    assert "option name SyzygyPath type string default <empty>" in lines
    assert "option name Search type combo default puct var puct var alphabeta var none" in lines
    assert "option name Nodes type spin default 256 min 1 max 100000" in lines and len(bestmoves(lines)) == 1
    # Valid tables: a KQvK root is played from them (a win: a high centipawn score), then switched off again.
    lines = talk(
        value_checkpoint,
        f"setoption name SyzygyPath value {SYZYGY_DIR}",
        "position fen 8/8/8/4k3/8/8/8/3QK3 w - - 0 1",
        "go nodes 16",
        "setoption name SyzygyPath value <empty>",
        "setoption name Nodes value 32",
        "go",
    )
    assert not [line for line in lines if line.startswith("info string error")]
    tablebase, searched = search_lines(lines)
    assert " score cp 2000 " in tablebase and " nodes 0 " in tablebase and " nodes 32 " in searched
    with pytest.raises(FileNotFoundError):
        UciEngine(value_checkpoint, syzygy_path=str(tmp_path / "missing"))


def test_go_limits():
    assert clock_seconds(60_000) == pytest.approx(59.95 / 30)
    assert clock_seconds(10_000, 1_000) == pytest.approx(9.95 / 30 + 0.75)
    assert clock_seconds(10_000, 0, 1) == pytest.approx(0.2 * 9.95)  # never more than a fifth of the clock
    assert clock_seconds(1_000, 5_000) == pytest.approx(0.2 * 0.95)
    assert clock_seconds(20) == clock_seconds(-500) == 0.001
    assert movetime_seconds(200) == pytest.approx(0.15) and movetime_seconds(10) == pytest.approx(0.005)
    limits, problems = parse_go("wtime 60000 btime 3000 winc 0 binc 100".split(), chess.BLACK, 256)
    assert limits.nodes == MAX_NODES and limits.seconds == pytest.approx(2.95 / 30 + 0.075) and not problems
    limits, _ = parse_go("nodes 5000 movetime 1000 wtime 100".split(), chess.WHITE, 256)
    assert (limits.nodes, limits.seconds) == (5000, pytest.approx(0.95))
    for arguments in ([], ["infinite"], ["depth", "5"], ["mate", "2"], ["ponder", "searchmoves", "e2e4"]):
        assert parse_go(arguments, chess.WHITE, 256) == (GoLimits(nodes=256), [])
    assert parse_go(["nodes", "0"], chess.WHITE, 256)[0].nodes == 1
    assert parse_go(["nodes", str(10 * MAX_NODES)], chess.WHITE, 256)[0].nodes == MAX_NODES
    limits, problems = parse_go(["nodes", "abc", "wtime"], chess.WHITE, 64)
    assert (limits.nodes, limits.seconds) == (64, None) and len(problems) == 2


def test_parse_position():
    assert parse_position(["startpos"]).fen() == chess.STARTING_FEN
    board = parse_position("fen 4k3/8/8/8/8/8/4P3/4K3 w - - 0 1 moves e2e4 e8d7".split())
    assert board.fen() == "8/3k4/8/8/4P3/8/8/4K3 w - - 1 2" and len(board.move_stack) == 2
    for bad in ([], ["startpos", "extra"], ["fen"], "startpos moves e7e5".split(), "startpos moves zz".split()):
        with pytest.raises(ValueError):
            parse_position(bad)


def test_a_bad_checkpoint_fails_at_startup(tmp_path):
    completed = subprocess.run(command(tmp_path / "nothing"), input="uci\n", capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2 and "no checkpoint" in completed.stderr and completed.stdout == ""


def test_a_bad_syzygy_path_fails_at_startup(value_checkpoint, tmp_path):
    completed = subprocess.run(
        command(value_checkpoint, "--syzygy-path", str(tmp_path / "nothing")), input="uci\n", capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 2 and "Syzygy directory not found" in completed.stderr and completed.stdout == ""


def test_cli_search_choices_match_the_engine():
    from chessgrpo.commands import uci as uci_command
    from chessgrpo.eval import uci_engine

    assert uci_command.SEARCH_CHOICES == uci_engine.SEARCH_CHOICES
