"""The report's figures of the evaluations, over one or several runs: the held-out metrics at each evaluation point
(with their intervals and, for one run, the paired change from the first point) and the games against anchors
(score, Elo per anchor and the maximum-likelihood Elo, over steps or per anchor). Their panels are always drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from chessgrpo.eval.registry import held_out_metrics
from chessgrpo.track.figure_panels import PALETTE, Panel, Trace
from chessgrpo.track.figures import ReportFigure
from chessgrpo.track.plot_series import legend_group, line_style
from chessgrpo.track.run_data import EloValue, GamesEvaluation, RunData

MARKERS = ("circle", "square", "diamond", "triangle-up", "x")
"""Marker per anchor (games) when colour is taken by the run."""


def figure_heldout(runs: Sequence[RunData]) -> ReportFigure | None:
    held_out = held_out_metrics()
    metrics = [m for m in held_out if any(m in p.metrics for run in runs for p in run.evals)]
    if not metrics:
        return None
    panels = []
    for metric in metrics:
        definition = held_out[metric][1]
        higher = definition.higher_is_better
        panel = Panel(
            f"{metric} ({'higher' if higher else 'lower'} is better)", definition.unit, droppable=False, integer_x=True
        )
        for r, run in enumerate(runs):
            points = [p for p in run.evals if metric in p.metrics]
            if not points:
                continue
            steps = np.array([p.step for p in points], dtype=float)
            values = np.array([p.metrics[metric].value for p in points])
            low = np.array([p.metrics[metric].low for p in points])
            high = np.array([p.metrics[metric].high for p in points])
            offset = (r - (len(runs) - 1) / 2) * 0.01 * max(1.0, float(np.ptp(steps)))
            style = line_style(r, 0, len(runs))
            label = run.name if len(runs) > 1 else metric
            has = np.isfinite(low) & np.isfinite(high)
            if has.all():
                panel.traces.append(
                    Trace(
                        "errorbar",
                        steps + offset,
                        values,
                        f"{label} (95% interval)",
                        marker="circle",
                        low=low,
                        high=high,
                        group=legend_group(run, len(runs)),
                        **style,
                    )
                )
            else:
                panel.line(
                    steps + offset,
                    values,
                    f"{label} (no interval logged)",
                    marker="circle",
                    group=legend_group(run, len(runs)),
                    **style,
                )
            panel.sources.append((label, values))
            if len(runs) == 1 and len(run.evals) >= 2:
                from chessgrpo.track.diagnose.changes import heldout_change
                from chessgrpo.track.diagnose.findings import Thresholds

                change = heldout_change(run, metric, run.evals[0], run.evals[-1], Thresholds())
                if change is not None:
                    how = "paired" if change.paired else "unpaired"
                    panel.note = f"last - first: {change.difference:+.4f} [{change.low:+.4f}, {change.high:+.4f}] {how}"
        panels.append(panel)
    return ReportFigure(
        "heldout",
        "Held-out metrics",
        "Held-out ESL, top-1 agreement with the engine, blunder rate and "
        "puzzle accuracy at each evaluation, with 95% intervals (bootstrap for the offline metrics, Wilson "
        "for puzzles). Overlapping intervals are not progress; the diagnosis compares points paired.",
        "Held-out evaluation (the same positions and puzzles at every point)",
        panels,
        columns=min(3, len(panels)),
        width=12.5,
        panel_height=3.2,
    )


def _games_label(evaluation: GamesEvaluation) -> str:
    return f"step {evaluation.step}" if evaluation.step is not None else evaluation.path.name


def _elo_point(estimate: EloValue | None) -> tuple[float, float, float, str | None]:
    """(value, low, high, bound) with NaN where absent; a one-sided bound has no interval."""
    if estimate is None or estimate.value is None:
        return math.nan, math.nan, math.nan, None
    low = math.nan if estimate.low is None or estimate.bound else estimate.low
    high = math.nan if estimate.high is None or estimate.bound else estimate.high
    return estimate.value, low, high, estimate.bound


def _add_elo(
    panel: Panel,
    x: np.ndarray,
    points: list[tuple[float, float, float, str | None]],
    label: str,
    interval: str,
    *,
    color: str,
    marker: str,
    connect: bool,
    group: str | None,
) -> None:
    """Elo estimates with their intervals as error bars, and one-sided bounds (a perfect or zero score) as bounds:
    a bar at the bound with an arrow towards the open side, in the legend as a bound, never as an interval."""
    finite = np.array([math.isfinite(p[0]) for p in points], dtype=bool)
    estimates = finite & np.array([p[3] is None for p in points], dtype=bool)
    if estimates.any():
        panel.traces.append(
            Trace(
                "errorbar",
                x[estimates],
                np.array([p[0] for p in points])[estimates],
                f"{label} ({interval})",
                color=color,
                marker=marker,
                low=np.array([p[1] for p in points])[estimates],
                high=np.array([p[2] for p in points])[estimates],
                connect=connect,
                group=group,
            )
        )
    for bound, what in (("lower", "lower bound: every game won"), ("upper", "upper bound: every game lost")):
        at = [i for i, p in enumerate(points) if finite[i] and p[3] == bound]
        if at:
            panel.traces.append(
                Trace(
                    "bound",
                    x[at],
                    np.array([points[i][0] for i in at]),
                    f"{label}: {what}",
                    color=color,
                    direction="up" if bound == "lower" else "down",
                    group=group,
                )
            )


def figure_games(runs: Sequence[RunData]) -> ReportFigure | None:
    """Games against anchors (`chessgrpo eval games ... output=RUN/eval/games*.json`): score and Elo per anchor.

    Over steps when a run has evaluations at two or more distinct known steps; else one point per anchor
    (its newest games), e.g. `make run`'s games against the random mover and against its start, both at the last step.
    """
    evaluated = [(r, run) for r, run in enumerate(runs) if run.games]
    if not evaluated:
        return None
    over_steps = any(len({e.step for e in run.games if e.step is not None}) >= 2 for _, run in evaluated)
    anchors = list(dict.fromkeys(a.anchor for _, run in evaluated for e in run.games for a in e.anchors))
    n_runs = len(runs)
    score = Panel(
        "score against each anchor (1 = every game won)",
        "score (points per game, 0-1)",
        droppable=False,
        ylim=(-0.02, 1.02),
    )
    # Elo axes span 200 Elo at least: a single point (or bound) would otherwise fill a 2-Elo-wide axis.
    elo = Panel("Elo difference to each anchor", "Elo difference (player - anchor)", droppable=False, min_yspan=200.0)
    overall = Panel(
        "maximum-likelihood Elo over the rated anchors", "Elo (anchor ratings' scale)", droppable=False, min_yspan=200.0
    )
    score.hline(0.5, "even score", color="#555555", dash="dot")
    elo.hline(0.0, "equal strength", color="#555555", dash="dot")
    skipped: list[str] = []
    overall_ticks: list[str] = []
    for r, run in evaluated:
        group = legend_group(run, n_runs)
        evaluations = [e for e in run.games if e.step is not None] if over_steps else list(run.games)
        skipped += [f"{run.name}: {e.path.name}" for e in run.games if e not in evaluations]
        evaluations = sorted(evaluations, key=lambda e: (e.step is None, e.step or 0))
        for a, anchor in enumerate(anchors):
            rows = [(e, row) for e in evaluations for row in e.anchors if row.anchor == anchor]
            if not rows:
                continue
            if over_steps:  # dodged by run and anchor so the intervals do not hide each other
                x = np.array([e.step for e, _ in rows], dtype=float)
                span = max(1.0, max(float(e.step) for e in evaluations) - min(float(e.step) for e in evaluations))
                slot = r * len(anchors) + a - (n_runs * len(anchors) - 1) / 2
                x = x + slot * 0.012 * span
            else:  # one point per anchor: its newest games (run.games is in step, then file-time order)
                rows = rows[-1:]
                x = np.array([a + (r - (n_runs - 1) / 2) * 0.12])
            color = PALETTE[r % 10] if n_runs > 1 else PALETTE[a % 10]
            marker = MARKERS[a % len(MARKERS)] if n_runs > 1 else "circle"
            prefix = f"{run.name}: " if n_runs > 1 else ""
            values = np.array([row.score.value for _, row in rows])
            score.traces.append(
                Trace(
                    "errorbar",
                    x,
                    values,
                    f"{prefix}{anchor} (95% Wilson)",
                    color=color,
                    marker=marker,
                    low=np.array([row.score.low for _, row in rows]),
                    high=np.array([row.score.high for _, row in rows]),
                    connect=over_steps,
                    group=group,
                )
            )
            score.sources.append((f"{prefix}{anchor}", values))
            _add_elo(
                elo,
                x,
                [_elo_point(row.elo) for _, row in rows],
                f"{prefix}{anchor}",
                "95%",
                color=color,
                marker=marker,
                connect=over_steps,
                group=group,
            )
        points = [(e, _elo_point(e.elo)) for e in evaluations]
        points = [(e, p) for e, p in points if math.isfinite(p[0])]
        if points:
            if over_steps:
                x = np.array([e.step for e, _ in points], dtype=float)
            else:  # one slot per evaluation with a rating, named below the axis
                x = np.arange(len(overall_ticks), len(overall_ticks) + len(points), dtype=float)
                overall_ticks += [f"{run.name + ': ' if n_runs > 1 else ''}{e.path.stem}" for e, _ in points]
            _add_elo(
                overall,
                x,
                [p for _, p in points],
                run.name if n_runs > 1 else "player",
                "95% likelihood-ratio interval",
                color=PALETTE[r % 10],
                marker="circle",
                connect=over_steps,
                group=group,
            )
    if not over_steps:
        ticks = (list(range(len(anchors))), anchors)
        for panel in (score, elo):
            panel.xlabel, panel.xticks = "anchor", ticks
        if overall_ticks:
            overall.xlabel, overall.xticks = "evaluation", (list(range(len(overall_ticks))), overall_ticks)
    else:
        for panel in (score, elo, overall):
            panel.integer_x = True
    panels = [p for p in (score, elo, overall) if p.traces]
    shown = "over the training steps of the evaluated checkpoints" if over_steps else "each anchor's newest games"
    caption = (
        f"Games against engine anchors (chessgrpo eval games), {shown}: score with its 95% Wilson interval and the "
        "Elo difference it implies, per anchor; the maximum-likelihood Elo over the rated anchors with its "
        "likelihood-ratio interval. A perfect (or zero) score gives only a one-sided Elo bound, drawn as a bar with an "
        "arrow towards the open side (not an interval). Anchor ratings are "
        "conventions (see the evaluation table), not measurements."
    )
    if skipped:
        caption += " Not drawn (step unknown): " + ", ".join(skipped) + "."
    return ReportFigure(
        "games",
        "Games against anchors",
        caption,
        "Game strength (eval games)",
        panels,
        columns=min(3, len(panels)),
        width=12.5,
        panel_height=3.4,
    )
