"""`build_report`: one self-contained HTML file (interactive plotly figures, or embedded PNGs) plus the PNGs.

Sections, in order: the verdict (`track.report_verdict`: did the run get stronger than its start, by
how much, against which opponents, with intervals and links to the games' PGN), the diagnosis
(`track.diagnose`), game strength (``eval games`` summaries in ``eval/``: W/D/L, score and Elo per
anchor with intervals, over steps), the evaluation tables (``eval/step_*.json`` or the eval rows, and
any standalone ``eval offline|puzzles`` result in ``eval/``), the figures (`track.plots`, drawn by
`track.figures`), the runs (kind, steps, status), their metadata (git commit, package versions,
hardware, wall time: what the run directory records, and what generated the report), and the
configuration: the model as saved with its weights beside config.yaml's model section, and the whole
resolved config for one run, the differences between the runs when several are compared. Every
table scrolls inside its section when it is wider. Several runs share the axes of every figure.

Interactive or static: with plotly installed the figures are interactive plotly charts (zoom,
hover, a legend that toggles a run) and plotly.js is embedded once in the HTML, so the file opens
offline; without plotly, with ``interactive=False`` (``chessgrpo report --static``) or with the
environment variable ``CHESSGRPO_REPORT_STATIC=1``, the figures are the matplotlib PNGs embedded
as base64. Panels whose every series is constant are left out and listed in one line.

A sweep's study directory (``chessgrpo sweep``) adds the optimisation history and the parameter
importances (`track.plots.figure_study`) and stands for its default and best trials' runs.

The sections are built by `track.report_sections` (verdict, diagnosis, games, evaluation) and
`track.report_provenance` (runs, metadata, configuration); this module loads the runs, draws the figures and
writes the file.

Where things go: ``chessgrpo report RUN_DIR`` writes ``RUN_DIR/report.html`` and the PNGs in
``RUN_DIR/report/``; ``--out DIR/NAME.html`` writes the PNGs to ``DIR/NAME/``. The HTML needs
none of the PNG files (everything is inline), so it can be mailed or archived alone.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chessgrpo.track.diagnose import diagnose
from chessgrpo.track.diagnose.findings import Finding
from chessgrpo.track.figure_panels import DroppedPanel
from chessgrpo.track.figures import ReportFigure, plotly_available
from chessgrpo.track.panel_drawing import panel_height_px
from chessgrpo.track.plots import figure_study, plan_figures
from chessgrpo.track.report_provenance import config_section, metadata_section, runs_section
from chessgrpo.track.report_sections import (
    escape,
    evaluation_section,
    findings_section,
    games_section,
    relative_path,
    verdict_section,
    wrap_tables,
)
from chessgrpo.track.report_verdict import Verdict, run_verdict
from chessgrpo.track.run_data import load_run

STATIC_ENV = "CHESSGRPO_REPORT_STATIC"
"""Set to 1 (or true/yes) to force the static report (embedded PNGs) even with plotly installed."""

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1250px; color: #222;
       padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
figure { margin: 1.2em 0 2em; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; margin-top: 0.3em; }
.sev { font-weight: bold; padding: 0.1em 0.4em; border-radius: 3px; color: white; font-size: 0.8em; }
.critical { background: #b00020; } .warning { background: #d97a00; } .info { background: #4a6fa5; }
.note { color: #555; font-size: 0.9em; } pre { background: #f8f8f8; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
details summary { cursor: pointer; color: #333; } nav a { margin-right: 1em; }
.panels { display: grid; gap: 0.8em; margin-top: 0.4em; } .cols-1 { grid-template-columns: minmax(0, 1fr); }
.cols-2 { grid-template-columns: repeat(2, minmax(0, 1fr)); } .cols-3 { grid-template-columns: repeat(3, minmax(0, 1fr)); }
.panel { border: 1px solid #eee; min-width: 0; } .panel-title { font-size: 0.95em; padding: 0.4em 0.6em 0; color: #222; } section.figure { margin: 1.2em 0 2.2em; }
td.unknown, span.unknown { color: #888; font-style: italic; }
.table-wrap { overflow-x: auto; max-width: 100%; } /* a wide table scrolls inside its section, never past the page */
td code, td .note { overflow-wrap: anywhere; }
.headline { font-size: 1.35em; font-weight: 600; padding: 0.5em 0.7em; border-left: 6px solid #888; background: #f6f6f6;
            margin: 0.4em 0 0.6em; }
.headline.stronger { border-color: #1a7f37; background: #eef8f0; } .headline.weaker { border-color: #b00020; background: #fcefef; }
.headline.no-change { border-color: #8a8a8a; } .headline.unmeasured { border-color: #d97a00; background: #fdf6ec; }
div.verdict ul { margin: 0.3em 0; padding-left: 1.4em; font-size: 0.92em; } .verdict li { margin: 0.15em 0; }
h2#verdict { margin-top: 0.8em; }
"""


