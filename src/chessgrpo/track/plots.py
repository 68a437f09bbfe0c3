"""The report's figures: one function per figure, over one or several runs, and which figures a report gets.

Each figure function builds a backend-neutral `ReportFigure` (`chessgrpo.track.figures`: panels of
lines, bands, error bars, stacks and reference lines), which draws itself with plotly or
matplotlib.

The figures themselves are in `track.plots_training` (the training steps) and `track.plots_evaluation`
(held-out metrics and games), drawn with `track.plot_series`; this module lists them (`FIGURES`), plans a
report's figures and draws a sweep's study.

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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from chessgrpo.track.figure_panels import PALETTE, DroppedPanel, Panel, Trace
from chessgrpo.track.figures import ReportFigure
from chessgrpo.track.plot_series import is_constant
from chessgrpo.track.plots_evaluation import figure_games, figure_heldout
from chessgrpo.track.plots_training import (
    figure_clip,
    figure_entropy,
    figure_kl,
    figure_loss,
    figure_optimizer,
    figure_pretraining,
    figure_ratio,
    figure_reward,
    figure_signal,
    figure_throughput,
)
from chessgrpo.track.run_data import RunData

if TYPE_CHECKING:
    from chessgrpo.sweep.summary import StudyPlotData


@dataclasses.dataclass
class FigurePlan:
    figures: list[ReportFigure]
    dropped: list[DroppedPanel]
    """Every panel left out as constant (figures with no panel left are not in `figures`)."""


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
