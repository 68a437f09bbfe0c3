"""Which kind of model a path holds: an action-policy checkpoint or a chess language model.

The players (`eval games`, `eval endgame`, `uci`) take either. Both kinds write ``model.safetensors``
and ``model_config.json`` (`models.policy.save_policy`; `models.lm.save_lm` writes its marker under
the same name), so the two are told apart by the ``config.json`` of `transformers`: a directory
with one is a language model (`models.lm.load_lm`), a directory with the weights and the policy
config and no ``config.json`` is an action policy (`models.policy.load_policy`).

A run directory (or its ``checkpoints/``) stands for its newest intact checkpoint, as for both
loaders (`files.resolve_model_directory`). Anything else is one `FileNotFoundError` naming the path.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

from chessgrpo.errors import InputError

POLICY = "policy"
LM = "lm"
CheckpointKind = Literal["policy", "lm"]

TRANSFORMERS_CONFIG = "config.json"
"""What `save_pretrained` writes beside the weights of a `transformers` model (the LM's sign)."""
_POLICY_FILES = ("model.safetensors", "model_config.json")
"""= `models.policy.MODEL_FILE`, `models.policy.CONFIG_FILE` (not imported: that module imports torch)."""


@dataclasses.dataclass(frozen=True)
class ModelCheckpoint:
    """A model directory and its kind."""

    kind: CheckpointKind
    directory: Path
    """The resolved model directory (a run directory's newest intact checkpoint)."""


def is_lm_directory(directory: Path) -> bool:
    """A `transformers` model directory (RookWorld-LM download, `save_lm`, an LM run's checkpoint)."""
    return (directory / TRANSFORMERS_CONFIG).is_file()


def is_policy_directory(directory: Path) -> bool:
    """An action-policy checkpoint: weights and the policy config, and no `transformers` config."""
    return all((directory / name).is_file() for name in _POLICY_FILES) and not is_lm_directory(directory)


def identify_checkpoint(path: str | os.PathLike) -> ModelCheckpoint:
    """The kind and directory of the model at `path` (a model directory, a run directory or its
    checkpoints/); `FileNotFoundError` naming `path` when it holds neither kind."""
    from chessgrpo.files import resolve_model_directory

    found = resolve_model_directory(path, lambda d: is_lm_directory(d) or is_policy_directory(d))
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint at {str(path)!r}: neither an action-policy checkpoint ({' + '.join(_POLICY_FILES)}) "
            f"nor a chess language model (a transformers {TRANSFORMERS_CONFIG}), nor a run directory with an "
            "intact checkpoint of either"
        )
    return ModelCheckpoint(LM if is_lm_directory(found) else POLICY, found)


def require_policy(path: str | os.PathLike, needs: str) -> None:
    """`ValueError` when `path` is a language model: `needs` (an option, "search") needs an action policy."""
    if identify_checkpoint(path).kind == LM:
        raise InputError(f"{needs} needs an action-policy checkpoint, but {str(path)!r} is a chess language model")


POLICY_TAKERS = "`pretrain`, `train` (move_group, trajectory, mixture: init_checkpoint), `eval` (offline, puzzles, games, endgame), `uci`"
"""Where an action-policy checkpoint goes (for the messages below)."""
LM_TAKERS = "`train` (sft, rookworld: init_checkpoint / model.path), `eval lm`, `eval games`, `eval endgame`, `uci`"
"""Where a chess-LM checkpoint goes."""


def wrong_kind_error(path: str | os.PathLike, directory: Path, needed: CheckpointKind) -> InputError | None:
    """One error naming what `path` holds and what was needed when `directory` (its resolved model directory) is the
    other kind of checkpoint; None when it is not (the loader then reports what is wrong with it)."""
    if needed == POLICY and is_lm_directory(directory):
        return InputError(
            f"{str(path)!r} is a chess language model checkpoint ({TRANSFORMERS_CONFIG}), and this needs an "
            f"action-policy checkpoint; chess-LM checkpoints are taken by {LM_TAKERS}"
        )
    if needed == LM and not is_lm_directory(directory) and all((directory / name).is_file() for name in _POLICY_FILES):
        return InputError(
            f"{str(path)!r} is an action-policy checkpoint, and this needs a chess language model (a "
            f"transformers {TRANSFORMERS_CONFIG}); action-policy checkpoints are taken by {POLICY_TAKERS}"
        )
    return None
