"""`optimize`: the PPO-epoch optimisation of a policy over one rollout batch, policy-agnostic.

The caller owns the model, the optimizer, the LR schedule and sampling; it hands over a
`RolloutBatch`, a `forward` function that recomputes, for any subset of rows, the log-probs
of the sampled tokens under the current weights (and optionally the exact entropy and the
reference log-probs), and the `update` that backpropagates a minibatch loss and steps the optimizer
(the training spine's `train.learner.Learner.update`). One call is one training step:

1. advantages, unless the caller filled them, by the batch's `supervision` (`compute_advantages`:
   outcome rewards [N] -> `group_advantages`; step rewards [N, L] -> `process_advantages`,
   `stepwise_advantages` or `critic_advantages`);
2. zero-std groups counted (``rollout/frac_reward_zero_std``) and, with DAPO dynamic sampling,
   dropped; a batch with nothing left is skipped (``loss/skipped`` = 1, no optimizer step);
3. ``num_iterations`` epochs over shuffled minibatches of whole rows: forward, `policy_loss`,
   backward, gradient clipping, optimizer step. With ``micro_batch_size`` a minibatch runs as
   micro-batches (forward + backward each, losses weighted by their share of the minibatch's tokens
   or rows, so the accumulated gradient is the minibatch's) and then one step: peak memory follows
   the micro-batch, the optimisation does not change;
4. the very first minibatch runs with the weights that sampled the batch, so the ratio must be 1:
   `check_first_minibatch` raises otherwise, checked on each of its micro-batches
   (docs/architecture.md, invariant 1). A pipelined step (``grpo.pipeline``) learns from a batch sampled
   one update earlier: `behaviour_forward` recomputes the first minibatch on the snapshot that sampled
   it, which is what the check holds to 1; the live weights' deviation is logged as
   ``ratio/lag_first_max_abs_dev`` and clipped like any off-policy PPO ratio;
5. the KL controller is updated once with the mean observed KL.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from chessgrpo.rl.advantages import (
    critic_advantages,
    group_advantages,
    process_advantages,
    stepwise_advantages,
    zero_advantage_groups,
    zero_std_groups,
)
from chessgrpo.rl.batch import RolloutBatch
from chessgrpo.rl.config import GRPOConfig
from chessgrpo.rl.invariants import check_first_minibatch, check_kl_nonnegative, ratio_max_abs_dev
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
    kl: Tensor | None = None
    """[n, L] exact KL(policy || reference) of the whole next-action distribution at each step (with grad; 0 at
    masked steps): the KL term under ``kl_estimator: exact``. None when the forward has no reference."""
    aux_loss: Tensor | None = None
    """A scalar term of the whole minibatch (with grad), e.g. a value loss on labelled positions drawn
    for it; logged in ``loss/aux``. None = nothing added. With micro-batches or data-parallel ranks it
    is weighted like the policy loss of the rows it came with, so ranks that draw the same positions
    add up to it once."""
    aux_row_loss: Tensor | None = None
    """[n] a per-row auxiliary loss (with grad; 0 for rows without one), e.g. a value head's regression on
    the engine value of each row's position. The minibatch's term is its mean over the minibatch's rows
    (all ranks and micro-batches together: each adds its rows' sum over the minibatch's row count), so
    the result does not depend on how the rows are split. None = nothing added."""


Forward = Callable[[RolloutBatch], PolicyOutputs]


class DataParallel(Protocol):
    """What `optimize` needs from a data-parallel run (`train.distributed.Parallel` provides it)."""

    world_size: int
    rank: int

    def all_gather(self, value: Any) -> list[Any]: ...

    def sum(self, values: Sequence[float]) -> list[float]: ...

    def std(self, values: Tensor) -> Tensor: ...


def compute_advantages(batch: RolloutBatch, config: GRPOConfig, parallel: DataParallel | None = None) -> Tensor:
    """Advantages for `batch` by its supervision (`RolloutBatch.reward_supervision`), with the config's
    estimator and epsilon: ``outcome`` [N] -> `group_advantages`, ``process`` [N, L] ->
    `process_advantages`, ``step`` [N, L] -> `stepwise_advantages`, ``critic`` [N, L] -> `critic_advantages`.

    Groups never span ranks, so only the batch-wide stds (``batch_std``, ``critic``) need the other
    ranks' rewards (`parallel`).
    """
    supervision = batch.reward_supervision
    if supervision == "outcome":
        batch_std = None
        if config.advantage_estimator == "batch_std" and parallel is not None and parallel.world_size > 1:
            batch_std = parallel.std(batch.rewards.double())
        return group_advantages(
            batch.rewards, batch.group_ids, config.advantage_estimator, config.advantage_epsilon, batch_std=batch_std
        )
    if supervision == "process":
        return process_advantages(
            batch.rewards, batch.mask, batch.group_ids, config.advantage_epsilon, estimator=config.advantage_estimator
        )
    if supervision == "step":
        return stepwise_advantages(
            batch.rewards, batch.mask, batch.group_ids, config.advantage_epsilon, estimator=config.advantage_estimator
        )
    if supervision == "critic":
        several = parallel is not None and parallel.world_size > 1
        batch_std = parallel.std(batch.rewards[batch.mask].double()) if parallel is not None and several else None
        return critic_advantages(batch.rewards, batch.mask, config.advantage_epsilon, batch_std=batch_std)
    raise ValueError(f"unknown supervision {supervision!r} (RolloutBatch.supervision)")


UpdateFn = Callable[..., float]
"""``update(loss)``: takes a minibatch loss, does backward, gradient clipping and one optimizer step
(or raises `NonFiniteError` without stepping) and returns the gradient norm before clipping.
``update(loss, step=False)`` (needed only with `GRPOConfig.micro_batch_size`) only adds
backward(loss) to the accumulated gradients; the minibatch's last micro-batch then calls
``update(loss)``. The training spine supplies the one update (`train.learner.Learner.update`), so
clipping and divergence handling live there."""


def optimize(
    batch: RolloutBatch,
    forward: Forward,
    update: UpdateFn,
    config: GRPOConfig,
    kl_controller: KLController,
    *,
    parameters: Iterable[Tensor] = (),
    generator: torch.Generator | None,
    bf16: bool = False,
    parallel: DataParallel | None = None,
    shuffle_seed: int | None = None,
    step: int | None = None,
    behaviour_forward: Forward | None = None,
) -> dict[str, float]:
    """One GRPO training step on `batch`; returns its metrics as plain floats.

    Args:
        batch: the rollout; `batch.advantages` is filled in place when it is None.
        forward: recomputes `PolicyOutputs` for a minibatch (a `RolloutBatch` of whole rows). It must
            run without dropout and with the sampling temperature and masks.
        update: backward + clip + optimizer step for a minibatch loss (`UpdateFn`), called once per
            minibatch (per micro-batch with ``step=False`` before its last); the caller steps any LR
            scheduler.
        config: the algorithm's hyperparameters.
        kl_controller: supplies the KL coefficient (fixed for this call) and is updated once.
        parameters: the trainable parameters, for the per-term gradient norms (optional).
        generator: shuffles rows between minibatches when `shuffle_seed` is None (None: torch's global generator).
        bf16: the forwards run in bf16, so the first-minibatch ratio check uses ratio_tolerance_bf16.
        parallel: in a data-parallel run, `batch` holds this rank's rows (whole groups) and the
            global batch is every rank's rows in rank order. Minibatches are drawn over the global
            rows; each rank backpropagates its share, weighted by (its normaliser / the minibatch's)
            x world size, so the gradient DDP averages equals the one-process gradient.
        shuffle_seed: seeds the minibatch shuffle (the same rows in every process and world size).
        step: the training step (counted from 0, as the spine's kinds get it); with `parameters`,
            single-process, on steps 0, k, 2k, ... for k = config.term_gradient_every, each loss
            term's gradient norm is measured on the first micro-batch (``grad_norm/{policy,kl,
            entropy,aux}``, `term_gradient_norms`).
        behaviour_forward: the same forward on the weights that sampled `batch`, when they are not the
            current ones (a pipelined step); the first minibatch's ratio invariant is then checked on it
            (no gradient), and the current weights' first-minibatch deviation is only logged.

    Metrics: the per-minibatch `policy_loss` metrics reduced over minibatches (``*/min*`` by min,
    ``*/max*`` by max, the rest by mean), plus ``grad_norm`` (mean, before clipping),
    ``reward/{mean,std,min,max}`` (per row; the row's sum of valid step rewards for step rewards),
    ``adv/{mean,std}`` (per row, or per valid token for [N, L] advantages), ``rollout/frac_reward_zero_std``,
    ``ratio/first_max_abs_dev`` (of the weights that sampled: `behaviour_forward`'s when given, and then
    also ``ratio/lag_first_max_abs_dev``, the current weights'), ``kl/coef`` (used in this step), ``kl/frac_at_min``,
    ``kl/frac_at_max``, ``learn/minibatches``, ``learn/rows`` and ``loss/skipped``. In a
    data-parallel run the metrics are this rank's (the training spine averages them over ranks).

    Raises:
        InvariantViolation: the first minibatch's ratio is not 1 (with config.check_invariants), a
            non-negative KL estimate went negative, or the loss or gradient norm is not finite
            (always; no optimizer step is taken then).
    """
    batch.validate()
    params = list(parameters)
    world_size = parallel.world_size if parallel is not None else 1
    every = config.term_gradient_every
    # DDP reduces gradients in backward hooks, so a side autograd.grad is only safe in one process.
    measure_terms = bool(params) and step is not None and every > 0 and step % every == 0 and world_size == 1
    if batch.advantages is None:
        batch.advantages = compute_advantages(batch, config, parallel)
    step_mask = batch.mask if batch.rewards.dim() == 2 else None
    zero_rows, frac_zero = zero_std_groups(batch.rewards, batch.group_ids, step_mask)
    metrics: dict[str, float] = {"rollout/frac_reward_zero_std": frac_zero, **_rollout_metrics(batch)}

    learn_batch = batch
    if config.drop_zero_std_groups:
        # Group-relative advantages are all 0 exactly when the group's rewards are all equal; critic advantages are
        # not centred on the group, so there only a group of all-zero advantages is without signal.
        if batch.reward_supervision == "critic":
            zero_rows = zero_advantage_groups(batch.advantages, batch.group_ids, step_mask)
        keep = (~zero_rows).nonzero().flatten()
        if keep.numel() < batch.num_rows:
            learn_batch = batch.select(keep)
    layout = _RowLayout.of(learn_batch, parallel)
    n = layout.total_rows
    if n == 0:
        logger.info("every group of the %d-row batch has all-equal rewards: step skipped", batch.num_rows)
        metrics.update({"loss/skipped": 1.0, "learn/minibatches": 0.0, "learn/rows": 0.0})
        return metrics

    kl_coef = kl_controller.coef
    size = min(config.minibatch_size or n, n)
    tolerance = config.ratio_tolerance_for(bf16)
    eps_low, eps_high = config.clip_range
    # With the bf16 tolerance and GSPO-sized clip ranges (~3e-4) a ratio within tolerance may
    # legitimately clip; then the ratio bound alone is the check.
    check_clipping = tolerance < min(eps_low, eps_high)
    shuffler = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else generator

    collected: list[dict[str, float]] = []
    first_dev = lag_dev = math.nan
    minibatches = 0
    for iteration in range(config.num_iterations):
        order = _permutation(n, shuffler)
        for start in range(0, n, size):
            rows = order[start : start + size]
            minibatches += 1
            first = iteration == 0 and start == 0  # the weights still equal the behaviour policy's
            micro_rows: list[dict[str, float]] = []
            micro_weights: list[float] = []
            grad_norm = math.nan
            parts = layout.micro_batches(rows, config.micro_batch_size, config.loss_aggregation, world_size)
            for index, (local, weight) in enumerate(parts):
                last = index == len(parts) - 1
                if local.numel() == 0:  # this rank holds none of these rows: join DDP's reduction with 0
                    outputs = forward(layout.placeholder(learn_batch, batch))
                    # Every output in the graph (x 0), so every parameter the other ranks use gets a gradient here too.
                    grad_norm = _update(update, _all_outputs(outputs) * 0.0, last)
                    continue
                minibatch = learn_batch.select(local.to(learn_batch.actions.device))
                outputs = forward(minibatch)
                context = f"iteration {iteration}, {minibatch.num_rows} of {n} rows, bf16={bf16}"
                lagged = first and behaviour_forward is not None
                loss, step_metrics, terms = _micro_batch_loss(
                    minibatch,
                    outputs,
                    config,
                    kl_controller,
                    kl_coef,
                    check=first and config.check_invariants and not lagged,
                    check_clipping=check_clipping,
                    tolerance=tolerance,
                    context=context,
                )
                checked_dev = step_metrics.get("ratio/max_abs_dev", math.nan)
                if lagged:  # the invariant holds for the sampling snapshot; the live weights are one update on
                    assert behaviour_forward is not None
                    lag_dev = checked_dev if math.isnan(lag_dev) else max(lag_dev, checked_dev)
                    checked_dev = _sampler_deviation(behaviour_forward, minibatch, config, tolerance, context)
                weighted = loss if weight == 1.0 else loss * weight
                if outputs.aux_row_loss is not None:
                    # The rows' sum over the whole minibatch's row count (x world size: DDP averages over ranks).
                    weighted = weighted + outputs.aux_row_loss.sum() * (world_size / rows.numel())
                    step_metrics["loss/aux"] = step_metrics.get("loss/aux", 0.0) + float(
                        outputs.aux_row_loss.detach().mean()
                    )
                if first:  # the largest deviation over the first minibatch's micro-batches
                    first_dev = checked_dev if math.isnan(first_dev) else max(first_dev, checked_dev)
                if first and index == 0 and measure_terms:
                    metrics.update(term_gradient_norms(terms, params))
                grad_norm = _update(update, weighted, last)
                micro_rows.append(step_metrics)
                micro_weights.append(weight)
            if micro_rows:
                collected.append({**combine_micro_metrics(micro_rows, micro_weights), "grad_norm": grad_norm})

    if collected:
        metrics.update(reduce_metrics(collected))
    observed_kl = metrics.get("kl/value")
    if parallel is not None and world_size > 1:  # every rank updates its controller with the same value
        kl_values = [m["kl/value"] for m in collected if "kl/value" in m]
        total, count = parallel.sum([math.fsum(kl_values), len(kl_values)])
        observed_kl = total / count if count else None
    kl_controller.update(observed_kl, n_steps=n)
    controller = kl_controller.metrics()
    metrics.update(
        {
            "kl/coef": kl_coef,
            "kl/frac_at_min": controller["kl/frac_at_min"],
            "kl/frac_at_max": controller["kl/frac_at_max"],
            "learn/minibatches": float(minibatches),
            "learn/rows": float(n),
            "loss/skipped": 0.0,
        }
    )
    if world_size == 1 or not math.isnan(first_dev):  # a rank without the first minibatch has nothing to say
        metrics["ratio/first_max_abs_dev"] = first_dev
    if behaviour_forward is not None and not math.isnan(lag_dev):
        metrics["ratio/lag_first_max_abs_dev"] = lag_dev
    return metrics


@dataclasses.dataclass
class _RowLayout:
    """Where this rank's rows sit in the global batch (every rank's rows in rank order)."""

    offset: int
    local_rows: int
    tokens: Tensor
    """[total rows] valid tokens of every global row (the token_mean normaliser)."""
    ranks: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    """(offset, rows) of every rank, in rank order (one entry in a single process)."""

    @classmethod
    def of(cls, batch: RolloutBatch, parallel: DataParallel | None) -> _RowLayout:
        counts = batch.mask.sum(dim=1).cpu() if batch.num_rows else torch.zeros(0, dtype=torch.long)
        if parallel is None or parallel.world_size == 1:
            return cls(0, batch.num_rows, counts, [(0, batch.num_rows)])
        everyone = parallel.all_gather(counts)
        sizes = [int(c.numel()) for c in everyone]
        offsets = [sum(sizes[:r]) for r in range(len(sizes))]
        rank = parallel.rank
        return cls(offsets[rank], batch.num_rows, torch.cat(everyone), list(zip(offsets, sizes)))

    @property
    def total_rows(self) -> int:
        return int(self.tokens.numel())

    def share(self, rows: Tensor, aggregation: str, world_size: int) -> tuple[Tensor, float]:
        """This rank's rows (local indices) of the global minibatch `rows`, and the weight of its loss."""
        if world_size == 1:
            return rows, 1.0
        mine = (rows >= self.offset) & (rows < self.offset + self.local_rows)
        local = rows[mine] - self.offset
        return local, self._weight(local, rows, aggregation, world_size)

    def micro_batches(
        self, rows: Tensor, micro_size: int, aggregation: str, world_size: int
    ) -> list[tuple[Tensor, float]]:
        """This rank's share of the global minibatch `rows` cut into micro-batches of <= `micro_size`
        rows (0 = one), each with its loss weight: world size x its share of the minibatch's valid
        tokens (token_mean) or rows (sequence means), so the weighted micro-batch losses sum to
        exactly the minibatch's loss, and their gradients to its gradient. Every rank gets the
        same number of micro-batches (DDP reduces in every backward); a rank with fewer rows gets
        empty ones (run on a placeholder row at weight 0)."""
        local, weight = self.share(rows, aggregation, world_size)
        if micro_size <= 0:
            return [(local, weight)]
        largest = max(int(((rows >= lo) & (rows < lo + count)).sum()) for lo, count in self.ranks)
        count = max(1, math.ceil(largest / micro_size))
        if count == 1:
            return [(local, weight)]
        chunks = [local[i * micro_size : (i + 1) * micro_size] for i in range(count)]
        return [(chunk, self._weight(chunk, rows, aggregation, world_size)) for chunk in chunks]

    def _weight(self, local: Tensor, rows: Tensor, aggregation: str, world_size: int) -> float:
        """world size x (the part `local` of this rank's rows holds) / (the whole minibatch `rows`)."""
        if aggregation == "token_mean":  # each loss is a token mean: weight by its share of tokens
            part, whole = float(self.tokens[local + self.offset].sum()), float(self.tokens[rows].sum())
        else:  # sequence means: weight by its share of rows
            part, whole = float(local.numel()), float(rows.numel())
        return world_size * part / whole

    @staticmethod
    def placeholder(learn_batch: RolloutBatch, batch: RolloutBatch) -> RolloutBatch:
        """One row to run the forward on when this rank holds none of a minibatch (its loss counts 0)."""
        source = learn_batch if learn_batch.num_rows else batch
        return source.select(torch.zeros(1, dtype=torch.long, device=source.actions.device))


# ------------------------------------------------------------------------------------------------


def _all_outputs(outputs: PolicyOutputs) -> Tensor:
    """The sum of every tensor output of a forward (to put all of them in a zero-weighted graph)."""
    total = outputs.logp.sum()
    for extra in (outputs.aux_loss, outputs.aux_row_loss, outputs.kl):
        if extra is not None:
            total = total + extra.sum()
    return total


def _sampler_deviation(
    behaviour_forward: Forward, minibatch: RolloutBatch, config: GRPOConfig, tolerance: float, context: str
) -> float:
    """max |ratio - 1| of the sampling weights' recomputed log-probs on `minibatch` (no gradient); with
    config.check_invariants, `check_first_minibatch` on it: the learner's forward must reproduce the sampler."""
    with torch.no_grad():
        logp = behaviour_forward(minibatch).logp
    if tuple(logp.shape) != tuple(minibatch.actions.shape):
        raise ValueError(
            f"behaviour_forward returned logp of shape {list(logp.shape)} for actions {list(minibatch.actions.shape)}"
        )
    deviation = ratio_max_abs_dev(logp, minibatch.behaviour_logp, minibatch.mask)
    if config.check_invariants:
        # Within tolerance the sampler's ratio cannot clip (the tolerance is below the clip range, or the bound alone is the check).
        check_first_minibatch(deviation, 0.0, tolerance, context=f"{context}, on the sampling snapshot")
    return deviation


def _check_outputs(outputs: PolicyOutputs, minibatch: RolloutBatch) -> None:
    if not isinstance(outputs, PolicyOutputs):
        raise TypeError(f"forward must return PolicyOutputs, got {type(outputs).__name__}")
    shape = tuple(minibatch.actions.shape)
    if tuple(outputs.logp.shape) != shape:
        raise ValueError(f"forward returned logp of shape {list(outputs.logp.shape)} for actions {list(shape)}")
    if not outputs.logp.requires_grad:
        raise ValueError("forward returned logp without grad (was it run under torch.no_grad?)")
    if outputs.aux_row_loss is not None and tuple(outputs.aux_row_loss.shape) != shape[:1]:
        raise ValueError(
            f"forward returned aux_row_loss of shape {list(outputs.aux_row_loss.shape)} for {shape[0]} rows"
        )


def _micro_batch_loss(
    minibatch: RolloutBatch,
    outputs: PolicyOutputs,
    config: GRPOConfig,
    kl_controller: KLController,
    kl_coef: float,
    *,
    check: bool,
    check_clipping: bool,
    tolerance: float,
    context: str,
) -> tuple[Tensor, dict[str, float], dict[str, Tensor]]:
    """The loss (policy + KL + entropy + aux) of one (micro-)batch, its metrics and its terms (with
    grad, `LossOutput.terms` plus ``aux``); with `check`, the first-minibatch ratio invariant
    (docs/architecture.md, invariant 1), and the KL sign check."""
    _check_outputs(outputs, minibatch)
    ref_logp = outputs.ref_logp if outputs.ref_logp is not None else minibatch.ref_logp
    needs_kl = kl_coef > 0 or config.kl_coef > 0 or kl_controller.schedule == "adaptive"
    if needs_kl and config.kl_estimator == "exact" and outputs.kl is None:
        raise ValueError(
            f"kl_coef = {config.kl_coef} (schedule {kl_controller.schedule!r}) with kl_estimator 'exact' needs the exact "
            "per-step KL, but the task's forward returned no PolicyOutputs.kl (was it given the reference?)"
        )
    if needs_kl and config.kl_estimator != "exact" and ref_logp is None:
        raise ValueError(
            f"kl_coef = {config.kl_coef} (schedule {kl_controller.schedule!r}) needs reference log-probs, "
            "but neither forward's PolicyOutputs.ref_logp nor batch.ref_logp holds them"
        )
    if minibatch.advantages is None:
        raise ValueError("the minibatch has no advantages (rl.compute_advantages fills them before optimize)")
    out = policy_loss(
        outputs.logp,
        minibatch.behaviour_logp,
        minibatch.advantages,
        minibatch.mask,
        config,
        ref_logp=ref_logp,
        kl=outputs.kl,
        entropy=outputs.entropy,
        kl_coef=kl_coef,
    )
    step_metrics = out.metrics
    if check:
        check_first_minibatch(
            step_metrics["ratio/max_abs_dev"],
            step_metrics["ratio/clip_frac"] if check_clipping else 0.0,
            tolerance,
            context=context,
        )
    if config.check_invariants and "kl/min" in step_metrics:
        check_kl_nonnegative(step_metrics["kl/min"], estimator=config.kl_estimator)
    loss, terms = out.loss, dict(out.terms)
    if outputs.aux_loss is not None:
        loss = loss + outputs.aux_loss
        terms["aux"] = outputs.aux_loss
        step_metrics = {**step_metrics, "loss/aux": float(outputs.aux_loss.detach())}
    return loss, step_metrics, terms


TERM_NAMES = ("policy", "kl", "entropy", "aux")


def term_gradient_norms(terms: dict[str, Tensor], parameters: Sequence[Tensor]) -> dict[str, float]:
    """``grad_norm/<term>``: the L2 norm of each loss term's own gradient, over the parameters the
    policy term reaches (the trunk and policy head: a value head's private weights say nothing about
    what moves the policy). Absent terms are 0. Computed with `torch.autograd.grad` on a retained
    graph, so nothing accumulates into ``.grad`` and the update is unchanged."""
    trainable = [p for p in parameters if p.requires_grad]
    policy_grads = torch.autograd.grad(terms["policy"], trainable, retain_graph=True, allow_unused=True)
    shared = [i for i, g in enumerate(policy_grads) if g is not None]
    out: dict[str, float] = {}
    for name in TERM_NAMES:
        term = terms.get(name)
        if name == "policy":
            grads = [policy_grads[i] for i in shared]
        elif term is None or not term.requires_grad:
            out[f"grad_norm/{name}"] = 0.0
            continue
        else:
            every = torch.autograd.grad(term, [trainable[i] for i in shared], retain_graph=True, allow_unused=True)
            grads = [g for g in every if g is not None]
        out[f"grad_norm/{name}"] = (
            float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads]))) if grads else 0.0
        )
    return out


