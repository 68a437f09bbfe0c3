"""The checks of learning: a trend in the training objective, held-out metrics that improved or got worse between
evaluations, the games against the run's start, and apparent held-out gains inside their intervals (noise read as
progress). Each is ``(RunData, Thresholds) -> list[Finding]`` (`track.diagnose.CHECKS`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from chessgrpo.track.diagnose.changes import games_against_start, heldout_changes, linear_trend
from chessgrpo.track.diagnose.findings import Finding, Thresholds, finite_series, learning_rows, pct, rounded
from chessgrpo.track.run_data import AnchorResult, GamesEvaluation, RunData

# ------------------------------------------------------------------------------------------------
# 4. and 5. Learning: trends and evaluation points


def _objective(run: RunData) -> tuple[str, bool] | None:
    if run.has("reward/mean"):
        return "reward/mean", True
    if run.has("loss/train"):
        return "loss/train", False
    return None


def check_learning(run: RunData, t: Thresholds) -> list[Finding]:
    """No trend in the training objective or the held-out metrics over a run long enough to show one."""
    findings: list[Finding] = []
    short: dict[str, Any] = {}
    games = games_against_start(run)
    # Games are the verdict that matters: a policy that beats its start has learned, whatever a flat
    # reward of fresh positions or an unresolved held-out difference says (those become information).
    stronger = games is not None and games[1].elo is not None and (games[1].elo.low or 0) > 0
    objective = _objective(run)
    if objective is not None:
        key, higher = objective
        steps, values = finite_series(*run.series(key, learning_rows(run)))
        if len(values) >= 3:
            change, low, high = linear_trend(steps, values, confidence=t.confidence, resamples=t.resamples)
            gain_low, gain_high = (low, high) if higher else (-high, -low)
            tenth = max(1, len(values) // 10)
            evidence = {
                "metric": key,
                "steps_logged": len(values),
                "first_step": int(steps[0]),
                "last_step": int(steps[-1]),
                "change_over_run": rounded(change),
                "interval": [rounded(low), rounded(high)],
                "confidence": t.confidence,
                "mean_first_10pct": rounded(float(values[:tenth].mean())),
                "mean_last_10pct": rounded(float(values[-tenth:].mean())),
            }
            described = (
                f"{key} changed by {change:+.4f} [{low:+.4f}, {high:+.4f}] over steps {int(steps[0])}-{int(steps[-1])}"
            )
            if len(values) < t.min_trend_steps:
                if gain_low <= 0:  # inconclusive (a significant gain needs no warning, however short the run)
                    short["training"] = evidence
            elif gain_high < 0:
                findings.append(
                    Finding(
                        "learning.objective_worse",
                        "warning",
                        f"the training objective got worse: {described} (linear fit, {pct(t.confidence)} block-bootstrap interval)",
                        evidence,
                        "Look at the findings above (loss budget, KL, collapse); lower lr; check that the reward is from the mover's "
                        "point of view.",
                    )
                )
            elif gain_low <= 0:
                findings.append(
                    Finding(
                        "learning.no_objective_trend",
                        "info" if stronger else "warning",
                        f"no learning in the training objective: {described}; the {pct(t.confidence)} interval of the linear "
                        f"trend includes 0"
                        + ("; in games it beats its start (learning.games_against_start)" if stronger else ""),
                        evidence,
                        "Check the signal (rollout/frac_reward_zero_std), the loss budget and the first-minibatch ratio; then raise "
                        "lr or num_iterations, or the group size. The reward of fresh positions varies from batch to batch: a real "
                        "trend needs more steps than that noise.",
                    )
                )
    changes = heldout_changes(run, t)
    finals = [c[-1] for c in changes.values() if c]
    if finals:
        span = finals[0].step_b - finals[0].step_a
        evidence = {"changes": [c.to_json() for c in finals], "confidence": t.confidence}
        worse = [c for c in finals if c.worse]
        checks = _puzzle_loss_from_fewer_checks(run, t) if any(c.metric.startswith("puzzle_") for c in worse) else None
        if worse:
            findings.append(
                Finding(
                    "learning.heldout_worse",
                    "warning",
                    "held-out metrics got significantly worse: " + "; ".join(c.describe() for c in worse),
                    {"changes": [c.to_json() for c in worse], "confidence": t.confidence},
                    "The policy drifts away from good moves: look at the entropy (collapse) and KL findings, raise kl_coef or "
                    "lower lr, and keep the checkpoint of the best held-out point."
                    + (" The puzzles' part: see learning.puzzles_fewer_checks." if checks else ""),
                )
            )
        if checks:
            findings.append(checks)
        if not any(c.improved for c in finals):
            if span < t.min_trend_steps:
                short["held_out"] = evidence
            else:
                findings.append(
                    Finding(
                        "learning.no_heldout_gain",
                        "info" if stronger else "warning",
                        f"no held-out metric improved significantly from step {finals[0].step_a} to {finals[0].step_b} "
                        f"({pct(t.confidence)} intervals of the differences: "
                        + "; ".join(c.describe() for c in finals)
                        + ")"
                        + ("; in games it beats its start (learning.games_against_start)" if stronger else ""),
                        evidence,
                        "Train longer or with a stronger signal before reading the curve; compare the two checkpoints with "
                        "`chessgrpo eval compare` on more positions (eval.max_positions) to resolve smaller differences.",
                    )
                )
    findings.extend(_games_against_start_finding(games, run))
    if short:
        findings.append(
            Finding(
                "learning.too_short",
                "info",
                f"too short to tell learning from noise (fewer than {t.min_trend_steps} steps): "
                + "; ".join(
                    f"{ev['metric']} changed by {ev['change_over_run']:+.4f} [{ev['interval'][0]:+.4f}, "
                    f"{ev['interval'][1]:+.4f}] over {ev['steps_logged']} steps"
                    if name == "training"
                    else "no held-out metric changed significantly between the first and last evaluation"
                    for name, ev in short.items()
                ),
                short,
                f"Run at least {t.min_trend_steps} steps (and evaluate at least twice) before judging whether it learns.",
            )
        )
    return findings


def task_drift(run: RunData) -> dict[str, float]:
    """A mixture's tasks by name with the median exact KL to the reference (`kl/<task>/exact`) over the last tenth of
    the logged steps (at least one), largest first; empty for a run of one task."""
    keys = sorted({key for row in run.rows for key in row if key.startswith("kl/") and key.endswith("/exact")})
    drift: dict[str, float] = {}
    for key in keys:
        task = key[len("kl/") : -len("/exact")]
        if not task or "/" in task:
            continue
        _, values = finite_series(*run.series(key, learning_rows(run)))
        if len(values):
            drift[task] = rounded(float(np.median(values[-max(1, len(values) // 10) :])))
    return dict(sorted(drift.items(), key=lambda item: -item[1]))


def _games_against_start_finding(
    found: tuple[GamesEvaluation, AnchorResult] | None, run: RunData | None = None
) -> list[Finding]:
    """Games are where a policy's change shows (`games_against_start`'s result): info when it beats its
    start, a warning when it loses to it (with each task's drift from the start in a mixture), nothing without such
    games."""
    if found is None or found[1].elo is None or found[1].elo.value is None:
        return []
    evaluation, anchor = found
    elo, games = anchor.elo, anchor.wins + anchor.draws + anchor.losses
    evidence = {
        "file": str(evaluation.path),
        "anchor": anchor.anchor,
        "games": games,
        "wins": anchor.wins,
        "draws": anchor.draws,
        "losses": anchor.losses,
        "elo": elo.value,
        "elo_interval": [elo.low, elo.high],
        "pentanomial": list(anchor.pentanomial),
    }
    described = f"{elo.text()} Elo over {games} games against {anchor.anchor} ({evaluation.path.name})"
    if elo.low is not None and elo.low > 0:
        return [
            Finding(
                "learning.games_against_start",
                "info",
                f"the policy beats its start in games: {described}",
                evidence,
                "Nothing to fix: games show what single-move held-out metrics may not.",
            )
        ]
    if elo.high is not None and elo.high < 0:
        advice = "It plays worse than before training: keep the starting checkpoint, and look at the findings above."
        drift = task_drift(run) if run is not None else {}
        if len(drift) > 1:  # a mixture: say how far each task moved the shared policy from its start
            evidence["kl_to_start_by_task"] = drift
            listed = ", ".join(f"{task} {kl:.3g}" for task, kl in drift.items())
            advice += (
                f" In a mixture every task's rows share one update, so a task with few loss tokens (a one-move row is one "
                f"token, a game one per ply) or small advantages (dr_grpo keeps the reward's scale, critic regrets are "
                f"normalised) is moved by the others: exact KL to the start by task, last tenth of the run: {listed}. "
                f"Hold the task that plays full games near its start (a larger weight, a lower lr, a larger "
                f"grpo.kl_coef, or bc_loss_weight) and measure again in games."
            )
        return [
            Finding(
                "learning.games_against_start",
                "warning",
                f"the policy loses to its start in games: {described}",
                evidence,
                advice,
            )
        ]
    return [
        Finding(
            "learning.games_against_start",
            "info",
            f"no significant difference in games against its start: {described}",
            evidence,
            "More games narrow the interval (eval games --games N, or --sprt for a sequential test).",
        )
    ]


def _puzzle_loss_from_fewer_checks(run: RunData, t: Thresholds) -> Finding | None:
    """A finding when the puzzles lost are check-first ones while quiet-first ones did not fall and the
    policy checks less often: the policy gave up a checking habit (puzzles mostly start with a check),
    which is not the same as drifting from good moves. None when the records cannot tell (older files)."""
    from chessgrpo.eval.compare import compare_records

    first, last = run.evals[0], run.evals[-1]
    records_a, records_b = first.records.get("puzzles"), last.records.get("puzzles")
    if not records_a or not records_b:
        return None
    rows = {
        m.metric: m
        for m in compare_records(
            "puzzles", records_a, records_b, confidence=t.confidence, resamples=t.resamples
        ).metrics
    }
    check_first, quiet_first, played = (
        rows.get(k) for k in ("check_first_accuracy", "quiet_first_accuracy", "played_check_rate")
    )
    if check_first is None or quiet_first is None or played is None:
        return None
    if not (check_first.verdict == "worse" and quiet_first.verdict != "worse" and played.verdict == "lower"):
        return None

    def row(m: Any) -> str:
        d = m.difference
        return f"{m.a.value:.3f} -> {m.b.value:.3f} ({d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}], n={m.a.n})"

    return Finding(
        "learning.puzzles_fewer_checks",
        "info",
        f"the puzzles lost (step {first.step} -> {last.step}) are check-first ones: check-first {row(check_first)}, "
        f"quiet-first {row(quiet_first)}; the policy's first move checks less often: {row(played)}",
        {
            key: m.to_json()
            for key, m in (("check_first", check_first), ("quiet_first", quiet_first), ("played_check_rate", played))
        },
        "The policy gave up a checking habit that most puzzles reward (their solutions start with a check) rather than "
        "drifting from good moves: compare `eval compare`'s played_check_rate with label_check_rate on the held-out "
        "positions, and judge the run by games against its start (`chessgrpo eval games --anchors START`) before "
        'raising kl_coef (docs/results.md, "The quickstart: `make run`").',
    )


def check_noise_as_progress(run: RunData, t: Thresholds) -> list[Finding]:
    """The best evaluation point of a metric not distinguishable from the first one."""
    changes = heldout_changes(run, t)
    if not changes:
        return []
    noisy = []
    for points in changes.values():
        best = max(points, key=lambda c: c.gain)
        if best.gain > 0 and not best.improved:
            noisy.append(best)
    if not noisy:
        return []
    anything_real = any(c.improved for points in changes.values() for c in points)
    last_step = run.evals[-1].step
    # A "peak" (best point before the last evaluation) is what gets read as progress; a best point at the
    # end is the no-learning finding's business (learning.no_heldout_gain), so alone it is only info here.
    peaks = [c for c in noisy if c.step_b < last_step and c.step_b - c.step_a >= t.min_trend_steps]
    severity = "warning" if peaks and not anything_real else "info"
    message = (
        "apparent held-out gains are inside their intervals (not distinguishable from the first evaluation): "
        + "; ".join(f"best {c.describe()}" for c in noisy)
    )
    if anything_real:
        message += "; other metrics did improve significantly"
    return [
        Finding(
            "eval.noise_as_progress",
            severity,
            message,
            {
                "best_points": [c.to_json() for c in noisy],
                "evaluations": len(run.evals),
                "confidence": t.confidence,
                "peak_steps": sorted({c.step_b for c in peaks}),
                "other_metric_improved": anything_real,
            },
            "Do not read these differences as progress. Report intervals with every number, compare checkpoints paired "
            "(`chessgrpo eval compare`), and evaluate on more positions/puzzles to shrink the intervals.",
        )
    ]
