"""`optimize`: the PPO-epoch optimisation of a policy over one rollout batch, policy-agnostic.

The caller owns the model, the optimizer, the LR schedule and sampling; it hands over a
`RolloutBatch` and a `forward` function that recomputes, for any subset of rows, the log-probs
of the sampled tokens under the current weights (and optionally the exact entropy and the
reference log-probs). One call is one training step:

1. advantages, unless the caller filled them (outcome rewards [N] -> `group_advantages`,
   step rewards [N, L] -> `process_advantages`);
2. zero-std groups counted (``rollout/frac_reward_zero_std``) and, with DAPO dynamic sampling,
   dropped; a batch with nothing left is skipped (``loss/skipped`` = 1, no optimizer step);
3. ``num_iterations`` epochs over shuffled minibatches of whole rows: forward, `policy_loss`,
   backward, gradient clipping, optimizer step;
4. the very first minibatch runs with the weights that sampled the batch, so the ratio must be 1:
   `check_first_minibatch` raises otherwise (ARCHITECTURE invariant 1);
5. the KL controller is updated once with the mean observed KL.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from chessgrpo.rl.advantages import group_advantages, process_advantages, zero_std_groups
from chessgrpo.rl.batch import RolloutBatch
from chessgrpo.rl.config import GRPOConfig
from chessgrpo.rl.invariants import check_finite, check_first_minibatch, check_kl_nonnegative
from chessgrpo.rl.kl_control import KLController
from chessgrpo.rl.loss import policy_loss

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class PolicyOutputs:
    """What the caller's forward returns for a minibatch of n rows."""

    logp: Tensor
    """[n, L] log-prob of batch.actions under the current policy (with grad), computed by the same
    function, at the same temperature and with the same mask as at sampling."""
    entropy: Tensor | None = None
    """[n, L] exact entropy of the current policy's (masked, tempered) distribution at each step, or None."""
    ref_logp: Tensor | None = None
    """[n, L] log-probs under the frozen reference (computed under no_grad), or None to use batch.ref_logp."""


Forward = Callable[[RolloutBatch], PolicyOutputs]


def compute_advantages(batch: RolloutBatch, config: GRPOConfig) -> Tensor:
    """Advantages for `batch`: group-relative for rewards [N], process supervision for rewards [N, L]."""
    if batch.rewards.dim() == 1:
        return group_advantages(batch.rewards, batch.group_ids, config.advantage_estimator, config.advantage_epsilon)
    return process_advantages(
        batch.rewards, batch.mask, batch.group_ids, config.advantage_epsilon, estimator=config.advantage_estimator
    )


UpdateFn = Callable[[Tensor], float]
"""Takes a minibatch loss, does backward, gradient clipping and one optimizer step (or raises
`NonFiniteError` without stepping) and returns the gradient norm before clipping. The training
spine supplies one (`train.loop.Learner.update`), so clipping and divergence handling live there."""


