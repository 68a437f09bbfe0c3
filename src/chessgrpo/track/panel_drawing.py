"""One report panel (`track.figure_panels.Panel`) drawn by either backend: on matplotlib axes (the static PNG;
legend below the axes, integer ticks at evaluation steps, room for the bounds' arrows) or as one interactive plotly
figure (legend below the axes, NaN drawn as a gap). Both read the same panel, so the two reports show the same
data with the same labels."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from chessgrpo.track.figure_panels import Panel

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


def legend_rows(panel: Panel, per_row: int) -> int:
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


def draw_matplotlib_panel(ax, panel: Panel) -> None:
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
    return 340 + 20 * legend_rows(panel, 2)


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
