"""Data-parallel training on torchrun: N processes run the same experiment as one.

Real processes (torchrun, gloo on CPU), real Stockfish and tablebases, tiny models. For every kind a
2-process run and a 1-process run with the same global batch must end with the same weights. They
cannot be bitwise equal: one process sums a minibatch's gradient in one backward, two processes sum
halves and all-reduce them, so float32 rounding differs (~1e-7 per update) and Adam, which divides by
the root of the squared gradients, carries that into the weights. The tolerance `ATOL` (1e-4 after a
few steps at lr 3e-3) is two orders of magnitude below what the same steps move the weights
(checked: `MOVED`), and the rollouts themselves (rewards) and the gradient norms must agree.

Cross-cutting: train/distributed.py with every kind's training (tasks/kinds/, train/loop.py),
models/placement.py and train/checkpoint.py, run through the CLI under torchrun.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import chess
import pytest
import torch
from safetensors.torch import load_file

from chessgrpo.models.placement import OnDevice
from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.models.sampling import multinomial_by_group
from chessgrpo.tasks.move_group import sample_groups
from chessgrpo.train.checkpoint import latest_checkpoint
from chessgrpo.train.distributed import Parallel, group_generators
from helpers import NO_LABELLED_LOSSES, SYZYGY_DIR

ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-4
MOVED = 5e-3


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_single(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "chessgrpo", *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_torchrun(*args: str, nproc: int = 2, check: bool = True) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "chessgrpo",
        *args,
    ]
    done = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def weights(run_dir: Path, checkpoint: Path | None = None) -> dict[str, torch.Tensor]:
    return load_file(str((checkpoint or latest_checkpoint(run_dir)) / "model.safetensors"))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((_learnable(k, a[k]).float() - _learnable(k, b[k]).float()).abs().max()) for k in a)


def _learnable(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The tensor without the slice whose true gradient is 0: an attention key bias only shifts every logit of
    a query's softmax by the same amount, so its gradient is float rounding, which Adam (dividing by its RMS)
    turns into steps of up to lr that differ between one and two processes."""
    if name.endswith("qkv.bias"):
        width = tensor.shape[0] // 3
        return torch.cat([tensor[:width], tensor[2 * width :]])
    return tensor


def assert_same_experiment(one: Path, two: Path, *, rollout_metric: str | None = None) -> None:
    """Same weights within ATOL (far below the training's own movement), same rollouts, same gradient norms."""
    first = one / "checkpoints" / "step_000000"
    start = weights(one, first) if first.exists() else None
    final_one, final_two = weights(one), weights(two)
    assert max_diff(final_one, final_two) < ATOL
    if start is not None:
        assert max_diff(final_one, start) > MOVED  # the tolerance is meaningful: training moved the weights
    rows_one = [r for r in _rows(one) if "grad_norm" in r]
    rows_two = [r for r in _rows(two) if "grad_norm" in r]
    assert [r["step"] for r in rows_one] == [r["step"] for r in rows_two]
    for a, b in zip(rows_one, rows_two):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3, abs=1e-7)
        if rollout_metric is not None:
            assert a[rollout_metric] == pytest.approx(b[rollout_metric], rel=1e-6, abs=1e-9)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def move_group_args(out: Path, name: str, *extra: str) -> list[str]:
    return [
        "train",
        "--config",
        "configs/grpo_tiny.yaml",
        f"run.out_dir={out}",
        f"run.name={name}",
        "init_checkpoint=null",
        "positions=random:64",
        "position_mixture=[]",
        "eval.positions=null",
        "eval.puzzles=null",
        "task.positions_per_step=4",
        "task.group_size=4",
        "task.reward_nodes=30",
        "task.best_move_values=false",
        "grpo.minibatch_size=8",
        "engine.processes=1",
        "engine.cache=false",
        "threads=1",
        "warmup_steps=0",
        "lr=3e-3",
        "steps=4",
        "eval_every=0",
        "eval_at_start=false",
        "checkpoint_every=1",
        "keep_checkpoints=10",
        *NO_LABELLED_LOSSES,
        *extra,
    ]


