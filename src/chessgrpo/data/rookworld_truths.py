"""The engine's truths of the RookWorld P: task: a position's top lines, and the values of other moves.

`policy_truths` runs one multipv analysis per distinct position through the engine pool (and its
SQLite cache); `unlisted_move_values` values legal moves outside that list by a search of the
position after them. Scores are in pawns for the side to move (mate = +/-1000, `mover_pawns`) and
in win probability (expected score, the pool's python-chess WDL model). The rewards that compare a
completion with these truths are `eval.rookworld_grading`'s.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chessgrpo.board.validation import parse_board, parse_move
from chessgrpo.data.rookworld_format import MATE_PAWNS, MAX_LISTED_MOVES, PolicyAnswer

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool


def mover_pawns(cp: int | None, mate: int | None) -> float:
    """An engine score for the side to move in pawns, mate = +/-1000."""
    if mate is not None:
        return MATE_PAWNS if mate > 0 else -MATE_PAWNS
    if cp is None:
        raise ValueError("a score needs cp or mate")
    return cp / 100.0


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


def policy_truths(pool: EnginePool, fens: Sequence[str], *, nodes: int, multipv: int = MAX_LISTED_MOVES) -> list[PolicyTruth]:
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


def unlisted_move_values(pool: EnginePool, pairs: Sequence[tuple[str, str]], *, nodes: int) -> dict[tuple[str, str], MoveValue]:
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

