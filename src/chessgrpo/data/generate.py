"""`chessgrpo data generate`: diverse labelled positions from engine games and random playouts.

Where positions come from:

- **Engine games.** Each game starts with a uniformly random number (`opening_random_plies_min`
  ..`opening_random_plies_max`) of uniformly random legal plies, so games do not all share the
  same openings, and then Stockfish plays both sides: each move is sampled from a softmax over
  the multipv win probabilities divided by `sampling_temperature`, so games keep diverging.
  `concurrent_games` games advance in lock step, so each batch of current positions goes to the
  engine pool together; one analysis per position is both its label and its move choice.
- **Random playouts.** `random_playout_fraction` of the positions are the ends of uniformly
  random legal games (unbalanced, unusual positions a policy must also handle).

Every position is recorded once (deduplicated by `schema.position_key` across the whole
dataset), terminal positions never. Rows are written every `shard_size` positions as one
atomic shard per split (see `labelling.DatasetWriter`).

Resuming: engine games run on across shards; before shard k is written, the games' state at
the start of shard k+1 (their moves and random stream) is saved to
``DIR/resume/engine-games-<k+1>.json``, and random playouts use a stream derived from (seed,
shard index). A killed run therefore restarts at its first unwritten shard with exactly the
state an uninterrupted run had there: it writes the same shards and never replays games.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import chess

from chessgrpo.board.sources import random_playout
from chessgrpo.board.validation import parse_move
from chessgrpo.config import save_config, to_dict
from chessgrpo.data import schema
from chessgrpo.data.labelling import (
    DatasetWriter,
    LabellingConfig,
    Progress,
    Row,
    analyse_boards,
    check_engine,
    is_labelable,
    label_boards,
    labelling_engine,
    make_rows,
    now_iso,
    prepare_output,
    ranked_lines,
    require,
)
from chessgrpo.engine.evaluation import Analysis, MoveEvaluation
from chessgrpo.engine.pool import EnginePool
from chessgrpo.errors import InputError

logger = logging.getLogger(__name__)

ENGINE_GAME = "engine_game"
RANDOM_PLAYOUT = "random_playout"
MAX_FRUITLESS_STEPS = 200  # lock-step batches in a row without a new position before we give up


@dataclasses.dataclass
class GenerateConfig(LabellingConfig):
    """`chessgrpo data generate`: label positions from engine games and random playouts."""

    out: str = ""
    """Dataset directory (required; `--out`). A rerun with the same settings resumes it."""
    positions: int = 10_000
    """Total number of positions the dataset should hold (a rerun adds only what is missing)."""
    random_playout_fraction: float = 0.2
    """Share of positions taken from uniformly random playouts instead of engine games."""
    random_playout_max_plies: int = 80
    """Longest random playout; each playout's length is uniform in 1..this."""
    opening_random_plies_min: int = 2
    """Fewest uniformly random legal plies before the engine plays a game."""
    opening_random_plies_max: int = 8
    """Most uniformly random legal plies before the engine plays a game."""
    sampling_temperature: float = 0.05
    """Engine-game moves are sampled with weights exp(win_prob / T) over the top moves; 0 = best move."""
    max_game_plies: int = 200
    """An engine game longer than this (plies from the start position) is ended."""
    concurrent_games: int = 64
    """Engine games played in lock step (also the batch size of random-playout labelling)."""

    def validate(self) -> None:
        """Raise `ConfigError` naming the first setting that cannot work."""
        require(bool(self.out), "out", self.out, "give the dataset directory with --out DIR (or out=DIR)")
        require(self.positions >= 1, "positions", self.positions, "must be >= 1")
        self.validate_labelling()
        require(
            0.0 <= self.random_playout_fraction <= 1.0,
            "random_playout_fraction",
            self.random_playout_fraction,
            "must be in [0, 1]",
        )
        require(
            self.random_playout_max_plies >= 1,
            "random_playout_max_plies",
            self.random_playout_max_plies,
            "must be >= 1",
        )
        require(
            self.opening_random_plies_min >= 0,
            "opening_random_plies_min",
            self.opening_random_plies_min,
            "must be >= 0",
        )
        require(
            self.opening_random_plies_max >= self.opening_random_plies_min,
            "opening_random_plies_max",
            self.opening_random_plies_max,
            "must be >= opening_random_plies_min",
        )
        require(
            self.max_game_plies > self.opening_random_plies_max,
            "max_game_plies",
            self.max_game_plies,
            "must be > opening_random_plies_max",
        )
        require(self.sampling_temperature >= 0.0, "sampling_temperature", self.sampling_temperature, "must be >= 0")
        require(self.concurrent_games >= 1, "concurrent_games", self.concurrent_games, "must be >= 1")

    def identity(self) -> dict[str, Any]:
        """The settings every shard of a dataset must share (all but out, positions, engine)."""
        settings = to_dict(self)
        for key in ("out", "positions", "engine"):
            settings.pop(key)
        return {"command": "generate", **settings}


