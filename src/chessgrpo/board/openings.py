"""Opening suites for engine matches: generated balanced positions, or read from an EPD/FEN/PGN file.

Games between a policy and an anchor start from a suite of openings, each played twice with
colours swapped, so an unbalanced opening favours neither side of the pair.

`generate_openings` makes a reproducible balanced suite: uniformly random legal plies (between
`min_plies` and `max_plies`) from the standard start; a candidate is kept when the game is not
over, it was not seen before (position, side to move, castling and en passant), and a quick
evaluation says it is balanced (|cp| < `max_cp` for the side to move). This module knows no
engine (`board/` must not): the caller passes `evaluate`, a function from boards to centipawns
(None for a mate score, which is never balanced), e.g. an `EnginePool` at 2000 nodes. The same
seed, limits and evaluator give the same suite.

`read_openings` reads a file the user passes: ``.pgn`` (the final position of each game's main
line, its moves kept) or anything else as one FEN or EPD per line (``#`` comments and blank lines
skipped; EPD operations ignored). Every position is validated; a malformed line or game raises
one `ValueError` naming the file and the line.
"""

from __future__ import annotations

import dataclasses
import io
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import chess
import chess.pgn

from chessgrpo.board.validation import parse_board
from chessgrpo.errors import InputError
from chessgrpo.files import read_text

Evaluator = Callable[[Sequence[chess.Board]], Sequence["int | None"]]
"""Centipawns for the side to move of each board, or None for a mate score."""

DEFAULT_MIN_PLIES = 4
DEFAULT_MAX_PLIES = 8
DEFAULT_MAX_CP = 60


@dataclasses.dataclass(frozen=True)
class Opening:
    """A start position for a game pair."""

    fen: str
    moves: tuple[str, ...] = ()
    """UCI moves from the standard start position that lead to `fen` (empty when unknown)."""
    cp: int | None = None
    """The balance check's evaluation (centipawns, side to move) for generated openings."""
    source: str = ""
    """Where it came from: "generated" or "FILE:LINE"."""

    def board(self) -> chess.Board:
        """A board at this opening; its move stack holds `moves` when they are known."""
        if self.moves:
            board = chess.Board()
            for move in self.moves:
                board.push_uci(move)
            return board
        return chess.Board(self.fen)


def generate_openings(
    count: int,
    evaluate: Evaluator,
    *,
    seed: int = 0,
    min_plies: int = DEFAULT_MIN_PLIES,
    max_plies: int = DEFAULT_MAX_PLIES,
    max_cp: int = DEFAULT_MAX_CP,
    batch_size: int = 64,
    max_candidates: int | None = None,
) -> list[Opening]:
    """`count` distinct balanced openings (see the module docstring); same seed, same list.

    Candidates are drawn and evaluated in batches of `batch_size`; after `max_candidates`
    (default 50 * count + 500) without enough balanced ones, `RuntimeError` says so.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 1 <= min_plies <= max_plies:
        raise ValueError(f"need 1 <= min_plies <= max_plies, got {min_plies}, {max_plies}")
    if max_cp <= 0:
        raise ValueError(f"max_cp must be > 0, got {max_cp}")
    limit = max_candidates if max_candidates is not None else 50 * count + 500
    rng = random.Random(seed)
    seen: set[str] = set()
    openings: list[Opening] = []
    drawn = 0
    while len(openings) < count:
        if drawn >= limit:
            raise RuntimeError(
                f"found only {len(openings)} of {count} balanced openings (|cp| < {max_cp}) in {drawn} random "
                f"candidates of {min_plies}-{max_plies} plies; raise max_cp or the ply range"
            )
        batch: list[tuple[chess.Board, tuple[str, ...]]] = []
        while len(batch) < batch_size and drawn < limit:
            drawn += 1
            board = chess.Board()
            for _ in range(rng.randint(min_plies, max_plies)):
                moves = list(board.legal_moves)  # python-chess's fixed order: reproducible
                if not moves:
                    break
                board.push(rng.choice(moves))
            key = board.epd()
            if key in seen or board.is_game_over(claim_draw=False):
                continue
            seen.add(key)
            batch.append((board, tuple(move.uci() for move in board.move_stack)))
        if not batch:
            continue
        scores = list(evaluate([board for board, _ in batch]))
        if len(scores) != len(batch):
            raise RuntimeError(f"the evaluator returned {len(scores)} scores for {len(batch)} positions")
        for (board, moves), cp in zip(batch, scores):
            if cp is not None and abs(cp) < max_cp and len(openings) < count:
                openings.append(Opening(fen=board.fen(), moves=moves, cp=int(cp), source="generated"))
    return openings


def read_openings(path: str | Path) -> list[Opening]:
    """Openings from a ``.pgn`` file or a FEN/EPD-per-line file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"openings file {str(path)!r} does not exist")
    text = read_text(path)  # a ValueError naming the line and byte that is not UTF-8
    openings = _read_pgn(path, text) if path.suffix.lower() == ".pgn" else _read_fen_lines(path, text)
    if not openings:
        raise InputError(f"{path}: no openings found")
    return openings


def _read_fen_lines(path: Path, text: str) -> list[Opening]:
    openings = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = stripped.split()
        # A full FEN has 6 fields (the last two numbers); an EPD has 4 and then operations.
        fen = (
            " ".join(fields[:6])
            if len(fields) >= 6 and fields[4].isdigit() and fields[5].isdigit()
            else " ".join(fields[:4])
        )
        try:
            board = parse_board(fen)
        except ValueError as error:
            raise InputError(f"{path}:{number}: {error}") from None
        if board.is_game_over(claim_draw=False):
            raise InputError(f"{path}:{number}: the game is already over in {board.fen()!r}")
        openings.append(Opening(fen=board.fen(), source=f"{path}:{number}"))
    return openings


def _read_pgn(path: Path, text: str) -> list[Opening]:
    openings = []
    handle = io.StringIO(text)
    index = 0
    while True:
        offset = handle.tell()
        try:
            game = chess.pgn.read_game(handle)
        except (ValueError, KeyError) as error:  # pragma: no cover - python-chess collects most errors
            raise InputError(f"{path}:{_line_of(text, offset)}: unreadable PGN game: {error}") from None
        if game is None:
            break
        index += 1
        # The line of the game's first non-blank character (tell() is a character offset in StringIO).
        start = offset + len(text[offset:]) - len(text[offset:].lstrip())
        where = f"{path}:{_line_of(text, start)}"
        if game.errors:
            raise InputError(f"{where}: PGN game {index} is malformed: {game.errors[0]}")
        try:
            board = parse_board(game.board())
            moves = []
            for move in game.mainline_moves():
                moves.append(move)
                board.push(move)
        except ValueError as error:
            raise InputError(f"{where}: PGN game {index}: {error}") from None
        if board.is_game_over(claim_draw=False):
            raise InputError(f"{where}: PGN game {index} ends in a finished game ({board.fen()!r})")
        standard_start = game.board().fen() == chess.STARTING_FEN
        openings.append(
            Opening(fen=board.fen(), moves=tuple(m.uci() for m in moves) if standard_start else (), source=where)
        )
    return openings


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1
