"""The backend-neutral description of a report figure, and its two drawings (plotly and matplotlib).

A figure function (`chessgrpo.track.plots`) builds a `ReportFigure`: its panels (`Panel`) of lines,
bands, error bars, stacks and reference lines (`Trace`, `Reference`). `ReportFigure` draws it either
as interactive plotly figures (one per panel, `ReportFigure.plotly`) or as one static matplotlib
figure (`ReportFigure.figure`, the PNG). Both drawings come from the same spec, so the interactive
report and the static fallback show the same data with the same labels; each panel's legend is
placed below its axes, outside the data.

The panels are described in `track.figure_panels` and drawn one by one in `track.panel_drawing`; this
module holds the figure (`ReportFigure`) and lays its panels out in one static figure.

No pyplot: static figures are `matplotlib.figure.Figure` objects drawn by the Agg canvas, so
nothing global is touched and no display is needed. plotly is imported only to draw the
interactive panels (`plotly_available` says whether it can be).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chessgrpo.track.figure_panels import DroppedPanel, Panel
from chessgrpo.track.panel_drawing import draw_matplotlib_panel, legend_rows, render_plotly_panel


def plotly_available() -> bool:
    """Whether plotly can be imported (the interactive report needs it; the static one does not)."""
    try:
        import plotly.graph_objects  # noqa: F401
    except ImportError:
        return False
    return True


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


def render_matplotlib(spec: ReportFigure) -> Figure:
    """All panels of `spec` in one matplotlib figure; each panel's legend below its axes (outside the data)."""
    from matplotlib.transforms import ScaledTranslation

    panels = spec.panels
    columns = max(1, min(spec.columns, len(panels)))
    rows = math.ceil(len(panels) / columns)
    per_row = 2 if columns == 1 else 1
    legend_lines = [
        max((legend_rows(p, per_row) for p in panels[i : i + columns]), default=0)
        for i in range(0, len(panels), columns)
    ]
    height = sum(spec.panel_height + 0.17 * lines for lines in legend_lines)
    figure = Figure(figsize=(spec.width, height), layout="constrained")
    grid = figure.add_gridspec(
        rows, columns, height_ratios=[spec.panel_height + 0.17 * lines for lines in legend_lines]
    )
    for index, panel in enumerate(panels):
        ax = figure.add_subplot(grid[index // columns, index % columns])
        draw_matplotlib_panel(ax, panel)
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
