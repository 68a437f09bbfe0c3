"""`build_report`: one self-contained HTML file (PNG figures embedded as base64) plus the PNGs.

Sections: the runs (kind, steps, status), the diagnosis (`track.diagnose`), the evaluation
tables (``eval/step_*.json`` or the eval rows, and any standalone ``eval offline|puzzles``
result in ``eval/``), the figures (`track.plots`), and the configuration: the differences
between the runs when several are compared, the whole resolved config for one.

A sweep's study directory (``chessgrpo sweep``) adds the optimisation history and the parameter
importances (`track.plots.figure_study`) and stands for its default and best trials' runs.

Where things go: ``chessgrpo report RUN_DIR`` writes ``RUN_DIR/report.html`` and the PNGs in
``RUN_DIR/report/``; ``--out DIR/NAME.html`` writes the PNGs to ``DIR/NAME/``. The HTML needs
none of the PNG files (every image is inline), so it can be mailed or archived alone.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import html
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from chessgrpo.track.diagnose import Finding, diagnose
from chessgrpo.track.plots import build_figures, figure_study
from chessgrpo.track.run_data import HELDOUT_METRICS, HeldOut, RunData, load_run

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
"""


ABSENT = "(absent)"
"""What `config_differences` reports for a key a run's config does not have."""


@dataclasses.dataclass
class ReportResult:
    html: Path
    """The self-contained HTML file."""
    pngs: list[Path]
    """The figures as PNG files (the same images as in the HTML)."""
    findings: dict[str, list[Finding]]
    """Run label -> its diagnosis."""


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


