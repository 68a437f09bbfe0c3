"""A reward function the user writes (`task.reward_fn: "module:function"`, tasks/user_rewards.py): checked when the config
is built, then it trains a real 3-step GRPO run (real Stockfish values, a module written by the test)."""

from __future__ import annotations

import chess
import pytest

from chessgrpo.config import ConfigError, load_config
from chessgrpo.tasks.kinds.move_group import MoveGroupTrainConfig
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import TINY_MOVE_GROUP_RUN, importable_module

REWARD_MODULE = '''
import chess

CALLS = []


def capture_bonus(board: chess.Board, move: chess.Move, win_probability: float) -> float:
    """The engine's value, plus 1 for a capture."""
    CALLS.append((board.fen(), move.uci(), win_probability))
    return win_probability + (1.0 if board.is_capture(move) else 0.0)


def constant(board, move, win_probability):
    return 0.25


def two_arguments(board, move):
    return 0.0


NOT_A_FUNCTION = 3
'''

OVERRIDES = [*TINY_MOVE_GROUP_RUN, "steps=3"]


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    yield from importable_module(tmp_path, monkeypatch, "my_rewards", REWARD_MODULE)


def test_a_user_reward_function_trains_a_three_step_run(reward_module, tmp_path):
    config = load_config(
        MoveGroupTrainConfig,
        None,
        [*OVERRIDES, f"run.out_dir={tmp_path}", "run.name=mine", "task.reward_fn=my_rewards:capture_bonus"],
    )
    with Trainer(config) as trainer:
        trainer.train()
    rows = read_metrics(tmp_path / "mine" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]
    calls = reward_module.CALLS
    assert len(calls) == 3 * 4 * 4  # every sampled move of every step, once
    assert all(0.0 <= value <= 1.0 for _, _, value in calls)
    # The logged training reward is the function's: the engine's value plus the captures' bonus, per step.
    for row, step_calls in zip(rows, (calls[0:16], calls[16:32], calls[32:48])):
        expected = (
            sum(value + chess.Board(fen).is_capture(chess.Move.from_uci(uci)) for fen, uci, value in step_calls) / 16
        )
        assert row["reward/mean"] == pytest.approx(expected, abs=1e-5)


def test_a_constant_user_reward_gives_zero_advantages(reward_module, tmp_path):
    """The function is what GRPO learns from: equal rewards in every group leave nothing to learn (the KL term aside)."""
    config = load_config(
        MoveGroupTrainConfig,
        None,
        [*OVERRIDES, f"run.out_dir={tmp_path}", "run.name=flat", "steps=1", "task.reward_fn=my_rewards:constant"],
    )
    with Trainer(config) as trainer:
        trainer.train()
    [row] = read_metrics(tmp_path / "flat" / "metrics.jsonl")
    assert row["reward/mean"] == pytest.approx(0.25) and row["adv/mean"] == 0.0 and row["adv/std"] == 0.0
    assert (
        row["loss/policy"] == pytest.approx(0.0, abs=1e-7) and 0.0 < row["reward/win_prob"] < 1.0
    )  # the engine still values the moves


def test_a_bad_reward_function_fails_when_the_config_is_built(reward_module, tmp_path):
    for spec, problem in (
        ("my_rewards", "expected 'module:function'"),
        ("no_such_module_x:f", "does not import"),
        ("my_rewards:missing", "has no attribute 'missing'"),
        ("my_rewards:NOT_A_FUNCTION", "is a int, not a function"),
        ("my_rewards:two_arguments", "must take (board, move, win_probability)"),
    ):
        with pytest.raises(ConfigError) as error:
            load_config(MoveGroupTrainConfig, None, [*OVERRIDES, f"run.out_dir={tmp_path}", f"task.reward_fn={spec}"])
        assert f"task.reward_fn {spec!r}" in str(error.value) and problem in str(error.value), str(error.value)
