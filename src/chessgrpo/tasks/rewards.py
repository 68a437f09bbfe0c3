"""Move rewards with signal everywhere: a total order over outcomes, not a saturating win probability.

The engine's win probability after a move saturates once a side is clearly winning: "up a queen",
"up two queens" and "mate in 5" all score ~1.0, so a group sampled in a won position gets
(almost) equal rewards and teaches nothing, and a stalemating move scores 0.5 only because the
terminal position is exact. `shaped_value` keeps an ordering among winning moves and scores every
draw as the draw it is, on one scale from the mover's point of view (1 = checkmate delivered):

| after the move (mover's view)            | value                               |
|------------------------------------------|-------------------------------------|
| checkmate delivered                      | 1.0                                 |
| mate in k plies (engine mate score or    | 0.9 + 0.1 * 0.95 ** k: in (0.9, 1)  |
|   tablebase win, k = |DTZ| at <= pieces) |   (shorter is better)               |
| undecided: engine score                  | 0.1 + 0.8 * (win_prob + material)/2 |
|                                          |   in (0.1, 0.9)                     |
| stalemate, insufficient material,        | 0.5                                 |
|   50 moves, tablebase draw/cursed win    |                                     |
| getting mated in k plies                 | 1 - (0.9 + 0.1 * 0.95 ** k)         |

"material" is ``(1 + tanh(cp / CP_SCALE)) / 2``: the engine's centipawns squashed much more
slowly than its win probability, so winning a second queen still scores above winning one. Every
forced mate ranks above every non-mate, so mate in one beats winning a queen; a stalemate of a
won position (0.5) ranks below every winning continuation (> 0.5 for a positive engine score).
Under GRPO's per-group normalisation only the order and relative gaps inside a group matter.

A tablebase probe of the position after the move (`probe_tablebase`, when the tables cover it)
replaces the engine's value, and `tablebase_evaluation` spares its search: exact WDL under the 50-move rule, and DTZ as the distance for ordering wins.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import chess

from chessgrpo.engine.evaluation import DRAW

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import Evaluation, Tablebase
    from chessgrpo.engine.tablebase import TablebaseResult

WIN_FLOOR = 0.9
"""Every forced win scores above this; every undecided position below it."""
DISTANCE_DECAY = 0.95
"""Per-ply discount of a forced win: mate in 1 (1 ply) 0.995, mate in 10 (19 plies) 0.938."""
CP_SCALE = 1000.0
"""Centipawns at which the material term reaches tanh(1) = 0.76 of its range."""


def forced_win_value(plies: int) -> float:
    """Value of a forced win `plies` plies away (0 = checkmate delivered)."""
    return WIN_FLOOR + (1.0 - WIN_FLOOR) * DISTANCE_DECAY ** max(plies, 0)


def undecided_value(win_probability: float, cp: int | None) -> float:
    """Value of a position without a forced result, from the mover's win probability and centipawns."""
    material = 0.5 if cp is None else 0.5 * (1.0 + math.tanh(cp / CP_SCALE))
    return (1.0 - WIN_FLOOR) + (2 * WIN_FLOOR - 1.0) * 0.5 * (win_probability + material)


def probe_tablebase(board: chess.Board, tablebase: Tablebase | None) -> TablebaseResult | None:
    """The exact tablebase values of a non-terminal position the tables cover, else None."""
    if tablebase is None or not tablebase.covers(board) or board.is_game_over():
        return None
    try:
        return tablebase.probe(board)
    except KeyError:  # a table of this material is missing: the engine values it
        return None


def tablebase_evaluation(board: chess.Board, probe: TablebaseResult) -> Evaluation:
    """An `Evaluation` (side to move's view) from a tablebase probe: no search needed."""
    from chessgrpo.engine import Evaluation

    wdl = {2: (1000, 0, 0), -2: (0, 0, 1000)}.get(probe.wdl, (0, 1000, 0))
    return Evaluation(fen=board.fen(), win_probability=probe.win_probability, wdl=wdl)


def shaped_value(evaluation: Evaluation, probe: TablebaseResult | None = None) -> float:
    """The mover's value of the position after its move (module table), in [0, 1].

    `evaluation` is the engine pool's evaluation of the position after the move, from the side
    to move there (the opponent); the pool marks finished games (`terminal`) without searching.
    `probe`, the tablebase's values of that position when the tables cover it, overrides it.
    """
    if evaluation.terminal == "checkmate":
        return 1.0
    if evaluation.terminal is not None:  # stalemate, insufficient material, fifty moves
        return DRAW
    if probe is not None:
        if probe.wdl == -2:  # the opponent (to move) loses: the mover wins
            return forced_win_value(abs(probe.dtz))
        if probe.wdl == 2:
            return 1.0 - forced_win_value(abs(probe.dtz))
        return DRAW  # draw, cursed win or blessed loss under the 50-move rule
    if evaluation.mate is not None:
        moves = evaluation.mate  # the opponent's view: < 0 it gets mated in |mate| moves
        if moves < 0:
            return forced_win_value(2 * -moves - 1)
        if moves > 0:
            return 1.0 - forced_win_value(2 * moves - 1)
        return 1.0  # mate 0: the opponent is mated now
    return undecided_value(1.0 - evaluation.win_probability, None if evaluation.cp is None else -evaluation.cp)
