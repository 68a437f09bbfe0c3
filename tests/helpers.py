"""Shared test helpers: where the repository's shipped data lives, and positions from random playouts."""

from __future__ import annotations

import importlib
import random
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import chess
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The data the repository ships (data/README.md): the tests read it from the checkout, whatever $CHESSGRPO_DATA says.
DATA_DIR = REPO_ROOT / "data"
SYZYGY_DIR = DATA_DIR / "syzygy"


def data_file(name: str) -> Path:
    """Path of a file the repository ships in data/; fails the test (never skips) when it is missing."""
    path = DATA_DIR / name
    if not path.exists():
        pytest.fail(f"shipped data {path} is missing from the checkout (see data/README.md)")
    return path


# configs/grpo_tiny.yaml trains the value head and a bc anchor on data/tiny's labelled positions; runs from a fresh
# policy (no value head) on random positions, without data/tiny, switch both off.
NO_LABELLED_LOSSES = ("value_loss_weight=0", "value_positions=null", "bc_loss_weight=0")


TINY_MOVE_GROUP_RUN = (
    "init_checkpoint=null",
    "positions=random:32",
    "task.group_size=4",
    "task.positions_per_step=4",
    "task.reward_nodes=50",
    "grpo.num_iterations=1",
    "grpo.minibatch_size=0",
    "engine.processes=1",
    "engine.cache=false",
    "eval.positions=null",
    "eval.puzzles=null",
    "steps=2",
    "warmup_steps=0",
    "checkpoint_every=0",
    "threads=1",
)
"""Overrides of a `kind: move_group` config for a run of seconds: a fresh tiny policy on random positions, 2 steps,
one engine process at 50 nodes, no held-out evaluation and no checkpoints between steps (add yours after them)."""


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


def importable_module(directory: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> Iterator[ModuleType]:
    """Write `source` as `directory/name.py`, put `directory` on sys.path and yield the imported module (a user's
    ``module:function`` reward, imported by name as a run would); forgotten again afterwards. For fixtures."""
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(directory))
    sys.modules.pop(name, None)
    yield importlib.import_module(name)
    sys.modules.pop(name, None)