def _update(update: UpdateFn, loss: Tensor, last: bool) -> float:
    """The minibatch's last micro-batch steps; the others only accumulate (plain ``update(loss)``
    when there is one micro-batch, so an `UpdateFn` without ``step=`` works without micro-batches)."""
    return update(loss) if last else update(loss, step=False)


def combine_micro_metrics(rows: list[dict[str, float]], weights: list[float]) -> dict[str, float]:
    """One minibatch's metrics from its micro-batches': ``min*``/``max*`` leaves by min/max, the rest
    by the mean weighted by each micro-batch's loss weight (its share of the minibatch's tokens or
    rows), which makes the loss terms exactly the minibatch's (approximate for nonlinear ones: shares)."""
    if len(rows) == 1:
        return rows[0]
    total = math.fsum(weights) or 1.0
    combined: dict[str, float] = {}
    for key in dict.fromkeys(key for m in rows for key in m):
        pairs = [(m[key], w) for m, w in zip(rows, weights) if key in m]
        leaf = key.rsplit("/", 1)[-1]
        if leaf.startswith("min"):
            combined[key] = min(v for v, _ in pairs)
        elif leaf.startswith("max"):
            combined[key] = max(v for v, _ in pairs)
        else:
            weight = math.fsum(w for _, w in pairs) or total
            combined[key] = math.fsum(v * w for v, w in pairs) / weight
    return combined


def _permutation(n: int, generator: torch.Generator | None) -> Tensor:
    if generator is None:
        return torch.randperm(n)
    return torch.randperm(n, generator=generator, device=generator.device)


def clip_grad_norm(params: Sequence[Tensor], max_norm: float) -> float:
    """The total gradient norm before clipping; clips to max_norm when it is > 0."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    limit = max_norm if max_norm > 0 else math.inf
    return float(torch.nn.utils.clip_grad_norm_(with_grad, limit))


def reduce_metrics(collected: list[dict[str, float]]) -> dict[str, float]:
    """Reduce metric rows (minibatches, data-parallel ranks): each name over the rows that hold it,
    names whose last part starts with min/max by min/max, others by mean."""
    reduced: dict[str, float] = {}
    for key in dict.fromkeys(key for m in collected for key in m):
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
