"""The clipped surrogate, aggregations and KL estimators against hand-computed numbers (chessgrpo.rl.loss)."""

from __future__ import annotations

import math

import pytest
import torch

from chessgrpo.rl import GRPOConfig, aggregate, categorical_entropy, exact_kl, kl_estimate, policy_loss

# Unequal sequence lengths: row 0 has 3 valid tokens, row 1 has 1; masked entries hold garbage.
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, float("nan")]])
MASK = torch.tensor([[True, True, True], [True, False, False]])


@pytest.mark.parametrize(
    ("mode", "max_length", "expected"),
    [
        ("token_mean", None, 2.5),  # (1 + 2 + 3 + 4) / 4
        ("seq_mean_token_mean", None, 3.0),  # (6/3 + 4/1) / 2
        ("seq_mean_token_sum_norm", None, 10 / 6),  # (6/3 + 4/3) / 2, L = 3
        ("seq_mean_token_sum_norm", 5, 1.0),  # (6/5 + 4/5) / 2
    ],
)
def test_aggregations_by_hand(mode: str, max_length: int | None, expected: float) -> None:
    assert aggregate(VALUES, MASK, mode, max_length).item() == pytest.approx(expected)
    # Through the loss: ratio 1 and advantages -v make the per-token surrogate equal to v.
    config = GRPOConfig(loss_aggregation=mode, aggregation_max_length=max_length)
    logp = torch.full((2, 3), -1.0)
    out = policy_loss(logp, logp, -VALUES, MASK, config, kl_coef=0.0)
    assert out.loss.item() == pytest.approx(expected)
    assert out.metrics["loss/policy"] == pytest.approx(expected)


def test_clip_fractions_by_hand() -> None:
    # eps_low 0.2 (clip below 0.8), eps_high 0.28 (clip above 1.28); the 7th token is masked.
    ratios = torch.tensor([[0.7, 0.7, 1.3, 1.3, 1.0, 1.25, 5.0]])
    advantages = torch.tensor([[-1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[True] * 6 + [False]])
    old = torch.full((1, 7), -2.0)
    new = old + ratios.log()
    out = policy_loss(new, old, advantages, mask, GRPOConfig(epsilon=0.2, epsilon_high=0.28), kl_coef=0.0)
    m = out.metrics
    # low: A < 0 and r < 0.8 -> token 0 only. high: A > 0 and r > 1.28 -> token 2 only
    # (token 1: A > 0, r = 0.7 is not clipped by the min; token 3: A < 0, r = 1.3 neither; token 5: 1.25 < 1.28).
    assert m["ratio/clip_frac_low"] == pytest.approx(1 / 6)
    assert m["ratio/clip_frac_high"] == pytest.approx(1 / 6)
    assert m["ratio/clip_frac"] == pytest.approx(2 / 6)
    # -min(rA, clip(r)A): 0.8, -0.7, -1.28, 1.3, -1.0, -1.25 -> sum -2.13, mean -0.355
    assert m["loss/policy"] == pytest.approx(-0.355, abs=1e-6)
    assert m["ratio/min"] == pytest.approx(0.7, abs=1e-6)
    assert m["ratio/max"] == pytest.approx(1.3, abs=1e-6)  # the masked 5.0 does not count
    assert m["ratio/max_abs_dev"] == pytest.approx(0.3, abs=1e-6)


def test_token_and_sequence_importance_ratios() -> None:
    old = torch.tensor([[-1.0, -2.0]])
    new = (old + torch.tensor([[0.1, -0.3]])).requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    advantages = torch.tensor([1.0])  # per sequence, broadcast over tokens

    # Token level, clip range wide enough to never clip: loss = -(r1 + r2)/2, d/dlogp_t = -r_t / 2.
    token = policy_loss(new, old, advantages, mask, GRPOConfig(epsilon=0.9, epsilon_high=5.0), kl_coef=0.0)
    token.loss.backward()
    r1, r2 = math.exp(0.1), math.exp(-0.3)  # 1.10517, 0.74082
    assert token.metrics["ratio/min"] == pytest.approx(r2, abs=1e-6)
    assert token.metrics["ratio/max"] == pytest.approx(r1, abs=1e-6)
    torch.testing.assert_close(new.grad, torch.tensor([[-r1 / 2, -r2 / 2]]))

    # Sequence level (GSPO): s = exp(mean(0.1, -0.3)) = exp(-0.1) = 0.904837 on both tokens;
    # loss = -s, d/dlogp_t = -s / 2 for each token.
    new.grad = None
    config = GRPOConfig(epsilon=0.9, epsilon_high=5.0, importance_sampling_level="sequence")
    seq = policy_loss(new, old, advantages, mask, config, kl_coef=0.0)
    seq.loss.backward()
    s = math.exp(-0.1)
    assert seq.metrics["ratio/mean"] == pytest.approx(s, abs=1e-6)
    assert seq.metrics["ratio/min"] == seq.metrics["ratio/max"]
    assert seq.loss.item() == pytest.approx(-s, abs=1e-6)
    torch.testing.assert_close(new.grad, torch.tensor([[-s / 2, -s / 2]]))
    # The invariant metric stays per token whatever the level: max |r_t - 1| = 1 - 0.74082.
    assert seq.metrics["ratio/max_abs_dev"] == pytest.approx(1 - r2, abs=1e-6)


def test_kl_estimators_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    # x = ref - logp = -0.5, 1.0
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[0.5, -1.0]]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([[0.125, 0.5]]))
    # k3: exp(-0.5) + 0.5 - 1 = 0.10653066; exp(1) - 1 - 1 = 0.71828183
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([[0.10653066, 0.71828183]]))
    with pytest.raises(ValueError, match="kl estimator"):
        kl_estimate(logp, ref, "k4")


