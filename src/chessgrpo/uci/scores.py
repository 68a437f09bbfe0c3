"""UCI scores (`Score`): what ``chessgrpo uci`` says of a move, always from the side to move's view.

- Decided by the rules (`decided_score`): ``mate 1`` when the move mates, ``mate -1`` when the
  opponent then has a mate in one, ``cp 0`` for a draw (stalemate, insufficient material, the
  fifty-move rule, a repetition as the search counts it); with Syzygy tables, a tablebase win or
  loss is ``cp +-2000``. Longer mates are not proven by either search, so they are never claimed.
- With a value head (`estimate_score`): ``cp`` from the expected score v on Lc0's scale,
  ``111.714640912 tan(1.5620688421 (2v - 1))`` (`chessgrpo.search.value_to_centipawns`, clipped to
  +-2000); for the searched moves v is the search's, for ``Search none`` the value head's on the
  position after each move.
- Without a value head (`policy_estimate`): v = the same scale's expected score of the material
  after the move (settled by a capture-only quiescence search, in centipawns) + T ln(p(move) / p(best)), with T =
  `POLICY_SCORE_TEMPERATURE` = 0.05: the distillation objective's temperature
  (`tasks.supervised`), under which the policy's log-probability ratios *are* expected-score
  differences in units of T. The policy's favourite scores exactly its material; an
  alternative the policy finds 10 times less likely scores about 0.12 lower. Not calibrated.
- ``wdl`` (`expected_score_wdl`): decided results are exact (1000 0 0, 0 1000 0, 0 0 1000);
  estimates split v with the maximum-entropy distribution whose expected score is v (W : D : L
  = t^2 : t : 1), since the network predicts only the expectation.

``docs/uci.md`` describes the same conventions for users.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import chess

from chessgrpo.search import centipawns_to_value, value_to_centipawns
from chessgrpo.search.evaluator import mating_move

ExactValue = Callable[[chess.Board, list[chess.Move]], "float | None"]
"""``exact_value(board, legal)``: the side to move's exact expected score, or None (`NetworkEvaluator.exact_value`, `claimable_value`)."""

POLICY_SCORE_TEMPERATURE = 0.05
"""T of the policy-only score estimate: win-probability units per unit of log-probability (= `configs/pretrain_tiny.yaml`'s distill_temperature)."""
PIECE_CENTIPAWNS = {chess.PAWN: 100, chess.KNIGHT: 300, chess.BISHOP: 300, chess.ROOK: 500, chess.QUEEN: 900}
QUIESCENCE_PLIES = 6
QUIESCENCE_NODES = 400
"""Capture-search budget per scored move (keeps a policy-only answer in milliseconds)."""


@dataclasses.dataclass(frozen=True)
class Score:
    """A UCI score from the side to move's view: ``cp N`` or ``mate N``, and its ``wdl`` (per mille)."""

    kind: str
    amount: int
    wdl: tuple[int, int, int]

    def text(self, show_wdl: bool = False) -> str:
        wdl = f" wdl {self.wdl[0]} {self.wdl[1]} {self.wdl[2]}" if show_wdl else ""
        return f"{self.kind} {self.amount}{wdl}"


def expected_score_wdl(value: float) -> tuple[int, int, int]:
    """Win/draw/loss per mille with expected score `value` (win + draw / 2): the maximum-entropy
    split, P(W) : P(D) : P(L) = t^2 : t : 1 with t solving the expectation (1/3 each at 0.5)."""
    v = min(max(float(value), 0.0), 1.0)
    if v >= 1.0 - 1e-9:
        return (1000, 0, 0)
    if v <= 1e-9:
        return (0, 0, 1000)
    # (1 - v) t^2 + (1/2 - v) t - v = 0, positive root
    b = 0.5 - v
    t = (-b + math.sqrt(b * b + 4.0 * v * (1.0 - v))) / (2.0 * (1.0 - v))
    total = t * t + t + 1.0
    wins, losses = round(1000 * t * t / total), round(1000 / total)
    draws = max(1000 - wins - losses, 0)
    return (1000 - draws - losses, draws, losses)


