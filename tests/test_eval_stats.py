"""Confidence intervals against hand-computed numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from chessgrpo.stats import Interval, bootstrap_interval, paired_bootstrap_difference, wilson_interval

Z95 = 1.959963984540054  # standard normal quantile at 0.975


def test_wilson_8_of_10_by_hand():
    # p = 0.8, n = 10, z^2 = 3.8415: centre = (0.8 + 0.19207) / 1.38415 = 0.71674,
    # half = 1.95996 * sqrt(0.016 + 0.0096036) / 1.38415 = 0.22658 -> [0.4902, 0.9433].
    interval = wilson_interval(8, 10)
    assert interval.value == 0.8 and interval.n == 10
    assert interval.low == pytest.approx(0.49016, abs=1e-4)
    assert interval.high == pytest.approx(0.94332, abs=1e-4)
    z2 = Z95**2
    centre = (0.8 + z2 / 20) / (1 + z2 / 10)
    half = Z95 * math.sqrt(0.8 * 0.2 / 10 + z2 / 400) / (1 + z2 / 10)
    assert (interval.low, interval.high) == pytest.approx((centre - half, centre + half), abs=1e-12)


def test_wilson_extremes_and_confidence():
    zero = wilson_interval(0, 10)
    assert (zero.value, zero.low) == (0.0, 0.0)
    assert zero.high == pytest.approx(Z95**2 / (10 + Z95**2), abs=1e-12)  # 0.2775: not the Wald [0, 0]
    full = wilson_interval(10, 10)
    assert full.high == 1.0 and full.low == pytest.approx(10 / (10 + Z95**2), abs=1e-12)
    assert wilson_interval(8, 10, confidence=0.99).low < wilson_interval(8, 10).low
    assert wilson_interval(800, 1000).high - wilson_interval(800, 1000).low < 0.06


def test_wilson_empty_and_invalid():
    empty = wilson_interval(0, 0)
    assert empty.n == 0 and math.isnan(empty.value) and math.isnan(empty.low) and math.isnan(empty.high)
    assert empty.to_json() == {"value": None, "low": None, "high": None, "n": 0}
    assert empty.format() == "n/a (n=0)"
    for successes, n in [(11, 10), (-1, 10), (1, -1)]:
        with pytest.raises(ValueError):
            wilson_interval(successes, n)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.0)


def test_bootstrap_of_constant_values_has_zero_width():
    interval = bootstrap_interval([0.3] * 50)
    assert (interval.value, interval.low, interval.high, interval.n) == pytest.approx((0.3, 0.3, 0.3, 50))
    single = bootstrap_interval([1.0])
    assert (single.value, single.low, single.high, single.n) == (1.0, 1.0, 1.0, 1)


def test_bootstrap_empty_is_explicit_nan():
    interval = bootstrap_interval([])
    assert interval.n == 0 and math.isnan(interval.value)
    assert json.loads(json.dumps(interval.to_json())) == {"value": None, "low": None, "high": None, "n": 0}
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_interval([0.1, float("nan")])


def test_bootstrap_contains_the_mean_matches_the_standard_error_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    small = rng.integers(0, 2, size=100).astype(float)
    large = rng.integers(0, 2, size=10_000).astype(float)
    for values in (small, large):
        interval = bootstrap_interval(values)
        assert interval.value == pytest.approx(values.mean())
        assert interval.low < interval.value < interval.high
        # Percentile bootstrap of a mean ~ mean +- 1.96 * sd / sqrt(n).
        expected_half = Z95 * values.std() / math.sqrt(len(values))
        assert (interval.high - interval.low) / 2 == pytest.approx(expected_half, rel=0.15)
    width_small = bootstrap_interval(small).high - bootstrap_interval(small).low
    width_large = bootstrap_interval(large).high - bootstrap_interval(large).low
    assert width_large < width_small / 5  # ~1/sqrt(100) ratio = 1/10


def test_bootstrap_is_seeded_and_takes_other_statistics():
    values = np.arange(20, dtype=float)
    assert bootstrap_interval(values, seed=3) == bootstrap_interval(values, seed=3)
    assert bootstrap_interval(values, seed=3) != bootstrap_interval(values, seed=4)
    median = bootstrap_interval(values, statistic=np.median)
    assert median.value == 9.5 and median.low <= 9.5 <= median.high
    assert bootstrap_interval(values, confidence=0.5).high - bootstrap_interval(values, confidence=0.5).low < (
        bootstrap_interval(values).high - bootstrap_interval(values).low
    )
    # Chunked resampling (memory bound) gives a valid interval for long inputs too.
    long = bootstrap_interval(np.ones(100_000) * 0.25, resamples=50)
    assert (long.low, long.high) == (0.25, 0.25)


def test_paired_difference_of_identical_and_shifted_arrays():
    values = np.random.default_rng(2).random(200)
    same = paired_bootstrap_difference(values, values)
    assert (same.value, same.low, same.high, same.n) == (0.0, 0.0, 0.0, 200)
    shifted = paired_bootstrap_difference(values + 0.1, values)
    assert (shifted.value, shifted.low, shifted.high) == pytest.approx((0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap_difference([1.0, 2.0], [1.0])


def test_paired_difference_is_tighter_than_separate_intervals():
    rng = np.random.default_rng(3)
    difficulty = rng.random(300)  # shared per-position variance
    a = difficulty + 0.05 + 0.01 * rng.standard_normal(300)
    b = difficulty + 0.01 * rng.standard_normal(300)
    paired = paired_bootstrap_difference(a, b)
    assert paired.value == pytest.approx(a.mean() - b.mean())
    assert paired.low > 0  # the 0.05 gain is detected ...
    separate_a, separate_b = bootstrap_interval(a), bootstrap_interval(b)
    assert separate_a.low < separate_b.high  # ... where separate intervals overlap


def test_interval_format_and_json():
    interval = Interval(value=0.123, low=0.101, high=0.147, n=500)
    assert interval.format() == "0.123 [0.101, 0.147] (n=500)"
    assert str(interval) == interval.format()
    assert interval.to_json() == {"value": 0.123, "low": 0.101, "high": 0.147, "n": 500}
