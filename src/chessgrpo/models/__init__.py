"""Policies: the action-policy transformer (and, later, the chess language model)."""

from chessgrpo.models.policy import (
    MODEL_SIZES,
    ActionPolicy,
    ModelConfig,
    PolicyConfig,
    frozen_parameters,
    load_policy,
    log_probs,
    resolve_checkpoint,
    sample_actions,
    save_policy,
)

__all__ = [
    "MODEL_SIZES",
    "ActionPolicy",
    "ModelConfig",
    "frozen_parameters",
    "PolicyConfig",
    "load_policy",
    "log_probs",
    "resolve_checkpoint",
    "sample_actions",
    "save_policy",
]
