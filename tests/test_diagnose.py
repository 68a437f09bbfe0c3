"""`chessgrpo diagnose`: each failure found in a run that exhibits it, nothing in a healthy run.

Real runs (real Stockfish at 50-200 nodes, real tiny models, real files; built once per session
by `build_lab` and shared with test_report.py and test_train_backends.py):

- a small engine-labelled dataset and a 40-step pretraining run on it (the GRPO starting point);
- ``healthy``: GRPO from the pretrained policy, with held-out evaluation -> no warnings;
- ``mismatch``: debug_learn_temperature=1.3 with grpo.check_invariants=false -> ratio finding;
- ``entropy``: entropy_coef=4.0, per-term gradient norms every step -> loss-budget finding (the
  entropy's share of the gradient is checked to be large);
- ``anchored``: dr_grpo advantages and a behaviour-cloning anchor (bc_loss_weight=1.0), gradient norms
  every step -> the auxiliary-loss finding (the CPU-hour recipe's harmful bc arm, in small);
- ``adaptive_kl``: adaptive KL with a tight target and a small kl_coef_max -> pinned controller;
- ``collapse``: lr=3e-3, no KL, 8 start positions -> the entropy collapses and most groups get
  identical rewards -> collapse and no-signal findings.

Synthetic metrics files (written with the real MetricsWriter and save_config) only for what a
real run cannot show cheaply: NaN/Inf (the trainer raises before logging one), negative KL (k3
cannot go negative), engine retries and failures (need a crashing Stockfish), gradient spikes,
no learning and noise read as progress (need long runs / many evaluations), an inert controller,
phase times and the cache hit rate. Each synthetic test says so in its docstring.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from chessgrpo import cli
from chessgrpo.board import move_to_action, random_playout_positions
from chessgrpo.config import EngineConfig, RunConfig, save_config
from chessgrpo.data.schema import write_shard
from chessgrpo.engine import EnginePool
from chessgrpo.models.policy import load_policy
from chessgrpo.rl import GRPOConfig
from chessgrpo.tasks.kinds.move_group import MoveGroupEvalConfig, MoveGroupTrainConfig
from chessgrpo.tasks.kinds.pretrain import PretrainTrainConfig
from chessgrpo.tasks.move_group import MoveGroupConfig
from chessgrpo.track.diagnose import Finding, Thresholds, diagnose, format_findings
from chessgrpo.track.diagnose.changes import linear_trend
from chessgrpo.track.run_data import load_run
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import MetricsWriter, read_metrics
from helpers import data_file

# ------------------------------------------------------------------------------------------------
# The shared lab of real runs


@dataclasses.dataclass(frozen=True)
class Lab:
    root: Path
    data: Path
    pretrain: Path
    healthy: Path
    mismatch: Path
    entropy: Path
    anchored: Path
    adaptive_kl: Path
    collapse: Path


ENTROPY_GRPO = GRPOConfig(num_iterations=2, minibatch_size=0, kl_coef=0.05, entropy_coef=4.0, term_gradient_every=1)


def grpo_config(lab_root: Path, name: str, **overrides) -> MoveGroupTrainConfig:
    """A short GRPO run from the lab's pretrained policy on the lab's dataset (no evaluation)."""
    base = MoveGroupTrainConfig(
        run=RunConfig(name=name, out_dir=str(lab_root), seed=0),
        init_checkpoint=str(lab_root / "pretrain"),
        positions=str(lab_root / "data"),
        start_win_prob_range=(0.05, 0.95),
        task=MoveGroupConfig(group_size=8, positions_per_step=8, reward_nodes=50),
        grpo=GRPOConfig(num_iterations=2, minibatch_size=32, kl_coef=0.05),
        engine=EngineConfig(nodes=None, processes=1, cache=False),
        eval=MoveGroupEvalConfig(positions=None, puzzles=None),
        steps=8,
        lr=1e-4,
        warmup_steps=0,
        checkpoint_every=0,
        threads=1,
    )
    return dataclasses.replace(base, **overrides)


def _grpo_run(config: MoveGroupTrainConfig) -> Path:
    run_dir = config.run.directory
    if not (run_dir / "checkpoints" / "latest").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        save_config(config, run_dir / "config.yaml")  # as `chessgrpo train` does
        with Trainer(config) as trainer:
            trainer.train()
    return run_dir


def labelled_row(board, moves, wins, nodes: int) -> dict:
    """A dataset row (data.schema) for `board` labelled with its multipv `moves` and their win probabilities."""
    return {
        "fen": board.fen(),
        "source": "random_playout",
        "best_move": moves[0],
        "best_action": move_to_action(moves[0]),
        "moves": moves,
        "win_probs": wins,
        "value": wins[0],
        "legal_moves": None,
        "legal_win_probs": None,
        "nodes": nodes,
    }


def build_lab(root: Path) -> Lab:
    """Build (once per session: finished runs are reused) the dataset and every real run."""
    torch.set_num_threads(1)
    data = root / "data"
    if not (data / "test" / "shard-00000.parquet").exists():
        boards = random_playout_positions(120, seed=7, max_plies=16)
        with EnginePool(processes=1, nodes=200, cache_path=None) as pool:
            analyses = pool.analyse_many(boards, multipv=3)
        rows = [
            labelled_row(b, [line.move for line in a.lines], [line.win_probability for line in a.lines], 200)
            for b, a in zip(boards, analyses)
        ]
        write_shard(rows[:100], data / "train" / "shard-00000.parquet")
        write_shard(rows[100:], data / "test" / "shard-00000.parquet")
    pretrain = root / "pretrain"
    if not (pretrain / "checkpoints" / "latest").exists():
        config = PretrainTrainConfig(
            run=RunConfig(name="pretrain", out_dir=str(root)),
            data=str(data),
            batch_size=64,
            steps=40,
            lr=3e-3,
            warmup_steps=5,
            log_every=5,
            eval_every=20,
            checkpoint_every=0,
            threads=1,
        )
        save_config(config, pretrain / "config.yaml")
        with Trainer(config) as trainer:
            trainer.train()
    healthy_eval = MoveGroupEvalConfig(
        positions=str(data),
        max_positions=20,
        nodes=100,
        puzzles=str(data_file("lichess_puzzles_dev.csv")),
        max_puzzles=30,
        resamples=200,
    )
    mismatch_grpo = GRPOConfig(num_iterations=2, minibatch_size=32, kl_coef=0.05, check_invariants=False)
    # One minibatch per epoch: the policy term's value is then small (-mean(A) = 0 on the first epoch), so
    # only the gradient norms can say whether the bonus dominates (at 0.1 it is ~20% of the gradient).
    entropy_grpo = ENTROPY_GRPO
    # dr_grpo's unscaled advantages make a small policy gradient; a bc anchor at 1.0 then pulls ~4x harder.
    anchored_grpo = GRPOConfig(
        num_iterations=2, minibatch_size=32, kl_coef=0.05, advantage_estimator="dr_grpo", term_gradient_every=1
    )
    adaptive_grpo = GRPOConfig(
        num_iterations=2,
        minibatch_size=32,
        kl_coef=0.01,
        kl_schedule="adaptive",
        kl_target=1e-4,
        kl_coef_max=0.02,
        kl_horizon=16,
    )
    collapse_grpo = GRPOConfig(num_iterations=2, minibatch_size=32, kl_coef=0.0)  # nothing holds the policy back
    return Lab(
        root=root,
        data=data,
        pretrain=pretrain,
        healthy=_grpo_run(grpo_config(root, "healthy", steps=16, eval=healthy_eval, eval_every=8)),
        mismatch=_grpo_run(grpo_config(root, "mismatch", steps=6, debug_learn_temperature=1.3, grpo=mismatch_grpo)),
        entropy=_grpo_run(grpo_config(root, "entropy", grpo=entropy_grpo)),
        anchored=_grpo_run(
            grpo_config(root, "anchored", bc_loss_weight=1.0, bc_positions=str(data), grpo=anchored_grpo)
        ),
        adaptive_kl=_grpo_run(grpo_config(root, "adaptive_kl", steps=12, grpo=adaptive_grpo)),
        collapse=_grpo_run(grpo_config(root, "collapse", steps=16, lr=3e-3, max_start_positions=2, grpo=collapse_grpo)),
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Lab:
    return build_lab(tmp_path_factory.getbasetemp() / "diagnose_lab")


def _ids(findings: list[Finding], *severities: str) -> set[str]:
    return {f.id for f in findings if not severities or f.severity in severities}


def _by_id(findings: list[Finding], identifier: str) -> Finding:
    matches = [f for f in findings if f.id == identifier]
    assert matches, f"no {identifier} in {[(f.id, f.severity) for f in findings]}"
    return matches[0]


# ------------------------------------------------------------------------------------------------
# Real runs


def test_healthy_run_has_no_warnings(lab):
    run = load_run(lab.healthy)
    findings = diagnose(run)
    assert not _ids(findings, "critical", "warning"), format_findings(findings)
    assert len(run.evals) == 3 and all(p.records for p in run.evals)  # steps 0, 8, 16 with per-item records
    assert run.kind == "grpo" and len(run.train_rows) == 16


def test_pretraining_run_has_no_warnings(lab):
    run = load_run(lab.pretrain)
    assert run.kind == "pretrain"
    findings = diagnose(run)
    assert not _ids(findings, "critical", "warning"), format_findings(findings)


def test_temperature_mismatch_is_a_critical_ratio_finding(lab):
    findings = diagnose(load_run(lab.mismatch))
    finding = _by_id(findings, "ratio.first_minibatch")
    assert finding.severity == "critical" and findings[0] is finding  # critical first
    assert finding.evidence["steps_affected"] == finding.evidence["steps_logged"] == 6
    assert finding.evidence["max_first_max_abs_dev"] > 1e-2 and finding.evidence["first_steps"][0] == 1
    assert "debug_learn_temperature=1.3" in finding.advice
    assert _by_id(findings, "monitor.invariants_off").severity == "info"


def test_entropy_bonus_dominating_the_loss_is_found(lab):
    rows = [r for r in read_metrics(lab.entropy / "metrics.jsonl") if "grad_norm/entropy" in r]
    shares = sorted(
        r["grad_norm/entropy"] / (r["grad_norm/policy"] + r["grad_norm/kl"] + r["grad_norm/entropy"]) for r in rows
    )
    assert len(rows) == 8 and shares[len(shares) // 2] > 0.75  # the bonus really pulls > 3x harder than the rest
    finding = _by_id(diagnose(load_run(lab.entropy)), "loss_budget.entropy")
    assert finding.severity in ("warning", "critical") and finding.evidence["median_share"] > 0.75
    assert finding.evidence["basis"] == "gradient norm" and finding.evidence["median_policy_share"] < 0.25
    assert finding.evidence["grpo.entropy_coef"] == 4.0 and "entropy_coef" in finding.advice
    assert "loss_budget.entropy" not in _ids(diagnose(load_run(lab.healthy)))


def test_term_gradients_leave_the_update_unchanged(lab, tmp_path):
    """Measuring each term's gradient (autograd.grad on a retained graph) must not touch the update: the
    entropy run repeated without the measurement ends with the same weights and the same losses."""
    config = grpo_config(
        lab.root,
        "entropy_unmeasured",
        grpo=dataclasses.replace(ENTROPY_GRPO, term_gradient_every=0),
        run=RunConfig(name="entropy_unmeasured", out_dir=str(tmp_path), seed=0),
    )
    unmeasured = _grpo_run(config)
    measured_rows, plain_rows = read_metrics(lab.entropy / "metrics.jsonl"), read_metrics(unmeasured / "metrics.jsonl")
    assert not any("grad_norm/policy" in r for r in plain_rows)
    assert [r["loss/total"] for r in measured_rows if "loss/total" in r] == [
        r["loss/total"] for r in plain_rows if "loss/total" in r
    ]
    a, b = load_policy(lab.entropy).state_dict(), load_policy(unmeasured).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_auxiliary_loss_outpulling_grpo_is_found(lab):
    """The CPU-hour recipe's failure in small: with dr_grpo advantages the policy gradient is small, and a
    behaviour-cloning anchor's gradient dominates the update; the loss values could not show it."""
    finding = _by_id(diagnose(load_run(lab.anchored)), "loss_budget.aux")
    assert finding.severity in ("warning", "critical") and finding.evidence["basis"] == "gradient norm"
    assert finding.evidence["median_share"] > 0.6 and finding.evidence["bc_loss_weight"] == 1.0
    assert "bc_loss_weight (now 1.0)" in finding.advice
    assert "loss_budget.aux" not in _ids(diagnose(load_run(lab.healthy)))


