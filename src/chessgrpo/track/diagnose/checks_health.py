"""The checks of the run's health and machinery: non-finite metrics, the training loop's divergence and stop events,
engine retries and failures, the evaluation cache's hit rate and the phase that dominates the step time.
Each is ``(RunData, Thresholds) -> list[Finding]`` (`track.diagnose.CHECKS`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from chessgrpo.track.diagnose.findings import Finding, Thresholds, finite_series, pct, rounded
from chessgrpo.track.run_data import RunData

# ------------------------------------------------------------------------------------------------
# 8. Numbers, gradients, KL sign, engines, cache, time


def check_non_finite(run: RunData, t: Thresholds) -> list[Finding]:
    """NaN or Inf in any logged metric."""
    where: dict[str, list[int]] = {}
    for row in run.rows:
        skipped = row.get("loss/skipped") == 1.0 or row.get("learn/minibatches") == 0.0
        for key, value in row.items():
            if key in ("step", "time") or not isinstance(value, float) or math.isfinite(value):
                continue
            if key == "ratio/first_max_abs_dev" and skipped:  # no minibatch ran: NaN by definition
                continue
            where.setdefault(key, []).append(row["step"])
    if not where:
        return []
    first = min(steps[0] for steps in where.values())
    keys = sorted(where, key=lambda k: where[k][0])
    return [
        Finding(
            "values.non_finite",
            "critical",
            f"non-finite values (NaN/Inf) in {len(keys)} metric(s), first at step {first}: "
            + ", ".join(
                f"{k} (steps {', '.join(map(str, where[k][:5]))}{', ...' if len(where[k]) > 5 else ''})"
                for k in keys[:6]
            ),
            {
                "first_step": first,
                "metrics": {k: where[k][:10] for k in keys},
                "rows_affected": len({s for v in where.values() for s in v}),
            },
            "Resume from the last checkpoint before that step with a lower lr; keep gradient clipping on and bf16=false; a NaN "
            "reward points at the engine or the reward function.",
        )
    ]


def check_health_events(run: RunData, t: Thresholds) -> list[Finding]:
    """The training loop's divergence and stop events (events.jsonl): what happened, where, and why."""
    findings = []
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in run.events:
        by_kind.setdefault(event["event"], []).append(event)
    if "diverged" in by_kind:
        last = by_kind["diverged"][-1]
        findings.append(
            Finding(
                "health.diverged",
                "critical",
                f"the run diverged and stopped at step {last['step']}: {last['message']}",
                {"step": last["step"], "rollbacks": len(by_kind.get("rollback", []))},
                "Restart from the last good checkpoint with a lower lr or a larger KL coefficient; check the rewards for NaN.",
            )
        )
    if "rollback" in by_kind:
        events = by_kind["rollback"]
        findings.append(
            Finding(
                "health.rollback",
                "warning",
                f"{len(events)} rollback(s) to the last good checkpoint after non-finite updates (first at step {events[0]['step']}); "
                "the learning rate was lowered each time",
                {"steps": [e["step"] for e in events][:10], "messages": [e["message"] for e in events][:3]},
                "The run recovered, but it was unstable at its learning rate: lower lr (the backoff already did, for this run).",
            )
        )
    if "nonfinite_skip" in by_kind and "rollback" not in by_kind and "diverged" not in by_kind:
        events = by_kind["nonfinite_skip"]
        findings.append(
            Finding(
                "health.nonfinite_skip",
                "warning",
                f"{len(events)} update(s) skipped for a non-finite loss or gradient (steps {', '.join(str(e['step']) for e in events[:5])})",
                {"steps": [e["step"] for e in events][:10]},
                "Isolated skips are harmless; repeated ones mean the learning rate or the precision is too aggressive.",
            )
        )
    for event in by_kind.get("early_stop", []):
        findings.append(
            Finding(
                "health.early_stop",
                "warning",
                f"the run stopped early: {event['message']}",
                {"step": event["step"]},
                "A KL or entropy stop means the policy left its reference or collapsed: lower lr or raise the KL coefficient. "
                "A held-out stop means more steps would not have helped at these settings.",
            )
        )
    return findings


