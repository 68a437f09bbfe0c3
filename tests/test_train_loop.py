"""The training spine's run safety (train/loop.py), once for every kind (real processes, real Stockfish, tiny models).

Divergence recovery (the NaN hook), early stops (KL, never at step 0), verified checkpoints (a
corrupt latest falls back), retention of the best checkpoint, the run-directory lock, SIGTERM then
--resume equal to an uninterrupted run, plain run names, one-line expected errors.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from chessgrpo.config import ConfigError, load_config
from chessgrpo.errors import RunLocked, TrainingDiverged
from chessgrpo.models.policy import load_policy
from chessgrpo.tasks.kinds.move_group import MoveGroupTrainConfig
from chessgrpo.track.diagnose import diagnose_run
from chessgrpo.train.checkpoint import latest_checkpoint, list_checkpoints
from chessgrpo.train.lock import LOCK_FILE, RunLock
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import NO_LABELLED_LOSSES, data_file

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "chessgrpo.cli"]


def tiny_overrides(tmp_path: Path, name: str = "run") -> list[str]:
    """A from-scratch move_group run that takes well under a second a step."""
    return [
        f"run.out_dir={tmp_path}",
        f"run.name={name}",
        "init_checkpoint=null",
        "positions=random:64",
        "position_mixture=[]",
        "eval.positions=null",
        f"eval.puzzles={data_file('lichess_puzzles_dev.csv')}",
        "eval.max_puzzles=16",
        "task.positions_per_step=4",
        "task.group_size=4",
        "task.reward_nodes=30",
        "task.best_move_values=false",
        "grpo.minibatch_size=8",
        "engine.processes=1",
        f"engine.cache_path={tmp_path}/cache.sqlite",
        "threads=1",
        "warmup_steps=0",
        "lr=3e-3",
        *NO_LABELLED_LOSSES,
    ]


def tiny_config(tmp_path: Path, *overrides: str, name: str = "run") -> MoveGroupTrainConfig:
    return load_config(
        MoveGroupTrainConfig, ROOT / "configs/grpo_tiny.yaml", [*tiny_overrides(tmp_path, name), *overrides]
    )


def weights(run_dir: Path) -> dict:
    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].equal(b[key]), key


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_nan_hook_skips_the_update_and_the_run_finishes(tmp_path):
    config = tiny_config(tmp_path, "steps=6", "eval_every=0", "debug.nonfinite_at_step=3")
    with Trainer(config) as trainer:
        result = trainer.train()
    assert result.finished and result.step == 6
    run_dir = config.run.directory
    assert [e["event"] for e in events(run_dir)] == ["nonfinite_skip"]
    rows = {row["step"]: row for row in read_metrics(run_dir / "metrics.jsonl")}
    assert rows[3]["health/nonfinite_skip"] == 1.0 and "loss/total" not in rows[3]
    assert "health/nonfinite_skip" not in rows[4]
    assert {f.id for f in diagnose_run(run_dir)} >= {"health.nonfinite_skip"}


def test_repeated_nan_rolls_back_with_a_lower_lr_and_recovers(tmp_path):
    config = tiny_config(
        tmp_path,
        "steps=8",
        "eval_every=0",
        "checkpoint_every=2",
        "debug.nonfinite_at_step=4",
        "debug.nonfinite_steps=3",
        "divergence.max_consecutive_skips=3",
        "divergence.lr_backoff=0.5",
        "min_lr_ratio=1.0",  # a constant lr after warmup, so the backed-off lr is exactly half of it
    )
    with Trainer(config) as trainer:
        result = trainer.train()
        assert trainer.lr_scale == 0.5 and trainer.rollbacks == 1
    assert result.finished and result.step == 8
    run_dir = config.run.directory
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds == ["nonfinite_skip"] * 3 + ["rollback"]
    assert "step_000002" in events(run_dir)[-1]["message"]  # the last checkpoint before the NaN steps
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == sorted(row["step"] for row in rows)  # rewound, never backwards
    after = [row for row in rows if row["step"] > 2 and "lr" in row and "loss/total" in row]
    assert after and all(abs(row["lr"] - 1.5e-3) < 1e-12 for row in after)
    assert "health.rollback" in {f.id for f in diagnose_run(run_dir)}


def test_divergence_that_does_not_recover_stops_with_a_clear_error(tmp_path):
    config = tiny_config(
        tmp_path,
        "steps=8",
        "eval_every=0",
        "debug.nonfinite_at_step=2",
        "debug.nonfinite_steps=20",
        "divergence.max_consecutive_skips=2",
        "divergence.max_rollbacks=1",
    )
    with Trainer(config) as trainer, pytest.raises(TrainingDiverged, match="rollback"):
        trainer.train()
    assert [e["event"] for e in events(config.run.directory)][-1] == "diverged"
    assert latest_checkpoint(config.run.directory).name == "step_000000"  # nothing poisoned was saved


def test_kl_stop_fires_on_a_drifting_run_and_never_at_step_0(tmp_path):
    # At step 1 the rollout's policy is the reference itself: exact KL 0, so even a tiny threshold must not fire.
    config = tiny_config(
        tmp_path,
        "steps=40",
        "eval_every=0",
        "lr=0.05",
        "grpo.kl_coef=0.0",
        "early_stop.kl_max=1e-9",
        "early_stop.kl_patience=1",
    )
    with Trainer(config) as trainer:
        result = trainer.train()
    rows = {row["step"]: row for row in read_metrics(config.run.directory / "metrics.jsonl")}
    assert rows[1]["kl/exact"] == 0.0
    assert not result.finished and 2 <= result.step < 40
    assert result.stop_reason.startswith("early stop: KL to the reference")
    assert rows[result.step]["health/early_stop"] == 1.0
    assert latest_checkpoint(config.run.directory).name == f"step_{result.step:06d}"  # a stop checkpoints
    assert "health.early_stop" in {f.id for f in diagnose_run(config.run.directory)}


@pytest.mark.parametrize(
    ("estimator", "kl_coef", "stops"), [("k1", 0.0, False), ("k3", 0.1, True), ("exact", 0.1, True)]
)
def test_a_signed_kl_estimator_cannot_feed_the_stop_rule(rookworld_data, estimator, kl_coef, stops):
    """The chess LM logs no rollout-time exact KL, only the learner's term: a k1 estimate (which can go negative;
    measured only, since k1 is refused as a loss) must never trip `early_stop.kl_max`, while the non-negative k3
    estimate and the exact per-token KL of the same run do."""
    from chessgrpo.config import from_dict
    from chessgrpo.tasks.kinds.rookworld import RookWorldTrainConfig
    from conftest import ROOKWORLD_NODES

    config = from_dict(
        RookWorldTrainConfig,
        {
            "run": {"name": f"kl_{estimator}", "out_dir": str(rookworld_data / "runs"), "seed": 0},
            "init_checkpoint": None,
            "model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
            "data": str(rookworld_data / "data"),
            "task": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "temperature": 1.0},
            "rewards": {"policy": {"nodes": ROOKWORLD_NODES}},
            "eval": {"policy_prompts": 0, "environment_prompts": 0},
            "engine": {"processes": 1, "cache_path": str(rookworld_data / "cache.sqlite")},
            "grpo": {
                "kl_estimator": estimator,
                "kl_coef": kl_coef,
                "kl_schedule": "fixed",
                "minibatch_size": 4,
                "entropy_coef": 0.01,
            },  # an untrained LM scores every answer alike: the entropy term moves it
            "steps": 4,
            "lr": 0.05,
            "warmup_steps": 0,
            "eval_every": 0,
            "eval_at_start": False,
            "checkpoint_every": 0,
            "early_stop": {"kl_max": 1e-12, "kl_patience": 1},
        },
    )
    with Trainer(config) as trainer:
        result = trainer.train()
    rows = read_metrics(config.run.directory / "metrics.jsonl")
    assert all("kl/exact" not in row and "kl/value" in row for row in rows)
    assert result.finished is not stops
    assert (result.stop_reason or "").startswith("early stop: KL to the reference") is stops


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    config = tiny_config(tmp_path, "steps=4", "eval_every=0", "checkpoint_every=2", "keep_checkpoints=3")
    with Trainer(config) as trainer:
        trainer.train()
    run_dir = config.run.directory
    model_file = run_dir / "checkpoints/step_000004/model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:1000])  # truncated, as by a full disk
    assert latest_checkpoint(run_dir).name == "step_000002"
    assert "step_000004" in caplog.text and "bytes" in caplog.text
    assert load_policy(run_dir) is not None  # eval/uci load the intact one
    assert [step for step, _ in list_checkpoints(run_dir)] == [0, 2]
    resumed = load_config(MoveGroupTrainConfig, run_dir / "config.yaml")
    with Trainer(resumed, resume=True) as trainer:
        assert trainer.step == 2
        result = trainer.train()
    assert result.step == 4 and latest_checkpoint(run_dir).name == "step_000004"


def test_retention_keeps_the_best_checkpoint(tmp_path):
    config = tiny_config(
        tmp_path,
        "steps=6",
        "eval_every=3",
        "checkpoint_every=1",
        "keep_checkpoints=1",
        "checkpoint_best_metric=eval/puzzle_first_move_accuracy",
        "checkpoint_best_mode=max",
    )
    with Trainer(config) as trainer:
        result = trainer.train()
    names = sorted(p.name for p in (config.run.directory / "checkpoints").iterdir())
    best = os.readlink(config.run.directory / "checkpoints/best")
    assert best in names and "step_000006" in names
    assert len([n for n in names if n.startswith("step_")]) <= 2
    assert result.best_checkpoint.name == best
    assert not [n for n in names if n.startswith(".tmp")]  # no debris


def test_a_second_process_on_a_locked_run_directory_is_refused(cli, tmp_path):
    run_dir = tmp_path / "locked"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from chessgrpo.train.lock import RunLock; import time; RunLock({str(run_dir)!r}).acquire(); "
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=str(holder.pid)):
            RunLock(run_dir).acquire()
        done = cli.run(
            "train", "--config", str(ROOT / "configs/grpo_tiny.yaml"), *tiny_overrides(tmp_path, "locked"), timeout=120
        )
        assert done.returncode != 0
        assert f"in use by process {holder.pid}" in done.stderr and "Traceback" not in done.stderr
        assert not (run_dir / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait()
    # The holder is dead now: its lock is stale and is taken over with a warning.
    lock = RunLock(run_dir).acquire()
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (run_dir / LOCK_FILE).exists()


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_equals_an_uninterrupted_run(cli, tmp_path):
    steps = ["steps=40", "eval_every=0", "checkpoint_every=100"]
    straight = tiny_config(tmp_path, *steps, name="straight")
    with Trainer(straight) as trainer:
        trainer.train()

    args = CLI + [
        "train",
        "--config",
        str(ROOT / "configs/grpo_tiny.yaml"),
        *tiny_overrides(tmp_path, "killed"),
        *steps,
    ]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "killed/metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(read_metrics(metrics)) >= 3):
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    stopped_at = latest_checkpoint(tmp_path / "killed")
    assert 3 <= int(stopped_at.name.split("_")[1]) < 40  # checkpointed mid-run, not at the end
    assert "stopped by SIGTERM" in out

    done = cli.run("train", "--resume", str(tmp_path / "killed"))
    assert done.returncode == 0, done.stderr
    assert_same_weights(weights(tmp_path / "killed"), weights(straight.run.directory))


def test_run_name_must_be_a_plain_name(tmp_path):
    for bad in ("../../x", "a/b", "..", ""):
        with pytest.raises(ConfigError, match="run.name"):
            tiny_config(tmp_path, f"run.name={bad}")


def test_expected_errors_print_one_line_and_unexpected_ones_keep_their_traceback(cli, tmp_path):
    bad = cli.run("train", "--config", str(ROOT / "configs/grpo_tiny.yaml"), "run.name=../x", timeout=60)
    assert bad.returncode == 2 and "run.name" in bad.stderr and "Traceback" not in bad.stderr
    crash = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from chessgrpo import cli; import chessgrpo.commands.train as train; "
            "train.resolve_run_config = lambda *a: (_ for _ in ()).throw(RuntimeError('shape mismatch [2] vs [3]')); "
            "sys.exit(cli.main(['train', '--config', 'configs/grpo_tiny.yaml']))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert crash.returncode != 0 and "Traceback" in crash.stderr and "shape mismatch" in crash.stderr


@pytest.mark.slow
@pytest.mark.parametrize("memory", [[], ["grpo.micro_batch_size=4"]], ids=["whole", "micro_batched"])
def test_compiled_grpo_trains_with_value_and_bc_terms_and_their_gradient_norms(tmp_path, memory):
    """compile=true with every learner term (value and bc on labelled positions, the per-term gradient norms that take
    several gradients of one compiled graph; micro-batches in the slow case): the step runs and the ratio check holds.
    Before issue 53's fix it crashed at step 1 ("compiled with non-empty donated buffers")."""
    data = tmp_path / "data"
    subprocess.run(
        [
            *CLI,
            "data",
            "generate",
            "--config",
            "configs/data_tiny.yaml",
            f"out={data}",
            "positions=120",
            "nodes=30",
            "engine.processes=1",
            "test_fraction=0.2",
            "shard_size=120",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    config = tiny_config(
        tmp_path,
        "compile=true",
        "steps=1",
        "eval_every=0",
        "eval_at_start=false",
        "model.value_head=true",
        "value_loss_weight=0.1",
        "task.best_move_values=true",
        f"value_positions={data}",
        "bc_loss_weight=0.3",
        "grpo.term_gradient_every=1",
        *memory,
    )
    with Trainer(config) as trainer:
        assert trainer.train().finished
    rows = [row for row in read_metrics(config.run.directory / "metrics.jsonl") if "loss/total" in row]
    assert [row["step"] for row in rows] == [1]
    assert (
        rows[0]["grad_norm/policy"] > 0 and rows[0]["grad_norm/aux"] > 0 and rows[0]["ratio/first_max_abs_dev"] < 1e-4
    )


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", [False, True], ids=["serial", "pipelined"])
def test_a_compiled_step_computes_the_eager_step_and_the_flag_is_scoped(tmp_path, pipeline):
    """Issue 64, item 6: compile=true on the shipped GRPO config takes the eager step's first step (loss and gradient
    norm to float tolerance), dynamo really compiled a graph, and torch's process-global donated_buffer flag is changed
    only while a run that takes several gradients of one graph (the per-term norms) trains, then given back."""
    import torch._dynamo
    import torch._dynamo.utils as dynamo_utils
    import torch._functorch.config as functorch_config

    before = functorch_config.donated_buffer
    first_rows = {}
    for mode in ("eager", "compiled"):
        config = tiny_config(
            tmp_path / mode,
            f"compile={mode == 'compiled'}",
            "steps=1",
            "eval_every=0",
            "eval_at_start=false",
            "grpo.term_gradient_every=1",
            f"grpo.pipeline={pipeline}",
            name=mode,
        )
        torch._dynamo.reset()  # forget graphs an earlier case of this process compiled: this run must compile its own
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        with Trainer(config) as trainer:
            if mode == "compiled":
                assert functorch_config.donated_buffer is False  # the per-term norms retain the graph
            assert trainer.train().finished
        if mode == "compiled":
            assert dynamo_utils.counters["stats"]["unique_graphs"] > graphs  # something was compiled
        assert functorch_config.donated_buffer == before  # given back when the run closed
        first_rows[mode] = next(r for r in read_metrics(config.run.directory / "metrics.jsonl") if "loss/total" in r)
    for key in ("loss/total", "grad_norm", "grad_norm/policy"):
        assert first_rows["compiled"][key] == pytest.approx(first_rows["eager"][key], rel=1e-4, abs=1e-6), key
    # Without the per-term norms the flag is never touched.
    config = tiny_config(
        tmp_path / "plain",
        "compile=true",
        "steps=1",
        "eval_every=0",
        "eval_at_start=false",
        "grpo.term_gradient_every=0",
        name="plain",
    )
    with Trainer(config) as trainer:
        assert functorch_config.donated_buffer == before
        assert trainer.train().finished
