"""The spine's optimizer update (`Learner`): what a kind's step calls for every optimizer update.

Backward (with gradient accumulation over micro-batches), clipping, the step; a non-finite loss or
gradient skips the update with `rl.NonFiniteError`, agreed on by every data-parallel rank. This is
the one update of the project: `rl.optimize` takes its `update` callable, and tests and benches use
it too.
"""

from __future__ import annotations

import math

import torch

from chessgrpo.rl.invariants import NonFiniteError, check_finite
from chessgrpo.rl.learner import clip_grad_norm
from chessgrpo.train.distributed import Parallel


class Learner:
    """What a kind's step calls for every optimizer update: backward, clipping, the step.

    `update` raises `NonFiniteError` (and takes no step) when the loss or gradient is not finite;
    the debug hook turns the loss into NaN on the steps it names.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        parameters: list[torch.nn.Parameter],
        max_grad_norm: float,
        parallel: Parallel | None = None,
    ):
        self.optimizer = optimizer
        self.parameters = parameters
        self.max_grad_norm = max_grad_norm
        self.parallel = parallel or Parallel()
        self.inject_nonfinite = False
        self._pending_nonfinite = False
        """A micro-batch loss of the minibatch being accumulated was not finite (checked at its step)."""
        self._accumulating = False
        """Gradients of earlier micro-batches of this step are in .grad (else .grad is stale: cleared first)."""

    def update(self, loss: torch.Tensor, *, step: bool = True) -> float:
        """backward(loss), clip, optimizer step; returns the gradient norm before clipping.

        With ``step=False`` only backward(loss) into the accumulated gradients (a micro-batch of
        gradient accumulation; returns nan); the next ``step=True`` call adds its loss, then clips
        and steps once. A non-finite micro-batch loss is remembered and skips that whole step.

        In a data-parallel run every rank calls this the same number of times per step; the ranks
        agree on a non-finite loss before the stepping backward (all skip, or none), and DDP's
        backward averages the gradients, so the clipped norm and the step are the same on every rank.
        """
        if self.inject_nonfinite:
            loss = loss * float("nan")
        if not step:  # accumulate; no collective here (ranks may agree only once per step)
            if not self._accumulating:
                self.optimizer.zero_grad(set_to_none=True)
                self._accumulating = True
            if math.isfinite(float(loss.detach())):
                loss.backward()
            else:
                self._pending_nonfinite = True
                if self.parallel.enabled:  # DDP reduces in every backward: keep the ranks in step
                    (loss * 0.0).backward()
            return math.nan
        pending, self._pending_nonfinite = self._pending_nonfinite, False
        if not self._accumulating:
            self.optimizer.zero_grad(set_to_none=True)
        self._accumulating = False
        if self.parallel.any(pending or not math.isfinite(float(loss.detach()))):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(
                f"loss is not finite ({float(loss.detach())} on rank {self.parallel.rank}); update skipped"
            )
        loss.backward()  # onto the gradients accumulated since the last step (none without micro-batches)
        grad_norm = clip_grad_norm(self.parameters, self.max_grad_norm)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            check_finite("grad_norm", grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm
