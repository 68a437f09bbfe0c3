"""`chessgrpo uci` (uci/engine.py): driven by python-chess's engine client, through a raw pipe and in-process
(`UciEngine` over `io.StringIO`); search with a value-head checkpoint, policy-only play without."""

from __future__ import annotations

import io
import queue
import subprocess
import sys
import tempfile
import threading
import time

import chess
import chess.engine
import pytest
import torch

from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.play.search_control import (
    MAX_NODES,
    GoFlags,
    GoLimits,
    clock_seconds,
    movetime_seconds,
    parse_go,
    parse_go_flags,
)
from chessgrpo.uci.chess960 import move_actions
from chessgrpo.uci.engine import UciEngine
from chessgrpo.uci.options import parse_temperature
from chessgrpo.uci.protocol_text import parse_position
from chessgrpo.uci.scores import expected_score_wdl, policy_estimate, quiescence
from helpers import SYZYGY_DIR

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


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


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
        for limit in (
            chess.engine.Limit(depth=3),
            chess.engine.Limit(nodes=100),
            chess.engine.Limit(white_clock=10, black_clock=10),
        ):
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
            "position fen 8/8/8/8 w - - 0 1",  # bad FEN: no valid position any more
            "go wtime 1000 btime 1000",  # -> bestmove 0000, never a move for 1. e4 e5
            "position startpos moves e2e4 e7e5",
            "position startpos moves e2e4 e2e4",  # illegal move
            "position fen rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 garbage",
            "position banana",
            "go wtime 1000 btime 1000",  # -> bestmove 0000
            "position startpos moves e2e4 e7e5",
            "setoption name Temperature value -3",
            "setoption name Device value not-a-device",
            "setoption name Nonsense value 1",
            "setoption",
            "frobnicate the engine",
            "\x00\x01\xff garbage",
            "go movetime 10",
            "stop",
            "position fen 7k/6Q1/6K1/8/8/8/8/8 b - - 0 1",  # Black is checkmated
            "go infinite",  # answers only at stop (here: quit)
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
    assert len(bestmoves) == 4
    after_e4_e5 = chess.Board()
    for move in ["e2e4", "e7e5"]:
        after_e4_e5.push_uci(move)
    assert bestmoves[:2] == ["0000", "0000"]
    assert chess.Move.from_uci(bestmoves[2]) in after_e4_e5.legal_moves
    assert bestmoves[3] == "0000"
    assert sum("error: no valid position" in line for line in lines) == 2
    errors = [line for line in lines if line.startswith("info string error")]
    assert (
        len(errors) >= 8
    )  # two bad FENs, an illegal move, a bad setup, two go without position, two bad option values
    assert any("unknown command ignored: frobnicate" in line for line in lines)
    assert sum(line.startswith("info depth") for line in lines) == 1  # only the one real move is announced


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
    """The engine's output lines for `commands`, then the end of input (which, unlike ``quit``,
    lets the last finite search finish)."""
    output = io.StringIO()
    engine = UciEngine(checkpoint, input=io.StringIO("\n".join(commands) + "\n"), output=output, **options)
    assert engine.run() == 0
    return output.getvalue().splitlines()


def bestmoves(lines: list[str]) -> list[str]:
    return [line.split()[1] for line in lines if line.startswith("bestmove")]


def search_lines(lines: list[str]) -> list[str]:
    """The searched ``info`` lines (the policy-only player's say ``nodes 1``)."""
    return [line for line in lines if line.startswith("info depth") and " multipv " in line and " nodes 1 " not in line]


def policy_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("info depth 1 seldepth 1 multipv ") and " nodes 1 " in line]


