"""RookWorld P: and A: examples of 3-4-piece endgames, every truth from the Syzygy tables.

`chessgrpo data rookworld endgames=[KQvK,KRvK]` (`data.rookworld.RookWorldDataConfig.endgames`)
writes these instead of engine-analysed random playouts: a domain a CPU-sized language model can
learn to read, with an exact oracle for every answer.

- **positions**: per material signature, uniform random won positions with the strong side to
  move (`board.endgames.endgame_positions`, predicate `Tablebase.is_won`); train positions get the
  random clocks of a position reached in play (`with_game_clocks`). The **test split is the
  held-out start set of `chessgrpo eval endgame`** (`EndgameStarts.hold_out(held_out, seed=seed)`
  with the same colours), so the LM's best-move accuracy on the test split and its mate rate in
  `eval endgame` are measured on the same positions; train positions never include them.
- **P:** `data.rookworld_truths.tablebase_truth`: M = the `multipv` best moves by exact value (the
  DTZ-optimal ones first, ties in UCI order) in the dataset's `move_order`, E = their values on the
  tablebase scale (`tablebase_pawns`: 100 - plies to mate), B = a DTZ-optimal move.
- **A:** at the same position, the tablebase's move with probability `engine_move_fraction`, a
  random legal move otherwise, or with probability `illegal_fraction` an illegal one; the answer
  from python-chess (`data.rookworld_format.environment_step`). The history is the move alone
  (the positions are placements, not games).

With `symmetries`, each train position also gives its rotations and mirror images (`symmetric_images`),
truths mapped rather than re-probed: up to 8x the train positions at the cost of the probes of one.

Probing costs ~45-50 ms per position (every legal move's DTZ with the weak side to move), so
positions are probed in `workers` processes, each with its own tables.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

import chess

from chessgrpo.board.endgames import (
    EndgameStarts,
    board_symmetries,
    endgame_positions,
    transform_board,
    transform_move,
)
from chessgrpo.data.rookworld_examples import environment_example, environment_move, hash_seed, policy_example
from chessgrpo.data.rookworld_truths import PolicyTruth, exact_truth, tablebase_truth

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.data.rookworld_examples import RookWorldExample

RookWorldDataConfig = Any
"""A `data.rookworld.RookWorldDataConfig` (that module calls this one, so it is not imported here)."""

_CHUNK = 64
"""Positions per worker task: small enough for a smooth progress bar, large enough to amortise pickling."""

_worker_tablebase = None  # each worker process opens the tables once (a Tablebase does not pickle)


def _open_worker_tablebase(path: str) -> None:
    global _worker_tablebase
    from chessgrpo.engine.tablebase import Tablebase

    _worker_tablebase = Tablebase(path)


def _truths_of(fens: list[str], multipv: int) -> list[PolicyTruth]:
    return [tablebase_truth(_worker_tablebase, chess.Board(fen), multipv=multipv) for fen in fens]  # type: ignore[arg-type]


def endgame_boards(config: RookWorldDataConfig, tablebase: object) -> dict[str, list[chess.Board]]:
    """{"train": [...], "test": [...]}: the held-out starts of each material (test) and `positions`
    distinct other won positions split evenly over the materials (train)."""
    split: dict[str, list[chess.Board]] = {"train": [], "test": []}
    materials = list(config.endgames)
    per_material = [
        config.positions // len(materials) + (i < config.positions % len(materials)) for i in range(len(materials))
    ]
    for material, count in zip(materials, per_material):
        starts = EndgameStarts(material, tablebase.is_won, tables=tablebase.names, colours=config.colours)  # type: ignore[attr-defined]
        held_out = starts.hold_out(config.held_out, seed=config.seed) if config.held_out else []
        split["test"] += held_out
        # No train position is a held-out start or one of its images (`EndgameStarts.hold_out`); with symmetries
        # every image of a train position is written too, so none of those is a held-out start either.
        train = endgame_positions(
            material,
            count,
            seed=[config.seed, 7],
            colours=config.colours,
            accept=tablebase.is_won,  # type: ignore[attr-defined]
            exclude=starts.held_out,
            distinct=True,
        )
        rng = random.Random(hash_seed(config.seed, f"clocks:{material}"))
        split["train"] += [with_game_clocks(board, tablebase.probe_dtz(board), rng) for board in train]  # type: ignore[attr-defined]
    return split


MAX_HALFMOVE_CLOCK = 80
"""Largest halfmove clock given to a train position (`with_game_clocks`)."""


def with_game_clocks(board: chess.Board, dtz: int, rng: random.Random) -> chess.Board:
    """`board` with the clocks of a position reached in play: a random halfmove clock and a fullmove number
    that fits it, so the model learns to read FENs as a game produces them (placements all end "0 1", and a
    model trained only on those wrote ill-formed answers for three of four positions reached in play).

    The halfmove clock stays at most 100 - |dtz| - 2 (and `MAX_HALFMOVE_CLOCK`), so the fastest win still
    mates before the 50-move rule and the position's tablebase value (which ignores the clock) holds.
    """
    board = board.copy()
    board.halfmove_clock = rng.randint(0, max(0, min(MAX_HALFMOVE_CLOCK, 100 - abs(dtz) - 2)))
    board.fullmove_number = 1 + board.halfmove_clock // 2 + rng.randint(0, 30)
    return board


def symmetric_images(
    boards: Sequence[chess.Board], truths: Sequence[PolicyTruth], *, multipv: int
) -> tuple[list[chess.Board], list[PolicyTruth]]:
    """`boards` and every distinct rotation and mirror image of each (`board.endgames.board_symmetries`), with
    truths mapped, not re-probed: an image of a pawnless position is the same position for the tables. Images
    that repeat a position already listed (two drawn positions of one symmetry class) are written once."""
    out_boards: list[chess.Board] = []
    out_truths: list[PolicyTruth] = []
    seen: set[str] = set()
    for board, truth in zip(boards, truths, strict=True):
        assert truth.exact is not None, "symmetric images need an exact (tablebase) truth"
        for square_map in board_symmetries(board):
            image = transform_board(board, square_map)
            if image.epd() in seen:
                continue
            seen.add(image.epd())
            values = {
                transform_move(chess.Move.from_uci(move), square_map).uci(): value
                for move, value in truth.exact.items()
            }
            out_boards.append(image)
            out_truths.append(exact_truth(image.fen(), values, multipv=multipv))
    return out_boards, out_truths


def probe_truths(
    boards: Sequence[chess.Board],
    *,
    syzygy_path: str,
    multipv: int,
    workers: int,
    progress: Callable[[int], None] | None = None,
) -> list[PolicyTruth]:
    """`tablebase_truth` of every board, in order, probed in `workers` processes (0 = one per core)."""
    fens = [board.fen() for board in boards]
    chunks = [fens[i : i + _CHUNK] for i in range(0, len(fens), _CHUNK)]
    workers = workers or os.cpu_count() or 1
    truths: list[PolicyTruth] = []
    if workers == 1 or len(chunks) <= 1:
        _open_worker_tablebase(syzygy_path)
        for chunk in chunks:
            truths += _truths_of(chunk, multipv)
            if progress is not None:
                progress(len(chunk))
        return truths
    with ProcessPoolExecutor(
        max_workers=workers, initializer=_open_worker_tablebase, initargs=(syzygy_path,)
    ) as executor:
        for chunk, result in zip(chunks, executor.map(_truths_of, chunks, [multipv] * len(chunks))):
            truths += result
            if progress is not None:
                progress(len(chunk))
    return truths


def generate_endgame_examples(
    config: RookWorldDataConfig, progress: Callable[[int], None] | None = None
) -> list[RookWorldExample]:
    """The P: and A: examples of `config.endgames` (a pure function of the config and the tables).

    Each example's ``source`` is ``endgame:<material>:<split>``, which `data.rookworld.write_examples`
    uses to put the held-out starts in the test split.
    """
    from chessgrpo.engine.tablebase import Tablebase

    with Tablebase(config.syzygy_path) as tablebase:
        boards = endgame_boards(config, tablebase)
    examples = []
    for split, split_boards in boards.items():
        truths = probe_truths(
            split_boards,
            syzygy_path=config.syzygy_path,
            multipv=config.multipv,
            workers=config.workers,
            progress=progress,
        )
        if split == "train" and config.symmetries:
            split_boards, truths = symmetric_images(split_boards, truths, multipv=config.multipv)
        for board, truth in zip(split_boards, truths):
            source = f"endgame:{material_name(board)}:{split}"
            examples.append(
                policy_example(
                    truth,
                    config.seed,
                    0,
                    source=source,
                    layout=config.layout,
                    move_only=config.move_only,
                    prompt=config.policy_prompt,
                )
            )
            move = environment_move(
                board,
                truth,
                seed=config.seed,
                illegal_fraction=config.illegal_fraction,
                engine_move_fraction=config.engine_move_fraction,
            )
            examples.append(environment_example(board, move, source=source))
    return examples


def material_name(board: chess.Board) -> str:
    """ "KQvK"-style signature of a board, the side to move (the strong side) first."""
    letters = "KQRBNP"
    sides = []
    for colour in (board.turn, not board.turn):
        pieces = sorted(
            (p.symbol().upper() for p in board.piece_map().values() if p.color == colour), key=letters.index
        )
        sides.append("".join(pieces))
    return "v".join(sides)


def example_split(example: RookWorldExample) -> str | None:
    """The split an endgame example was generated for (its ``source`` says), None for other examples."""
    parts = example.source.split(":")
    return parts[2] if len(parts) == 3 and parts[0] == "endgame" else None
