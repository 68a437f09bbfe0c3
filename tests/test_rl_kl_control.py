"""KL coefficient schedules, bound pinning statistics and exact resume (chessgrpo.rl.kl_control)."""

from __future__ import annotations

import logging

import pytest

from chessgrpo.rl import GRPOConfig, KLController
from chessgrpo.rl.kl_control import PINNED_WARNING_STEPS


def test_fixed_is_constant_and_never_pinned() -> None:
    controller = KLController.from_config(GRPOConfig(kl_coef=0.04))
    for kl in (0.0, 1.0, 100.0):
        assert controller.coef == 0.04
        controller.update(kl)
    controller.update(None)  # nothing measured: fine for a fixed coefficient
    assert controller.metrics() == {"kl/coef": 0.04, "kl/frac_at_min": 0.0, "kl/frac_at_max": 0.0}
    assert controller.steps == 4


def test_warmup_trajectory() -> None:
    controller = KLController.from_config(GRPOConfig(kl_coef=0.1, kl_schedule="warmup", kl_warmup_steps=4))
    coefs = []
    for _ in range(6):
        coefs.append(controller.coef)
        controller.update(0.5)
    # coef at step s = 0.1 * min(1, s / 4)
    assert coefs == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1])


def test_adaptive_trajectory_by_hand() -> None:
    config = GRPOConfig(kl_coef=0.1, kl_schedule="adaptive", kl_target=0.01, kl_horizon=100)
    controller = KLController.from_config(config)
    # error = clip(kl / 0.01 - 1, -0.2, 0.2); coef *= 1 + error * 10 / 100
    controller.update(0.02, n_steps=10)  # error clip(1.0) = 0.2 -> * 1.02 -> 0.102
    assert controller.coef == pytest.approx(0.102)
    controller.update(0.0, n_steps=10)  # error clip(-1.0) = -0.2 -> * 0.98 -> 0.09996
    assert controller.coef == pytest.approx(0.09996)
    controller.update(0.011, n_steps=10)  # error 0.1 -> * 1.01 -> 0.1009596
    assert controller.coef == pytest.approx(0.1009596)
    with pytest.raises(ValueError, match="finite observed KL"):
        controller.update(None)


def test_adaptive_pinning_statistics() -> None:
    config = GRPOConfig(kl_coef=0.1, kl_schedule="adaptive", kl_horizon=100, kl_coef_max=0.105, kl_coef_min=0.099)
    controller = KLController.from_config(config)
    # high KL: 0.1 * 1.02^n = 0.102, 0.10404, 0.10612 -> clamped 0.105 from the 3rd update on
    for _ in range(5):
        controller.update(1.0, n_steps=10)
    assert controller.coef == 0.105
    assert (controller.steps, controller.steps_at_max, controller.steps_at_min) == (5, 3, 0)
    # low KL: 0.105 * 0.98 = 0.1029, 0.100842, 0.09883 -> clamped 0.099 on the 3rd
    for _ in range(3):
        controller.update(0.0, n_steps=10)
    assert controller.coef == 0.099
    metrics = controller.metrics()
    assert metrics["kl/frac_at_max"] == pytest.approx(3 / 8)
    assert metrics["kl/frac_at_min"] == pytest.approx(1 / 8)
    assert metrics["kl/coef"] == 0.099


def test_adaptive_warns_when_pinned_for_long(caplog: pytest.LogCaptureFixture) -> None:
    controller = KLController("adaptive", 0.5, coef_min=0.0, coef_max=0.5, horizon=10)
    with caplog.at_level(logging.WARNING, logger="chessgrpo.rl.kl_control"):
        for _ in range(PINNED_WARNING_STEPS):
            controller.update(1.0, n_steps=1)
    assert controller.metrics()["kl/frac_at_max"] == 1.0
    assert any("kl_coef_max" in record.getMessage() for record in caplog.records)


def test_state_dict_round_trip_resumes_exactly() -> None:
    config = GRPOConfig(kl_coef=0.1, kl_schedule="adaptive", kl_horizon=50, kl_coef_max=0.2)
    original = KLController.from_config(config)
    for kl in (0.03, 0.001, 0.02):
        original.update(kl, n_steps=7)
    resumed = KLController.from_config(config)
    resumed.load_state_dict(original.state_dict())
    for kl in (0.5, 0.0, 0.012, 0.5):
        original.update(kl, n_steps=7)
        resumed.update(kl, n_steps=7)
        assert resumed.coef == original.coef
    assert resumed.state_dict() == original.state_dict()
    assert resumed.metrics() == original.metrics()

    fixed = KLController.from_config(GRPOConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="schedule"):
        fixed.load_state_dict(original.state_dict())
    with pytest.raises(ValueError, match="keys"):
        resumed.load_state_dict({"steps": 3})


def test_warmup_resume_continues_the_ramp() -> None:
    config = GRPOConfig(kl_coef=0.2, kl_schedule="warmup", kl_warmup_steps=10)
    original = KLController.from_config(config)
    for _ in range(3):
        original.update(None)
    resumed = KLController.from_config(config)
    resumed.load_state_dict(original.state_dict())
    assert resumed.coef == pytest.approx(0.06)
