"""Elo from game results: pure functions, checked against hand-computed numbers (tests/test_elo.py).

Conventions (the logistic Elo model, as in FIDE/CCRL/fishtest's "logistic Elo"):

- `expected_score(d) = 1 / (1 + 10^(-d / 400))`: the expected score of a player rated d above its
  opponent; `elo_difference(s) = 400 * log10(s / (1 - s))` is its inverse.
- A draw is half a win everywhere: a player's points are wins + draws / 2.

What each interval is:

- `score_interval`: the Wilson score interval (`chessgrpo.stats.wilson_interval`) of the
  score, treating each game as one Bernoulli trial worth its points. Draws reduce the true
  per-game variance below the binomial p(1-p), so the interval is slightly conservative.
- `elo_from_score`: that interval mapped through `elo_difference` (monotone, so the Elo interval
  has exactly the coverage of the score interval). At a 0% or 100% score the point estimate is
  infinite; we report the finite end of the Wilson interval as a **bound** instead
  (`EloEstimate.bound` = "upper" or "lower") and leave the other end open (None).
- `maximum_likelihood_elo`: the rating R of the player that maximises the likelihood of all
  its games against anchors with fixed ratings r_j, each game a Bernoulli trial with success
  probability expected_score(R - r_j) worth its points (draws half; a quasi-likelihood). The
  score equation sum_j n_j E_j(R) = points is monotone in R and solved by bisection. The
  interval is the **likelihood-ratio** interval {R : 2 (L(R_hat) - L(R)) <= z^2}, which stays
  finite on the bounded side when the player won (or lost) every game: then the supremum of L
  is 0, reached only as R -> +-inf, and we report the likelihood-ratio bound as
  `EloEstimate.bound`.
- `pentanomial`: counts of colour-swapped pair scores 0, 0.5, 1, 1.5, 2 (fishtest's pentanomial
  model: the two games of a pair share an opening, so they are not independent trials).
- `sprt`: the generalised SPRT on the pentanomial frequencies, as fishtest computes it
  (Michel Van den Bergh, "Normalized Elo" notes; fishtest `stat_util.LLR_logistic`). Under each
  hypothesis Elo = elo0 / elo1 (logistic Elo per game) the pentanomial distribution is the
  maximum-likelihood one with that expected score; the LLR is the log-likelihood ratio of the
  observed pairs under the two. Wald's bounds: log(beta / (1 - alpha)) and log((1 - beta) / alpha).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from statistics import NormalDist
from typing import Literal

from chessgrpo.stats import Interval, wilson_interval

ELO_SEARCH_LIMIT = 10_000.0
"""Ratings are searched within +-this of the anchors; far beyond any real difference."""

PAIR_SCORES = (0.0, 0.5, 1.0, 1.5, 2.0)
"""The five possible points of a colour-swapped game pair (the pentanomial categories)."""

_REGULARIZATION = 1e-3
"""Added to empty pentanomial cells before the GSPRT's maximum-likelihood fit (as fishtest), so
the fitted distributions are defined after only a few pairs."""


# --------------------------------------------------------------------------------------------
# Score <-> Elo


def expected_score(elo_diff: float) -> float:
    """Expected score of a player rated `elo_diff` above its opponent (logistic model)."""
    return 1.0 / (1.0 + 10.0 ** (-elo_diff / 400.0))


def elo_difference(score: float) -> float:
    """400 * log10(s / (1 - s)): the Elo difference that predicts the score `s` in (0, 1)."""
    if not 0.0 < score < 1.0:
        raise ValueError(f"the Elo difference of a score of {score!r} is infinite; need 0 < score < 1")
    return 400.0 * math.log10(score / (1.0 - score))


def points(wins: int, draws: int, losses: int) -> float:
    """wins + draws / 2."""
    _check_counts(wins, draws, losses)
    return wins + 0.5 * draws


def _check_counts(*counts: int) -> None:
    for count in counts:
        if isinstance(count, bool) or int(count) != count or count < 0:
            raise ValueError(f"game counts must be non-negative integers, got {counts!r}")


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def score_interval(wins: int, draws: int, losses: int, confidence: float = 0.95) -> Interval:
    """The score (points / games) with its Wilson interval over the games.

    With an even number of draws the points are an integer and this is exactly
    `wilson_interval(points, n)`; with an odd number it is the same formula at the half-integer
    point total (Wilson's interval depends only on p and n).
    """
    _check_counts(wins, draws, losses)
    n = wins + draws + losses
    doubled = 2 * wins + draws
    if doubled % 2 == 0:
        return wilson_interval(doubled // 2, n, confidence)
    z = _z(confidence)
    p = doubled / (2 * n)
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    return Interval(value=p, low=max(0.0, centre - half), high=min(1.0, centre + half), n=n)


@dataclasses.dataclass(frozen=True)
class EloEstimate:
    """An Elo value with a confidence interval; open ends are None (see `bound`)."""

    value: float | None
    """The estimate; at a 0% or 100% score, the finite bound (see `bound`)."""
    low: float | None
    high: float | None
    n: int
    """Games behind the estimate."""
    bound: Literal["lower", "upper"] | None = None
    """"lower": every game was won, so only a lower bound exists and `value` is that bound
    (the true Elo is at least `value` at the stated confidence); "upper": every game was lost."""

    def to_json(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n, "bound": self.bound}

    def format(self, signed: bool = True) -> str:
        """ "+123 [+45, +201]", or "> +523 (lower bound: every game won)" at a perfect score."""
        if self.value is None:
            return f"n/a (n={self.n})"
        sign = "+" if signed else ""
        if self.bound == "lower":
            return f">= {self.value:{sign}.0f} (lower bound: every game won)"
        if self.bound == "upper":
            return f"<= {self.value:{sign}.0f} (upper bound: every game lost)"
        return f"{self.value:{sign}.0f} [{self.low:{sign}.0f}, {self.high:{sign}.0f}]"

    def __str__(self) -> str:
        return self.format()


def elo_from_score(interval: Interval) -> EloEstimate:
    """The Elo difference of a score `Interval` (e.g. `score_interval`), ends mapped one to one."""
    if interval.n == 0 or math.isnan(interval.value):
        return EloEstimate(value=None, low=None, high=None, n=interval.n)
    low = elo_difference(interval.low) if interval.low > 0.0 else None
    high = elo_difference(interval.high) if interval.high < 1.0 else None
    if interval.value >= 1.0:
        return EloEstimate(value=low, low=low, high=None, n=interval.n, bound="lower")
    if interval.value <= 0.0:
        return EloEstimate(value=high, low=None, high=high, n=interval.n, bound="upper")
    return EloEstimate(value=elo_difference(interval.value), low=low, high=high, n=interval.n)


# --------------------------------------------------------------------------------------------
# Maximum-likelihood Elo against fixed anchors


@dataclasses.dataclass(frozen=True)
class AnchorGames:
    """The player's games against one anchor of fixed rating."""

    rating: float
    points: float
    """The player's points (wins + draws / 2)."""
    games: int

    def __post_init__(self) -> None:
        if self.games < 0 or not 0.0 <= self.points <= self.games:
            raise ValueError(f"need 0 <= points <= games, got points={self.points}, games={self.games}")


def log_likelihood(rating: float, results: Sequence[AnchorGames]) -> float:
    """sum_j [p_j ln E_j + (n_j - p_j) ln(1 - E_j)], E_j = expected_score(rating - r_j)."""
    total = 0.0
    for result in results:
        d = (rating - result.rating) * math.log(10) / 400.0
        # ln E = -ln(1 + e^-d), ln(1 - E) = -ln(1 + e^d); log1p(exp()) is stable for moderate d.
        total -= result.points * _softplus(-d) + (result.games - result.points) * _softplus(d)
    return total


def _softplus(x: float) -> float:
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def _bisect(function, low: float, high: float, iterations: int = 200) -> float:
    """A root of an increasing-or-decreasing function with a sign change on [low, high]."""
    f_low = function(low)
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        f_middle = function(middle)
        if (f_middle > 0) == (f_low > 0):
            low, f_low = middle, f_middle
        else:
            high = middle
        if high - low < 1e-9:
            break
    return 0.5 * (low + high)


def maximum_likelihood_elo(results: Sequence[AnchorGames], confidence: float = 0.95) -> EloEstimate:
    """The player's rating given its games against anchors of fixed rating (see module docstring).

    Returns the maximum-likelihood rating with its likelihood-ratio interval; at a 0% or 100%
    overall score, the likelihood-ratio bound with `bound` set.
    """
    results = [result for result in results if result.games > 0]
    n = sum(result.games for result in results)
    if n == 0:
        return EloEstimate(value=None, low=None, high=None, n=0)
    z = _z(confidence)
    total_points = sum(result.points for result in results)
    lowest = min(result.rating for result in results) - ELO_SEARCH_LIMIT
    highest = max(result.rating for result in results) + ELO_SEARCH_LIMIT

    if total_points >= n:  # every game won: L rises towards its supremum 0 as R -> +inf
        bound = _bisect(lambda r: log_likelihood(r, results) + z * z / 2, lowest, highest)
        return EloEstimate(value=bound, low=bound, high=None, n=n, bound="lower")
    if total_points <= 0:
        bound = _bisect(lambda r: log_likelihood(r, results) + z * z / 2, lowest, highest)
        return EloEstimate(value=bound, low=None, high=bound, n=n, bound="upper")

    def excess(rating: float) -> float:  # expected minus actual points: increasing in rating
        return sum(r.games * expected_score(rating - r.rating) for r in results) - total_points

    best = _bisect(excess, lowest, highest)
    threshold = log_likelihood(best, results) - z * z / 2
    low = _bisect(lambda r: log_likelihood(r, results) - threshold, lowest, best)
    high = _bisect(lambda r: log_likelihood(r, results) - threshold, best, highest)
    return EloEstimate(value=best, low=low, high=high, n=n)


# --------------------------------------------------------------------------------------------
# Game pairs


def pentanomial(pair_points: Iterable[float]) -> tuple[int, int, int, int, int]:
    """Counts of pairs that scored 0, 0.5, 1, 1.5 and 2 points (the player's points per pair)."""
    counts = [0] * 5
    for value in pair_points:
        doubled = 2 * value
        if doubled != int(doubled) or not 0 <= doubled <= 4:
            raise ValueError(f"a game pair scores 0, 0.5, 1, 1.5 or 2 points, got {value!r}")
        counts[int(doubled)] += 1
    return tuple(counts)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# SPRT


@dataclasses.dataclass(frozen=True)
class SprtResult:
    """The state of a sequential probability ratio test between H0: elo = elo0 and H1: elo = elo1."""

    llr: float
    lower: float
    """log(beta / (1 - alpha)): at or below it, H0 is accepted."""
    upper: float
    """log((1 - beta) / alpha): at or above it, H1 is accepted."""
    elo0: float
    elo1: float
    alpha: float
    beta: float
    pairs: tuple[int, int, int, int, int]

    @property
    def decision(self) -> Literal["H0", "H1"] | None:
        """ "H1" (elo >= elo1 accepted), "H0" (elo <= elo0 accepted) or None (keep playing)."""
        if self.llr >= self.upper:
            return "H1"
        if self.llr <= self.lower:
            return "H0"
        return None

    def to_json(self) -> dict:
        return {
            "llr": self.llr,
            "lower": self.lower,
            "upper": self.upper,
            "elo0": self.elo0,
            "elo1": self.elo1,
            "alpha": self.alpha,
            "beta": self.beta,
            "pentanomial": list(self.pairs),
            "decision": self.decision,
        }

    def format(self) -> str:
        verdict = {
            "H1": f"H1 accepted (elo >= {self.elo1:g})",
            "H0": f"H0 accepted (elo <= {self.elo0:g})",
            None: "undecided",
        }[self.decision]
        return (
            f"SPRT elo0={self.elo0:g} elo1={self.elo1:g} alpha={self.alpha:g} beta={self.beta:g}: "
            f"LLR {self.llr:.2f} in [{self.lower:.2f}, {self.upper:.2f}] after {sum(self.pairs)} pairs -> {verdict}"
        )


def sprt_bounds(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's (lower, upper) LLR bounds: log(beta / (1 - alpha)), log((1 - beta) / alpha)."""
    if not (0.0 < alpha < 0.5 and 0.0 < beta < 0.5):
        raise ValueError(f"alpha and beta must be in (0, 0.5), got {alpha!r}, {beta!r}")
    return math.log(beta / (1.0 - alpha)), math.log((1.0 - beta) / alpha)


def _fit_with_mean(frequencies: Sequence[float], values: Sequence[float], mean: float) -> list[float]:
    """The distribution p maximising sum f_k log p_k subject to sum p_k v_k = mean.

    p_k = f_k / (1 + theta (v_k - mean)), with theta the root of
    sum_k f_k (v_k - mean) / (1 + theta (v_k - mean)) = 0 (decreasing in theta); the root also
    makes sum_k p_k = 1. Needs min(v) < mean < max(v) over cells with f_k > 0.
    """
    deviations = [v - mean for v in values]
    # 1 + theta * d_k > 0 for every cell: theta in (-1 / max d, -1 / min d).
    low = -1.0 / max(deviations) * (1 - 1e-12)
    high = -1.0 / min(deviations) * (1 - 1e-12)
    theta = _bisect(lambda t: sum(f * d / (1.0 + t * d) for f, d in zip(frequencies, deviations)), low, high)
    return [f / (1.0 + theta * d) for f, d in zip(frequencies, deviations)]


def sprt(pairs: Sequence[int], elo0: float, elo1: float, alpha: float = 0.05, beta: float = 0.05) -> SprtResult:
    """The GSPRT log-likelihood ratio of pentanomial pair counts (see the module docstring).

    `pairs` are the counts of pair scores 0, 0.5, 1, 1.5, 2 (`pentanomial`); elo0 < elo1 are
    logistic Elo differences per game.
    """
    if len(pairs) != 5:
        raise ValueError(f"pentanomial counts have 5 cells, got {len(pairs)}")
    _check_counts(*pairs)
    if not elo0 < elo1:
        raise ValueError(f"need elo0 < elo1, got elo0={elo0}, elo1={elo1}")
    lower, upper = sprt_bounds(alpha, beta)
    counts = tuple(int(c) for c in pairs)
    llr = 0.0
    if sum(counts) > 0:
        regularised = [c if c > 0 else _REGULARIZATION for c in counts]
        total = sum(regularised)
        frequencies = [c / total for c in regularised]
        values = [score / 2.0 for score in PAIR_SCORES]  # per-game score of a pair: 0 .. 1
        p0 = _fit_with_mean(frequencies, values, expected_score(elo0))
        p1 = _fit_with_mean(frequencies, values, expected_score(elo1))
        llr = sum(c * math.log(b / a) for c, a, b in zip(regularised, p0, p1))
    return SprtResult(llr=llr, lower=lower, upper=upper, elo0=elo0, elo1=elo1, alpha=alpha, beta=beta, pairs=counts)  # type: ignore[arg-type]