# -- every kind: 2 processes == 1 process -----------------------------------------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """A small engine-labelled dataset (chessgrpo data generate, real Stockfish)."""
    out = tmp_path_factory.mktemp("dp_data") / "data"
    # opening_random_plies_min=2: the data the tolerances below were measured on (with data_tiny's 0 since issue 54 the
    # mixture's weights differ by 1.07e-4 between one and two processes: float rounding that Adam amplifies, over ATOL).
    run_single(
        "data",
        "generate",
        "--config",
        "configs/data_tiny.yaml",
        f"out={out}",
        "positions=160",
        "nodes=50",
        "engine.processes=1",
        "test_fraction=0.2",
        "shard_size=100",
        "opening_random_plies_min=2",
    )
    return out


@pytest.mark.slow
def test_move_group_on_two_processes_is_the_one_process_experiment(tmp_path):
    run_single(*move_group_args(tmp_path, "one"))
    done = run_torchrun(*move_group_args(tmp_path, "two"))
    assert "data-parallel: 2 processes (gloo)" in done.stdout
    assert_same_experiment(tmp_path / "one", tmp_path / "two", rollout_metric="reward/mean")
    # rank 0 alone wrote the run directory: one metrics row per step, no second writer's rows
    assert [r["step"] for r in _rows(tmp_path / "two")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_trajectory_on_two_processes_is_the_one_process_experiment(tmp_path):
    args = [
        "train",
        "--config",
        "configs/endgame_kqk.yaml",
        f"run.out_dir={tmp_path}",
        "init_checkpoint=null",
        f"engine.syzygy_path={SYZYGY_DIR}",
        "task.positions_per_step=4",
        "task.group_size=4",
        "task.horizon=3",
        "grpo.minibatch_size=8",
        "eval_every=0",
        "eval_at_start=false",
        "eval.positions=16",
        "steps=3",
        "threads=1",
        "checkpoint_every=1",
        "keep_checkpoints=10",
        "lr=3e-3",
    ]
    run_single(*args, "run.name=one")
    run_torchrun(*args, "run.name=two")
    assert_same_experiment(tmp_path / "one", tmp_path / "two", rollout_metric="rollout/plies")


@pytest.mark.slow
def test_task_mixture_on_two_processes_is_the_one_process_experiment(tmp_path, labelled):
    # A rank may hold no group of a task in a step (each group draws its task): it must neither wait nor diverge,
    # and the one-move task's value loss (on its rows) and bc anchor (on labelled positions, every minibatch)
    # must count as in one process. Before: DDP stopped ("parameters that were not used in producing loss").
    config = {
        "kind": "mixture",
        "init_checkpoint": None,
        "model": {"size": "tiny", "value_head": True},
        "groups_per_step": 4,
        "tasks": [
            {
                "name": "one_move",
                "kind": "move_group",
                "weight": 0.5,
                "config": {
                    "positions": "random:64",
                    "task": {"group_size": 4, "reward_nodes": 30, "best_move_values": True},
                    "value_loss_weight": 0.5,
                    "value_positions": None,
                    "bc_loss_weight": 0.5,
                    "bc_positions": str(labelled),
                    "bc_batch_size": 8,
                    "eval": {"positions": None, "puzzles": None},
                },
            },
            {
                "name": "kqk",
                "kind": "trajectory",
                "weight": 0.5,
                "config": {
                    "positions": "endgame:KQvK",
                    "task": {"group_size": 4, "horizon": 3, "opponent": "tablebase"},
                    "eval": {"positions": 16, "baselines": False},
                },
            },
        ],
        "grpo": {"minibatch_size": 8},
        "engine": {"processes": 1, "cache": False, "syzygy_path": str(SYZYGY_DIR)},
        "steps": 3,
        "lr": 3e-3,
        "warmup_steps": 0,
        "eval_every": 0,
        "eval_at_start": False,
        "threads": 1,
        "checkpoint_every": 1,
        "keep_checkpoints": 10,
    }
    path = tmp_path / "mixture.yaml"
    path.write_text(json.dumps(config))
    args = ["train", "--config", str(path), f"run.out_dir={tmp_path}"]
    run_single(*args, "run.name=one")
    run_torchrun(*args, "run.name=two")
    assert_same_experiment(tmp_path / "one", tmp_path / "two", rollout_metric="rollout/task/kqk")
    rows = _rows(tmp_path / "two")
    assert {r["rollout/task/kqk"] for r in rows} != {0.0} and {r["rollout/task/kqk"] for r in rows} != {1.0}


@pytest.mark.slow
def test_pretrain_on_two_processes_is_the_one_process_experiment(tmp_path, labelled):
    args = [
        "pretrain",
        "--config",
        "configs/pretrain_tiny.yaml",
        f"data={labelled}",
        f"run.out_dir={tmp_path}",
        "batch_size=32",
        "steps=6",
        "eval_every=0",
        "warmup_steps=0",
        "threads=1",
        "checkpoint_every=1",
        "keep_checkpoints=10",
    ]
    run_single(*args, "run.name=one")
    run_torchrun(*args, "run.name=two")
    assert_same_experiment(tmp_path / "one", tmp_path / "two", rollout_metric=None)


@pytest.mark.slow
def test_move_group_with_value_and_bc_losses_on_two_processes_is_the_one_process_experiment(tmp_path, labelled):
    # The value head's loss and the bc anchor run extra forwards on labelled positions drawn per
    # minibatch: every rank must draw the same ones, weight them like its rows and call forward as
    # often as the others (DDP once hung here broadcasting buffers inside forward).
    losses = (
        "model.value_head=true",
        "task.best_move_values=true",
        "value_loss_weight=0.5",
        f"value_positions={labelled}",
        "value_batch_size=8",
        "bc_loss_weight=0.5",
        "bc_batch_size=8",
    )
    run_single(*move_group_args(tmp_path, "one"), *losses)
    run_torchrun(*move_group_args(tmp_path, "two"), *losses)
    assert_same_experiment(tmp_path / "one", tmp_path / "two", rollout_metric="reward/mean")
    rows = [r for r in _rows(tmp_path / "two") if "loss/aux" in r]
    assert len(rows) == 4 and all(r["loss/aux"] > 0 for r in rows)  # the auxiliary losses really ran


@pytest.mark.slow
def test_sft_and_rookworld_on_two_processes_are_the_one_process_experiments(tmp_path):
    data = tmp_path / "rw"
    run_single(
        "data",
        "rookworld",
        "--out",
        str(data),
        "--positions",
        "40",
        "--nodes",
        "100",
        "engine.processes=1",
        "test_fraction=0.2",
        "engine.cache=false",
    )
    sft = [
        "train",
        "--config",
        "configs/rookworld_sft_tiny.yaml",
        f"data={data}",
        f"run.out_dir={tmp_path}",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.n_head=2",
        "steps=4",
        "batch_size=8",
        "eval_every=0",
        "eval_examples=8",
        "eval_prompts=2",
        "max_new_tokens=8",
        "checkpoint_every=1",
        "keep_checkpoints=10",
        "threads=1",
        "lr=3e-3",
        "warmup_steps=0",
        "first_tasks_steps=2",
    ]  # the A:-first stage, then both
    run_single(*sft, "run.name=sft_one")
    run_torchrun(*sft, "run.name=sft_two")
    assert_same_experiment(tmp_path / "sft_one", tmp_path / "sft_two")

    grpo = [
        "train",
        "--config",
        "configs/rookworld_grpo_tiny.yaml",
        f"data={data}",
        f"init_checkpoint={tmp_path / 'sft_one'}",
        f"run.out_dir={tmp_path}",
        "task.prompts_per_step=4",
        "task.group_size=2",
        "task.max_new_tokens=20",
        "grpo.minibatch_size=4",
        "rewards.policy.nodes=100",
        "engine.processes=1",
        "engine.cache=false",
        "eval.policy_prompts=2",
        "eval.environment_prompts=2",
        "eval_every=0",
        "eval_at_start=false",
        "steps=3",
        "grpo.entropy_coef=0.01",
        "threads=1",
        "checkpoint_every=1",
    ]
    run_single(*grpo, "run.name=rw_one")
    run_torchrun(*grpo, "run.name=rw_two")
    a, b = weights(tmp_path / "rw_one"), weights(tmp_path / "rw_two")
    assert max_diff(a, b) < ATOL
    rows_one, rows_two = _rows(tmp_path / "rw_one"), _rows(tmp_path / "rw_two")
    for x, y in zip(rows_one, rows_two):
        if "reward/mean" in x:  # the same completions were sampled and scored
            assert x["reward/mean"] == pytest.approx(y["reward/mean"], abs=1e-9)


# -- resume, world sizes, nodes -----------------------------------------------------------------------


@pytest.mark.slow
def test_two_process_run_resumes_exactly_and_resumes_on_one_process(tmp_path):
    run_torchrun(*move_group_args(tmp_path, "straight"))
    run_torchrun(*move_group_args(tmp_path, "stopped", "stop_at=2"))
    run_torchrun("train", "--resume", str(tmp_path / "stopped"))
    straight, resumed = weights(tmp_path / "straight"), weights(tmp_path / "stopped")
    assert all(straight[k].equal(resumed[k]) for k in straight)  # same world size: bitwise

    run_torchrun(*move_group_args(tmp_path, "switch", "stop_at=2"))
    run_single("train", "--resume", str(tmp_path / "switch"))  # the same experiment on one process
    assert max_diff(weights(tmp_path / "switch"), straight) < ATOL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_node_processes_on_loopback_match_one_process(tmp_path):
    run_single(*move_group_args(tmp_path, "one"))
    port = _free_port()
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=loopback",
                "-m",
                "chessgrpo",
                *move_group_args(tmp_path, "nodes"),
            ],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err[-3000:] for _, err in outputs]
    assert_same_experiment(tmp_path / "one", tmp_path / "nodes", rollout_metric="reward/mean")


