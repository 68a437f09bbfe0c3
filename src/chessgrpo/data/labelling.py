"""Labelling boards with Stockfish and writing the rows as dataset shards.

Shared by `data generate` and `data import-pgn`, so every dataset is labelled the same way:

- `analyse_boards` runs one multipv search per board (`EnginePool.analyse_many`); the analysis
  is from the side to move's point of view, for White and for Black alike.
- `make_row` turns a board and its analysis into a row of `schema.POSITION_SCHEMA`:
  ``best_move = moves[0]``, ``value = win_probs[0]``, ``best_action = move_to_action(best_move)``.
- `DatasetWriter` owns an output directory: it rebuilds what earlier (possibly killed) runs
  wrote, deduplicates by `schema.position_key`, splits by `schema.split_of` and writes one
  atomic shard per split per shard index.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import chess

from chessgrpo.board.actions import move_to_action
from chessgrpo.board.validation import parse_move
from chessgrpo.config import ConfigError, EngineConfig
from chessgrpo.data import schema
from chessgrpo.engine.evaluation import Analysis, MoveEvaluation, terminal_result
from chessgrpo.engine.pool import EnginePool
from chessgrpo.errors import InputError

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]
Row = dict[str, Any]

_SHARD_NAME = re.compile(r"^shard-(\d{5,})\.parquet$")
MAX_MULTIPV = 500  # Stockfish's limit


@dataclasses.dataclass
class DataEngineConfig(EngineConfig):
    """`EngineConfig` with labelling defaults (a subclass, so ``engine.x=...`` overrides keep them)."""

    nodes: int | None = None
    """Leave null: the data commands' top-level `nodes` is the labelling limit."""
    cache: bool = False
    """Off: a dataset searches each position once, so a persistent cache would only grow."""


@dataclasses.dataclass(frozen=True)
class LabelSettings:
    """How positions are labelled (the settings a dataset's rows must share)."""

    nodes: int
    """Node limit of every labelling search."""
    multipv: int
    """Number of top moves stored per position."""
    all_legal_values: bool = False
    """Also value every legal move (one extra search per legal move)."""


def is_labelable(board: chess.Board) -> bool:
    """True when a position has moves to label: the game is not over by rule.

    Checkmate, stalemate, insufficient material and a claimable 50-move draw are what the pool
    itself treats as terminal; fivefold repetition needs the move stack (engine games have it).
    """
    return terminal_result(board) is None and not board.is_fivefold_repetition()


def analyse_boards(
    pool: EnginePool, boards: Sequence[chess.Board], settings: LabelSettings, progress: Progress | None = None
) -> list[Analysis]:
    """One multipv analysis per board, in order (the pool validates every board first)."""
    return pool.analyse_many(boards, multipv=settings.multipv, nodes=settings.nodes, progress=progress)


def ranked_lines(analysis: Analysis) -> list[MoveEvaluation]:
    """The analysis lines, best first by win probability, each move once.

    A node-limited multipv search is usually stopped mid-iteration, so the reported lines can
    mix depths: a move not yet re-searched keeps its previous-iteration score and may outrank
    the new rank 1, and the pool (which keeps the last exact line of each rank) can report one
    move under two ranks. We keep each move's first (highest-ranked) line and sort stably by
    value, so ``win_probs`` is non-increasing and ``best_move`` is the move the label values
    highest; ties keep Stockfish's order.
    """
    unique: dict[str, MoveEvaluation] = {}
    for line in analysis.lines:
        unique.setdefault(line.move, line)
    return sorted(unique.values(), key=lambda line: -line.win_probability)


