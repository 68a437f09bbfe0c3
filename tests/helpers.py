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


def taught_kqk_move_first(
    root: Path, *, teach_steps: int = 60, positions: int = 6, policy_prompt: str = "fen"
) -> tuple[Path, Path]:
    """(data directory, LM directory): a KQvK dataset of the real command (move-first layout, 2 held-out starts,
    P: prompts in style `policy_prompt`) under `root`/data and a one-layer chess LM taught its P: lines for
    `teach_steps` full-batch steps under `root`/taught (saved with that prompt style, as SFT saves it).
    Taught 60 steps it writes ``B: <some move>`` first and its moves vary, so sampled groups have reward spread."""
    import torch

    from chessgrpo.cli import main
    from chessgrpo.data.rookworld import read_rookworld
    from chessgrpo.models.lm import LMModelConfig, build_lm, completion_log_probs, left_pad, right_pad, save_lm

    common = ["--positions", str(positions), "endgames=[KQvK]", "held_out=2", "multipv=2", "workers=1"]
    command = ["data", "rookworld", "--out", str(root / "data"), *common, "layout=move_first"]
    command.append(f"policy_prompt={policy_prompt}")
    assert main([*command, f"syzygy_path={SYZYGY_DIR}"]) == 0
    lm = build_lm(LMModelConfig(n_layer=1, n_embd=64, n_head=2, n_positions=256), seed=0)
    lm.policy_prompt = policy_prompt
    tokenizer = lm.tokenizer
    policy = [e for split in ("train", "test") for e in read_rookworld(root / "data", split, task="policy")]
    prompt_ids, prompt_mask = left_pad([tokenizer.encode(e.prompt) for e in policy], tokenizer.eos_token_id)
    completion_ids, completion_mask = right_pad(
        [tokenizer.encode(e.completion) + [tokenizer.eos_token_id] for e in policy], tokenizer.eos_token_id
    )
    optimizer = torch.optim.Adam(lm.model.parameters(), lr=3e-3)
    lm.model.eval()
    for _ in range(teach_steps):
        logp, _ = completion_log_probs(
            lm.model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0
        )
        loss = -logp.sum() / completion_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return root / "data", save_lm(lm, root / "taught")
