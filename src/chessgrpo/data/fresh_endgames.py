"""Fresh endgame positions beside a `data rookworld` set: the stream GRPO and the control arm draw, and the held-out set.

Issue 66's experiment trains a chess LM on positions it has never seen: won positions of one material that are
neither a P: position of the data (train or test) nor a rotation or mirror image of one (`EndgameStarts.exclude`).
Three places need the same positions, so they are built here once:

- the GRPO kind's ``task.fresh_endgames`` prompts (`EndgameStarts.draw`, seeded by step and round);
- the continued-SFT control arm (`kind: sft`, ``fresh_endgames``): the same stream, labelled by the tables;
- the held-out set (``eval.endgame_positions`` in training, ``endgame_positions`` of `chessgrpo eval lm`): drawn
  first with its own seed and excluded from every later draw, so every run and arm of the same data is evaluated
  on the same positions, paired.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import chess

from chessgrpo.board.endgames import EndgameStarts
from chessgrpo.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.data.rookworld_examples import RookWorldExample
    from chessgrpo.data.rookworld_truths import PolicyTruth
    from chessgrpo.engine.tablebase import Tablebase


def fresh_endgame_starts(data: str, material: str, tablebase: Tablebase, *, colours: str = "white") -> EndgameStarts:
    """The stream of won `material` positions (strong side `colours`) that are not a P: position of dataset `data`
    (train and test splits) nor any rotation or mirror image of one, whether the data holds its images or not."""
    from chessgrpo.data.rookworld import read_rookworld

    starts = EndgameStarts(material, tablebase.is_won, tables=tablebase.names, colours=colours)
    for split in ("train", "test"):
        examples = read_rookworld(data, split, task="policy")
        starts.exclude(chess.Board(example.fen) for example in examples)
    return starts


def held_out_endgame_fens(starts: EndgameStarts, count: int, *, seed: int) -> list[str]:
    """`count` held-out positions of `starts` (FENs), excluded with their images from every later draw of it.

    Call it on a fresh `fresh_endgame_starts` stream before any draw: the set then depends on the data, the
    material, the colours and `seed` only, so a training run and `chessgrpo eval lm` build the same one."""
    if count < 1:
        raise InputError(f"endgame_positions must be >= 1, got {count}")
    return [board.fen() for board in starts.hold_out(count, seed=seed)]


def fresh_draw(
    starts: EndgameStarts, tablebase: Tablebase, count: int, *, seed: int, step: int, rank: int = 0, clocks: bool = True
) -> list[chess.Board]:
    """`count` fresh positions of (seed, step, rank) (`EndgameStarts.draw`). With `clocks` each gets the clocks of a
    position reached in play (`data.rookworld_endgames.with_game_clocks`, seeded by (seed, step, rank)), as the data's
    train positions have them: a model trained on placements alone (``0 1``) forgot how to read the FENs a game
    produces (issue 66, first arms: P: well-formed 0.997 -> 0.60 on positions with clocks)."""
    boards = starts.draw(count, seed=seed, step=step, rank=rank)
    if not clocks:
        return boards
    from chessgrpo.data.rookworld_endgames import with_game_clocks
    from chessgrpo.data.rookworld_examples import hash_seed

    rng = random.Random(hash_seed(seed, f"fresh clocks:{step}:{rank}"))
    return [with_game_clocks(board, tablebase.probe_dtz(board), rng) for board in boards]


def fresh_truths(
    starts: EndgameStarts,
    tablebase: Tablebase,
    count: int,
    *,
    seed: int,
    step: int,
    multipv: int = 5,
    clocks: bool = True,
) -> list[PolicyTruth]:
    """The exact truths (`tablebase_truth`: every legal move's value, the DTZ-optimal ones) of step `step`'s `count`
    fresh positions: `fresh_draw` with ``rank=0``, the draw a GRPO run's first round makes at that step."""
    from chessgrpo.data.rookworld_truths import tablebase_truth

    boards = fresh_draw(starts, tablebase, count, seed=seed, step=step, clocks=clocks)
    return [tablebase_truth(tablebase, board, multipv=multipv) for board in boards]


def labelled_fresh_examples(
    starts: EndgameStarts, tablebase: Tablebase, count: int, *, data: str, seed: int, step: int, clocks: bool = True
) -> list[RookWorldExample]:
    """The P: examples of step `step`'s `count` fresh positions (`fresh_truths`), each labelled by the tables and
    written as dataset `data` writes its P: lines (its manifest's layout, ``move_only``, ``multipv`` and
    ``policy_prompt``): the continued-SFT control arm's batch."""
    from chessgrpo.data import schema
    from chessgrpo.data.rookworld_examples import policy_example
    from chessgrpo.data.rookworld_format import FEN_PROMPT, ROOKWORLD_LAYOUT
    from chessgrpo.paths import find_data_path

    settings = schema.read_manifest(find_data_path(data) or data).get("settings", {})
    layout = settings.get("layout", ROOKWORLD_LAYOUT)
    move_only, multipv = bool(settings.get("move_only", False)), int(settings.get("multipv", 5))
    prompt = str(settings.get("policy_prompt", FEN_PROMPT))
    source = f"endgame:{starts.material.name}:fresh"
    return [
        policy_example(truth, seed, 0, source, layout=layout, move_only=move_only, prompt=prompt)
        for truth in fresh_truths(starts, tablebase, count, seed=seed, step=step, multipv=multipv, clocks=clocks)
    ]
