"""Confidence intervals for evaluation metrics: pure functions over numpy arrays.

A metric without an interval invites reading noise as progress (the predecessor systems read
32-64 games at a 3% score difference as an improvement). Every number the evaluation commands
print therefore carries an `Interval`:

- `bootstrap_interval`: percentile bootstrap of any statistic of per-item values (Efron &
  Tibshirani 1993, ch. 13). Used for move-level metrics (top-1 agreement, expected-score loss,
  blunder rate), where the items are positions.
- `paired_bootstrap_difference`: the interval of statistic(a) - statistic(b) when a and b are
  measured on the same items, resampling items jointly. Comparing two policies this way removes
  the position-to-position variance both share, so it is much tighter than two separate intervals.
- `wilson_interval`: the Wilson score interval of a binomial proportion (Wilson 1927); correct
  coverage near 0 and 1 where the normal approximation fails. Used for puzzle solve rates.

Edge cases are explicit: no items gives NaN everywhere with n=0; all-equal values give a
zero-width interval.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

Statistic = Callable[..., Any]
"""A numpy-style reducer accepting ``axis=`` (np.mean, np.median, ...)."""

# Bootstrap resamples are drawn in chunks so that at most this many values are held at once.
_MAX_RESAMPLE_ELEMENTS = 4_000_000


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval over `n` items."""

    value: float
    low: float
    high: float
    n: int

    def to_json(self) -> dict[str, float | int | None]:
        """{"value", "low", "high", "n"}; NaN (no items) becomes null so the JSON stays valid."""
        return {
            "value": _json_float(self.value),
            "low": _json_float(self.low),
            "high": _json_float(self.high),
            "n": int(self.n),
        }

    def format(self, digits: int = 3) -> str:
        """Like "0.123 [0.101, 0.147] (n=500)"; "n/a (n=0)" without items."""
        if self.n == 0 or math.isnan(self.value):
            return f"n/a (n={self.n})"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] (n={self.n})"

    def __str__(self) -> str:
        return self.format()


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _as_values(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if np.isnan(array).any():
        raise ValueError(f"{name} contain NaN; drop or fill them before computing an interval")
    return array


def _check_confidence(confidence: float, resamples: int | None = None) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if resamples is not None and (not isinstance(resamples, int) or resamples < 1):
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")


def _nan_interval() -> Interval:
    return Interval(value=math.nan, low=math.nan, high=math.nan, n=0)


def _bootstrap_statistics(
    arrays: Sequence[np.ndarray], statistic: Statistic, resamples: int, seed: int
) -> list[np.ndarray]:
    """statistic(array[idx], axis=1) for every array, with the same resampled indices idx."""
    n = len(arrays[0])
    rng = np.random.default_rng(seed)
    chunk = max(1, _MAX_RESAMPLE_ELEMENTS // n)
    out: list[list[np.ndarray]] = [[] for _ in arrays]
    for start in range(0, resamples, chunk):
        indices = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        for slot, array in enumerate(arrays):
            out[slot].append(np.asarray(statistic(array[indices], axis=1), dtype=np.float64))
    return [np.concatenate(parts) for parts in out]


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    low, high = np.quantile(samples, [alpha / 2, 1.0 - alpha / 2])
    return float(low), float(high)


def bootstrap_interval(
    values: Sequence[float] | np.ndarray,
    statistic: Statistic = np.mean,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of `statistic(values)`.

    Draws `resamples` samples of len(values) items with replacement (vectorised, seeded: the
    same inputs give the same interval) and takes the (1-confidence)/2 and (1+confidence)/2
    quantiles of the resampled statistic. `value` is the statistic of the original values.
    """
    _check_confidence(confidence, resamples)
    array = _as_values(values)
    if len(array) == 0:
        return _nan_interval()
    value = float(statistic(array))
    [samples] = _bootstrap_statistics([array], statistic, resamples, seed)
    low, high = _percentiles(samples, confidence)
    return Interval(value=value, low=low, high=high, n=len(array))


def paired_bootstrap_difference(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    statistic: Statistic = np.mean,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of statistic(a) - statistic(b), a[i] and b[i] paired.

    Items are resampled jointly (the same indices for a and b), so the variance the two share
    (hard and easy positions) cancels. Identical arrays give exactly [0, 0].
    """
    _check_confidence(confidence, resamples)
    first, second = _as_values(a, "a"), _as_values(b, "b")
    if len(first) != len(second):
        raise ValueError(f"paired values need equal lengths, got {len(first)} and {len(second)}")
    if len(first) == 0:
        return _nan_interval()
    value = float(statistic(first)) - float(statistic(second))
    samples_a, samples_b = _bootstrap_statistics([first, second], statistic, resamples, seed)
    low, high = _percentiles(samples_a - samples_b, confidence)
    return Interval(value=value, low=low, high=high, n=len(first))


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval of the proportion successes / n; `value` is successes / n.

    With z the standard normal quantile at (1 + confidence) / 2 and p = successes / n::

        centre = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z * sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)
    """
    _check_confidence(confidence)
    if isinstance(successes, bool) or isinstance(n, bool) or int(successes) != successes or int(n) != n:
        raise ValueError(f"successes and n must be integers, got {successes!r}, {n!r}")
    successes, n = int(successes), int(n)
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return _nan_interval()
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    # At p = 0 (p = 1) the lower (upper) end is exactly 0 (1); the formula leaves rounding noise.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(value=p, low=low, high=high, n=n)
