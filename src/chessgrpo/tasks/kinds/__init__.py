"""The kinds of training run, each a plug-in of the training spine (`train.kind.Kind`), and their registry.

pretrain, sft, move_group, trajectory, rookworld and mixture. Each module holds the kind's config (a
`train.config.TrainConfig` subclass) and its plug-in class; the task logic they call lives beside
them in `tasks/`. Defining a kind ties its config class to it (`Kind.__init_subclass__` sets
`TrainConfig.kind_class`), so the spine runs a config without importing this layer.

Modules are imported lazily, so `chessgrpo train` on an action policy never imports transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from chessgrpo.config import ConfigError

if TYPE_CHECKING:
    from chessgrpo.train.kind import Kind

KINDS: dict[str, str] = {
    "pretrain": "chessgrpo.tasks.kinds.pretrain:PretrainKind",
    "sft": "chessgrpo.tasks.kinds.sft:SFTKind",
    "move_group": "chessgrpo.tasks.kinds.move_group:MoveGroupKind",
    "trajectory": "chessgrpo.tasks.kinds.trajectory:TrajectoryKind",
    "rookworld": "chessgrpo.tasks.kinds.rookworld:RookWorldKind",
    "mixture": "chessgrpo.tasks.kinds.mixture:MixtureKind",
}
"""Config `kind` -> "module:class" of its plug-in."""


def kind_class(name: str) -> type[Kind]:
    """The `Kind` subclass registered as `name` (a `ConfigError` naming the valid ones otherwise)."""
    if name not in KINDS:
        raise ConfigError(f"config key kind: unknown kind {name!r}; choose one of {', '.join(sorted(KINDS))}")
    module, _, cls = KINDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def config_class(name: str) -> type:
    """The config dataclass of kind `name`."""
    return kind_class(name).config_class
