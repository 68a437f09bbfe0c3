"""What a run's evaluations say, gathered from the files under ``RUN/eval/``: did it get stronger, by how much.

`run_outcome(run_dir)` reads what the evaluation commands wrote (nothing is recomputed but the paired
puzzle comparison of the run's first and last in-run evaluations):

- games (`eval/games_*.json`, `chessgrpo eval games`): one `GameResult` per anchor, with the score and
  Elo difference and their intervals, the PGN, and whether the anchor is the run's own start
  (`init_checkpoint`);
- puzzles: the first move found, first in-run evaluation (step 0) against the last, paired on the
  same puzzles (`eval.compare`);
- the value head (`eval/value.json`, `chessgrpo eval value`) and puzzles through a search
  (`eval/puzzles_search*.json`).

`format_outcome` renders it as the short text `chessgrpo summary` prints at the end of `make run`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import yaml

from chessgrpo.eval.compare import MetricComparison, compare_files

PUZZLE_METRIC = "first_move_accuracy"
"""The puzzle number the summary leads with: the share of puzzles whose first move the policy finds."""


@dataclasses.dataclass(frozen=True)
class GameResult:
    """A match against one anchor, from the run's point of view."""

    anchor: str
    label: str
    """How to name the anchor to a reader: "its start (pretrained)", "random mover", the engine's name."""
    games: int
    score: dict[str, float]
    """value, low, high (Wilson interval of the score)."""
    elo: dict[str, Any]
    """value, low, high and ``bound`` ("lower"/"upper" when a side won every game, else None)."""
    pgn: Path | None
    is_start: bool

    @property
    def verdict(self) -> str:
        """"stronger", "weaker" or "no measurable difference" (the Elo interval against 0)."""
        if self.elo.get("low") is not None and self.elo["low"] > 0:
            return "stronger"
        if self.elo.get("high") is not None and self.elo["high"] < 0:
            return "weaker"
        return "no measurable difference"

    def elo_text(self) -> str:
        """"+71 Elo [+49, +93]", or "Elo >= +806" when the interval is one-sided."""
        value, low, high, bound = (self.elo.get(key) for key in ("value", "low", "high", "bound"))
        if bound == "lower" or (value is None and low is not None):
            return f"Elo >= {low:+.0f} (won every game)"
        if bound == "upper" or (value is None and high is not None):
            return f"Elo <= {high:+.0f} (lost every game)"
        return f"{value:+.0f} Elo [{low:+.0f}, {high:+.0f}]"


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    kind: str
    steps: int | None
    start: str | None
    """The run's init_checkpoint, as written in its config."""
    games: tuple[GameResult, ...]
    puzzles: MetricComparison | None
    """First move found, last in-run evaluation minus the first (paired)."""
    puzzle_steps: tuple[int, int] | None
    search_puzzles: tuple[int, dict[str, float]] | None
    """(search nodes, first-move rate with interval) of puzzles through a search, when evaluated."""
    value: dict[str, Any] | None
    """`eval value`'s JSON: mae, baseline_mae (intervals), n."""

    @property
    def against_start(self) -> GameResult | None:
        return next((game for game in self.games if game.is_start), None)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def _same_checkpoint(anchor: str, start: str | None, run_dir: Path) -> bool:
    """Whether a games anchor names the run's init_checkpoint (a run directory or one of its checkpoints)."""
    if not start:
        return False
    candidates = {Path(start), run_dir.parent.parent / start, Path.cwd() / start}
    anchor_path = Path(anchor)
    for candidate in candidates:
        try:
            if anchor_path.resolve() == candidate.resolve() or candidate.resolve() in anchor_path.resolve().parents:
                return True
        except OSError:
            continue
    return anchor.rstrip("/") == start.rstrip("/")


def _anchor_label(anchor: dict[str, Any], is_start: bool) -> str:
    if is_start:
        return "its start (the pretrained policy)"
    name = str(anchor.get("anchor", "?"))
    return "a random mover" if name == "random" else name


def _game_results(run_dir: Path, start: str | None) -> list[GameResult]:
    results = []
    for path in sorted((run_dir / "eval").glob("games_*.json")):
        payload = _read_json(path)
        if payload is None:
            continue
        pgn = payload.get("pgn")
        pgn_path = Path(pgn) if pgn else path.with_suffix(".pgn")
        if not pgn_path.is_absolute() and not pgn_path.exists():
            pgn_path = path.with_suffix(".pgn")
        for anchor in payload.get("anchors", []):
            name = str(anchor.get("anchor", "?"))
            is_start = _same_checkpoint(name, start, run_dir)
            games = int(anchor.get("wins", 0)) + int(anchor.get("draws", 0)) + int(anchor.get("losses", 0))
            results.append(
                GameResult(
                    anchor=name, label=_anchor_label(anchor, is_start), games=games, score=anchor.get("score") or {},
                    elo=anchor.get("elo_difference") or {}, pgn=pgn_path if pgn_path.exists() else None, is_start=is_start,
                )  # fmt: skip
            )
    return results


def _step_of(path: Path) -> int:
    match = re.search(r"step_(\d+)_", path.name)
    return int(match.group(1)) if match else -1


