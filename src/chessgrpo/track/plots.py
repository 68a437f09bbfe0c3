"""The report's figures: one function per figure, over one or several runs, and which figures a report gets.

Each figure function builds a backend-neutral `ReportFigure` (`chessgrpo.track.figures`: panels of
lines, bands, error bars, stacks and reference lines), which draws itself with plotly or
matplotlib.

Every panel has a title, labelled axes with units and a legend placed below the data; intervals
are bands or error bars. A figure whose metrics no run logged is skipped (the builder returns
None), so the same code draws GRPO and pretraining runs. With several runs the runs share the axes
of every panel (overlays): colour is the run and line style the metric; with one run, colour is
the metric.

A per-step training panel in which every series is constant (a fixed KL coefficient, a constant
learning rate, a cache hit rate of 0 with the cache off) is not drawn: `plan_figures` lists it in
`FigurePlan.dropped` with the constant values, and the report says so in one line. Evaluation
panels (held-out metrics, games) are always drawn.

Per-step training metrics are noisy (every step draws fresh positions), so long series are drawn
twice: the raw values thin and pale, and a centred moving average over ``w`` steps (w = n/25,
at least 5) with its 95% band ``mean +- 1.96 sd / sqrt(w)`` from the spread inside the window.
Short series (< 10 steps) are drawn raw; the reward then gets the per-step band
``reward/mean +- 1.96 reward/std / sqrt(rows)`` (the batch mean's own interval).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from chessgrpo.eval.registry import held_out_metrics
from chessgrpo.track.figures import PALETTE, DroppedPanel, Panel, Reference, ReportFigure, Trace
from chessgrpo.track.run_data import EloValue, GamesEvaluation, RunData

if TYPE_CHECKING:
    from chessgrpo.sweep.summary import StudyPlotData

Z95 = 1.959964
DASHES = ("solid", "dash", "dot", "dashdot")
MARKERS = ("circle", "square", "diamond", "triangle-up", "x")
"""Marker per anchor (games) when colour is taken by the run."""


@dataclasses.dataclass
class FigurePlan:
    figures: list[ReportFigure]
    dropped: list[DroppedPanel]
    """Every panel left out as constant (figures with no panel left are not in `figures`)."""


# ------------------------------------------------------------------------------------------------
# Helpers


def _style(run_index: int, metric_index: int, n_runs: int) -> dict:
    if n_runs == 1:
        return {"color": PALETTE[metric_index % 10], "dash": "solid"}
    return {"color": PALETTE[run_index % 10], "dash": DASHES[metric_index % len(DASHES)]}


def _group(run: RunData, n_runs: int) -> str | None:
    return run.name if n_runs > 1 else None


def _label(run: RunData, metric: str, n_runs: int) -> str:
    return metric if n_runs == 1 else f"{run.name}: {metric}"


def _series(run: RunData, key: str, train_only: bool = True) -> tuple[np.ndarray, np.ndarray]:
    steps, values = run.series(key, run.train_rows if train_only else None)
    keep = np.isfinite(values)
    return steps[keep], values[keep]


def window_for(n: int) -> int:
    """Moving-average window (steps) for a series of n points: 1 below 10 points, else max(5, n // 25)."""
    return 1 if n < 10 else max(5, n // 25)


def moving_average(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Centred moving mean and the 95% half-width 1.96 sd / sqrt(k) of each window (k points, edges shrink)."""
    n = len(values)
    if window <= 1 or n == 0:
        return values.astype(float), np.zeros(n)
    half = window // 2
    mean = np.empty(n)
    width = np.empty(n)
    for i in range(n):
        chunk = values[max(0, i - half) : min(n, i + half + 1)]
        mean[i] = chunk.mean()
        width[i] = Z95 * chunk.std(ddof=1) / math.sqrt(len(chunk)) if len(chunk) > 1 else 0.0
    return mean, width


def is_constant(values: np.ndarray) -> bool:
    """At least two finite values, all equal (to 1e-9 relative): a setting drawn as a curve, not a measurement."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if len(finite) < 2:
        return False
    return bool(np.allclose(finite, finite[0], rtol=1e-9, atol=1e-12))


def _plot_smoothed(
    panel: Panel,
    steps: np.ndarray,
    values: np.ndarray,
    label: str,
    style: dict,
    *,
    band: bool = True,
    group: str | None = None,
) -> None:
    group = group or label  # the raw values, the mean and its band toggle together in the interactive legend
    window = window_for(len(values))
    if window == 1:
        panel.line(steps, values, label, source=label, marker="dot" if len(values) < 30 else None, group=group, **style)
        return
    panel.line(steps, values, None, source=label, color=style["color"], opacity=0.3, width=0.7, group=group)
    mean, width = moving_average(values, window)
    panel.line(steps, mean, f"{label} (mean of {window} steps)", width=1.8, group=group, **style)
    if band:  # paler when runs overlap on the same axes
        panel.band(
            steps, mean - width, mean + width, color=style["color"], opacity=0.2 if group is None else 0.12, group=group
        )


def _any(runs: Sequence[RunData], *keys: str) -> bool:
    return any(run.has(key) for run in runs for key in keys)


def _plot_metrics(
    panel: Panel, runs: Sequence[RunData], keys: Sequence[str], *, band: bool = True, raw: bool = False
) -> bool:
    """Each run's `keys` on `panel`: smoothed with a band (noisy per-step metrics) or raw (schedules, controller outputs)."""
    drawn = False
    for r, run in enumerate(runs):
        for m, key in enumerate(keys):
            steps, values = _series(run, key)
            if not len(values):
                continue
            label = _label(run, key, len(runs))
            if raw:
                panel.line(steps, values, label, source=label, group=_group(run, len(runs)), **_style(r, m, len(runs)))
            else:
                _plot_smoothed(
                    panel, steps, values, label, _style(r, m, len(runs)), band=band, group=_group(run, len(runs))
                )
            drawn = True
    return drawn


def _plot_trend(panel: Panel, steps: np.ndarray, values: np.ndarray, style: dict, group: str | None = None) -> None:
    """The least-squares line the diagnosis tests, labelled with its change over the run and 95% interval."""
    from chessgrpo.track.diagnose import linear_trend

    if len(values) < 10:
        return
    change, low, high = linear_trend(steps, values)
    if not math.isfinite(change):
        return
    slope, intercept = np.polyfit(steps, values, 1)
    panel.line(
        steps[[0, -1]],
        intercept + slope * steps[[0, -1]],
        f"linear trend: {change:+.3f} [{low:+.3f}, {high:+.3f}] over the run",
        color=style["color"],
        dash="longdash",
        width=1.0,
        group=group,
    )


def _reward_units(runs: Sequence[RunData]) -> str:
    kinds = {run.setting("task.reward", "win_prob") for run in runs}
    if kinds == {"regret"}:
        return "regret (win-prob units, <= 0)"
    if kinds == {"win_prob"}:
        return "win probability of the move (0-1, mover's view)"
    return "reward (win-prob units)"


def _stacked(panel: Panel, runs: Sequence[RunData], keys: Sequence[str], labels: Sequence[str]) -> None:
    """One run: the moving averages of `keys` stacked; several runs: each key as a line per run (shared axes)."""
    if len(runs) == 1:
        series = [_series(runs[0], key) for key in keys]
        steps = series[0][0]
        if len(steps) and all(len(s[1]) == len(steps) for s in series):
            window = window_for(len(steps))
            suffix = f" (mean of {window} steps)" if window > 1 else ""
            for m, ((_, values), key, label) in enumerate(zip(series, keys, labels)):
                panel.traces.append(
                    Trace(
                        "stack", steps, moving_average(values, window)[0], label + suffix, color=PALETTE[m], opacity=0.8
                    )
                )
                panel.sources.append((key, values))
    else:
        _plot_metrics(panel, runs, keys, band=False)


# ------------------------------------------------------------------------------------------------
# Figures


def figure_reward(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "reward/mean"):
        return None
    panel = Panel("reward of the sampled moves", _reward_units(runs))
    for r, run in enumerate(runs):
        steps, mean = _series(run, "reward/mean")
        if not len(mean):
            continue
        style, group = _style(r, 0, len(runs)), _group(run, len(runs))
        _plot_smoothed(panel, steps, mean, _label(run, "reward/mean", len(runs)), style, group=group)
        if window_for(len(mean)) == 1:  # short run: the per-step batch mean's own interval
            _, std = run.series("reward/std", run.train_rows)
            _, rows = run.series("learn/rows", run.train_rows)
            if len(std) == len(mean) and len(rows) == len(mean):
                width = Z95 * std / np.sqrt(np.maximum(rows, 1))
                panel.band(
                    steps,
                    mean - width,
                    mean + width,
                    "95% interval of the batch mean",
                    color=style["color"],
                    group=group,
                )
        _plot_trend(panel, steps, mean, style, group)
    panels = [panel]
    if _any(runs, "reward/esl"):
        esl = Panel("rollout ESL: best move's value - sampled move's", "expected score loss (win-prob units)")
        _plot_metrics(esl, runs, ["reward/esl"])
        panels.append(esl)
    return ReportFigure(
        "reward",
        "Reward",
        "Mean reward of the sampled moves per step and the rollout's expected score loss "
        "(lower is better). Bands: 95% intervals (see the note on moving averages).",
        "Reward (training rollouts)",
        panels,
    )


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
            style = _style(r, 0, len(runs))
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
                        group=_group(run, len(runs)),
                        **style,
                    )
                )
            else:
                panel.line(
                    steps + offset,
                    values,
                    f"{label} (no interval logged)",
                    marker="circle",
                    group=_group(run, len(runs)),
                    **style,
                )
            panel.sources.append((label, values))
            if len(runs) == 1 and len(run.evals) >= 2:
                from chessgrpo.track.diagnose import Thresholds, heldout_change

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
        group = _group(run, n_runs)
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


def figure_pretraining(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "loss/train"):
        return None
    panels = []
    for train_key, eval_key, unit, title in (
        ("loss/train", "eval/loss", "cross-entropy (nats)", "loss: training batches and held-out split"),
        ("train/top1", "eval/top1", "fraction of positions", "top-1 agreement with the engine's best move"),
    ):
        panel = Panel(title, unit)
        for r, run in enumerate(runs):
            group = _group(run, len(runs))
            steps, values = _series(run, train_key)
            if len(values):
                _plot_smoothed(
                    panel, steps, values, _label(run, train_key, len(runs)), _style(r, 0, len(runs)), group=group
                )
                if train_key == "loss/train":
                    _plot_trend(panel, steps, values, _style(r, 0, len(runs)), group)
            steps, values = _series(run, eval_key, train_only=False)
            if len(values):
                label = _label(run, eval_key + " (point estimate)", len(runs))
                panel.line(steps, values, label, source=label, marker="circle", group=group, **_style(r, 1, len(runs)))
        panels.append(panel)
    return ReportFigure(
        "pretraining",
        "Pretraining curves",
        "Training metrics (batch means) and held-out metrics on the "
        "dataset's test split. Pretraining evaluation logs point estimates only (no interval).",
        "Pretraining: training and held-out",
        panels,
    )


def figure_loss(runs: Sequence[RunData]) -> ReportFigure | None:
    terms = ["loss/policy", "loss/kl_weighted", "loss/entropy", "loss/total"]
    if not _any(runs, *terms):
        return None
    shares = ["loss/share_policy", "loss/share_kl", "loss/share_entropy"]
    panel = Panel("loss terms (entropy term = -coef x entropy)", "loss value (dimensionless)")
    _plot_metrics(panel, runs, [t for t in terms if _any(runs, t)], band=False)
    panel.hline(0.0, None, color="black", dash="solid", width=0.6)
    panels = [panel]
    if _any(runs, *shares):
        budget = Panel("loss budget: each term's share", "share of sum |terms| (0-1)", ylim=(0, 1.02))
        _stacked(budget, runs, shares, shares)
        budget.hline(0.5, "one half (dominance)", color="black", dash="dash")
        panels.append(budget)
    gradients = [f"grad_norm/{term}" for term in ("policy", "kl", "entropy", "aux")]
    if _any(runs, "grad_norm/policy"):
        pull = Panel("gradient of each term alone (every grpo.term_gradient_every steps)", "gradient L2 norm")
        _plot_metrics(pull, runs, [k for k in gradients if _any(runs, k)], raw=True)
        panels.append(pull)
    return ReportFigure(
        "loss",
        "Loss terms and shares",
        "The policy (clipped surrogate), weighted KL and entropy terms, and "
        "each term's share of the sum of their magnitudes. With normalised advantages the policy term's "
        "value is near 0 by construction, so the last panel shows what each term pulls on the weights "
        "(its own gradient's norm, auxiliary = value head and bc anchor); a term other than the policy "
        "above one half of the sum for most measured steps is flagged.",
        "Loss terms and their shares",
        panels,
    )


def figure_kl(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "kl/value", "kl/coef"):
        return None
    value = Panel("KL to the reference: raw estimate, exact, weighted", "KL (nats per move/token)")
    _plot_metrics(value, runs, [k for k in ("kl/value", "kl/exact", "loss/kl_weighted") if _any(runs, k)])
    for r, run in enumerate(runs):
        if run.setting("grpo.kl_schedule") == "adaptive":
            value.hline(
                float(run.setting("grpo.kl_target", 0.01)),
                f"{run.name if len(runs) > 1 else ''} kl_target".strip(),
                color=_style(r, 0, len(runs))["color"],
                dash="dash",
                width=0.9,
            )
    coef = Panel("KL coefficient (controller output)", "KL coefficient beta (dimensionless)")
    _plot_metrics(coef, runs, ["kl/coef"], raw=True)
    values = [v for run in runs for v in _series(run, "kl/coef")[1] if v > 0]
    for r, run in enumerate(runs):
        if run.setting("grpo.kl_schedule") == "adaptive":
            for bound in ("kl_coef_min", "kl_coef_max"):
                limit = float(run.setting(f"grpo.{bound}", math.nan))
                if limit > 0:
                    coef.hline(
                        limit,
                        f"{run.name + ' ' if len(runs) > 1 else ''}{bound}",
                        color=_style(r, 0, len(runs))["color"],
                        dash="dot",
                        width=0.9,
                    )
                    values.append(limit)
    coef.ylog = bool(values) and max(values) / min(values) > 20
    panels = [p for p in (value, coef) if p.traces]
    return ReportFigure(
        "kl",
        "KL and its coefficient",
        "kl/value: the k-estimator on the sampled moves (mean per move/token); "
        "kl/exact: the exact KL of the full distributions at sampling; loss/kl_weighted = coef x KL. The "
        "coefficient: the controller's output, with its bounds when adaptive.",
        "KL to the reference policy",
        panels,
    )


def figure_entropy(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "entropy/mean"):
        return None
    panel = Panel("policy entropy against the uniform policy's", "entropy (nats)", ylim=(0, None))
    for r, run in enumerate(runs):
        group = _group(run, len(runs))
        steps, entropy = _series(run, "entropy/mean")
        if len(entropy):
            _plot_smoothed(
                panel, steps, entropy, _label(run, "entropy/mean", len(runs)), _style(r, 0, len(runs)), group=group
            )
        steps, legal = _series(run, "entropy/ln_legal")
        if len(legal):
            mean, _ = moving_average(legal, window_for(len(legal)))
            label = _label(run, "ln(#legal moves) = uniform policy", len(runs))
            panel.line(steps, mean, label, group=group, **_style(r, 1, len(runs)))
            panel.sources.append((label, legal))
            panel.band(
                steps,
                0.95 * mean,
                mean,
                "near-uniform zone (>= 95% of ln #legal)" if r == 0 else None,
                color="#808080",
                opacity=0.15,
                group=group,
            )
    panel.references.append(Reference(0.0, "collapse zone (< 0.1 nats)", color="#d62728", y1=0.1, opacity=0.08))
    return ReportFigure(
        "entropy",
        "Entropy",
        "Exact entropy of the masked, tempered policy at the sampled positions against "
        "ln(#legal moves), the entropy of the uniform policy.",
        "Entropy of the sampling distribution",
        [panel],
        columns=1,
        width=9.0,
    )


def figure_signal(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "rollout/frac_reward_zero_std"):
        return None
    panel = Panel("groups whose rewards are all equal (no signal)", "fraction of groups", ylim=(-0.02, 1.02))
    _plot_metrics(panel, runs, ["rollout/frac_reward_zero_std"])
    panel.hline(0.5, "one half", color="black", dash="dash")
    panels = [panel]
    if _any(runs, "rollout/unique_moves"):
        unique = Panel("distinct sampled moves per group", "distinct moves per group (count)")
        _plot_metrics(unique, runs, ["rollout/unique_moves"])
        panels.append(unique)
    return ReportFigure(
        "signal",
        "Signal",
        "A group whose sampled moves all get the same reward has zero advantage and teaches nothing.",
        "Signal: reward variance inside groups",
        panels,
    )


def figure_clip(runs: Sequence[RunData]) -> ReportFigure | None:
    keys = [k for k in ("ratio/clip_frac", "ratio/clip_frac_low", "ratio/clip_frac_high") if _any(runs, k)]
    if not keys:
        return None
    panel = Panel(
        "clipped fraction: low (A < 0, ratio < 1-eps), high (A > 0, ratio > 1+eps)",
        "fraction of tokens (moves)",
        ylim=(0, None),
    )
    _plot_metrics(panel, runs, keys)
    return ReportFigure(
        "clip",
        "Clip fractions",
        "Share of sampled moves whose ratio was clipped, over all minibatches of a "
        "step. The first minibatch after a rollout must clip nothing.",
        "PPO clipping",
        [panel],
        columns=1,
        width=9.0,
    )


def figure_ratio(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "ratio/mean", "ratio/first_max_abs_dev"):
        return None
    ratio = Panel("importance ratio over all minibatches", "ratio pi/pi_old (dimensionless)")
    for r, run in enumerate(runs):
        group = _group(run, len(runs))
        steps, low = _series(run, "ratio/min")
        _, high = _series(run, "ratio/max")
        style = _style(r, 0, len(runs))
        if len(low) and len(low) == len(high):
            ratio.band(
                steps, low, high, _label(run, "ratio min-max over moves", len(runs)), color=style["color"], group=group
            )
            ratio.sources += [(_label(run, "ratio/min", len(runs)), low), (_label(run, "ratio/max", len(runs)), high)]
        steps, mean = _series(run, "ratio/mean")
        if len(mean):
            label = _label(run, "ratio/mean", len(runs))
            ratio.line(steps, mean, label, source=label, group=group, **style)
        eps_low = float(run.setting("grpo.epsilon", 0.2))
        eps_high = run.setting("grpo.epsilon_high") or eps_low
        if r == 0 and run.kind == "grpo":
            ratio.hline(1 - eps_low, f"clip bounds 1-{eps_low:g}, 1+{float(eps_high):g}", color="black", dash="dash")
            ratio.hline(1 + float(eps_high), None, color="black", dash="dash")
    deviation = Panel("first minibatch after each rollout (must be ~0)", "max |ratio - 1| (log scale)", ylog=True)
    floor = 1e-9
    for r, run in enumerate(runs):
        steps, dev = _series(run, "ratio/first_max_abs_dev")
        if len(dev):
            label = _label(run, f"ratio/first_max_abs_dev (0 drawn at {floor:g})", len(runs))
            deviation.line(
                steps,
                np.maximum(dev, floor),
                label,
                marker="dot" if len(dev) < 60 else None,
                group=_group(run, len(runs)),
                **_style(r, 0, len(runs)),
            )
            deviation.sources.append((_label(run, "ratio/first_max_abs_dev", len(runs)), dev))
        bf16 = run.setting("bf16")
        tolerance = float(
            run.setting("grpo.ratio_tolerance_bf16", 2e-2) if bf16 else run.setting("grpo.ratio_tolerance", 1e-4)
        )
        if r == 0:
            deviation.hline(tolerance, f"tolerance {tolerance:g}", color="#d62728", dash="dash", width=0.9)
    panels = [p for p in (ratio, deviation) if p.traces]
    return ReportFigure(
        "ratio",
        "Ratio range",
        "The range and mean of the ratio used in the loss, and the largest "
        "|ratio - 1| on the first minibatch after each rollout, where the learner's weights still equal "
        "the sampler's: above the tolerance the log-probs of sampling and learning differ.",
        "Importance ratio",
        panels,
    )


def figure_throughput(runs: Sequence[RunData]) -> ReportFigure | None:
    phases = ["perf/sample_s", "perf/reward_s", "perf/learn_s"]
    rates = [k for k in ("perf/samples_per_s", "perf/engine_evals_per_s") if _any(runs, k)]
    if not _any(runs, *phases) and not rates:
        return None
    panels = []
    if _any(runs, *phases):
        panel = Panel("time per phase (stacked: sample, reward, learn)", "seconds per step (s)")
        _stacked(panel, runs, phases, [p.split("/")[1].removesuffix("_s") for p in phases])
        panels.append(panel)
    for key in rates:
        panel = Panel(
            key, "samples per second (1/s)" if key == "perf/samples_per_s" else "engine evaluations per second (1/s)"
        )
        _plot_metrics(panel, runs, [key])
        panels.append(panel)
    if _any(runs, "perf/cache_hit_rate"):
        panel = Panel("evaluation cache hit rate", "fraction of lookups", ylim=(-0.02, 1.02))
        _plot_metrics(panel, runs, ["perf/cache_hit_rate"])
        panels.append(panel)
    panels = [p for p in panels if p.traces]
    return ReportFigure(
        "throughput",
        "Throughput",
        "Time per training step split into sampling, engine rewards and learning; "
        "samples and engine evaluations per second; the evaluation cache's hit rate.",
        "Throughput and phase times",
        panels,
        columns=2 if len(panels) > 1 else 1,
    )


def figure_optimizer(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "grad_norm", "lr"):
        return None
    grad = Panel("gradient norm", "gradient L2 norm before clipping")
    _plot_metrics(grad, runs, ["grad_norm"], band=False)
    for r, run in enumerate(runs):
        clip = run.setting("max_grad_norm", run.setting("grpo.max_grad_norm", run.setting("grad_clip")))
        if clip and grad.traces:
            grad.hline(
                float(clip),
                f"{run.name + ' ' if len(runs) > 1 else ''}clip at {clip}",
                color=_style(r, 0, len(runs))["color"],
                dash="dash",
                width=0.9,
            )
    values = [v for run in runs for v in _series(run, "grad_norm")[1] if v > 0]
    grad.ylog = bool(values) and max(values) / min(values) > 20
    lr = Panel("learning rate", "learning rate (per update)")
    _plot_metrics(lr, runs, ["lr"], raw=True)
    panels = [p for p in (grad, lr) if p.traces]
    return ReportFigure(
        "optimizer",
        "Gradient norm and learning rate",
        "Gradient norm before clipping (mean over the step's "
        "minibatches) with the clipping threshold, and the learning rate schedule.",
        "Optimizer",
        panels,
    )


FIGURES: tuple[Callable[[Sequence[RunData]], ReportFigure | None], ...] = (
    figure_reward,
    figure_heldout,
    figure_games,
    figure_pretraining,
    figure_loss,
    figure_kl,
    figure_entropy,
    figure_signal,
    figure_clip,
    figure_ratio,
    figure_throughput,
    figure_optimizer,
)


def drop_constant_panels(figure: ReportFigure) -> ReportFigure | None:
    """Leave out the droppable panels whose every series is constant (recorded in figure.dropped); None when none is left."""
    kept = []
    for panel in figure.panels:
        if panel.droppable and panel.sources and all(is_constant(values) for _, values in panel.sources):
            constants = {}
            for label, values in panel.sources:
                finite = np.asarray(values, dtype=float)
                constants.setdefault(label, float(finite[np.isfinite(finite)][0]))
            figure.dropped.append(DroppedPanel(figure.title, panel.title, tuple(constants.items())))
        else:
            kept.append(panel)
    figure.panels = kept
    if not kept:
        return None
    figure.columns = max(1, min(figure.columns, len(kept)))
    return figure


def plan_figures(runs: Sequence[RunData]) -> FigurePlan:
    """Every figure some run has metrics for, in report order, without the panels whose series are all constant."""
    figures, dropped = [], []
    for build in FIGURES:
        figure = build(runs)
        if figure is None:
            continue
        kept = drop_constant_panels(figure)
        dropped += figure.dropped
        if kept is not None:
            figures.append(kept)
    return FigurePlan(figures, dropped)


def build_figures(runs: Sequence[RunData]) -> list[ReportFigure]:
    """The figures of `plan_figures` (constant panels left out)."""
    return plan_figures(runs).figures


def figure_study(study: StudyPlotData) -> ReportFigure:
    """A sweep's optimisation history (each trial's objective, the best so far) beside its parameter importances."""
    minimize = study.direction == "minimize"
    done = [
        (n, v, i)
        for n, v, s, i in zip(study.numbers, study.values, study.states, study.intervals)
        if s == "complete" and v is not None
    ]
    pruned = [(n, v) for n, v, s in zip(study.numbers, study.values, study.states) if s == "pruned" and v is not None]
    failed = [n for n, s in zip(study.numbers, study.states) if s == "failed"]
    failed_text = f"; {len(failed)} failed (not drawn)" if failed else ""
    history = Panel(
        f"optimisation history of {study.name}{failed_text}",
        study.metric,
        "trial number",
        integer_x=True,
        droppable=False,
    )
    if done:
        numbers = np.array([n for n, _, _ in done], dtype=float)
        values = np.array([v for _, v, _ in done], dtype=float)
        low = np.array([i[0] if i else v for _, v, i in done], dtype=float)
        high = np.array([i[1] if i else v for _, v, i in done], dtype=float)
        history.traces.append(
            Trace(
                "errorbar",
                numbers,
                values,
                "complete (95% interval)",
                marker="circle",
                low=low,
                high=high,
                connect=False,
                opacity=0.8,
            )
        )
        best = np.minimum.accumulate(values) if minimize else np.maximum.accumulate(values)
        history.traces.append(
            Trace("step", numbers, best, f"best so far ({'lowest' if minimize else 'highest'})", color=PALETTE[3])
        )
    if pruned:
        history.traces.append(
            Trace(
                "line",
                np.array([n for n, _ in pruned], dtype=float),
                np.array([v for _, v in pruned], dtype=float),
                "pruned (last reported value)",
                color="#808080",
                width=0,
                marker="x",
            )
        )
    importance = Panel("parameter importances (PED-ANOVA, normalised)", "parameter", "importance", droppable=False)
    if study.importances:
        names = list(study.importances)[::-1]
        importance.traces.append(
            Trace("barh", np.array([study.importances[n] for n in names], dtype=float), names, None, color=PALETTE[2])
        )
    else:
        importance.placeholder = study.importance_note or "no importances"
    caption = (
        f"Each complete trial's objective ({study.metric}, {study.direction}) with its 95% interval (the evaluation's own, "
        "or the paired bootstrap of the change from step 0), pruned trials at their last reported value, and the best "
        "value so far. The best is selected on these positions: re-measure it on unseen ones "
        "(chessgrpo sweep --summary STUDY --remeasure). Importances: how much of the objective's variation over the "
        "complete trials each parameter explains."
    )
    return ReportFigure(
        "study",
        f"Sweep {study.name}: optimisation history and parameter importances",
        caption,
        f"Sweep {study.name}",
        [history, importance],
    )
