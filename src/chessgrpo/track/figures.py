"""The backend-neutral description of a report figure, and its two drawings (plotly and matplotlib).

A figure function (`chessgrpo.track.plots`) builds a `ReportFigure`: its panels (`Panel`) of lines,
bands, error bars, stacks and reference lines (`Trace`, `Reference`). `ReportFigure` draws it either
as interactive plotly figures (one per panel, `ReportFigure.plotly`) or as one static matplotlib
figure (`ReportFigure.figure`, the PNG). Both drawings come from the same spec, so the interactive
report and the static fallback show the same data with the same labels; each panel's legend is
placed below its axes, outside the data.

No pyplot: static figures are `matplotlib.figure.Figure` objects drawn by the Agg canvas, so
nothing global is touched and no display is needed. plotly is imported only to draw the
interactive panels (`plotly_available` says whether it can be).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

STEP_LABEL = "training step"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""Matplotlib's tab10, as hex for both backends: colour i is the i-th run (or metric with one run)."""
_MPL_DASH: dict[str, Any] = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-.", "longdash": (0, (5, 2))}
_MPL_MARKER = {
    "circle": "o",
    "dot": ".",
    "x": "x",
    "triangle-up": "^",
    "triangle-down": "v",
    "square": "s",
    "diamond": "D",
}
_PLOTLY_MARKER = {
    "circle": "circle",
    "dot": "circle",
    "x": "x",
    "triangle-up": "triangle-up",
    "triangle-down": "triangle-down",
    "square": "square",
    "diamond": "diamond",
}


def plotly_available() -> bool:
    """Whether plotly can be imported (the interactive report needs it; the static one does not)."""
    try:
        import plotly.graph_objects  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------------------
# The backend-neutral figure description


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


@dataclasses.dataclass
class ReportFigure:
    """A figure of the report: its panels and what the report says about it; drawn on demand by either backend."""

    name: str
    """File stem of the PNG and id of the section (``reward`` -> reward.png)."""
    title: str
    caption: str
    heading: str
    """The figure's own title (the static figure's suptitle)."""
    panels: list[Panel]
    columns: int = 2
    width: float = 11.0
    panel_height: float = 3.6
    dropped: list[DroppedPanel] = dataclasses.field(default_factory=list)
    """Panels of this figure left out as constant."""

    @functools.cached_property
    def figure(self) -> Figure:
        """The static matplotlib drawing (all panels in one figure)."""
        return render_matplotlib(self)

    def png(self, dpi: int = 100) -> bytes:
        from io import BytesIO

        buffer = BytesIO()
        FigureCanvasAgg(self.figure)
        self.figure.savefig(buffer, format="png", dpi=dpi)
        return buffer.getvalue()

    def plotly(self) -> list[Any]:
        """One interactive plotly figure per panel (needs plotly)."""
        return [render_plotly_panel(panel) for panel in self.panels]


# ------------------------------------------------------------------------------------------------
# Static drawing (matplotlib)


def _legend_rows(panel: Panel, per_row: int) -> int:
    return math.ceil(panel.legend_entries() / per_row) if panel.legend_entries() else 0


def integer_ticks(panel: Panel, most: int = 12) -> list[float] | None:
    """The distinct integer x values of an integer-x panel (its evaluation steps) when there are at most `most`:
    ticks at exactly those steps, never a repeated label ("400 400 400") from a narrow automatic range."""
    if not panel.integer_x:
        return None
    xs = {
        round(float(v))
        for t in panel.traces
        if t.kind != "barh"
        for v in np.asarray(t.x, dtype=float).ravel()
        if math.isfinite(v)
    }
    return sorted(float(v) for v in xs) if 0 < len(xs) <= most else None


