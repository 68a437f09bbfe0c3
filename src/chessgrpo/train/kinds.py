"""The registry of kinds of run: config `kind:` -> the `train.kind.Kind` subclass that plugs into the loop.

Modules are imported lazily, so `chessgrpo train` on an action policy never imports transformers.
"""

from __future__ import annotations

import importlib

from chessgrpo.config import ConfigError

KINDS: dict[str, str] = {
    "pretrain": "chessgrpo.tasks.kinds.pretrain:PretrainKind",
    "sft": "chessgrpo.tasks.kinds.sft:SFTKind",
    "move_group": "chessgrpo.tasks.kinds.move_group:MoveGroupKind",
    "trajectory": "chessgrpo.tasks.kinds.trajectory:TrajectoryKind",
    "rookworld": "chessgrpo.tasks.kinds.rookworld:RookWorldKind",
    "mixture": "chessgrpo.tasks.kinds.mixture:MixtureKind",
}
"""Config `kind` -> "module:class" of its plug-in."""


def kind_class(name: str) -> type:
    """The `Kind` subclass registered as `name` (a `ConfigError` naming the valid ones otherwise)."""
    if name not in KINDS:
        raise ConfigError(f"config key kind: unknown kind {name!r}; choose one of {', '.join(sorted(KINDS))}")
    module, _, cls = KINDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def config_class(name: str) -> type:
    """The config dataclass of kind `name`."""
    return kind_class(name).config_class
