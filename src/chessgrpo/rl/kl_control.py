"""`KLController`: the KL coefficient over training, and how long it sat at its bounds.

Schedules (``GRPOConfig.kl_schedule``):

- ``fixed``: coef = kl_coef.
- ``warmup``: coef = kl_coef * min(1, s / kl_warmup_steps) after s updates (0 at the first step).
- ``adaptive`` (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences"):
  e = clip(observed_kl / kl_target - 1, -0.2, 0.2); coef *= 1 + e * n_steps / kl_horizon;
  coef is clamped to [kl_coef_min, kl_coef_max]; it starts at kl_coef.

A predecessor system's adaptive controller sat at its maximum for a whole run and nobody noticed,
so the controller counts the updates that end pinned at a bound (``kl/frac_at_min``,
``kl/frac_at_max``) and logs a warning when it stays pinned for `PINNED_WARNING_STEPS` updates in a
row. Pinning is only counted for the adaptive schedule; a fixed coefficient is not "pinned".
"""

from __future__ import annotations

import logging
import math
from typing import Any

from chessgrpo.rl.config import KL_SCHEDULES, GRPOConfig

logger = logging.getLogger(__name__)

PINNED_WARNING_STEPS = 100
"""Consecutive updates at a bound after which the adaptive controller logs a warning."""


class KLController:
    """The KL coefficient of one run; `update` once per training step, `state_dict` for resume."""

    def __init__(
        self,
        schedule: str = "fixed",
        kl_coef: float = 0.0,
        *,
        warmup_steps: int = 0,
        target: float = 0.01,
        horizon: int = 10000,
        coef_min: float = 0.0,
        coef_max: float = 1.0,
    ):
        if schedule not in KL_SCHEDULES:
            raise ValueError(f"kl_schedule must be one of {list(KL_SCHEDULES)}, got {schedule!r}")
        if schedule == "warmup" and warmup_steps < 1:
            raise ValueError(f"warmup schedule needs warmup_steps >= 1, got {warmup_steps}")
        if schedule == "adaptive" and not (kl_coef > 0 and coef_min <= kl_coef <= coef_max):
            raise ValueError(
                f"adaptive schedule needs 0 < kl_coef in [coef_min, coef_max]; "
                f"got {kl_coef} and [{coef_min}, {coef_max}]"
            )
        if target <= 0 or horizon < 1 or kl_coef < 0:
            raise ValueError(f"need target > 0, horizon >= 1, kl_coef >= 0; got {target}, {horizon}, {kl_coef}")
        self.schedule = schedule
        self.kl_coef = float(kl_coef)
        self.warmup_steps = int(warmup_steps)
        self.target = float(target)
        self.horizon = int(horizon)
        self.coef_min = float(coef_min)
        self.coef_max = float(coef_max)
        self._adaptive_coef = float(kl_coef)
        self.steps = 0
        """Number of `update` calls so far."""
        self.steps_at_min = 0
        """Updates after which the adaptive coefficient sat at coef_min."""
        self.steps_at_max = 0
        """Updates after which the adaptive coefficient sat at coef_max."""
        self._pinned_streak = 0

    @classmethod
    def from_config(cls, config: GRPOConfig) -> KLController:
        return cls(
            config.kl_schedule,
            config.kl_coef,
            warmup_steps=config.kl_warmup_steps,
            target=config.kl_target,
            horizon=config.kl_horizon,
            coef_min=config.kl_coef_min,
            coef_max=config.kl_coef_max,
        )

    @property
    def coef(self) -> float:
        """The coefficient to use for the next training step."""
        if self.schedule == "fixed":
            return self.kl_coef
        if self.schedule == "warmup":
            return self.kl_coef * min(1.0, self.steps / self.warmup_steps)
        return self._adaptive_coef

    def update(self, observed_kl: float | None, n_steps: int = 1) -> None:
        """Advance one training step having observed `observed_kl` (mean per-token KL).

        `n_steps` is the adaptive controller's step size in the units of kl_horizon (samples in
        Ziegler et al.; the learner passes the number of rollout rows). `observed_kl` may be None
        (nothing measured) only for the fixed and warmup schedules.
        """
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps}")
        self.steps += 1
        if self.schedule != "adaptive":
            return
        if observed_kl is None or not math.isfinite(observed_kl):
            raise ValueError(f"the adaptive KL controller needs a finite observed KL, got {observed_kl!r}")
        error = min(max(observed_kl / self.target - 1.0, -0.2), 0.2)
        coef = self._adaptive_coef * (1.0 + error * n_steps / self.horizon)
        self._adaptive_coef = min(max(coef, self.coef_min), self.coef_max)
        at_min = self._adaptive_coef <= self.coef_min
        at_max = self._adaptive_coef >= self.coef_max
        self.steps_at_min += int(at_min)
        self.steps_at_max += int(at_max)
        self._pinned_streak = self._pinned_streak + 1 if (at_min or at_max) else 0
        if self._pinned_streak == PINNED_WARNING_STEPS:
            bound = "kl_coef_max" if at_max else "kl_coef_min"
            logger.warning(
                "adaptive KL coefficient has sat at %s = %g for %d updates (last observed KL %g, target %g): "
                "the controller cannot reach its target; revisit kl_target or the bounds",
                bound,
                self._adaptive_coef,
                self._pinned_streak,
                observed_kl,
                self.target,
            )

    def metrics(self) -> dict[str, float]:
        """``kl/coef`` (the next step's coefficient), ``kl/frac_at_min``, ``kl/frac_at_max``."""
        steps = max(self.steps, 1)
        return {
            "kl/coef": self.coef,
            "kl/frac_at_min": self.steps_at_min / steps,
            "kl/frac_at_max": self.steps_at_max / steps,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly (plain Python numbers)."""
        return {
            "schedule": self.schedule,
            "adaptive_coef": self._adaptive_coef,
            "steps": self.steps,
            "steps_at_min": self.steps_at_min,
            "steps_at_max": self.steps_at_max,
            "pinned_streak": self._pinned_streak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict`; the schedule must match this controller's."""
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(f"KL controller state has keys {sorted(state)}, expected {sorted(expected)}")
        if state["schedule"] != self.schedule:
            raise ValueError(
                f"KL controller state was saved with schedule {state['schedule']!r} but this run uses "
                f"{self.schedule!r}; start the controller fresh instead of loading it"
            )
        self._adaptive_coef = float(state["adaptive_coef"])
        self.steps = int(state["steps"])
        self.steps_at_min = int(state["steps_at_min"])
        self.steps_at_max = int(state["steps_at_max"])
        self._pinned_streak = int(state["pinned_streak"])

    def __repr__(self) -> str:
        return f"KLController(schedule={self.schedule!r}, coef={self.coef:.6g}, steps={self.steps})"
