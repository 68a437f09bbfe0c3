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

Where things go: ``chessgrpo report RUN_DIR`` writes ``RUN_DIR/report.html`` and the PNGs in
``RUN_DIR/report/``; ``--out DIR/NAME.html`` writes the PNGs to ``DIR/NAME/``. The HTML needs
none of the PNG files (everything is inline), so it can be mailed or archived alone.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import html
import json
import math
import os
import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from chessgrpo.eval.registry import held_out_metrics, read_by_run_data
from chessgrpo.run_info import cpu_model, package_version, source_commit
from chessgrpo.track.diagnose import Finding, diagnose
from chessgrpo.track.figures import DroppedPanel, ReportFigure, panel_height_px, plotly_available
from chessgrpo.track.plots import figure_study, plan_figures
from chessgrpo.track.report_verdict import Verdict, pgn_href, run_verdict, verdict_html
from chessgrpo.track.run_data import GamesEvaluation, HeldOut, RunData, effective_model_config, load_run

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


ABSENT = "(absent)"
"""What `config_differences` reports for a key a run's config does not have."""


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
            + "; ".join(_e(d.describe()) for d in plan.dropped)
            + ".</p>",
        )
    # The verdict first (did it get stronger, against whom), then the warnings; where the run came from last.
    sections = [
        ("verdict", "Verdict: did it get stronger?", _verdict_html(runs, verdicts, out.parent)),
        ("findings", "Diagnosis", wrap_tables(_findings_html(runs, findings))),
        ("games", "Game strength", _games_html(runs, rendered.get("games"), out.parent)),
        ("evaluation", "Evaluation", wrap_tables(_evaluation_html(runs))),
        ("figures", "Figures", "\n".join(figure_parts) or "<p>No metrics to plot yet.</p>"),
        ("runs", "Runs", wrap_tables(_runs_table(runs))),
        ("metadata", "Run metadata", wrap_tables(_metadata_html(runs))),
        ("config", "Configuration" if len(runs) == 1 else "Configuration differences", wrap_tables(_config_html(runs))),
    ]
    generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    body = "\n".join(
        f'<h2 id="{key}">{_e(name)}</h2>\n<div class="{key}">{content}</div>' for key, name, content in sections
    )
    nav = " ".join(f'<a href="#{key}">{_e(name)}</a>' for key, name, _ in sections)
    script = ""
    mode = "figures are embedded PNGs (static report)"
    if interactive:
        from plotly.offline import get_plotlyjs

        script = f'<script type="text/javascript">/* plotly.js, embedded once: the report needs no network */\n{get_plotlyjs()}</script>'
        mode = "figures are interactive (plotly: drag to zoom, double-click to reset, click a legend entry to hide it)"
    overlay = "; the runs share the axes of every panel (colour = run)" if len(runs) > 1 else ""
    document = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style>{script}</head><body>\n"
        f"<h1>{_e(title)}</h1><p class=note>generated {_e(generated)} by <code>chessgrpo report</code>; {mode}{overlay}; "
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
    where = f" <span class=note>(PNG: {_e(_relative(path, out.parent))})</span>" if path is not None else ""
    if not interactive:
        encoded = base64.b64encode(png).decode("ascii")
        return (
            f'<figure id="fig-{figure.name}"><h3>{_e(figure.title)}</h3>'
            f'<img src="data:image/png;base64,{encoded}" alt="{_e(figure.title)}">'
            f"<figcaption>{_e(figure.caption)}{where}</figcaption></figure>"
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
        note = f"<br><span class=note>{_e(panel.note)}</span>" if panel.note else ""
        divs.append(f'<div class="panel"><div class="panel-title">{_e(panel.title)}{note}</div>{div}</div>')
    columns = max(1, min(figure.columns, len(divs), 3))
    return (
        f'<section class="figure" id="fig-{figure.name}"><h3>{_e(figure.title)}</h3>'
        f'<div class="panels cols-{columns}">{"".join(divs)}</div>'
        f"<p class=note>{_e(figure.caption)}{where}</p></section>"
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


# ------------------------------------------------------------------------------------------------
# Sections


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def wrap_tables(fragment: str) -> str:
    """Every <table> of an HTML fragment inside a ``table-wrap`` div: a table wider than its section scrolls there."""
    return re.sub(r"<table\b", '<div class="table-wrap"><table', fragment).replace("</table>", "</table></div>")


def _verdict_html(runs: Sequence[RunData], verdicts: dict[str, Verdict], base: Path) -> str:
    parts = []
    for run in runs:
        if len(runs) > 1:
            parts.append(f"<h3>{_e(run.name)}</h3>")
        parts.append(verdict_html(verdicts[run.name], base))
    parts.append(
        "<p class=note>Decided by the games against the run's start (its <code>init_checkpoint</code>): stronger or "
        "weaker when the 95% interval of the Elo difference excludes 0. The diagnosis below explains why; the "
        "game strength section has every evaluation.</p>"
    )
    return wrap_tables("\n".join(parts))


def _runs_table(runs: Sequence[RunData]) -> str:
    header = (
        "<table><tr><th>run</th><th>directory</th><th>kind</th><th>rows</th><th>steps logged</th><th>planned steps</th>"
        "<th>last row written</th></tr>"
    )
    lines = [header]
    for run in runs:
        steps = [row["step"] for row in run.rows]
        times = [row["time"] for row in run.rows if isinstance(row.get("time"), (int, float))]
        last = datetime.datetime.fromtimestamp(max(times)).astimezone().strftime("%Y-%m-%d %H:%M:%S") if times else "-"
        planned = run.setting("steps", "-")
        span = f"{steps[0]}-{steps[-1]}" if steps else "none yet"
        lines.append(
            f"<tr><td>{_e(run.name)}</td><td><code>{_e(run.path)}</code></td><td>{_e(run.kind)}</td>"
            f"<td class=num>{len(run.rows)}</td><td class=num>{_e(span)}</td><td class=num>{_e(planned)}</td>"
            f"<td>{_e(last)}</td></tr>"
        )
    lines.append("</table>")
    return "\n".join(lines)


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def duration_text(seconds: float) -> str:
    """1 h 02 min 03 s, 4 min 05 s, 6.2 s."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s"


def _info_value(run: RunData, *paths: str) -> Any:
    """The first present value among dotted paths into the run's metadata file, then its config."""
    for source in (run.info, run.config):
        for dotted in paths:
            node: Any = source
            for part in dotted.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node not in (None, "", {}, []):
                return node
    return None


def _started(run: RunData) -> float | None:
    value = _info_value(run, "started", "start_time", "time")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def run_metadata(run: RunData) -> dict[str, str | None]:
    """What the run directory records about the run: field -> text, None where nothing is recorded."""
    times = [row["time"] for row in run.rows if isinstance(row.get("time"), (int, float))]
    steps = [row["step"] for row in run.rows]
    config_kind = run.config.get("kind")
    kind = f"{config_kind} ({run.kind})" if config_kind and config_kind != run.kind else run.kind
    planned = run.setting("steps")
    logged = f"{min(steps)}-{max(steps)}" if steps else "none yet"
    meta: dict[str, str | None] = {
        "kind": kind,
        "steps": f"{logged} logged" + (f" of {planned} planned" if planned else ""),
    }
    started = _started(run)
    if times:
        first, last = min(times), max(times)
        if started is not None and started <= first:
            meta["wall time"] = f"{duration_text(last - started)} (run start to the last metrics row)"
        else:
            meta["wall time"] = (
                f"{duration_text(last - first)} between the first and last metrics rows (steps "
                f"{steps[0]}-{steps[-1]}; time before the first row not counted)"
            )
        meta["first / last metrics row"] = f"{_when(first)} / {_when(last)}"
    else:
        meta["wall time"] = None
        meta["first / last metrics row"] = None
    commit = _info_value(run, "git_commit", "git.commit", "commit", "run.git_commit", "meta.git_commit")
    if commit is None:
        commit = next(
            (row[k] for row in run.rows for k in ("git_commit", "meta/git_commit") if isinstance(row.get(k), str)), None
        )
    dirty = _info_value(run, "git_dirty", "git.dirty")
    meta["git commit"] = None if commit is None else f"{commit}{' (uncommitted changes)' if dirty is True else ''}"
    versions = _info_value(run, "versions", "packages")
    if isinstance(versions, dict):
        wanted = ["chessgrpo", "torch", "chess", "python-chess"]
        ordered = [k for k in wanted if k in versions] + sorted(k for k in versions if k not in wanted)
        meta["package versions"] = ", ".join(f"{'python-chess' if k == 'chess' else k} {versions[k]}" for k in ordered)
    else:
        meta["package versions"] = None
    python = _info_value(run, "python", "python_version")
    meta["python"] = str(python).split()[0] if python else None
    hardware = _info_value(run, "hardware")
    parts = []
    if isinstance(hardware, dict):
        cpu = hardware.get("cpu_model") or hardware.get("cpu")
        count = hardware.get("cpu_count")
        if cpu or count:
            parts.append(f"CPU {cpu or '?'}" + (f" x {count} cores" if count else ""))
        gpu = hardware.get("gpu") or hardware.get("gpus")
        if gpu:
            parts.append(f"GPU {', '.join(map(str, gpu)) if isinstance(gpu, list) else gpu}")
        if hardware.get("memory_gb"):
            parts.append(f"{hardware['memory_gb']} GB memory")
    host = _info_value(run, "hostname", "host")
    if host:
        parts.append(f"host {host}")
    meta["hardware"] = "; ".join(parts) or None
    device = run.setting("device")
    settings = [f"device {device}"] if device else []
    if run.setting("threads") is not None:
        settings.append(
            f"threads {run.setting('threads')}" + (" (0 = all cores)" if run.setting("threads") == 0 else "")
        )
    if run.setting("bf16") is not None:
        settings.append(f"bf16 {str(run.setting('bf16')).lower()}")
    if isinstance(run.setting("engine.processes"), int):
        settings.append(f"engine processes {run.setting('engine.processes')}")
    meta["device settings (config)"] = ", ".join(settings) or None
    meta["metadata file"] = str(run.info_path.name) if run.info_path is not None else None
    return meta


_UNKNOWN = {
    "git commit": "unknown (not recorded in the run directory)",
    "package versions": "not recorded in the run directory",
    "python": "not recorded",
    "hardware": "not recorded in the run directory (see the device settings)",
    "metadata file": "none (no run_info.json; the training loop does not write one yet)",
    "wall time": "unknown (no timed metrics row yet)",
    "first / last metrics row": "-",
    "device settings (config)": "-",
}


def report_environment() -> dict[str, str]:
    """The code and machine that generate the report (not necessarily the run's)."""
    versions = ", ".join(
        f"{label} {package_version(name)}"
        for label, name in (
            ("chessgrpo", "chessgrpo"),
            ("torch", "torch"),
            ("python-chess", "chess"),
            ("plotly", "plotly"),
            ("matplotlib", "matplotlib"),
        )
    )
    return {
        "chessgrpo source commit": source_commit(),
        "package versions": versions,
        "python": platform.python_version() + f" ({sys.implementation.name})",
        "hardware": f"CPU {cpu_model()} x {os.cpu_count() or '?'} cores; {platform.system()} {platform.release()}",
    }


def _metadata_html(runs: Sequence[RunData]) -> str:
    metas = [run_metadata(run) for run in runs]
    header = "".join(f"<th>{_e(run.name)}</th>" for run in runs)
    lines = [f"<table><tr><th>recorded for the run</th>{header}</tr>"]
    for field in metas[0]:
        cells = []
        for meta in metas:
            value = meta.get(field)
            cells.append(
                f"<td>{_e(value)}</td>"
                if value is not None
                else f"<td class=unknown>{_e(_UNKNOWN.get(field, 'unknown'))}</td>"
            )
        lines.append(f"<tr><td>{_e(field)}</td>{''.join(cells)}</tr>")
    lines.append("</table>")
    environment = report_environment()
    lines.append(
        "<table><tr><th>this report was generated with</th><th>(not necessarily the run's code or machine)</th></tr>"
    )
    lines += [f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in environment.items()]
    lines.append(
        "</table><p class=note>Git commit, versions and hardware of a run come from a metadata file in the run "
        "directory (run_info.json; docs/report.md gives its fields) or its config; the wall time from the "
        "metrics rows' timestamps.</p>"
    )
    return "\n".join(lines)


def _interval_text(held: HeldOut) -> str:
    if not math.isfinite(held.value):
        return "n/a"
    if held.has_interval:
        return f"{held.value:.3f} [{held.low:.3f}, {held.high:.3f}]"
    return f"{held.value:.3f}"


def _games_table(evaluations: Sequence[GamesEvaluation], base: Path) -> str:
    parts = [
        "<table><tr><th>step</th><th>file</th><th>anchor</th><th>rating</th><th>W / D / L</th>"
        "<th>score [95% Wilson]</th><th>Elo difference [95%]</th><th>ML Elo over rated anchors [95%]</th></tr>"
    ]
    for evaluation in evaluations:
        span = len(evaluation.anchors)
        step = "?" if evaluation.step is None else str(evaluation.step)
        elo = evaluation.elo.text(signed=False) if evaluation.elo is not None else "n/a (no rated anchor)"
        speed = f"; {evaluation.games_played} games" + (
            f", {evaluation.games_per_minute:g}/min" if evaluation.games_per_minute else ""
        )
        for index, row in enumerate(evaluation.anchors):
            pgn = (
                f'<br><a class=pgn href="{_e(pgn_href(evaluation.pgn, base))}">{_e(evaluation.pgn.name)}</a>'
                if evaluation.pgn is not None
                else ""
            )
            first = (
                (
                    f'<td class=num rowspan={span} title="{_e(evaluation.step_source)}">{_e(step)}</td>'
                    f"<td rowspan={span}><code>{_e(evaluation.path.name)}</code>{pgn}<br><span class=note>{_e(evaluation.player)}"
                    f"{_e(speed)}</span></td>"
                )
                if index == 0
                else ""
            )
            last = f"<td class=num rowspan={span}>{_e(elo)}</td>" if index == 0 else ""
            rating = "unrated" if row.rating is None else f"{row.rating:g}"
            parts.append(
                f'<tr>{first}<td title="{_e(row.settings)}">{_e(row.anchor)}</td><td class=num title="{_e(row.rating_source)}">'
                f"{_e(rating)}</td><td class=num>{row.wins} / {row.draws} / {row.losses}</td>"
                f"<td class=num>{_e(_interval_text(row.score))}</td>"
                f"<td class=num>{_e(row.elo.text() if row.elo else 'n/a')}</td>{last}</tr>"
            )
    parts.append("</table>")
    return "\n".join(parts)


def _games_html(runs: Sequence[RunData], figure: str | None, base: Path) -> str:
    parts = []
    for run in runs:
        if len(runs) > 1:
            parts.append(f"<h3>{_e(run.name)}</h3>")
        if not run.games:
            parts.append(
                "<p>No game evaluation in this run directory. Play one with <code>chessgrpo eval games --checkpoint "
                "RUN/checkpoints/step_NNNNNN output=RUN/eval/games_step_NNNNNN.json</code>.</p>"
            )
            continue
        parts.append(wrap_tables(_games_table(run.games, base)))
        steps = sorted({e.step_source for e in run.games})
        parts.append("<p class=note>Step of each evaluation from: " + _e("; ".join(steps)) + ".</p>")
    calibration = next((e.calibration for run in runs for e in run.games if e.calibration), "")
    if calibration:
        parts.append(f"<p class=note>Ratings: {_e(calibration)}</p>")
    if figure:
        parts.append(figure)
    return "\n".join(parts)


def _findings_html(runs: Sequence[RunData], findings: dict[str, list[Finding]]) -> str:
    parts = []
    for run in runs:
        found = findings[run.name]
        if len(runs) > 1:
            parts.append(f"<h3>{_e(run.name)}</h3>")
        if not found:
            parts.append("<p>No findings: nothing in the metrics points to a problem.</p>")
            continue
        parts.append("<table><tr><th>severity</th><th>finding</th><th>what</th><th>advice</th></tr>")
        for f in found:
            evidence = json.dumps(f.to_json()["evidence"], indent=1)
            parts.append(
                f'<tr><td><span class="sev {f.severity}">{_e(f.severity)}</span></td><td><code>{_e(f.id)}</code></td>'
                f"<td>{_e(f.message)}<details><summary>evidence</summary><pre>{_e(evidence)}</pre></details></td>"
                f"<td>{_e(f.advice)}</td></tr>"
            )
        parts.append("</table>")
    parts.append(
        "<p class=note>The same findings: <code>chessgrpo diagnose RUN_DIR</code> (docs/diagnose.md lists them "
        "with their thresholds).</p>"
    )
    return "\n".join(parts)


def _interval(held: HeldOut | None) -> str:
    if held is None or not math.isfinite(held.value):
        return "-"
    text = f"{held.value:.4f}"
    if held.has_interval:
        text += f" [{held.low:.4f}, {held.high:.4f}]"
    return text


def _evaluation_html(runs: Sequence[RunData]) -> str:
    parts = []
    held_out = held_out_metrics()
    for run in runs:
        metrics = [m for m in held_out if any(m in p.metrics for p in run.evals)]
        if len(runs) > 1:
            parts.append(f"<h3>{_e(run.name)}</h3>")
        if metrics:
            header = "".join(
                f"<th>{_e(m)} ({'higher' if held_out[m][1].higher_is_better else 'lower'} is better)</th>"
                for m in metrics
            )
            parts.append(f"<table><tr><th>step</th>{header}<th>n (positions / puzzles)</th></tr>")
            for point in run.evals:
                sizes = [
                    next((held.n for name, held in point.metrics.items() if held_out[name][0] is kind and held.n), None)
                    for kind in read_by_run_data()
                ]  # the evaluations whose files hold n: offline, puzzles
                sizes = [n for n in sizes if n]
                cells = "".join(f"<td class=num>{_e(_interval(point.metrics.get(m)))}</td>" for m in metrics)
                size = " / ".join(map(str, sizes)) or "-"
                parts.append(f"<tr><td class=num>{point.step}</td>{cells}<td class=num>{_e(size)}</td></tr>")
            parts.append(
                "</table><p class=note>value [95% interval]: bootstrap for the offline metrics, Wilson for "
                "puzzles. Paired differences: <code>chessgrpo eval compare A.json B.json</code>.</p>"
            )
        pretrain = [row for row in run.rows if any(k.startswith("eval/") for k in row)] if not metrics else []
        if pretrain:
            keys = sorted({k for row in pretrain for k in row if k.startswith("eval/")})
            parts.append("<table><tr><th>step</th>" + "".join(f"<th>{_e(k)}</th>" for k in keys) + "</tr>")
            for row in pretrain:
                parts.append(
                    f"<tr><td class=num>{row['step']}</td>"
                    + "".join(f"<td class=num>{_e(_number(row.get(k)))}</td>" for k in keys)
                    + "</tr>"
                )
            parts.append(
                "</table><p class=note>Pretraining evaluation on the dataset's test split (point estimates).</p>"
            )
        for evaluation in run.standalone:
            names = list(evaluation.player)
            parts.append(
                f"<p><code>{_e(evaluation.path.name)}</code> ({_e(evaluation.kind)}):</p><table><tr><th>player</th>"
                + "".join(f"<th>{_e(n)}</th>" for n in names)
                + "</tr>"
            )
            for player, values in [(run.name, evaluation.player), *evaluation.baselines.items()]:
                cells = "".join(f"<td class=num>{_e(_interval(values.get(n)))}</td>" for n in names)
                parts.append(f"<tr><td>{_e(player)}</td>{cells}</tr>")
            parts.append("</table>")
        if not metrics and not pretrain and not run.standalone:
            parts.append("<p>No evaluation yet.</p>")
    return "\n".join(parts)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def config_differences(runs: Sequence[RunData]) -> list[tuple[str, list[Any]]]:
    """(dotted key, value per run) for every key whose value differs between the runs (`ABSENT` where a run lacks it)."""
    flats = [_flatten(run.config) for run in runs]
    keys = sorted(set().union(*flats))
    rows = []
    for key in keys:
        values = [flat.get(key, ABSENT) for flat in flats]
        if any(v != values[0] for v in values[1:]):
            rows.append((key, values))
    return rows


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The policy's shape as the run has it: config.yaml's model section beside the saved checkpoint's config."""

    source: Path
    """The model_config.json the effective values come from."""
    configured: dict[str, Any]
    """The run's config.yaml model section."""
    effective: dict[str, Any]
    """The checkpoint's saved policy config."""
    ignored: bool
    """Whether the model section is ignored (init_checkpoint is set: the run takes the checkpoint's shape)."""


def model_settings(run: RunData) -> ModelSettings | None:
    """What the run's model actually has (`run_data.effective_model_config`), or None for a run without a policy checkpoint."""
    found = effective_model_config(run)
    configured = run.config.get("model")
    if found is None or not isinstance(configured, dict):
        return None
    effective, source = found
    return ModelSettings(source, configured, effective, bool(run.setting("init_checkpoint")))


def _model_table(model: ModelSettings) -> str:
    why = (
        "init_checkpoint is set, so the run takes the checkpoint's shape and ignores config.yaml's model section"
        if model.ignored
        else "config.yaml's model section as built (sizes resolved)"
    )
    rows = [
        f"<p>The model as saved with its weights (<code>{_e(model.source)}</code>): {_e(why)}.</p>",
        "<table class=model-table><tr><th>model key</th><th>the model has</th><th>config.yaml says</th><th></th></tr>",
    ]
    for key in dict.fromkeys([*model.effective, *model.configured]):
        has, says = model.effective.get(key, ABSENT), model.configured.get(key, ABSENT)
        if model.ignored:
            mark = "ignored" + (" (differs)" if has != says and says is not None and says != ABSENT else "")
        else:
            mark = "" if has == says or says is None else "resolved"
        rows.append(
            f'<tr data-key="{_e(key)}"><td><code>{_e(key)}</code></td><td>{_e(_yaml_value(has))}</td>'
            f"<td>{_e(_yaml_value(says))}</td><td>{_e(mark)}</td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


def _yaml_value(value: Any) -> str:
    if value is ABSENT:
        return ABSENT
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _mark_ignored(text: str, model: ModelSettings) -> str:
    """The YAML dump with a comment on each model-section key that the run does not use (init_checkpoint is set)."""
    if not model.ignored:
        return text
    lines, inside = [], False
    for line in text.splitlines():
        if not line.startswith(" "):
            inside = line.startswith("model:")
            if inside:
                line += "  # ignored: init_checkpoint is set (the model is the checkpoint's, table above)"
        elif inside and re.match(r"^  ([A-Za-z_]\w*):", line):
            key = line.split(":", 1)[0].strip()
            if key in model.effective:
                line += f"  # ignored; the model has {_yaml_value(model.effective[key])}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _config_html(runs: Sequence[RunData]) -> str:
    if len(runs) == 1:
        run = runs[0]
        if not run.config:
            return "<p>No config.yaml in the run directory.</p>"
        model = model_settings(run)
        text = yaml.safe_dump(run.config, sort_keys=False)
        if model is None:
            return (
                f"<details open><summary>resolved config (RUN_DIR/config.yaml)</summary><pre>{_e(text)}</pre></details>"
            )
        return (
            _model_table(model) + "<details open><summary>resolved config (RUN_DIR/config.yaml; the model section's "
            f"ignored keys are marked)</summary><pre>{_e(_mark_ignored(text, model))}</pre></details>"
        )
    differences = config_differences(runs)
    if not differences:
        return "<p>The runs' configs are identical.</p>"
    header = "".join(f"<th>{_e(run.name)}</th>" for run in runs)
    rows = "".join(
        f"<tr><td><code>{_e(key)}</code></td>"
        + "".join(f"<td>{_e('null' if v is None else v)}</td>" for v in values)
        + "</tr>"
        for key, values in differences
    )
    return (
        f"<table><tr><th>key</th>{header}</tr>{rows}</table><p class=note>Only keys whose values differ are listed.</p>"
    )