@dataclasses.dataclass
class GenerateSummary:
    """What a `generate` run did."""

    directory: Path
    added: int
    """Positions written by this run."""
    total: int
    """Positions in the dataset now."""
    requested: int
    shards_written: int
    seconds: float
    counts: dict[str, Any]
    """The manifest's counts (per split, per source)."""
    engine: str | None = None


# --------------------------------------------------------------------------------------------
# Position sources


def shard_rng(seed: int, shard_index: int, stream: str) -> random.Random:
    """An independent random stream per (seed, shard, purpose); string seeds hash stably."""
    return random.Random(f"chessgrpo.data.generate/{seed}/{shard_index}/{stream}")


def sample_move(lines: Sequence[MoveEvaluation], temperature: float, rng: random.Random) -> str:
    """A move drawn with probability proportional to exp(win_probability / temperature).

    `lines` are best first; temperature 0 always returns the first.
    """
    if not lines:
        raise ValueError("no moves to sample from")
    if temperature <= 0.0:
        return lines[0].move
    best = lines[0].win_probability
    weights = [math.exp((line.win_probability - best) / temperature) for line in lines]  # max weight 1: no overflow
    return rng.choices([line.move for line in lines], weights=weights)[0]


def game_has_ended(board: chess.Board) -> bool:
    """Game over by rule, or drawn by threefold repetition or the 50-move rule.

    Cheaper than ``is_game_over(claim_draw=True)``, which also tries every legal move to see
    whether it would allow a claim (that dominated generation time in profiles).
    """
    return board.is_game_over() or board.is_fifty_moves() or board.is_repetition(3)


def random_opening(rng: random.Random, min_plies: int, max_plies: int) -> chess.Board:
    """The start position plus a uniform number of uniformly random legal plies, game not over."""
    while True:
        board = chess.Board()
        for _ in range(rng.randint(min_plies, max_plies)):
            board.push(rng.choice(list(board.legal_moves)))
            if board.is_game_over():
                break
        if not game_has_ended(board):
            return board


class EngineGames:
    """`concurrent_games` engine games advanced in lock step.

    Games run on across shard boundaries (so long games and endgames are reached whatever the
    shard size); `state`/`from_state` save and restore them with their random stream, which is
    how a resumed run continues exactly where the uninterrupted run would be.
    """

    def __init__(self, config: GenerateConfig, rng: random.Random, boards: list[chess.Board] | None = None):
        self.config = config
        self.rng = rng
        self.boards = boards if boards is not None else [self._new_game() for _ in range(config.concurrent_games)]

    def _new_game(self) -> chess.Board:
        return random_opening(self.rng, self.config.opening_random_plies_min, self.config.opening_random_plies_max)

    def step(self, pool: EnginePool, writer: DatasetWriter, wanted: int) -> list[Row]:
        """Analyse every current position, record up to `wanted` new ones, play one move in each game."""
        settings = self.config.label_settings
        analyses = analyse_boards(pool, self.boards, settings)
        chosen: list[tuple[chess.Board, Analysis]] = []
        for slot, (board, analysis) in enumerate(zip(self.boards, analyses)):
            fen = board.fen()
            if len(chosen) < wanted and is_labelable(board) and writer.is_new(fen):
                writer.reserve(fen)
                chosen.append((board.copy(stack=False), analysis))
            self._advance(slot, analysis)
        return make_rows(pool, [b for b, _ in chosen], [a for _, a in chosen], [ENGINE_GAME] * len(chosen), settings)

    def _advance(self, slot: int, analysis: Analysis) -> None:
        board = self.boards[slot]
        lines = ranked_lines(analysis)
        if lines:
            board.push_uci(sample_move(lines, self.config.sampling_temperature, self.rng))
        if not lines or board.ply() >= self.config.max_game_plies or game_has_ended(board):
            self.boards[slot] = self._new_game()

    def state(self) -> dict[str, Any]:
        """JSON-able state: each game's moves from the start position and the random stream."""
        version, internal, gauss = self.rng.getstate()
        return {
            "games": [[move.uci() for move in board.move_stack] for board in self.boards],
            "rng": [version, list(internal), gauss],
        }

    @classmethod
    def from_state(cls, config: GenerateConfig, state: dict[str, Any]) -> EngineGames:
        """Games as `state` saved them; the moves are replayed, so repetitions are still seen."""
        rng = random.Random()
        version, internal, gauss = state["rng"]
        rng.setstate((version, tuple(internal), gauss))
        boards = []
        for moves in state["games"]:
            board = chess.Board()
            for move in moves:
                board.push(parse_move(board, move))
            boards.append(board)
        if len(boards) != config.concurrent_games:
            raise InputError(
                f"saved engine games: {len(boards)} games, config has concurrent_games={config.concurrent_games}"
            )
        return cls(config, rng, boards)


