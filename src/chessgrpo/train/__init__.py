"""The training spine: one `Trainer` loop that every kind of run plugs into (the kinds are plug-ins, registered in `tasks.kinds`).

`Trainer(config).train()` runs a config of any kind (`kind: pretrain | sft | move_group |
trajectory | rookworld`); `TrainConfig` holds the knobs they share; `Kind` is the plug-in base.
"""

from chessgrpo.train.checkpoint import (
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    save_checkpoint,
)
from chessgrpo.train.config import DebugConfig, DivergenceConfig, EarlyStopConfig, TrainConfig
from chessgrpo.train.kind import Kind, RunContext
from chessgrpo.train.loop import Trainer, TrainResult
from chessgrpo.train.schedule import WarmupCosine

__all__ = [
    "DebugConfig",
    "DivergenceConfig",
    "EarlyStopConfig",
    "Kind",
    "RunContext",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "WarmupCosine",
    "best_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_trainer_state",
    "save_checkpoint",
]