def y_range(panel: Panel) -> tuple[float, float] | None:
    """The y range a panel needs beyond autoscaling: at least `min_yspan` wide, with room for the bounds' arrows.
    None when autoscaling does (no minimum span hit and no bound drawn) or the panel has its own ylim/log scale."""
    if panel.ylim is not None or panel.ylog:
        return None
    ys = [
        float(v)
        for t in panel.traces
        if t.kind != "barh"
        for arr in (t.y, t.low, t.high)
        if arr is not None
        for v in np.asarray(arr, dtype=float).ravel()
        if math.isfinite(v)
    ]
    ys += [r.y for r in panel.references] + [r.y1 for r in panel.references if r.y1 is not None]
    bounds = [t for t in panel.traces if t.kind == "bound"]
    if not ys or (not bounds and (panel.min_yspan is None or max(ys) - min(ys) >= panel.min_yspan)):
        return None
    low, high = min(ys), max(ys)
    span = max(high - low, panel.min_yspan or 0.0, 1e-9)
    middle = (low + high) / 2
    low, high = min(low, middle - span / 2), max(high, middle + span / 2)
    up, down = any(t.direction == "up" for t in bounds), any(t.direction == "down" for t in bounds)
    return low - (0.25 if down else 0.08) * span, high + (0.25 if up else 0.08) * span


