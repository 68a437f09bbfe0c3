"""Training checkpoints: atomic step directories, a `latest` symlink, pruning, RNG capture.

Layout (shared by pretraining and the GRPO loop)::

    RUN_DIR/checkpoints/step_000500/model.safetensors   the policy (`models.policy.save_policy`)
                                    model_config.json
                                    trainer_state.pt     optimizer, step, RNG, data position, ...
    RUN_DIR/checkpoints/latest -> step_000500            relative symlink to the newest step

A checkpoint is written into a hidden temporary directory and renamed into place, then `latest`
is repointed by renaming a fresh symlink over it. A crash at any moment leaves either the previous
checkpoint or the new one, never a half-written directory that `latest` points to; stale
temporary directories are removed on the next save. `load_policy(RUN_DIR)` therefore always
loads a complete model.

`trainer_state.pt` holds only tensors and plain Python data, so it loads with
``torch.load(weights_only=True)`` (no arbitrary code from a checkpoint file).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chessgrpo.models.policy import CONFIG_FILE, MODEL_FILE

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
LATEST_LINK = "latest"
TRAINER_STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_TMP_PREFIX = ".tmp-"


def step_dir_name(step: int) -> str:
    """``step_000123``: zero-padded so names sort by step."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative integer, got {step!r}")
    return f"step_{step:06d}"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, directory), oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and _is_complete(entry):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in (MODEL_FILE, CONFIG_FILE, TRAINER_STATE_FILE))


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory of a run, or None when it has none.

    Follows ``checkpoints/latest``; when the link is missing, dangling or older than the newest
    complete step directory (a crash between the rename and the relink), the newest one wins.
    """
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return None
    newest_step, newest = checkpoints[-1]
    link = Path(run_dir) / CHECKPOINTS_DIR / LATEST_LINK
    if link.is_symlink() and link.resolve().is_dir() and _is_complete(link.resolve()):
        target = link.resolve()
        match = _STEP_DIR.match(target.name)
        if match and int(match.group(1)) >= newest_step:
            return target
        logger.warning("%s points to %s but %s is newer; using the newer one", link, target.name, newest.name)
    return newest.resolve()


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    save_model: Callable[[Path], Any],
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint `step` atomically, point `latest` at it, keep the newest `keep`.

    Args:
        run_dir: the run directory (``checkpoints/`` is created inside it).
        step: optimizer steps completed; names the directory.
        save_model: writes the model files into the directory it is given (e.g.
            ``lambda d: save_policy(model, d)``), so the same function serves other model kinds.
        trainer_state: tensors and plain data only (see the module docstring).
        keep: how many checkpoints to keep, newest first (>= 1).

    Returns the final checkpoint directory.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)
    name = step_dir_name(step)
    final = root / name
    tmp = root / f"{_TMP_PREFIX}{name}-{os.getpid()}"
    tmp.mkdir()
    try:
        save_model(tmp)
        torch.save(trainer_state, tmp / TRAINER_STATE_FILE)
        for file in tmp.iterdir():
            _fsync(file)
        if final.exists():  # the same step saved again (e.g. a resumed run stopped where it began)
            old = root / f"{_TMP_PREFIX}old-{name}-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _point_latest(root, name)
    _fsync(root)
    _prune(root, keep)
    logger.debug("saved checkpoint %s", final)
    return final


def _point_latest(root: Path, name: str) -> None:
    """Atomically repoint root/latest at `name` (relative target, so the run dir can move)."""
    tmp_link = root / f"{_TMP_PREFIX}{LATEST_LINK}-{os.getpid()}"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    os.symlink(name, tmp_link)
    os.replace(tmp_link, root / LATEST_LINK)


def _prune(root: Path, keep: int) -> None:
    checkpoints = list_checkpoints(root.parent)
    for _, directory in checkpoints[:-keep]:
        shutil.rmtree(directory)
        logger.debug("pruned checkpoint %s", directory)


def _remove_stale_tmp(root: Path) -> None:
    for entry in root.iterdir():
        if entry.name.startswith(_TMP_PREFIX):
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
            else:
                shutil.rmtree(entry, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_trainer_state(checkpoint_dir: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The trainer state of a checkpoint directory (loaded with ``weights_only=True``)."""
    path = Path(checkpoint_dir) / TRAINER_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(checkpoint_dir)!r} has no {TRAINER_STATE_FILE}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - unpickling raises many kinds; name the file
        raise ValueError(f"{path} is not a readable trainer state: {error}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a trainer state dict")
    return state


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
