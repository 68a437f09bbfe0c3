"""Several rollouts (e.g. of different tasks) as one batch and one forward, for one GRPO update.

A task mixture's step samples each task's groups with that task's own code (one-move groups of
length 1, trajectories of length T), and every task's forward recomputes log-probs for its own rows
only. `concat_rollouts` joins the parts into one `RolloutBatch`; `concat_forwards` gives the
forward of the joined batch: for a minibatch of joined rows it calls each part's forward on that
part's rows and pads the outputs to the joined length. The learner (`optimize`) then sees one batch.

Each part's advantages must be filled before joining: groups are centred within their own task
(a one-move group is never compared with a trajectory), with that task's reward scale.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from chessgrpo.rl.batch import RolloutBatch
from chessgrpo.rl.learner import Forward, PolicyOutputs


def _pad(value: Tensor, length: int) -> Tensor:
    """[n, L] -> [n, length] with zeros (False for bool) on the right."""
    if value.shape[1] == length:
        return value
    padding = torch.zeros(value.shape[0], length - value.shape[1], dtype=value.dtype, device=value.device)
    return torch.cat([value, padding], dim=1)


def concat_rollouts(parts: Sequence[RolloutBatch]) -> RolloutBatch:
    """The rows of `parts`, in order, as one batch (every part's advantages already filled).

    Rows keep their own length: shorter rows are padded to the longest with mask False. Advantages
    become [N, L] (a per-row advantage is broadcast over that row's valid steps), rewards the per-row
    totals [N] (what the learner logs), and group ids are offset so that groups of different parts
    never merge. `inputs` is {"part": [N], "row": [N]}: which part a row came from and its index there,
    what `concat_forwards` reads. Reference log-probs are kept only when every part has them.

    Raises ValueError when `parts` is empty or a part has no advantages.
    """
    if not parts:
        raise ValueError("concat_rollouts needs at least one rollout")
    length = max(part.actions.shape[1] for part in parts)
    device = parts[0].actions.device
    advantages, rewards, group_ids, part_ids, row_ids = [], [], [], [], []
    offset = 0
    for index, part in enumerate(parts):
        if part.advantages is None:
            raise ValueError(f"rollout {index} has no advantages: fill them with its own groups before joining")
        part.validate()
        advantage = part.advantages if part.advantages.dim() == 2 else part.advantages.unsqueeze(1).expand_as(part.mask)
        advantages.append(
            _pad(torch.where(part.mask, advantage.float(), torch.zeros_like(advantage, dtype=torch.float32)), length)
        )
        reward = (
            part.rewards
            if part.rewards.dim() == 1
            else torch.where(part.mask, part.rewards, torch.zeros_like(part.rewards)).sum(1)
        )
        rewards.append(reward.float())
        ids = part.group_ids.long()
        _, dense = torch.unique(ids, return_inverse=True)  # 0..groups-1 within the part
        group_ids.append(dense + offset)
        offset += int(dense.max()) + 1
        part_ids.append(torch.full((part.num_rows,), index, dtype=torch.long, device=device))
        row_ids.append(torch.arange(part.num_rows, device=device))
    with_reference = all(part.ref_logp is not None for part in parts)
    joined = RolloutBatch(
        inputs={"part": torch.cat(part_ids), "row": torch.cat(row_ids)},
        actions=torch.cat([_pad(part.actions, length) for part in parts]),
        behaviour_logp=torch.cat([_pad(part.behaviour_logp.float(), length) for part in parts]),
        mask=torch.cat([_pad(part.mask, length) for part in parts]),
        rewards=torch.cat(rewards),
        group_ids=torch.cat(group_ids),
        ref_logp=torch.cat([_pad(part.ref_logp.float(), length) for part in parts]) if with_reference else None,  # type: ignore[union-attr]
        advantages=torch.cat(advantages),
    )
    joined.validate()
    return joined


def concat_forwards(parts: Sequence[RolloutBatch], forwards: Sequence[Forward]) -> Forward:
    """The forward of `concat_rollouts(parts)`: each part's forward on its rows of a minibatch.

    Outputs come back in the minibatch's row order, padded to its length with zeros (the loss
    ignores masked steps). Entropy (and the reference log-probs, the exact KL) is returned when every part's
    forward returns it; the parts'
    minibatch-wide auxiliary losses are added and their per-row ones put at their rows. (Terms that a
    task adds to every minibatch whatever its rows, such as labelled-position losses, are not a part's:
    `with_minibatch_terms`.)
    """
    if len(parts) != len(forwards):
        raise ValueError(f"{len(parts)} rollouts but {len(forwards)} forwards")

    def forward(minibatch: RolloutBatch) -> PolicyOutputs:
        part_of, row_of = minibatch.inputs["part"], minibatch.inputs["row"]
        length = minibatch.actions.shape[1]
        logp: Tensor | None = None
        entropy: Tensor | None = None
        ref_logp: Tensor | None = None
        kl: Tensor | None = None
        has_entropy = has_reference = has_kl = True
        aux: Tensor | None = None
        aux_rows: Tensor | None = None
        for index in torch.unique(part_of).tolist():
            where = (part_of == index).nonzero().flatten()
            out = forwards[index](parts[index].select(row_of[where]))
            values = _pad(out.logp, length)
            if logp is None:
                logp = values.new_zeros(minibatch.actions.shape)
            logp = logp.index_put((where.to(logp.device),), values)
            if out.entropy is None:
                has_entropy = False
            elif has_entropy:
                entropy = (entropy if entropy is not None else values.new_zeros(minibatch.actions.shape)).index_put(
                    (where.to(values.device),), _pad(out.entropy, length)
                )
            if out.ref_logp is None:
                has_reference = False
            elif has_reference:
                ref_logp = (ref_logp if ref_logp is not None else values.new_zeros(minibatch.actions.shape)).index_put(
                    (where.to(values.device),), _pad(out.ref_logp, length)
                )
            if out.kl is None:
                has_kl = False
            elif has_kl:
                kl = (kl if kl is not None else values.new_zeros(minibatch.actions.shape)).index_put(
                    (where.to(values.device),), _pad(out.kl, length)
                )
            if out.aux_loss is not None:
                aux = out.aux_loss if aux is None else aux + out.aux_loss
            if out.aux_row_loss is not None:
                rows_aux = out.aux_row_loss.float()
                aux_rows = (aux_rows if aux_rows is not None else rows_aux.new_zeros(minibatch.num_rows)).index_put(
                    (where.to(rows_aux.device),), rows_aux
                )
        assert logp is not None  # a minibatch has at least one row
        return PolicyOutputs(
            logp=logp,
            entropy=entropy if has_entropy else None,
            ref_logp=ref_logp if has_reference else None,
            kl=kl if has_kl else None,
            aux_loss=aux,
            aux_row_loss=aux_rows,
        )

    return forward


def with_minibatch_terms(forward: Forward, terms: Callable[[], Tensor]) -> Forward:
    """`forward` with `terms()` added to every call's `aux_loss`: losses of the whole minibatch rather than
    of its rows (e.g. on labelled positions drawn per call). Data-parallel ranks call it once per
    minibatch each, so with the same draws their shares add up to it once (`rl.learner.optimize`)."""

    def forward_with_terms(minibatch: RolloutBatch) -> PolicyOutputs:
        out = forward(minibatch)
        extra = terms()
        return dataclasses.replace(out, aux_loss=extra if out.aux_loss is None else out.aux_loss + extra)

    return forward_with_terms
