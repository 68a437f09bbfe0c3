"""The truths of the RookWorld P: task: a position's top lines, and the values of other moves.

Two oracles:

- **the engine** (`policy_truths`): one multipv analysis per distinct position through the engine
  pool (and its SQLite cache); `unlisted_move_values` values legal moves outside that list by a
  search of the position after them. Scores are in pawns for the side to move (mate = +/-1000,
  `mover_pawns`) and in win probability (expected score, the pool's python-chess WDL model).
- **the Syzygy tablebase** (`tablebase_truths`, 3-4-piece endgames): every legal move's exact
  value (`ExactMoveValue`: win/draw/loss and plies to the end), so no move is unvalued and the
  DTZ-optimal moves are known exactly. Its E: scale is `tablebase_pawns`: 100 minus the plies to
  mate for a win (a mating move is 100.0), 0 for a draw, -(100 - plies) for a loss.

The rewards that compare a completion with these truths are `data.rookworld_grading`'s.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import chess

from chessgrpo.board.validation import parse_board, parse_move
from chessgrpo.data.rookworld_format import MATE_PAWNS, MAX_LISTED_MOVES, PolicyAnswer

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool
    from chessgrpo.engine.tablebase import Tablebase

TABLEBASE_WIN_PAWNS = 100.0
"""E: value of a mating move on the tablebase scale; a win with n plies left is 100 - n (`tablebase_pawns`)."""


def mover_pawns(cp: int | None, mate: int | None) -> float:
    """An engine score for the side to move in pawns, mate = +/-1000."""
    if mate is not None:
        return MATE_PAWNS if mate > 0 else -MATE_PAWNS
    if cp is None:
        raise ValueError("a score needs cp or mate")
    return cp / 100.0


@dataclasses.dataclass(frozen=True)
class ExactMoveValue:
    """A legal move's exact value for the mover (a tablebase probe of the position after it)."""

    score: float
    """1 the mover wins, 0.5 draw (cursed wins included: the 50-move rule counts), 0 the mover loses."""
    plies: int
    """Plies to the end after the move in a decisive position (0: the move mates); 0 in a draw."""

    @property
    def key(self) -> tuple[float, int]:
        """Orders moves best first when sorted descending: the score, then the shortest win or longest loss."""
        if self.score == 1.0:
            return (1.0, -self.plies)
        if self.score == 0.0:
            return (0.0, self.plies)
        return (self.score, 0)


def tablebase_pawns(value: ExactMoveValue) -> float:
    """The E: value of a move on the tablebase scale: 100 - plies to mate for a win, 0 for a draw,
    -(100 - plies) for a loss (`TABLEBASE_WIN_PAWNS`)."""
    if value.score == 1.0:
        return TABLEBASE_WIN_PAWNS - value.plies
    if value.score == 0.0:
        return -(TABLEBASE_WIN_PAWNS - value.plies)
    return 0.0


@dataclasses.dataclass(frozen=True)
class PolicyTruth:
    """The engine's view of a position for the policy task."""

    fen: str
    moves: tuple[str, ...]
    """The engine's top moves, best first (multipv order)."""
    pawns: tuple[float, ...]
    """Their values in pawns for the side to move."""
    legal: frozenset[str]
    """Every legal move (UCI)."""
    wins: tuple[float, ...] = ()
    """Their win probabilities (expected score for the side to move, the pool's python-chess WDL
    model); empty in a truth built without them (graded rewards need them: use `policy_truths`)."""
    exact: Mapping[str, ExactMoveValue] | None = None
    """Every legal move's exact value (a tablebase truth, `tablebase_truths`); None for an engine truth."""

    @property
    def optimal(self) -> frozenset[str]:
        """The exactly best moves (an exact truth: every move tied with the best by `ExactMoveValue.key`,
        the DTZ-optimal ones in a won position); an engine truth: its best move."""
        if self.exact is None:
            return frozenset([self.best])
        top = max(value.key for value in self.exact.values())
        return frozenset(move for move, value in self.exact.items() if value.key == top)

    @property
    def best(self) -> str:
        return self.moves[0]

    @property
    def best_win(self) -> float:
        """The reference win probability regrets are measured from: the best listed line's."""
        if len(self.wins) != len(self.moves):
            raise ValueError(f"the truth of {self.fen!r} carries no win probabilities (build it with policy_truths)")
        return max(self.wins)

    def answer(self, seed: int | None = None) -> PolicyAnswer:
        """The engine's answer in P: form: M shuffled (seeded), E rounded as written, B = best."""
        order = list(range(len(self.moves)))
        random.Random(seed if seed is not None else self.fen).shuffle(order)
        return PolicyAnswer(
            moves=tuple(self.moves[i] for i in order),
            evals=tuple(round(self.pawns[i], 2) for i in order),
            best=self.best,
        )


