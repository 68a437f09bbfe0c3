"""A resumed training run continues its W&B run (train/backends.py, RUN_DIR/wandb_run_id): real tiny GRPO runs logging
to W&B offline, stopped at step 2 and resumed to step 4; the W&B run files are read back record by record."""

from __future__ import annotations

import dataclasses
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chessgrpo.config import EngineConfig, RunConfig, load_config
from chessgrpo.rl import GRPOConfig
from chessgrpo.tasks.kinds.move_group import MoveGroupEvalConfig, MoveGroupTrainConfig
from chessgrpo.tasks.move_group import MoveGroupConfig
from chessgrpo.train.backends import WANDB_ID_FILE, TrackingConfig
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics

pytest.importorskip("wandb")  # in the dev extra, so CI runs it


def _config(tmp_path: Path, **changes) -> MoveGroupTrainConfig:
    config = MoveGroupTrainConfig(
        run=RunConfig(name="wbr", out_dir=str(tmp_path), seed=0), init_checkpoint=None, positions="random:32",
        task=MoveGroupConfig(group_size=4, positions_per_step=4, reward_nodes=50),
        grpo=GRPOConfig(num_iterations=1, minibatch_size=0, kl_coef=0.05), engine=EngineConfig(nodes=None, processes=1, cache=False),
        eval=MoveGroupEvalConfig(positions=None, puzzles=None), steps=4, warmup_steps=0, checkpoint_every=2, threads=1,
        tracking=TrackingConfig(backends=["jsonl", "wandb"], wandb_project="chessgrpo-test"),
    )  # fmt: skip
    return dataclasses.replace(config, **changes)


def _records(path: Path) -> Iterator[object]:
    """The protobuf records of a W&B run file (``run-<id>.wandb``: LevelDB log framing, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B", path
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if position + 7 + length > len(data):  # still being written
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, or LAST of a FIRST/MIDDLE/LAST chain
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _finished_records(path: Path, timeout: float = 30.0) -> list:
    """The records of a run file once its exit record is there: W&B's service process may still be writing
    the file for a moment after `wandb.finish()` returns (seen here: a file with only its header)."""
    deadline = time.monotonic() + timeout
    while True:
        records = list(_records(path))
        if any(record.WhichOneof("record_type") == "exit" for record in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _wandb_runs(run_dir: Path) -> list[tuple[str, str, list[int], list[float]]]:
    """Each offline folder, oldest first: (folder, W&B run id, the steps of its history rows, their reward/mean)."""
    runs = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        [log] = folder.glob("run-*.wandb")
        run_ids, steps, rewards = [], [], []
        for record in _finished_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_ids.append(record.run.run_id)
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                steps.append(int(items["_step"]))
                rewards.append(float(items["reward/mean"]))
        [run_id] = run_ids
        runs.append((folder.name, run_id, steps, rewards))
    return runs


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch):
    for variable in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_a_stopped_and_resumed_run_is_one_wandb_run_whose_steps_continue(tmp_path):
    with Trainer(_config(tmp_path, stop_at=2)) as trainer:  # stopped at step 2 (and checkpointed), as an interrupt is
        trainer.train()
    run = tmp_path / "wbr"
    run_id = (run / WANDB_ID_FILE).read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{8}", run_id)
    resumed = load_config(MoveGroupTrainConfig, run / "config.yaml", ["stop_at=null"])
    with Trainer(resumed, resume=True) as trainer:
        assert trainer.step == 2
        trainer.train()

    assert (run / WANDB_ID_FILE).read_text().strip() == run_id
    (first, first_id, first_steps, first_rewards), (second, second_id, second_steps, second_rewards) = _wandb_runs(run)
    # One W&B run (one id in both folders' names and run records), written by two invocations.
    assert first_id == second_id == run_id and first.endswith(run_id) and re.search(rf"-{run_id}(-\d+)?$", second)
    # The resumed invocation continues the step count, and W&B holds the rows metrics.jsonl holds.
    assert first_steps == [1, 2] and second_steps == [3, 4]
    rows = read_metrics(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert first_rewards + second_rewards == pytest.approx([row["reward/mean"] for row in rows])


def test_a_fresh_run_in_the_same_directory_is_a_new_wandb_run(tmp_path):
    with Trainer(_config(tmp_path, steps=1, checkpoint_every=0)) as trainer:
        trainer.train()
    run = tmp_path / "wbr"
    first_id = (run / WANDB_ID_FILE).read_text().strip()
    with Trainer(_config(tmp_path, steps=1, checkpoint_every=0)) as trainer:  # not --resume: metrics.jsonl starts again
        trainer.train()
    second_id = (run / WANDB_ID_FILE).read_text().strip()
    assert second_id != first_id
    assert sorted(run_id for _, run_id, _, _ in _wandb_runs(run)) == sorted([first_id, second_id])