def _increments(steps: np.ndarray, cumulative: np.ndarray) -> tuple[int, list[int]]:
    """Total increase of a counter that restarts at each invocation, and the steps where it rose."""
    total, rose, previous = 0, [], 0.0
    for step, value in zip(steps, cumulative):
        delta = value - previous if value >= previous else value  # a restart (resume) begins from 0 again
        if delta > 0:
            total += round(delta)
            rose.append(int(step))
        previous = value
    return total, rose


def check_engine(run: RunData, t: Thresholds) -> list[Finding]:
    """Engine retries (a crash or hang, recovered) and failures (not recovered)."""
    findings = []
    for key, identifier, severity, what in (
        ("perf/engine_failures", "engine.failures", "critical", "exhausted its retries on one search"),
        ("perf/engine_retries", "engine.retries", "warning", "crashed or hung and was restarted"),
    ):
        steps, values = finite_series(*run.series(key, run.train_rows))
        total, rose = _increments(steps, values)
        if total > 0:
            findings.append(
                Finding(
                    identifier,
                    severity,
                    f"Stockfish {what} {total} time(s) (first at step {rose[0]})",
                    {
                        "count": total,
                        "steps": rose[:10],
                        "engine.timeout_s": run.setting("engine.timeout_s"),
                        "engine.processes": run.setting("engine.processes"),
                    },
                    "Check the engine with `chessgrpo doctor`, the machine's memory, and engine.timeout_s (a slow machine under load "
                    "times out); retried searches are recomputed, never scored 0.",
                )
            )
    return findings


def check_cache(run: RunData, t: Thresholds) -> list[Finding]:
    """A low evaluation-cache hit rate in the second half of the run (cache on)."""
    if run.setting("engine.cache", True) is False:
        return []
    _, rate = finite_series(*run.series("perf/cache_hit_rate", run.train_rows))
    if len(rate) < 20:
        return []
    median = float(np.median(rate[len(rate) // 2 :]))
    if median >= t.low_cache_hit:
        return []
    return [
        Finding(
            "engine.low_cache_hit",
            "info",
            f"the evaluation cache hits {pct(median)} of lookups in the second half of the run: nearly every reward is a fresh search",
            {
                "median_cache_hit_rate_second_half": rounded(median),
                "threshold": t.low_cache_hit,
                "engine.cache_path": run.setting("engine.cache_path"),
            },
            "Expected when every step draws new positions. If positions do recur, check that engine.cache_path is persistent "
            "and shared between runs; otherwise engine.cache=false saves the lookups.",
        )
    ]


def check_phase_time(run: RunData, t: Thresholds) -> list[Finding]:
    """One phase (sample, reward, learn) taking most of the step time."""
    rows = [row for row in run.train_rows if "perf/step_s" in row]
    if not rows:
        return []
    total = sum(row["perf/step_s"] for row in rows if math.isfinite(row["perf/step_s"]))
    if total <= 0:
        return []
    shares = {
        phase: sum(row.get(f"perf/{phase}_s", 0.0) for row in rows) / total for phase in ("sample", "reward", "learn")
    }
    phase, share = max(shares.items(), key=lambda item: item[1])
    if share <= t.phase_dominant:
        return []
    advice = {
        "reward": "More engine processes (engine.processes), fewer task.reward_nodes, keep engine.cache on; the policy waits "
        "for Stockfish.",
        "sample": "Sampling dominates: a larger batch per forward (positions_per_step) or a GPU.",
        "learn": "Learning dominates: fewer grpo.num_iterations or larger minibatches, bf16 on a GPU.",
    }[phase]
    return [
        Finding(
            "perf.phase_dominates",
            "info",
            f"{phase} takes {pct(share)} of the step time ("
            + ", ".join(f"{p} {pct(s)}" for p, s in shares.items())
            + ")",
            {
                "shares": {p: rounded(s) for p, s in shares.items()},
                "total_seconds": rounded(total),
                "steps_logged": len(rows),
            },
            advice,
        )
    ]