def render_matplotlib(spec: ReportFigure) -> Figure:
    """All panels of `spec` in one matplotlib figure; each panel's legend below its axes (outside the data)."""
    from matplotlib.transforms import ScaledTranslation

    panels = spec.panels
    columns = max(1, min(spec.columns, len(panels)))
    rows = math.ceil(len(panels) / columns)
    per_row = 2 if columns == 1 else 1
    legend_lines = [
        max((_legend_rows(p, per_row) for p in panels[i : i + columns]), default=0)
        for i in range(0, len(panels), columns)
    ]
    height = sum(spec.panel_height + 0.17 * lines for lines in legend_lines)
    figure = Figure(figsize=(spec.width, height), layout="constrained")
    grid = figure.add_gridspec(
        rows, columns, height_ratios=[spec.panel_height + 0.17 * lines for lines in legend_lines]
    )
    for index, panel in enumerate(panels):
        ax = figure.add_subplot(grid[index // columns, index % columns])
        _draw_panel(ax, panel)
        if panel.placeholder is None and panel.legend_entries():
            below = ax.transAxes + ScaledTranslation(
                0, -0.5, figure.dpi_scale_trans
            )  # under the tick labels and x label
            ax.legend(
                loc="upper center",
                bbox_to_anchor=(0.5, 0),
                bbox_transform=below,
                fontsize=7,
                ncol=per_row,
                frameon=False,
            )
    figure.suptitle(spec.heading)
    return figure


def _draw_panel(ax, panel: Panel) -> None:
    if panel.placeholder is not None and not panel.traces:
        ax.text(0.5, 0.5, panel.placeholder, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        ax.set_title(panel.title, fontsize=10)
        return
    stacks = [t for t in panel.traces if t.kind == "stack"]
    if stacks:
        ax.stackplot(
            stacks[0].x,
            [t.y for t in stacks],
            labels=[t.label for t in stacks],
            colors=[t.color for t in stacks],
            alpha=stacks[0].opacity,
        )
    for trace in panel.traces:
        common = {"color": trace.color, "label": trace.label}
        if trace.kind == "line":
            ax.plot(
                trace.x,
                trace.y,
                linestyle=_MPL_DASH[trace.dash] if trace.width > 0 else "none",
                linewidth=trace.width or None,
                alpha=trace.opacity,
                marker=_MPL_MARKER.get(trace.marker or "", None),
                markersize=trace.size,
                zorder=3,
                **common,
            )
        elif trace.kind == "band":
            ax.fill_between(trace.x, trace.low, trace.high, alpha=trace.opacity, linewidth=0, **common)
        elif trace.kind == "errorbar":
            low, high = np.asarray(trace.low, dtype=float), np.asarray(trace.high, dtype=float)
            y = np.asarray(trace.y, dtype=float)
            yerr = [np.where(np.isfinite(low), y - low, 0.0), np.where(np.isfinite(high), high - y, 0.0)]
            ax.errorbar(
                trace.x,
                y,
                yerr=yerr,
                marker=_MPL_MARKER.get(trace.marker or "circle", "o"),
                capsize=4,
                alpha=trace.opacity,
                linestyle=_MPL_DASH[trace.dash] if trace.connect else "none",
                **common,
            )
        elif trace.kind == "step":
            ax.step(trace.x, trace.y, where="post", linewidth=trace.width, **common)
        elif trace.kind == "barh":
            ax.barh(trace.y, trace.x, color=trace.color)
        elif trace.kind == "bound":  # a bar at the bound, an arrow towards the open side and the bound in words
            up = trace.direction == "up"
            ax.plot(
                trace.x, trace.y, linestyle="none", marker="_", markersize=14, markeredgewidth=2.5, zorder=3, **common
            )
            for x, y in zip(np.asarray(trace.x, dtype=float), np.asarray(trace.y, dtype=float)):
                ax.annotate(
                    "",
                    xy=(x, y),
                    xytext=(0, 26 if up else -26),
                    textcoords="offset points",
                    arrowprops={"arrowstyle": "<-", "color": trace.color, "lw": 1.5},
                )
                ax.annotate(
                    f"{'>=' if up else '<='} {y:+.0f}",
                    xy=(x, y),
                    xytext=(8, 3 if up else -11),
                    textcoords="offset points",
                    fontsize=7,
                    color=trace.color,
                )
    for ref in panel.references:
        if ref.y1 is not None:
            ax.axhspan(ref.y, ref.y1, color=ref.color, alpha=ref.opacity, label=ref.label)
        else:
            ax.axhline(ref.y, color=ref.color, linestyle=_MPL_DASH[ref.dash], linewidth=ref.width, label=ref.label)
    if panel.ylog:
        ax.set_yscale("log")
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    if panel.xticks is not None:
        ax.set_xticks(panel.xticks[0], panel.xticks[1], fontsize=8)
        ax.set_xlim(min(panel.xticks[0]) - 0.5, max(panel.xticks[0]) + 0.5)
    elif integer_ticks(panel) is not None:
        ax.set_xticks(integer_ticks(panel))
    elif panel.integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    needed = y_range(panel)
    if needed is not None:
        ax.set_ylim(*needed)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title + (f"\n{panel.note}" if panel.note else ""), fontsize=10)
    ax.grid(alpha=0.3)


# ------------------------------------------------------------------------------------------------
# Interactive drawing (plotly)


def _rgba(color: str, opacity: float) -> str:
    color = color.lstrip("#")
    red, green, blue = (int(color[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({red},{green},{blue},{opacity:g})"


def _list(values: Any) -> list:
    """JSON-ready values: NaN -> None (a gap), numpy scalars -> Python numbers."""
    out = []
    for value in np.asarray(values).tolist() if not isinstance(values, list) else values:
        out.append(None if isinstance(value, float) and not math.isfinite(value) else value)
    return out


def panel_height_px(panel: Panel) -> int:
    """Pixel height of an interactive panel: the plot plus its legend rows below."""
    return 340 + 20 * _legend_rows(panel, 2)


def render_plotly_panel(panel: Panel) -> Any:
    """One panel as a plotly figure, legend below the axes (outside the data); its title is left to the page."""
    import plotly.graph_objects as go

    figure = go.Figure()
    xs: list[float] = []
    for trace in panel.traces:
        if trace.kind != "barh":
            xs += [float(v) for v in np.asarray(trace.x, dtype=float).ravel() if math.isfinite(v)]
        legend = {
            "name": trace.label or "",
            "showlegend": trace.label is not None,
            "legendgroup": trace.group or trace.label,
        }
        if trace.kind == "line":
            mode = ("lines" if trace.width > 0 else "") + (
                "+markers" if trace.marker and trace.width > 0 else "markers" if trace.marker else ""
            )
            figure.add_trace(
                go.Scatter(
                    x=_list(trace.x),
                    y=_list(trace.y),
                    mode=mode,
                    opacity=trace.opacity,
                    line={"color": trace.color, "dash": trace.dash, "width": trace.width or 1},
                    marker={
                        "color": trace.color,
                        "symbol": _PLOTLY_MARKER.get(trace.marker or "", "circle"),
                        "size": trace.size or (5 if trace.marker == "dot" else 9),
                    },
                    hoverinfo="skip" if trace.label is None and trace.opacity < 0.5 else None,
                    **legend,
                )
            )
        elif trace.kind == "band":
            x = np.asarray(trace.x, dtype=float)
            figure.add_trace(
                go.Scatter(
                    x=_list(np.concatenate([x, x[::-1]])),
                    y=_list(
                        np.concatenate([np.asarray(trace.high, dtype=float), np.asarray(trace.low, dtype=float)[::-1]])
                    ),
                    fill="toself",
                    fillcolor=_rgba(trace.color, trace.opacity),
                    line={"width": 0},
                    mode="lines",
                    hoverinfo="skip",
                    **legend,
                )
            )
        elif trace.kind == "errorbar":
            y = np.asarray(trace.y, dtype=float)
            low, high = np.asarray(trace.low, dtype=float), np.asarray(trace.high, dtype=float)
            error = {
                "type": "data",
                "symmetric": False,
                "array": _list(np.where(np.isfinite(high), high - y, np.nan)),
                "arrayminus": _list(np.where(np.isfinite(low), y - low, np.nan)),
                "color": trace.color,
                "width": 4,
            }
            text = [
                f"{v:.4g} [{lo:.4g}, {hi:.4g}]" if math.isfinite(lo) and math.isfinite(hi) else f"{v:.4g}"
                for v, lo, hi in zip(y, low, high)
            ]
            figure.add_trace(
                go.Scatter(
                    x=_list(trace.x),
                    y=_list(y),
                    error_y=error,
                    mode="lines+markers" if trace.connect else "markers",
                    line={"color": trace.color, "dash": trace.dash},
                    opacity=trace.opacity,
                    marker={
                        "color": trace.color,
                        "symbol": _PLOTLY_MARKER.get(trace.marker or "circle", "circle"),
                        "size": 8,
                    },
                    text=text,
                    hovertemplate="%{x}: %{text}<extra>" + (trace.label or "") + "</extra>",
                    **legend,
                )
            )
        elif trace.kind == "stack":
            figure.add_trace(
                go.Scatter(
                    x=_list(trace.x),
                    y=_list(trace.y),
                    stackgroup="stack",
                    mode="lines",
                    line={"color": trace.color, "width": 0.5},
                    fillcolor=_rgba(trace.color, trace.opacity),
                    **legend,
                )
            )
        elif trace.kind == "step":
            figure.add_trace(
                go.Scatter(
                    x=_list(trace.x),
                    y=_list(trace.y),
                    mode="lines",
                    line={"color": trace.color, "shape": "hv"},
                    **legend,
                )
            )
        elif trace.kind == "barh":
            figure.add_trace(
                go.Bar(
                    x=_list(trace.x), y=list(trace.y), orientation="h", marker={"color": trace.color}, showlegend=False
                )
            )
        elif trace.kind == "bound":  # a bar at the bound with its value, an arrow (fixed pixels) towards the open side
            up = trace.direction == "up"
            sign = ">=" if up else "<="
            text = [f"{sign} {v:+.0f}" for v in np.asarray(trace.y, dtype=float)]
            figure.add_trace(
                go.Scatter(
                    x=_list(trace.x),
                    y=_list(trace.y),
                    mode="markers+text",
                    text=text,
                    textposition="middle right",
                    textfont={"color": trace.color, "size": 10},
                    marker={
                        "symbol": "line-ew-open",
                        "size": 18,
                        "color": trace.color,
                        "line": {"width": 3, "color": trace.color},
                    },
                    hovertemplate="%{x}: %{text}<extra>" + (trace.label or "") + "</extra>",
                    **legend,
                )
            )
            for x, y in zip(_list(trace.x), _list(trace.y)):
                figure.add_annotation(
                    x=x,
                    y=y,
                    ax=0,
                    ay=-38 if up else 38,
                    showarrow=True,
                    arrowside="start",
                    arrowhead=2,
                    arrowwidth=1.6,
                    arrowcolor=trace.color,
                    text="",
                )
    if panel.xticks is not None:
        xs += [min(panel.xticks[0]) - 0.5, max(panel.xticks[0]) + 0.5]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    for ref in panel.references:  # drawn as traces across the data's x range, so they have legend entries
        legend = {"name": ref.label or "", "showlegend": ref.label is not None, "hoverinfo": "skip"}
        if ref.y1 is not None:
            figure.add_trace(
                go.Scatter(
                    x=[x0, x1, x1, x0],
                    y=[ref.y, ref.y, ref.y1, ref.y1],
                    fill="toself",
                    mode="lines",
                    fillcolor=_rgba(ref.color if ref.color.startswith("#") else "#000000", max(ref.opacity, 0.08)),
                    line={"width": 0},
                    **legend,
                )
            )
        else:
            color = ref.color if ref.color != "black" else "#000000"
            figure.add_trace(
                go.Scatter(
                    x=[x0, x1],
                    y=[ref.y, ref.y],
                    mode="lines",
                    line={"color": color, "dash": ref.dash, "width": max(ref.width, 1)},
                    **legend,
                )
            )
    xaxis: dict[str, Any] = {"title": {"text": panel.xlabel}, "zeroline": False}
    yaxis: dict[str, Any] = {"title": {"text": panel.ylabel}, "zeroline": False}
    if panel.xticks is not None:
        xaxis.update(tickmode="array", tickvals=panel.xticks[0], ticktext=panel.xticks[1], range=[x0, x1])
    elif integer_ticks(panel) is not None:
        xaxis.update(tickmode="array", tickvals=integer_ticks(panel), tickformat="d")
    elif panel.integer_x:
        xaxis.update(tickformat="d")
    needed = y_range(panel)
    if needed is not None:
        yaxis["range"] = list(needed)
    if panel.ylog:
        yaxis["type"] = "log"
    if panel.ylim is not None:
        low, high = panel.ylim
        if low is None or high is None:
            ys = [
                float(v)
                for t in panel.traces
                for arr in (t.y, t.high)
                if arr is not None and t.kind != "barh"
                for v in np.asarray(arr, dtype=float).ravel()
                if math.isfinite(v)
            ]
            top = max(ys, default=1.0)
            bottom = min(ys, default=0.0)
            low = bottom - 0.05 * abs(top - bottom) if low is None else low
            high = top + 0.05 * abs(top - (low or 0.0)) if high is None else high
        yaxis["range"] = [low, high]
    if panel.placeholder is not None and not panel.traces:
        figure.add_annotation(text=panel.placeholder, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
        xaxis["visible"] = yaxis["visible"] = False
    figure.update_layout(  # no plotly title: the report writes the panel's title (and note) above the chart, clear of the toolbar
        xaxis=xaxis,
        yaxis=yaxis,
        template="plotly_white",
        height=panel_height_px(panel),
        margin={"l": 60, "r": 15, "t": 28, "b": 10},
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "x": 0,
            "xanchor": "left",
            "font": {"size": 10},
            "groupclick": "togglegroup",
        },
        hovermode="closest",
    )
    return figure
