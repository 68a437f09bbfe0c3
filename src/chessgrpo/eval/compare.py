"""Paired comparison of two players evaluated on the same positions or puzzles.

Two evaluations of different checkpoints share most of their variance: a hard position is hard
for both. Pairing each position's outcome under A with its outcome under B and resampling the
pairs jointly (`stats.paired_bootstrap_difference`) cancels that shared part, so a real
improvement shows up with a much tighter interval than two independent intervals would give.
A difference whose interval contains 0 is not progress, whatever its sign.

Inputs are the JSON files written by ``chessgrpo eval offline|puzzles|endgame|games ... output=FILE`` (they
hold one record per position, puzzle or colour-swapped game pair). Which evaluation a file holds, how
its items are matched (offline and endgame records by FEN, puzzles by id, game pairs by anchor, pair
index and opening: the pentanomial unit) and which metrics are paired is the evaluation's entry in
`eval.registry`; only items present in both files are compared, and the count is reported.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chessgrpo.errors import InputError
from chessgrpo.eval.registry import comparable, recognise_records
from chessgrpo.stats import Interval, bootstrap_interval, paired_bootstrap_difference, wilson_interval


@dataclasses.dataclass(frozen=True)
class MetricComparison:
    """One metric of B against A on the same items."""

    metric: str
    a: Interval
    """A's own value with its interval (Wilson for rates, bootstrap for ESL)."""
    b: Interval
    difference: Interval
    """B - A with its paired bootstrap interval."""
    higher_is_better: bool | None
    """None for a descriptive rate (e.g. how often the first move is a check): neither direction is better."""

    @property
    def verdict(self) -> str:
        """ "better", "worse" (B against A; "higher", "lower" for a descriptive rate) or "no
        significant difference" (interval contains 0)."""
        if self.higher_is_better is None:
            return (
                "higher"
                if self.difference.low > 0
                else "lower"
                if self.difference.high < 0
                else "no significant difference"
            )
        if self.difference.low > 0:
            return "better" if self.higher_is_better else "worse"
        if self.difference.high < 0:
            return "worse" if self.higher_is_better else "better"
        return "no significant difference"

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "difference": self.difference.to_json(),
            "higher_is_better": self.higher_is_better,
            "verdict": self.verdict,
        }


@dataclasses.dataclass(frozen=True)
class Comparison:
    kind: str
    """The evaluation's name in `eval.registry` ("offline", "puzzles", "endgame", "games", ...)."""
    player_a: str
    player_b: str
    n: int
    """Items present in both evaluations (the pairs compared)."""
    metrics: tuple[MetricComparison, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "a": self.player_a,
            "b": self.player_b,
            "n": self.n,
            "metrics": {m.metric: m.to_json() for m in self.metrics},
        }


def compare_records(
    kind: str,
    records_a: Sequence[dict[str, Any]],
    records_b: Sequence[dict[str, Any]],
    *,
    player_a: str = "A",
    player_b: str = "B",
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Paired differences B - A of every metric of `kind` over the items both record lists hold."""
    kinds = {e.name: e for e in comparable()}
    if kind not in kinds:
        raise InputError(f"unknown evaluation kind {kind!r}: expected one of {', '.join(kinds)}")
    evaluation = kinds[kind]
    key = evaluation.item_key
    by_key_b = {record[key]: record for record in records_b}
    pairs = [(record, by_key_b[record[key]]) for record in records_a if record[key] in by_key_b]
    if not pairs:
        raise InputError(f"the two {kind} evaluations share no {evaluation.item_noun}")
    rows: list[tuple[str, str, bool | None, list[tuple[dict[str, Any], dict[str, Any]]]]] = [
        (metric.name, metric.field, metric.higher_is_better, pairs) for metric in evaluation.paired
    ]
    for metric in evaluation.descriptive:
        field, subset = metric.field, metric.subset
        needed = [field] + ([subset[0]] if subset else [])
        if not all(name in first and name in second for first, second in pairs for name in needed):
            continue  # written before the field existed
        kept = [(first, second) for first, second in pairs if subset is None or first[subset[0]] == subset[1]]
        if kept:
            rows.append((metric.name, field, metric.higher_is_better, kept))
    results = []
    for metric, field, higher_is_better, items in rows:
        a = [float(first[field]) for first, _ in items]
        b = [float(second[field]) for _, second in items]
        difference = paired_bootstrap_difference(b, a, confidence=confidence, resamples=resamples, seed=seed)
        own = [_own_interval(values, confidence, resamples, seed) for values in (a, b)]
        results.append(MetricComparison(metric, own[0], own[1], difference, higher_is_better))
    return Comparison(kind, player_a, player_b, len(pairs), tuple(results))


def _own_interval(values: list[float], confidence: float, resamples: int, seed: int) -> Interval:
    if all(value in (0.0, 1.0) for value in values):
        return wilson_interval(int(sum(values)), len(values), confidence)
    return bootstrap_interval(values, confidence=confidence, resamples=resamples, seed=seed)


def read_evaluation(path: str | Path) -> tuple[str, str, list[dict[str, Any]]]:
    """(kind, player name, the player's records) from an evaluation's output file (`eval.registry.recognise_records`)."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no evaluation file at {str(path)!r}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path} is not JSON: {error}") from None
    records = payload.get("records", {}).get("player") if isinstance(payload, dict) else None
    names = [e.name for e in comparable()]
    if not isinstance(records, list) or not records:
        raise InputError(
            f"{path} has no per-item records: write it with `chessgrpo eval {'|'.join(names)} ... output={path}`"
        )
    found = recognise_records(records[0])
    if found is None:
        labels = [e.records_label for e in comparable()]
        raise InputError(f"{path}: records are neither {', '.join(labels[:-1])} nor {labels[-1]} records")
    kind = found.name
    return kind, str(payload.get("player", path)), records


def compare_files(path_a: str | Path, path_b: str | Path, **options: Any) -> Comparison:
    """`compare_records` on two evaluation files of the same kind (B - A)."""
    kind_a, player_a, records_a = read_evaluation(path_a)
    kind_b, player_b, records_b = read_evaluation(path_b)
    if kind_a != kind_b:
        raise InputError(f"cannot compare a {kind_a} evaluation ({path_a}) with a {kind_b} one ({path_b})")
    return compare_records(kind_a, records_a, records_b, player_a=player_a, player_b=player_b, **options)


def format_comparison(comparison: Comparison, confidence: float = 0.95) -> str:
    """A small table: A, B, B - A [interval], verdict."""
    lines = [
        f"{comparison.kind}: B = {comparison.player_b} vs A = {comparison.player_a} on {comparison.n} shared items; "
        f"paired bootstrap {100 * confidence:g}% intervals of B - A",
        f"{'metric':<20}  {'A [interval]':<22}  {'B [interval]':<22}  {'B - A [interval]':<26}  verdict for B",
    ]
    for m in comparison.metrics:
        d = m.difference
        a, b = (f"{x.value:.3f} [{x.low:.3f}, {x.high:.3f}]" for x in (m.a, m.b))
        subset = f" (on {m.a.n} of them)" if m.a.n != comparison.n else ""
        lines.append(
            f"{m.metric:<20}  {a:<22}  {b:<22}  {f'{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]':<26}  {m.verdict}{subset}"
        )
    return "\n".join(lines)
