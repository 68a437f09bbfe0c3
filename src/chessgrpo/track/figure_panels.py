"""The backend-neutral description of a report panel: its drawn elements (`Trace`: lines, bands, error bars,
stacks, bounds, bars), reference lines and zones (`Reference`), the panel with its axes and legend (`Panel`), and
a panel left out as constant (`DroppedPanel`). `track.figures.ReportFigure` holds the panels of one figure;
`track.panel_drawing` draws one with matplotlib or plotly."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

STEP_LABEL = "training step"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""Matplotlib's tab10, as hex for both backends: colour i is the i-th run (or metric with one run)."""


@dataclasses.dataclass
class Trace:
    """One drawn element of a panel."""

    kind: str
    """line | band (filled between low and high) | errorbar (points with low/high) | stack (stacked area, in order)
    | step (post-step line) | barh (horizontal bars: x = lengths, y = names) | bound (one-sided bounds: a bar at each
    y with an arrow towards `direction`, "up" for a lower bound, "down" for an upper one)."""
    x: Any
    y: Any
    label: str | None = None
    """Legend entry; None = not in the legend."""
    color: str = PALETTE[0]
    dash: str = "solid"
    width: float = 1.5
    opacity: float = 1.0
    marker: str | None = None
    """None, or one of circle, dot, x, triangle-up, triangle-down, square, diamond."""
    low: Any = None
    high: Any = None
    connect: bool = True
    """errorbar: join the points with a line (False: points only)."""
    group: str | None = None
    """Legend group (the run with several runs): the interactive legend toggles a run's traces together."""
    size: float | None = None
    """Marker size in points (None: the default)."""
    direction: str = "up"
    """bound: the open side of the bound ("up": the value is at least y; "down": at most y)."""


@dataclasses.dataclass
class Reference:
    """A horizontal reference line (y) or band (y to y1) across the panel."""

    y: float
    label: str | None = None
    color: str = "black"
    dash: str = "dash"
    width: float = 0.8
    y1: float | None = None
    opacity: float = 1.0


@dataclasses.dataclass
class Panel:
    """One set of axes."""

    title: str
    ylabel: str = ""
    xlabel: str = STEP_LABEL
    traces: list[Trace] = dataclasses.field(default_factory=list)
    references: list[Reference] = dataclasses.field(default_factory=list)
    sources: list[tuple[str, np.ndarray]] = dataclasses.field(default_factory=list)
    """(series label, raw values) of the data drawn: what the constant check looks at."""
    ylog: bool = False
    ylim: tuple[float | None, float | None] | None = None
    note: str | None = None
    """A second line under the title (the held-out paired difference): kept off the data."""
    placeholder: str | None = None
    """Text shown instead of axes (nothing to draw)."""
    xticks: tuple[list[float], list[str]] | None = None
    """Tick positions and labels (categorical x, e.g. the anchors of one games evaluation)."""
    integer_x: bool = False
    min_yspan: float | None = None
    """The y axis spans at least this much (a lone point or bound would otherwise get an absurdly zoomed axis)."""
    droppable: bool = True
    """Whether the panel is left out when every series in it is constant (evaluation panels: no)."""

    def line(self, x, y, label=None, *, source: str | None = None, **style) -> None:
        self.traces.append(Trace("line", np.asarray(x), np.asarray(y), label, **style))
        if source is not None:
            self.sources.append((source, np.asarray(y, dtype=float)))

    def band(self, x, low, high, label=None, *, color: str, opacity: float = 0.2, group: str | None = None) -> None:
        self.traces.append(
            Trace(
                "band",
                np.asarray(x),
                None,
                label,
                color=color,
                opacity=opacity,
                low=np.asarray(low),
                high=np.asarray(high),
                group=group,
            )
        )

    def hline(self, y: float, label: str | None = None, **style) -> None:
        self.references.append(Reference(float(y), label, **style))

    @property
    def has_data(self) -> bool:
        return bool(self.traces) or self.placeholder is not None

    def legend_entries(self) -> int:
        return sum(t.label is not None for t in self.traces) + sum(r.label is not None for r in self.references)


@dataclasses.dataclass(frozen=True)
class DroppedPanel:
    """A panel left out because every series in it was constant."""

    figure: str
    panel: str
    values: tuple[tuple[str, float], ...]
    """(series label, its constant value)."""

    def describe(self) -> str:
        values = ", ".join(f"{label} = {value:.6g}" for label, value in self.values)
        return f"{self.figure} / {self.panel}: {values}"