def policy_truths(
    pool: EnginePool, fens: Sequence[str], *, nodes: int, multipv: int = MAX_LISTED_MOVES
) -> list[PolicyTruth]:
    """One `PolicyTruth` per FEN from a multipv analysis (cached by the pool); distinct FENs once."""
    boards = {fen: parse_board(fen) for fen in dict.fromkeys(fens)}
    for fen, board in boards.items():
        if not any(board.generate_legal_moves()):
            raise ValueError(f"position {fen!r} has no legal move: no policy task")
    analyses = pool.analyse_many(list(boards.values()), multipv=multipv, nodes=nodes)
    truths = {}
    for (fen, board), analysis in zip(boards.items(), analyses):
        if not analysis.lines:
            raise RuntimeError(f"the engine returned no line for {fen!r}")
        truths[fen] = PolicyTruth(
            fen=fen,
            moves=tuple(line.move for line in analysis.lines),
            pawns=tuple(mover_pawns(line.cp, line.mate) for line in analysis.lines),
            legal=frozenset(move.uci() for move in board.legal_moves),
            wins=tuple(line.win_probability for line in analysis.lines),
        )
    return [truths[fen] for fen in fens]


@dataclasses.dataclass(frozen=True)
class MoveValue:
    """A legal move's value for the mover, from a search of the position after it (`unlisted_move_values`)."""

    pawns: float
    """Pawns, mover's view (mate = +/-1000)."""
    win: float
    """Win probability (expected score) for the mover: 1 - the opponent's after the move."""


def unlisted_move_values(
    pool: EnginePool, pairs: Sequence[tuple[str, str]], *, nodes: int
) -> dict[tuple[str, str], MoveValue]:
    """Values (mover's view) of (FEN, legal move) pairs from a search of the position after the move."""
    distinct = list(dict.fromkeys(pairs))
    if not distinct:
        return {}
    boards = []
    for fen, move in distinct:
        board = parse_board(fen)
        board.push(parse_move(board, move))
        boards.append(board)
    values = {}
    for pair, evaluation in zip(distinct, pool.evaluate(boards, nodes=nodes)):
        if evaluation.mate is not None:  # the opponent's mate score; mate 0 = the opponent is mated
            pawns = -MATE_PAWNS if evaluation.mate > 0 else MATE_PAWNS
        else:
            pawns = -(evaluation.cp or 0) / 100.0
        # The opponent's expected score, one ply later: the WDL model's ply term moves it negligibly.
        values[pair] = MoveValue(pawns=pawns, win=1.0 - evaluation.win_probability)
    return values


def exact_move_values(tablebase: Tablebase, board: chess.Board) -> dict[str, ExactMoveValue]:
    """Every legal move of `board` with its exact value for the mover (UCI -> value), from the tables.

    The position after each move is judged by the rules first (mate, stalemate, insufficient
    material, 50 moves) and by the tables otherwise (`Tablebase.state`); `KeyError` when no table
    covers the position.
    """
    from chessgrpo.engine.tablebase_values import terminal_after_move

    mover = board.turn
    values = {}
    for move in board.legal_moves:
        after = board.copy(stack=False)
        after.push(move)
        state = tablebase.state(after, mover, terminal=terminal_after_move(after), checked=True)
        values[move.uci()] = ExactMoveValue(score=state.score, plies=state.plies)
    return values


def tablebase_truth(tablebase: Tablebase, board: chess.Board, *, multipv: int = MAX_LISTED_MOVES) -> PolicyTruth:
    """The exact `PolicyTruth` of a tablebase position: the `multipv` best moves (ties in UCI order) with
    their `tablebase_pawns` values and win scores, and every legal move's value in ``exact``."""
    return exact_truth(board.fen(), exact_move_values(tablebase, board), multipv=multipv)


def exact_truth(fen: str, values: Mapping[str, ExactMoveValue], *, multipv: int = MAX_LISTED_MOVES) -> PolicyTruth:
    """The `PolicyTruth` of the position `fen` whose legal moves have the exact `values`: the `multipv`
    best moves (ties in UCI order) with their `tablebase_pawns` values and win scores."""
    if not values:
        raise ValueError(f"position {fen!r} has no legal move: no policy task")
    ranked = sorted(values, key=lambda move: (tuple(-x for x in values[move].key), move))[:multipv]
    return PolicyTruth(
        fen=fen,
        moves=tuple(ranked),
        pawns=tuple(tablebase_pawns(values[m]) for m in ranked),
        legal=frozenset(values),
        wins=tuple(values[m].score for m in ranked),
        exact=dict(values),
    )


def tablebase_truths(
    tablebase: Tablebase, fens: Sequence[str], *, multipv: int = MAX_LISTED_MOVES
) -> list[PolicyTruth]:
    """`tablebase_truth` of each FEN (distinct FENs probed once; the tablebase caches probes)."""
    truths = {fen: tablebase_truth(tablebase, parse_board(fen), multipv=multipv) for fen in dict.fromkeys(fens)}
    return [truths[fen] for fen in fens]