def build_report(run_dirs: Sequence[str | Path], out: str | Path | None = None, *, dpi: int = 100) -> ReportResult:
    """Write the HTML report of one or several runs (and its PNGs); returns where they are."""
    if not run_dirs:
        raise ValueError("build_report needs at least one run directory")
    given = [Path(d) for d in run_dirs]
    paths, studies = _study_trials(given)
    runs = [load_run(p) for p in paths]
    for run, label in zip(runs, _labels(paths)):
        run.label = label
    out = Path(out) if out is not None else default_output(given if studies else paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    images = png_directory(out)
    images.mkdir(parents=True, exist_ok=True)

    findings = {run.name: diagnose(run) for run in runs}
    figures = [figure_study(study) for study in studies] + build_figures(runs)
    pngs, figure_html = [], []
    for figure in figures:
        data = figure.png(dpi=dpi)
        path = images / f"{figure.name}.png"
        path.write_bytes(data)
        pngs.append(path)
        encoded = base64.b64encode(data).decode("ascii")
        figure_html.append(
            f'<figure id="fig-{figure.name}"><h3>{_e(figure.title)}</h3>'
            f'<img src="data:image/png;base64,{encoded}" alt="{_e(figure.title)}">'
            f"<figcaption>{_e(figure.caption)} <span class=note>(PNG: {_e(_relative(path, out.parent))})</span></figcaption></figure>"
        )

    title = "chessgrpo report: " + ", ".join([f"study {study.name}" for study in studies] + [run.name for run in runs])
    sections = [
        ("runs", "Runs", _runs_table(runs)),
        ("findings", "Diagnosis", _findings_html(runs, findings)),
        ("evaluation", "Evaluation", _evaluation_html(runs)),
        ("figures", "Figures", "\n".join(figure_html) or "<p>No metrics to plot yet.</p>"),
        ("config", "Configuration" if len(runs) == 1 else "Configuration differences", _config_html(runs)),
    ]
    generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    body = "\n".join(f'<h2 id="{key}">{_e(name)}</h2>\n{content}' for key, name, content in sections)
    nav = " ".join(f'<a href="#{key}">{_e(name)}</a>' for key, name, _ in sections)
    document = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{_e(title)}</h1><p class=note>generated {_e(generated)} by <code>chessgrpo report</code>; "
        "intervals are 95%; long per-step series are drawn raw (pale) and as a centred moving average with the 95% "
        "band of the window mean.</p>\n"
        f"<nav>{nav}</nav>\n{body}\n</body></html>\n"
    )
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(document, encoding="utf-8")
    tmp.replace(out)
    return ReportResult(out, pngs, findings)


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
        lines.append(f"<tr><td>{_e(run.name)}</td><td><code>{_e(run.path)}</code></td><td>{_e(run.kind)}</td>"
                     f"<td class=num>{len(run.rows)}</td><td class=num>{_e(span)}</td><td class=num>{_e(planned)}</td>"
                     f"<td>{_e(last)}</td></tr>")  # fmt: skip
    lines.append("</table>")
    return "\n".join(lines)


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
    parts.append("<p class=note>The same findings: <code>chessgrpo diagnose RUN_DIR</code> (docs/diagnose.md lists them "
                 "with their thresholds).</p>")  # fmt: skip
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
    for run in runs:
        metrics = [m for m in HELDOUT_METRICS if any(m in p.metrics for p in run.evals)]
        if len(runs) > 1:
            parts.append(f"<h3>{_e(run.name)}</h3>")
        if metrics:
            header = "".join(f"<th>{_e(m)} ({'higher' if HELDOUT_METRICS[m][3] else 'lower'} is better)</th>" for m in metrics)
            parts.append(f"<table><tr><th>step</th>{header}<th>n (positions / puzzles)</th></tr>")
            for point in run.evals:
                sizes = [next((held.n for name, held in point.metrics.items() if HELDOUT_METRICS[name][0] == kind and held.n), None)
                         for kind in ("offline", "puzzles")]
                sizes = [n for n in sizes if n]
                cells = "".join(f"<td class=num>{_e(_interval(point.metrics.get(m)))}</td>" for m in metrics)
                size = " / ".join(map(str, sizes)) or "-"
                parts.append(f"<tr><td class=num>{point.step}</td>{cells}<td class=num>{_e(size)}</td></tr>")
            parts.append("</table><p class=note>value [95% interval]: bootstrap for the offline metrics, Wilson for "
                         "puzzles. Paired differences: <code>chessgrpo eval compare A.json B.json</code>.</p>")  # fmt: skip
        pretrain = [row for row in run.rows if any(k.startswith("eval/") for k in row)] if not metrics else []
        if pretrain:
            keys = sorted({k for row in pretrain for k in row if k.startswith("eval/")})
            parts.append("<table><tr><th>step</th>" + "".join(f"<th>{_e(k)}</th>" for k in keys) + "</tr>")
            for row in pretrain:
                parts.append(f"<tr><td class=num>{row['step']}</td>"
                             + "".join(f"<td class=num>{_e(_number(row.get(k)))}</td>" for k in keys) + "</tr>")  # fmt: skip
            parts.append("</table><p class=note>Pretraining evaluation on the dataset's test split (point estimates).</p>")
        for evaluation in run.standalone:
            names = list(evaluation.player)
            parts.append(f"<p><code>{_e(evaluation.path.name)}</code> ({_e(evaluation.kind)}):</p><table><tr><th>player</th>"
                         + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>")  # fmt: skip
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


def _config_html(runs: Sequence[RunData]) -> str:
    if len(runs) == 1:
        run = runs[0]
        if not run.config:
            return "<p>No config.yaml in the run directory.</p>"
        text = yaml.safe_dump(run.config, sort_keys=False)
        return f"<details open><summary>resolved config (RUN_DIR/config.yaml)</summary><pre>{_e(text)}</pre></details>"
    differences = config_differences(runs)
    if not differences:
        return "<p>The runs' configs are identical.</p>"
    header = "".join(f"<th>{_e(run.name)}</th>" for run in runs)
    rows = "".join(
        f"<tr><td><code>{_e(key)}</code></td>" + "".join(f"<td>{_e('null' if v is None else v)}</td>" for v in values) + "</tr>"
        for key, values in differences
    )
    return f"<table><tr><th>key</th>{header}</tr>{rows}</table><p class=note>Only keys whose values differ are listed.</p>"