def make_row(
    board: chess.Board,
    analysis: Analysis,
    source: str,
    nodes: int,
    legal_values: tuple[list[str], list[float]] | None = None,
) -> Row | None:
    """The dataset row of one position, or None when it has no legal moves.

    Every move is checked to be legal in `board` before it is stored (an engine answer is
    untrusted input too); a bad one raises `ValueError` naming the position.
    """
    lines = ranked_lines(analysis)
    if not lines:
        return None
    moves = [parse_move(board, line.move).uci() for line in lines]
    win_probs = [float(line.win_probability) for line in lines]
    legal_moves, legal_win_probs = legal_values if legal_values is not None else (None, None)
    return {
        "fen": board.fen(),
        "source": source,
        "best_move": moves[0],
        "best_action": move_to_action(moves[0]),
        "moves": moves,
        "win_probs": win_probs,
        "value": win_probs[0],
        "legal_moves": legal_moves,
        "legal_win_probs": legal_win_probs,
        "nodes": nodes,
    }


def legal_move_values(
    pool: EnginePool, boards: Sequence[chess.Board], nodes: int
) -> list[tuple[list[str], list[float]]]:
    """For each board, every legal move (UCI, python-chess order) and its value for the mover.

    The value of a move is 1 - the win probability of the child position for its side to move;
    children that end the game (mate, stalemate, ...) are scored exactly by the pool.
    """
    moves_per_board = [list(board.legal_moves) for board in boards]
    children = []
    for board, moves in zip(boards, moves_per_board):
        for move in moves:
            child = board.copy(stack=False)
            child.push(move)
            children.append(child)
    evaluations = pool.evaluate(children, nodes=nodes)
    out, start = [], 0
    for moves in moves_per_board:
        values = [1.0 - evaluation.win_probability for evaluation in evaluations[start : start + len(moves)]]
        out.append(([move.uci() for move in moves], values))
        start += len(moves)
    return out


def make_rows(
    pool: EnginePool,
    boards: Sequence[chess.Board],
    analyses: Sequence[Analysis],
    sources: Sequence[str],
    settings: LabelSettings,
) -> list[Row]:
    """Rows for boards already analysed (positions without legal moves are dropped)."""
    legal = legal_move_values(pool, boards, settings.nodes) if settings.all_legal_values else [None] * len(boards)
    rows = []
    for board, analysis, source, values in zip(boards, analyses, sources, legal):
        row = make_row(board, analysis, source, settings.nodes, values)
        if row is not None:
            rows.append(row)
    return rows


def label_boards(
    pool: EnginePool,
    boards: Sequence[chess.Board],
    sources: Sequence[str] | str,
    settings: LabelSettings,
    progress: Progress | None = None,
) -> list[Row]:
    """Analyse and label boards; positions without legal moves are dropped."""
    if isinstance(sources, str):
        sources = [sources] * len(boards)
    analyses = analyse_boards(pool, boards, settings, progress)
    return make_rows(pool, boards, analyses, sources, settings)


# --------------------------------------------------------------------------------------------
# Config and output-directory checks shared by the data commands


def require(ok: bool, key: str, value: Any, problem: str) -> None:
    """Raise `ConfigError` ("key=value: problem") unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {problem}")


def validate_labelling(nodes: int, multipv: int, test_fraction: float, engine: EngineConfig) -> None:
    """Check the settings both data commands share."""
    require(nodes >= 1, "nodes", nodes, "must be >= 1")
    require(1 <= multipv <= MAX_MULTIPV, "multipv", multipv, f"must be in 1..{MAX_MULTIPV}")
    require(0.0 <= test_fraction < 1.0, "test_fraction", test_fraction, "must be in [0, 1)")
    # One labelling limit, one place to set it: a differing engine.nodes would be silently unused.
    require(
        engine.depth is None,
        "engine.depth",
        engine.depth,
        "labels use node limits: set `nodes`, leave engine.depth null",
    )
    require(
        engine.nodes in (None, nodes),
        "engine.nodes",
        engine.nodes,
        f"conflicts with nodes={nodes}: set `nodes` (--nodes) only",
    )


@dataclasses.dataclass
class LabellingConfig:
    """The labelling knobs every dataset command shares (`data generate`, `data import-pgn`); a command's
    config subclasses it and adds its own."""

    nodes: int = 2000
    """Node limit of each labelling search (`data generate`: also the search that picks engine-game moves)."""
    multipv: int = 5
    """Top moves stored per position (`data generate`: also sampled from in engine games)."""
    seed: int = 0
    """Seed of every random stream of the command (openings, move sampling, playouts, per-game position sampling)."""
    test_fraction: float = 0.05
    """Share of positions in the test split (by position hash, see `schema.split_of`)."""
    shard_size: int = 5000
    """About this many positions per shard index (`data import-pgn`: shards end at game boundaries); a killed run
    loses at most one shard's work."""
    all_legal_values: bool = False
    """Also store the value of every legal move (one extra search per legal move: slow)."""
    engine: DataEngineConfig = dataclasses.field(default_factory=DataEngineConfig)
    """Stockfish pool; leave engine.nodes and engine.depth null: `nodes` is the labelling limit."""

    def validate_labelling(self) -> None:
        """Check the shared knobs (`ConfigError` naming the first bad one)."""
        require(self.shard_size >= 1, "shard_size", self.shard_size, "must be >= 1")
        validate_labelling(self.nodes, self.multipv, self.test_fraction, self.engine)

    @property
    def label_settings(self) -> LabelSettings:
        """How every position of this dataset is labelled."""
        return LabelSettings(nodes=self.nodes, multipv=self.multipv, all_legal_values=self.all_legal_values)


