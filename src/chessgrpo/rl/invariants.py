"""Runtime checks that fail fast with a message saying what is wrong and what usually causes it.

The first minibatch after a rollout is learned with the very weights that sampled it, so the
recomputed log-probs must equal the behaviour log-probs: ratio = 1 and nothing clipped
(docs/architecture.md, invariant 1). A predecessor system sampled at temperature 1.3 and learned at 1.0 and
ran for days with a 55% clip fraction at step 0; this check turns that into an exception. A
pipelined step (``grpo.pipeline``) learns one update after sampling: there the check runs on the
snapshot of the weights that sampled (`rl.optimize`'s behaviour_forward), for which it still holds.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from chessgrpo.errors import ChessGRPOError


class InvariantViolation(ChessGRPOError, RuntimeError):
    """A runtime invariant of the GRPO learner does not hold; training must not continue."""


class NonFiniteError(InvariantViolation):
    """A loss or gradient norm is NaN or infinite; the optimizer step was not taken.

    The training loop's divergence policy catches this one (skip, then roll back), unlike the
    other invariant violations, which always stop a run."""


_RATIO_CAUSES = """likely causes:
  - the sampling temperature differs from the learning temperature (both must call the same
    log-prob function with the same temperature);
  - dropout or other train-mode randomness in the sampling or learning forward (put the model in
    eval mode, or set dropout to 0, for every RL forward);
  - a different legal-move or attention mask at sampling and at learning (padding side, position
    ids, or legal masks recomputed from a different position);
  - the weights changed between rollout and learning (an optimizer step, an EMA swap or a
    checkpoint load in between);
  - a bf16/fp32 mismatch between the sampling and learning forwards (pass bf16=True to use the
    bf16 tolerance only if both really run in bf16)."""


def check_first_minibatch(ratio_max_abs_dev: float, clip_frac: float, tolerance: float, *, context: str = "") -> None:
    """Raise `InvariantViolation` unless max |ratio - 1| <= tolerance and the clip fraction is 0.

    Call it on the first minibatch of a rollout batch, before any optimizer step.
    """
    where = f" ({context})" if context else ""
    if not math.isfinite(ratio_max_abs_dev) or ratio_max_abs_dev > tolerance or clip_frac > 0.0:
        raise InvariantViolation(
            f"first minibatch{where}: the learner's log-probs do not reproduce the behaviour policy's: "
            f"max |ratio - 1| = {ratio_max_abs_dev:.3g} (tolerance {tolerance:.3g}), "
            f"clip fraction = {clip_frac:.3g} (must be 0). The weights have not changed since sampling, so "
            f"the ratio must be exactly 1 up to numerical noise; {_RATIO_CAUSES}"
        )


def ratio_max_abs_dev(logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> float:
    """max |exp(logp - behaviour_logp) - 1| over the valid (`mask`) tokens, as `policy_loss` logs
    ``ratio/max_abs_dev`` (0 when no token is valid)."""
    log_ratio = logp.detach().float() - behaviour_logp.detach().float()
    deviation = (log_ratio.exp() - 1.0).abs()[mask]
    return float(deviation.max()) if deviation.numel() else 0.0


def check_finite(name: str, value: float | Tensor) -> None:
    """Raise `NonFiniteError` (an `InvariantViolation`) if the metric `name` is NaN or infinite."""
    if isinstance(value, Tensor):
        finite = bool(torch.isfinite(value).all())
        shown: object = value.detach().flatten()[:4].tolist()
    else:
        finite = math.isfinite(value)
        shown = value
    if not finite:
        raise NonFiniteError(
            f"{name} is not finite ({shown}); the optimizer step was not taken. Check the rewards, the "
            "log-probs at masked positions, the learning rate and the precision of the forward."
        )


def check_kl_nonnegative(kl_min: float, *, estimator: str = "k3", tolerance: float = 1e-6) -> None:
    """Raise `InvariantViolation` if a non-negative KL estimator (k2, k3) has a value below -tolerance.

    k3 = exp(x) - x - 1 >= 0 for every x, so a negative value means a bug (wrong sign convention,
    reference and policy swapped, non-finite inputs). k1 may legitimately be negative: not checked.
    """
    if estimator == "k1":
        return
    if not math.isfinite(kl_min) or kl_min < -tolerance:
        raise InvariantViolation(
            f"KL estimator {estimator} produced {kl_min:.3g} < -{tolerance:g}; {estimator} is non-negative by "
            "construction, so the log-probs passed to it are wrong (check that ref_logp comes from the frozen "
            "reference, is finite at valid tokens and is computed with the same mask and temperature)"
        )