@pytest.mark.slow
def test_a_batch_that_does_not_split_evenly_is_one_config_error(tmp_path):
    done = run_torchrun(*move_group_args(tmp_path, "odd", "task.positions_per_step=3"), check=False)
    assert done.returncode != 0
    assert "task.positions_per_step: 3 cannot be split evenly over 2 processes" in done.stderr
    assert not (tmp_path / "odd" / "metrics.jsonl").exists()


# -- the pieces, in process ---------------------------------------------------------------------------


def test_one_process_world_is_an_identity():
    parallel = Parallel()
    assert not parallel.enabled and parallel.is_main
    assert parallel.shard(8, "x") == range(0, 8) and parallel.split(5) == range(0, 5)
    assert parallel.mean_metrics({"a": 1.0}) == {"a": 1.0} and parallel.broadcast(3) == 3
    assert parallel.sum([1, 2]) == [1.0, 2.0] and not parallel.any(False)
    model = torch.nn.Linear(2, 2)
    assert parallel.wrap(model) is model


def test_shards_and_splits_cover_the_batch_once():
    shares = [Parallel(rank=r, world_size=3).shard(12, "k") for r in range(3)]
    assert [list(s) for s in shares] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    splits = [Parallel(rank=r, world_size=3).split(10) for r in range(3)]
    assert sum((list(s) for s in splits), []) == list(range(10))


