"""Chess clocks for `chessgrpo eval games`: cutechess/fastchess time controls and each side's clock.

A time control (`parse_time_control`) is written as cutechess-cli and fastchess take it:

- ``MOVES/SECONDS+INC``: SECONDS for every MOVES moves, plus INC seconds after each move
  (``40/10+0.1``); the clock gets SECONDS more when a side has played MOVES moves (repeating);
- ``SECONDS+INC``: the whole game in SECONDS plus INC per move (``30+0.3``);
- ``SECONDS``: the whole game, no increment (``60``).

`GameClock` keeps both sides' clocks: `view` is what the mover is told before its move (both
remaining times, both increments, moves to go: UCI ``go wtime btime winc binc movestogo``), and
`spend` takes off the wall time the move really took, adds the increment and says whether the side
flagged (its clock went below zero: a loss on time, or a draw when the opponent cannot mate).
"""

from __future__ import annotations

import dataclasses
import re

import chess

_TIME_CONTROL = re.compile(r"^(?:(\d+)/)?(\d+(?:\.\d*)?|\.\d+)(?:\+(\d+(?:\.\d*)?|\.\d+))?$")
TC_GRAMMAR = "MOVES/SECONDS+INC, SECONDS+INC or SECONDS (e.g. 40/10+0.1, 30+0.3, 60)"


@dataclasses.dataclass(frozen=True)
class TimeControl:
    """One side's time control: `seconds` per period of `moves` moves (0 = the whole game), plus `increment` per move."""

    seconds: float
    increment: float = 0.0
    moves: int = 0
    """Moves per period (the ``MOVES/`` part); 0 = sudden death (one period for the whole game)."""

    @property
    def text(self) -> str:
        """The cutechess form (``40/10+0.1``), also the PGN TimeControl tag."""
        base = f"{self.moves}/{self.seconds:g}" if self.moves else f"{self.seconds:g}"
        return f"{base}+{self.increment:g}" if self.increment else base


def parse_time_control(text: str, what: str = "tc") -> TimeControl:
    """`TimeControl` of ``MOVES/SECONDS+INC``, ``SECONDS+INC`` or ``SECONDS``; `ValueError` names `what` and the value."""
    match = _TIME_CONTROL.match(str(text).strip())
    if match is None:
        raise ValueError(f"{what} {str(text)!r} is not a time control: expected {TC_GRAMMAR}")
    moves, seconds, increment = match.groups()
    control = TimeControl(seconds=float(seconds), increment=float(increment or 0), moves=int(moves or 0))
    if not control.seconds > 0:
        raise ValueError(f"{what} {str(text)!r}: the time must be more than 0 seconds")
    if moves is not None and control.moves < 1:
        raise ValueError(f"{what} {str(text)!r}: MOVES must be at least 1")
    return control


@dataclasses.dataclass(frozen=True)
class ClockView:
    """What a mover is told before its move: both clocks and increments (seconds) and its moves to go."""

    white: float
    black: float
    white_increment: float
    black_increment: float
    moves_to_go: int = 0
    """Moves of the mover to the next time control (0 = sudden death)."""

    def remaining(self, colour: chess.Color) -> float:
        return self.white if colour == chess.WHITE else self.black

    def increment(self, colour: chess.Color) -> float:
        return self.white_increment if colour == chess.WHITE else self.black_increment


class GameClock:
    """Both sides' clocks in one game (module docstring); `controls` maps a colour to its `TimeControl`."""

    def __init__(self, white: TimeControl, black: TimeControl):
        self.controls = {chess.WHITE: white, chess.BLACK: black}
        self.left = {chess.WHITE: white.seconds, chess.BLACK: black.seconds}
        self.moves = {chess.WHITE: 0, chess.BLACK: 0}

    def moves_to_go(self, colour: chess.Color) -> int:
        control = self.controls[colour]
        return control.moves - self.moves[colour] % control.moves if control.moves else 0

    def view(self, colour: chess.Color) -> ClockView:
        """The clocks as `colour` sees them before its move."""
        return ClockView(
            white=self.left[chess.WHITE],
            black=self.left[chess.BLACK],
            white_increment=self.controls[chess.WHITE].increment,
            black_increment=self.controls[chess.BLACK].increment,
            moves_to_go=self.moves_to_go(colour),
        )

    def spend(self, colour: chess.Color, seconds: float) -> bool:
        """Take a move's wall time off `colour`'s clock; True when it flagged (below zero before the increment)."""
        self.left[colour] -= seconds
        if self.left[colour] < 0:
            return True
        control = self.controls[colour]
        self.left[colour] += control.increment
        self.moves[colour] += 1
        if control.moves and self.moves[colour] % control.moves == 0:  # a new period: its time is added
            self.left[colour] += control.seconds
        return False


def time_forfeit(board: chess.Board, flagged: chess.Color) -> str:
    """The result when `flagged` ran out of time in `board`: a loss, or a draw when the opponent has
    insufficient material to mate (FIDE Laws 6.9)."""
    if board.has_insufficient_material(not flagged):
        return "1/2-1/2"
    return "0-1" if flagged == chess.WHITE else "1-0"