def test_tight_adaptive_kl_target_pins_the_controller(lab):
    rows = read_metrics(lab.adaptive_kl / "metrics.jsonl")
    assert rows[-1]["kl/frac_at_max"] >= 0.5 and rows[-1]["kl/coef"] == pytest.approx(0.02)
    finding = _by_id(diagnose(load_run(lab.adaptive_kl)), "kl.controller_pinned_max")
    assert finding.severity == "warning"
    assert finding.evidence["grpo.kl_coef_max"] == 0.02 and finding.evidence["median_kl_over_target"] > 1
    assert finding.evidence["first_step_at_bound"] <= 4 and "kl_target" in finding.advice


def test_collapse_and_no_signal_are_found(lab):
    findings = diagnose(load_run(lab.collapse))
    collapse = _by_id(findings, "entropy.collapse")
    assert collapse.severity == "warning" and collapse.evidence["median_entropy_last_quarter"] < 0.1
    signal = _by_id(findings, "signal.zero_reward_variance")
    assert signal.severity in ("warning", "critical") and signal.evidence["median_frac_reward_zero_std"] > 0.5


def test_a_from_scratch_policy_is_near_uniform(lab, tmp_path):
    """Real run: GRPO of a freshly initialised policy samples nearly uniformly."""
    config = grpo_config(
        lab.root, "scratch", init_checkpoint=None, steps=4, run=RunConfig(name="scratch", out_dir=str(tmp_path))
    )
    findings = diagnose(load_run(_grpo_run(config)))
    finding = _by_id(findings, "entropy.near_uniform")
    assert finding.evidence["median_ratio"] > 0.95 and "init_checkpoint" in finding.advice