class RandomPlayouts:
    """New, labelable random-playout positions, `concurrent_games` per batch."""

    def __init__(self, config: GenerateConfig, rng: random.Random):
        self.config = config
        self.rng = rng

    def step(self, pool: EnginePool, writer: DatasetWriter, wanted: int) -> list[Row]:
        """Label up to `wanted` (at most one batch) new random-playout positions."""
        boards: list[chess.Board] = []
        attempts, batch = 0, min(wanted, self.config.concurrent_games)
        while len(boards) < batch:
            attempts += 1
            if attempts > 100 * batch + 1000:
                raise RuntimeError(f"random playouts keep reaching stored positions ({attempts} tries)")
            board = random_playout(self.rng, self.config.random_playout_max_plies)
            fen = board.fen()
            if is_labelable(board) and writer.is_new(fen):
                writer.reserve(fen)
                boards.append(board.copy(stack=False))
        return label_boards(pool, boards, RANDOM_PLAYOUT, self.config.label_settings)


def shard_rows(
    pool: EnginePool,
    config: GenerateConfig,
    writer: DatasetWriter,
    games: EngineGames,
    shard_index: int,
    size: int,
    progress: Progress | None = None,
) -> list[Row]:
    """`size` new labelled rows for shard `shard_index`: engine games continue from `games`,
    random playouts come from a fresh stream for this shard.

    The two sources are interleaved (whichever is further behind its quota goes next) so the
    progress rate is steady.
    """
    quota = {RANDOM_PLAYOUT: round(size * config.random_playout_fraction)}
    quota[ENGINE_GAME] = size - quota[RANDOM_PLAYOUT]
    sources: dict[str, EngineGames | RandomPlayouts] = {
        ENGINE_GAME: games,
        RANDOM_PLAYOUT: RandomPlayouts(config, shard_rng(config.seed, shard_index, "playouts")),
    }
    done = {RANDOM_PLAYOUT: 0, ENGINE_GAME: 0}
    fruitless = {RANDOM_PLAYOUT: 0, ENGINE_GAME: 0}
    rows: list[Row] = []
    while len(rows) < size:
        name = min((n for n in quota if done[n] < quota[n]), key=lambda n: done[n] / quota[n])
        new = sources[name].step(pool, writer, quota[name] - done[name])
        done[name] += len(new)
        rows.extend(new)
        fruitless[name] = 0 if new else fruitless[name] + 1
        if fruitless[name] >= MAX_FRUITLESS_STEPS:  # e.g. temperature 0 and no random opening plies
            raise RuntimeError(
                f"{name} positions stopped being new ({MAX_FRUITLESS_STEPS} batches without one); "
                "raise sampling_temperature or opening_random_plies_max"
            )
        if progress and new:
            progress(len(new))
    return rows


# --------------------------------------------------------------------------------------------
# The job


