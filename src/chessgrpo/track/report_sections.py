"""The report's HTML sections about results: the verdict (`track.report_verdict`, one per run), the diagnosis's
findings, game strength (the games tables of ``eval games``) and the evaluation tables (per step, pretraining, and
standalone ``eval offline|puzzles`` results); and the HTML helpers every section uses (escaping, relative links,
tables that scroll inside their section)."""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chessgrpo.eval.registry import held_out_metrics, read_by_run_data
from chessgrpo.track.diagnose.findings import Finding
from chessgrpo.track.report_verdict import Verdict, pgn_href, verdict_html
from chessgrpo.track.run_data import GamesEvaluation, HeldOut, RunData


def escape(text: Any) -> str:
    return html.escape(str(text), quote=True)


def relative_path(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def wrap_tables(fragment: str) -> str:
    """Every <table> of an HTML fragment inside a ``table-wrap`` div: a table wider than its section scrolls there."""
    return re.sub(r"<table\b", '<div class="table-wrap"><table', fragment).replace("</table>", "</table></div>")


def verdict_section(runs: Sequence[RunData], verdicts: dict[str, Verdict], base: Path) -> str:
    parts = []
    for run in runs:
        if len(runs) > 1:
            parts.append(f"<h3>{escape(run.name)}</h3>")
        parts.append(verdict_html(verdicts[run.name], base))
    parts.append(
        "<p class=note>Decided by the games against the run's start (its <code>init_checkpoint</code>): stronger or "
        "weaker when the 95% interval of the Elo difference excludes 0. The diagnosis below explains why; the "
        "game strength section has every evaluation.</p>"
    )
    return wrap_tables("\n".join(parts))


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
                f'<br><a class=pgn href="{escape(pgn_href(evaluation.pgn, base))}">{escape(evaluation.pgn.name)}</a>'
                if evaluation.pgn is not None
                else ""
            )
            first = (
                (
                    f'<td class=num rowspan={span} title="{escape(evaluation.step_source)}">{escape(step)}</td>'
                    f"<td rowspan={span}><code>{escape(evaluation.path.name)}</code>{pgn}<br><span class=note>{escape(evaluation.player)}"
                    f"{escape(speed)}</span></td>"
                )
                if index == 0
                else ""
            )
            last = f"<td class=num rowspan={span}>{escape(elo)}</td>" if index == 0 else ""
            rating = "unrated" if row.rating is None else f"{row.rating:g}"
            parts.append(
                f'<tr>{first}<td title="{escape(row.settings)}">{escape(row.anchor)}</td><td class=num title="{escape(row.rating_source)}">'
                f"{escape(rating)}</td><td class=num>{row.wins} / {row.draws} / {row.losses}</td>"
                f"<td class=num>{escape(_interval_text(row.score))}</td>"
                f"<td class=num>{escape(row.elo.text() if row.elo else 'n/a')}</td>{last}</tr>"
            )
    parts.append("</table>")
    return "\n".join(parts)


def games_section(runs: Sequence[RunData], figure: str | None, base: Path) -> str:
    parts = []
    for run in runs:
        if len(runs) > 1:
            parts.append(f"<h3>{escape(run.name)}</h3>")
        if not run.games:
            parts.append(
                "<p>No game evaluation in this run directory. Play one with <code>chessgrpo eval games --checkpoint "
                "RUN/checkpoints/step_NNNNNN output=RUN/eval/games_step_NNNNNN.json</code>.</p>"
            )
            continue
        parts.append(wrap_tables(_games_table(run.games, base)))
        steps = sorted({e.step_source for e in run.games})
        parts.append("<p class=note>Step of each evaluation from: " + escape("; ".join(steps)) + ".</p>")
    calibration = next((e.calibration for run in runs for e in run.games if e.calibration), "")
    if calibration:
        parts.append(f"<p class=note>Ratings: {escape(calibration)}</p>")
    if figure:
        parts.append(figure)
    return "\n".join(parts)


