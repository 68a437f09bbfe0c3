"""Elo, score intervals, pentanomial counts and SPRT against hand-computed numbers."""

from __future__ import annotations

import math
import random

import pytest

from chessgrpo.play.elo import (
    AnchorGames,
    elo_difference,
    elo_from_score,
    expected_score,
    log_likelihood,
    maximum_likelihood_elo,
    pentanomial,
    points,
    score_interval,
    sprt,
    sprt_bounds,
)
from chessgrpo.stats import wilson_interval

Z95 = 1.959963984540054


def test_expected_score_and_elo_difference_by_hand():
    assert expected_score(0) == 0.5
    assert expected_score(400) == pytest.approx(10 / 11)  # 1 / (1 + 10^-1)
    assert expected_score(-400) == pytest.approx(1 / 11)
    assert elo_difference(0.75) == pytest.approx(400 * math.log10(3))  # 190.85
    assert elo_difference(0.75) == pytest.approx(190.848, abs=1e-3)
    assert elo_difference(0.25) == pytest.approx(-190.848, abs=1e-3)
    assert elo_difference(expected_score(123.4)) == pytest.approx(123.4)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="infinite"):
            elo_difference(bad)


def test_score_interval_counts_draws_as_half_points():
    assert points(6, 4, 0) == 8.0
    # 6 wins, 4 draws, 0 losses = 8 of 10 points: exactly Wilson(8, 10) = [0.4902, 0.9433].
    interval = score_interval(6, 4, 0)
    assert interval == wilson_interval(8, 10)
    assert (interval.low, interval.high) == pytest.approx((0.49016, 0.94332), abs=1e-4)
    # 5 wins, 1 draw, 4 losses = 5.5 / 10: Wilson's formula at p = 0.55, n = 10:
    # centre = (0.55 + 0.19207) / 1.38415 = 0.53612; half = 1.95996 * sqrt(0.02475 + 0.0096036) / 1.38415 = 0.26245.
    odd = score_interval(5, 1, 4)
    assert odd.value == 0.55 and odd.n == 10
    assert (odd.low, odd.high) == pytest.approx((0.27367, 0.79857), abs=1e-4)
    # Between the integer neighbours 5/10 and 6/10.
    assert wilson_interval(5, 10).low < odd.low < wilson_interval(6, 10).low
    with pytest.raises(ValueError):
        score_interval(-1, 0, 3)
    assert score_interval(0, 0, 0).n == 0


def test_elo_from_score_maps_the_interval_and_bounds_perfect_scores():
    # 30 of 40 points: +190.85, ends mapped through the same formula.
    interval = score_interval(30, 0, 10)
    estimate = elo_from_score(interval)
    assert estimate.value == pytest.approx(190.848, abs=1e-3)
    assert estimate.low == pytest.approx(elo_difference(interval.low))
    assert estimate.high == pytest.approx(elo_difference(interval.high))
    assert estimate.bound is None and "+191 [" in estimate.format()
    # 10 of 10: Wilson low = 10 / (10 + z^2) = 0.72246 -> at least 400 log10(0.72246 / 0.27754) = +166.2.
    perfect = elo_from_score(score_interval(10, 0, 0))
    assert perfect.bound == "lower" and perfect.high is None
    assert perfect.value == perfect.low == pytest.approx(166.2, abs=0.1)
    assert math.isfinite(perfect.value) and ">= +166" in perfect.format()
    zero = elo_from_score(score_interval(0, 0, 10))
    assert zero.bound == "upper" and zero.low is None and zero.value == pytest.approx(-166.2, abs=0.1)
    assert zero.to_json() == {"value": zero.value, "low": None, "high": zero.value, "n": 10, "bound": "upper"}
    assert elo_from_score(score_interval(0, 0, 0)).value is None


def test_maximum_likelihood_elo_by_hand():
    # One anchor: the ML rating is the anchor's plus elo_difference(score).
    single = maximum_likelihood_elo([AnchorGames(rating=1000, points=30, games=40)])
    assert single.value == pytest.approx(1000 + 190.848, abs=1e-3)
    # Anchors at 0 and 400, 10 points from 20 games: at R = 200 the expected scores are
    # 0.7597 and 0.2403, summing to exactly 10 points, whatever the split.
    for split in ((7, 3), (5, 5), (9, 1)):
        both = maximum_likelihood_elo([AnchorGames(0, split[0], 10), AnchorGames(400, split[1], 10)])
        assert both.value == pytest.approx(200.0, abs=1e-6)
    # Likelihood-ratio interval: L drops by z^2 / 2 at both ends.
    estimate = maximum_likelihood_elo([AnchorGames(0, 7, 10), AnchorGames(400, 3, 10)])
    results = [AnchorGames(0, 7, 10), AnchorGames(400, 3, 10)]
    peak = log_likelihood(estimate.value, results)
    for end in (estimate.low, estimate.high):
        assert log_likelihood(end, results) == pytest.approx(peak - Z95**2 / 2, abs=1e-6)
    # With many games it matches the Wald interval: 400 games at 50%: SE = (400 / ln 10) / sqrt(400 * 0.25) = 17.37 Elo.
    wide = maximum_likelihood_elo([AnchorGames(0, 200, 400)])
    assert wide.value == pytest.approx(0.0, abs=1e-6)
    assert (wide.low, wide.high) == pytest.approx((-Z95 * 17.372, Z95 * 17.372), abs=0.3)


