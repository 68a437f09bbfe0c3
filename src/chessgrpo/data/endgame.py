"""`chessgrpo data endgame`: positions of a tablebase endgame labelled by the tablebase (exact).

The supervised warm start of the endgame curriculum: a dataset in the ordinary position schema
(`data.schema`), so `chessgrpo pretrain` trains on it unchanged. Each row is a won position of one
material signature (e.g. KQvK, strong side to move), drawn uniformly like the trajectory trainer's
start positions, with **every** legal move and its exact value from the mover's point of view:

    value(move) = 1 - PLY_STEP * d   the move keeps the win, mate in d plies after it (mate: d = 0)
                  0.5                the move draws (stalemate, a hung piece, ...)
                  PLY_STEP * d       the move loses (never in these endgames; kept for completeness)

stored as ``win_probs`` best first (ties by UCI), so ``best_move`` is a DTZ-optimal move and the
``distill`` objective with a temperature of about PLY_STEP puts almost all the target weight on
the DTZ-optimal moves (each 2 plies slower costs a factor e^(-2 PLY_STEP / T)).

The evaluation positions of an endgame run (`EndgameStarts.hold_out(held_out, seed=held_out_seed)`,
i.e. the trainer's ``eval.positions`` and ``run.seed``) are excluded, so a warm-started policy is
still evaluated on positions it never saw. Labelling probes the tables for every legal move (a DTZ
probe with the weak side to move costs ~1 ms), so it runs in `processes` worker processes; the
rows are written in draw order, so the dataset is a pure function of the config.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chess

from chessgrpo.board.actions import move_to_action
from chessgrpo.board.endgames import (
    COLOURS,
    EndgameStarts,
    Material,
    board_symmetries,
    endgame_positions,
    symmetric_epds,
    transform_board,
    transform_move,
)
from chessgrpo.config import ConfigError, save_config, to_dict
from chessgrpo.data import schema
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.paths import SYZYGY_DEFAULT

logger = logging.getLogger(__name__)

PLY_STEP = 0.005
"""Value lost per ply of distance to mate (KBNvK, the longest table here, needs < 70 plies: > 0.65)."""


@dataclasses.dataclass
class EndgameDataConfig:
    """`chessgrpo data endgame`: tablebase-labelled positions (see the module docstring)."""

    out: str = ""
    """Output directory (required; `--out`)."""
    material: str = "KQvK"
    """Material signature, strong side first (KQvK, KRvK, KBBvK, KBNvK; 3-4 pieces)."""
    positions: int = 20000
    """Distinct won positions to label."""
    colours: str = "white"
    """The strong side's colour: white, black or both (as `endgame_colours` of the trainer)."""
    seed: int = 1
    """Seed of the position draw (any value; the held-out set is excluded whatever it is)."""
    held_out: int = 200
    """Evaluation positions to exclude: the trainer's ``eval.positions``."""
    held_out_seed: int = 0
    """Seed of the evaluation positions: the trainer's ``run.seed``."""
    syzygy_path: str = SYZYGY_DEFAULT
    """Directory (or os.pathsep-separated directories) of Syzygy tables."""
    test_fraction: float = 0.05
    """Share of positions in the test split (by a hash of the position, as every dataset here)."""
    processes: int = 0
    """Labelling worker processes (0 = one per CPU core)."""
    shard_size: int = 10000
    """Rows per Parquet shard."""
    symmetries: bool = False
    """Also write every position's mirror images and rotations (8 per position without pawns, labels
    mapped, not re-probed): ~8x the rows for free. Whole symmetry classes then stay in one split, and
    no image of an evaluation position is written."""

    def __post_init__(self) -> None:
        if self.positions < 1:
            raise ConfigError(f"config key positions must be >= 1, got {self.positions}")
        if self.colours not in COLOURS:
            raise ConfigError(f"config key colours must be one of {list(COLOURS)}, got {self.colours!r}")
        try:
            Material.parse(self.material)
        except ValueError as error:
            raise ConfigError(f"config key material: {error}") from None
        if self.held_out < 0 or self.processes < 0 or self.shard_size < 1:
            raise ConfigError("config keys held_out and processes must be >= 0 and shard_size >= 1")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"config key test_fraction must be in (0, 1), got {self.test_fraction}")


@dataclasses.dataclass
class EndgameDataSummary:
    directory: Path
    positions: int
    splits: dict[str, int]
    seconds: float
    optimal_moves_per_position: float
    drawn: int


def move_values(tablebase: Tablebase, board: chess.Board) -> list[tuple[str, float]]:
    """Every legal move of `board` with its exact value for the mover, best first (ties by UCI)."""
    mover = board.turn
    rows: list[tuple[str, float]] = []
    for move in board.legal_moves:
        after = board.copy(stack=False)
        after.push(move)
        state = tablebase.state(after, mover)
        if state.score == 1.0:
            value = 1.0 - PLY_STEP * state.plies
        elif state.score == 0.0:
            value = PLY_STEP * state.plies
        else:
            value = 0.5
        rows.append((move.uci(), round(value, 6)))
    rows.sort(key=lambda item: (-item[1], item[0]))
    return rows


def label_row(tablebase: Tablebase, board: chess.Board) -> dict[str, Any]:
    """One dataset row (`data.schema.POSITION_SCHEMA`) for a won position."""
    values = move_values(tablebase, board)
    if not values:
        raise ValueError(f"no legal move in {board.fen()!r}: not a start position")
    return _row(board, values)


