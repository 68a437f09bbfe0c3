"""Checkpoints: atomic step directories, the `latest` link, pruning, fallbacks, RNG state."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from chessgrpo.errors import CheckpointError
from chessgrpo.files import verify_manifest
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, save_policy
from chessgrpo.train.checkpoint import (
    TRAINER_STATE_FILE,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    restore_rng_state,
    save_checkpoint,
)

TINY = PolicyConfig(n_layers=1, d_model=16, n_heads=2)


def _save(run_dir, step, model, keep=3, **extra):
    state = {"step": step, "optimizer": {"lr": 0.1, "moments": torch.arange(3.0)}, **extra}
    return save_checkpoint(run_dir, step, save_model=lambda d: save_policy(model, d), trainer_state=state, keep=keep)


def test_roundtrip_latest_link_and_pruning(tmp_path):
    torch.manual_seed(0)
    models = {step: ActionPolicy(TINY) for step in (10, 20, 30, 40)}
    for step, model in models.items():
        path = _save(tmp_path, step, model, keep=2)
        link = tmp_path / "checkpoints" / "latest"
        assert link.is_symlink() and os.readlink(link) == f"step_{step:06d}"  # relative target
        assert path == tmp_path / "checkpoints" / f"step_{step:06d}"
    assert [step for step, _ in list_checkpoints(tmp_path)] == [30, 40]  # pruned to keep=2
    assert latest_checkpoint(tmp_path) == (tmp_path / "checkpoints" / "step_000040").resolve()
    loaded = load_policy(tmp_path)  # a run directory resolves through checkpoints/latest
    for name, tensor in models[40].state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    state = load_trainer_state(latest_checkpoint(tmp_path))
    assert state["step"] == 40 and torch.equal(state["optimizer"]["moments"], torch.arange(3.0))
    # Only complete step directories and the link remain: no temporary leftovers.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000030", "step_000040"]


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path):
    model = ActionPolicy(TINY)
    good = _save(tmp_path, 1, model)

    def broken(directory):
        save_policy(model, directory)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, save_model=broken, trainer_state={"step": 2}, keep=3)
    assert latest_checkpoint(tmp_path) == good.resolve()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]


def test_stale_temporaries_are_cleaned_and_a_step_can_be_rewritten(tmp_path):
    model = ActionPolicy(TINY)
    _save(tmp_path, 5, model)
    stale = tmp_path / "checkpoints" / ".tmp-step_000006-99999"  # a writer killed mid-save
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    _save(tmp_path, 5, model, marker=1)  # same step again replaces it atomically
    assert not stale.exists()
    assert load_trainer_state(latest_checkpoint(tmp_path))["marker"] == 1


def test_latest_falls_back_to_newest_complete_step(tmp_path):
    model = ActionPolicy(TINY)
    _save(tmp_path, 1, model)
    _save(tmp_path, 2, model)
    link = tmp_path / "checkpoints" / "latest"
    link.unlink()  # crash between the rename and the relink
    assert latest_checkpoint(tmp_path).name == "step_000002"
    os.symlink("step_000001", link)  # a stale link loses to a newer complete directory
    assert latest_checkpoint(tmp_path).name == "step_000002"
    (tmp_path / "checkpoints" / "step_000002" / TRAINER_STATE_FILE).unlink()  # incomplete: ignored
    assert latest_checkpoint(tmp_path).name == "step_000001"
    assert latest_checkpoint(tmp_path / "nothing-here") is None


def test_rng_state_roundtrip_through_a_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    _save(tmp_path, 1, ActionPolicy(TINY), rng=capture_rng_state())
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    restore_rng_state(load_trainer_state(latest_checkpoint(tmp_path))["rng"])  # loaded with weights_only=True
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_bad_trainer_state_file_is_a_clear_error(tmp_path):
    path = _save(tmp_path, 1, ActionPolicy(TINY))
    (path / TRAINER_STATE_FILE).write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="not a readable trainer state"):
        load_trainer_state(path)


def test_manifest_catches_a_damaged_file_and_loaders_fall_back(tmp_path, caplog):
    model = ActionPolicy(TINY)
    _save(tmp_path, 1, model)
    newest = _save(tmp_path, 2, model)
    assert verify_manifest(newest) is None
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, one flipped bit
    weights.write_bytes(bytes(data))
    assert "SHA-256" in verify_manifest(newest)
    assert latest_checkpoint(tmp_path).name == "step_000001" and "step_000002" in caplog.text
    assert load_policy(tmp_path) is not None  # a run directory loads its newest intact checkpoint
    with pytest.raises(CheckpointError, match="corrupt"):
        load_policy(newest)  # naming the damaged checkpoint itself is an error, never silently used