def pv_moves(lines: list[str]) -> list[str]:
    return [line.split(" pv ")[1].split()[0] for line in lines]


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
        "option name UCI_Chess960 type check default false",
        "option name UCI_ShowWDL type check default false",
        "option name Ponder type check default false",
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
    lines = talk(
        value_checkpoint, "position startpos moves e2e4", "go movetime 200", "go wtime 3000 btime 3000 winc 0 binc 0"
    )
    assert time.perf_counter() - started < 10  # ~0.4 s of search plus loading, on a busy machine
    after_e4 = chess.Board()
    after_e4.push_uci("e2e4")
    moves = bestmoves(lines)
    assert len(moves) == 2 and all(chess.Move.from_uci(move) in after_e4.legal_moves for move in moves)
    assert len(search_lines(lines)) == 2
    lines = talk(
        value_checkpoint, "setoption name Search value alphabeta", MATE_IN_ONE, "go nodes 100", "go movetime 100"
    )
    assert bestmoves(lines) == ["a1a8", "a1a8"] and " score mate 1 " in search_lines(lines)[0]


def test_search_sees_the_game_history(value_checkpoint):
    """With the moves, Kg8-h8 repeats the first position: an exact draw, never expanded (its PV
    stops there); from the FEN alone the same move is searched like any other."""
    fen = "7k/8/8/8/8/8/8/R6K w - - 0 1"
    with_history = talk(
        value_checkpoint, "setoption name MultiPV value 5", f"position fen {fen} moves a1a2 h8g8 a2a1", "go nodes 200"
    )
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
    assert not search_lines(lines) and len(policy_lines(lines)) == 1 and " score cp " in policy_lines(lines)[0]
    assert chess.Move.from_uci(bestmoves(lines)[0]) in chess.Board().legal_moves
    lines = talk(
        value_checkpoint,
        "setoption name Search value none",
        "setoption name Search value PUCT",
        MATE_IN_ONE,
        "go nodes 200",
    )
    assert bestmoves(lines) == ["a1a8"] and search_lines(lines)
    # `checkpoint` has no value head: one info string, then policy moves; never a crash.
    lines = talk(
        checkpoint, "uci", "position startpos", "go nodes 50", "position startpos moves e2e4", "go movetime 50"
    )
    notices = [line for line in lines if "no value head" in line]
    assert len(notices) == 1 and notices[0].startswith("info string ") and "error" not in notices[0]
    assert not search_lines(lines) and len(bestmoves(lines)) == 2 and len(policy_lines(lines)) == 2
    assert chess.Move.from_uci(bestmoves(lines)[0]) in chess.Board().legal_moves
    assert pv_moves(policy_lines(lines)) == bestmoves(lines)


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
    assert parse_go_flags("ponder wtime 10 searchmoves e2e4 d2d4 nodes 5 infinite".split()) == GoFlags(
        True, True, ("e2e4", "d2d4")
    )
    assert parse_go_flags(["searchmoves"]) == parse_go_flags([]) == GoFlags()
    limits, _ = parse_go("searchmoves e2e4 nodes 7".split(), chess.WHITE, 256)
    assert limits.nodes == 7
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
    completed = subprocess.run(
        command(tmp_path / "nothing"), input="uci\n", capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 2 and "no checkpoint" in completed.stderr and completed.stdout == ""


def test_a_bad_syzygy_path_fails_at_startup(value_checkpoint, tmp_path):
    completed = subprocess.run(
        command(value_checkpoint, "--syzygy-path", str(tmp_path / "nothing")),
        input="uci\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2 and "Syzygy directory not found" in completed.stderr and completed.stdout == ""


def test_cli_search_choices_match_the_engine():
    from chessgrpo.commands import uci as uci_command
    from chessgrpo.uci import options as uci_options

    assert uci_command.SEARCH_CHOICES == uci_options.SEARCH_CHOICES


# ------------------------------------------------------------------------------------------------
# Scores, MultiPV, WDL


@pytest.mark.slow
def test_python_chess_analyse_multipv_scores_with_and_without_a_value_head(value_checkpoint, checkpoint):
    board = chess.Board()
    for move in ["e2e4", "e7e5", "g1f3"]:
        board.push_uci(move)
    for path in (value_checkpoint, checkpoint):
        engine = chess.engine.SimpleEngine.popen_uci(command(path, "--nodes", "32"), timeout=STARTUP_TIMEOUT_S)
        try:
            infos = engine.analyse(board, chess.engine.Limit(nodes=32), multipv=3)
            assert [info["multipv"] for info in infos] == [1, 2, 3]
            assert all(info["score"].relative.score() is not None for info in infos)
            assert len({info["pv"][0] for info in infos}) == 3 and all(
                info["pv"][0] in board.legal_moves for info in infos
            )
            engine.configure({"UCI_ShowWDL": True})
            # White to move, a rook up: an estimate, from material here without a value head.
            rook_up = chess.Board("4k3/pppp4/8/8/8/8/PPPP4/R3K3 w - - 0 1")
            infos = engine.analyse(rook_up, chess.engine.Limit(nodes=32), multipv=3)
            assert len(infos) == 3
            for info in infos:
                wdl = info["wdl"].relative
                assert wdl.wins + wdl.draws + wdl.losses == 1000
            if path == checkpoint:
                assert infos[0]["score"].relative.score() >= 400  # the policy's move keeps the rook
            mate_board = chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")
            root_moves = [chess.Move.from_uci("a1a8"), chess.Move.from_uci("g1f1")]
            infos = engine.analyse(mate_board, chess.engine.Limit(nodes=32), multipv=2, root_moves=root_moves)
            [mating] = [info for info in infos if info["pv"][0] == root_moves[0]]
            assert mating["score"].relative == chess.engine.Mate(1) and mating["wdl"].relative.wins == 1000
        finally:
            engine.quit()


def test_multipv_lines_after_a_mate_in_one_and_in_tablebase_positions(value_checkpoint):
    """A root decided without search (a mate in one, a tablebase move) still gives as many scored lines as asked
    (python-chess's `analyse(multipv=3)`), the decided move first (issue 54: it gave one line)."""
    engine = chess.engine.SimpleEngine.popen_uci(command(value_checkpoint, "--nodes", "32"), timeout=STARTUP_TIMEOUT_S)
    try:
        scholar = chess.Board("r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4")
        infos = engine.analyse(scholar, chess.engine.Limit(nodes=32), multipv=3)
        assert [info["multipv"] for info in infos] == [1, 2, 3]
        assert infos[0]["pv"][0] == chess.Move.from_uci("h5f7") and infos[0]["score"].relative == chess.engine.Mate(1)
        assert len({info["pv"][0] for info in infos}) == 3 and all(info["score"].relative is not None for info in infos)
        engine.configure({"SyzygyPath": str(SYZYGY_DIR)})
        kqk = chess.Board("8/8/8/3k4/8/8/8/KQ6 w - - 0 1")
        infos = engine.analyse(kqk, chess.engine.Limit(nodes=32), multipv=3)
        assert [info["multipv"] for info in infos] == [1, 2, 3] and len({info["pv"][0] for info in infos}) == 3
        assert infos[0]["score"].relative.score(mate_score=100000) >= 2000  # a tablebase win (DTZ is no mate distance)
    finally:
        engine.quit()


def test_policy_only_scores_are_estimates_not_a_fixed_zero(checkpoint):
    # Black to move can take the hanging queen; material and the policy's odds give the scores.
    fen = "4k3/8/8/3q4/8/8/3Q4/4K3 w - - 0 1"
    lines = talk(checkpoint, "setoption name MultiPV value 16", f"position fen {fen}", "go nodes 1")
    shown = policy_lines(lines)
    assert len(shown) == 16
    scores = [int(line.split(" score cp ")[1].split()[0]) for line in shown]
    assert len(set(scores)) > 1 and all(abs(score) <= 2000 for score in scores)
    # The estimate: material once the captures settle, lowered by the policy's odds against the move.
    board = chess.Board(fen)
    take, hang, quiet = (chess.Move.from_uci(m) for m in ("d2d5", "d2d4", "e1e2"))
    assert policy_estimate(board, take, 0.2, 0.2).amount >= 800  # Qxd5: a queen up
    assert policy_estimate(board, hang, 0.2, 0.2).amount <= -800  # Qd4?? Qxd4
    assert (
        policy_estimate(board, quiet, 0.2, 0.2).amount == 0
    )  # Ke2 guards the queen: equal material, the policy's favourite
    assert (
        policy_estimate(board, quiet, 0.02, 0.2).amount == -42
    )  # ten times less likely: 0.05 * ln 10 lower (Lc0's scale)
    board.push(hang)
    assert quiescence(board) >= 800 and board.fen() == "4k3/8/8/3q4/3Q4/8/8/4K3 b - - 1 1"  # left unchanged
    mate_lines = talk(
        checkpoint, "setoption name MultiPV value 16", "position fen 6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1", "go nodes 1"
    )
    a8 = [line for line in policy_lines(mate_lines) if line.endswith(" pv a1a8")]
    assert len(a8) == 1 and " score mate 1 " in a8[0]
    assert_mate_against(
        talk(checkpoint, "setoption name MultiPV value 16", f"position fen {BACK_RANK}", "go nodes 1"), policy_lines
    )


BACK_RANK = "r5k1/5ppp/8/8/3N4/8/5PPP/6K1 w - - 0 1"
"""Black threatens ...Ra1#: Kh1, Nb5, Nc6, Ne6, Nf5 allow it (mate -1); Nb3, Nc2, Ne2, Nf3 and the luft moves do not."""


def assert_mate_against(lines: list[str], select) -> None:
    by_move = {line.split(" pv ")[1].split()[0]: line for line in select(lines)}
    assert len(by_move) == 16
    for move, line in by_move.items():
        assert (" score mate -1 " in line) == (move in ("g1h1", "d4b5", "d4c6", "d4e6", "d4f5")), line


def test_expected_score_wdl():
    for value in (0.0, 1e-12, 0.1, 0.37, 0.5, 0.8, 0.999, 1.0):
        wins, draws, losses = expected_score_wdl(value)
        assert min(wins, draws, losses) >= 0 and wins + draws + losses == 1000
        assert abs((wins + draws / 2) / 1000 - value) < 0.002
    assert expected_score_wdl(0.5) in ((333, 334, 333), (333, 333, 334), (334, 333, 333))
    assert expected_score_wdl(1.0) == (1000, 0, 0) and expected_score_wdl(0.0) == (0, 0, 1000)
    wins, draws, losses = expected_score_wdl(0.8)
    assert expected_score_wdl(0.2) == (losses, draws, wins)


def test_search_scores_show_wdl_and_exact_results(value_checkpoint):
    lines = talk(
        value_checkpoint,
        "setoption name UCI_ShowWDL value true",
        "setoption name MultiPV value 3",
        "position startpos",
        "go nodes 48",
    )
    for line in search_lines(lines):
        wdl = [int(x) for x in line.split(" wdl ")[1].split()[:3]]
        assert sum(wdl) == 1000
    lines = talk(value_checkpoint, "setoption name UCI_ShowWDL value true", MATE_IN_ONE, "go nodes 16")
    assert " score mate 1 wdl 1000 0 0 " in search_lines(lines)[0]
    for search in ("puct", "alphabeta"):
        lines = talk(
            value_checkpoint,
            f"setoption name Search value {search}",
            "setoption name MultiPV value 16",
            f"position fen {BACK_RANK}",
            "go nodes 64",
        )
        assert_mate_against(lines, search_lines)
        assert bestmoves(lines)[0] not in ("g1h1", "d4b5", "d4c6", "d4e6", "d4f5")


# ------------------------------------------------------------------------------------------------
# go infinite / ponder / stop / quit over real pipes


class RawEngine:
    """`chessgrpo uci` over raw pipes; every read has a timeout, so a test never hangs."""

    def __init__(self, checkpoint, *extra: str):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            command(checkpoint, *extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, *commands: str) -> None:
        for line in commands:
            self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect(self, prefix: str, timeout: float = 20.0) -> tuple[str, list[str]]:
        """The first line starting with `prefix`, and the lines before it."""
        before: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} within {timeout} s; got {before}") from None
            if line is None:
                self.stderr.seek(0)
                raise AssertionError(
                    f"engine exited before {prefix!r}; got {before}; stderr {self.stderr.read()[-2000:]}"
                )
            if line.startswith(prefix):
                return line, before
            before.append(line)

    def silent_for(self, seconds: float, prefix: str = "bestmove") -> list[str]:
        """The lines of the next `seconds`, none starting with `prefix`."""
        lines: list[str] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            assert line is not None and not line.startswith(prefix), f"unexpected {line!r} after {lines}"
            lines.append(line)
        return lines

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.stderr.close()


def test_go_infinite_ponder_and_quit_over_raw_pipes(value_checkpoint):
    engine = RawEngine(value_checkpoint)
    try:
        engine.send("uci")
        engine.expect("uciok", STARTUP_TIMEOUT_S)
        start = chess.Board()
        # go infinite: no answer until stop; isready is answered while it searches.
        engine.send("position startpos", "go infinite")
        engine.silent_for(0.3)
        engine.send("isready")
        engine.expect("readyok", 10)
        engine.send("stop")
        line, before = engine.expect("bestmove", 20)
        assert chess.Move.from_uci(line.split()[1]) in start.legal_moves
        assert any(" multipv 1 " in info for info in before)
        # go ponder: no answer until ponderhit, then the go's own clock applies.
        board = chess.Board()
        board.push_uci("e2e4")
        engine.send("position startpos moves e2e4", "go ponder wtime 2000 btime 2000 winc 0 binc 0")
        engine.silent_for(0.3)
        hit = time.monotonic()
        engine.send("ponderhit")
        line, _ = engine.expect("bestmove", 20)
        assert chess.Move.from_uci(line.split()[1]) in board.legal_moves
        assert time.monotonic() - hit < 10
        # go ponder then stop (the opponent played something else): answered at once.
        engine.send("go ponder wtime 2000 btime 2000")
        engine.silent_for(0.2)
        engine.send("stop")
        line, _ = engine.expect("bestmove", 20)
        assert chess.Move.from_uci(line.split()[1]) in board.legal_moves
        # go infinite with searchmoves, then quit while it searches: a clean exit.
        engine.send("position startpos", "go infinite searchmoves a2a3 h2h4")
        engine.silent_for(0.2)
        engine.send("stop")
        line, _ = engine.expect("bestmove", 20)
        assert line.split()[1] in ("a2a3", "h2h4")
        engine.send("go infinite")
        engine.silent_for(0.2)
        engine.send("quit")
        assert engine.process.wait(timeout=30) == 0
    finally:
        engine.close()


class LiveInput:
    """An input stream fed line by line while `UciEngine.run` reads it in another thread."""

    def __init__(self):
        self.queue: queue.Queue[str | None] = queue.Queue()

    def __iter__(self):
        while (line := self.queue.get()) is not None:
            yield line + "\n"


class LiveOutput(io.TextIOBase):
    def __init__(self):
        self.lines: queue.Queue[str] = queue.Queue()
        self.buffer = ""

    def write(self, text: str) -> int:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self.lines.put(line)
        return len(text)

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line.startswith(prefix):
                return line


def test_policy_only_go_infinite_and_ponder_wait_in_process(checkpoint):
    """Without a value head the answer is ready at once, yet infinite/ponder hold it back."""
    source, sink = LiveInput(), LiveOutput()
    engine = UciEngine(checkpoint, input=source, output=sink)
    runner = threading.Thread(target=engine.run, daemon=True)
    runner.start()
    try:
        for go in ("go infinite", "go ponder wtime 1000 btime 1000"):
            source.queue.put("position startpos")
            source.queue.put(go)
            sink.expect("info string policy probability", 20)
            time.sleep(0.3)
            assert not [line for line in list(sink.lines.queue) if line.startswith("bestmove")]
            source.queue.put("isready")
            assert sink.expect("readyok", 10) == "readyok"
            source.queue.put("stop" if go == "go infinite" else "ponderhit")
            assert chess.Move.from_uci(sink.expect("bestmove", 10).split()[1]) in chess.Board().legal_moves
        # A rejected position, then go infinite: bestmove 0000 only at stop.
        source.queue.put("position startpos moves e2e5")
        source.queue.put("go infinite")
        sink.expect("info string error: no valid position", 10)
        time.sleep(0.2)
        assert not [line for line in list(sink.lines.queue) if line.startswith("bestmove")]
        source.queue.put("stop")
        assert sink.expect("bestmove", 10) == "bestmove 0000"
    finally:
        source.queue.put("quit")
        runner.join(30)
    assert not runner.is_alive()


# ------------------------------------------------------------------------------------------------
# searchmoves


def test_searchmoves_restricts_the_root(value_checkpoint, checkpoint):
    # The mate a1a8 is not among the searchmoves: neither the shortcut nor the search may play it.
    for search in ("puct", "alphabeta", "none"):
        lines = talk(
            value_checkpoint,
            f"setoption name Search value {search}",
            "setoption name MultiPV value 5",
            MATE_IN_ONE,
            "go nodes 64 searchmoves g1f1 h2h3",
        )
        assert bestmoves(lines)[0] in ("g1f1", "h2h3"), search
        shown = search_lines(lines) or policy_lines(lines)
        assert set(pv_moves(shown)) <= {"g1f1", "h2h3"} and len(shown) == 2
    lines = talk(value_checkpoint, MATE_IN_ONE, "go nodes 64 searchmoves a1a8 g1f1")
    assert bestmoves(lines) == ["a1a8"]
    lines = talk(value_checkpoint, "position startpos", "go nodes 16 searchmoves b1c3")  # one move: played at once
    assert bestmoves(lines) == ["b1c3"]
    # Without a value head: the policy's mask.
    lines = talk(checkpoint, "setoption name MultiPV value 3", "position startpos", "go searchmoves a2a3 h2h4")
    assert bestmoves(lines)[0] in ("a2a3", "h2h4") and set(pv_moves(policy_lines(lines))) <= {"a2a3", "h2h4"}
    # Illegal searchmoves are refused; none legal means every move.
    lines = talk(checkpoint, "position startpos", "go searchmoves e2e5 zz a2a3", "go searchmoves e7e5")
    assert bestmoves(lines)[0] == "a2a3" and chess.Move.from_uci(bestmoves(lines)[1]) in chess.Board().legal_moves
    assert sum("error: searchmoves" in line for line in lines) == 4


# ------------------------------------------------------------------------------------------------
# Chess960

CASTLE_960 = "6k1/8/8/8/8/8/8/RK5R w HA - 0 1"
"""White king b1, rooks a1 and h1: O-O-O is b1a1 (king to c1, while b1c1 is also a plain king move), O-O is b1h1."""


def test_chess960_castling(value_checkpoint, checkpoint):
    board = chess.Board(CASTLE_960, chess960=True)
    castles = {board.uci(m) for m in board.legal_moves if board.is_castling(m)}
    assert castles == {"b1a1", "b1h1"}
    # The action mapping: distinct actions, b1c1 stays the plain king move.
    moves = list(board.legal_moves)
    actions = dict(zip((board.uci(m) for m in moves), move_actions(board, moves)))
    assert len(set(actions.values())) == len(moves) and min(actions.values()) >= 0
    from chessgrpo.board import move_to_action

    assert (
        actions["b1c1"] == move_to_action("b1c1")
        and actions["b1a1"] == move_to_action("b1a1")
        and actions["b1h1"] == move_to_action("b1g1")
    )
    after = parse_position(["fen", *CASTLE_960.split(), "moves", "b1h1"], chess960=True)
    assert after.piece_at(chess.G1) == chess.Piece.from_symbol("K") and after.piece_at(
        chess.F1
    ) == chess.Piece.from_symbol("R")
    for path in (value_checkpoint, checkpoint):
        for castle in ("b1a1", "b1h1"):
            lines = talk(
                path,
                "setoption name UCI_Chess960 value true",
                f"position fen {CASTLE_960}",
                f"go nodes 16 searchmoves {castle} a1a2",
            )
            assert bestmoves(lines)[0] in (castle, "a1a2")
            lines = talk(
                path,
                "setoption name UCI_Chess960 value true",
                f"position fen {CASTLE_960}",
                f"go nodes 16 searchmoves {castle}",
            )
            assert bestmoves(lines) == [castle]
        lines = talk(
            path, "setoption name UCI_Chess960 value true", f"position fen {CASTLE_960} moves b1a1 g8g7", "go nodes 16"
        )
        after = chess.Board(CASTLE_960, chess960=True)
        for move in ("b1a1", "g8g7"):
            after.push_uci(move)
        assert chess.Move.from_uci(bestmoves(lines)[0]) in after.legal_moves
        # Without UCI_Chess960 the Shredder-FEN is rejected: bestmove 0000.
        lines = talk(path, f"position fen {CASTLE_960}", "go nodes 16")
        assert bestmoves(lines) == ["0000"]


def test_chess960_standard_geometry_matches_standard_chess(checkpoint):
    """In a position with the standard king and rooks, the network sees 960's e1h1 as e1g1: the
    policy's lines are the same, castling written king-takes-rook."""
    moves = "e2e4 e7e5 g1f3 b8c6 f1c4 g8f6"
    standard = talk(checkpoint, "setoption name MultiPV value 16", f"position startpos moves {moves}", "go nodes 1")
    chess960 = talk(
        checkpoint,
        "setoption name UCI_Chess960 value true",
        "setoption name MultiPV value 16",
        f"position startpos moves {moves}",
        "go nodes 1",
    )

    def pv_and_score(lines: list[str]) -> list[tuple[str, str]]:
        return [(line.split(" pv ")[1], line.split(" score ")[1].split(" nodes ")[0]) for line in policy_lines(lines)]

    expected = [(pv.replace("e1g1", "e1h1"), score) for pv, score in pv_and_score(standard)]
    assert pv_and_score(chess960) == expected
    standard = talk(
        checkpoint,
        "setoption name MultiPV value 3",
        f"position startpos moves {moves}",
        "go searchmoves e1g1 d2d3 h2h3",
    )
    chess960 = talk(
        checkpoint,
        "setoption name UCI_Chess960 value true",
        "setoption name MultiPV value 3",
        f"position startpos moves {moves}",
        "go searchmoves e1h1 d2d3 h2h3",
    )
    expected = [(pv.replace("e1g1", "e1h1"), score) for pv, score in pv_and_score(standard)]
    assert pv_and_score(chess960) == expected and "e1h1" in [pv for pv, _ in expected]
    lines = talk(
        checkpoint, "setoption name UCI_Chess960 value true", f"position startpos moves {moves}", "go searchmoves e1h1"
    )
    assert bestmoves(lines) == ["e1h1"]
    lines = talk(checkpoint, f"position startpos moves {moves}", "go searchmoves e1g1")
    assert bestmoves(lines) == ["e1g1"]


def test_python_chess_root_moves_and_chess960(value_checkpoint):
    """python-chess sends ``searchmoves`` for root_moves, sets UCI_Chess960 itself for a chess960
    board and reads the king-takes-rook answer as castling."""
    engine = chess.engine.SimpleEngine.popen_uci(command(value_checkpoint, "--nodes", "16"), timeout=STARTUP_TIMEOUT_S)
    try:
        board = chess.Board(MATE_IN_ONE.split(" fen ")[1])
        result = engine.play(board, chess.engine.Limit(nodes=32), root_moves=[chess.Move.from_uci("h2h4")])
        assert result.move == chess.Move.from_uci("h2h4")
        board = chess.Board(CASTLE_960, chess960=True)
        castle = board.parse_uci("b1a1")
        result = engine.play(board, chess.engine.Limit(nodes=16), root_moves=[castle])
        assert result.move == castle and board.is_castling(result.move)
        result = engine.play(board, chess.engine.Limit(nodes=32))
        assert result.move in board.legal_moves
        standard_board = chess.Board()
        assert engine.play(standard_board, chess.engine.Limit(nodes=16)).move in standard_board.legal_moves
    finally:
        engine.quit()


# ------------------------------------------------------------------------------------------------
# Refused options and positions


def test_refused_options_change_nothing(checkpoint, value_checkpoint):
    bad = [
        "setoption name Device value meta",
        "setoption name Device value cuda:99",
        "setoption name Device value not-a-device",
        "setoption name Temperature value 1e-320",
        "setoption name Temperature value nan",
        "setoption name Temperature value inf",
        "setoption name Temperature value -1",
        "setoption name Temperature value 1000",
        "setoption name UCI_Chess960 value maybe",
    ]
    for path in (checkpoint, value_checkpoint):
        lines = talk(
            path,
            "position startpos moves e2e4",
            "go nodes 32",
            *bad,
            "uci",
            "position startpos moves e2e4",
            "go nodes 32",
        )
        errors = [line for line in lines if line.startswith("info string error")]
        assert len(errors) == len(bad)
        assert all("keeping cpu" in line for line in errors[:3]) and all("keeping 0" in line for line in errors[3:8])
        assert (
            "option name Temperature type string default 0" in lines
            and "option name Device type string default cpu" in lines
        )
        first, second = bestmoves(lines)
        assert first == second
    # Valid values are taken: the device through a validated copy, a temperature samples.
    lines = talk(checkpoint, "setoption name Device value cpu", "setoption name Temperature value 0.5", "uci")
    assert (
        not [line for line in lines if "error" in line] and "option name Temperature type string default 0.5" in lines
    )
    assert parse_temperature("0") == 0.0 and parse_temperature("100") == 100.0
    for text in ("1e-320", "nan", "-inf", "-0.5", "100.5", "warm"):
        with pytest.raises(ValueError):
            parse_temperature(text)
    with pytest.raises(ValueError):
        UciEngine(checkpoint, temperature=float("nan"))
    # The model in use is never moved: a refused device leaves the very same module on the CPU.
    engine = UciEngine(checkpoint, input=io.StringIO("setoption name Device value meta\n"), output=io.StringIO())
    policy, weights = engine.policy, {name: tensor.clone() for name, tensor in engine.policy.state_dict().items()}
    engine.run()
    assert engine.policy is policy and engine.device == "cpu"
    assert all(
        tensor.device.type == "cpu" and torch.equal(tensor, weights[name])
        for name, tensor in policy.state_dict().items()
    )


def test_a_rejected_position_is_never_answered_with_an_older_one(checkpoint, value_checkpoint):
    for path in (checkpoint, value_checkpoint):
        lines = talk(
            path,
            "position startpos moves e2e4",
            "go nodes 16",
            "position startpos moves e2e4 e2e4",  # illegal
            "go nodes 16",
            "position fen 8/8/8/8/8/8/8/8 w - - 0 1",  # invalid FEN
            "go movetime 50",
            "ucinewgame",  # a new game starts from the initial position
            "go nodes 16",
            "position startpos moves e2e4 e7e5",
            "go nodes 16",
        )
        moves = bestmoves(lines)
        after_e4 = chess.Board()
        after_e4.push_uci("e2e4")
        assert chess.Move.from_uci(moves[0]) in after_e4.legal_moves
        assert moves[1:3] == ["0000", "0000"]
        assert sum("error: no valid position" in line for line in lines) == 2
        assert chess.Move.from_uci(moves[3]) in chess.Board().legal_moves
        after_e4.push_uci("e7e5")
        assert chess.Move.from_uci(moves[4]) in after_e4.legal_moves