def test_maximum_likelihood_elo_clamps_perfect_scores_to_a_bound():
    # 10 wins against an anchor rated 0: L(R) = 10 ln E(R) rises to 0; the bound has
    # 10 ln E = -z^2 / 2 -> E = exp(-0.19207) = 0.82525 -> 400 log10(0.82525 / 0.17475) = +269.7.
    won = maximum_likelihood_elo([AnchorGames(0, 10, 10)])
    assert won.bound == "lower" and won.high is None
    assert won.value == pytest.approx(269.7, abs=0.1)
    lost = maximum_likelihood_elo([AnchorGames(0, 0, 10), AnchorGames(100, 0, 10)])
    assert lost.bound == "upper" and lost.low is None and math.isfinite(lost.value) and lost.value < 0
    assert maximum_likelihood_elo([]).value is None
    with pytest.raises(ValueError):
        AnchorGames(0, 11, 10)


def test_pentanomial_counts():
    assert pentanomial([0, 0.5, 1, 1, 2, 1.5]) == (1, 1, 2, 1, 1)
    assert pentanomial([]) == (0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        pentanomial([0.25])
    with pytest.raises(ValueError):
        pentanomial([2.5])


def test_sprt_bounds_and_normal_approximation():
    lower, upper = sprt_bounds(0.05, 0.05)
    assert lower == pytest.approx(math.log(0.05 / 0.95)) == pytest.approx(-2.9444, abs=1e-4)
    assert upper == pytest.approx(2.9444, abs=1e-4)
    assert sprt([0, 0, 0, 0, 0], 0, 10).llr == 0.0
    # For small Elo differences the GSPRT is close to fishtest's normal approximation
    # LLR ~ N (s1 - s0)(2 m - s0 - s1) / (2 var), with N pairs, m the mean per-game score of a pair
    # and var its variance. Counts (10, 20, 40, 20, 10): m = 0.5, var = 2 (0.1 * 0.25 + 0.2 * 0.0625) = 0.075.
    s0, s1 = expected_score(0), expected_score(10)
    approx = 100 * (s1 - s0) * (2 * 0.5 - s0 - s1) / (2 * 0.075)
    result = sprt([10, 20, 40, 20, 10], 0, 10)
    assert approx == pytest.approx(-0.138, abs=1e-3)
    assert result.llr == pytest.approx(approx, rel=0.02)
    assert result.decision is None
    # A lopsided record decides.
    assert sprt([0, 2, 10, 40, 48], 0, 50).decision == "H1"
    assert sprt([48, 40, 10, 2, 0], 0, 50).decision == "H0"
    with pytest.raises(ValueError):
        sprt([1, 2, 3], 0, 10)
    with pytest.raises(ValueError):
        sprt([1, 1, 1, 1, 1], 10, 0)


def _simulate(
    true_elo: float, elo0: float, elo1: float, rng: random.Random, draw_rate: float = 0.3, max_pairs: int = 3000
):
    """Play simulated colour-swapped pairs until the SPRT decides; returns the decision and pairs."""
    score = expected_score(true_elo)
    win = score - draw_rate / 2  # expected score = win + draw / 2
    counts = [0] * 5
    for pair in range(1, max_pairs + 1):
        total = 0.0
        for _ in range(2):
            u = rng.random()
            total += 1.0 if u < win else 0.5 if u < win + draw_rate else 0.0
        counts[int(2 * total)] += 1
        result = sprt(counts, elo0, elo1, 0.05, 0.05)
        if result.decision is not None:
            return result.decision, pair
    return None, max_pairs


def test_sprt_on_simulated_results_decides_correctly_most_of_the_time():
    rng = random.Random(1234)
    runs = 30
    strong = [_simulate(150, 0, 50, rng) for _ in range(runs)]
    weak = [_simulate(-100, 0, 50, rng) for _ in range(runs)]
    assert sum(decision == "H1" for decision, _ in strong) >= 0.9 * runs
    assert sum(decision == "H0" for decision, _ in weak) >= 0.9 * runs
    # It stops early: far fewer pairs than the cap.
    assert max(pairs for _, pairs in strong + weak) < 1000
