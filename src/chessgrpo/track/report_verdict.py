"""The report's verdict: did the run get stronger, by how much, against whom, with intervals.

`run_verdict` reads what the run directory already holds (`track.run_data.load_run`: the `eval games`
summaries, the held-out evaluations, the metrics rows; `eval/value.json` for the value head) and decides
one headline from the games against the run's start (`track.diagnose.changes.games_against_start`):

- "Stronger than its start" when the 95% interval of the Elo difference lies above 0,
- "Weaker than its start" when it lies below 0,
- "No measurable change" when it contains 0;

a perfect (or zero) score has only a one-sided bound, and the headline says so in words. Below it: every
opponent the run was measured against (its start, the random mover, Stockfish levels, UCI engines, other
checkpoints), each with its score, Elo difference, games and a link to the games' PGN; then the held-out
changes (first evaluation against the last, paired), the training objective's trend, and what was not
measured (with the command that measures it). `verdict_html` renders it for `track.report`.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import urllib.parse
from pathlib import Path
from typing import Any

from chessgrpo.eval.registry import held_out_metrics
from chessgrpo.track.diagnose.changes import games_against_start, heldout_change, linear_trend
from chessgrpo.track.diagnose.findings import Thresholds
from chessgrpo.track.run_data import AnchorResult, EloValue, GamesEvaluation, RunData

STRONGER, NO_CHANGE, WEAKER, UNMEASURED = "stronger", "no change", "weaker", "unmeasured"


@dataclasses.dataclass(frozen=True)
class Opponent:
    """One opponent of the verdict table: its newest games against the run's policy."""

    label: str
    note: str
    is_start: bool
    evaluation: GamesEvaluation
    result: AnchorResult

    @property
    def games(self) -> int:
        return self.result.wins + self.result.draws + self.result.losses


@dataclasses.dataclass
class Verdict:
    """What the report's first screen says about one run."""

    tone: str
    """`STRONGER`, `NO_CHANGE`, `WEAKER` (games against its start) or `UNMEASURED` (no such games)."""
    headline: str
    opponents: list[Opponent]
    rating: str | None
    """The maximum-likelihood Elo over the rated anchors, in words (None: no rated anchor)."""
    secondary: list[str]
    """Held-out changes, search and value-head numbers, the training objective's trend."""
    missing: list[tuple[str, str]]
    """What was not measured and the command that measures it ("" when there is none)."""


def elo_words(elo: EloValue | None, games: int) -> str:
    """ "+71 Elo [+49, +93] over 1000 games"; a one-sided bound is said in words, not drawn as an estimate."""
    if elo is None or elo.value is None:
        return f"no Elo difference could be computed from {games} games"
    if elo.bound == "lower":
        return f"won all {games} games, so the Elo difference is only a lower bound: >= {elo.value:+.0f}"
    if elo.bound == "upper":
        return f"lost all {games} games, so the Elo difference is only an upper bound: <= {elo.value:+.0f}"
    if elo.low is None or elo.high is None:
        return f"{elo.value:+.0f} Elo (no interval) over {games} games"
    return f"{elo.value:+.0f} Elo [{elo.low:+.0f}, {elo.high:+.0f}] over {games} games"


def elo_tone(elo: EloValue | None) -> str:
    """`STRONGER` / `WEAKER` when the 95% interval (or the one-sided bound) excludes 0, else `NO_CHANGE`."""
    if elo is None or elo.value is None:
        return UNMEASURED
    low = elo.value if elo.bound == "lower" else elo.low
    high = elo.value if elo.bound == "upper" else elo.high
    if low is not None and low > 0:
        return STRONGER
    if high is not None and high < 0:
        return WEAKER
    return NO_CHANGE


def start_headline(elo: EloValue | None, games: int) -> tuple[str, str]:
    """(tone, sentence) of the games against the run's start."""
    tone = elo_tone(elo)
    words = elo_words(elo, games)
    if tone == STRONGER:
        return tone, f"Stronger than its start: {words}."
    if tone == WEAKER:
        return tone, f"Weaker than its start: {words}."
    if tone == NO_CHANGE:
        return tone, f"No measurable change against its start: {words} (the 95% interval contains 0)."
    return UNMEASURED, f"Against its start: {words}."