def symmetric_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """`row` and the rows of its distinct symmetric images (`board_symmetries`), values carried over.

    A rotation or reflection of a pawnless position is the same position for the tablebase, so each
    image's move values are the original's with the moves mapped the same way.
    """
    board = chess.Board(row["fen"])
    rows, seen = [], set()
    for square_map in board_symmetries(board):
        image = transform_board(board, square_map)
        if image.epd() in seen:
            continue
        seen.add(image.epd())
        values = [
            (transform_move(chess.Move.from_uci(uci), square_map).uci(), value)
            for uci, value in zip(row["legal_moves"], row["legal_win_probs"], strict=True)
        ]
        values.sort(key=lambda item: (-item[1], item[0]))
        rows.append(_row(image, values))
    return rows


def _row(board: chess.Board, values: list[tuple[str, float]]) -> dict[str, Any]:
    moves = [uci for uci, _ in values]
    wins = [value for _, value in values]
    best = chess.Move.from_uci(moves[0])
    return {
        "fen": board.fen(),
        "source": "tablebase",
        "best_move": moves[0],
        "best_action": move_to_action(best),
        "moves": moves,
        "win_probs": wins,
        "value": wins[0],
        "legal_moves": moves,
        "legal_win_probs": wins,
        "nodes": 0,
    }


# Worker processes: each opens the tables once.
_WORKER_TABLEBASE: Tablebase | None = None


def _init_worker(syzygy_path: str) -> None:
    global _WORKER_TABLEBASE
    _WORKER_TABLEBASE = Tablebase(syzygy_path)


def _label_fen(fen: str) -> dict[str, Any]:
    assert _WORKER_TABLEBASE is not None
    return label_row(_WORKER_TABLEBASE, chess.Board(fen))


def generate_endgame_dataset(
    config: EndgameDataConfig, *, progress: Callable[[int], None] | None = None
) -> EndgameDataSummary:
    """Draw, label and write the dataset; refuses to overwrite an existing one."""
    if not config.out:
        raise ConfigError("config key out is required (--out DIR)")
    config.__post_init__()  # flags are applied after construction: validate again
    directory = Path(config.out)
    if schema.shard_paths(directory):  # an empty list for a missing directory
        raise FileExistsError(f"{directory} already holds a dataset; choose another --out or delete it")
    tick = time.perf_counter()
    with Tablebase(config.syzygy_path) as tablebase:
        starts = EndgameStarts(config.material, tablebase.is_won, tables=tablebase.names, colours=config.colours)
        excluded: set[str] = set()
        if config.held_out:
            for board in starts.hold_out(config.held_out, seed=config.held_out_seed):
                excluded |= symmetric_epds(board) if config.symmetries else {board.epd()}
        boards = endgame_positions(
            starts.material,
            config.positions,
            seed=[config.seed, 7],
            colours=config.colours,
            accept=tablebase.is_won,
            exclude=excluded,
            distinct=True,
        )
    fens = [board.fen() for board in boards]
    processes = config.processes or os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    drawn = len(fens)
    if processes == 1:
        _init_worker(config.syzygy_path)
        for fen in fens:
            rows.append(_label_fen(fen))
            if progress:
                progress(1)
    else:
        context = multiprocessing.get_context("spawn")  # no forked torch or table handles
        with context.Pool(processes, initializer=_init_worker, initargs=(config.syzygy_path,)) as pool:
            for row in pool.imap(_label_fen, fens, chunksize=64):
                rows.append(row)
                if progress:
                    progress(1)
    by_split: dict[str, list[dict[str, Any]]] = {split: [] for split in schema.SPLITS}
    if config.symmetries:
        written: set[str] = set()  # two drawn positions can share images
        for row in rows:
            images = symmetric_rows(row)
            split = schema.split_of(min(image["fen"] for image in images), config.test_fraction)
            for image in images:
                epd = chess.Board(image["fen"]).epd()
                if epd not in written:
                    written.add(epd)
                    by_split[split].append(image)
        rows = [row for split_rows in by_split.values() for row in split_rows]
    else:
        for row in rows:
            by_split[schema.split_of(row["fen"], config.test_fraction)].append(row)
    directory.mkdir(parents=True, exist_ok=True)
    shards = 0
    for split, split_rows in by_split.items():
        for index, start in enumerate(range(0, len(split_rows), config.shard_size)):
            schema.write_shard(
                split_rows[start : start + config.shard_size], directory / split / f"shard-{index:05d}.parquet"
            )
            shards += 1
    optimal = [sum(1 for value in row["win_probs"] if value == row["win_probs"][0]) for row in rows]
    seconds = time.perf_counter() - tick
    save_config(config, directory / "config.yaml")
    schema.write_manifest(
        directory,
        {
            "schema_version": schema.SCHEMA_VERSION,
            "command": "endgame",
            "complete": True,
            "material": config.material,
            "positions": len(rows),
            "splits": {split: len(split_rows) for split, split_rows in by_split.items()},
            "held_out_excluded": {
                "count": config.held_out,
                "seed": config.held_out_seed,
                "with_images": config.symmetries,
            },
            "symmetries": config.symmetries,
            "shard_sha256": schema.shard_checksums(directory),
            "label": f"value = 1 - {PLY_STEP} * plies to mate after the move (win), 0.5 draw",
            "config": to_dict(config),
        },
    )
    return EndgameDataSummary(
        directory=directory,
        positions=len(rows),
        splits={split: len(split_rows) for split, split_rows in by_split.items()},
        seconds=seconds,
        optimal_moves_per_position=sum(optimal) / max(len(optimal), 1),
        drawn=drawn,
    )