def optimize(
    batch: RolloutBatch,
    forward: Forward,
    optimizer: torch.optim.Optimizer | None,
    config: GRPOConfig,
    kl_controller: KLController,
    *,
    parameters: Iterable[Tensor] = (),
    generator: torch.Generator | None,
    bf16: bool = False,
    max_grad_norm: float = 1.0,
    update: UpdateFn | None = None,
) -> dict[str, float]:
    """One GRPO training step on `batch`; returns its metrics as plain floats.

    Args:
        batch: the rollout; `batch.advantages` is filled in place when it is None.
        forward: recomputes `PolicyOutputs` for a minibatch (a `RolloutBatch` of whole rows). It must
            run without dropout and with the sampling temperature and masks.
        optimizer: stepped once per minibatch; the caller steps any LR scheduler (None with `update`).
        config: the algorithm's hyperparameters.
        kl_controller: supplies the KL coefficient (fixed for this call) and is updated once.
        parameters: the parameters whose gradient norm is clipped to `max_grad_norm` (without `update`).
        generator: shuffles rows between minibatches (None: torch's global generator).
        bf16: the forwards run in bf16, so the first-minibatch ratio check uses ratio_tolerance_bf16.
        max_grad_norm: gradient-norm clip of the built-in update (0 = off).
        update: backward + clip + optimizer step for a minibatch loss (`UpdateFn`); replaces the
            built-in one (optimizer, parameters, max_grad_norm).

    Metrics: the per-minibatch `policy_loss` metrics reduced over minibatches (``*/min*`` by min,
    ``*/max*`` by max, the rest by mean), plus ``grad_norm`` (mean, before clipping),
    ``reward/{mean,std,min,max}`` (per row; the row's sum of valid step rewards for step rewards),
    ``adv/{mean,std}`` (per row, or per valid token for [N, L] advantages), ``rollout/frac_reward_zero_std``,
    ``ratio/first_max_abs_dev``, ``kl/coef`` (used in this step), ``kl/frac_at_min``,
    ``kl/frac_at_max``, ``learn/minibatches``, ``learn/rows`` and ``loss/skipped``.

    Raises:
        InvariantViolation: the first minibatch's ratio is not 1 (with config.check_invariants), a
            non-negative KL estimate went negative, or the loss or gradient norm is not finite
            (always; no optimizer step is taken then).
    """
    batch.validate()
    if update is None:
        params = list(parameters)
        if optimizer is None or not params:
            raise ValueError("optimize needs an update function, or an optimizer and the parameters to clip")
        update = _builtin_update(optimizer, params, max_grad_norm)
    if batch.advantages is None:
        batch.advantages = compute_advantages(batch, config)
    step_mask = batch.mask if batch.rewards.dim() == 2 else None
    zero_rows, frac_zero = zero_std_groups(batch.rewards, batch.group_ids, step_mask)
    metrics: dict[str, float] = {"rollout/frac_reward_zero_std": frac_zero, **_rollout_metrics(batch)}

    learn_batch = batch
    if config.drop_zero_std_groups:
        keep = (~zero_rows).nonzero().flatten()
        if keep.numel() == 0:
            logger.info("every group of the %d-row batch has all-equal rewards: step skipped", batch.num_rows)
            metrics.update({"loss/skipped": 1.0, "learn/minibatches": 0.0, "learn/rows": 0.0})
            return metrics
        if keep.numel() < batch.num_rows:
            learn_batch = batch.select(keep)

    kl_coef = kl_controller.coef
    n = learn_batch.num_rows
    size = min(config.minibatch_size or n, n)
    tolerance = config.ratio_tolerance_for(bf16)
    eps_low, eps_high = config.clip_range
    # With the bf16 tolerance and GSPO-sized clip ranges (~3e-4) a ratio within tolerance may
    # legitimately clip; then the ratio bound alone is the check.
    check_clipping = tolerance < min(eps_low, eps_high)

    collected: list[dict[str, float]] = []
    first_dev = math.nan
    for iteration in range(config.num_iterations):
        order = _permutation(n, generator).to(learn_batch.actions.device)
        for start in range(0, n, size):
            minibatch = learn_batch.select(order[start : start + size])
            outputs = forward(minibatch)
            _check_outputs(outputs, minibatch)
            ref_logp = outputs.ref_logp if outputs.ref_logp is not None else minibatch.ref_logp
            if ref_logp is None and (kl_coef > 0 or config.kl_coef > 0 or kl_controller.schedule == "adaptive"):
                raise ValueError(
                    f"kl_coef = {config.kl_coef} (schedule {kl_controller.schedule!r}) needs reference log-probs, "
                    "but neither forward's PolicyOutputs.ref_logp nor batch.ref_logp holds them"
                )
            out = policy_loss(
                outputs.logp,
                minibatch.behaviour_logp,
                minibatch.advantages,
                minibatch.mask,
                config,
                ref_logp=ref_logp,
                entropy=outputs.entropy,
                kl_coef=kl_coef,
            )
            step_metrics = out.metrics
            check_finite("loss/total", step_metrics["loss/total"])
            if not collected:  # the first minibatch: weights still equal the behaviour policy's
                first_dev = step_metrics["ratio/max_abs_dev"]
                if config.check_invariants:
                    check_first_minibatch(
                        first_dev,
                        step_metrics["ratio/clip_frac"] if check_clipping else 0.0,
                        tolerance,
                        context=f"iteration {iteration}, {minibatch.num_rows} of {n} rows, bf16={bf16}",
                    )
            if config.check_invariants and "kl/min" in step_metrics:
                check_kl_nonnegative(step_metrics["kl/min"], estimator=config.kl_estimator)

            grad_norm = update(out.loss)
            collected.append({**step_metrics, "grad_norm": grad_norm})

    metrics.update(_reduce(collected))
    observed_kl = metrics.get("kl/value")
    kl_controller.update(observed_kl, n_steps=n)
    controller = kl_controller.metrics()
    metrics.update(
        {
            "kl/coef": kl_coef,
            "kl/frac_at_min": controller["kl/frac_at_min"],
            "kl/frac_at_max": controller["kl/frac_at_max"],
            "ratio/first_max_abs_dev": first_dev,
            "learn/minibatches": float(len(collected)),
            "learn/rows": float(n),
            "loss/skipped": 0.0,
        }
    )
    return metrics


