"""Training checkpoints: verified step directories, `latest` and `best` links, safe pruning, RNG capture.

Layout (every kind of run)::

    RUN_DIR/checkpoints/step_000500/model files     written by the kind (`Kind.save_model`)
                                    trainer_state.pt optimizer (unless checkpoint_optimizer: false),
                                                     step, RNG, the kind's own state, ...
                                    manifest.json    size and SHA-256 of every file (`chessgrpo.files`)
    RUN_DIR/checkpoints/latest -> step_000500        relative symlink to the newest step
    RUN_DIR/checkpoints/best   -> step_000400        the best step by the run's `checkpoint.best_metric`

A checkpoint is written into a hidden temporary directory, its manifest written last, and the
directory renamed into place; then `latest` is repointed by renaming a fresh symlink over it. A
crash at any moment leaves the previous checkpoint or the new one. Loaders trust a checkpoint only
when its manifest verifies (`latest_checkpoint` skips a truncated one with a warning and falls back
to the newest intact one). Pruning first renames a directory to a hidden name, then deletes it, so
a kill during pruning leaves debris only under hidden names, which the next save removes.
Retention keeps the newest `keep` checkpoints plus the one `best` points to, so a collapse late in
a run never prunes the last good state.

`trainer_state.pt` holds only tensors and plain Python data, so it loads with
``torch.load(weights_only=True)`` (no arbitrary code from a checkpoint file).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chessgrpo.errors import CheckpointError, one_line
from chessgrpo.files import (
    CHECKPOINTS_DIR,
    STEP_DIR,
    fsync_path,
    newest_intact_checkpoint,
    step_checkpoints,
    verify_manifest,
    write_manifest,
)

logger = logging.getLogger(__name__)

LATEST_LINK = "latest"
BEST_LINK = "best"
TRAINER_STATE_FILE = "trainer_state.pt"
_TMP_PREFIX = ".tmp-"


def step_dir_name(step: int) -> str:
    """``step_000123``: zero-padded so names sort by step."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative integer, got {step!r}")
    return f"step_{step:06d}"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Intact checkpoints of a run (manifest verified, trainer state present) as (step, directory), oldest first."""
    return [
        (step, d)
        for step, d in step_checkpoints(run_dir)
        if (d / TRAINER_STATE_FILE).is_file() and verify_manifest(d) is None
    ]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest intact checkpoint directory of a run, or None when it has none.

    A newer checkpoint that fails verification is skipped with a warning naming it.
    """
    return newest_intact_checkpoint(run_dir)


