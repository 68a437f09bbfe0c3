"""Lichess puzzles: first-move accuracy and full-line solve rate, overall, by rating band and by theme.

The Lichess puzzle CSV (columns PuzzleId, FEN, Moves, Rating, ..., Themes, ...) gives the
position *before* the opponent's setup move: ``Moves[0]`` is played first, then the solver is to
move. Solver moves are ``Moves[1], Moves[3], ...``; the opponent's replies ``Moves[2], ...`` are
played automatically.

Scoring, as on Lichess:

- a solver move is **correct** when it equals the solution move or delivers checkmate (any
  mate is accepted, and a mate ends the puzzle as solved even if the line had more moves);
- **first-move accuracy**: the first solver move is correct;
- **solved**: every solver move is correct until the line ends or a mate is delivered.

Rows are validated (FEN parses into a valid position, every move of `Moves` is legal in
sequence, an even number of moves so the line ends with a solver move, an integer rating).
A bad row is **skipped with a warning and counted** (`PuzzleSet.skipped`), so one corrupt row in
a multi-million-row dump does not stop an evaluation; ``strict=True`` raises on it instead,
naming the row. A file without the needed columns, or with no valid row, always raises.

The file may be plain, gzip or zstd (detected by its magic bytes, `chessgrpo.files.open_decompressed`),
so the Lichess database is read as it is published (``lichess_db_puzzle.csv.zst``, millions of
rows). Every row is validated; when a sample is drawn from more than `KEEP_PARSED` valid rows only
their row numbers are kept and the sampled rows are parsed again in a second pass, so memory stays
bounded (the sample is the same either way).

Rating bands (`RATING_BUCKETS`, the default): <1000, 1000-1399, 1400-1799, 1800-2199, >=2200; 400
points wide, roughly beginner / club / strong club / expert / master puzzles. Other edges:
`rating_bands`. Themes are the row's space-separated Lichess `Themes` (``mateIn2 fork short``; a
puzzle counts in each of its themes); `summarize_puzzles` reports the themes with at least
`min_theme_puzzles` puzzles (default `MIN_THEME_PUZZLES`), since a rate over a handful of puzzles
says little even with its interval.

Players are asked in batches: at each solver turn, every still-running puzzle is one position
of a single `choose_moves` call.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import random
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import chess

from chessgrpo.board.validation import parse_board, parse_move
from chessgrpo.errors import InputError, one_line
from chessgrpo.files import open_decompressed, text_lines
from chessgrpo.paths import find_data_path
from chessgrpo.play.players import Player
from chessgrpo.stats import Interval, wilson_interval

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("PuzzleId", "FEN", "Moves", "Rating")

RATING_BUCKETS: tuple[tuple[str, int | None, int | None], ...] = (
    ("<1000", None, 1000),
    ("1000-1399", 1000, 1400),
    ("1400-1799", 1400, 1800),
    ("1800-2199", 1800, 2200),
    (">=2200", 2200, None),
)
"""(name, lowest rating included, highest rating excluded); None = unbounded."""

RatingBands = Sequence[tuple[str, int | None, int | None]]

DEFAULT_RATING_EDGES: tuple[int, ...] = (1000, 1400, 1800, 2200)
"""The edges of `RATING_BUCKETS`."""

MIN_THEME_PUZZLES = 20
"""Default: a theme is reported when at least this many puzzles carry it."""

KEEP_PARSED = 100_000
"""Valid puzzles held parsed while reading; a larger file that is sampled keeps row numbers only."""


def rating_bands(edges: Sequence[int]) -> tuple[tuple[str, int | None, int | None], ...]:
    """Bands from increasing integer edges: (1000, 1400) gives <1000, 1000-1399, >=1400.

    `rating_bands(DEFAULT_RATING_EDGES) == RATING_BUCKETS`.
    """
    edges = [int(edge) for edge in edges]
    if not edges:
        raise ValueError("rating_bands needs at least one edge, e.g. [1000, 1400, 1800, 2200]")
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"rating_bands must be strictly increasing integers, got {edges}")
    bands: list[tuple[str, int | None, int | None]] = [(f"<{edges[0]}", None, edges[0])]
    bands += [(f"{low}-{high - 1}", low, high) for low, high in zip(edges, edges[1:])]
    bands.append((f">={edges[-1]}", edges[-1], None))
    return tuple(bands)


def rating_bucket(rating: int, bands: RatingBands = RATING_BUCKETS) -> str:
    for name, low, high in bands:
        if (low is None or rating >= low) and (high is None or rating < high):
            return name
    raise ValueError(f"rating {rating} is in none of the rating bands {[name for name, _, _ in bands]}")


@dataclasses.dataclass(frozen=True)
class Puzzle:
    """A validated puzzle: `board` is the solver's position (after the setup move)."""

    id: str
    rating: int
    board: chess.Board
    solution: tuple[chess.Move, ...]
    """Moves[1:]: solver, opponent, solver, ... ending with a solver move."""
    themes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class SkippedRow:
    line: int
    """Line number in the CSV file (the header is line 1)."""
    puzzle_id: str
    reason: str


