"""A resumed training run continues its W&B run (train/backends.py, RUN_DIR/wandb_run_id), and W&B's history is
metrics.jsonl's rows: real tiny GRPO runs logging to W&B offline, stopped at a checkpoint, rolled back by a divergence,
or killed with SIGKILL between checkpoints, then run to the end; the W&B run files are read back record by record."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chessgrpo.config import EngineConfig, RunConfig, load_config, save_config
from chessgrpo.rl import GRPOConfig
from chessgrpo.tasks.kinds.move_group import MoveGroupEvalConfig, MoveGroupTrainConfig
from chessgrpo.tasks.move_group import MoveGroupConfig
from chessgrpo.train.backends import WANDB_ID_FILE, TrackingConfig
from chessgrpo.train.config import DebugConfig, DivergenceConfig
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from test_train_backends import _scalars

pytest.importorskip("wandb")  # in the dev extra, so CI runs it


def _config(tmp_path: Path, **changes) -> MoveGroupTrainConfig:
    config = MoveGroupTrainConfig(
        run=RunConfig(name="wbr", out_dir=str(tmp_path), seed=0),
        init_checkpoint=None,
        positions="random:32",
        task=MoveGroupConfig(group_size=4, positions_per_step=4, reward_nodes=50),
        grpo=GRPOConfig(num_iterations=1, minibatch_size=0, kl_coef=0.05),
        engine=EngineConfig(nodes=None, processes=1, cache=False),
        eval=MoveGroupEvalConfig(positions=None, puzzles=None),
        steps=4,
        warmup_steps=0,
        checkpoint_every=2,
        threads=1,
        tracking=TrackingConfig(backends=["jsonl", "wandb"], wandb_project="chessgrpo-test"),
    )
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


def _wandb_history(run_dir: Path, killed: int | None = None) -> list[tuple[int, dict[str, float]]]:
    """Every history row of the run's offline folders, oldest folder first: (step, its metrics without W&B's own
    ``_`` keys). Folder number `killed` (0-based) was SIGKILLed: it has no exit record, so it is read as it is."""
    history = []
    for number, folder in enumerate(sorted((run_dir / "wandb").glob("offline-run-*"))):
        [log] = folder.glob("run-*.wandb")
        records = list(_records(log)) if number == killed else _finished_records(log)
        for record in records:
            if record.WhichOneof("record_type") == "history":
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                history.append((int(items["_step"]), {k: v for k, v in items.items() if not k.startswith("_")}))
    return history


def _jsonl_history(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """metrics.jsonl as W&B holds it: one row per step (a rollback's row joins its checkpoint's step; a later value
    of a key wins), without ``step`` and ``time`` (W&B keeps its own)."""
    history: list[tuple[int, dict[str, float]]] = []
    for row in read_metrics(run_dir / "metrics.jsonl"):
        values = {k: v for k, v in row.items() if k not in ("step", "time")}
        if history and history[-1][0] == row["step"]:
            history[-1][1].update(values)
        else:
            history.append((row["step"], values))
    return history


def _assert_tensorboard_has_the_jsonl_rows(run_dir: Path) -> None:
    """TensorBoard keeps every row (two at a rollback's checkpoint step), so each metric's events are its JSONL values
    in file order; the abandoned steps are purged (float32: approximately)."""
    scalars = {
        tag: events for tag, events in _scalars(run_dir / "tensorboard").items() if events
    }  # a purged tag stays, empty
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert set(scalars) == {key for row in rows for key in row} - {"step", "time"}
    for tag, events in scalars.items():
        assert [step for step, _ in events] == [row["step"] for row in rows if tag in row], tag
        assert [value for _, value in events] == pytest.approx(
            [row[tag] for row in rows if tag in row], rel=1e-6, nan_ok=True
        ), tag


# TensorBoard too where it is installed (both are in the dev extra): it must purge what a rollback or a resume replaces.
_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
_BACKENDS = ["jsonl", "wandb", *(["tensorboard"] if _TENSORBOARD else [])]


def _assert_same_history(wandb: list[tuple[int, dict[str, float]]], jsonl: list[tuple[int, dict[str, float]]]) -> None:
    """The same steps in the same order, each with the same keys and exactly the same values (NaN equal to NaN)."""
    assert [step for step, _ in wandb] == [step for step, _ in jsonl]
    for (step, got), (_, want) in zip(wandb, jsonl):
        assert got.keys() == want.keys(), step
        same = [
            g == w or (isinstance(g, float) and math.isnan(g) and math.isnan(w))
            for g, w in ((got[k], want[k]) for k in want)
        ]
        assert all(same), (step, got, want)


def _wait_for_writers(run_dir: Path, timeout: float = 30.0) -> None:
    """Wait until the killed process's W&B service has stopped writing its run file (it outlives its client a moment)."""
    deadline, previous = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        sizes = [path.stat().st_size for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))]
        if sizes == previous:
            return
        previous = sizes
        time.sleep(1.0)


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch):
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


