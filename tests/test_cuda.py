"""Every kind on a CUDA device, through the CLI as a user runs it (skipped where no GPU is present).

The CPU suite proves the spine; these prove the GPU path does what the CPU path does: each kind
trains on ``device=cuda`` (fp32, bf16 autocast, torch.compile), the runtime ratio == 1 check
passes on the GPU (it raises otherwise), checkpoints written from the GPU load on the CPU and give
the same policy, a CUDA pretraining run is the CPU experiment within float tolerance, and
torchrun's NCCL process group trains. Real Stockfish, real files, real processes, tiny models.

Run them on a GPU machine with ``pytest tests/test_cuda.py`` (they are in the default run and
skip in a second where ``torch.cuda.is_available()`` is false).

Cross-cutting: every kind (tasks/kinds/) through the CLI on CUDA, models/placement.py (device,
autocast, compile), train/checkpoint.py (GPU to CPU) and train/distributed.py (NCCL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from chessgrpo.models.policy import load_policy, log_probs
from chessgrpo.train.checkpoint import latest_checkpoint
from helpers import SYZYGY_DIR, data_file

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def cli(*args: str, torchrun: bool = False) -> subprocess.CompletedProcess:
    prefix = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
        if torchrun
        else [sys.executable]
    )
    done = subprocess.run(
        [*prefix, "-m", "chessgrpo", *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_trained(run_dir: Path, steps: int) -> list[dict]:
    """The run reached `steps`, every logged number is finite, and the weights moved from step 0."""
    logged = rows(run_dir)
    assert max(r["step"] for r in logged) == steps
    for row in logged:
        bad = {
            k: v
            for k, v in row.items()
            if isinstance(v, float) and v != v and k != "ratio/first_max_abs_dev" and not k.startswith("eval/")
        }
        assert not bad, bad
    start = run_dir / "checkpoints" / "step_000000"
    if start.exists():
        a, b = (
            load_file(str(start / "model.safetensors")),
            load_file(str(latest_checkpoint(run_dir) / "model.safetensors")),
        )
        assert max(float((a[k].float() - b[k].float()).abs().max()) for k in a) > 1e-4
    return logged


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cuda_data") / "data"
    cli(
        "data",
        "generate",
        "--config",
        "configs/data_tiny.yaml",
        f"out={out}",
        "positions=400",
        "nodes=50",
        "engine.processes=2",
        "test_fraction=0.2",
        "shard_size=200",
    )
    return out


def pretrain_args(out: Path, name: str, data: Path, *extra: str) -> list[str]:
    return [
        "pretrain",
        "--config",
        "configs/pretrain_tiny.yaml",
        f"data={data}",
        f"run.out_dir={out}",
        f"run.name={name}",
        "batch_size=64",
        "steps=8",
        "eval_every=4",
        "warmup_steps=0",
        "threads=1",
        "checkpoint_every=4",
        "keep_checkpoints=10",
        "lr=3e-3",
        *extra,
    ]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, labelled) -> Path:
    out = tmp_path_factory.mktemp("cuda_pretrain")
    cli(*pretrain_args(out, "cuda", labelled, "device=cuda"))
    return out / "cuda"


def test_pretraining_on_cuda_is_the_cpu_experiment(tmp_path, labelled, pretrained):
    cli(*pretrain_args(tmp_path, "cpu", labelled, "device=cpu"))
    assert_trained(pretrained, 8)
    a, b = (
        load_file(str(latest_checkpoint(pretrained) / "model.safetensors")),
        load_file(str(latest_checkpoint(tmp_path / "cpu") / "model.safetensors")),
    )
    # Same data order and init; GPU and CPU kernels only differ in float summation order.
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 2e-3
    cpu_rows, gpu_rows = rows(tmp_path / "cpu"), rows(pretrained)
    cpu_eval = [r for r in cpu_rows if "eval/nll" in r][-1]["eval/nll"]
    gpu_eval = [r for r in gpu_rows if "eval/nll" in r][-1]["eval/nll"]
    assert gpu_eval == pytest.approx(cpu_eval, rel=1e-2)


def test_a_checkpoint_written_on_the_gpu_plays_the_same_on_the_cpu(pretrained):
    import chess

    gpu = load_policy(pretrained, device="cuda").eval()
    cpu = load_policy(pretrained, device="cpu").eval()
    boards = [
        chess.Board(),
        chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"),
        chess.Board("8/8/8/8/8/5k2/7q/5K2 b - - 0 1"),
    ]
    inputs, mask = cpu.inputs(boards)
    with torch.no_grad():
        on_cpu = log_probs(cpu(inputs), mask)
        on_gpu = log_probs(gpu(inputs.cuda()), mask.cuda()).cpu()
    assert torch.allclose(on_cpu[mask], on_gpu[mask], atol=1e-4)
    assert on_cpu.argmax(-1).tolist() == on_gpu.argmax(-1).tolist()


@pytest.mark.parametrize(
    "extra",
    [["device=cuda"], ["device=cuda", "bf16=true"], ["device=cuda", "compile=true"]],
    ids=["fp32", "bf16", "compile"],
)
def test_move_group_grpo_on_cuda(tmp_path, labelled, pretrained, extra):
    args = [
        "train",
        "--config",
        "configs/grpo_tiny.yaml",
        f"run.out_dir={tmp_path}",
        "run.name=grpo",
        f"init_checkpoint={pretrained}",
        "positions=random:64",
        "position_mixture=[]",
        "eval.positions=null",
        f"eval.puzzles={data_file('lichess_puzzles_dev.csv')}",
        "eval.max_puzzles=16",
        "task.positions_per_step=8",
        "task.group_size=4",
        "task.reward_nodes=30",
        "grpo.minibatch_size=16",
        "engine.processes=2",
        "engine.cache=false",
        "steps=3",
        "eval_every=3",
        "checkpoint_every=1",
        "keep_checkpoints=10",
        "lr=3e-3",
        "warmup_steps=0",
        "value_loss_weight=1.0",
        f"value_positions={labelled}",
        "bc_loss_weight=0.3",
        *extra,
    ]
    cli(*args)
    logged = assert_trained(tmp_path / "grpo", 3)
    steps = [r for r in logged if "ratio/first_max_abs_dev" in r]
    assert steps and all(r["ratio/first_max_abs_dev"] < (1e-2 if "bf16=true" in extra else 1e-4) for r in steps)
    assert yaml.safe_load((tmp_path / "grpo" / "config.yaml").read_text())["device"] == "cuda"


def test_trajectory_grpo_on_cuda(tmp_path):
    cli(
        "train",
        "--config",
        "configs/endgame_kqk.yaml",
        f"run.out_dir={tmp_path}",
        "run.name=traj",
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
        "checkpoint_every=1",
        "keep_checkpoints=10",
        "lr=3e-3",
        "device=cuda",
    )
    assert_trained(tmp_path / "traj", 3)


@pytest.mark.parametrize("memory", [[], ["micro"]], ids=["whole", "micro_batched"])
def test_sft_and_rookworld_grpo_on_cuda(tmp_path, memory):
    """SFT then GRPO on text, the chess tokenizer (the fresh-model default); "micro_batched" also runs
    SFT and the GRPO learner in micro-batches and the log-probs in row chunks (issue 20's memory path)."""
    sft_memory = ["micro_batch_size=4"] if memory else []
    grpo_memory = ["grpo.micro_batch_size=2", "task.logprob_chunk_rows=3"] if memory else []
    data = tmp_path / "rw"
    cli(
        "data",
        "rookworld",
        "--out",
        str(data),
        "--positions",
        "40",
        "--nodes",
        "100",
        "engine.processes=2",
        "test_fraction=0.2",
        "engine.cache=false",
    )
    cli(
        "train",
        "--config",
        "configs/rookworld_sft_tiny.yaml",
        f"data={data}",
        f"run.out_dir={tmp_path}",
        "run.name=sft",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.n_head=2",
        "steps=4",
        "batch_size=8",
        "eval_every=4",
        "eval_examples=8",
        "eval_prompts=2",
        "max_new_tokens=8",
        "checkpoint_every=1",
        "keep_checkpoints=10",
        "lr=3e-3",
        "warmup_steps=0",
        "device=cuda",
        "bf16=true",
        *sft_memory,
    )
    assert_trained(tmp_path / "sft", 4)
    cli(
        "train",
        "--config",
        "configs/rookworld_grpo_tiny.yaml",
        f"data={data}",
        f"init_checkpoint={tmp_path / 'sft'}",
        f"run.out_dir={tmp_path}",
        "run.name=rw",
        "task.prompts_per_step=4",
        "task.group_size=2",
        "task.max_new_tokens=20",
        "grpo.minibatch_size=4",
        "rewards.policy.nodes=100",
        "engine.processes=2",
        "engine.cache=false",
        "eval.policy_prompts=2",
        "eval.environment_prompts=2",
        "eval_every=0",
        "eval_at_start=false",
        "steps=3",
        "grpo.entropy_coef=0.01",
        "checkpoint_every=1",
        "device=cuda",
        *grpo_memory,
    )
    logged = assert_trained(tmp_path / "rw", 3)
    assert all(r["ratio/first_max_abs_dev"] < 1e-4 for r in logged if "ratio/first_max_abs_dev" in r)


def test_torchrun_puts_a_rank_on_its_own_gpu(tmp_path, labelled):
    """torchrun with ``device=cuda`` trains on cuda:LOCAL_RANK (one GPU here: one rank, no NCCL group)."""
    cli(*pretrain_args(tmp_path, "torchrun", labelled, "device=cuda"), torchrun=True)
    assert_trained(tmp_path / "torchrun", 8)
    assert json.loads((tmp_path / "torchrun" / "run_info.json").read_text())["hardware"]["gpu"]
