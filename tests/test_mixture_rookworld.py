"""The chess LM's GRPO kind (`kind: rookworld`) as tasks of a `kind: mixture`: the GRPO task contract at work.

A tiny fresh LM (one layer), a 40-position RookWorld dataset labelled by real Stockfish at a small
node limit, two steps per run.
"""

from __future__ import annotations

import pytest

from chessgrpo.config import ConfigError, from_dict, load_config
from chessgrpo.tasks.kinds.mixture import MixtureTrainConfig
from chessgrpo.tasks.kinds.rookworld import RookWorldTrainConfig
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from conftest import ROOKWORLD_NODES as NODES

MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2}


def _task(root, **task) -> dict:
    """A rookworld task's own keys (the shared ones are the mixture's)."""
    return {
        "data": str(root / "data"),
        "task": {"group_size": 2, "max_new_tokens": 12, "temperature": 1.0, **task},
        "rewards": {"policy": {"nodes": NODES}},
        "eval": {"policy_prompts": 0, "environment_prompts": 0},
    }


def _mixture(root, name: str, tasks: list[dict]) -> MixtureTrainConfig:
    return from_dict(
        MixtureTrainConfig,
        {
            "kind": "mixture",
            "run": {"name": name, "out_dir": str(root / "runs"), "seed": 0},
            "steps": 2,
            "log_every": 1,
            "eval_every": 0,
            "eval_at_start": False,
            "checkpoint_every": 0,
            "init_checkpoint": None,
            "model": MODEL,
            "groups_per_step": 4,
            "tasks": tasks,
            "engine": {"processes": 1, "cache_path": str(root / "cache.sqlite")},
            "grpo": {"advantage_estimator": "grpo", "minibatch_size": 4},
        },
    )


def test_a_mixture_of_one_rookworld_task_is_that_task(rookworld_data):
    data = rookworld_data
    """Weight 1 on one LM task: the same prompts, completions, rewards and updates as `kind: rookworld` alone."""
    mixture = _mixture(data, "mixture", [{"name": "text", "kind": "rookworld", "weight": 1.0, "config": _task(data)}])
    alone = from_dict(
        RookWorldTrainConfig,
        {
            **{
                key: getattr(mixture, key)
                for key in ("steps", "log_every", "eval_every", "eval_at_start", "checkpoint_every", "init_checkpoint")
            },
            **_task(data, prompts_per_step=mixture.groups_per_step),
            "kind": "rookworld",
            "model": MODEL,
            "run": {"name": "alone", "out_dir": str(data / "runs"), "seed": 0},
            "engine": {"processes": 1, "cache_path": str(data / "cache.sqlite")},
            "grpo": {"advantage_estimator": "grpo", "minibatch_size": 4},
        },
    )
    for config in (mixture, alone):
        with Trainer(config) as trainer:
            assert trainer.train().finished
    rows = read_metrics(data / "runs" / "mixture" / "metrics.jsonl")
    rows_alone = read_metrics(data / "runs" / "alone" / "metrics.jsonl")
    assert len(rows) == len(rows_alone) == 2
    for row, row_alone in zip(rows, rows_alone):
        assert row["reward/mean"] == row_alone["reward/mean"]
        assert row["reward/text/policy_total"] == row_alone["reward/policy_total"]
        assert row["loss/total"] == pytest.approx(row_alone["loss/total"], abs=1e-6)
        assert row["grad_norm"] == pytest.approx(row_alone["grad_norm"], rel=1e-5)


def test_a_policy_task_and_an_environment_task_train_one_lm_together(rookworld_data):
    data = rookworld_data
    mixture = _mixture(
        data,
        "two_tasks",
        [
            {"name": "moves", "kind": "rookworld", "weight": 0.5, "config": _task(data, policy_fraction=1.0)},
            {"name": "rules", "kind": "rookworld", "weight": 0.5, "config": _task(data, policy_fraction=0.0)},
        ],
    )
    with Trainer(mixture) as trainer:
        assert trainer.train().finished
    rows = read_metrics(data / "runs" / "two_tasks" / "metrics.jsonl")
    assert any("reward/moves/policy_total" in row for row in rows)
    assert any("reward/rules/environment_total" in row for row in rows)
    assert not any("reward/moves/environment_total" in row or "reward/rules/policy_total" in row for row in rows)
    assert (data / "runs" / "two_tasks" / "checkpoints" / "latest").exists()


def test_tasks_of_two_policy_families_are_refused(rookworld_data, tmp_path):
    data = rookworld_data
    with pytest.raises(ConfigError, match="one policy family"):
        _mixture(
            data,
            "mixed",
            [
                {"name": "text", "kind": "rookworld", "config": _task(data)},
                {"name": "moves", "kind": "move_group", "config": {}},
            ],
        )
    with pytest.raises(ConfigError, match="prompts_per_step"):
        _mixture(data, "counted", [{"name": "text", "kind": "rookworld", "config": _task(data, prompts_per_step=4)}])


def test_the_shipped_lm_mixture_config_loads():
    config = load_config(MixtureTrainConfig, "configs/rookworld_mixture_tiny.yaml")
    assert {task.kind for task in config.tasks} == {"rookworld"} and len(config.task_configs()) == 2
