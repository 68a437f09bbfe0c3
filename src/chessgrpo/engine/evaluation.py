"""Evaluations and win probabilities, always from the side to move's point of view.

A raw engine score (centipawns or mate distance) is turned into a win probability with
python-chess's WDL model for the engine version that produced it (`wdl_model_for`), never a
hand-rolled curve: Stockfish 15.1 normalises its centipawns so that 100 cp means a 50% chance
of winning, and the model encodes exactly that calibration.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import chess
import chess.engine

logger = logging.getLogger(__name__)

# python-chess WDL model names by Stockfish version (see chess.engine.Cp.wdl).
_WDL_MODELS = {"12": "sf12", "14": "sf14", "15": "sf15", "15.1": "sf15.1", "16": "sf16", "16.1": "sf16.1"}


def wdl_model_for(engine_name: str) -> str:
    """The python-chess WDL model matching an engine's ``id name`` (e.g. "Stockfish 15.1")."""
    match = re.search(r"Stockfish\s+(\d+(?:\.\d+)?)", engine_name)
    if match and match.group(1) in _WDL_MODELS:
        return _WDL_MODELS[match.group(1)]
    logger.warning("no WDL model known for %r; using python-chess's latest Stockfish model", engine_name)
    return "sf"


def score_to_wdl(cp: int | None, mate: int | None, *, ply: int, model: str) -> tuple[int, int, int]:
    """(wins, draws, losses) in permille for the side to move, from a cp or mate score."""
    if mate is not None:
        # Mate(0) means the side to move is checkmated.
        return (0, 0, 1000) if mate <= 0 else (1000, 0, 0)
    if cp is None:
        raise ValueError("a score needs cp or mate")
    wdl = chess.engine.Cp(cp).wdl(model=model, ply=ply)  # type: ignore[arg-type]
    return (wdl.wins, wdl.draws, wdl.losses)


DRAW = 0.5
"""The win probability (expected score) of a drawn position."""


def expected_score(wdl: tuple[int, int, int]) -> float:
    """Win probability as the expected game score: (wins + draws / 2) / 1000."""
    wins, draws, losses = wdl
    return (wins + 0.5 * draws) / (wins + draws + losses)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """An engine evaluation of one position, from the side to move's point of view."""

    fen: str
    """The position as evaluated (python-chess's normal form of the requested FEN)."""
    win_probability: float
    """Expected score for the side to move in [0, 1]: 1 = certain win, 0.5 = draw, 0 = loss."""
    wdl: tuple[int, int, int]
    """(wins, draws, losses) in permille for the side to move."""
    cp: int | None = None
    """Centipawns for the side to move (None when the score is a mate or a terminal position)."""
    mate: int | None = None
    """Mate distance in moves: > 0 the side to move mates, < 0 it gets mated, 0 it is mated now."""
    best_move: str | None = None
    """Stockfish's `bestmove` in UCI (None for terminal positions). When the node limit stops
    an iteration after a new best move failed high, this can differ from pv[0] (rare)."""
    pv: tuple[str, ...] = ()
    """Principal variation of the scored line (the last iteration with an exact score)."""
    depth: int = 0
    nodes: int = 0
    terminal: str | None = None
    """"checkmate", "stalemate", "insufficient_material" or "fifty_moves" when the game is over."""
    cached: bool = False
    """True when this came from the persistent cache instead of a search."""


@dataclasses.dataclass(frozen=True)
class MoveEvaluation:
    """One line of a multipv analysis: a root move and the value of playing it."""

    move: str
    win_probability: float
    """Expected score for the side to move at the root after playing `move`."""
    wdl: tuple[int, int, int]
    cp: int | None = None
    mate: int | None = None
    pv: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Analysis:
    """A multipv analysis: the top moves of a position, best first, side to move's view."""

    fen: str
    lines: tuple[MoveEvaluation, ...]
    depth: int = 0
    nodes: int = 0
    cached: bool = False

    @property
    def best(self) -> MoveEvaluation | None:
        return self.lines[0] if self.lines else None


def terminal_result(board: chess.Board) -> tuple[str, float] | None:
    """(reason, win probability for the side to move) if the game is over, else None.

    A checkmated side scores 0; stalemate, insufficient material and a claimable 50-move draw
    score 0.5. Threefold repetition needs the game's history and is the caller's to judge.
    """
    if board.is_checkmate():
        return "checkmate", 0.0
    if board.is_stalemate():
        return "stalemate", 0.5
    if board.is_insufficient_material():
        return "insufficient_material", 0.5
    if board.is_fifty_moves():
        return "fifty_moves", 0.5
    return None


def terminal_evaluation(board: chess.Board, reason: str, value: float) -> Evaluation:
    """The exact evaluation of a finished game, made without asking an engine."""
    wdl = (0, 0, 1000) if value == 0.0 else (0, 1000, 0)
    return Evaluation(
        fen=board.fen(),
        win_probability=value,
        wdl=wdl,
        cp=None if reason == "checkmate" else 0,
        mate=0 if reason == "checkmate" else None,
        terminal=reason,
    )
