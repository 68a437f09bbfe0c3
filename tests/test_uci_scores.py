"""The scale of `chessgrpo uci`'s scores (uci/scores.py, search.value_to_centipawns): Lc0's centipawns, checked
through python-chess's engine client on a network whose value is known by construction, and on the quickstart network.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import chess
import chess.engine
import pytest
import torch

from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from helpers import REPO_ROOT

STARTUP_TIMEOUT_S = 60.0
QUICKSTART = REPO_ROOT / "tests" / "data" / "quickstart_grpo"
"""`make run`'s GRPO network (runs/quickstart/grpo, a fresh clone's run of 2026-11-29: +47 Elo [+25, +69] against its
start), its weights and config only (0.8 MB), so that the test needs no 20-minute run beside it."""


def engine_command(checkpoint: Path | str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "chessgrpo.cli", "uci", "--checkpoint", str(checkpoint), *flags]


@pytest.fixture(scope="module")
def white_scores_60(tmp_path_factory) -> Path:
    """A network whose value head says White scores 0.6 in every position (last layer: weights 0, bias logit(0.6))."""
    torch.manual_seed(0)
    policy = ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True))
    last = policy.value_head.mlp[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(math.log(0.6 / 0.4))
    return save_policy(policy, tmp_path_factory.mktemp("uci_scale") / "white_0.6")


def test_a_known_value_is_reported_in_lc0_centipawns_for_either_side(white_scores_60):
    """v = 0.6 for White is cp = 111.714640912 tan(1.5620688421 * 0.2) = +36 for White and -36 for Black, every line."""
    engine = chess.engine.SimpleEngine.popen_uci(
        engine_command(white_scores_60, "--search", "none"), timeout=STARTUP_TIMEOUT_S
    )
    try:
        engine.configure({"UCI_ShowWDL": True})
        board = chess.Board()
        infos = engine.analyse(board, chess.engine.Limit(nodes=1), multipv=3)
        assert len(infos) == 3 and all(info["score"].white() == chess.engine.Cp(36) for info in infos)
        assert all(abs(info["wdl"].relative.expectation() - 0.6) < 0.002 for info in infos)
        board.push_uci("e2e4")
        infos = engine.analyse(board, chess.engine.Limit(nodes=1), multipv=3)
        assert all(
            info["score"].relative == chess.engine.Cp(-36) and info["score"].white() == chess.engine.Cp(36)
            for info in infos
        )
    finally:
        engine.quit()


def test_the_quickstart_network_scores_the_start_position_like_an_engine():
    """Issue 54: with its default settings (256-node PUCT) the quickstart network's score of the start position reads as
    an engine's does: its expected score (the score converted back, `centipawns_to_value`) within 0.10 of the 0.52
    Stockfish 15.1 gives White there (+34 cp at 2000 nodes), where the scale before issue 54 was off by hundreds of cp.
    This network says -13 cp (0.48); an earlier run's said +8 cp."""
    from chessgrpo.search import centipawns_to_value

    engine = chess.engine.SimpleEngine.popen_uci(engine_command(QUICKSTART), timeout=STARTUP_TIMEOUT_S)
    try:
        info = engine.analyse(chess.Board(), chess.engine.Limit(nodes=256))
        white = info["score"].white().score()
        assert white is not None and abs(centipawns_to_value(white) - 0.52) <= 0.10, info["score"]
        assert abs(white) <= 100, info["score"]  # less than a pawn either way: the opening is level
    finally:
        engine.quit()
