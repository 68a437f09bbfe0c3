"""Tracking (train/backends.py, through train/metrics.py's writer): metrics.jsonl always; TensorBoard
and W&B (offline) with the same metric names and the resolved config, from real short GRPO and
pretraining runs. The backend tests skip when their package is missing (both are in the `dev`
extra, so CI runs them)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from chessgrpo.board import random_playout_positions
from chessgrpo.config import ConfigError, EngineConfig, RunConfig, load_config, to_dict
from chessgrpo.data.schema import write_shard
from chessgrpo.engine import EnginePool
from chessgrpo.rl import GRPOConfig
from chessgrpo.tasks.kinds.move_group import MoveGroupEvalConfig, MoveGroupTrainConfig
from chessgrpo.tasks.kinds.pretrain import PretrainTrainConfig
from chessgrpo.tasks.move_group import MoveGroupConfig
from chessgrpo.train import backends
from chessgrpo.train.backends import BackendUnavailable, TrackingConfig
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import MetricsWriter, read_metrics
from test_diagnose import labelled_row

REPO = Path(__file__).resolve().parents[1]


def _grpo(tmp_path: Path, name: str, tracking: TrackingConfig, steps: int = 3) -> MoveGroupTrainConfig:
    return MoveGroupTrainConfig(
        run=RunConfig(name=name, out_dir=str(tmp_path), seed=0),
        init_checkpoint=None,
        positions="random:32",
        task=MoveGroupConfig(group_size=4, positions_per_step=4, reward_nodes=50),
        grpo=GRPOConfig(num_iterations=1, minibatch_size=0, kl_coef=0.05),
        engine=EngineConfig(nodes=None, processes=1, cache=False),
        eval=MoveGroupEvalConfig(positions=None, puzzles=None),
        steps=steps,
        warmup_steps=0,
        checkpoint_every=0,
        threads=1,
        tracking=tracking,
    )


def _metric_names(run_dir: Path) -> set[str]:
    return {key for row in read_metrics(run_dir / "metrics.jsonl") for key in row} - {"step", "time"}


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def _config_text(log_dir: Path) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    [event] = accumulator.Tensors("config/text_summary")
    return event.tensor_proto.string_val[0].decode()


# ------------------------------------------------------------------------------------------------
# Config


def test_tracking_config_validates_backends(monkeypatch):
    assert TrackingConfig().backends == ["jsonl"]
    with pytest.raises(ConfigError, match="unknown backend.*mlflow"):
        load_config(MoveGroupTrainConfig, REPO / "configs" / "grpo_tiny.yaml", ["tracking.backends=[jsonl,mlflow]"])
    with pytest.raises(ConfigError, match="twice"):
        TrackingConfig(backends=["jsonl", "jsonl"])
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config(MoveGroupTrainConfig, None, ["tracking.wandb_mode=sometimes"])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        backends.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real_find_spec(name, *a)
    )
    with pytest.raises(BackendUnavailable, match=r"pip install 'chessgrpo\[tracking\]'") as error:
        load_config(PretrainTrainConfig, REPO / "configs" / "pretrain_tiny.yaml", ["tracking.backends=[jsonl,wandb]"])
    assert isinstance(error.value, ConfigError) and "wandb" in str(error.value)


def test_shipped_configs_have_a_tracking_section():
    for path, cls in (("grpo_tiny.yaml", MoveGroupTrainConfig), ("pretrain_tiny.yaml", PretrainTrainConfig)):
        assert "\ntracking:\n" in (REPO / "configs" / path).read_text()
        assert load_config(cls, REPO / "configs" / path).tracking == TrackingConfig()


def test_jsonl_only_writer_is_unchanged(tmp_path):
    with MetricsWriter(tmp_path / "m.jsonl", tracking=TrackingConfig(), run_config={"a": 1}) as writer:
        writer.log(1, {"loss/total": 0.5})
    assert [r["loss/total"] for r in read_metrics(tmp_path / "m.jsonl")] == [0.5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]  # no other backend wrote anything


# ------------------------------------------------------------------------------------------------
# TensorBoard


def test_grpo_run_logs_the_same_metrics_and_config_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    config = _grpo(tmp_path, "tb", TrackingConfig(backends=["jsonl", "tensorboard"]))
    with Trainer(config) as trainer:
        trainer.train()
    run = tmp_path / "tb"
    scalars = _scalars(run / "tensorboard")
    assert set(scalars) == _metric_names(run)  # the same names, every one of them
    rows = read_metrics(run / "metrics.jsonl")
    assert [step for step, _ in scalars["reward/mean"]] == [r["step"] for r in rows] == [1, 2, 3]
    assert [v for _, v in scalars["reward/mean"]] == pytest.approx([r["reward/mean"] for r in rows])
    text = _config_text(run / "tensorboard")
    assert "kl_coef: 0.05" in text and "backends:" in text and "tensorboard" in text


def test_pretraining_logs_to_tensorboard_and_resume_purges_later_steps(tmp_path):
    pytest.importorskip("tensorboard")
    torch.set_num_threads(1)
    boards = random_playout_positions(24, seed=3, max_plies=20)
    with EnginePool(processes=1, nodes=100, cache_path=None) as pool:
        analyses = pool.analyse_many(boards, multipv=2)
    rows = [
        labelled_row(b, [line.move for line in a.lines], [line.win_probability for line in a.lines], 100)
        for b, a in zip(boards, analyses)
    ]
    write_shard(rows, tmp_path / "data" / "train" / "shard-00000.parquet")
    config = PretrainTrainConfig(
        run=RunConfig(name="pre", out_dir=str(tmp_path)),
        data=str(tmp_path / "data"),
        batch_size=8,
        steps=4,
        warmup_steps=1,
        log_every=1,
        checkpoint_every=2,
        threads=1,
        tracking=TrackingConfig(backends=["tensorboard"]),
    )
    with Trainer(config) as trainer:
        trainer.train()
    run = tmp_path / "pre"
    scalars = _scalars(run / "tensorboard")
    assert set(scalars) == _metric_names(run) and [s for s, _ in scalars["loss/train"]] == [1, 2, 3, 4]
    assert "objective: bc" in _config_text(run / "tensorboard")
    # A resume from step 2 keeps rows <= 2 in metrics.jsonl; TensorBoard drops the events after step 2 too.
    with MetricsWriter(
        run / "metrics.jsonl", resume_step=2, tracking=config.tracking, run_config=to_dict(config)
    ) as writer:
        writer.log(3, {"loss/train": 123.0})
    steps = _scalars(run / "tensorboard")["loss/train"]
    assert [s for s, _ in steps] == [1, 2, 3] and steps[-1][1] == 123.0


# ------------------------------------------------------------------------------------------------
# Weights & Biases (offline)


def test_grpo_run_logs_to_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for variable in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = _grpo(tmp_path, "wb", TrackingConfig(backends=["jsonl", "wandb"], wandb_project="chessgrpo-test"), steps=2)
    with Trainer(config) as trainer:
        trainer.train()
    run = tmp_path / "wb"
    [log] = list((run / "wandb").glob("offline-run-*/run-*.wandb"))  # offline: a local run file, nothing uploaded
    data = log.read_bytes()
    for name in _metric_names(run):  # the same metric names as metrics.jsonl
        assert name.encode() in data, name
    for key in ("entropy_coef", "reward_nodes", "chessgrpo-test"):  # the resolved config and the project
        assert key.encode() in data, key
    assert dataclasses.asdict(config.tracking)["wandb_mode"] == "offline"


def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    """`--resume` keeps the W&B run id (RUN_DIR/wandb_run_id): one run, its steps continuing, not a second run."""
    pytest.importorskip("wandb")
    for variable in (
        "WANDB_API_KEY",
        "WANDB_MODE",
        "WANDB_DIR",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_RUN_ID",
        "WANDB_RESUME",
    ):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracking = TrackingConfig(backends=["jsonl", "wandb"], wandb_project="chessgrpo-test")
    config = dataclasses.replace(_grpo(tmp_path, "wbr", tracking, steps=2), checkpoint_every=2)
    with Trainer(config) as trainer:
        trainer.train()
    run = tmp_path / "wbr"
    run_id = (run / "wandb_run_id").read_text().strip()
    resumed = load_config(MoveGroupTrainConfig, run / "config.yaml", ["steps=3"])
    with Trainer(resumed, resume=True) as trainer:
        assert trainer.step == 2
        trainer.train()
    assert (run / "wandb_run_id").read_text().strip() == run_id
    runs = sorted((run / "wandb").glob("offline-run-*"))
    # One W&B run written twice (W&B adds "-1" to the second folder when both start in the same second).
    assert len(runs) == 2 and all(
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", path.name) for path in runs
    ), runs
    assert b"reward/mean" in next(runs[-1].glob("run-*.wandb")).read_bytes()
