"""The action policy's learner forward, shared by its tasks (one-move groups and trajectories).

Rows that stand in the same position (the G moves of a group, the first plies of a trajectory group)
share one model call: the policy runs once per distinct position in the minibatch, and each row reads
its position's log-probs through the inverse index. The log-probs come from `models.policy.log_probs`
at the sampling temperature and with the same legal mask (docs/architecture.md, invariant 1). With a KL
term the same positions go through the frozen reference too, for the exact KL over every legal move.
"""

from __future__ import annotations

import dataclasses

import torch

from chessgrpo.models.policy import ActionPolicy, log_probs
from chessgrpo.rl import exact_kl


@dataclasses.dataclass
class DistinctPositions:
    """The policy's outputs on the distinct positions of a minibatch's rows."""

    positions: torch.Tensor
    """[P] the distinct position indices (into the task's tokens and legal masks), sorted."""
    inverse: torch.Tensor
    """[n] each row's index into `positions`."""
    logp_full: torch.Tensor
    """[P, A] log-probs of every action at each distinct position (masked actions at -inf)."""
    value_logits: torch.Tensor | None
    """[P] the value head's logits when asked for, else None."""


def distinct_position_log_probs(
    model: ActionPolicy,
    tokens: torch.Tensor,
    legal: torch.Tensor,
    position_index: torch.Tensor,
    temperature: float,
    *,
    bf16: bool = False,
    with_value: bool = False,
) -> DistinctPositions:
    """Run `model` once per distinct entry of `position_index` ([n] rows' indices into `tokens` [N, S] and
    `legal` [N, A]) under bf16 autocast when asked; gradients flow."""
    positions, inverse = torch.unique(position_index, return_inverse=True)
    value_logits = None
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
        if with_value:
            logits, value_logits = model(tokens[positions], with_value=True)
        else:
            logits = model(tokens[positions])
    return DistinctPositions(positions, inverse, log_probs(logits, legal[positions], temperature), value_logits)


def exact_reference_kl(
    reference: ActionPolicy,
    tokens: torch.Tensor,
    legal: torch.Tensor,
    at: DistinctPositions,
    temperature: float,
    *,
    bf16: bool = False,
) -> torch.Tensor:
    """[P] exact KL(policy || reference) over all legal moves at each of `at`'s distinct positions (the reference
    under no_grad, at the same temperature and mask; the gradient flows through the policy's log-probs)."""
    with torch.no_grad(), torch.autocast(at.logp_full.device.type, dtype=torch.bfloat16, enabled=bf16):
        ref_logits = reference(tokens[at.positions])
    ref_full = log_probs(ref_logits, legal[at.positions], temperature).to(at.logp_full.device)
    return exact_kl(at.logp_full, ref_full)
