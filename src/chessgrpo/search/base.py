"""What both search algorithms (`search.puct`, `search.alphabeta`) share: their limits, their
result, the root moves they may play, the roots they decide without searching, and the hooks a
caller can give a search.

The hooks (keyword arguments of `PuctSearch.search`, `AlphaBetaSearch.search` and
`Searcher.search`; a search without them is exactly the search it was before they existed):

- ``root_moves``: play only one of these moves (UCI ``go searchmoves``). The root is restricted
  before anything else, so the decided-root shortcuts (a tablebase move, a mate in one) also
  pick only among them.
- ``should_stop(nodes)``: asked before the search grows to ``nodes`` nodes (PUCT: before every
  simulation; alpha-beta: before every network call, which may evaluate several positions).
  True stops the search, which returns its best result so far, as at its node or time limit. A
  caller can stop a search from another thread (UCI ``stop``) or move its node limit while it
  runs (UCI ``ponderhit``).
- ``report(result)``: the search so far, at most every ``report_interval`` seconds (PUCT: after
  a batch of leaves; alpha-beta: after a completed iteration), e.g. for UCI ``info`` lines
  during a long search.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import chess

from chessgrpo.search.evaluator import mating_move

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.search.evaluator import NetworkEvaluator

StopCheck = Callable[[int], bool]
"""``should_stop(nodes)``: True when the search must not grow to `nodes` nodes (see the module docstring)."""
Report = Callable[["SearchResult"], None]
"""``report(result)``: receives the search so far (see the module docstring)."""
REPORT_INTERVAL_S = 1.0
"""Default seconds between two ``report`` calls."""


@dataclasses.dataclass(frozen=True)
class SearchLimits:
    """When a search stops: after `nodes` simulations or `seconds` of wall-clock, whichever first."""

    nodes: int = 256
    """Simulations (each evaluates at most one new leaf)."""
    seconds: float | None = None
    """Wall-clock limit (None = none); the search always finishes the batch it is in."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"search nodes must be >= 1, got {self.nodes}")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"search time limit must be > 0 seconds, got {self.seconds}")


@dataclasses.dataclass
class RootMove:
    """One root move's statistics after a search."""

    move: chess.Move
    visits: int
    value: float
    """Mean expected score for the root's side to move through this move, in [0, 1] (the prior's
    parent estimate when unvisited)."""
    prior: float
    pv: list[chess.Move]
    """The move, then the most visited line below it."""


@dataclasses.dataclass
class SearchResult:
    """What a search found, from the root's side to move."""

    move: chess.Move
    value: float
    """Expected score of the best move, in [0, 1]."""
    root_moves: list[RootMove]
    """Every root move, most visited first."""
    nodes: int
    """Simulations run."""
    network_positions: int
    """Positions the network evaluated (root included)."""
    seconds: float
    depth: int
    """Length of the principal variation."""
    seldepth: int
    """Deepest simulation."""
    exact: bool = False
    """The best move's value is proven by the rules or the tablebases (e.g. a mate in one)."""

    @property
    def pv(self) -> list[chess.Move]:
        return self.root_moves[0].pv


def root_candidates(board: chess.Board, root_moves: Sequence[chess.Move] | None = None) -> list[chess.Move]:
    """The moves a search of `board` may play: every legal move (None), else those of `root_moves`,
    in legal-move order (so a restricted search breaks ties as an unrestricted one does).

    Raises:
        ValueError: the side to move has no legal move, or `root_moves` is empty or holds a move
            that is not legal in `board`.
    """
    legal = list(board.legal_moves)
    if not legal:
        raise ValueError(f"no legal move to search in {board.fen()!r}")
    if root_moves is None:
        return legal
    wanted = set(root_moves)
    if not wanted:
        raise ValueError("root_moves is empty: pass None to search every legal move")
    illegal = wanted.difference(legal)
    if illegal:
        raise ValueError(f"root_moves {sorted(m.uci() for m in illegal)} are not legal in {board.fen()!r}")
    return [move for move in legal if move in wanted]


def decided_result(move: chess.Move, value: float, started: float) -> SearchResult:
    """The result of a root decided without search (a mate in one, a tablebase position)."""
    root_move = RootMove(move=move, visits=0, value=value, prior=1.0, pv=[move])
    seconds = time.perf_counter() - started
    return SearchResult(
        move=move,
        value=value,
        root_moves=[root_move],
        nodes=0,
        network_positions=0,
        seconds=seconds,
        depth=1,
        seldepth=1,
        exact=True,
    )


def mate_in_one_result(
    board: chess.Board, started: float, moves: Sequence[chess.Move] | None = None
) -> SearchResult | None:
    """The mate where one of `moves` (default: every legal move) mates at once, else None."""
    mate = mating_move(board, list(board.legal_moves) if moves is None else moves)
    if mate is None:
        return None
    return decided_result(mate, 1.0, started)


def tablebase_result(
    evaluator: NetworkEvaluator, board: chess.Board, started: float, moves: Sequence[chess.Move] | None = None
) -> SearchResult | None:
    """The perfect move where the evaluator's tablebases cover the root (`Tablebase.best_moves`:
    the fastest win, else a draw, else the longest loss), else None. No network call is needed.

    With `moves`, only a perfect move among them is played; when none is, None (the search then
    finds the best of `moves`, the tables still scoring the positions after them exactly).
    """
    tablebase = evaluator.tablebase
    if tablebase is None or chess.popcount(board.occupied) > evaluator.tablebase_pieces or not tablebase.covers(board):
        return None
    best = tablebase.best_moves(board)
    if moves is not None:
        allowed = set(moves)
        best = [move for move in best if move in allowed]
        if not best:
            return None
    board.push(best[0])
    try:
        after = evaluator.exact_value(board, list(board.legal_moves))
    finally:
        board.pop()
    value = 1.0 - (after if after is not None else 0.5)
    return decided_result(best[0], value, started)


def decided_root(
    evaluator: NetworkEvaluator, board: chess.Board, moves: Sequence[chess.Move], started: float
) -> SearchResult | None:
    """A root decided without search among `moves` (`root_candidates`): a tablebase move, else a
    mate in one; None when the root must be searched."""
    return tablebase_result(evaluator, board, started, moves) or mate_in_one_result(board, started, moves)


class Progress:
    """Calls `report` with the search so far at most every `interval` seconds (nothing without `report`)."""

    def __init__(self, report: Report | None, interval: float, started: float):
        self.report = report
        self.interval = interval
        self.last = started

    def __call__(self, result: Callable[[], SearchResult]) -> None:
        """Report `result()` when the interval has passed (the result is only built then)."""
        if self.report is None or time.perf_counter() - self.last < self.interval:
            return
        self.last = time.perf_counter()
        self.report(result())
