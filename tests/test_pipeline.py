"""Pipelined GRPO steps (`grpo.pipeline`, train/pipeline.py): the next step's rollout runs on a snapshot of the
weights while the learner updates; the ratio check runs on the snapshot; resume stays bitwise; off = today's run.

Real Stockfish at small node limits, real Syzygy tables, real tiny models, real files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import chess
import pytest
import torch
from safetensors.torch import load_file

from chessgrpo.config import ConfigError, load_config
from chessgrpo.rl import InvariantViolation
from chessgrpo.tasks.kinds import config_class
from chessgrpo.tasks.kinds.move_group import MoveGroupKind
from chessgrpo.tasks.trajectory import TrajectoryConfig
from chessgrpo.train.distributed import Parallel
from chessgrpo.train.kind import RunContext
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import REPO_ROOT
from test_move_group import _config as move_group_config
from test_trajectory import _config as trajectory_config


def _pipelined(config, on: bool = True):
    return dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, pipeline=on))


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "latest" / "model.safetensors"))


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_switched_off_the_run_is_todays(tmp_path):
    """grpo.pipeline: false and the key absent give the same weights; pipelined, the same first step and other weights."""
    for name, config in (
        ("absent", move_group_config(tmp_path, "absent")),
        ("off", _pipelined(move_group_config(tmp_path, "off"), False)),
        ("on", _pipelined(move_group_config(tmp_path, "on"))),
    ):
        assert config.grpo.pipeline is (name == "on")
        with Trainer(config) as trainer:
            assert trainer.train().finished
    assert _same_weights(_weights(tmp_path / "absent"), _weights(tmp_path / "off"))
    assert not _same_weights(
        _weights(tmp_path / "absent"), _weights(tmp_path / "on")
    )  # later steps learn from lagged batches
    serial, piped = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("off", "on"))
    assert serial[0]["reward/mean"] == piped[0]["reward/mean"] and serial[0]["loss/total"] == piped[0]["loss/total"]
    assert all("ratio/lag_first_max_abs_dev" not in row for row in serial)


# Opening positions: every move is undecided, so the sampled moves of a group get different engine values (on
# `random:N` playouts most positions are already won or lost: every move is worth 0 or 1 there).
_OPENINGS = ("", "e2e4", "d2d4", "c2c4", "g1f3 d7d5", "e2e4 c7c5", "e2e4 e7e5 g1f3", "d2d4 g8f6 c2c4")


def _openings_file(path: Path) -> Path:
    lines = []
    for moves in _OPENINGS:
        board = chess.Board()
        for move in moves.split():
            board.push_uci(move)
        lines.append(board.fen() + "\n")
    path.write_text("".join(lines))
    return path


def test_next_rollout_samples_the_weights_before_the_update(tmp_path):
    """After step t the pending rollout's snapshot holds the pre-update weights; the first minibatch's check holds
    for the snapshot (deviation ~0) while the live weights are one update on (logged, > 0).

    Step 0 must have a gradient, else the update is a no-op and the snapshot equals the live weights whichever it
    holds. On `random:N` positions every group of step 0 had all-equal rewards (0 or 1): the policy loss was 0 and
    the KL term at the reference 0 up to rounding, so the weights moved only where the learner's forward rounded
    differently from the sampler's (not with ATEN_CPU_CAPABILITY=default, say). Opening positions give signal."""
    positions = str(_openings_file(tmp_path / "openings.fen"))
    with Trainer(_pipelined(move_group_config(tmp_path, "lag", positions=positions))) as trainer:
        before = {k: v.clone() for k, v in trainer.kind.model.state_dict().items()}
        first = trainer.train_step()
        assert first["rollout/frac_reward_zero_std"] == 0.0  # every group has signal: the update has a gradient
        pending = trainer.kind.state_dict()["pipeline"]
        assert pending["step"] == 1 and _same_weights(pending["weights"], before)
        assert not _same_weights(trainer.kind.model.state_dict(), before)
        second = trainer.train_step()
    assert first["ratio/lag_first_max_abs_dev"] < 1e-4  # step 0 sampled the live weights
    assert second["ratio/first_max_abs_dev"] < 1e-4 < second["ratio/lag_first_max_abs_dev"]
    assert second["perf/rollout_wait_s"] >= 0 and second["perf/step_s"] > second["perf/learn_s"]


def test_ratio_check_still_fires_on_the_snapshot(tmp_path):
    """A learning temperature that differs from the sampling one is caught at every pipelined step, not only the first."""
    with (
        Trainer(_pipelined(move_group_config(tmp_path, "mismatch", debug_learn_temperature=1.3))) as trainer,
        pytest.raises(InvariantViolation, match="sampling snapshot"),
    ):
        trainer.train_step()