def _latest_per_anchor(run: RunData) -> list[tuple[GamesEvaluation, AnchorResult]]:
    """Each anchor's newest games (run.games is ordered by step, then file time), in first-seen order."""
    newest: dict[str, tuple[GamesEvaluation, AnchorResult]] = {}
    for evaluation in run.games:
        for row in evaluation.anchors:
            newest[row.anchor] = (evaluation, row)
    return list(newest.values())


def _label(row: AnchorResult, is_start: bool) -> tuple[str, str]:
    rating = f"rated {row.rating:g} ({row.rating_source})" if row.rating is not None else ""
    if is_start:
        return "its start", f"{row.anchor} (the run's init_checkpoint)"
    if row.anchor == "random":
        return "random mover", rating or row.settings
    return row.anchor, "; ".join(part for part in (row.settings, rating) if part)


def _opponents(run: RunData) -> tuple[list[Opponent], Opponent | None]:
    start = games_against_start(run)
    opponents = []
    for evaluation, row in _latest_per_anchor(run):
        is_start = start is not None and start[1].anchor == row.anchor
        if is_start:
            evaluation, row = start
        label, note = _label(row, is_start)
        opponents.append(Opponent(label, note, is_start, evaluation, row))
    opponents.sort(key=lambda o: not o.is_start)  # its start first: the row the headline is about
    return opponents, next((o for o in opponents if o.is_start), None)


def _rating(opponents: list[Opponent]) -> str | None:
    evaluation = next(
        (o.evaluation for o in opponents if o.evaluation.elo is not None and o.evaluation.elo.value is not None), None
    )
    if evaluation is None or evaluation.elo is None:
        return None
    rated = ", ".join(f"{r.anchor} = {r.rating:g}" for r in evaluation.anchors if r.rating is not None)
    elo = evaluation.elo
    if elo.bound:
        value = f"{'>=' if elo.bound == 'lower' else '<='} {elo.value:.0f} (a one-sided bound: every game {'won' if elo.bound == 'lower' else 'lost'})"
    else:
        value = elo.text(signed=False)
    return (
        f"Rating on the anchors' scale ({rated}; conventions, not human ratings): {value}, from {evaluation.path.name}."
    )


def _heldout_lines(run: RunData) -> list[str]:
    if len(run.evals) < 2:
        return []
    lines = []
    thresholds = Thresholds()
    for metric in held_out_metrics():
        change = heldout_change(run, metric, run.evals[0], run.evals[-1], thresholds)
        if change is None:
            continue
        judged = "better" if change.improved else "worse" if change.worse else "no significant change"
        how = "paired" if change.paired else "unpaired"
        lines.append(
            f"{metric}: {change.a:.4f} -> {change.b:.4f} (step {change.step_a} -> {change.step_b}), "
            f"{change.difference:+.4f} [{change.low:+.4f}, {change.high:+.4f}] {how}: {judged}"
        )
    return lines


def _trend_line(run: RunData) -> str | None:
    key = "reward/mean" if run.has("reward/mean") else "loss/train" if run.has("loss/train") else None
    if key is None:
        return None
    steps, values = run.series(key, run.train_rows)
    keep = [i for i, v in enumerate(values) if math.isfinite(v)]
    if len(keep) < 3:
        return None
    change, low, high = linear_trend(steps[keep], values[keep])
    if not math.isfinite(change):
        return None
    what = "training reward of fresh positions" if key == "reward/mean" else "training loss"
    return (
        f"{what} ({key}): {change:+.4f} [{low:+.4f}, {high:+.4f}] over steps {int(steps[keep[0]])}-{int(steps[keep[-1]])} "
        "(linear trend, 95% block bootstrap)"
    )


