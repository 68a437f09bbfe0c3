"""Exact endgame values for one colour, and the rules that end a game before any table is probed.

`TablebaseState` is what `engine.tablebase.Tablebase.state` returns: a position's game-theoretic
score for a stated point of view (``pov``, the colour whose value it is; 1 win, 0.5 draw, 0 loss,
the 50-move rule counting, so a cursed win is a draw) and the distance to the end in plies
(|DTZ|; in the pawnless endgames of the curriculum the only zeroing move the strong side can make
is mate, so DTZ is the distance to mate). Positions where the game is over are scored by the
rules, not probed: mate, stalemate, insufficient material (a captured queen), the 50-move rule and
threefold repetition (`game_over`, which needs the game's move stack).
"""

from __future__ import annotations

import dataclasses

import chess


def game_over(board: chess.Board) -> str | None:
    """Why the game is over at `board` (using its move stack for repetitions), or None.

    "checkmate" (the side to move is mated), "stalemate", "insufficient_material",
    "fifty_moves" (claimable: halfmove clock >= 100), "threefold_repetition" (claimable).
    """
    terminal = terminal_after_move(board)
    if terminal is None and board.halfmove_clock >= 4 and board.is_repetition(3):
        return "threefold_repetition"
    return terminal


def terminal_after_move(board: chess.Board) -> str | None:
    """`game_over` without the repetition check: a repetition can only be claimed on the move after,
    so judging the positions one move deep needs no move stack (`Tablebase.best_moves`)."""
    if board.is_checkmate():
        return "checkmate"
    if board.is_stalemate():
        return "stalemate"
    if board.is_insufficient_material():
        return "insufficient_material"
    if board.halfmove_clock >= 100:
        return "fifty_moves"
    return None


@dataclasses.dataclass(frozen=True)
class TablebaseState:
    """A position's exact value for one colour (`pov`)."""

    score: float
    """1 win, 0.5 draw (including cursed wins and blessed losses), 0 loss, for pov."""
    plies: int
    """Plies to the end (|DTZ|; 0 at a finished game, 0 in a draw)."""
    terminal: str | None = None
    """`game_over` reason, or None."""
    mated: bool = False
    """The game ended in mate of pov (True) ... """
    delivered_mate: bool = False
    """... or pov delivered mate (True)."""

    @property
    def progress(self) -> float:
        """-plies / 2 when winning (fewer own moves to mate is better), +plies / 2 when losing (a
        longer loss is better), 0 in a draw: the distance in own moves, signed so that more is better."""
        if self.score == 1.0:
            return -self.plies / 2.0
        if self.score == 0.0:
            return self.plies / 2.0
        return 0.0
