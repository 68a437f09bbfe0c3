"""Runtime invariant checks and their messages (chessgrpo.rl.invariants)."""

from __future__ import annotations

import math

import pytest
import torch

from chessgrpo.rl import InvariantViolation, check_finite, check_first_minibatch, check_kl_nonnegative


def test_first_minibatch_passes_within_tolerance() -> None:
    check_first_minibatch(5e-5, 0.0, 1e-4)


@pytest.mark.parametrize(("deviation", "clip_frac"), [(3e-3, 0.0), (0.0, 0.01), (math.nan, 0.0)])
def test_first_minibatch_violation_names_numbers_and_causes(deviation: float, clip_frac: float) -> None:
    with pytest.raises(InvariantViolation) as error:
        check_first_minibatch(deviation, clip_frac, 1e-4, context="step 7")
    message = str(error.value)
    assert "step 7" in message and "tolerance 0.0001" in message
    for cause in ("temperature", "dropout", "mask", "weights changed", "bf16"):
        assert cause in message


def test_check_finite() -> None:
    check_finite("loss/total", 1.5)
    check_finite("grad", torch.ones(3))
    with pytest.raises(InvariantViolation, match="grad_norm"):
        check_finite("grad_norm", math.inf)
    with pytest.raises(InvariantViolation, match="loss/total"):
        check_finite("loss/total", torch.tensor([1.0, math.nan]))


def test_check_kl_nonnegative() -> None:
    check_kl_nonnegative(0.0)
    check_kl_nonnegative(-5e-7)  # rounding noise
    check_kl_nonnegative(-3.0, estimator="k1")  # k1 may be negative
    with pytest.raises(InvariantViolation, match="k3"):
        check_kl_nonnegative(-1e-3)
