"""Shared test helpers: where the project's shared data lives, and positions from random playouts."""

from __future__ import annotations

import os
import random
from pathlib import Path

import chess
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


def random_playout_positions(count: int, seed: int = 0) -> list[chess.Board]:
    """Positions sampled from seeded random playouts (long games reach promotions, castling, en passant;
    a finished game's last position is among them)."""
    rng = random.Random(seed)
    boards: list[chess.Board] = []
    while len(boards) < count:
        board = chess.Board()
        for _ in range(rng.randrange(20, 300)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
            if rng.random() < 0.06:
                boards.append(board.copy(stack=False))
        boards.append(board.copy(stack=False))
    return boards[:count]
