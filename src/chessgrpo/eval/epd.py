"""EPD test suites: the share of positions where a player finds the best move (`bm`) and avoids
the bad ones (`am`), with a Wilson interval.

A suite is a text file with one EPD record a line (the classic test suites: WAC, ECM, STS,
Bratko-Kopec, ...)::

    6k1/5ppp/8/8/8/8/8/R5K1 w - - bm Ra8#; id "backrank.white";
    rnbqkbnr/pppp1ppp/8/4p3/8/5P2/PPPPP1PP/RNBQKBNR w KQkq - am g4; id "fool.blunder";

python-chess parses it (`chess.Board.from_epd`): `bm` and `am` are lists of SAN moves, `id` names
the position. A position is **solved** when the chosen move is one of `bm` (when the record has
one) and none of `am`. Four position fields are standard; a record whose position carries the
halfmove and fullmove counters as well (six fields) is accepted too.

Blank lines and lines starting with ``#`` are ignored. A bad line (a malformed record, an invalid
position or one without legal moves, no `bm` and no `am`, a move that is not legal, every `bm` move
also in `am`) is **skipped with a warning** naming the file and the line, its text cut to a short
echo, and counted (`EpdSuite.skipped`); ``strict=True`` raises on it instead. A file without any
usable record raises. The file may be plain, gzip or zstd (`chessgrpo.files.open_decompressed`).

Players are asked in batches of `batch_size` positions (`Player.choose_moves`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import chess

from chessgrpo.board.validation import parse_board
from chessgrpo.errors import InputError, one_line, quote
from chessgrpo.files import open_decompressed, text_lines
from chessgrpo.play.players import Player
from chessgrpo.stats import Interval, wilson_interval

logger = logging.getLogger(__name__)

WARNED_LINES = 20
"""Bad lines warned about one by one; the rest are counted in the summary warning."""


@dataclasses.dataclass(frozen=True)
class EpdPosition:
    """A validated EPD record."""

    line: int
    """Line number in the file (the first line is 1)."""
    id: str | None
    board: chess.Board
    best: tuple[chess.Move, ...] = ()
    """`bm`: the chosen move must be one of these (no constraint when empty)."""
    avoid: tuple[chess.Move, ...] = ()
    """`am`: the chosen move must be none of these."""

    def solved_by(self, move: chess.Move) -> bool:
        return (not self.best or move in self.best) and move not in self.avoid


@dataclasses.dataclass(frozen=True)
class SkippedLine:
    line: int
    reason: str


@dataclasses.dataclass(frozen=True)
class EpdSuite:
    positions: tuple[EpdPosition, ...]
    skipped: tuple[SkippedLine, ...] = ()


def _moves(board: chess.Board, operations: dict, opcode: str) -> tuple[chess.Move, ...]:
    value = operations.get(opcode)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(move, chess.Move) for move in value):
        raise InputError(f"{opcode} must list moves, got {quote(str(value))}")
    for move in value:
        if not board.is_legal(move):  # python-chess checks SAN; a null move "--" passes it
            raise InputError(f"{opcode} move {move.uci()} is not legal")
    return tuple(dict.fromkeys(value))


def parse_epd(text: str, line: int = 0) -> EpdPosition:
    """An `EpdPosition` from one EPD record; `ValueError` says what is wrong (the text cut short)."""
    fields = text.split()
    if len(fields) < 5:
        raise InputError(f"not an EPD record with operations: {quote(text)}")
    counters = None
    if len(fields) >= 6 and fields[4].isdigit() and fields[5].isdigit():  # a full FEN, then operations
        counters = (int(fields[4]), int(fields[5]))
        fields = fields[:4] + fields[6:]
    board = chess.Board()
    try:
        operations = board.set_epd(" ".join(fields))
    except ValueError as error:
        raise InputError(f"malformed EPD record {quote(text)}: {one_line(error, 150)}") from None
    try:
        board = parse_board(board)
    except ValueError as error:
        raise InputError(one_line(error, 200)) from None
    if counters is not None:
        board.halfmove_clock, board.fullmove_number = counters[0], max(1, counters[1])
    if not any(board.generate_legal_moves()):
        raise InputError(f"position {board.fen()!r} has no legal moves")
    best, avoid = _moves(board, operations, "bm"), _moves(board, operations, "am")
    if not best and not avoid:
        raise InputError(f"no bm or am operation in {quote(text)}")
    if best and all(move in avoid for move in best):
        raise InputError("every bm move is also an am move")
    identifier = operations.get("id")
    return EpdPosition(
        line=line, id=None if identifier is None else str(identifier), board=board, best=best, avoid=avoid
    )


def read_epd(path: str | Path, *, strict: bool = False) -> EpdSuite:
    """The usable records of an EPD suite (plain, .gz or .zst), bad lines skipped with a warning."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"EPD file {str(path)!r} does not exist")
    positions: list[EpdPosition] = []
    skipped: list[SkippedLine] = []
    try:
        with open_decompressed(path) as handle:
            for number, raw in enumerate(text_lines(handle, path), start=1):
                text = raw.strip()
                if not text or text.startswith("#"):
                    continue
                try:
                    positions.append(parse_epd(text, number))
                except ValueError as error:
                    if strict:
                        raise InputError(f"{path}:{number}: {error}") from None
                    skipped.append(SkippedLine(number, str(error)))
                    if len(skipped) <= WARNED_LINES:
                        logger.warning("%s:%d: skipped: %s", path, number, error)
    except OSError as error:
        raise InputError(f"EPD file {str(path)!r}: cannot read it: {one_line(error.strerror or error)}") from None
    if skipped:
        logger.warning("skipped %d bad EPD lines of %s (first: line %d)", len(skipped), path, skipped[0].line)
    if not positions:
        raise InputError(f"EPD file {str(path)!r} holds no usable record with bm or am ({len(skipped)} lines skipped)")
    return EpdSuite(positions=tuple(positions), skipped=tuple(skipped))