@dataclasses.dataclass(frozen=True)
class PuzzleSet:
    puzzles: tuple[Puzzle, ...]
    skipped: tuple[SkippedRow, ...] = ()


def parse_puzzle(row: dict[str, str]) -> Puzzle:
    """A `Puzzle` from one CSV row (a dict of the Lichess columns); `ValueError` says what is wrong."""
    puzzle_id = (row.get("PuzzleId") or "").strip()
    if not puzzle_id:
        raise InputError("empty PuzzleId")
    try:
        rating = int((row.get("Rating") or "").strip())
    except ValueError:
        raise InputError(f"puzzle {puzzle_id}: rating {row.get('Rating')!r} is not an integer") from None
    try:
        board = parse_board((row.get("FEN") or "").strip())
    except ValueError as error:
        raise InputError(f"puzzle {puzzle_id}: {error}") from None
    texts = (row.get("Moves") or "").split()
    if len(texts) < 2 or len(texts) % 2:
        raise InputError(
            f"puzzle {puzzle_id}: Moves must be the setup move then solver/opponent pairs ending with a solver move, "
            f"got {len(texts)} moves"
        )
    moves = []
    line = board.copy(stack=False)
    for ply, text in enumerate(texts):
        try:
            move = parse_move(line, text)
        except ValueError as error:
            raise InputError(f"puzzle {puzzle_id}: Moves[{ply}]: {error}") from None
        moves.append(move)
        line.push(move)
        if line.is_game_over() and ply < len(texts) - 1:
            raise InputError(f"puzzle {puzzle_id}: the game is over after Moves[{ply}] but the line goes on")
    board.push(moves[0])
    themes = tuple((row.get("Themes") or "").split())
    return Puzzle(id=puzzle_id, rating=rating, board=board.copy(stack=False), solution=tuple(moves[1:]), themes=themes)


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a Lichess puzzle CSV (plain, gzip or zstd); reading errors name the file."""
    reader = None
    try:
        with open_decompressed(path) as handle:
            # Decoded line by line: a byte that is not UTF-8 raises a ValueError naming its line.
            reader = csv.DictReader(text_lines(handle, path))
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(f"puzzle file {str(path)!r} lacks columns {missing} (expected the Lichess puzzle CSV)")
            for row in reader:
                yield reader.line_num, row
    except csv.Error as error:
        line = reader.line_num if reader is not None else 1
        raise InputError(f"puzzle file {str(path)!r} line {line} is not readable CSV: {one_line(error)}") from None
    except OSError as error:
        raise InputError(f"puzzle file {str(path)!r}: cannot read it: {one_line(error.strerror or error)}") from None


def _parse_row(row: dict[str, str]) -> Puzzle:
    if None in row:  # more fields than the header
        raise InputError(f"puzzle {row.get('PuzzleId')}: more fields than the header")
    return parse_puzzle(row)


def read_puzzles(path: str | Path, max_puzzles: int | None = None, seed: int = 0, *, strict: bool = False) -> PuzzleSet:
    """Validated puzzles from a Lichess puzzle CSV (plain, .gz or .zst); `max_puzzles` sampled
    with `seed` (file order kept). A relative path is found from any directory (`chessgrpo.paths`)."""
    path = find_data_path(path) or Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"puzzle file {str(path)!r} does not exist")
    if max_puzzles is not None and max_puzzles < 1:
        raise ValueError(f"max_puzzles must be >= 1 or None, got {max_puzzles!r}")
    puzzles: list[Puzzle] | None = []
    valid_rows = array("q")  # data-row ordinals of the valid rows
    skipped: list[SkippedRow] = []
    for ordinal, (line, row) in enumerate(_csv_rows(path)):
        try:
            puzzle = _parse_row(row)
        except ValueError as error:
            if strict:
                raise InputError(f"{path}:{line}: {error}") from None
            skipped.append(SkippedRow(line=line, puzzle_id=str(row.get("PuzzleId") or ""), reason=str(error)))
            continue
        valid_rows.append(ordinal)
        if puzzles is not None:
            puzzles.append(puzzle)
            if max_puzzles is not None and len(puzzles) > max(max_puzzles, KEEP_PARSED):
                puzzles = None  # a large file to sample from: keep row numbers, parse the sample again
    if skipped:
        logger.warning(
            "skipped %d malformed puzzle rows of %s (first: line %d: %s)",
            len(skipped),
            path,
            skipped[0].line,
            skipped[0].reason,
        )
    if not valid_rows:
        raise InputError(f"puzzle file {str(path)!r} holds no valid puzzle ({len(skipped)} rows skipped)")
    chosen = range(len(valid_rows))
    if max_puzzles is not None and len(valid_rows) > max_puzzles:
        chosen = sorted(random.Random(seed).sample(range(len(valid_rows)), max_puzzles))
    if puzzles is not None:
        puzzles = [puzzles[index] for index in chosen]
    else:
        wanted = {valid_rows[index] for index in chosen}
        puzzles = []
        try:
            for ordinal, (_, row) in enumerate(_csv_rows(path)):
                if ordinal in wanted:
                    puzzles.append(_parse_row(row))
                    if len(puzzles) == len(wanted):
                        break
        except ValueError as error:
            raise InputError(f"puzzle file {str(path)!r} changed while it was read: {one_line(error)}") from None
        if len(puzzles) != len(wanted):
            raise InputError(f"puzzle file {str(path)!r} changed while it was read")
    return PuzzleSet(puzzles=tuple(puzzles), skipped=tuple(skipped))


# --------------------------------------------------------------------------------------------
# Solving


@dataclasses.dataclass(frozen=True)
class PuzzleRecord:
    id: str
    rating: int
    first_move_correct: bool
    solved: bool
    played: tuple[str, ...]
    """The player's moves (UCI), up to and including the first wrong one."""
    themes: tuple[str, ...] = ()
    """The puzzle's Lichess themes."""
    solution_check: bool = False
    """The solution's first move gives check (70% of the shipped puzzles, data/lichess_puzzles_dev.csv: "check-first" puzzles)."""
    played_check: bool = False
    """The player's first move gives check."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PuzzleResult:
    player: str
    first_move_accuracy: Interval
    solve_rate: Interval
    by_rating: dict[str, dict[str, Interval]]
    """band -> {"first_move_accuracy": Interval, "solve_rate": Interval}; empty bands omitted, bands in rating order."""
    records: tuple[PuzzleRecord, ...]
    by_theme: dict[str, dict[str, Interval]] = dataclasses.field(default_factory=dict)
    """theme -> the same metrics, for themes with at least `min_theme_puzzles` puzzles (most puzzles first)."""
    min_theme_puzzles: int = MIN_THEME_PUZZLES
    by_solution: dict[str, dict[str, Interval]] = dataclasses.field(default_factory=dict)
    """"check first" / "quiet first" (the solution's first move gives check or not) -> the same metrics.
    A policy that checks more or less often moves the two apart: most puzzles start with a check."""
    played_check_rate: Interval | None = None
    """Share of puzzles whose first move the player chose gives check (the solutions': `by_solution`'s counts)."""

    def to_json(self, records: bool = False) -> dict:
        def table(groups: dict[str, dict[str, Interval]]) -> dict:
            return {
                group: {metric: interval.to_json() for metric, interval in metrics.items()}
                for group, metrics in groups.items()
            }

        out = {
            "player": self.player,
            "first_move_accuracy": self.first_move_accuracy.to_json(),
            "solve_rate": self.solve_rate.to_json(),
            "by_rating": table(self.by_rating),
            "by_theme": table(self.by_theme),
            "min_theme_puzzles": self.min_theme_puzzles,
            "by_solution": table(self.by_solution),
        }
        if self.played_check_rate is not None:
            out["played_check_rate"] = self.played_check_rate.to_json()
        if records:
            out["records"] = [record.to_json() for record in self.records]
        return out


def _gives_mate(board: chess.Board, move: chess.Move) -> bool:
    board.push(move)
    try:
        return board.is_checkmate()
    finally:
        board.pop()


@dataclasses.dataclass
class _State:
    puzzle: Puzzle
    board: chess.Board
    step: int = 0
    played: list[str] = dataclasses.field(default_factory=list)
    first_correct: bool | None = None
    solved: bool | None = None
    solution_check: bool = False
    played_check: bool = False


def solve_puzzles(
    player: Player,
    puzzles: Sequence[Puzzle],
    *,
    confidence: float = 0.95,
    progress: Callable[[int], None] | None = None,
    rating_bands: RatingBands = RATING_BUCKETS,
    min_theme_puzzles: int = MIN_THEME_PUZZLES,
) -> PuzzleResult:
    """Play every puzzle with `player` (batched by solver turn) and score it like Lichess.

    `rating_bands` and `min_theme_puzzles` shape the breakdowns (see `summarize_puzzles`)."""
    states = [_State(puzzle, puzzle.board.copy()) for puzzle in puzzles]
    running = list(states)
    while running:
        moves = player.choose_moves([state.board.copy(stack=False) for state in running])
        if len(moves) != len(running):
            raise RuntimeError(f"player {player.name!r} returned {len(moves)} moves for {len(running)} positions")
        still_running = []
        for state, move in zip(running, moves):
            if not state.board.is_legal(move):
                raise RuntimeError(f"player {player.name!r} chose illegal move {move.uci()} in {state.board.fen()!r}")
            expected = state.puzzle.solution[state.step]
            mates = _gives_mate(state.board, move)
            correct = move == expected or mates
            state.played.append(move.uci())
            if state.first_correct is None:
                state.first_correct = correct
                state.solution_check = state.board.gives_check(expected)
                state.played_check = state.board.gives_check(move)
            if not correct:
                state.solved = False
            elif mates or state.step + 1 == len(state.puzzle.solution):
                state.solved = True
            else:
                state.board.push(move)
                state.board.push(state.puzzle.solution[state.step + 1])
                state.step += 2
                still_running.append(state)
                continue
            if progress:
                progress(1)
        running = still_running
    records = [
        PuzzleRecord(
            id=s.puzzle.id,
            rating=s.puzzle.rating,
            first_move_correct=bool(s.first_correct),
            solved=bool(s.solved),
            played=tuple(s.played),
            themes=s.puzzle.themes,
            solution_check=s.solution_check,
            played_check=s.played_check,
        )
        for s in states
    ]
    return summarize_puzzles(
        player.name, records, confidence=confidence, rating_bands=rating_bands, min_theme_puzzles=min_theme_puzzles
    )


def summarize_puzzles(
    player: str,
    records: Sequence[PuzzleRecord],
    *,
    confidence: float = 0.95,
    rating_bands: RatingBands = RATING_BUCKETS,
    min_theme_puzzles: int = MIN_THEME_PUZZLES,
) -> PuzzleResult:
    """Wilson intervals of first-move accuracy and solve rate, overall, per rating band and per
    theme (the themes of at least `min_theme_puzzles` puzzles, most puzzles first, then by name).

    A puzzle is in exactly one band, so band counts sum to the total; it is in every one of its
    themes, so theme counts do not."""
    if min_theme_puzzles < 1:
        raise ValueError(f"min_theme_puzzles must be >= 1, got {min_theme_puzzles!r}")

    def metrics(group: Sequence[PuzzleRecord]) -> dict[str, Interval]:
        return {
            "first_move_accuracy": wilson_interval(sum(r.first_move_correct for r in group), len(group), confidence),
            "solve_rate": wilson_interval(sum(r.solved for r in group), len(group), confidence),
        }

    overall = metrics(records)
    bands: dict[str, list[PuzzleRecord]] = {name: [] for name, _, _ in rating_bands}
    themes: dict[str, list[PuzzleRecord]] = {}
    for record in records:
        bands[rating_bucket(record.rating, rating_bands)].append(record)
        for theme in dict.fromkeys(record.themes):  # a theme listed twice counts once
            themes.setdefault(theme, []).append(record)
    solution_kinds = {
        "check first": [r for r in records if r.solution_check],
        "quiet first": [r for r in records if not r.solution_check],
    }
    frequent = sorted(
        (theme for theme, group in themes.items() if len(group) >= min_theme_puzzles),
        key=lambda t: (-len(themes[t]), t),
    )
    return PuzzleResult(
        player=player,
        first_move_accuracy=overall["first_move_accuracy"],
        solve_rate=overall["solve_rate"],
        by_rating={name: metrics(group) for name, group in bands.items() if group},
        records=tuple(records),
        by_theme={theme: metrics(themes[theme]) for theme in frequent},
        min_theme_puzzles=min_theme_puzzles,
        by_solution={name: metrics(group) for name, group in solution_kinds.items() if group},
        played_check_rate=wilson_interval(sum(r.played_check for r in records), len(records), confidence),
    )
