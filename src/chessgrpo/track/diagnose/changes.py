"""How a run's numbers changed: the linear trend of a training metric over the run (with a moving-block bootstrap
interval), a held-out metric's change from the first evaluation (paired on the same items where the records allow),
and the games against the run's start. The checks judge these; the report's verdict and figures draw them."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from chessgrpo.eval.registry import held_out_metrics
from chessgrpo.stats import paired_bootstrap_difference
from chessgrpo.track.diagnose.findings import Thresholds, rounded
from chessgrpo.track.run_data import AnchorResult, EvalPoint, GamesEvaluation, RunData, resolve_run_path


def linear_trend(
    steps: np.ndarray, values: np.ndarray, *, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> tuple[float, float, float]:
    """(change, low, high): the change over the steps' span of a least-squares line through (steps, values),
    with a moving-block bootstrap interval (blocks of round(n^(1/3)) consecutive points)."""
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        return math.nan, math.nan, math.nan
    span = x[-1] - x[0]

    def slopes(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        dx = xs - xs.mean(axis=-1, keepdims=True)
        dy = ys - ys.mean(axis=-1, keepdims=True)
        denominator = (dx * dx).sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denominator > 0, (dx * dy).sum(axis=-1) / denominator, np.nan)

    change = float(slopes(x, y)) * span
    block = max(1, round(n ** (1 / 3)))
    blocks = math.ceil(n / block)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n - block + 1, size=(resamples, blocks))
    index = (starts[:, :, None] + np.arange(block)).reshape(resamples, -1)[:, :n]
    samples = slopes(x[index], y[index]) * span
    samples = samples[np.isfinite(samples)]
    alpha = 1.0 - confidence
    low, high = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return change, float(low), float(high)


@dataclasses.dataclass(frozen=True)
class HeldOutChange:
    """One held-out metric at a later evaluation against the first evaluation."""

    metric: str
    step_a: int
    step_b: int
    a: float
    b: float
    difference: float
    """b - a."""
    low: float
    high: float
    paired: bool
    """True: paired bootstrap over the shared items; False: from the two points' own intervals."""
    higher_is_better: bool

    @property
    def gain(self) -> float:
        """The difference signed so that > 0 is better."""
        return self.difference if self.higher_is_better else -self.difference

    @property
    def improved(self) -> bool:
        return (self.low > 0) if self.higher_is_better else (self.high < 0)

    @property
    def worse(self) -> bool:
        return (self.high < 0) if self.higher_is_better else (self.low > 0)

    def describe(self) -> str:
        how = "paired" if self.paired else "from the two intervals"
        return (
            f"{self.metric} {self.a:.4f} -> {self.b:.4f} (step {self.step_a} -> {self.step_b}): "
            f"{self.difference:+.4f} [{self.low:+.4f}, {self.high:+.4f}] {how}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "step_a": self.step_a,
            "step_b": self.step_b,
            "a": rounded(self.a),
            "b": rounded(self.b),
            "difference": rounded(self.difference),
            "low": rounded(self.low),
            "high": rounded(self.high),
            "paired": self.paired,
        }


def heldout_change(
    run: RunData, metric: str, first: EvalPoint, later: EvalPoint, thresholds: Thresholds
) -> HeldOutChange | None:
    """`metric` at `later` against `first`: paired when both have records, else from the intervals."""
    evaluation, definition = held_out_metrics()[metric]
    field, higher = definition.record_field, definition.higher_is_better
    if metric not in first.metrics or metric not in later.metrics:
        return None
    a, b = first.metrics[metric], later.metrics[metric]
    records_a, records_b = first.records.get(evaluation.name), later.records.get(evaluation.name)
    if records_a and records_b:
        key = evaluation.item_key
        by_key = {r.get(key): r for r in records_b}
        pairs = [(r, by_key[r.get(key)]) for r in records_a if r.get(key) in by_key and field in r]
        if pairs:
            va = [float(x[field]) for x, _ in pairs]
            vb = [float(y[field]) for _, y in pairs]
            interval = paired_bootstrap_difference(
                vb, va, confidence=thresholds.confidence, resamples=thresholds.resamples
            )
            return HeldOutChange(
                metric,
                first.step,
                later.step,
                float(np.mean(va)),
                float(np.mean(vb)),
                interval.value,
                interval.low,
                interval.high,
                True,
                higher,
            )
    if not (a.has_interval and b.has_interval):
        return None
    half = math.hypot((a.high - a.low) / 2, (b.high - b.low) / 2)
    difference = b.value - a.value
    return HeldOutChange(
        metric,
        first.step,
        later.step,
        a.value,
        b.value,
        difference,
        difference - half,
        difference + half,
        False,
        higher,
    )


def heldout_changes(run: RunData, thresholds: Thresholds) -> dict[str, list[HeldOutChange]]:
    """metric -> its change at every later evaluation point against the first one."""
    if len(run.evals) < 2:
        return {}
    first = run.evals[0]
    changes: dict[str, list[HeldOutChange]] = {}
    for metric in held_out_metrics():
        for later in run.evals[1:]:
            change = heldout_change(run, metric, first, later, thresholds)
            if change is not None:
                changes.setdefault(metric, []).append(change)
    return changes


def games_against_start(run: RunData) -> tuple[GamesEvaluation, AnchorResult] | None:
    """The newest `eval games` result in the run directory whose anchor is the run's starting policy
    (`init_checkpoint`), with that anchor's row; None when there is none (e.g. `make run`'s
    eval/games_vs_pretrain.json is one). Matched by the anchor's path or by the checkpoint it loaded."""
    start = run.setting("init_checkpoint")
    if not start:
        return None
    start_path = resolve_run_path(run, str(start)) or Path(str(start)).resolve()  # found from any working directory
    for evaluation in reversed(run.games):
        for anchor in evaluation.anchors:
            anchor_path = resolve_run_path(run, anchor.anchor) or Path(anchor.anchor).resolve()
            if anchor_path == start_path or str(start_path) + "/" in anchor.settings:
                return evaluation, anchor
    return None
