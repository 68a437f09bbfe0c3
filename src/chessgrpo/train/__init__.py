"""Training loops (supervised pretraining; GRPO later), checkpoints, schedules, in-memory data."""

from chessgrpo.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    save_checkpoint,
)
from chessgrpo.train.pretrain import (
    ModelConfig,
    PretrainConfig,
    Pretrainer,
    PretrainResult,
    TrainingDiverged,
)
from chessgrpo.train.schedule import WarmupCosine

__all__ = [
    "ModelConfig",
    "PretrainConfig",
    "PretrainResult",
    "Pretrainer",
    "TrainingDiverged",
    "WarmupCosine",
    "latest_checkpoint",
    "list_checkpoints",
    "load_trainer_state",
    "save_checkpoint",
]
