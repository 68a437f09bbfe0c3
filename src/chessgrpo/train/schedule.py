"""Learning-rate schedules as pure functions of the optimizer step (nothing to save but the step).

The training loop sets ``param_group["lr"] = schedule.lr(step)`` before every update, where
``step`` is the number of updates already done (0 for the first). Because the rate is a function
of the step alone, resuming from a checkpoint reproduces it exactly.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class WarmupCosine:
    """Linear warmup to `base_lr`, then a half cosine down to ``min_lr_ratio * base_lr``.

    For update ``s`` (0-based)::

        s < warmup_steps:  base_lr * (s + 1) / warmup_steps
        otherwise:         min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2,
                           p = min(1, (s - warmup_steps) / max(1, total_steps - warmup_steps))

    so the first update already has a non-zero rate, the peak is reached at update
    ``warmup_steps - 1`` and held for one more, and updates at or past ``total_steps`` stay at the
    floor (a run extended past its planned length does not restart the cycle).
    """

    base_lr: float
    """Peak learning rate."""
    warmup_steps: int
    """Updates of linear warmup (0 = start at the peak)."""
    total_steps: int
    """Planned number of updates; the cosine reaches its floor here."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine as a fraction of base_lr."""

    def __post_init__(self) -> None:
        if self.base_lr < 0 or self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError(f"need base_lr >= 0, warmup_steps >= 0, total_steps >= 1, got {self}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def lr(self, step: int) -> float:
        """Learning rate of update number `step` (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        min_lr = self.base_lr * self.min_lr_ratio
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return min_lr + (self.base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