# --------------------------------------------------------------------------------------------
# Solving


@dataclasses.dataclass(frozen=True)
class EpdRecord:
    id: str | None
    line: int
    fen: str
    move: str
    """The player's move (UCI)."""
    san: str
    solved: bool
    bm: tuple[str, ...]
    """The best moves (SAN)."""
    am: tuple[str, ...]
    """The moves to avoid (SAN)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EpdResult:
    player: str
    solved: Interval
    """The solved share with its Wilson interval (`solved.n` positions)."""
    records: tuple[EpdRecord, ...]

    @property
    def solved_count(self) -> int:
        return sum(record.solved for record in self.records)

    def to_json(self) -> dict:
        return {"player": self.player, "solved": self.solved.to_json(), "solved_count": self.solved_count}


def solve_epd(
    player: Player,
    positions: Sequence[EpdPosition],
    *,
    confidence: float = 0.95,
    batch_size: int = 256,
    progress: Callable[[int], None] | None = None,
) -> EpdResult:
    """One move of `player` per position (in batches of `batch_size`), scored by bm/am."""
    records = []
    for start in range(0, len(positions), batch_size):
        chunk = positions[start : start + batch_size]
        moves = player.choose_moves([position.board.copy(stack=False) for position in chunk])
        if len(moves) != len(chunk):
            raise RuntimeError(f"player {player.name!r} returned {len(moves)} moves for {len(chunk)} positions")
        for position, move in zip(chunk, moves):
            board = position.board
            if not board.is_legal(move):
                raise RuntimeError(f"player {player.name!r} chose illegal move {move.uci()} in {board.fen()!r}")
            records.append(
                EpdRecord(
                    id=position.id,
                    line=position.line,
                    fen=board.fen(),
                    move=move.uci(),
                    san=board.san(move),
                    solved=position.solved_by(move),
                    bm=tuple(board.san(m) for m in position.best),
                    am=tuple(board.san(m) for m in position.avoid),
                )
            )
        if progress:
            progress(len(chunk))
    solved = wilson_interval(sum(record.solved for record in records), len(records), confidence)
    return EpdResult(player=player.name, solved=solved, records=tuple(records))