def estimate_score(value: float) -> Score:
    """An estimated expected score as ``cp`` (`value_to_centipawns`) with its maximum-entropy WDL."""
    return Score("cp", value_to_centipawns(value), expected_score_wdl(value))


def decided_score(board: chess.Board, move: chess.Move, exact_value: ExactValue) -> Score | None:
    """The score of `move` when the rules (or tables) decide the position after it, else None.

    `exact_value(after, legal)` is the opponent's exact expected score or None (the searcher's
    `NetworkEvaluator.exact_value`, or `claimable_value` without search).
    """
    board.push(move)
    try:
        legal = list(board.legal_moves)
        if not legal and board.is_check():
            return Score("mate", 1, (1000, 0, 0))
        opponent = exact_value(board, legal)
        if opponent is None:
            return None
        if opponent >= 1.0 and mating_move(board, legal) is not None:
            return Score("mate", -1, (0, 0, 1000))
    finally:
        board.pop()
    value = 1.0 - opponent
    if value == 0.5:
        return Score("cp", 0, (0, 1000, 0))
    return Score("cp", 2000 if value > 0.5 else -2000, (1000, 0, 0) if value > 0.5 else (0, 0, 1000))


def claimable_value(board: chess.Board, legal: list[chess.Move]) -> float | None:
    """The side to move's exact score where the game is over or a draw can be claimed now
    (threefold, fifty moves), or a mate in one is on the board; else None (no search: a twofold
    repetition is not yet a draw)."""
    if not legal:
        return 0.0 if board.is_check() else 0.5
    if board.is_insufficient_material() or board.halfmove_clock >= 100 or board.is_repetition(3):
        return 0.5
    return 1.0 if mating_move(board, legal) is not None else None


def material_centipawns(board: chess.Board) -> int:
    """Material of the side to move minus the opponent's (P 100, N/B 300, R 500, Q 900)."""
    total = 0
    for piece_type, value in PIECE_CENTIPAWNS.items():
        total += value * (
            chess.popcount(board.pieces_mask(piece_type, board.turn))
            - chess.popcount(board.pieces_mask(piece_type, not board.turn))
        )
    return total


def quiescence(
    board: chess.Board,
    alpha: float = -math.inf,
    beta: float = math.inf,
    plies: int = QUIESCENCE_PLIES,
    budget: list[int] | None = None,
) -> float:
    """Material (side to move, centipawns) once the captures settle: negamax over captures and
    promotions (most valuable victim first) with stand-pat, at most `plies` deep and
    `QUIESCENCE_NODES` positions; checks are not searched (an estimate, not a proof)."""
    budget = budget if budget is not None else [QUIESCENCE_NODES]
    stand = material_centipawns(board)
    if plies == 0 or budget[0] <= 0 or stand >= beta:
        return stand
    alpha = max(alpha, stand)

    def gain(move: chess.Move) -> int:
        victim = board.piece_type_at(move.to_square) or (chess.PAWN if board.is_en_passant(move) else 0)
        return (
            10 * PIECE_CENTIPAWNS.get(victim, 0)
            + PIECE_CENTIPAWNS.get(move.promotion or 0, 0)
            - (board.piece_type_at(move.from_square) or 0)
        )

    moves = [m for m in board.legal_moves if board.is_capture(m) or m.promotion == chess.QUEEN]
    for move in sorted(moves, key=gain, reverse=True):
        budget[0] -= 1
        board.push(move)
        try:
            score = -quiescence(board, -beta, -alpha, plies - 1, budget)
        finally:
            board.pop()
        if score >= beta:
            return score
        alpha = max(alpha, score)
        if budget[0] <= 0:
            break
    return alpha


def policy_estimate(board: chess.Board, move: chess.Move, probability: float, best_probability: float) -> Score:
    """The score of `move` without a value head (module docstring): logistic(quiescence material
    after the move) + `POLICY_SCORE_TEMPERATURE` * ln(p(move) / p(best))."""
    board.push(move)
    try:
        material = -quiescence(board.copy(stack=False))
    finally:
        board.pop()
    ratio = max(probability, 1e-300) / max(best_probability, 1e-300)
    value = centipawns_to_value(material) + POLICY_SCORE_TEMPERATURE * math.log(min(ratio, 1.0))
    return estimate_score(min(max(value, 0.0), 1.0))
