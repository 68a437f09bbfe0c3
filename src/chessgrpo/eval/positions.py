"""Evaluation positions with a best-move label, from our datasets, FEN/EPD text files or PGNs.

`load_eval_positions(path, ...)` accepts:

- a dataset directory of ours (`chessgrpo.data.schema`): its **test** split, `fen` + `best_move`;
- a single ``.parquet`` file with `fen` and `best_move` columns (a null `best_move` is labelled);
- a ``.epd``, ``.fen`` or ``.txt`` file with one FEN or EPD per line (EPD operations such as
  ``bm`` are ignored: they are SAN, sometimes several, and not what our engine would say);
- a ``.pgn`` file: every mainline position of every game, deduplicated, then sampled.

Positions without a label are labelled with the engine pool: the first move of a multipv=1
analysis at the given node limit (`Analysis.best.move`, the move whose line the engine valued).
The `max_positions` subsample is drawn *before* labelling (seeded, file order kept), positions
with no legal moves are dropped, and a file that cannot be read gives one `ValueError` naming it.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import chess
import chess.pgn

from chessgrpo.board.sources import read_fen_file
from chessgrpo.board.validation import parse_board, parse_move
from chessgrpo.errors import InputError
from chessgrpo.files import read_text

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".epd", ".fen", ".txt")
PGN_SUFFIXES = (".pgn",)
PARQUET_SUFFIXES = (".parquet",)


@dataclasses.dataclass(frozen=True)
class LabelledPosition:
    """A position to evaluate a player on and the reference ("best") move for it."""

    board: chess.Board
    best_move: chess.Move

    @property
    def fen(self) -> str:
        return self.board.fen()


def load_eval_positions(
    path: str | Path,
    max_positions: int | None = None,
    seed: int = 0,
    pool: EnginePool | None = None,
    nodes: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[LabelledPosition]:
    """Labelled positions from `path` (see the module docstring for the formats).

    `max_positions` (None = all) positions are sampled with `seed`, keeping file order.
    Unlabelled positions need `pool`; they are analysed at `nodes` (None = the pool's default).
    """
    path = Path(path)
    if max_positions is not None and max_positions < 1:
        raise ValueError(f"max_positions must be >= 1 or None, got {max_positions!r}")
    if not path.exists():
        raise FileNotFoundError(f"evaluation positions {str(path)!r} do not exist")
    suffix = path.suffix.lower()
    if path.is_dir() or suffix in PARQUET_SUFFIXES:
        items = _read_parquet(path)
    elif suffix in TEXT_SUFFIXES:
        items = _read_text(path)
    elif suffix in PGN_SUFFIXES:
        items = _read_pgn(path)
    else:
        raise InputError(
            f"cannot read positions from {str(path)!r}: expected a dataset directory, .parquet, "
            f"{', '.join(TEXT_SUFFIXES)} or .pgn"
        )
    items = [(board, move) for board, move in items if any(board.generate_legal_moves())]
    if not items:
        raise InputError(f"{str(path)!r} holds no position with a legal move")
    if max_positions is not None and len(items) > max_positions:
        chosen = sorted(random.Random(seed).sample(range(len(items)), max_positions))
        items = [items[index] for index in chosen]
    return _label(items, pool, nodes, path, progress)


def _label(
    items: list[tuple[chess.Board, chess.Move | None]],
    pool: EnginePool | None,
    nodes: int | None,
    path: Path,
    progress: Callable[[int], None] | None,
) -> list[LabelledPosition]:
    unlabelled = [index for index, (_, move) in enumerate(items) if move is None]
    labels: dict[int, chess.Move] = {}
    if unlabelled:
        if pool is None:
            raise InputError(
                f"{len(unlabelled)} positions in {str(path)!r} have no best move and no engine pool was given to label them"
            )
        analyses = pool.analyse_many([items[i][0] for i in unlabelled], multipv=1, nodes=nodes, progress=progress)
        for index, analysis in zip(unlabelled, analyses):
            if analysis.best is None:
                raise RuntimeError(f"the engine found no move in {analysis.fen!r}")
            labels[index] = parse_move(items[index][0], analysis.best.move)
    return [
        LabelledPosition(board, move if move is not None else labels[index])
        for index, (board, move) in enumerate(items)
    ]


def _read_parquet(path: Path) -> list[tuple[chess.Board, chess.Move | None]]:
    from chessgrpo.data.schema import read_positions  # pyarrow only when a Parquet file is read

    table = read_positions(path, split="test" if path.is_dir() else None, columns=["fen", "best_move"])
    items: list[tuple[chess.Board, chess.Move | None]] = []
    for row, (fen, best) in enumerate(zip(table.column("fen").to_pylist(), table.column("best_move").to_pylist())):
        try:
            board = parse_board(fen)
            items.append((board, parse_move(board, best) if best else None))
        except ValueError as error:
            raise InputError(f"{str(path)!r} row {row}: {error}") from None
    return items


def _read_text(path: Path) -> list[tuple[chess.Board, chess.Move | None]]:
    return [(board, None) for board in read_fen_file(path)]  # errors name the file and line


def _read_pgn(path: Path) -> list[tuple[chess.Board, chess.Move | None]]:
    handle = io.StringIO(read_text(path))  # a ValueError naming the line and byte that is not UTF-8
    seen: set[str] = set()
    items: list[tuple[chess.Board, chess.Move | None]] = []
    games = moves = 0
    while True:
        game = chess.pgn.read_game(handle)
        if game is None:
            break
        games += 1
        if game.errors:
            raise InputError(f"{str(path)!r} game {games}: {game.errors[0]}")
        try:
            board = parse_board(game.board())
        except ValueError as error:
            raise InputError(f"{str(path)!r} game {games}: {error}") from None
        moves += sum(1 for _ in game.mainline())
        for position in [board.copy(stack=False)] + [_push(board, node.move) for node in game.mainline()]:
            key = position.epd()
            if key not in seen:
                seen.add(key)
                items.append((position, None))
    if games == 0 or moves == 0:
        raise InputError(f"{str(path)!r} holds no PGN games with moves (is it a PGN file?)")
    return items


def _push(board: chess.Board, move: chess.Move) -> chess.Board:
    board.push(move)
    return board.copy(stack=False)


__all__ = ["LabelledPosition", "load_eval_positions"]
