"""The UCI options bots and GUIs set (eval/uci_engine.py, eval/uci_go.py): ``Move Overhead``, ``Threads``, ``Hash``, with
lichess-bot's default engine options, driven through python-chess's engine client against a real checkpoint."""

from __future__ import annotations

import sys
import time

import chess
import chess.engine
import pytest
import torch

from chessgrpo.eval.uci_go import MOVE_OVERHEAD_MS, clock_seconds, hash_nodes, movetime_seconds, parse_go
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from helpers import SYZYGY_DIR

STARTUP_TIMEOUT_S = 60.0
LICHESS_BOT_OPTIONS = {"Move Overhead": 100, "Threads": 4, "Hash": 512, "SyzygyPath": str(SYZYGY_DIR), "UCI_ShowWDL": True}
"""lichess-bot's default `engine.uci_options` (its config.yml.default), with this machine's Syzygy directory."""


@pytest.fixture(scope="module")
def value_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True)), tmp_path_factory.mktemp("uci_opts") / "ckpt")


def engine(checkpoint) -> chess.engine.SimpleEngine:
    return chess.engine.SimpleEngine.popen_uci([sys.executable, "-m", "chessgrpo.cli", "uci", "--checkpoint", str(checkpoint)],
                                               timeout=STARTUP_TIMEOUT_S)  # fmt: skip


def test_overhead_and_hash_set_the_budgets():
    assert clock_seconds(30_000, 300, overhead_ms=1000) < clock_seconds(30_000, 300) < clock_seconds(30_000, 300, overhead_ms=0)
    assert movetime_seconds(1000, 200) == pytest.approx(0.8) and movetime_seconds(1000) == pytest.approx(1 - MOVE_OVERHEAD_MS / 1000)
    assert hash_nodes(1) == 256 and hash_nodes(64) == 16384 and hash_nodes(10**6) == 100_000
    limits, _ = parse_go(["wtime", "1000", "btime", "1000"], chess.WHITE, 256, overhead_ms=900, max_nodes=300)
    assert limits.nodes == 300 and limits.seconds == pytest.approx(0.1 / 30)  # what the overhead leaves, over 30 moves


def test_lichess_bot_options_configure_and_a_30_plus_03_game_never_flags(value_checkpoint):
    """python-chess refuses an option the engine does not offer: lichess-bot's defaults must all be offered. Then a game
    under a 30 s + 0.3 s clock kept by the client (the wall time of each move): no move ever exceeds the clock."""
    client = engine(value_checkpoint)
    try:
        for name in ("Move Overhead", "Threads", "Hash"):
            assert name in client.options
        client.configure({"Threads": 2, "Hash": 64, "Move Overhead": 100})
        client.configure(LICHESS_BOT_OPTIONS)
        board, clocks, increment = chess.Board(), {chess.WHITE: 30.0, chess.BLACK: 30.0}, 0.3
        for _ in range(10):  # 10 plies at ~1 s a move: the budget is what matters, not the game's length
            limit = chess.engine.Limit(white_clock=clocks[chess.WHITE], black_clock=clocks[chess.BLACK], white_inc=increment,
                                       black_inc=increment)  # fmt: skip
            started = time.perf_counter()
            result = client.play(board, limit)
            spent = time.perf_counter() - started
            assert spent < clocks[board.turn], f"flagged: {spent:.2f} s with {clocks[board.turn]:.2f} s left"
            assert spent <= clock_seconds(int(clocks[board.turn] * 1000), 300, overhead_ms=100) + 0.5  # its budget, plus latency
            clocks[board.turn] += increment - spent
            board.push(result.move)
            if board.is_game_over():
                break
    finally:
        client.quit()


def test_hash_bounds_the_search_tree(value_checkpoint):
    client = engine(value_checkpoint)
    try:
        client.configure({"Hash": 1})  # 256 nodes of ~4 kB
        info = client.analyse(chess.Board(), chess.engine.Limit(nodes=5000))
        assert 0 < info["nodes"] <= hash_nodes(1)
        client.configure({"Hash": 64})
        info = client.analyse(chess.Board(), chess.engine.Limit(nodes=1000))
        assert info["nodes"] > hash_nodes(1)
    finally:
        client.quit()
