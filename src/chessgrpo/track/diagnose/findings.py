"""What a diagnosis finding is (`Finding`), the thresholds every check reads (`Thresholds`), and the small helpers
the checks build their evidence with (rounded numbers, finite series, the rows that took an optimizer step)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from chessgrpo.track.run_data import RunData

SEVERITIES = ("critical", "warning", "info")
SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}
"""Severity -> its place in a sorted list of findings (critical first)."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One diagnosis: what (`id`, `message`), how bad (`severity`), the numbers, what to change."""

    id: str
    """Stable dotted name, e.g. ``ratio.first_minibatch`` (docs/diagnose.md lists them)."""
    severity: str
    """"critical", "warning" or "info"."""
    message: str
    """One or two sentences: what is wrong, with the key numbers."""
    evidence: dict[str, Any]
    """The numbers and steps behind the message (JSON-serialisable)."""
    advice: str
    """What to change."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"severity must be one of {list(SEVERITIES)}, got {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "evidence": jsonable(self.evidence),
            "advice": self.advice,
        }


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Every threshold of the checks, with its default."""

    ratio_tolerance: float | None = None
    """|ratio - 1| allowed on the first minibatch; None = the run's grpo.ratio_tolerance(_bf16) (1e-4 fp32)."""
    share_dominant: float = 0.5
    """A regularizer term "dominates" a step when its |value| is more than this share of the sum of |terms|."""
    most_of_run: float = 0.5
    """"Most of the run": more than this fraction of the logged training steps."""
    share_warning: float = 0.75
    """Median share of the entropy or KL term from which the loss-budget finding is a warning (info below)."""
    share_critical: float = 0.9
    """... and from which it is critical (the predecessor's entropy bonus was 95% of its loss)."""
    pinned_fraction: float = 0.5
    """Fraction of adaptive-KL updates at a bound (kl/frac_at_max or kl/frac_at_min) that is "pinned"."""
    min_controller_steps: int = 10
    """Fewest training steps before the KL controller is judged."""
    inert_ratio: float = 1.01
    """An adaptive coefficient whose max/min over the run stays below this never moved."""
    min_trend_steps: int = 50
    """Fewest training steps (or steps between evaluations) before "no learning" is a warning (info below)."""
    confidence: float = 0.95
    """Confidence of every interval."""
    resamples: int = 1000
    """Bootstrap resamples for trends and paired evaluation differences."""
    near_uniform_ratio: float = 0.95
    """entropy / ln(#legal) at or above this (median over the last half of the run) is a near-uniform policy."""
    collapse_entropy: float = 0.1
    """Entropy in nats at or below this (median over the last quarter of the run) is a collapsed policy."""
    zero_std_fraction: float = 0.5
    """Median rollout/frac_reward_zero_std above this: most groups carry no signal (warning)."""
    zero_std_critical: float = 0.9
    """... at or above this: almost no group carries signal (critical)."""
    spike_z: float = 6.0
    """Robust z-score (median/MAD of log grad_norm) above which a step is a gradient-norm spike."""
    spike_ratio: float = 5.0
    """A spike must also be this many times the median grad_norm."""
    spike_ratio_warning: float = 100.0
    """A spike this many times the median is a warning even with gradient clipping on."""
    min_spike_rows: int = 20
    """Fewest training rows before spikes are looked for."""
    negative_kl: float = -1e-6
    """kl/min, kl/value or kl/exact below this is a negative KL estimate."""
    low_cache_hit: float = 0.1
    """Median perf/cache_hit_rate over the second half of the run below this is low (info)."""
    phase_dominant: float = 0.8
    """A phase (sample, reward, learn) taking more than this share of perf/step_s dominates (info)."""
    lm_distinct_ratio: float = 0.8
    """Chess LM: distinct greedy B: moves at the last evaluation / at the first below this is a collapse."""
    lm_share_rise: float = 0.15
    """Chess LM: the most common greedy B: move's share rising by this much (absolute) is a collapse."""
    endgame_piece_floor: float = 0.05
    """Endgame runs: a piece type (other than the king) making less than this share of the policy's held-out moves
    at the last evaluation has vanished as a class (the king-only optimum)."""
    endgame_win_lost: float = 0.10
    """Endgame runs: wins given away (drawn by repetition, stalemate, material, 50 moves) in at least this share of
    the held-out games at the last evaluation is a warning."""


Check = Callable[[RunData, Thresholds], list[Finding]]


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def rounded(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}") if math.isfinite(value) else value


def steps_where(steps: np.ndarray, mask: np.ndarray | None = None, limit: int = 10) -> list[int]:
    chosen = steps if mask is None else steps[mask]
    return [int(s) for s in chosen[:limit]]


def finite_series(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(values)
    return steps[keep], values[keep]


def learning_rows(run: RunData) -> list[dict[str, Any]]:
    """Training rows that took an optimizer step (DAPO dynamic sampling may skip one)."""
    return [row for row in run.train_rows if row.get("loss/skipped", 0.0) != 1.0]


def pct(value: float) -> str:
    return f"{100 * value:.0f}%"