def _standalone_lines(run: RunData) -> list[str]:
    lines = []
    for evaluation in run.standalone:
        parts = [
            f"{name} {held.value:.3f}" + (f" [{held.low:.3f}, {held.high:.3f}]" if held.has_interval else "")
            for name, held in evaluation.player.items()
            if math.isfinite(held.value)
        ]
        if parts:
            lines.append(f"{evaluation.path.name} ({evaluation.kind}): " + ", ".join(parts))
    value = _read_json(run.path / "eval" / "value.json")  # the value head's error (`chessgrpo eval value`)
    mae = value.get("mae") if isinstance(value, dict) else None
    if isinstance(mae, dict) and all(isinstance(mae.get(k), (int, float)) for k in ("value", "low", "high")):
        base = (value or {}).get("baseline_mae") or {}
        against = f" (a constant guess: {base['value']:.3f})" if isinstance(base.get("value"), (int, float)) else ""
        lines.append(
            f"value head error (mean absolute, expected score, {value.get('n', '?')} positions): "
            f"{mae['value']:.3f} [{mae['low']:.3f}, {mae['high']:.3f}]{against}"
        )
    return lines


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def _missing(run: RunData, opponents: list[Opponent], start: Opponent | None) -> list[tuple[str, str]]:
    missing = []
    init = run.setting("init_checkpoint")
    out = f"{run.path}/eval"
    if start is None and isinstance(init, str) and init:
        command = (
            f"chessgrpo eval games --checkpoint {run.path} --anchors {init} --games 200 "
            f"output={out}/games_vs_start.json pgn={out}/games_vs_start.pgn"
        )
        missing.append(("games against its start", command))
    if not any(o.result.rating is not None and o.result.anchor != "random" for o in opponents):
        command = (
            f"chessgrpo eval games --checkpoint {run.path} --anchors sf-skill:0 --games 100 "
            f"output={out}/games_stockfish.json pgn={out}/games_stockfish.pgn"
        )
        missing.append(("strength against Stockfish (rated anchors)", command))
    if len(run.evals) < 2 and run.kind == "grpo":
        missing.append(("held-out changes", "evaluations at two steps at least (config eval_every, eval_at_start)"))
    return missing


def run_verdict(run: RunData) -> Verdict:
    """The verdict of one run (see the module doc); works on runs without any evaluation too."""
    opponents, start = _opponents(run)
    if start is not None:
        tone, headline = start_headline(start.result.elo, start.games)
    elif opponents:
        first = opponents[0]
        tone = UNMEASURED
        headline = (
            f"Not measured against its start; against {first.label}: {elo_words(first.result.elo, first.games)}."
            if run.setting("init_checkpoint")
            else f"Trained from scratch (no start to play); against {first.label}: {elo_words(first.result.elo, first.games)}."
        )
    else:
        tone = UNMEASURED
        headline = "Strength in games not measured: this run directory has no chessgrpo eval games result."
    secondary = _heldout_lines(run)
    trend = _trend_line(run)
    if trend is not None:
        secondary.append(trend)
    secondary += _standalone_lines(run)
    return Verdict(tone, headline, opponents, _rating(opponents), secondary, _missing(run, opponents, start))


# ------------------------------------------------------------------------------------------------
# HTML


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def pgn_href(pgn: Path, base: Path) -> str:
    """The link from a report in `base` to a PGN file: relative when it can be (the run directory moves as one)."""
    try:
        target = os.path.relpath(pgn.resolve(), base.resolve())
    except ValueError:  # another drive (Windows)
        target = str(pgn.resolve())
    return urllib.parse.quote(target.replace(os.sep, "/"))


def _elo_cell(elo: EloValue | None) -> str:
    if elo is None or elo.value is None:
        return "n/a"
    if elo.bound == "lower":
        return f">= {elo.value:+.0f} (lower bound: every game won)"
    if elo.bound == "upper":
        return f"<= {elo.value:+.0f} (upper bound: every game lost)"
    return elo.text()


