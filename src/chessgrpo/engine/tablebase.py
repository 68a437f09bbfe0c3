"""Syzygy endgame tablebases: exact WDL and DTZ for positions with few pieces (python-chess)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Sequence

import chess
import chess.syzygy

from chessgrpo.board.validation import parse_board
from chessgrpo.paths import find_data_path

_TABLE_NAME = re.compile(r"^([KQRBNP]+)v([KQRBNP]+)\.rtbw$")


@dataclasses.dataclass(frozen=True)
class TablebaseResult:
    """Exact values for the side to move."""

    wdl: int
    """2 win, 1 win blocked by the 50-move rule (cursed), 0 draw, -1 blessed loss, -2 loss."""
    dtz: int
    """Distance to zeroing move (capture or pawn move) with the 50-move rule, python-chess sign."""

    @property
    def win_probability(self) -> float:
        """Expected score under the 50-move rule: a cursed win or blessed loss is a draw."""
        return {2: 1.0, -2: 0.0}.get(self.wdl, 0.5)


def split_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Directories from one path, an os.pathsep-joined string, or a list; a relative one is found
    from any current directory (`chessgrpo.paths`: as given, $CHESSGRPO_DATA, the checkout)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [p for p in str(paths).split(os.pathsep) if p]
    return [find_data_path(p) or Path(p) for p in paths]


def table_names(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Names of the WDL tables found (e.g. ["KQvK", "KRvK"]), sorted."""
    names = set()
    for directory in split_paths(paths):
        if directory.is_dir():
            for file in directory.iterdir():
                match = _TABLE_NAME.match(file.name)
                if match:
                    names.add(file.name[: -len(".rtbw")])
    return sorted(names)


class Tablebase:
    """Probe Syzygy tables in one or more directories.

    ``max_pieces`` is the largest piece count (kings included) with tables present; positions
    with more pieces, castling rights or missing tables raise `KeyError` from `probe`.
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike]):
        directories = split_paths(paths)
        missing = [str(d) for d in directories if not d.is_dir()]
        if not directories or missing:
            raise FileNotFoundError(f"Syzygy directory not found: {', '.join(missing) or '(none given)'}")
        self.names = table_names(directories)
        if not self.names:
            raise FileNotFoundError(f"no Syzygy tables (*.rtbw) in {', '.join(map(str, directories))}")
        self.max_pieces = max(len(name) - 1 for name in self.names)  # 'KQvK' -> 3 pieces
        self._tablebase = chess.syzygy.Tablebase()
        for directory in directories:
            self._tablebase.add_directory(str(directory))

    def covers(self, board: chess.Board) -> bool:
        """True when the position has few enough pieces and no castling rights."""
        return chess.popcount(board.occupied) <= self.max_pieces and not board.castling_rights

    def probe(self, position: str | chess.Board) -> TablebaseResult:
        """Exact WDL and DTZ for the side to move; `KeyError` when no table covers it."""
        board = parse_board(position)
        if not self.covers(board):
            raise KeyError(f"no tablebase covers {board.fen()!r} (tables up to {self.max_pieces} pieces)")
        try:
            wdl = self._tablebase.probe_wdl(board)
            dtz = self._tablebase.probe_dtz(board)
        except chess.syzygy.MissingTableError as error:
            raise KeyError(f"no tablebase covers {board.fen()!r}: {error}") from None
        return TablebaseResult(wdl=wdl, dtz=dtz)

    def close(self) -> None:
        self._tablebase.close()

    def __enter__(self) -> "Tablebase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