def findings_section(runs: Sequence[RunData], findings: dict[str, list[Finding]]) -> str:
    parts = []
    for run in runs:
        found = findings[run.name]
        if len(runs) > 1:
            parts.append(f"<h3>{escape(run.name)}</h3>")
        if not found:
            parts.append("<p>No findings: nothing in the metrics points to a problem.</p>")
            continue
        parts.append("<table><tr><th>severity</th><th>finding</th><th>what</th><th>advice</th></tr>")
        for f in found:
            evidence = json.dumps(f.to_json()["evidence"], indent=1)
            parts.append(
                f'<tr><td><span class="sev {f.severity}">{escape(f.severity)}</span></td><td><code>{escape(f.id)}</code></td>'
                f"<td>{escape(f.message)}<details><summary>evidence</summary><pre>{escape(evidence)}</pre></details></td>"
                f"<td>{escape(f.advice)}</td></tr>"
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


def evaluation_section(runs: Sequence[RunData]) -> str:
    parts = []
    held_out = held_out_metrics()
    for run in runs:
        metrics = [m for m in held_out if any(m in p.metrics for p in run.evals)]
        if len(runs) > 1:
            parts.append(f"<h3>{escape(run.name)}</h3>")
        if metrics:
            header = "".join(
                f"<th>{escape(m)} ({'higher' if held_out[m][1].higher_is_better else 'lower'} is better)</th>"
                for m in metrics
            )
            parts.append(f"<table><tr><th>step</th>{header}<th>n (positions / puzzles)</th></tr>")
            for point in run.evals:
                sizes = [
                    next((held.n for name, held in point.metrics.items() if held_out[name][0] is kind and held.n), None)
                    for kind in read_by_run_data()
                ]  # the evaluations whose files hold n: offline, puzzles
                sizes = [n for n in sizes if n]
                cells = "".join(f"<td class=num>{escape(_interval(point.metrics.get(m)))}</td>" for m in metrics)
                size = " / ".join(map(str, sizes)) or "-"
                parts.append(f"<tr><td class=num>{point.step}</td>{cells}<td class=num>{escape(size)}</td></tr>")
            parts.append(
                "</table><p class=note>value [95% interval]: bootstrap for the offline metrics, Wilson for "
                "puzzles. Paired differences: <code>chessgrpo eval compare A.json B.json</code>.</p>"
            )
        pretrain = [row for row in run.rows if any(k.startswith("eval/") for k in row)] if not metrics else []
        if pretrain:
            keys = sorted({k for row in pretrain for k in row if k.startswith("eval/")})
            parts.append("<table><tr><th>step</th>" + "".join(f"<th>{escape(k)}</th>" for k in keys) + "</tr>")
            for row in pretrain:
                parts.append(
                    f"<tr><td class=num>{row['step']}</td>"
                    + "".join(f"<td class=num>{escape(_number(row.get(k)))}</td>" for k in keys)
                    + "</tr>"
                )
            parts.append(
                "</table><p class=note>Pretraining evaluation on the dataset's test split (point estimates).</p>"
            )
        for evaluation in run.standalone:
            names = list(evaluation.player)
            parts.append(
                f"<p><code>{escape(evaluation.path.name)}</code> ({escape(evaluation.kind)}):</p><table><tr><th>player</th>"
                + "".join(f"<th>{escape(n)}</th>" for n in names)
                + "</tr>"
            )
            for player, values in [(run.name, evaluation.player), *evaluation.baselines.items()]:
                cells = "".join(f"<td class=num>{escape(_interval(values.get(n)))}</td>" for n in names)
                parts.append(f"<tr><td>{escape(player)}</td>{cells}</tr>")
            parts.append("</table>")
        if not metrics and not pretrain and not run.standalone:
            parts.append("<p>No evaluation yet.</p>")
    return "\n".join(parts)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
