"""What an engine anchor actually ran, measured from its ``info`` lines, against the limit it was asked.

An engine may not keep the limit it is given: Ethereal 12 answers ``go nodes 200`` after depth 1
and ~6 nodes, so "+108 Elo vs Ethereal 12.00" would be a result against a far weaker player than
the name says. `EngineMover` keeps, for each of its moves, the depth and nodes of its last
``info`` lines and the move's wall time (`MoveSearch`); `anchor_run` sums a match's moves up
(median and mean depth and nodes per move, the share of moves that reported nodes, the median
time) and judges the asked limit (`judge`):

- ``nodes=N``: kept when the median nodes per move is within N/4 .. 4N + 200 (engines finish the
  iteration they are in, and Stockfish completes depth ~2, 40-100 nodes, before it first looks at
  a node limit); below it the engine stopped early (Ethereal's depth 1), above it searched on;
  no nodes reported on most moves is "not reported", also a warning;
- ``depth=D``: kept when the median depth reported is D;
- ``movetime=MS``: kept when the median wall time per move is within MS/4 .. 2 MS + 100 ms;
- a clock alone: nothing to judge per move (a clock is kept or the side loses on time);
- a clock and a limit: searching beyond the limit is ignoring it; stopping below it is not (the
  clock came first, as it should: "the clock came first", no warning).

The result's ``line`` is what the table prints, e.g.
"Ethereal 12.00 (asked nodes=200; ran depth 1, ~6 nodes/move: limit ignored)".
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from typing import Any

NODES_LOW_SHARE = 0.25
NODES_HIGH_FACTOR = 4
NODES_HIGH_SLACK = 200
MOVETIME_HIGH_SLACK_S = 0.1


@dataclasses.dataclass(frozen=True)
class MoveSearch:
    """One engine move: the depth and nodes of its last ``info`` lines (None when not reported) and its wall time."""

    depth: int | None
    nodes: int | None
    seconds: float


def pack(moves: Iterable[MoveSearch]) -> dict[str, list]:
    """A game's moves as JSON-friendly columns (GameResult.anchor_search)."""
    moves = list(moves)
    return {
        "depth": [m.depth for m in moves],
        "nodes": [m.nodes for m in moves],
        "seconds": [round(m.seconds, 4) for m in moves],
    }


def unpack(columns: dict[str, list] | None) -> list[MoveSearch]:
    """The inverse of `pack` (an empty list for None)."""
    if not columns:
        return []
    return [MoveSearch(d, n, s) for d, n, s in zip(columns["depth"], columns["nodes"], columns["seconds"])]


def judge(
    kind: str, value: int | None, depth: float | None, nodes: float | None, seconds: float | None, clocked: bool = False
) -> tuple[bool | None, str]:
    """(kept, why) for the asked limit (`kind`, `value`) given the medians; kept None = nothing to judge.
    `clocked`: the engine also had a clock, which may stop it below its limit."""
    kept, why = _judge_limit(kind, value, depth, nodes, seconds)
    if (
        clocked
        and kept is False
        and ("below" in why or (kind == "depth" and depth is not None and depth < (value or 0)))
    ):
        return None, "the clock came first"
    return kept, why


def _judge_limit(
    kind: str, value: int | None, depth: float | None, nodes: float | None, seconds: float | None
) -> tuple[bool | None, str]:
    if kind == "nodes" and value is not None:
        if nodes is None:
            return False, "did not report nodes"
        if nodes < NODES_LOW_SHARE * value:
            return False, "limit ignored: stopped far below it"
        if nodes > NODES_HIGH_FACTOR * value + NODES_HIGH_SLACK:
            return False, "limit ignored: searched far beyond it"
        return True, "limit kept"
    if kind == "depth" and value is not None:
        if depth is None:
            return False, "did not report depth"
        return (True, "limit kept") if depth == value else (False, "limit ignored: another depth")
    if kind == "movetime" and value is not None and seconds is not None:
        asked_s = value / 1000
        if seconds < NODES_LOW_SHARE * asked_s:
            return False, "limit ignored: moved far below it"
        if seconds > 2 * asked_s + MOVETIME_HIGH_SLACK_S:
            return False, "limit ignored: took far beyond it"
        return True, "limit kept"
    return None, "on the clock"


def anchor_run(
    name: str, asked: tuple[str, int | None], asked_text: str, moves: list[MoveSearch], clocked: bool = False
) -> dict[str, Any]:
    """The summary of `moves` (every move the anchor made in a match) against what it was `asked`
    (`clocked`: on a clock too, see `judge`)."""
    depths = [m.depth for m in moves if m.depth is not None]
    nodes = [m.nodes for m in moves if m.nodes is not None]
    seconds = [m.seconds for m in moves]
    reported = len(nodes) / len(moves) if moves else 0.0
    depth_median = statistics.median(depths) if depths else None
    nodes_median = statistics.median(nodes) if nodes and reported >= 0.5 else None
    seconds_median = statistics.median(seconds) if seconds else None
    kept, why = judge(*asked, depth_median, nodes_median, seconds_median, clocked) if moves else (None, "no moves")
    ran = []
    if depth_median is not None:
        ran.append(f"depth {depth_median:g}")
    ran.append(f"~{nodes_median:.0f} nodes/move" if nodes_median is not None else "nodes not reported")
    if seconds_median is not None:
        ran.append(f"{1000 * seconds_median:.0f} ms/move")
    verdict = f": {why}" if kept is not None or why == "the clock came first" else ""
    line = f"{name} (asked {asked_text}; ran {', '.join(ran)}{verdict})"
    return {
        "asked": asked_text,
        "moves": len(moves),
        "depth_median": depth_median,
        "depth_mean": round(statistics.fmean(depths), 2) if depths else None,
        "nodes_median": nodes_median,
        "nodes_mean": round(statistics.fmean(nodes), 1) if nodes else None,
        "nodes_reported": round(reported, 3),
        "seconds_median": round(seconds_median, 4) if seconds_median is not None else None,
        "kept": kept,
        "verdict": why,
        "line": line,
        "warning": None
        if kept is not False
        else f"WARNING: {line}; the result is against what it ran, not what it was asked",
    }