def labelling_engine(engine: EngineConfig, nodes: int) -> EngineConfig:
    """The pool config for labelling at `nodes`."""
    return dataclasses.replace(engine, nodes=nodes, depth=None)


def prepare_output(out: str, identity: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Check the output directory and return it with the manifest of an earlier run (or {}).

    Raises `ValueError` naming the directory when it is a file, when it is a non-empty directory
    that holds no dataset, or when it holds a dataset made with different settings.
    """
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"output directory {str(directory)!r} is a file")
    manifest: dict[str, Any] = {}
    if directory.is_dir():
        try:
            manifest = schema.read_manifest(directory)
        except ValueError as error:
            raise InputError(f"{str(directory / 'manifest.json')!r} is not valid JSON: {error}") from None
        if not manifest and any(directory.iterdir()):
            raise InputError(
                f"output directory {str(directory)!r} is not empty and holds no dataset (no manifest.json); "
                "choose a new or empty directory"
            )
    previous = manifest.get("identity")
    if manifest and manifest.get("command") != identity["command"]:
        raise InputError(
            f"output directory {str(directory)!r} holds a dataset made by `data {manifest.get('command')}`, "
            f"not `data {identity['command']}`; use another --out"
        )
    if manifest and previous != identity:
        differing = sorted(
            key for key in set(identity) | set(previous or {}) if (previous or {}).get(key) != identity.get(key)
        )
        details = ", ".join(
            f"{key}: {(previous or {}).get(key)!r} there, {identity.get(key)!r} now" for key in differing
        )
        raise InputError(
            f"output directory {str(directory)!r} holds a dataset made with other settings ({details}); "
            "use another --out or the same settings"
        )
    directory.mkdir(parents=True, exist_ok=True)
    return directory, manifest


def check_engine(manifest: dict[str, Any], directory: Path, engine_name: str) -> None:
    """Refuse to extend a dataset labelled by another engine version."""
    previous = manifest.get("engine")
    if previous and previous != engine_name:
        raise InputError(
            f"dataset {str(directory)!r} was labelled by {previous}, this engine is {engine_name}; use another --out"
        )


def now_iso() -> str:
    """The current UTC time for manifests."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------
# The output directory


class DatasetWriter:
    """Appends labelled rows to a dataset directory as shards, resuming what is already there.

    On construction it deletes stale ``*.tmp`` files (a killed writer's leftovers) and any shard
    index that has only one of its two split files (a writer killed between them), then reads
    the ``fen`` and ``source`` columns of every complete shard to rebuild the set of positions
    already stored. `checksums` (the manifest's ``shard_sha256``: relative path -> SHA-256 recorded
    when each shard was written) are verified first, so a shard changed on disk since is one error
    naming it instead of a dataset silently extended around damaged rows. `write_shard` writes the next index: ``test/`` first, then ``train/``, each
    atomically, so a complete index always has both files.
    """

    def __init__(self, directory: str | Path, test_fraction: float, checksums: dict[str, str] | None = None):
        self.directory = Path(directory)
        self.test_fraction = test_fraction
        self.checksums: dict[str, str] = dict(checksums or {})
        self.seen: set[str] = set()
        self.counts: dict[str, collections.Counter[str]] = {split: collections.Counter() for split in schema.SPLITS}
        self.next_shard = 0
        self._recover()

    @property
    def rows(self) -> int:
        """Rows stored in complete shards."""
        return sum(sum(counter.values()) for counter in self.counts.values())

    def is_new(self, fen: str) -> bool:
        """True when the position (without move counters) is not stored or reserved yet."""
        return schema.position_key(fen) not in self.seen

    def reserve(self, fen: str) -> None:
        """Mark a position as taken (before its row is written) so it is not collected twice."""
        self.seen.add(schema.position_key(fen))

    def write_shard(self, rows: Sequence[Row]) -> int:
        """Write rows as shard `next_shard` of both splits; returns the index written."""
        index = self.next_shard
        by_split: dict[str, list[Row]] = {split: [] for split in schema.SPLITS}
        for row in rows:
            by_split[schema.split_of(row["fen"], self.test_fraction)].append(row)
        for split in ("test", "train"):  # an index counts as complete only once both files exist
            path = schema.write_shard(by_split[split], self._shard_path(split, index))
            self.checksums[self._relative(path)] = schema.file_sha256(path)
        for split, split_rows in by_split.items():
            self.counts[split].update(row["source"] for row in split_rows)
        self.seen.update(schema.position_key(row["fen"]) for row in rows)
        self.next_shard = index + 1
        return index

    def count_summary(self) -> dict[str, Any]:
        """Counts for the manifest: total, per split, per source, per split and source."""
        sources: collections.Counter[str] = collections.Counter()
        for counter in self.counts.values():
            sources.update(counter)
        return {
            "positions": self.rows,
            "splits": {split: sum(counter.values()) for split, counter in self.counts.items()},
            "sources": dict(sorted(sources.items())),
            "counts": {split: dict(sorted(counter.items())) for split, counter in self.counts.items()},
            "shards": self.next_shard,
            "shard_sha256": dict(sorted(self.checksums.items())),
        }

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.directory).as_posix()

    def _shard_path(self, split: str, index: int) -> Path:
        return self.directory / split / f"shard-{index:05d}.parquet"

    def _recover(self) -> None:
        for stale in [*self.directory.glob("*/*.tmp"), *self.directory.glob("*.tmp")]:
            logger.info("removing %s left by an interrupted run", stale)
            stale.unlink()
        indices: dict[str, set[int]] = {split: set() for split in schema.SPLITS}
        for split in schema.SPLITS:
            for path in schema.shard_paths(self.directory, split):
                match = _SHARD_NAME.match(path.name)
                if match:
                    indices[split].add(int(match.group(1)))
        complete = indices["train"] & indices["test"]
        for split in schema.SPLITS:
            for index in sorted(indices[split] - complete):
                logger.warning(
                    "removing incomplete shard %s (its other split was never written)", self._shard_path(split, index)
                )
                self._shard_path(split, index).unlink()
                self.checksums.pop(self._relative(self._shard_path(split, index)), None)
        if not complete:
            return
        for split in schema.SPLITS:
            for index in sorted(complete):
                path = self._shard_path(split, index)
                schema.verify_shard(self.directory, path, self.checksums)
                # A shard written after the manifest's last update (killed in between) has no checksum
                # yet: its write was atomic, so it is adopted as it is.
                self.checksums.setdefault(self._relative(path), schema.file_sha256(path))
                table = schema.read_positions(self._shard_path(split, index), columns=["fen", "source"])
                self.seen.update(schema.position_key(fen) for fen in table.column("fen").to_pylist())
                self.counts[split].update(table.column("source").to_pylist())
        self.next_shard = max(complete) + 1