def test_pipelined_move_group_resumes_bitwise(tmp_path):
    with Trainer(_pipelined(move_group_config(tmp_path, "straight"))) as trainer:
        assert trainer.train().finished
    with Trainer(_pipelined(move_group_config(tmp_path, "resumed", stop_at=2))) as trainer:
        assert not trainer.train().finished and trainer.step == 2
    with Trainer(_pipelined(move_group_config(tmp_path, "resumed")), resume=True) as trainer:
        assert trainer.step == 2 and trainer.train().finished
    assert _same_weights(_weights(tmp_path / "straight"), _weights(tmp_path / "resumed"))
    rows, straight = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("resumed", "straight"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward/mean", "loss/total", "ratio/first_max_abs_dev", "ratio/lag_first_max_abs_dev"):
        assert [r[key] for r in rows] == [r[key] for r in straight], key


def test_pipelined_trajectory_resumes_bitwise_with_its_curriculum_and_evaluations(tmp_path):
    """Endgame trajectories against the tablebase with the adaptive curriculum (a state each rollout changes) and an
    evaluation every 2 steps (which waits for the rollout in flight): a resumed run is the straight run."""
    adaptive = {
        "steps": 6,
        "curriculum_start_dtz": 1,
        "curriculum_widen_at": 0.08,
        "curriculum_widen_plies": 2,
        "curriculum_window": 2,
        "checkpoint_every": 1,
        "eval_every": 2,
        "lr": 3e-3,
        "task": TrajectoryConfig(group_size=4, positions_per_step=4, horizon=2, opponent="tablebase"),
    }
    with Trainer(_pipelined(trajectory_config(tmp_path, "straight", **adaptive))) as trainer:
        assert trainer.train().finished
    with Trainer(_pipelined(trajectory_config(tmp_path, "resumed", **adaptive))) as trainer:
        # Interrupted after step 2, whose evaluation waited for step 3's rollout: it has run (and moved the curriculum)
        # when the checkpoint is written, so the checkpoint must hold the state from before it.
        trainer.train(progress=lambda step, row: step == 2 and trainer.request_stop())
    with Trainer(_pipelined(trajectory_config(tmp_path, "resumed", **adaptive)), resume=True) as trainer:
        assert trainer.step == 2 and trainer.train().finished
    assert _same_weights(_weights(tmp_path / "straight"), _weights(tmp_path / "resumed"))
    rows, straight = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("resumed", "straight"))
    for key in ("rollout/curriculum_max_dtz", "rollout/mate_rate", "loss/total", "eval/mate_rate"):
        assert [r.get(key) for r in rows] == [r.get(key) for r in straight], key
    assert sum("eval/mate_rate" in r for r in straight) == 3
    assert straight[-1]["rollout/curriculum_max_dtz"] > 1  # the curriculum widened: its state mattered


def test_pipelined_trajectory_searches_engine_rewards_as_it_plays_with_the_serial_rewards(tmp_path):
    """Against Stockfish with engine rewards, a pipelined rollout hands each position to the pool as it is reached
    (`task.overlap_rewards`' path, without the key): its first step, sampled from the same weights, has the serial
    step's rewards and loss exactly."""
    engine_rewards = {
        "steps": 2,
        "positions": "random:16",
        "task": TrajectoryConfig(
            group_size=2,
            positions_per_step=2,
            horizon=2,
            opponent="stockfish",
            opponent_nodes=50,
            reward="engine",
            reward_nodes=100,
        ),
    }
    for name, on in (("serial", False), ("piped", True)):
        with Trainer(_pipelined(trajectory_config(tmp_path, name, **engine_rewards), on)) as trainer:
            assert not trainer.config.task.overlap_rewards
            assert trainer.train().finished
    serial, piped = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("serial", "piped"))
    assert serial[0]["reward/mean"] == piped[0]["reward/mean"] and serial[0]["loss/total"] == piped[0]["loss/total"]


def test_kinds_that_cannot_pipeline_refuse_the_switch(tmp_path):
    with pytest.raises(ConfigError, match="grpo.pipeline"):
        load_config(config_class("mixture"), REPO_ROOT / "configs" / "grpo_mixture_tiny.yaml", ["grpo.pipeline=true"])
    config = _pipelined(move_group_config(tmp_path, "ranks"))
    two_ranks = RunContext(tmp_path / "ranks", torch.device("cpu"), 0, parallel=Parallel(rank=0, world_size=2))
    with pytest.raises(ConfigError, match="data-parallel"):
        MoveGroupKind(config, two_ranks)


def test_a_rollback_drops_the_rollout_in_flight_and_replays_the_checkpoints(tmp_path):
    """Non-finite updates force a rollback to the step-2 checkpoint: the rollout in flight (sampled from weights the
    rollback discards) is dropped, step 2's rollout re-runs from the checkpoint's snapshot, and the run finishes."""
    from chessgrpo.train.config import DebugConfig, DivergenceConfig

    config = _pipelined(
        move_group_config(
            tmp_path,
            "rollback",
            steps=8,
            checkpoint_every=2,
            min_lr_ratio=1.0,
            debug=DebugConfig(nonfinite_at_step=4, nonfinite_steps=3),
            divergence=DivergenceConfig(max_consecutive_skips=3, lr_backoff=0.5),
        )
    )
    with Trainer(config) as trainer:
        result = trainer.train()
        assert trainer.rollbacks == 1 and trainer.lr_scale == 0.5
    assert result.finished and result.step == 8
    rows = [row for row in read_metrics(tmp_path / "rollback" / "metrics.jsonl") if "loss/total" in row]
    assert rows[-1]["step"] == 8 and all(row["ratio/first_max_abs_dev"] < 1e-4 for row in rows)
    # The first step after the rollback learned from the checkpoint's snapshot (one update behind), not the live weights.
    assert [row["ratio/lag_first_max_abs_dev"] > 1e-4 for row in rows if row["step"] == 3] == [True]