def _puzzle_change(run_dir: Path) -> tuple[MetricComparison | None, tuple[int, int] | None]:
    files = sorted((run_dir / "eval").glob("step_*_puzzles.json"), key=_step_of)
    if len(files) < 2:
        return None, None
    try:
        comparison = compare_files(files[0], files[-1])
    except (OSError, ValueError):
        return None, None
    metric = next((m for m in comparison.metrics if m.metric == PUZZLE_METRIC), None)
    return metric, (_step_of(files[0]), _step_of(files[-1]))


def _search_puzzles(run_dir: Path) -> tuple[int, dict[str, float]] | None:
    for path in sorted((run_dir / "eval").glob("puzzles_search*.json")):
        payload = _read_json(path)
        match = re.search(r"search(\d+)", path.name)
        if payload and isinstance(payload.get(PUZZLE_METRIC), dict) and match:
            return int(match.group(1)), payload[PUZZLE_METRIC]
    return None


def run_outcome(run_dir: str | Path) -> RunOutcome:
    """Everything `RUN/eval/` says of a run (see the module doc); missing evaluations are None or empty."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {str(run_dir)!r}")
    config: dict[str, Any] = {}
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        pass
    start = config.get("init_checkpoint")
    puzzles, steps = _puzzle_change(run_dir)
    return RunOutcome(
        run_dir=run_dir, kind=str(config.get("kind", "?")), steps=config.get("steps"), start=start,
        games=tuple(_game_results(run_dir, start)), puzzles=puzzles, puzzle_steps=steps,
        search_puzzles=_search_puzzles(run_dir), value=_read_json(run_dir / "eval" / "value.json"),
    )  # fmt: skip


def _interval(x: dict[str, Any], digits: int = 3, sign: bool = False) -> str:
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{f.format(x['value'])} [{f.format(x['low'])}, {f.format(x['high'])}]"


def headline(outcome: RunOutcome) -> str:
    """One sentence: did the run get stronger than its start, in games, by how much."""
    start = outcome.against_start
    if start is None:
        if outcome.games:
            return "No games against its start were played; see the anchors below."
        return "No games were played, so strength is not measured (run `chessgrpo eval games`)."
    elo = start.elo_text()
    if start.verdict == "stronger":
        return f"Yes: stronger than its start, {elo} over {start.games} games."
    if start.verdict == "weaker":
        return f"No: weaker than its start, {elo} over {start.games} games."
    return f"Not measurably: {elo} against its start over {start.games} games (the interval contains 0)."


GRPO_KINDS = ("move_group", "trajectory", "mixture", "rookworld")


def trained_text(outcome: RunOutcome) -> str:
    """What the run trained: "400 GRPO steps (move_group) from runs/quickstart/pretrain"."""
    what = "GRPO" if outcome.kind in GRPO_KINDS else outcome.kind
    steps = f"{outcome.steps} {what} steps" if outcome.steps else f"{what} training"
    start = f" from {outcome.start}" if outcome.start else " from a random network"
    return f"{outcome.run_dir}: {steps} ({outcome.kind}){start}"


def format_outcome(outcome: RunOutcome, *, report: Path | None = None, next_steps: list[tuple[str, str]] = ()) -> str:
    """The summary's text: the headline, the three numbers with intervals, the files, what to run next."""
    what = "GRPO" if outcome.kind in GRPO_KINDS else "training"
    lines = [f"Trained: {trained_text(outcome)}", f"Did {what} help?  {headline(outcome)}", ""]
    for game in sorted(outcome.games, key=lambda g: not g.is_start):
        lines.append(f"  games vs {game.label}: {game.games} games, score {_interval(game.score)}, {game.elo_text()}")
    if outcome.puzzles is not None and outcome.puzzle_steps is not None:
        m = outcome.puzzles
        first, last = outcome.puzzle_steps
        lines.append(
            f"  puzzles, first move found ({m.a.n} Lichess puzzles): step {first} {m.a.value:.3f} -> step {last} {m.b.value:.3f}, "
            f"{m.difference.value:+.3f} [{m.difference.low:+.3f}, {m.difference.high:+.3f}] ({m.verdict})"
        )  # fmt: skip
    if outcome.search_puzzles is not None:
        nodes, rate = outcome.search_puzzles
        alone = f" (the policy alone: {outcome.puzzles.b.value:.3f})" if outcome.puzzles is not None else ""
        lines.append(f"  puzzles with a {nodes}-node search of the same network: {_interval(rate)}{alone}")
    if outcome.value is not None and isinstance(outcome.value.get("mae"), dict):
        mae, base = outcome.value["mae"], outcome.value.get("baseline_mae") or {}
        against = f" (a constant guess: {base['value']:.3f})" if "value" in base else ""
        lines.append(f"  value head error (mean absolute, expected score, {outcome.value.get('n', '?')} held-out positions): {_interval(mae)}{against}")
    if report is not None or any(g.pgn for g in outcome.games):
        lines.append("")
    if report is not None:
        lines.append(f"  report (every plot, the diagnosis): {report}")
    for game in outcome.games:
        if game.pgn is not None and game.is_start:
            lines.append(f"  games (PGN): {game.pgn}")
    if next_steps:
        lines += ["", "Next:"]
        width = max(len(what) for what, _ in next_steps)
        lines += [f"  {what:<{width}}  {command}" for what, command in next_steps]
    return "\n".join(lines)
