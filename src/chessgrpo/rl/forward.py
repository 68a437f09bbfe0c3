"""The learner's forward as every task builds it: the policy in eval mode, then its outputs.

A task's `make_forward` (one-move groups, trajectories, LM completions) returns the `Forward` that
`optimize` calls on each minibatch; how the log-probs and entropy are computed is the task's, the
refusal to run a model with dropout active is shared here (docs/architecture.md, invariant 2: no
dropout in RL forwards, or the recomputed log-probs would not be the sampler's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from chessgrpo.rl.batch import RolloutBatch
from chessgrpo.rl.learner import Forward, PolicyOutputs

if TYPE_CHECKING:  # pragma: no cover
    import torch


def eval_mode_forward(model: torch.nn.Module, outputs: Callable[[RolloutBatch], PolicyOutputs]) -> Forward:
    """`outputs` of each minibatch, refused (`RuntimeError`) while `model.training` is set (checked at every call)."""

    def forward(minibatch: RolloutBatch) -> PolicyOutputs:
        if model.training:
            raise RuntimeError("the GRPO forward needs the model in eval mode (no dropout in RL forwards)")
        return outputs(minibatch)

    return forward
