"""The clipped GRPO surrogate, KL estimators and their aggregation over [N, L] tokens.

Everything here sees per-token tensors [N, L] with a validity mask, so one loss serves a single
move (L = 1), a trajectory of plies (L = T) and an LM completion (L tokens):

    ratio_t  = exp(logp_t - old_logp_t)                           (token level, PPO/GRPO)
             = exp(mean_{s valid}(logp_s - old_logp_s))           (sequence level, GSPO)
    policy_t = -min(ratio_t * A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_t)
    loss     = agg(policy) + kl_coef * agg(kl) - entropy_coef * agg(entropy)

kl_t is the exact KL(policy || reference) over the whole next-action distribution at step t (the default,
from the task's forward), or a sampled estimator k2/k3 weighted by the detached per-token importance ratio
exp(logp_t - old_logp_t), so that its expected gradient is the on-policy one even when the samples come from
an older policy (num_iterations > 1, the pipelined step). Which gradient each has: `GRPOConfig.kl_estimator`.

`old_logp` is the *behaviour* policy's log-prob recorded at sampling time (never the reference's:
one of the predecessor systems took the ratio against the frozen reference). Masked positions are
zeroed *before* any arithmetic, so padding holding -inf or garbage can never leak a NaN into the
loss or its gradient.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from chessgrpo.rl.config import KL_ESTIMATORS, LOSS_AGGREGATIONS, GRPOConfig

SAMPLED_KL_ESTIMATORS = tuple(name for name in KL_ESTIMATORS if name != "exact")


@dataclasses.dataclass
class LossOutput:
    """The scalar to backpropagate and the metrics that explain it (plain floats)."""

    loss: Tensor
    """Scalar: policy term + kl_coef * KL term + entropy term."""
    metrics: dict[str, float]
    """loss/*, ratio/*, kl/*, entropy/* (see `policy_loss`)."""
    terms: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    """The scalar terms that sum to `loss` (with grad): ``policy``, and ``kl`` (already weighted) and
    ``entropy`` when present; for measuring each term's gradient separately."""


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token sampled estimate of KL(policy || reference) (Schulman 2020, "Approximating KL").

    With x = ref_logp - logp (the log of ref/policy at the sampled token):

    - ``k1`` = -x = logp - ref_logp: unbiased, can be negative per token; zero gradient in expectation;
    - ``k2`` = x^2 / 2: biased, non-negative; its expected gradient is grad KL(policy || ref);
    - ``k3`` = exp(x) - x - 1: unbiased and non-negative (DeepSeekMath); computed as expm1(x) - x,
      which is exact near x = 0 where the true KL is ~0; its expected gradient is grad KL(ref || policy).

    The values are what a sample from the policy itself estimates; `policy_loss` importance-weights them
    when the sample came from another policy. ``exact`` is not a sampled estimator (see `exact_kl`).
    """
    if estimator not in SAMPLED_KL_ESTIMATORS:
        raise ValueError(f"sampled kl estimator must be one of {list(SAMPLED_KL_ESTIMATORS)}, got {estimator!r}")
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {list(logp.shape)} and ref_logp {list(ref_logp.shape)} differ in shape")
    x = ref_logp - logp
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x**2
    return torch.expm1(x) - x


def exact_kl(logp_full: Tensor, ref_logp_full: Tensor) -> Tensor:
    """Exact KL(p || q) [N] = sum_a p(a) (log p(a) - log q(a)) over a full categorical [N, A].

    For small action spaces where both full distributions are available. Actions with p(a) = 0
    (log p = -inf, e.g. masked illegal moves) contribute 0 whatever q is (0 * -inf counts as 0);
    an action with p(a) > 0 and q(a) = 0 gives +inf, which is the true value. Differentiable, and
    the gradient is finite wherever the value is.
    """
    if logp_full.shape != ref_logp_full.shape:
        raise ValueError(f"logp_full {list(logp_full.shape)} and ref_logp_full {list(ref_logp_full.shape)} differ")
    absent = torch.isneginf(logp_full)
    zero = torch.zeros_like(logp_full)
    safe_logp = torch.where(absent, zero, logp_full)
    safe_ref = torch.where(absent, zero, ref_logp_full)
    p = torch.where(absent, zero, safe_logp.exp())
    return (p * (safe_logp - safe_ref)).sum(dim=-1)


def categorical_entropy(logp_full: Tensor) -> Tensor:
    """Exact entropy [...] = -sum_a p(a) log p(a) of categorical log-probs [..., A] over the last dim.

    Entries of -inf (masked actions, p = 0) contribute 0, and so does their gradient: the naive
    ``where(mask, p * logp, 0)`` evaluates 0 * -inf = NaN in the discarded branch, which turns
    the gradient into NaN even though the value is right.
    """
    absent = torch.isneginf(logp_full)
    safe = torch.where(absent, torch.zeros_like(logp_full), logp_full)
    plogp = torch.where(absent, torch.zeros_like(logp_full), safe.exp() * safe)
    return -plogp.sum(dim=-1)


def aggregate(values: Tensor, mask: Tensor, mode: str = "token_mean", max_length: int | None = None) -> Tensor:
    """Reduce per-token values [N, L] over the valid tokens to a scalar.

    - ``token_mean``: sum_{i,t valid} v / #valid tokens                      (DAPO)
    - ``seq_mean_token_mean``: mean_i (sum_t v_{i,t} / #valid_i)              (GRPO)
    - ``seq_mean_token_sum_norm``: mean_i (sum_t v_{i,t} / max_length)         (Dr. GRPO)

    `max_length` defaults to L. Values at masked positions are ignored (they may be anything finite
    or not). Every row must have at least one valid token.
    """
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss aggregation must be one of {list(LOSS_AGGREGATIONS)}, got {mode!r}")
    if values.dim() != 2 or mask.shape != values.shape:
        raise ValueError(f"values and mask must both be [N, L]; got {list(values.shape)} and {list(mask.shape)}")
    masked = torch.where(mask, values, torch.zeros_like(values))
    counts = mask.sum(dim=1)
    if mode == "token_mean":
        return masked.sum() / counts.sum().clamp(min=1)
    if mode == "seq_mean_token_mean":
        return (masked.sum(dim=1) / counts.clamp(min=1)).mean()
    length = values.shape[1] if max_length is None else max_length
    return (masked.sum(dim=1) / length).mean()


def policy_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: GRPOConfig,
    *,
    ref_logp: Tensor | None = None,
    kl: Tensor | None = None,
    entropy: Tensor | None = None,
    kl_coef: float,
) -> LossOutput:
    """The clipped surrogate with optional KL penalty and entropy bonus, aggregated per `config`.

    Args:
        new_logp: [N, L] log-probs of the sampled tokens under the current policy (with grad).
        old_logp: [N, L] behaviour log-probs recorded at sampling time.
        advantages: [N] (one per sequence, broadcast over tokens) or [N, L].
        mask: [N, L] bool, True at valid tokens; every row needs one.
        config: clip range, aggregation, importance-sampling level, KL estimator, entropy_coef.
        ref_logp: [N, L] reference log-probs (no grad); required when kl_coef > 0 with a sampled
            estimator (k1, k2, k3). When given, the KL is measured (and logged) even at kl_coef = 0.
        kl: [N, L] exact KL(policy || reference) of the whole next-action distribution at each step
            (with grad); required when kl_coef > 0 with ``kl_estimator: exact``, and then the KL term. At
            kl_coef = 0 without it, ``kl/value`` is the k3 estimate from `ref_logp` (measured, not penalised).
        entropy: [N, L] exact entropy of the current policy at each step (with grad); required
            when config.entropy_coef > 0.
        kl_coef: the KL weight to use now (the KL controller's coefficient, not config.kl_coef).

    Metrics (plain floats, computed under no_grad): ``loss/policy``, ``loss/kl`` (aggregated raw
    estimate), ``loss/kl_weighted``, ``loss/entropy`` (= -entropy_coef * aggregated entropy),
    ``loss/total``, ``loss/share_{policy,kl,entropy}`` (|term| / sum of |terms|), ``ratio/mean``,
    ``ratio/min``, ``ratio/max`` (of the ratio used in the loss), ``ratio/max_abs_dev`` (max
    |exp(logp - old_logp) - 1| per *token*, whatever the importance level: the invariant check),
    ``ratio/clip_frac_low`` (A < 0 and ratio < 1 - eps_low), ``ratio/clip_frac_high`` (A > 0 and
    ratio > 1 + eps_high), ``ratio/clip_frac``; when ref_logp is given ``kl/value`` (mean per-token
    estimate over valid tokens) and ``kl/min``; when entropy is given ``entropy/mean`` (mean over
    valid tokens).
    """
    shape = new_logp.shape
    if new_logp.dim() != 2:
        raise ValueError(f"new_logp must be [N, L], got {list(shape)}")
    for name, value in (
        ("old_logp", old_logp),
        ("mask", mask),
        ("ref_logp", ref_logp),
        ("kl", kl),
        ("entropy", entropy),
    ):
        if value is not None and value.shape != shape:
            raise ValueError(f"{name} has shape {list(value.shape)}, expected {list(shape)} like new_logp")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be torch.bool, got {mask.dtype}")
    if advantages.shape == shape[:1]:
        advantages = advantages.unsqueeze(1).expand(shape)
    elif advantages.shape != shape:
        raise ValueError(f"advantages must be [N] or [N, L] = {list(shape)}, got {list(advantages.shape)}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    exact = config.kl_estimator == "exact"
    if kl_coef > 0 and exact and kl is None:
        raise ValueError(
            f"kl_coef = {kl_coef} > 0 with kl_estimator 'exact' needs the exact per-step KL from the task's forward "
            "(PolicyOutputs.kl; the forward computes it when it is given the reference)"
        )
    if kl_coef > 0 and not exact and ref_logp is None:
        raise ValueError(f"kl_coef = {kl_coef} > 0 needs ref_logp (log-probs under the frozen reference)")
    if config.entropy_coef > 0 and entropy is None:
        raise ValueError(f"entropy_coef = {config.entropy_coef} > 0 needs the exact per-step entropy")

    # Zero every masked position before any arithmetic (see the module docstring).
    def clean(value: Tensor) -> Tensor:
        return torch.where(mask, value.float(), torch.zeros((), dtype=torch.float32, device=value.device))

    new_logp, old_logp, advantages = clean(new_logp), clean(old_logp.detach()), clean(advantages.detach())
    mode, max_length = config.loss_aggregation, config.aggregation_max_length
    eps_low, eps_high = config.clip_range

    log_ratio = new_logp - old_logp
    if config.importance_sampling_level == "sequence":
        seq_log_ratio = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
        ratio = seq_log_ratio.exp().expand(shape)
    else:
        ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token_policy = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
    policy_term = aggregate(per_token_policy, mask, mode, max_length)

    total = policy_term
    kl_term = per_token_kl = None
    if exact and kl is not None:
        per_token_kl = clean(kl)
    elif ref_logp is not None:
        # A sampled estimator, or (exact without the forward's KL, only possible at kl_coef 0) a measurement: k3,
        # whose value is unbiased for KL(policy || reference).
        estimator = "k3" if exact else config.kl_estimator
        # Importance-weighted by the detached token ratio: the sample came from the behaviour policy, the
        # estimator's expectation is over the current one (the weight is 1 on the first, on-policy pass).
        weight = torch.where(mask, log_ratio.detach().exp(), torch.zeros_like(log_ratio))
        per_token_kl = weight * clean(kl_estimate(new_logp, clean(ref_logp.detach()), estimator))
    if per_token_kl is not None:
        kl_term = aggregate(per_token_kl, mask, mode, max_length)
        total = total + kl_coef * kl_term
    entropy_term = None
    if entropy is not None:
        entropy = clean(entropy)
        entropy_term = -config.entropy_coef * aggregate(entropy, mask, mode, max_length)
        total = total + entropy_term

    with torch.no_grad():
        valid = mask
        num_valid = valid.sum().clamp(min=1)
        valid_ratio = ratio[valid]
        token_dev = (log_ratio.exp() - 1.0).abs()[valid]
        low = (advantages < 0) & (ratio < 1.0 - eps_low) & valid
        high = (advantages > 0) & (ratio > 1.0 + eps_high) & valid
        zero = total.new_zeros(())
        kl_weighted = kl_coef * kl_term if kl_term is not None else zero
        stacked = torch.stack([policy_term, kl_weighted, entropy_term if entropy_term is not None else zero]).detach()
        magnitude = stacked.abs().sum()
        shares = torch.where(magnitude > 0, stacked.abs() / magnitude.clamp(min=1e-30), torch.zeros_like(stacked))
        names = [
            "loss/policy",
            "loss/kl",
            "loss/kl_weighted",
            "loss/entropy",
            "loss/total",
            "loss/share_policy",
            "loss/share_kl",
            "loss/share_entropy",
            "ratio/mean",
            "ratio/min",
            "ratio/max",
            "ratio/max_abs_dev",
            "ratio/clip_frac_low",
            "ratio/clip_frac_high",
            "ratio/clip_frac",
        ]
        values = [
            policy_term,
            kl_term if kl_term is not None else zero,
            kl_weighted,
            stacked[2],
            total,
            shares[0],
            shares[1],
            shares[2],
            valid_ratio.mean(),
            valid_ratio.min(),
            valid_ratio.max(),
            token_dev.max(),
            low.sum() / num_valid,
            high.sum() / num_valid,
            (low | high).sum() / num_valid,
        ]
        if per_token_kl is not None:
            names += ["kl/value", "kl/min"]
            values += [per_token_kl[valid].mean(), per_token_kl[valid].min()]
        if entropy is not None:
            names.append("entropy/mean")
            values.append(entropy[valid].mean())
        # One device-to-host transfer for all metrics.
        floats = torch.stack([v.detach().float().reshape(()) for v in values]).tolist()
    terms = {"policy": policy_term}
    if kl_term is not None:
        terms["kl"] = kl_coef * kl_term
    if entropy_term is not None:
        terms["entropy"] = entropy_term
    return LossOutput(loss=total, metrics=dict(zip(names, floats)), terms=terms)