def test_k3_is_nonnegative_on_random_inputs() -> None:
    generator = torch.Generator().manual_seed(0)
    logp = -torch.rand(2000, generator=generator) * 10
    ref = -torch.rand(2000, generator=generator) * 10
    near = logp + torch.randn(2000, generator=generator) * 1e-7
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert (kl_estimate(logp, near, "k3") >= 0).all()
    assert (kl_estimate(logp, logp, "k3") == 0).all()


def test_exact_kl_with_masked_actions() -> None:
    inf = float("inf")
    logp = torch.tensor([[math.log(0.5), math.log(0.5), -inf], [0.0, -inf, -inf]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5), math.log(0.25)], [math.log(0.5), math.log(0.5), -inf]])
    # row 0: 0.5 ln(0.5/0.25) + 0.5 ln(1) + 0 = 0.34657359; row 1: 1 * ln(1/0.5) = 0.69314718
    kl = exact_kl(logp, ref)
    torch.testing.assert_close(kl, torch.tensor([0.34657359, 0.69314718]))
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert exact_kl(ref, ref).tolist() == [0.0, 0.0]


def test_kl_and_entropy_terms_and_shares() -> None:
    logp = torch.tensor([[-1.0], [-2.0]])
    ref = torch.tensor([[-1.5], [-1.0]])
    mask = torch.ones(2, 1, dtype=torch.bool)
    advantages = torch.tensor([2.0, 0.0])
    entropy = torch.tensor([[1.0], [2.0]])
    config = GRPOConfig(entropy_coef=0.1, kl_estimator="k3")
    out = policy_loss(logp, logp, advantages, mask, config, ref_logp=ref, entropy=entropy, kl_coef=0.5)
    m = out.metrics
    # policy: ratio 1 -> -A -> (-2 + 0)/2 = -1. k3 = 0.10653066, 0.71828183 -> mean 0.41240625;
    # weighted 0.5 * 0.41240625 = 0.20620312. entropy term: -0.1 * 1.5 = -0.15. total -0.94379688.
    assert m["loss/policy"] == pytest.approx(-1.0)
    assert m["loss/kl"] == pytest.approx(0.41240625, abs=1e-6)
    assert m["kl/value"] == pytest.approx(0.41240625, abs=1e-6)
    assert m["kl/min"] == pytest.approx(0.10653066, abs=1e-6)
    assert m["loss/kl_weighted"] == pytest.approx(0.20620312, abs=1e-6)
    assert m["loss/entropy"] == pytest.approx(-0.15, abs=1e-6)
    assert m["entropy/mean"] == pytest.approx(1.5)
    assert m["loss/total"] == pytest.approx(-0.94379688, abs=1e-6)
    assert out.loss.item() == pytest.approx(-0.94379688, abs=1e-6)
    # shares: |terms| = 1, 0.20620312, 0.15; sum 1.35620312
    assert m["loss/share_policy"] == pytest.approx(1 / 1.35620312, abs=1e-6)
    assert m["loss/share_kl"] == pytest.approx(0.20620312 / 1.35620312, abs=1e-6)
    assert m["loss/share_entropy"] == pytest.approx(0.15 / 1.35620312, abs=1e-6)
    assert all(type(v) is float for v in m.values())


