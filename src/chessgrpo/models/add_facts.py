"""Give a trained policy move facts it was not trained with, without changing what it plays.

A move fact's weights in `MoveFactsHead` start at zero, so a fact added to a trained network adds nothing to any
logit until training moves its weights: the widened policy's distribution equals the old one's on every position.
This is how a general policy learns to read the game's repetition count (`repetition`, `threefold`,
`allows_threefold`) in a run that starts from a checkpoint saved without them: the config's `model` section names the
facts, and `tasks.kinds.policy_base` widens the starting checkpoint with `with_move_facts` before training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from chessgrpo.board.move_facts import EXTRA_FACTS, FACT_CONFIG_KEYS
from chessgrpo.models.policy import ActionPolicy, ModelConfig

FACT_KEYS = FACT_CONFIG_KEYS
"""The config keys that switch a move fact on (`board.move_facts.FACT_CONFIG_KEYS`)."""


def requested_facts(model_config: ModelConfig) -> tuple[str, ...]:
    """The fact keys a training config's `model` section sets true (`FACT_KEYS`), in that order."""
    return tuple(key for key in FACT_KEYS if getattr(model_config, key))


def missing_facts(model: ActionPolicy, wanted: Sequence[str]) -> tuple[str, ...]:
    """The fact keys of `wanted` that `model` does not read."""
    return tuple(key for key in wanted if not getattr(model.config, key))


def with_move_facts(model: ActionPolicy, facts: Sequence[str]) -> ActionPolicy:
    """A copy of `model` that also reads the move facts `facts` (keys of `FACT_KEYS`), their weights zero.

    Every other parameter is copied, and each fact the model already read keeps its weights (matched by name, since
    adding a fact can move the others' rows), so the copy's logits equal the original's on every input it
    accepts. Adding an optional fact to a model without `move_facts` adds the rule facts too (they come together).
    """
    unknown = [key for key in facts if key not in FACT_KEYS]
    if unknown:
        raise ValueError(f"unknown move facts {unknown}; choose from {list(FACT_KEYS)}")
    added = {key: True for key in facts}
    if any(key in EXTRA_FACTS for key in facts):
        added["move_facts"] = True
    config = dataclasses.replace(model.config, **added)
    widened = ActionPolicy(config).to(model.device)
    state = {name: tensor for name, tensor in model.state_dict().items() if not name.startswith("move_facts.")}
    missing, unexpected = widened.load_state_dict(state, strict=False)
    assert not unexpected and all(name.startswith("move_facts.") for name in missing), (missing, unexpected)
    if model.move_facts is not None and widened.move_facts is not None:
        old_rows = {name: row for row, name in enumerate(model.config.fact_names)}
        with torch.no_grad():
            for row, name in enumerate(config.fact_names):
                if name in old_rows:
                    widened.move_facts.weights.weight[row] = model.move_facts.weights.weight[old_rows[name]]
                    widened.move_facts.weights.bias[row] = model.move_facts.weights.bias[old_rows[name]]
    return widened.train(model.training)