def test_diagnose_reads_a_run_still_being_written(lab, tmp_path):
    running = tmp_path / "running"
    shutil.copytree(lab.mismatch, running)
    text = (running / "metrics.jsonl").read_text()
    (running / "metrics.jsonl").write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # torn last line
    run = load_run(running)
    assert len(run.train_rows) == 5
    assert "ratio.first_minibatch" in _ids(diagnose(run))
    config_only = tmp_path / "just_started"
    config_only.mkdir()
    shutil.copy(lab.mismatch / "config.yaml", config_only / "config.yaml")
    assert diagnose(load_run(config_only)) == []


def test_cli_json_and_text(lab, capsys):
    assert cli.main(["diagnose", str(lab.mismatch), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"findings"}
    for finding in payload["findings"]:
        assert set(finding) == {"id", "severity", "message", "evidence", "advice"}
        assert finding["severity"] in ("info", "warning", "critical")
    severities = [f["severity"] for f in payload["findings"]]
    assert severities == sorted(severities, key=["critical", "warning", "info"].index)
    assert cli.main(["diagnose", str(lab.healthy)]) == 0  # exit 0 whatever is found
    text = capsys.readouterr().out
    assert "[WARNING]" not in text and "[CRITICAL]" not in text
    assert cli.main(["diagnose", str(lab.mismatch)]) == 0
    text = capsys.readouterr().out
    assert text.index("[CRITICAL] ratio.first_minibatch") < text.index("[INFO] monitor.invariants_off")
    assert "evidence:" in text and "advice:" in text
    assert cli.main(["diagnose", str(lab.root / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Synthetic metrics files


def _synthetic_rows(steps: int = 120, seed: int = 0) -> list[dict[str, float]]:
    """Rows of a healthy-looking GRPO run: reward rising, entropy half of ln(#legal), policy term dominant."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        sample, reward, learn = 0.02, 0.05 + 0.01 * rng.random(), 0.06
        rows.append(
            {
                "step": step,
                "reward/mean": 0.3 + 0.001 * step + 0.02 * rng.standard_normal(),
                "reward/std": 0.2,
                "entropy/mean": 1.6 + 0.05 * rng.standard_normal(),
                "entropy/ln_legal": 3.3,
                "rollout/frac_reward_zero_std": 0.2,
                "rollout/unique_moves": 5.0,
                "loss/policy": -0.01,
                "loss/kl": 0.1,
                "loss/kl_weighted": 0.005,
                "loss/entropy": 0.0,
                "loss/total": -0.005,
                "loss/share_policy": 0.7,
                "loss/share_kl": 0.3,
                "loss/share_entropy": 0.0,
                "kl/value": 0.1,
                "kl/min": 0.0,
                "kl/exact": 0.09,
                "kl/coef": 0.05,
                "kl/frac_at_min": 0.0,
                "kl/frac_at_max": 0.0,
                "ratio/mean": 1.0,
                "ratio/min": 0.9,
                "ratio/max": 1.1,
                "ratio/max_abs_dev": 0.1,
                "ratio/first_max_abs_dev": 0.0,
                "ratio/clip_frac": 0.01,
                "grad_norm": float(np.exp(0.1 * rng.standard_normal())),
                "lr": 1e-4,
                "learn/rows": 256.0,
                "learn/minibatches": 4.0,
                "loss/skipped": 0.0,
                "perf/sample_s": sample,
                "perf/reward_s": reward,
                "perf/learn_s": learn,
                "perf/step_s": sample + reward + learn,
                "perf/samples_per_s": 256 / (sample + reward + learn),
                "perf/cache_hit_rate": 0.5,
                "perf/engine_retries": 0.0,
                "perf/engine_failures": 0.0,
            }
        )
    return rows


def _eval_row(step: int, esl: float, top1: float, half: float = 0.01) -> dict[str, float]:
    return {
        "step": step,
        "eval/esl": esl,
        "eval/esl_low": esl - half,
        "eval/esl_high": esl + half,
        "eval/top1": top1,
        "eval/top1_low": top1 - 4 * half,
        "eval/top1_high": top1 + 4 * half,
    }


def _write_run(directory: Path, rows: list[dict], config: MoveGroupTrainConfig | None = None) -> Path:
    """A synthetic run directory: config.yaml (save_config) and metrics.jsonl (MetricsWriter), no eval files."""
    config = config or MoveGroupTrainConfig(run=RunConfig(name=directory.name, out_dir=str(directory.parent)))
    save_config(config, directory / "config.yaml")
    merged: dict[int, dict] = {}
    for row in rows:
        merged.setdefault(row["step"], {}).update({k: v for k, v in row.items() if k != "step"})
    with MetricsWriter(directory / "metrics.jsonl") as writer:
        for step in sorted(merged):
            writer.log(step, merged[step])
    return directory


def _healthy_evals() -> list[dict]:
    return [_eval_row(0, 0.10, 0.20), _eval_row(60, 0.085, 0.22), _eval_row(120, 0.07, 0.26)]


def test_synthetic_healthy_run_is_clean(tmp_path):
    """Synthetic: the baseline the other synthetic tests perturb (so each finding is caused by its perturbation)."""
    findings = diagnose(load_run(_write_run(tmp_path / "ok", _synthetic_rows() + _healthy_evals())))
    assert not _ids(findings, "critical", "warning"), format_findings(findings)


def test_non_finite_values(tmp_path):
    """Synthetic: the trainers raise on a non-finite metric before logging it, so a real run cannot write one."""
    rows = _synthetic_rows()
    rows[49]["grad_norm"] = math.nan
    rows[50]["reward/mean"] = math.inf
    rows[60]["ratio/first_max_abs_dev"] = math.nan
    rows[60].update({"loss/skipped": 1.0, "learn/minibatches": 0.0})  # a skipped step: NaN by definition, not a finding
    finding = _by_id(diagnose(load_run(_write_run(tmp_path / "nan", rows))), "values.non_finite")
    assert finding.severity == "critical" and finding.evidence["first_step"] == 50
    assert finding.evidence["metrics"] == {"grad_norm": [50], "reward/mean": [51]}


def test_negative_kl_estimates(tmp_path):
    """Synthetic: k3 cannot go negative in a real run (and check_invariants raises if it does)."""
    rows = _synthetic_rows()
    for row in rows[30:40]:
        row["kl/min"] = -0.003
    finding = _by_id(diagnose(load_run(_write_run(tmp_path / "k3", rows))), "kl.negative")
    assert finding.severity == "critical" and finding.evidence["kl/min"]["steps"][0] == 31
    k1 = MoveGroupTrainConfig(run=RunConfig(name="k1", out_dir=str(tmp_path)), grpo=GRPOConfig(kl_estimator="k1"))
    assert "kl.negative" not in _ids(
        diagnose(load_run(_write_run(tmp_path / "k1", rows, k1)))
    )  # k1 may go below 0 per token


def test_engine_retries_and_failures(tmp_path):
    """Synthetic: a real retry needs a crashing Stockfish. Counters are cumulative per invocation (reset on resume)."""
    rows = _synthetic_rows()
    for row in rows[39:60]:
        row["perf/engine_retries"] = 1.0
    for row in rows[79:]:  # resumed at step 60 (counter restarted), two more retries at step 80 and a failure at 100
        row["perf/engine_retries"] = 2.0
    for row in rows[99:]:
        row["perf/engine_failures"] = 1.0
    findings = diagnose(load_run(_write_run(tmp_path / "engine", rows)))
    retries = _by_id(findings, "engine.retries")
    assert retries.severity == "warning" and retries.evidence["count"] == 3 and retries.evidence["steps"] == [40, 80]
    failures = _by_id(findings, "engine.failures")
    assert failures.severity == "critical" and failures.evidence["steps"] == [100]


def test_no_learning_and_decreasing_objective(tmp_path):
    """Synthetic: a flat reward needs >= 50 steps to be judged, too many for a real test run."""
    flat = _synthetic_rows()
    rng = np.random.default_rng(1)
    for row in flat:
        row["reward/mean"] = 0.3 + 0.02 * rng.standard_normal()
    finding = _by_id(
        diagnose(load_run(_write_run(tmp_path / "flat", flat + _healthy_evals()))), "learning.no_objective_trend"
    )
    low, high = finding.evidence["interval"]
    assert finding.severity == "warning" and low < 0 < high
    falling = _synthetic_rows()
    for row in falling:
        row["reward/mean"] = 0.5 - 0.002 * row["step"] + 0.01 * rng.standard_normal()
    assert "learning.objective_worse" in _ids(
        diagnose(load_run(_write_run(tmp_path / "falling", falling + _healthy_evals())))
    )
    short = _synthetic_rows(steps=20)
    findings = diagnose(load_run(_write_run(tmp_path / "short", short)))
    assert _by_id(findings, "learning.too_short").severity == "info" and not _ids(findings, "warning", "critical")


def test_noise_read_as_progress(tmp_path):
    """Synthetic: several evaluation points over >= 50 steps; the peak at step 60 is inside the intervals."""
    evals = [_eval_row(0, 0.10, 0.20), _eval_row(60, 0.099, 0.235), _eval_row(120, 0.101, 0.21)]
    findings = diagnose(load_run(_write_run(tmp_path / "noise", _synthetic_rows() + evals)))
    noise = _by_id(findings, "eval.noise_as_progress")
    assert noise.severity == "warning" and noise.evidence["peak_steps"] == [60]
    assert {p["metric"] for p in noise.evidence["best_points"]} == {"top1", "esl"}
    assert _by_id(findings, "learning.no_heldout_gain").severity == "warning"
    # The same curve with a real gain at the end: the peak is no longer the story.
    real = evals[:2] + [_eval_row(120, 0.07, 0.30)]
    findings = diagnose(load_run(_write_run(tmp_path / "real", _synthetic_rows() + real)))
    assert "learning.no_heldout_gain" not in _ids(findings) and "eval.noise_as_progress" not in _ids(
        findings, "warning"
    )


def test_gradient_spikes(tmp_path):
    """Synthetic: spikes at chosen steps; a warning only without clipping (or for huge spikes)."""
    rows = _synthetic_rows()
    rows[69]["grad_norm"] = 40.0
    spike = _by_id(diagnose(load_run(_write_run(tmp_path / "clipped", rows))), "grad_norm.spikes")
    assert spike.severity == "info" and spike.evidence["steps"] == [70]
    unclipped = MoveGroupTrainConfig(run=RunConfig(name="u", out_dir=str(tmp_path)), max_grad_norm=0.0)
    spike = _by_id(diagnose(load_run(_write_run(tmp_path / "unclipped", rows, unclipped))), "grad_norm.spikes")
    assert spike.severity == "warning"


def test_inert_controller_phase_time_and_cache(tmp_path):
    """Synthetic: an adaptive coefficient that never moves, the engine taking 90% of the time, a cold cache."""
    rows = _synthetic_rows()
    for row in rows:
        row.update(
            {
                "kl/value": 0.5,
                "perf/reward_s": 0.9,
                "perf/step_s": 1.0,
                "perf/sample_s": 0.05,
                "perf/learn_s": 0.05,
                "perf/cache_hit_rate": 0.02,
            }
        )
    adaptive = MoveGroupTrainConfig(
        run=RunConfig(name="a", out_dir=str(tmp_path)),
        grpo=GRPOConfig(kl_coef=0.05, kl_schedule="adaptive", kl_target=0.01, kl_horizon=10_000_000),
    )
    findings = diagnose(load_run(_write_run(tmp_path / "inert", rows, adaptive)))
    inert = _by_id(findings, "kl.controller_inert")
    assert inert.severity == "warning" and "kl_horizon" in inert.advice
    phase = _by_id(findings, "perf.phase_dominates")
    assert phase.severity == "info" and phase.evidence["shares"]["reward"] == pytest.approx(0.9)
    assert _by_id(findings, "engine.low_cache_hit").severity == "info"


def test_linear_trend_by_hand():
    steps = np.arange(100.0)
    change, low, high = linear_trend(steps, 2.0 + 0.01 * steps)
    assert change == pytest.approx(0.99) and low == pytest.approx(0.99) and high == pytest.approx(0.99)
    rng = np.random.default_rng(0)
    change, low, high = linear_trend(steps, rng.standard_normal(100))
    assert low < 0 < high and low < change < high
    assert all(math.isnan(v) for v in linear_trend(steps[:2], steps[:2]))


def test_thresholds_are_respected(tmp_path):
    rows = _synthetic_rows()
    run = load_run(_write_run(tmp_path / "t", rows))
    assert "signal.zero_reward_variance" not in _ids(diagnose(run))
    assert "signal.zero_reward_variance" in _ids(diagnose(run, Thresholds(zero_std_fraction=0.1)))


def test_equal_rewards_are_not_called_no_signal_under_critic_supervision(tmp_path):
    """Under critic supervision each ply's regret is its advantage (no group baseline): groups of equal regrets still
    teach, so the zero-variance finding, and its advice to drop them, must not fire (issue 64, item 2)."""
    from chessgrpo.config import from_dict
    from chessgrpo.tasks.kinds.trajectory import TrajectoryTrainConfig

    rows = _synthetic_rows()
    for row in rows:
        if "rollout/frac_reward_zero_std" in row:
            row["rollout/frac_reward_zero_std"] = 0.9
    outcome = load_run(_write_run(tmp_path / "outcome", rows))
    assert "signal.zero_reward_variance" in _ids(diagnose(outcome))
    critic = from_dict(
        TrajectoryTrainConfig,
        {
            "run": {"name": "critic", "out_dir": str(tmp_path)},
            "task": {"supervision": "critic", "reward": "tablebase", "regret": True},
        },
    )
    assert "signal.zero_reward_variance" not in _ids(diagnose(load_run(_write_run(tmp_path / "critic", rows, critic))))


def _puzzle_eval_file(directory: Path, step: int, records: list[dict]) -> None:
    """eval/step_NNNNNN_puzzles.json as `chessgrpo train` writes it (summary + per-puzzle records)."""
    from chessgrpo.eval.puzzles import PuzzleRecord, summarize_puzzles

    result = summarize_puzzles("player", [PuzzleRecord(**r) for r in records])
    (directory / "eval").mkdir(exist_ok=True)
    payload = {**result.to_json(), "step": step, "records": {"player": records}}
    (directory / "eval" / f"step_{step:06d}_puzzles.json").write_text(json.dumps(payload))


def test_a_puzzle_loss_from_fewer_checks_is_explained(tmp_path):
    """Synthetic puzzle records: 300 check-first puzzles, 200 quiet-first. At step 120 the policy no longer
    checks: it loses 90 check-first puzzles and gains 30 quiet-first ones; overall accuracy falls."""

    def records(step: int) -> list[dict]:
        out = []
        for i in range(500):
            check_first = i < 300
            correct = (i < 120) if step == 0 else (i < 30 or 300 <= i < 380)
            if not check_first and step == 0:
                correct = i < 350
            out.append(
                {
                    "id": str(i),
                    "rating": 1500,
                    "first_move_correct": correct,
                    "solved": correct,
                    "played": ["e2e4"],
                    "themes": [],
                    "solution_check": check_first,
                    "played_check": step == 0 and i < 400,
                }
            )
        return out

    run_dir = _write_run(tmp_path / "checks", _synthetic_rows() + _healthy_evals())
    for step in (0, 120):
        _puzzle_eval_file(run_dir, step, records(step))
    findings = diagnose(load_run(run_dir))
    assert "learning.heldout_worse" in _ids(findings, "warning")  # first-move accuracy 0.34 -> 0.22
    explained = _by_id(findings, "learning.puzzles_fewer_checks")
    assert explained.severity == "info"
    assert explained.evidence["check_first"]["difference"]["value"] == pytest.approx(-0.3)
    assert explained.evidence["quiet_first"]["difference"]["value"] == pytest.approx(+0.15)
    assert explained.evidence["played_check_rate"]["verdict"] == "lower"
    assert "learning.puzzles_fewer_checks" in _by_id(findings, "learning.heldout_worse").advice

    # Records written before the check fields existed: the warning stays, with no explanation.
    for step in (0, 120):
        _puzzle_eval_file(
            run_dir,
            step,
            [{k: v for k, v in r.items() if k not in ("solution_check", "played_check")} for r in records(step)],
        )
    findings = diagnose(load_run(run_dir))
    assert "learning.heldout_worse" in _ids(findings) and "learning.puzzles_fewer_checks" not in _ids(findings)


def _games_against(
    directory: Path, anchor: str, wins: int, draws: int, losses: int, elo: tuple[float, float, float]
) -> None:
    """eval/games_vs_start.json as `eval games --anchors START` writes it (the fields diagnose reads)."""
    games = wins + draws + losses
    row = {
        "anchor": anchor,
        "settings": f"policy {anchor}/checkpoints/step_001000",
        "wins": wins,
        "draws": draws,
        "losses": losses,
        "score": {"value": (wins + draws / 2) / games, "n": games},
        "elo_difference": {"value": elo[0], "low": elo[1], "high": elo[2], "n": games},
    }
    (directory / "eval").mkdir(exist_ok=True)
    (directory / "eval" / "games_vs_start.json").write_text(
        json.dumps({"anchors": [row], "checkpoint": str(directory)})
    )


def test_games_against_the_start_are_read_and_soften_a_missing_heldout_gain(tmp_path):
    """A run whose held-out metrics and reward did not move but which beats its start in games (make
    run's GRPO): diagnose reports the games, and the no-gain and flat-objective findings are information. Losing to the
    start is a warning; games against another anchor are not read as games against the start."""
    start = tmp_path / "start"
    start.mkdir()
    config = MoveGroupTrainConfig(run=RunConfig(name="g", out_dir=str(tmp_path)), init_checkpoint=str(start))
    flat = [_eval_row(0, 0.10, 0.20), _eval_row(120, 0.10, 0.20)]
    rows = _synthetic_rows()
    rng = np.random.default_rng(1)
    for row in rows:  # a flat reward of fresh positions, as in make run's GRPO
        row["reward/mean"] = 0.3 + 0.02 * rng.standard_normal()
    run_dir = _write_run(tmp_path / "g", rows + flat, config)
    assert _by_id(diagnose(load_run(run_dir)), "learning.no_heldout_gain").severity == "warning"
    assert _by_id(diagnose(load_run(run_dir)), "learning.no_objective_trend").severity == "warning"
    assert "learning.games_against_start" not in _ids(diagnose(load_run(run_dir)))

    _games_against(run_dir, str(start), 474, 158, 368, (37.0, 15.3, 58.6))
    findings = diagnose(load_run(run_dir))
    games = _by_id(findings, "learning.games_against_start")
    assert games.severity == "info" and "beats its start" in games.message and "+37 [+15, +59]" in games.message
    assert games.evidence["games"] == 1000 and games.evidence["wins"] == 474
    no_gain = _by_id(findings, "learning.no_heldout_gain")
    assert no_gain.severity == "info" and "learning.games_against_start" in no_gain.message
    flat_reward = _by_id(findings, "learning.no_objective_trend")
    assert flat_reward.severity == "info" and "learning.games_against_start" in flat_reward.message

    _games_against(run_dir, str(start), 300, 158, 542, (-85.0, -108.0, -62.0))
    findings = diagnose(load_run(run_dir))
    assert _by_id(findings, "learning.games_against_start").severity == "warning"
    assert _by_id(findings, "learning.no_heldout_gain").severity == "warning"
    assert _by_id(findings, "learning.no_objective_trend").severity == "warning"

    _games_against(run_dir, str(tmp_path / "someone_else"), 474, 158, 368, (37.0, 15.3, 58.6))
    assert "learning.games_against_start" not in _ids(diagnose(load_run(run_dir)))


def test_a_mixture_that_loses_to_its_start_shows_how_far_each_task_moved(tmp_path):
    """Synthetic: a mixture whose full-game task drifted (its exact KL to the start rose to ~1.5 while the quickstart's
    own GRPO ends near 0.2) loses to its start in games: the warning lists each task's KL, largest first, and says how
    the tasks share the update. A run of one task (one kl/exact) gets no such list."""
    start = tmp_path / "start"
    start.mkdir()
    config = MoveGroupTrainConfig(run=RunConfig(name="mix", out_dir=str(tmp_path)), init_checkpoint=str(start))
    rows = _synthetic_rows()
    for index, row in enumerate(rows):
        row["kl/one_move/exact"] = 0.02 + 1.5 * index / len(rows)
        row["kl/kqvk/exact"] = 0.01 + 2.4 * index / len(rows)
    run_dir = _write_run(tmp_path / "mix", rows + _healthy_evals(), config)
    _games_against(run_dir, str(start), 193, 106, 701, (-195.0, -220.0, -170.0))
    games = _by_id(diagnose(load_run(run_dir)), "learning.games_against_start")
    assert games.severity == "warning"
    drift = games.evidence["kl_to_start_by_task"]
    assert list(drift) == ["kqvk", "one_move"] and 1.3 < drift["one_move"] < 1.6 and drift["kqvk"] > 2.0
    assert "one_move" in games.advice and "share one update" in games.advice

    for row in rows:
        del row["kl/kqvk/exact"]
    alone = _write_run(tmp_path / "alone", rows + _healthy_evals(), config)
    _games_against(alone, str(start), 193, 106, 701, (-195.0, -220.0, -170.0))
    games = _by_id(diagnose(load_run(alone)), "learning.games_against_start")
    assert "kl_to_start_by_task" not in games.evidence and "share one update" not in games.advice


def _lm_eval(directory: Path, step: int, moves: list[str]) -> dict[str, float]:
    """eval/step_NNNNNN_lm.json as `kind: rookworld` writes it (P: records with each greedy B: move), and its metrics row."""
    from chessgrpo.eval.lm import policy_metrics

    records = [
        {
            "prompt": f"P: position {i}",
            "completion": f"M: {m} E: 0.1 B: {m}",
            "total": 1.0,
            "malformed": None,
            "best": 0.0,
            "top5_hit": 0.0,
            "legal": 1.0,
            "top5": 0.0,
            "best_move": m,
            "best_legal": 1.0,
        }
        for i, m in enumerate(moves)
    ]
    metrics = policy_metrics(records, confidence=0.95, resamples=200, seed=0)
    (directory / "eval").mkdir(parents=True, exist_ok=True)
    payload = {"metrics": {k: v.to_json() for k, v in metrics.items()}, "records": {"policy": records}, "step": step}
    (directory / "eval" / f"step_{step:06d}_lm.json").write_text(json.dumps(payload))
    row = {"step": step}
    for name in ("p_distinct_best", "p_top_best_share"):
        row.update(
            {
                f"eval/{name}": metrics[name].value,
                f"eval/{name}_low": metrics[name].low,
                f"eval/{name}_high": metrics[name].high,
            }
        )
    return row


def test_an_lm_collapsing_onto_one_move_is_found_and_a_diverse_one_is_said_to_hold(tmp_path):
    """Synthetic: two LM evaluations 40 positions apart, as the issue saw it (42 distinct B: moves became 5, d2d4 taking
    half); a real collapse needs a long LM run. The same run without the collapse gets the info finding instead."""
    before = [f"m{i % 40}" for i in range(80)]
    collapsed = ["d2d4"] * 40 + [f"m{i % 4}" for i in range(40)]
    run = _write_run(tmp_path / "lm", _synthetic_rows(40))
    rows = [_lm_eval(run, 0, before), _lm_eval(run, 40, collapsed)]
    _write_run(run, _synthetic_rows(40) + rows)
    finding = _by_id(diagnose(load_run(run)), "lm.collapse")
    assert finding.severity == "warning" and "40 -> 5" in finding.message and "d2d4" in finding.message
    assert finding.evidence["favourite"] == {"move": "d2d4", "share": 0.5}

    steady = _write_run(tmp_path / "lm_ok", _synthetic_rows(40))
    rows = [_lm_eval(steady, 0, before), _lm_eval(steady, 40, list(reversed(before)))]
    _write_run(steady, _synthetic_rows(40) + rows)
    findings = diagnose(load_run(steady))
    assert (
        "lm.collapse" not in _ids(findings, "warning") and "40 -> 40" in _by_id(findings, "lm.answers_diverse").message
    )
