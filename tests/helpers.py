"""Shared test helpers: where the project's shared data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# CI and developers have ../shared beside the checkout; $CHESSGRPO_DATA overrides.
SHARED_DATA = Path(os.environ.get("CHESSGRPO_DATA", REPO_ROOT.parent / "shared" / "data"))
SYZYGY_DIR = SHARED_DATA / "syzygy"


def shared_file(name: str) -> Path:
    """Path of a file in shared/data; fails the test (never skips) when it is missing."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.fail(f"shared data {path} is missing: check out ../shared beside the repo or set CHESSGRPO_DATA")
    return path

# configs/grpo_tiny.yaml trains the value head and a bc anchor on data/tiny's labelled positions; runs from a fresh
# policy (no value head) on random positions, without data/tiny, switch both off.
NO_LABELLED_LOSSES = ("value_loss_weight=0", "value_positions=null", "bc_loss_weight=0")
