"""Position sources: reproducible streams of start positions."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import chess

from chessgrpo.board.validation import parse_board
from chessgrpo.errors import InputError
from chessgrpo.files import text_lines


def random_playout(rng: random.Random, max_plies: int) -> chess.Board:
    """The end of a uniformly random legal game of 1..max_plies plies (may be terminal)."""
    board = chess.Board()
    for _ in range(rng.randint(1, max_plies)):
        moves = list(board.legal_moves)
        if not moves:
            break
        board.push(rng.choice(moves))
    return board


def random_playout_positions(
    count: int, *, seed: int = 0, max_plies: int = 60, keep_history: bool = False
) -> list[chess.Board]:
    """`count` distinct non-terminal positions reached by uniformly random legal play.

    Each position is the end of a random game of 1..max_plies plies from the start position;
    the same seed gives the same list. Random play reaches unbalanced, unusual positions, which
    is what a smoke test or a stress test of the engine wants (not a training distribution).
    `keep_history` keeps each board's move stack (e.g. for tasks that show the last moves).
    """
    if count < 0 or max_plies < 1:
        raise ValueError(f"need count >= 0 and max_plies >= 1, got {count}, {max_plies}")
    rng = random.Random(seed)
    seen: set[str] = set()
    boards: list[chess.Board] = []
    attempts = 0
    while len(boards) < count:
        attempts += 1
        if attempts > 20 * count + 100:
            raise RuntimeError(f"could not find {count} distinct positions in {attempts} playouts")
        board = random_playout(rng, max_plies)
        if board.is_game_over(claim_draw=False):
            continue
        key = board.epd()
        if key in seen:
            continue
        seen.add(key)
        boards.append(board if keep_history else board.copy(stack=False))
    return boards


def read_fen_file(path: str | Path) -> Iterator[chess.Board]:
    """Validated boards from a text file with one FEN (or EPD without operations) per line.

    Blank lines and lines starting with '#' are skipped. A bad line, a byte that is not UTF-8 or
    an unreadable file raises `ValueError` naming the file (and the line number when there is one);
    a missing file raises `FileNotFoundError` naming it.
    """
    path = Path(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"FEN file {str(path)!r} does not exist") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read it: {error.strerror or error}") from None
    with handle:
        for number, line in enumerate(text_lines(handle, path), start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            fields = text.split()
            # EPD lines carry 4 position fields and then operations ("bm Nf3; id ...").
            fen = " ".join(fields[:6]) if len(fields) >= 6 and fields[4].isdigit() else " ".join(fields[:4])
            try:
                yield parse_board(fen)
            except ValueError as error:
                raise InputError(f"{path}:{number}: {error}") from None