def verdict_html(verdict: Verdict, base: Path) -> str:
    """The verdict block: headline, the opponents' table (PGN links relative to `base`), the secondary lines."""
    parts = [
        f'<p class="headline {verdict.tone.replace(" ", "-")}" data-tone="{_e(verdict.tone)}">{_e(verdict.headline)}</p>'
    ]
    if verdict.opponents:
        rows = [
            (
                "<table class=verdict-table><tr><th>opponent</th><th>played by</th><th>games</th><th>W / D / L</th>"
                "<th>score [95% Wilson]</th><th>Elo difference [95%]</th><th>games (PGN)</th></tr>"
            )
        ]
        for o in verdict.opponents:
            r = o.result
            score = (
                f"{r.score.value:.3f} [{r.score.low:.3f}, {r.score.high:.3f}]"
                if r.score.has_interval
                else f"{r.score.value:.3f}"
            )
            step = f"step {o.evaluation.step}" if o.evaluation.step is not None else "?"
            pgn = o.evaluation.pgn
            link = (
                f'<a class=pgn href="{_e(pgn_href(pgn, base))}">{_e(pgn.name)}</a>'
                if pgn is not None
                else "<span class=unknown>no PGN found</span>"
            )
            rows.append(
                f"<tr><td><b>{_e(o.label)}</b><br><span class=note>{_e(o.note)}</span></td>"
                f'<td title="{_e(o.evaluation.path.name)}">{_e(step)}</td><td class=num>{o.games}</td>'
                f"<td class=num>{r.wins} / {r.draws} / {r.losses}</td><td class=num>{_e(score)}</td>"
                f"<td class=num>{_e(_elo_cell(r.elo))}</td><td>{link}</td></tr>"
            )
        rows.append("</table>")
        parts.append("\n".join(rows))
    if verdict.rating:
        parts.append(f"<p class=note>{_e(verdict.rating)}</p>")
    if verdict.secondary:
        parts.append(
            "<p class=note>Held-out evaluations (first against last, 95% intervals), the training trend and "
            "standalone evaluations:</p><ul class=secondary>"
            + "".join(f"<li>{_e(line)}</li>" for line in verdict.secondary)
            + "</ul>"
        )
    if verdict.missing:
        parts.append(
            "<p class=note>Not measured:</p><ul class=missing>"
            + "".join(f"<li>{_e(what)}: <code>{_e(how)}</code></li>" for what, how in verdict.missing)
            + "</ul>"
        )
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# Text (`chessgrpo summary`)

GRPO_KINDS = ("move_group", "trajectory", "mixture", "rookworld")


def trained_text(run: RunData) -> str:
    """What the run trained: "runs/quickstart/grpo: 400 GRPO steps (move_group) from runs/quickstart/pretrain"."""
    kind = str(run.setting("kind") or run.kind)
    what = "GRPO" if kind in GRPO_KINDS else kind
    steps = run.setting("steps")
    init = run.setting("init_checkpoint")
    start = f" from {init}" if isinstance(init, str) and init else " from a random network"
    return f"{run.path}: {f'{steps} {what} steps' if steps else f'{what} training'} ({kind}){start}"


def _shown_path(path: Path) -> str:
    """`path` relative to the current directory when it lies under it (what a terminal user can paste)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def verdict_text(run: RunData, verdict: Verdict, next_steps: list[tuple[str, str]] = ()) -> str:
    """The verdict as the few lines a terminal shows last: the headline, each opponent, the secondary lines,
    what was not measured, the report, then `next_steps` ((what, command) pairs)."""
    kind = str(run.setting("kind") or run.kind)
    lines = [
        f"Trained: {trained_text(run)}",
        f"Did {'GRPO' if kind in GRPO_KINDS else 'training'} help?  {verdict.headline}",
    ]
    if verdict.opponents:
        lines += ["", "Games (score [95% Wilson], Elo difference [95%], PGN):"]
        rows = []
        for o in verdict.opponents:
            r = o.result
            score = (
                f"{r.score.value:.3f} [{r.score.low:.3f}, {r.score.high:.3f}]"
                if r.score.has_interval
                else f"{r.score.value:.3f}"
            )
            pgn = _shown_path(o.evaluation.pgn) if o.evaluation.pgn is not None else "no PGN found"
            rows.append((o.label, f"{o.games} games", score, _elo_cell(r.elo), pgn))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines += [
            "  " + "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows
        ]
    if verdict.secondary:
        lines += [
            "",
            "Held-out, first evaluation -> last (paired 95% intervals), training trend, standalone evaluations:",
        ]
        lines += [f"  {line}" for line in verdict.secondary]
    if verdict.missing:
        lines += ["", "Not measured:"] + [f"  {what}: {how}" for what, how in verdict.missing]
    report = run.path / "report.html"
    if report.exists():
        lines += ["", f"Report (every plot, the diagnosis): {report}"]
    if next_steps:
        width = max(len(what) for what, _ in next_steps)
        lines += ["", "Next:"] + [f"  {what:<{width}}  {command}" for what, command in next_steps]
    return "\n".join(lines)
