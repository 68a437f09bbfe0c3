"""Syzygy endgame tablebases: the one front end to exact WDL, DTZ, values and perfect moves (python-chess).

`Tablebase` (3-4 pieces in data/syzygy) answers two kinds of question:

- `probe(position)` -> `TablebaseResult`: WDL and DTZ for the side to move, probed afresh (the
  reward shaping of `tasks.rewards`, the adjudication of `play.games`, the UCI player).
- The endgame curriculum's exact oracle, every probe cached (`probe_wdl`, `probe_dtz`, `is_won`):
  - `state(board, pov)` -> `engine.tablebase_values.TablebaseState`: the game-theoretic score for
    `pov` and the distance to the end in plies; a finished game is scored by the rules, not probed.
  - `best_moves(board)`: the moves that are best for the side to move by (score, then progress):
    the shortest win, else a draw, else the longest loss. The first of them in UCI order is
    `tablebase_move`, used both as the **perfect defender** (the weak side picks the loss that
    takes longest, or a draw if any move draws) and as the **tablebase baseline** (the strong side
    mates by the DTZ-optimal path: the physical limit).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import chess
import chess.syzygy

from chessgrpo.board.validation import parse_board
from chessgrpo.engine.tablebase_values import TablebaseState, game_over, terminal_after_move
from chessgrpo.paths import find_data_path

_TABLE_NAME = re.compile(r"^([KQRBNP]+)v([KQRBNP]+)\.rtbw$")

_CACHE_LIMIT = 2_000_000
"""Cached probes kept before the cache is cleared (a KQvK table has ~0.5M positions per side to move)."""


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
    """Probe Syzygy tables in one or more directories: exact values, best moves, the perfect defender.

    ``max_pieces`` is the largest piece count (kings included) with tables present; positions
    with more pieces, castling rights or missing tables raise `KeyError` from `probe` (and from
    the cached probes, except for a missing table of a covered piece count).

    Probing costs depend on which side to move a table stores: for KQvK a DTZ probe with the strong
    side to move takes ~180 us, with the weak side to move ~900 us (python-chess then searches one
    ply), a WDL probe ~45 us (KRvK: 460 us, 1.9 ms, 90 us). So `best_moves` judges moves by WDL
    first and probes DTZ only for the moves that tie on the best score, and every `probe_wdl` and
    `probe_dtz` is cached (positions keyed by pieces, side to move and en-passant square; a cache
    is cleared when it exceeds `_CACHE_LIMIT` entries). The rollouts of `tasks.trajectory` only
    ever need DTZ with the strong side to move.
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
        self._wdl: dict[tuple, int] = {}
        self._dtz: dict[tuple, int] = {}
        self._moves: dict[tuple, chess.Move] = {}  # `tablebase_move` by position
        self.probes = 0
        """Cached probes that went to the tables (cache misses, WDL and DTZ; `probe` is not counted)."""
        self.lookups = 0
        """All cached probe requests (hits and misses)."""

    def covers(self, board: chess.Board) -> bool:
        """True when the position has few enough pieces and no castling rights."""
        return chess.popcount(board.occupied) <= self.max_pieces and not board.castling_rights

    def probe(self, position: str | chess.Board) -> TablebaseResult:
        """Exact WDL and DTZ for the side to move, uncached; `KeyError` when no table covers it."""
        board = parse_board(position)
        self._check(board)
        try:
            wdl = self._tablebase.probe_wdl(board)
            dtz = self._tablebase.probe_dtz(board)
        except chess.syzygy.MissingTableError as error:
            raise KeyError(f"no tablebase covers {board.fen()!r}: {error}") from None
        return TablebaseResult(wdl=wdl, dtz=dtz)

    def close(self) -> None:
        self._tablebase.close()

    def __enter__(self) -> Tablebase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------------------------------------
    # Cached probes

    @staticmethod
    def _key(board: chess.Board) -> tuple:
        return (
            board.occupied_co[0],
            board.occupied_co[1],
            board.pawns,
            board.knights,
            board.bishops,
            board.rooks,
            board.queens,
            board.kings,
            board.turn,
            board.ep_square,
        )

    def _check(self, board: chess.Board) -> None:
        if not self.covers(board):
            raise KeyError(f"no tablebase covers {board.fen()!r} (tables up to {self.max_pieces} pieces)")

    def probe_wdl(self, board: chess.Board) -> int:
        """WDL for the side to move (2 win, 1 cursed win, 0 draw, -1 blessed loss, -2 loss), cached; KeyError when not covered."""
        return self._probe(self._wdl, self._tablebase.probe_wdl, board)

    def probe_dtz(self, board: chess.Board) -> int:
        """DTZ for the side to move (python-chess sign and rounding), cached; KeyError when not covered."""
        return self._probe(self._dtz, self._tablebase.probe_dtz, board)

    def _probe(self, cache: dict, probe: Callable[[chess.Board], int], board: chess.Board) -> int:
        """`probe(board)` through `cache` (cleared when full); counts lookups and real probes."""
        self.lookups += 1
        key = self._key(board)
        value = cache.get(key)
        if value is None:
            self._check(board)
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            value = cache[key] = probe(board)
            self.probes += 1
        return value

    def is_won(self, board: chess.Board) -> bool:
        """The side to move wins (WDL == 2, i.e. also under the 50-move rule)."""
        return self.covers(board) and self.probe_wdl(board) == 2

    # --------------------------------------------------------------------------------------------
    # Values and perfect moves

    def state(
        self,
        board: chess.Board,
        pov: chess.Color,
        *,
        terminal: str | None = None,
        checked: bool = False,
        distance: bool = True,
    ) -> TablebaseState:
        """The exact value of `board` for `pov`.

        `checked=True` says the caller already knows whether the game is over (`terminal`, None
        when not); otherwise `game_over(board)` decides, using the board's move stack.
        `distance=False` skips the DTZ probe (plies is then 0).
        """
        if not checked:
            terminal = game_over(board)
        if terminal == "checkmate":
            mated = board.turn == pov
            return TablebaseState(
                score=0.0 if mated else 1.0, plies=0, terminal=terminal, mated=mated, delivered_mate=not mated
            )
        if terminal is not None:
            return TablebaseState(score=0.5, plies=0, terminal=terminal)
        wdl = self.probe_wdl(board)
        if board.turn != pov:
            wdl = -wdl
        score = 1.0 if wdl == 2 else 0.0 if wdl == -2 else 0.5
        plies = abs(self.probe_dtz(board)) if distance and score != 0.5 else 0
        return TablebaseState(score=score, plies=plies)

    def best_moves(self, board: chess.Board) -> list[chess.Move]:
        """The legal moves best for the side to move by (score, progress), in UCI order.

        The shortest win, else any draw, else the longest loss. Positions after a move are judged
        by the rules first (mate, stalemate, insufficient material, 50 moves) and by the tables
        otherwise; a repetition can only be claimed on the move after, so no move stack is needed.
        """
        mover = board.turn
        scored: list[tuple[chess.Move, TablebaseState, chess.Board]] = []
        for move in sorted(board.legal_moves, key=chess.Move.uci):
            after = board.copy(stack=False)
            after.push(move)
            state = self.state(after, mover, terminal=terminal_after_move(after), checked=True, distance=False)
            scored.append((move, state, after))
        if not scored:
            return []
        top = max(state.score for _, state, _ in scored)
        candidates = [(move, state, after) for move, state, after in scored if state.score == top]
        if top == 0.5 or len(candidates) == 1:
            return [move for move, _, _ in candidates]
        progress = [
            state.progress if state.terminal else self.state(after, mover, checked=True).progress
            for _, state, after in candidates
        ]
        best = max(progress)
        return [move for (move, _, _), value in zip(candidates, progress) if value == best]

    def tablebase_move(self, board: chess.Board) -> chess.Move:
        """The perfect move for the side to move (the first of `best_moves` in UCI order), cached.

        The perfect defender answers every ply of every rollout, and the same positions come back step after step:
        a cached answer is a dictionary lookup instead of `best_moves`' probes of every legal move. The cache key is
        the probes' (pieces, side to move, en-passant square) and whether the halfmove clock is at 99 or more, the
        only other thing `best_moves` reads (a quiet move then reaches the fifty-move rule)."""
        key = (self._key(board), board.halfmove_clock >= 99)
        move = self._moves.get(key)
        if move is None:
            moves = self.best_moves(board)
            if not moves:
                raise ValueError(f"no legal move in {board.fen()!r}")
            if len(self._moves) >= _CACHE_LIMIT:
                self._moves.clear()
            move = self._moves[key] = moves[0]
        return move
