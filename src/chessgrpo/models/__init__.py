"""The models: the action-policy transformer (`policy`), the chess language model (`lm`, its tokenizers and
sampling), what a checkpoint holds (`checkpoint_kind`) and device placement (`placement`)."""

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