def best_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint `checkpoints/best` points to, when it exists and is intact."""
    link = Path(run_dir) / CHECKPOINTS_DIR / BEST_LINK
    if link.is_symlink() and link.resolve().is_dir() and verify_manifest(link.resolve()) is None:
        return link.resolve()
    return None


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    save_model: Callable[[Path], Any],
    trainer_state: dict[str, Any],
    keep: int,
    best_step: int | None = None,
) -> Path:
    """Write checkpoint `step` atomically with its manifest, point `latest` at it, prune.

    Args:
        run_dir: the run directory (``checkpoints/`` is created inside it).
        step: optimizer steps completed; names the directory.
        save_model: writes the model files into the directory it is given.
        trainer_state: tensors and plain data only (see the module docstring).
        keep: how many checkpoints to keep, newest first (>= 1); `best_step` is kept besides.
        best_step: the step that `best` should point to (None: leave `best` as it is).

    Returns the final checkpoint directory.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    remove_debris(root)
    name = step_dir_name(step)
    final = root / name
    tmp = root / f"{_TMP_PREFIX}{name}-{os.getpid()}"
    tmp.mkdir()
    try:
        save_model(tmp)
        torch.save(trainer_state, tmp / TRAINER_STATE_FILE)
        for file in tmp.iterdir():
            fsync_path(file)
        write_manifest(tmp)
        if final.exists():  # the same step saved again (a resumed run stopped where it began, a rollback)
            _discard(root, final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _point_link(root, LATEST_LINK, name)
    if best_step is not None:
        _point_link(root, BEST_LINK, step_dir_name(best_step))
    fsync_path(root)
    _prune(root, keep)
    logger.debug("saved checkpoint %s", final)
    return final


def _point_link(root: Path, link: str, name: str) -> None:
    """Atomically repoint root/link at `name` (relative target, so the run dir can move)."""
    tmp_link = root / f"{_TMP_PREFIX}{link}-{os.getpid()}"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    os.symlink(name, tmp_link)
    os.replace(tmp_link, root / link)


def _protected(root: Path) -> set[str]:
    names = set()
    for link in (LATEST_LINK, BEST_LINK):
        if (root / link).is_symlink():
            names.add(os.readlink(root / link))
    return names


def _prune(root: Path, keep: int) -> None:
    checkpoints = step_checkpoints(root.parent)
    protected = _protected(root)
    newest = {d.name for _, d in checkpoints[-keep:]}
    for _, directory in checkpoints:
        if directory.name not in newest and directory.name not in protected:
            _discard(root, directory)
            logger.debug("pruned checkpoint %s", directory)


def _discard(root: Path, directory: Path) -> None:
    """Rename first (atomic), then delete: a kill in between leaves only a hidden name behind."""
    hidden = root / f"{_TMP_PREFIX}old-{directory.name}-{os.getpid()}"
    os.replace(directory, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def remove_debris(root: Path) -> None:
    """Delete what an interrupted save or prune left under hidden names."""
    for entry in root.iterdir():
        if entry.name.startswith(_TMP_PREFIX):
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
            else:
                shutil.rmtree(entry, ignore_errors=True)


def load_trainer_state(checkpoint_dir: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The trainer state of a checkpoint directory (loaded with ``weights_only=True``)."""
    path = Path(checkpoint_dir) / TRAINER_STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(checkpoint_dir)!r} has no {TRAINER_STATE_FILE}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - unpickling raises many kinds; name the file
        raise CheckpointError(
            f"{path} is not a readable trainer state (truncated or corrupt): {one_line(error)}"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold a trainer state dict")
    return state


OPTIMIZER_KEY = "optimizer"


def optimizer_state(optimizer: torch.optim.Optimizer, save: bool) -> dict[str, Any]:
    """The trainer-state entries for the optimizer: its state dict, or (`save` false, config key
    ``checkpoint_optimizer: false``) a note that it was left out (checkpoints ~3x smaller)."""
    return {OPTIMIZER_KEY: optimizer.state_dict()} if save else {"optimizer_saved": False}


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], checkpoint: str | os.PathLike) -> bool:
    """Load the optimizer state of a trainer state; True when it held one.

    A checkpoint saved with ``checkpoint_optimizer: false`` holds none: the optimizer then starts
    fresh (its per-parameter state, e.g. AdamW moments, is cleared; hyperparameters and the
    learning-rate schedule are untouched) and a warning says so. That is a choice, not a fault: the
    first steps after such a resume take Adam's bias-corrected early steps again.
    """
    if OPTIMIZER_KEY in state:
        optimizer.load_state_dict(state[OPTIMIZER_KEY])
        return True
    optimizer.state.clear()
    logger.warning(
        "checkpoint %s holds no optimizer state (it was saved with checkpoint_optimizer: false): "
        "the optimizer starts fresh (AdamW moments reset); step, schedule, RNG and model are restored",
        checkpoint,
    )
    return False


def is_step_dir(path: Path) -> bool:
    return bool(STEP_DIR.match(path.name))


# ------------------------------------------------------------------------------------------------
# Random generator states (plain data, so weights_only loading works)


def capture_rng_state() -> dict[str, Any]:
    """States of the torch (CPU and CUDA), numpy and Python global generators."""
    version, keys, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [np_name, [int(k) for k in np_keys], int(np_pos), int(np_has_gauss), float(np_gauss)],
        "python": [version, list(keys), gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what `capture_rng_state` captured."""
    torch.set_rng_state(state["torch"].cpu())
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_name, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