def test_wandb_history_equals_metrics_jsonl_after_a_divergence_rollback(tmp_path):
    """Steps 4-6 are poisoned (the debug hook): three skips in a row roll the run back to its step-2 checkpoint, which
    rewinds metrics.jsonl and re-runs steps 3-6. W&B must not keep the abandoned rows 3-5 (nor drop the new ones)."""
    config = _config(
        tmp_path,
        steps=6,
        debug=DebugConfig(nonfinite_at_step=4, nonfinite_steps=3),
        divergence=DivergenceConfig(max_consecutive_skips=3, lr_backoff=0.5),
        tracking=TrackingConfig(backends=_BACKENDS, wandb_project="chessgrpo-test"),
    )
    with Trainer(config) as trainer:
        result = trainer.train()
        assert trainer.rollbacks == 1 and result.finished
    run = tmp_path / "wbr"
    jsonl = _jsonl_history(run)
    assert [step for step, _ in jsonl] == [1, 2, 3, 4, 5, 6] and "health/rollback" in jsonl[1][1]
    _assert_same_history(_wandb_history(run), jsonl)
    if _TENSORBOARD:
        _assert_tensorboard_has_the_jsonl_rows(run)


_KILLED_AT_STEP_5 = """
import os, signal, sys
from chessgrpo.config import load_config
from chessgrpo.tasks.kinds.move_group import MoveGroupTrainConfig
from chessgrpo.train.loop import Trainer

def progress(step, row):
    if step == 5:  # rows 4 and 5 are logged, the step-3 checkpoint is the last one: die as a crash would
        os.kill(os.getpid(), signal.SIGKILL)

with Trainer(load_config(MoveGroupTrainConfig, sys.argv[1])) as trainer:
    trainer.train(progress)
"""


def test_wandb_history_equals_metrics_jsonl_after_a_kill_and_resume(tmp_path):
    """A training process SIGKILLed at step 5 (checkpoints every 3 steps), resumed from its step-3 checkpoint to step 6:
    W&B must hold the rows metrics.jsonl holds, each step once, steps 4 and 5 from the resumed run. (W&B's service
    drops the unwritten tail of the killed process's run file, here all of it: the resume re-sends what W&B lacks.)"""
    tracking = TrackingConfig(backends=_BACKENDS, wandb_project="chessgrpo-test")
    path = save_config(_config(tmp_path, steps=6, checkpoint_every=3, tracking=tracking), tmp_path / "killed.yaml")
    # Its own W&B service, as a separate invocation has (not this process's, which WANDB_SERVICE would name).
    env = {name: value for name, value in os.environ.items() if name != "WANDB_SERVICE"}
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_STEP_5, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    run = tmp_path / "wbr"
    killed_rows = read_metrics(run / "metrics.jsonl")
    assert [row["step"] for row in killed_rows] == [1, 2, 3, 4, 5]
    _wait_for_writers(run)
    with Trainer(load_config(MoveGroupTrainConfig, run / "config.yaml"), resume=True) as trainer:
        assert trainer.step == 3
        trainer.train()
    jsonl = _jsonl_history(run)
    assert [step for step, _ in jsonl] == [1, 2, 3, 4, 5, 6]
    _assert_same_history(_wandb_history(run, killed=0), jsonl)
    if _TENSORBOARD:
        _assert_tensorboard_has_the_jsonl_rows(run)