class DatasetGenerator:
    """Generate (or resume) a dataset: ``DatasetGenerator(config).run(progress=bar.update)``.

    Construction validates the config, checks the output directory and reads what an earlier
    run stored there (removing the leftovers of a killed one); `existing` and `complete` tell
    the caller what is already done before any engine starts.
    """

    def __init__(self, config: GenerateConfig):
        config.validate()
        self.config = config
        self.directory, self.manifest = prepare_output(config.out, config.identity())
        self.writer = DatasetWriter(self.directory, config.test_fraction, self.manifest.get("shard_sha256"))
        self.earlier_seconds = float(self.manifest.get("wall_time_s", 0.0))

    @property
    def existing(self) -> int:
        """Positions already stored."""
        return self.writer.rows

    @property
    def complete(self) -> bool:
        return self.writer.rows >= self.config.positions

    def run(self, *, pool: EnginePool | None = None, progress: Progress | None = None) -> GenerateSummary:
        """Add positions until the dataset holds `config.positions`; a complete dataset is left untouched."""
        started = time.perf_counter()
        before, shards_before = self.writer.rows, self.writer.next_shard
        if self.complete:
            if not self.manifest.get("complete"):  # killed after its last shard, before the manifest
                self._write_manifest(self.manifest.get("engine"), 0.0, complete=True)
            return self._summary(before, shards_before, started, self.manifest.get("engine"))
        own_pool = pool is None
        if pool is None:
            pool = EnginePool.from_config(labelling_engine(self.config.engine, self.config.nodes))
        try:
            check_engine(self.manifest, self.directory, pool.engine_name)
            save_config(self.config, self.directory / "config.yaml")
            self._write_manifest(pool.engine_name, 0.0, complete=False)
            games = self._load_games(self.writer.next_shard)
            while not self.complete:
                index = self.writer.next_shard
                size = min(self.config.shard_size, self.config.positions - self.writer.rows)
                rows = shard_rows(pool, self.config, self.writer, games, index, size, progress)
                # The games' state at the start of the next shard goes to disk before this shard,
                # so whichever shard a resumed run starts at, its starting state is there.
                self._save_games(index + 1, games)
                self.writer.write_shard(rows)
                self._games_path(index).unlink(missing_ok=True)
                self._write_manifest(pool.engine_name, time.perf_counter() - started, complete=self.complete)
                logger.debug("wrote shard %d (%d rows, %d in total)", index, len(rows), self.writer.rows)
            return self._summary(before, shards_before, started, pool.engine_name)
        finally:
            if own_pool:
                pool.close()

    def _games_path(self, shard_index: int) -> Path:
        return self.directory / "resume" / f"engine-games-{shard_index:05d}.json"

    def _load_games(self, shard_index: int) -> EngineGames:
        """The engine games at the start of `shard_index`: saved by the run that wrote the shard
        before it, or new games from the (seed, shard) stream when there is no saved state."""
        path = self._games_path(shard_index)
        if shard_index > 0 and path.is_file():
            try:
                return EngineGames.from_state(self.config, json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError) as error:
                raise InputError(
                    f"saved engine games {str(path)!r} are unreadable ({error}); delete the file to start new games"
                ) from None
        if shard_index > 0:
            logger.warning("no saved engine games for shard %d: starting new games", shard_index)
        return EngineGames(self.config, shard_rng(self.config.seed, shard_index, "games"))

    def _save_games(self, shard_index: int, games: EngineGames) -> None:
        from chessgrpo.files import write_json_atomic

        write_json_atomic(self._games_path(shard_index), games.state(), indent=None)

    def _summary(self, before: int, shards_before: int, started: float, engine: str | None) -> GenerateSummary:
        return GenerateSummary(
            directory=self.directory,
            added=self.writer.rows - before,
            total=self.writer.rows,
            requested=self.config.positions,
            shards_written=self.writer.next_shard - shards_before,
            seconds=time.perf_counter() - started,
            counts=self.writer.count_summary(),
            engine=engine,
        )

    def _write_manifest(self, engine: str | None, run_seconds: float, *, complete: bool) -> None:
        manifest = {
            "command": "generate",
            "complete": complete,
            "requested_positions": self.config.positions,
            **self.writer.count_summary(),
            "engine": engine,
            "nodes": self.config.nodes,
            "multipv": self.config.multipv,
            "seed": self.config.seed,
            "test_fraction": self.config.test_fraction,
            "all_legal_values": self.config.all_legal_values,
            "wall_time_s": round(self.earlier_seconds + run_seconds, 3),  # summed over resumed runs
            "updated": now_iso(),
            "identity": self.config.identity(),
        }
        schema.write_manifest(self.directory, manifest)


def generate_dataset(
    config: GenerateConfig, *, pool: EnginePool | None = None, progress: Progress | None = None
) -> GenerateSummary:
    """Generate or resume the dataset described by `config` (see `DatasetGenerator`)."""
    return DatasetGenerator(config).run(pool=pool, progress=progress)