def test_a_group_samples_the_same_moves_whoever_samples_it():
    """Group 5's moves are a function of (seed, step, 5): alone, or next to other groups, they agree."""
    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(1)), dim=-1)
    together = multinomial_by_group(probs, 8, range(6), group_generators(0, 3, range(6)), replacement=True)
    alone = multinomial_by_group(probs[5:], 8, [0], group_generators(0, 3, range(5, 6)), replacement=True)
    assert together[5].equal(alone[0])
    other_step = multinomial_by_group(probs[5:], 8, [0], group_generators(0, 4, range(5, 6)), replacement=True)
    assert not other_step[0].equal(alone[0])


def test_a_reference_on_device_answers_on_the_callers_device():
    torch.manual_seed(0)
    policy = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    reference = ActionPolicy(PolicyConfig.from_size("tiny")).eval().requires_grad_(False)
    boards = [chess.Board(), chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")]
    plain = sample_groups(
        policy, boards, 4, temperature=1.0, generator=group_generators(0, 0, range(2)), reference=reference
    )
    placed = sample_groups(
        policy,
        boards,
        4,
        temperature=1.0,
        generator=group_generators(0, 0, range(2)),
        reference=OnDevice(reference, "cpu"),
    )
    assert placed.actions.equal(plain.actions) and placed.ref_logp.equal(plain.ref_logp)
    assert not OnDevice(reference, "cpu").training