# ------------------------------------------------------------------------------------------------


def _check_outputs(outputs: PolicyOutputs, minibatch: RolloutBatch) -> None:
    if not isinstance(outputs, PolicyOutputs):
        raise TypeError(f"forward must return PolicyOutputs, got {type(outputs).__name__}")
    shape = tuple(minibatch.actions.shape)
    if tuple(outputs.logp.shape) != shape:
        raise ValueError(f"forward returned logp of shape {list(outputs.logp.shape)} for actions {list(shape)}")
    if not outputs.logp.requires_grad:
        raise ValueError("forward returned logp without grad (was it run under torch.no_grad?)")


def _builtin_update(optimizer: torch.optim.Optimizer, params: list[Tensor], max_grad_norm: float) -> UpdateFn:
    """backward, clip, step (skipped with `NonFiniteError` on a non-finite gradient norm), zero_grad."""

    def update(loss: Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_grad_norm(params, max_grad_norm)
        if not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            check_finite("grad_norm", grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    return update


def _permutation(n: int, generator: torch.Generator | None) -> Tensor:
    if generator is None:
        return torch.randperm(n)
    return torch.randperm(n, generator=generator, device=generator.device)


def clip_grad_norm(params: list[Tensor], max_norm: float) -> float:
    """The total gradient norm before clipping; clips to max_norm when it is > 0."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    limit = max_norm if max_norm > 0 else math.inf
    return float(torch.nn.utils.clip_grad_norm_(with_grad, limit))


def _reduce(collected: list[dict[str, float]]) -> dict[str, float]:
    """Reduce per-minibatch metrics: names whose last part starts with min/max by min/max, others by mean."""
    reduced: dict[str, float] = {}
    for key in collected[0]:
        values = [m[key] for m in collected if key in m]
        leaf = key.rsplit("/", 1)[-1]
        if leaf.startswith("min"):
            reduced[key] = min(values)
        elif leaf.startswith("max"):
            reduced[key] = max(values)
        else:
            reduced[key] = sum(values) / len(values)
    return reduced


def _rollout_metrics(batch: RolloutBatch) -> dict[str, float]:
    """reward/* per row (row sums of valid step rewards for [N, L]) and adv/* over rows or valid tokens."""
    with torch.no_grad():
        rewards = batch.rewards
        if rewards.dim() == 2:
            rewards = torch.where(batch.mask, rewards, torch.zeros_like(rewards)).sum(dim=1)
        advantages = batch.advantages
        assert advantages is not None
        if advantages.dim() == 2:
            advantages = advantages[batch.mask]
        rewards, advantages = rewards.double(), advantages.double()
        zero = rewards.new_zeros(())
        values = torch.stack(
            [
                rewards.mean(),
                rewards.std() if rewards.numel() > 1 else zero,
                rewards.min(),
                rewards.max(),
                advantages.mean(),
                advantages.std() if advantages.numel() > 1 else zero,
            ]
        ).tolist()
    names = ["reward/mean", "reward/std", "reward/min", "reward/max", "adv/mean", "adv/std"]
    return dict(zip(names, values))