def test_masked_infinities_leave_loss_and_gradient_finite() -> None:
    inf = float("inf")
    new = torch.tensor([[-1.0, -inf], [-0.5, -0.7]], requires_grad=True)
    old = torch.tensor([[-1.1, -inf], [-0.5, -0.6]])
    ref = torch.tensor([[-1.2, -inf], [-0.4, -0.65]])
    mask = torch.tensor([[True, False], [True, True]])
    entropy = torch.tensor([[0.5, float("nan")], [0.3, 0.2]], requires_grad=True)
    config = GRPOConfig(entropy_coef=0.01, kl_estimator="k3")
    out = policy_loss(new, old, torch.tensor([1.0, -1.0]), mask, config, ref_logp=ref, entropy=entropy, kl_coef=0.1)
    out.loss.backward()
    assert math.isfinite(out.loss.item())
    assert torch.isfinite(new.grad).all() and torch.isfinite(entropy.grad).all()
    assert new.grad[0, 1].item() == 0.0


def test_missing_inputs_raise() -> None:
    logp = torch.zeros(2, 1)
    mask = torch.ones(2, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(logp, logp, torch.zeros(2), mask, GRPOConfig(kl_estimator="k3"), kl_coef=0.1)
    with pytest.raises(ValueError, match="exact per-step KL"):
        policy_loss(logp, logp, torch.zeros(2), mask, GRPOConfig(), kl_coef=0.1, ref_logp=logp)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(logp, logp, torch.zeros(2), mask, GRPOConfig(entropy_coef=0.01), kl_coef=0.0)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, logp, torch.zeros(3), mask, GRPOConfig(), kl_coef=0.0)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="advantage_estimator.*'grpo'"):
        GRPOConfig(advantage_estimator="GRPO")
    with pytest.raises(ValueError, match="loss_aggregation"):
        GRPOConfig(loss_aggregation="sum")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        GRPOConfig(importance_sampling_level="tokens")
    with pytest.raises(ValueError, match="kl_estimator"):
        GRPOConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="kl_schedule"):
        GRPOConfig(kl_schedule="cosine")
    with pytest.raises(ValueError, match="epsilon"):
        GRPOConfig(epsilon=1.5)
    with pytest.raises(ValueError, match="kl_warmup_steps"):
        GRPOConfig(kl_schedule="warmup", kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        GRPOConfig(kl_schedule="adaptive", kl_coef=0.0)
    with pytest.raises(ValueError, match="num_iterations"):
        GRPOConfig(num_iterations=0)
    assert GRPOConfig(epsilon_high=0.28).clip_range == (0.2, 0.28)
    assert GRPOConfig().clip_range == (0.2, 0.2)


def test_categorical_entropy_handles_masked_actions() -> None:
    inf = float("inf")
    logits = torch.tensor([[0.0, 0.0, -inf, 0.0], [1.0, 2.0, 3.0, -inf]], requires_grad=True)
    entropy = categorical_entropy(logits.log_softmax(dim=-1))
    # row 0: uniform over 3 legal actions -> ln 3 = 1.09861229
    assert entropy[0].item() == pytest.approx(math.log(3), abs=1e-6)
    p = torch.tensor([1.0, 2.0, 3.0]).softmax(dim=0)
    assert entropy[1].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()
