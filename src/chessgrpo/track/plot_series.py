"""How one metric's series is drawn on a report panel (`track.figure_panels.Panel`): the colour and dash of each run and
metric, the legend groups, the finite values of a series, and the smoothing of noisy per-step metrics.

Per-step training metrics are noisy (every step draws fresh positions), so long series are drawn
twice: the raw values thin and pale, and a centred moving average over ``w`` steps (w = n/25,
at least 5) with its 95% band ``mean +- 1.96 sd / sqrt(w)`` from the spread inside the window.
Short series (< 10 steps) are drawn raw. With several runs, colour is the run and line style the metric;
with one run, colour is the metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from chessgrpo.track.figure_panels import PALETTE, Panel, Trace
from chessgrpo.track.run_data import RunData

Z95 = 1.959964
DASHES = ("solid", "dash", "dot", "dashdot")


def line_style(run_index: int, metric_index: int, n_runs: int) -> dict:
    if n_runs == 1:
        return {"color": PALETTE[metric_index % 10], "dash": "solid"}
    return {"color": PALETTE[run_index % 10], "dash": DASHES[metric_index % len(DASHES)]}


def legend_group(run: RunData, n_runs: int) -> str | None:
    return run.name if n_runs > 1 else None


def series_label(run: RunData, metric: str, n_runs: int) -> str:
    return metric if n_runs == 1 else f"{run.name}: {metric}"


def finite_series(run: RunData, key: str, train_only: bool = True) -> tuple[np.ndarray, np.ndarray]:
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


def plot_smoothed(
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


def any_logged(runs: Sequence[RunData], *keys: str) -> bool:
    return any(run.has(key) for run in runs for key in keys)


def plot_metrics(
    panel: Panel, runs: Sequence[RunData], keys: Sequence[str], *, band: bool = True, raw: bool = False
) -> bool:
    """Each run's `keys` on `panel`: smoothed with a band (noisy per-step metrics) or raw (schedules, controller outputs)."""
    drawn = False
    for r, run in enumerate(runs):
        for m, key in enumerate(keys):
            steps, values = finite_series(run, key)
            if not len(values):
                continue
            label = series_label(run, key, len(runs))
            if raw:
                panel.line(
                    steps,
                    values,
                    label,
                    source=label,
                    group=legend_group(run, len(runs)),
                    **line_style(r, m, len(runs)),
                )
            else:
                plot_smoothed(
                    panel,
                    steps,
                    values,
                    label,
                    line_style(r, m, len(runs)),
                    band=band,
                    group=legend_group(run, len(runs)),
                )
            drawn = True
    return drawn


def plot_trend(panel: Panel, steps: np.ndarray, values: np.ndarray, style: dict, group: str | None = None) -> None:
    """The least-squares line the diagnosis tests, labelled with its change over the run and 95% interval."""
    from chessgrpo.track.diagnose.changes import linear_trend

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


def plot_stacked(panel: Panel, runs: Sequence[RunData], keys: Sequence[str], labels: Sequence[str]) -> None:
    """One run: the moving averages of `keys` stacked; several runs: each key as a line per run (shared axes)."""
    if len(runs) == 1:
        series = [finite_series(runs[0], key) for key in keys]
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
        plot_metrics(panel, runs, keys, band=False)