@dataclasses.dataclass
class ReportResult:
    html: Path
    """The self-contained HTML file."""
    pngs: list[Path]
    """The figures as PNG files (the images of the static report; written beside the interactive one too)."""
    findings: dict[str, list[Finding]]
    """Run label -> its diagnosis."""
    interactive: bool = False
    """Whether the figures are interactive plotly charts (else embedded PNGs)."""
    figures: list[str] = dataclasses.field(default_factory=list)
    """Names of the figures in the report, in order."""
    dropped: list[DroppedPanel] = dataclasses.field(default_factory=list)
    """Panels left out because every series in them was constant."""
    verdicts: dict[str, Verdict] = dataclasses.field(default_factory=dict)
    """Run label -> the verdict the report opens with (`track.report_verdict`)."""


def default_output(run_dirs: Sequence[Path]) -> Path:
    """RUN_DIR/report.html for one run; <parent of the first>/compare_<names>.html for several."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0]) / "report.html"
    names = "_vs_".join(re.sub(r"[^A-Za-z0-9_.-]", "_", label) for label in _labels(run_dirs))[:100]
    return Path(run_dirs[0]).parent / f"compare_{names}.html"


def png_directory(out: Path) -> Path:
    """Where the PNGs of the report `out` go: the HTML's name without the suffix (report.html -> report/)."""
    directory = out.with_suffix("")
    return directory if directory != out else out.parent / (out.name + "_png")


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    names = [Path(d).name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{Path(d).parent.name}/{Path(d).name}" for d in run_dirs]


def interactive_default() -> bool:
    """Interactive when plotly is importable and CHESSGRPO_REPORT_STATIC is not set to 1/true/yes."""
    if os.environ.get(STATIC_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    return plotly_available()


def build_report(
    run_dirs: Sequence[str | Path],
    out: str | Path | None = None,
    *,
    dpi: int = 100,
    interactive: bool | None = None,
    pngs: bool = True,
) -> ReportResult:
    """Write the HTML report of one or several runs (and its PNGs); returns where they are.

    interactive: True = plotly charts (raises when plotly is missing), False = embedded PNGs,
    None = `interactive_default()`. pngs: also write the PNG files (always done for the static
    report, whose HTML embeds them).
    """
    if not run_dirs:
        raise ValueError("build_report needs at least one run directory")
    if interactive is None:
        interactive = interactive_default()
    elif interactive and not plotly_available():
        raise ImportError(
            "the interactive report needs plotly: pip install 'plotly>=5.20' (or build it static: --static)"
        )
    given = [Path(d) for d in run_dirs]
    paths, studies = _study_trials(given)
    runs = [load_run(p) for p in paths]
    for run, label in zip(runs, _labels(paths)):
        run.label = label
    out = Path(out) if out is not None else default_output(given if studies else paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    images = png_directory(out)
    write_pngs = pngs or not interactive
    if write_pngs:
        images.mkdir(parents=True, exist_ok=True)

    findings = {run.name: diagnose(run) for run in runs}
    verdicts = {run.name: run_verdict(run) for run in runs}
    plan = plan_figures(runs)
    figures = [figure_study(study) for study in studies] + plan.figures
    png_paths: list[Path] = []
    rendered: dict[str, str] = {}
    for figure in figures:
        path = images / f"{figure.name}.png"
        data = figure.png(dpi=dpi) if write_pngs else b""
        if write_pngs:
            path.write_bytes(data)
            png_paths.append(path)
        rendered[figure.name] = _figure_html(figure, data, path if write_pngs else None, out, interactive)

    title = "chessgrpo report: " + ", ".join([f"study {study.name}" for study in studies] + [run.name for run in runs])
    figure_parts = [html for name, html in rendered.items() if name != "games"]
    if plan.dropped:
        figure_parts.insert(
            0,
            '<p class=note id="dropped">Constant, not drawn: '
            + "; ".join(escape(d.describe()) for d in plan.dropped)
            + ".</p>",
        )
    # The verdict first (did it get stronger, against whom), then the warnings; where the run came from last.
    sections = [
        ("verdict", "Verdict: did it get stronger?", verdict_section(runs, verdicts, out.parent)),
        ("findings", "Diagnosis", wrap_tables(findings_section(runs, findings))),
        ("games", "Game strength", games_section(runs, rendered.get("games"), out.parent)),
        ("evaluation", "Evaluation", wrap_tables(evaluation_section(runs))),
        ("figures", "Figures", "\n".join(figure_parts) or "<p>No metrics to plot yet.</p>"),
        ("runs", "Runs", wrap_tables(runs_section(runs))),
        ("metadata", "Run metadata", wrap_tables(metadata_section(runs))),
        (
            "config",
            "Configuration" if len(runs) == 1 else "Configuration differences",
            wrap_tables(config_section(runs)),
        ),
    ]
    generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    body = "\n".join(
        f'<h2 id="{key}">{escape(name)}</h2>\n<div class="{key}">{content}</div>' for key, name, content in sections
    )
    nav = " ".join(f'<a href="#{key}">{escape(name)}</a>' for key, name, _ in sections)
    script = ""
    mode = "figures are embedded PNGs (static report)"
    if interactive:
        from plotly.offline import get_plotlyjs

        script = f'<script type="text/javascript">/* plotly.js, embedded once: the report needs no network */\n{get_plotlyjs()}</script>'
        mode = "figures are interactive (plotly: drag to zoom, double-click to reset, click a legend entry to hide it)"
    overlay = "; the runs share the axes of every panel (colour = run)" if len(runs) > 1 else ""
    document = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style>{script}</head><body>\n"
        f"<h1>{escape(title)}</h1><p class=note>generated {escape(generated)} by <code>chessgrpo report</code>; {mode}{overlay}; "
        "intervals are 95%; long per-step series are drawn raw (pale) and as a centred moving average with the 95% "
        "band of the window mean.</p>\n"
        f"<nav>{nav}</nav>\n{body}\n</body></html>\n"
    )
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(document, encoding="utf-8")
    tmp.replace(out)
    return ReportResult(out, png_paths, findings, interactive, [f.name for f in figures], plan.dropped, verdicts)


def _figure_html(figure: ReportFigure, png: bytes, path: Path | None, out: Path, interactive: bool) -> str:
    """One figure: its plotly panels in a grid (interactive) or its embedded PNG (static)."""
    where = f" <span class=note>(PNG: {escape(relative_path(path, out.parent))})</span>" if path is not None else ""
    if not interactive:
        encoded = base64.b64encode(png).decode("ascii")
        return (
            f'<figure id="fig-{figure.name}"><h3>{escape(figure.title)}</h3>'
            f'<img src="data:image/png;base64,{encoded}" alt="{escape(figure.title)}">'
            f"<figcaption>{escape(figure.caption)}{where}</figcaption></figure>"
        )
    divs = []
    for index, (panel, chart) in enumerate(zip(figure.panels, figure.plotly())):
        div = chart.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"plot-{figure.name}-{index}",
            default_width="100%",
            default_height=f"{panel_height_px(panel)}px",
            config={"displaylogo": False, "responsive": True},
        )
        note = f"<br><span class=note>{escape(panel.note)}</span>" if panel.note else ""
        divs.append(f'<div class="panel"><div class="panel-title">{escape(panel.title)}{note}</div>{div}</div>')
    columns = max(1, min(figure.columns, len(divs), 3))
    return (
        f'<section class="figure" id="fig-{figure.name}"><h3>{escape(figure.title)}</h3>'
        f'<div class="panels cols-{columns}">{"".join(divs)}</div>'
        f"<p class=note>{escape(figure.caption)}{where}</p></section>"
    )


def _study_trials(paths: Sequence[Path]) -> tuple[list[Path], list[Any]]:
    """Replace each sweep study directory among `paths` by its default and best trials' run directories.

    Returns (run directories, the studies' plot data); a study adds the optimisation-history and
    importance figure, and its two trials are compared like any two runs.
    """
    runs: list[Path] = []
    studies = []
    from chessgrpo.sweep.summary import is_study_directory, load_study, plot_data, summarize  # optuna only for a study

    for path in paths:
        if not is_study_directory(path):
            runs.append(path)
            continue

        summary = summarize(load_study(path))
        studies.append(plot_data(summary))
        for trial in (summary.default, summary.best):
            if trial is not None and trial.run_dir and Path(trial.run_dir).is_dir() and Path(trial.run_dir) not in runs:
                runs.append(Path(trial.run_dir))
    if not runs:
        raise ValueError(f"study {paths[0]} has no trial run directory on this machine yet")
    return runs, studies
