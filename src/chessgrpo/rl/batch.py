"""`RolloutBatch`: what a task hands to the learner, as tensors only.

A row is one sampled sequence of length L with a validity mask: a single move (L = 1), a
trajectory of the agent's own plies (L = T) or an LM completion (L tokens). Rows of the same
group share a prompt (position, trajectory start), so the group's rewards give the baseline.
Rows are always kept whole: minibatches select rows, never tokens.

`inputs` is whatever the caller's forward function needs to recompute log-probs; `rl/` never
looks inside it except to select rows. Supported shapes of `inputs` (recursively):

- a Tensor whose first dimension is the row;
- a Mapping (e.g. {"input_ids": ..., "attention_mask": ...}) of supported values;
- a tuple of supported values (a fixed structure such as ``(tokens, legal_mask)``);
- a list with one item per row (e.g. FEN strings kept for debugging);
- None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from chessgrpo.rl.advantages import SUPERVISIONS

_FLOAT_DTYPES = (torch.float32, torch.float64)


@dataclasses.dataclass
class RolloutBatch:
    """N sampled rows of length L, their behaviour log-probs, rewards and groups."""

    inputs: Any
    """What the policy's forward needs for these rows (opaque to rl/; see the module docstring)."""
    actions: Tensor
    """[N, L] long: the sampled token/action ids (any value at masked positions)."""
    behaviour_logp: Tensor
    """[N, L] float32: log-prob of each sampled token under the sampling policy, at sampling time."""
    mask: Tensor
    """[N, L] bool: True where the token is part of the sequence (and enters the loss)."""
    rewards: Tensor
    """[N] float (outcome reward per row) or [N, L] float (process reward per step)."""
    group_ids: Tensor
    """[N] integer: rows with the same id form a group; ids need not be contiguous."""
    ref_logp: Tensor | None = None
    """[N, L] float: log-probs under the frozen reference, when computed at rollout time."""
    advantages: Tensor | None = None
    """[N] or [N, L] float: filled by the learner (`optimize`) or by the caller."""
    supervision: str | None = None
    """What the rewards are, and so how the learner turns them into advantages (`rl.compute_advantages`):
    "outcome" (rewards [N]), "process", "step" or "critic" (rewards [N, L]; `rl.advantages`). None = by
    the rewards' shape: "outcome" for [N], "process" for [N, L]."""
    extras: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    """Other per-row tensors the policy needs (e.g. legal masks), first dimension N."""

    @property
    def num_rows(self) -> int:
        """N, the number of sequences."""
        return int(self.actions.shape[0])

    @property
    def reward_supervision(self) -> str:
        """`supervision`, or its default for the rewards' shape ("outcome" for [N], "process" for [N, L])."""
        if self.supervision is not None:
            return self.supervision
        return "outcome" if self.rewards.dim() == 1 else "process"

    def validate(self) -> None:
        """Check shapes, dtypes and values; raise ValueError naming the offending field."""
        if self.actions.dim() != 2:
            raise ValueError(f"actions must be [N, L], got shape {tuple(self.actions.shape)}")
        if self.actions.dtype != torch.long:
            raise ValueError(f"actions must be torch.long, got {self.actions.dtype}")
        n, length = self.actions.shape
        shape = (n, length)
        if n == 0 or length == 0:
            raise ValueError(f"actions is empty (shape {tuple(shape)}); a batch needs N >= 1 rows of L >= 1")
        device = self.actions.device

        def check_tensor(name: str, value: Tensor, shapes: tuple[tuple[int, ...], ...]) -> None:
            if not isinstance(value, Tensor):
                raise ValueError(f"{name} must be a Tensor, got {type(value).__name__}")
            if tuple(value.shape) not in shapes:
                expected = " or ".join(str(list(s)) for s in shapes)
                raise ValueError(f"{name} must have shape {expected}, got {list(value.shape)}")
            if value.device != device:
                raise ValueError(f"{name} is on {value.device} but actions are on {device}")

        check_tensor("mask", self.mask, (shape,))
        if self.mask.dtype != torch.bool:
            raise ValueError(f"mask must be torch.bool, got {self.mask.dtype}")
        empty = ~self.mask.any(dim=1)
        if bool(empty.any()):
            rows = empty.nonzero().flatten()[:10].tolist()
            raise ValueError(f"mask: rows {rows} have no valid token; every row must have at least one")

        check_tensor("behaviour_logp", self.behaviour_logp, (shape,))
        if self.behaviour_logp.dtype not in _FLOAT_DTYPES:
            raise ValueError(
                f"behaviour_logp must be float32 (or float64), got {self.behaviour_logp.dtype}: "
                "compute log-probs in fp32 even when the forward runs in bf16"
            )
        valid_logp = self.behaviour_logp[self.mask]
        if not bool(torch.isfinite(valid_logp).all()):
            raise ValueError("behaviour_logp is not finite at a valid token (a sampled token had probability 0?)")
        if bool((valid_logp > 1e-4).any()):
            raise ValueError(f"behaviour_logp must be <= 0 (a log-probability), max is {float(valid_logp.max()):.6g}")

        check_tensor("rewards", self.rewards, ((n,), shape))
        if not self.rewards.is_floating_point():
            raise ValueError(f"rewards must be a float tensor, got {self.rewards.dtype}")
        if not bool(torch.isfinite(self.rewards).all()):
            raise ValueError("rewards contain NaN or Inf; a failed reward must raise upstream, never be stored")
        if self.supervision is not None and self.supervision not in SUPERVISIONS:
            raise ValueError(f"supervision must be None or one of {list(SUPERVISIONS)}, got {self.supervision!r}")
        if (self.reward_supervision == "outcome") != (self.rewards.dim() == 1):
            raise ValueError(
                f"supervision {self.reward_supervision!r} does not fit rewards of shape {list(self.rewards.shape)}: "
                "outcome rewards are [N], process, step and critic rewards [N, L]"
            )

        check_tensor("group_ids", self.group_ids, ((n,),))
        if self.group_ids.is_floating_point() or self.group_ids.dtype == torch.bool or self.group_ids.is_complex():
            raise ValueError(f"group_ids must be an integer tensor, got {self.group_ids.dtype}")

        if self.ref_logp is not None:
            check_tensor("ref_logp", self.ref_logp, (shape,))
            if not self.ref_logp.is_floating_point():
                raise ValueError(f"ref_logp must be a float tensor, got {self.ref_logp.dtype}")
        if self.advantages is not None:
            check_tensor("advantages", self.advantages, ((n,), shape))
            if not self.advantages.is_floating_point():
                raise ValueError(f"advantages must be a float tensor, got {self.advantages.dtype}")
            if not bool(torch.isfinite(self.advantages).all()):
                raise ValueError("advantages contain NaN or Inf")
        if not isinstance(self.extras, dict):
            raise ValueError(f"extras must be a dict of tensors, got {type(self.extras).__name__}")
        for key, value in self.extras.items():
            if not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != n:
                got = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"extras[{key!r}] must be a tensor with first dimension N={n}, got {got}")
        _check_inputs(self.inputs, n, "inputs")

    def select(self, index: Tensor) -> RolloutBatch:
        """The rows `index` (long indices or a bool mask [N]) of every per-row field, as a new batch."""
        if not isinstance(index, Tensor):
            index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            if tuple(index.shape) != (self.num_rows,):
                raise ValueError(f"a boolean row index must have shape [{self.num_rows}], got {list(index.shape)}")
            index = index.nonzero().flatten()
        if index.dim() != 1:
            raise ValueError(f"row index must be one-dimensional, got shape {list(index.shape)}")
        index = index.to(device=self.actions.device, dtype=torch.long)

        def rows(value: Tensor | None) -> Tensor | None:
            return None if value is None else value[index.to(value.device)]

        return RolloutBatch(
            inputs=_select_inputs(self.inputs, index),
            actions=self.actions[index],
            behaviour_logp=self.behaviour_logp[index],
            mask=self.mask[index],
            rewards=self.rewards[index],
            group_ids=self.group_ids[index],
            ref_logp=rows(self.ref_logp),
            advantages=rows(self.advantages),
            supervision=self.supervision,
            extras={key: value[index.to(value.device)] for key, value in self.extras.items()},
        )


def _check_inputs(value: Any, n: int, name: str) -> None:
    if value is None:
        return
    if isinstance(value, Tensor):
        if value.dim() == 0 or value.shape[0] != n:
            raise ValueError(f"{name} must have first dimension N={n}, got shape {list(value.shape)}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_inputs(item, n, f"{name}[{key!r}]")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            _check_inputs(item, n, f"{name}[{i}]")
    elif isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"{name} is a list of {len(value)} items; a list in inputs holds one item per row (N={n})")
    else:
        raise ValueError(
            f"{name} has unsupported type {type(value).__name__}; use a Tensor, a Mapping, a tuple, "
            "a list with one item per row, or None"
        )


def _select_inputs(value: Any, index: Tensor) -> Any:
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value[index.to(value.device)]
    if isinstance(value, Mapping):
        return {key: _select_inputs(item, index) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(_select_inputs(item, index) for item in value)
    if isinstance(value, list):
        return [value[i] for i in index.tolist()]
    raise TypeError(f"cannot select rows of inputs of type {type(value).__name__} (see RolloutBatch)")
