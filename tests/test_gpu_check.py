"""The GPU check (scripts/gpu_check.sh, scripts/gpu_check.py) and its two configs, without a GPU.

The configs load through the real config loader (every key valid) with the GPU shape; the script's
CPU dry run (`--dry-run`: the same pipeline at tiny sizes) runs end to end, so the command a GPU machine
will run is exercised here; the summary reads GPU-shaped numbers right; without CUDA the check refuses
with a clear message.

Cross-cutting: configs/rookworld_124m_gpu.yaml and configs/rookworld_sft_gpu.yaml (tasks/kinds/rookworld.py,
tasks/kinds/sft.py, train/config.py, rl/config.py), scripts/make_gpt2_124m.py, and the CLI commands the
script chains (data rookworld, train, eval lm).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from chessgrpo.config import load_config
from chessgrpo.tasks.kinds import config_class
from helpers import DATA_DIR, REPO_ROOT

GPU_CONFIG = REPO_ROOT / "configs" / "rookworld_124m_gpu.yaml"
SFT_CONFIG = REPO_ROOT / "configs" / "rookworld_sft_gpu.yaml"
SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"


def helper_module():
    spec = importlib.util.spec_from_file_location("gpu_check_helper", REPO_ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_grpo_config_loads_with_the_gpu_shape():
    config = load_config(config_class("rookworld"), GPU_CONFIG)  # raises on any unknown key or wrong type
    cpu = load_config(config_class("rookworld"), REPO_ROOT / "configs" / "rookworld_124m.yaml")
    assert (config.device, config.bf16, config.compile) == ("cuda", True, False)
    assert config.task.prompts_per_step * config.task.group_size >= 256
    assert (
        config.grpo.micro_batch_size > cpu.grpo.micro_batch_size
        and config.task.logprob_chunk_rows > cpu.task.logprob_chunk_rows
    )
    rows = config.task.prompts_per_step * config.task.group_size
    assert rows % config.grpo.minibatch_size == 0 and config.grpo.minibatch_size % config.grpo.micro_batch_size == 0
    # The same algorithm and task as the CPU config: only sizes (and the device) differ.
    assert config.grpo.kl_coef == cpu.grpo.kl_coef and config.task.temperature == cpu.task.temperature
    assert config.task.max_new_tokens == cpu.task.max_new_tokens and config.lr == cpu.lr


def test_gpu_sft_config_loads_and_builds_a_model_of_at_least_20m_parameters():
    from chessgrpo.models.lm import build_lm

    config = load_config(config_class("sft"), SFT_CONFIG)
    assert (config.device, config.bf16, config.compile) == ("cuda", True, False)
    assert config.model.architecture == "llama" and config.model.tokenizer == "chess" and config.model.path is None
    assert build_lm(config.model, seed=0).num_parameters() >= 20_000_000


def test_the_summary_reads_a_gpu_run(tmp_path):
    """GPU-shaped numbers (a metrics.jsonl as `train` writes it, a CUDA peak) come out as completions/s,
    the phases of a step, the peak and the target verdict; the first step is kept apart as warm-up."""
    gpu_check = helper_module()
    run = tmp_path / "grpo_throughput"
    run.mkdir()
    (run / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "device": "cuda",
                "bf16": True,
                "task": {"prompts_per_step": 64, "group_size": 8, "max_new_tokens": 128, "logprob_chunk_rows": 128},
                "grpo": {"micro_batch_size": 64},
            }
        )
    )
    rows = [
        {
            "step": 1,
            "perf/step_s": 9.0,
            "perf/sample_s": 6.0,
            "perf/reward_s": 0.5,
            "perf/learn_s": 2.5,
            "perf/samples_per_s": 512 / 9.0,
            "rollout/completion_tokens": 128.0,
            "ratio/first_max_abs_dev": 0.004,
        }
    ]
    rows += [
        {
            "step": s,
            "perf/step_s": 4.0,
            "perf/sample_s": 3.0,
            "perf/reward_s": 0.2,
            "perf/learn_s": 0.8,
            "perf/samples_per_s": 128.0,
            "rollout/completion_tokens": 128.0,
        }
        for s in (2, 3, 4)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    work = tmp_path / "work"
    gpu_check.write_stage(
        work, "meta", {"mode": "gpu", "full": 0, "grpo_run": str(run), "grpo_config": "configs/x.yaml", "total_s": 400}
    )
    gpu_check.write_stage(
        work, "preflight", {"rc": 0, "device": "NVIDIA H200, 140 GiB, 1 device(s)", "torch": "2.11.0"}
    )
    gpu_check.write_stage(
        work,
        "grpo_throughput",
        {"rc": 0, "seconds": 60.0, "cuda_peak_allocated_gib": 31.5, "cuda_peak_reserved_gib": 40.0},
    )
    numbers = gpu_check.grpo_throughput(run)
    assert numbers["completions_per_s"] == pytest.approx(128.0) and numbers["first_step_s"] == 9.0
    assert numbers["measured_steps"] == [2, 3, 4] and numbers["sampled_tokens_per_s"] == pytest.approx(512 * 128 / 3.0)
    out = tmp_path / "out"
    report = _run_summary(gpu_check, work, out)
    text = (out / "gpu_check_summary.txt").read_text()
    assert "128.0 completions/s" in text and "sampling 3.00 + rewards 0.20 + learning 0.80" in text
    assert "31.5 GiB allocated" in text and ": MET" in text and "first step (warm-up) 9.00 s" in text
    assert report["summary"]["grpo_throughput"]["completions_per_step"] == 512
    lm = next(f for f in report["figures"] if f["key"] == "lm_grpo_completions_per_s")
    assert lm["cuda"] == pytest.approx(128.0) and lm["pass"] and lm["verdict"] == "PASS"


def _run_summary(gpu_check, work: Path, out: Path) -> dict:
    sys_argv = sys.argv
    try:
        sys.argv = ["gpu_check.py", "summary", "--work", str(work), "--out", str(out)]
        assert gpu_check.main() == 0
    finally:
        sys.argv = sys_argv
    return json.loads((out / "gpu_check.json").read_text())


def test_the_report_reads_gpu_shaped_bench_results(tmp_path):
    """The benches' JSON as bench/rollout_throughput.py and bench/pretrain_pipeline.py write them, with GPU-shaped
    numbers: each figure on cuda and on the CPU threads, their ratio, the issue-53 targets with pass and fail, the
    machine; the Markdown table says the same."""
    gpu_check = helper_module()
    work, bench = tmp_path / "work", tmp_path / "work" / "bench"
    bench.mkdir(parents=True)

    def rollout(one_move: float, trajectory: float) -> dict:  # 3 timed steps each; the median is the middle one
        # The trainer's CPU split as the bench measures it: 1.4 ms a sample of which the network 0.4 (the median step's).
        steps = lambda rate, samples: [
            {
                "setting": "x",
                "step": i,
                "wall_s": samples / (rate * f),
                "samples": samples,
                "main_cpu_s": samples * 1.4e-3 * f,
                "model_cpu_s": samples * 0.4e-3 * f,
                "host_cpu_s": samples * 1.0e-3 * f,
            }
            for i, f in enumerate((0.5, 1.0, 2.0))
        ]
        return {"one_move": steps(one_move, 256.0), "trajectory": steps(trajectory, 250.0)}

    def pretrain(model_only: float, off: float, on: float) -> dict:
        rows = [
            {"variant": v, "samples_per_s": r, "windows": [r], "step_ms": 1024e3 / r}
            for v, r in (("model_only", model_only), ("pipeline_prefetch0", off), ("pipeline_prefetch2", on))
        ]
        return {
            "meta": {"size": "small", "batch": 1024},
            "rows": rows,
            "ratios": {},
            "host": {"build_uint8_ms": 2.0},
            "prefetch": 2,
        }

    for name, data in (
        ("rollout_cuda", rollout(2500.0, 1000.0)),
        ("rollout_cpu", rollout(500.0, 250.0)),
        ("pretrain_cuda", pretrain(27700.0, 14200.0, 26000.0)),
        ("pretrain_cpu", pretrain(400.0, 380.0, 396.0)),
    ):
        (bench / f"{name}.json").write_text(json.dumps(data))
        gpu_check.write_stage(work, name, {"rc": 0, "seconds": 30.0})
    gpu_check.write_stage(
        work,
        "meta",
        {
            "mode": "gpu",
            "full": 0,
            "bench_dir": str(bench),
            "accel": "cuda",
            "prefetch": 2,
            "pretrain_size": "small",
            "pretrain_batch": 1024,
            "pretrain_cpu_batch": 128,
            "rollout_steps": 5,
            "total_s": 455,
            "budget_s": 470,
        },
    )
    gpu_check.write_stage(
        work,
        "preflight",
        {
            "rc": 0,
            "device": "NVIDIA H200, 140 GiB, 1 device(s)",
            "gpu": "NVIDIA H200",
            "cpu_count": 16,
            "cpu": "AMD EPYC",
            "torch": "2.11.0",
            "torch_cuda": "13.0",
        },
    )
    gpu_check.write_stage(work, "tests", {"rc": 0, "seconds": 190.0, "result": "9 passed in 190.00s"})
    report = _run_summary(gpu_check, work, tmp_path / "out")
    figures = {f["key"]: f for f in report["figures"]}
    one_move, trajectory = figures["one_move_samples_per_s"], figures["trajectory_plies_per_s"]
    assert one_move["cuda"] == pytest.approx(2500.0) and one_move["cpu"] == pytest.approx(500.0)
    assert (
        one_move["cuda_over_cpu"] == pytest.approx(5.0)
        and one_move["verdict"] == "PASS"
        and one_move["target"] == 2000.0
    )
    assert (
        trajectory["cuda"] == pytest.approx(1000.0) and trajectory["verdict"] == "FAIL" and trajectory["pass"] is False
    )
    ratio = figures["pretrain_pipeline_over_model_only"]
    assert (
        ratio["cuda"] == pytest.approx(26000 / 27700)
        and ratio["cpu"] == pytest.approx(0.99)
        and ratio["verdict"] == "PASS"
    )
    assert figures["pretrain_prefetch0_over_model_only"]["cuda"] == pytest.approx(14200 / 27700)
    assert figures["lm_grpo_completions_per_s"]["verdict"] == "not run"  # no LM GRPO stage in this run
    assert report["tests"]["verdict"] == "PASS" and report["all_targets_met"] is False  # the trajectory target fails
    assert report["machine"]["gpu"] == "NVIDIA H200" and report["machine"]["cpu_count"] == 16 and not report["dry_run"]
    markdown = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| GRPO one-move groups (grpo_tiny shape), samples/s | 2,500 | 500 | 5.00x | ≥ 2,000 | PASS |" in markdown
    assert "| 1,000 | 250 | 4.00x | ≥ 1,200 | FAIL |" in markdown and "| 0.94 | 0.99 |  | ≥ 0.90 | PASS |" in markdown
    assert (
        "Machine: GPU NVIDIA H200; CPU 16 x AMD EPYC; torch 2.11.0" in markdown and "All targets met: no." in markdown
    )
    assert "| tests/test_cuda.py | 9 passed in 190.00s |" in markdown
    host = figures["one_move_host_cpu_ms_per_sample"]
    assert host["cuda"] == pytest.approx(1.0) and figures["one_move_main_cpu_ms_per_sample"]["cpu"] == pytest.approx(
        1.4
    )
    assert "| GRPO one-move: trainer CPU ms per sample, of it the network | 0.40 | 0.40 |" in markdown


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_check_refuses_with_a_clear_message(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "gpu_check.py"),
            "preflight",
            "--work",
            str(tmp_path),
            "--require-cuda",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "no CUDA device" in done.stderr and "--dry-run" in done.stderr


def dry_run(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "WORK", "DEVICE", "GPU_CHECK_FULL")}
    env.update(
        PYTHON=sys.executable, WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"), CHESSGRPO_DATA=str(DATA_DIR)
    )
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *flags],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, (tmp_path / "out" / "gpu_check_summary.txt").read_text()


@pytest.mark.slow
def test_the_dry_run_runs_the_gpu_pipeline_on_cpu(tmp_path):
    """`scripts/gpu_check.sh --dry-run`: (d) a labelled set, a starting policy, the rollout and pretraining benches
    in both columns; data, the model directory, a GRPO run of the GPU config (CPU-sized) whose timings the summary
    reads, and the CUDA tests (all skipped here); gpu_check.json and gpu_check.md with every figure. ~100 s on 2 busy cores."""
    done, summary = dry_run(tmp_path)
    assert "[ok] GRPO throughput (configs/rookworld_124m_gpu.yaml" in summary and "completions/s" in summary
    assert "steps 2-3:" in summary and "sampling" in summary and "learning" in summary
    assert "[ok] tests/test_cuda.py:" in summary and "not run (add --full)" in summary
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"gpu_check_summary.txt", "gpu_check.json", "gpu_check.md", "grpo_metrics.jsonl", "test_cuda.log"} <= files
    assert len(files) <= 8  # the device tool brings back at most 8 files from $OUT
    assert summary in done.stdout

    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["mode"] == "dry-run" and report["dry_run"] is True
    machine = report["machine"]
    assert machine["cpu_count"] >= 1 and machine["torch"] == torch.__version__ and "gpu" in machine and machine["date"]
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == {
        "one_move_samples_per_s",
        "trajectory_plies_per_s",
        "pretrain_model_only_samples_per_s",
        "pretrain_prefetch0_samples_per_s",
        "pretrain_pipeline_samples_per_s",
        "pretrain_pipeline_over_model_only",
        "pretrain_prefetch0_over_model_only",
        "lm_grpo_completions_per_s",
        *(f"one_move_{part}_cpu_ms_per_sample" for part in ("main", "model", "host")),
    }
    for key, figure in figures.items():  # every figure measured in both columns (the LM GRPO run: on the device only)
        assert figure["cuda"] > 0 and (key == "lm_grpo_completions_per_s" or figure["cpu"] > 0), figure
    for key in (
        "one_move_samples_per_s",
        "trajectory_plies_per_s",
        "pretrain_pipeline_over_model_only",
        "lm_grpo_completions_per_s",
    ):
        assert figures[key]["verdict"] in ("PASS", "FAIL") and figures[key]["target"] > 0
    assert report["tests"]["verdict"] == "PASS" and report["total_s"] > 0
    assert all(
        report["stages"][s]["rc"] == 0
        for s in ("pretrain_data", "rollout_init", "rollout_cuda", "rollout_cpu", "pretrain_cuda", "pretrain_cpu")
    )
    pretrain = report["pretrain"]["cuda"]
    assert pretrain["host"]["build_uint8_ms"] > 0 and pretrain["meta"]["device"] == "cpu"  # a dry run's "cuda" column
    markdown = (tmp_path / "out" / "gpu_check.md").read_text()
    assert markdown.startswith("# gpu_check (dry-run)") and "Dry run:" in markdown
    assert markdown.count("\n| ") == 13  # the header and 12 figure rows
    for figure in figures.values():
        assert f"| {figure['name']} |" in markdown


@pytest.mark.slow
def test_the_full_dry_run_adds_sft_time_bounded_grpo_and_the_paired_eval(tmp_path):
    """--full: SFT of the (shrunk) GPU SFT config, GRPO from it stopped by its time budget (checkpointed, then
    evaluated), `eval lm` of both and the paired comparison; ~85 s on 2 busy cores."""
    _, summary = dry_run(tmp_path, "--full", "--no-tests", "--no-benches")  # (d) is checked by the default dry run
    assert "[ok] SFT: 6 steps" in summary
    assert "[ok] GRPO of the SFT model:" in summary and "stopped by the time budget" in summary
    assert "[ok][ok] eval lm (SFT -> GRPO):" in summary and "p_format_rate" in summary
    assert "paired GRPO - SFT" in summary
    assert len(list((tmp_path / "out").iterdir())) <= 8
