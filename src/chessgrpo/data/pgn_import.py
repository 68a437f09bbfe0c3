"""`chessgrpo data import-pgn`: positions from real games, labelled like generated ones.

Reads PGN files as the Lichess database publishes them (``.pgn``, ``.pgn.gz``, ``.pgn.zst``;
the compression is recognised by the file's first bytes), keeps games whose players both reach
`min_elo`, samples `positions_per_game` positions from each game's mainline (reproducibly, by
seed and game number), deduplicates them and labels them with the same code as `data generate`
(`labelling.label_boards`), into the same shard layout.

A malformed game (python-chess records an illegal or unparsable move in ``game.errors``) or a
variant game is skipped and counted, never a crash. Shards are cut at game boundaries and the
manifest records how many games they cover, so a killed import resumes after the last written
shard (games before it are skipped with the fast `chess.pgn.skip_game`).

Besides the engine labels, each row keeps what the game says about its position (the game columns
of `schema.POSITION_SCHEMA`, built by `mainline_positions`), for human-move imitation
(``objective: human`` of `kind: pretrain`):

- ``ply``: half-moves from the game's first position (0) to this one.
- ``human_move``: the mainline move played from this position, UCI; null at the game's last position.
- ``mover_rating`` / ``opponent_rating``: WhiteElo / BlackElo of the side to move / the other side,
  as integers; null when the header is absent, not an integer ("?", "1500?") or negative.
- ``pgn_eval_cp`` / ``pgn_eval_mate``: the ``[%eval ...]`` of *this* position. A PGN comment follows
  the move it annotates, so this is the comment after the move that led here (for the game's first
  position the comment before move 1). Lichess writes evals from White's point of view; stored
  from the side to move's (negated when Black is to move), like every label of the schema. A mate
  score ``#N`` sets ``pgn_eval_mate`` (N > 0: the side to move mates in N; N < 0: it is mated in
  -N) and leaves ``pgn_eval_cp`` null; a centipawn score the other way round; no eval: both null.
- ``mover_clock``: the side to move's remaining clock in seconds when this position arose: the
  ``[%clk ...]`` after the side to move's *own previous* move (two plies back). Null for each
  player's first move and when that move's comment has no clock. (The ``[%clk]`` after the move
  played from this position, i.e. the time left after thinking here, is the next-but-one row's
  ``mover_clock`` when that row is sampled.)
- ``result`` / ``time_control``: the Result and TimeControl headers as written (Result is "*" when
  the header is absent; time_control is null then).

Positions are deduplicated across the whole import (`labelling.DatasetWriter`), so a position reached
in several games (the opening positions above all) keeps the game columns of the first game read.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import io
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import chess
import chess.pgn

from chessgrpo.config import save_config, to_dict
from chessgrpo.data import schema
from chessgrpo.data.labelling import (
    DatasetWriter,
    LabellingConfig,
    Progress,
    check_engine,
    is_labelable,
    label_boards,
    labelling_engine,
    now_iso,
    prepare_output,
    require,
)
from chessgrpo.engine.pool import EnginePool
from chessgrpo.errors import InputError, one_line
from chessgrpo.files import CorruptCompressedFile, open_decompressed

logger = logging.getLogger(__name__)

PGN = "pgn"


@dataclasses.dataclass
class ImportPgnConfig(LabellingConfig):
    """`chessgrpo data import-pgn`: label positions sampled from the games of a PGN file."""

    pgn: str = ""
    """PGN file: .pgn, .pgn.gz or .pgn.zst (the positional FILE argument)."""
    out: str = ""
    """Dataset directory (required; `--out`). A rerun with the same settings resumes it."""
    min_elo: int | None = None
    """Keep only games where both WhiteElo and BlackElo are at least this; null keeps all games."""
    max_games: int | None = None
    """Stop after reading this many games (skipped ones included); null reads the whole file."""
    positions_per_game: int | None = 10
    """Positions sampled from each game's mainline; null takes every ply."""

    def validate(self) -> None:
        """Raise `ConfigError` (or `FileNotFoundError` for a missing file) naming the bad setting."""
        require(bool(self.pgn), "pgn", self.pgn, "give the PGN file to import")
        require(bool(self.out), "out", self.out, "give the dataset directory with --out DIR (or out=DIR)")
        if self.min_elo is not None:
            require(self.min_elo >= 0, "min_elo", self.min_elo, "must be >= 0")
        if self.max_games is not None:
            require(self.max_games >= 1, "max_games", self.max_games, "must be >= 1")
        if self.positions_per_game is not None:
            require(
                self.positions_per_game >= 1,
                "positions_per_game",
                self.positions_per_game,
                "must be >= 1 (null = every ply)",
            )
        self.validate_labelling()
        path = Path(self.pgn)
        if not path.exists():
            raise FileNotFoundError(f"PGN file {self.pgn!r} does not exist")
        if not path.is_file():
            raise InputError(f"PGN file {self.pgn!r} is not a file")

    def identity(self) -> dict[str, Any]:
        """The settings every shard of a dataset must share (all but out, max_games, engine)."""
        settings = to_dict(self)
        for key in ("out", "max_games", "engine"):
            settings.pop(key)
        settings["pgn"] = str(Path(self.pgn).resolve())
        return {"command": "import-pgn", **settings}


@dataclasses.dataclass
class GameCounts:
    """What happened to the games read (cumulative over resumed runs)."""

    games_read: int = 0
    """Games parsed from the file, skipped ones included."""
    games_used: int = 0
    """Games that passed the filters (they may still add no new position)."""
    skipped_elo: int = 0
    """Games below min_elo or without a numeric WhiteElo/BlackElo while a filter is set."""
    skipped_malformed: int = 0
    """Games python-chess reported errors for (illegal or unparsable moves, bad FEN header)."""
    skipped_variant: int = 0
    """Games of another variant (Chess960, atomic, ...)."""
    skipped_empty: int = 0
    """Games without a single move."""


@dataclasses.dataclass
class ImportSummary:
    """What an `import-pgn` run did."""

    directory: Path
    added: int
    total: int
    shards_written: int
    seconds: float
    games: GameCounts
    counts: dict[str, Any]
    engine: str | None = None
    already_complete: bool = False


class Latin1Fallback:
    """A codec error handler: bytes that are not UTF-8 are read as ISO-8859-1, the character set of
    the PGN standard (1994) that many older files (ChessBase exports, TWIC) still use, and counted."""

    def __init__(self) -> None:
        self.bytes = 0
        self.name = f"chessgrpo-pgn-latin1-{id(self)}"
        codecs.register_error(self.name, self)

    def __call__(self, error: UnicodeError) -> tuple[str, int]:
        if not isinstance(error, UnicodeDecodeError):
            raise error
        self.bytes += error.end - error.start
        return error.object[error.start : error.end].decode("latin-1"), error.end


@contextlib.contextmanager
def open_pgn(path: str | Path, fallback: Latin1Fallback | None = None) -> Iterator[TextIO]:
    """Open a PGN file as text, decompressing gzip or zstd when its first bytes say so.

    Text is UTF-8; bytes that are not are read as ISO-8859-1 (`fallback` counts them), so a Latin-1
    file loses nothing and its names come out right."""
    path = Path(path)
    try:
        raw = open_decompressed(path)  # gzip or zstd by magic bytes; read errors name the file
    except OSError as error:
        raise InputError(f"cannot open PGN file {str(path)!r}: {one_line(error)}") from None
    handle = io.TextIOWrapper(raw, encoding="utf-8-sig", errors=(fallback or Latin1Fallback()).name)
    try:
        yield handle
    finally:
        handle.close()


def _elo(headers: chess.pgn.Headers, key: str) -> int | None:
    try:
        return int(headers.get(key, ""))
    except ValueError:
        return None


_INT32_MAX = 2**31 - 1


def header_rating(headers: chess.pgn.Headers, key: str) -> int | None:
    """The integer rating in header `key` (WhiteElo, BlackElo); None when absent, not an integer,
    negative, or beyond int32 (the column's type)."""
    rating = _elo(headers, key)
    return rating if rating is not None and 0 <= rating <= _INT32_MAX else None


def _clamp_int32(value: int | None) -> int | None:
    return None if value is None else max(-_INT32_MAX, min(_INT32_MAX, value))


def position_eval(node: chess.pgn.GameNode, turn: chess.Color) -> tuple[int | None, int | None]:
    """(centipawns, mate) of the ``[%eval]`` in `node`'s comment, from `turn`'s point of view
    (`turn` = the side to move in `node`'s position); (None, None) without an eval."""
    score = node.eval()
    if score is None:
        return None, None
    relative = score.pov(turn)
    if relative.is_mate():
        return None, _clamp_int32(relative.mate())
    return _clamp_int32(relative.score()), None


def mainline_positions(game: chess.pgn.Game) -> list[tuple[chess.Board, dict[str, Any]]]:
    """Every mainline position (the start, then after each move) with the game columns of its row
    (module docstring: which annotation belongs to which position)."""
    headers = game.headers
    ratings = {chess.WHITE: header_rating(headers, "WhiteElo"), chess.BLACK: header_rating(headers, "BlackElo")}
    result, time_control = headers.get("Result"), headers.get("TimeControl")
    clocks: dict[chess.Color, float | None] = {chess.WHITE: None, chess.BLACK: None}
    board = game.board()
    node: chess.pgn.GameNode = game
    positions, ply = [], 0
    while True:
        following = node.next()
        turn = board.turn
        eval_cp, eval_mate = position_eval(node, turn)
        info = {
            "ply": ply,
            "human_move": following.move.uci() if following is not None else None,
            "mover_rating": ratings[turn],
            "opponent_rating": ratings[not turn],
            "pgn_eval_cp": eval_cp,
            "pgn_eval_mate": eval_mate,
            "mover_clock": clocks[turn],
            "result": result,
            "time_control": time_control,
        }
        positions.append((board.copy(stack=False), info))
        if following is None:
            return positions
        clocks[turn] = following.clock()  # the mover's clock after this move: what it has at its next position
        board.push(following.move)
        node, ply = following, ply + 1


MALFORMED_WARNINGS = 10
"""Malformed games named in a warning each (a large database may hold thousands; the rest are counted)."""


def game_name(game: chess.pgn.Game) -> str:
    """ "White - Black, Event, Date" from the game's headers (what a user finds the game by)."""
    headers = game.headers
    return f"{headers.get('White', '?')} - {headers.get('Black', '?')}, {headers.get('Event', '?')}, {headers.get('Date', '?')}"


def game_filter_reason(game: chess.pgn.Game, min_elo: int | None) -> str | None:
    """Why a game is skipped ("elo", "malformed", "variant", "empty"), or None to keep it."""
    if game.errors:
        return "malformed"
    board = game.board()
    if type(board) is not chess.Board or board.chess960:
        return "variant"
    if not board.is_valid():
        return "malformed"
    if game.next() is None:
        return "empty"
    if min_elo is not None:
        white, black = _elo(game.headers, "WhiteElo"), _elo(game.headers, "BlackElo")
        if white is None or black is None or min(white, black) < min_elo:
            return "elo"
    return None


def sample_game_positions(
    game: chess.pgn.Game, count: int | None, rng: random.Random
) -> list[tuple[chess.Board, dict[str, Any]]]:
    """Up to `count` distinct-ply labelable positions of the mainline (all when None), in game order,
    each with the game columns of its row (`mainline_positions`)."""
    candidates = [(board, info) for board, info in mainline_positions(game) if is_labelable(board)]
    if count is None or len(candidates) <= count:
        return candidates
    return [candidates[i] for i in sorted(rng.sample(range(len(candidates)), count))]


def sample_positions(game: chess.pgn.Game, count: int | None, rng: random.Random) -> list[chess.Board]:
    """The boards of `sample_game_positions` (the same sample for the same `rng` state)."""
    return [board for board, _ in sample_game_positions(game, count, rng)]


class PgnImporter:
    """Import (or resume importing) a PGN file: ``PgnImporter(config).run(progress=bar.update)``."""

    def __init__(self, config: ImportPgnConfig):
        config.validate()
        self.config = config
        self.directory, self.manifest = prepare_output(config.out, config.identity())
        self.writer = DatasetWriter(self.directory, config.test_fraction, self.manifest.get("shard_sha256"))
        known = {field.name for field in dataclasses.fields(GameCounts)}
        self.games = GameCounts(**{k: v for k, v in self.manifest.get("games", {}).items() if k in known})
        self.end_of_file = bool(self.manifest.get("end_of_file", False))
        self.earlier_seconds = float(self.manifest.get("wall_time_s", 0.0))
        # True when every stored row has the game columns (false for a dataset begun by an older version).
        self.game_columns = not self.writer.rows or bool(self.manifest.get("game_columns"))
        if not self.game_columns:
            logger.warning(
                "dataset %s was started before imports kept the game columns (human_move, ratings, %%eval, %%clk): "
                "its %d positions so far have them null; re-import into a new --out to have them everywhere",
                self.directory,
                self.writer.rows,
            )

    @property
    def existing(self) -> int:
        """Positions already stored."""
        return self.writer.rows

    @property
    def complete(self) -> bool:
        """True when the file is exhausted or `max_games` games have been read."""
        limit = self.config.max_games
        return self.end_of_file or (limit is not None and self.games.games_read >= limit)

    def run(self, *, pool: EnginePool | None = None, progress: Progress | None = None) -> ImportSummary:
        """Read, filter, sample, label and write; a complete import is left untouched."""
        started = time.perf_counter()
        before, shards_before = self.writer.rows, self.writer.next_shard
        if self.complete:
            return self._summary(before, shards_before, started, self.manifest.get("engine"), already_complete=True)
        own_pool = pool is None
        if pool is None:
            pool = EnginePool.from_config(labelling_engine(self.config.engine, self.config.nodes))
        try:
            check_engine(self.manifest, self.directory, pool.engine_name)
            save_config(self.config, self.directory / "config.yaml")
            self._write_manifest(pool.engine_name, 0.0)
            self._import(pool, started, progress)
            self._write_manifest(pool.engine_name, time.perf_counter() - started)
            return self._summary(before, shards_before, started, pool.engine_name)
        finally:
            if own_pool:
                pool.close()

    def _import(self, pool: EnginePool, started: float, progress: Progress | None) -> None:
        config = self.config
        pending: list[tuple[chess.Board, dict[str, Any]]] = []
        counts = dataclasses.replace(self.games)  # advances past games whose positions are pending
        fallback = Latin1Fallback()
        try:
            with open_pgn(config.pgn, fallback) as handle:
                for _ in range(counts.games_read):  # resume: these games are in written shards
                    if not chess.pgn.skip_game(handle):
                        break
                while config.max_games is None or counts.games_read < config.max_games:
                    game = chess.pgn.read_game(handle)
                    if game is None:
                        self.end_of_file = True
                        break
                    pending.extend(self._positions_of(game, counts))
                    if len(pending) >= config.shard_size:
                        self._flush(pool, pending, counts, started, progress)
                        pending = []
        except (OSError, CorruptCompressedFile) as error:  # a read error, truncated or corrupt compression
            raise InputError(
                f"cannot read PGN file {config.pgn!r} after game {counts.games_read}: {one_line(error)}"
            ) from None
        if fallback.bytes:
            logger.warning(
                "PGN file %r is not UTF-8: %d bytes were read as ISO-8859-1 (Latin-1, the PGN standard's character set)",
                config.pgn,
                fallback.bytes,
            )
        self._flush(pool, pending, counts, started, progress)
        if self.end_of_file and self.games.games_used == 0 and self.writer.rows == 0:
            raise InputError(f"PGN file {config.pgn!r} has no usable games ({self._describe_counts()})")

    def _positions_of(self, game: chess.pgn.Game, counts: GameCounts) -> list[tuple[chess.Board, dict[str, Any]]]:
        index = counts.games_read
        counts.games_read += 1
        reason = game_filter_reason(game, self.config.min_elo)
        if reason is not None:
            setattr(counts, f"skipped_{reason}", getattr(counts, f"skipped_{reason}") + 1)
            if reason == "malformed" and counts.skipped_malformed <= MALFORMED_WARNINGS:
                logger.warning(
                    "PGN file %r: game %d (%s) skipped as malformed: %s%s",
                    self.config.pgn,
                    index + 1,
                    game_name(game),
                    one_line(game.errors[0]) if game.errors else "an impossible start position",
                    "; further malformed games are only counted"
                    if counts.skipped_malformed == MALFORMED_WARNINGS
                    else "",
                )
            return []
        counts.games_used += 1
        rng = random.Random(f"chessgrpo.data.pgn_import/{self.config.seed}/{index}")
        positions = []
        for board, info in sample_game_positions(game, self.config.positions_per_game, rng):
            fen = board.fen()
            if self.writer.is_new(fen):
                self.writer.reserve(fen)
                positions.append((board, info))
        return positions

    def _flush(
        self,
        pool: EnginePool,
        pending: list[tuple[chess.Board, dict[str, Any]]],
        counts: GameCounts,
        started: float,
        progress: Progress | None,
    ) -> None:
        """Label and write the pending positions (with their game columns), then record the games they came from."""
        if pending:
            rows = label_boards(pool, [board for board, _ in pending], PGN, self.config.label_settings, progress)
            games = {board.fen(): info for board, info in pending}  # pending FENs are distinct (deduplicated)
            for row in rows:  # label_boards drops positions without legal moves, so match by FEN
                row.update(games[row["fen"]])
            self.writer.write_shard(rows)
        self.games = dataclasses.replace(counts)
        self._write_manifest(pool.engine_name, time.perf_counter() - started)

    def _describe_counts(self) -> str:
        return ", ".join(f"{key} {value}" for key, value in dataclasses.asdict(self.games).items())

    def _summary(
        self, before: int, shards_before: int, started: float, engine: str | None, already_complete: bool = False
    ) -> ImportSummary:
        return ImportSummary(
            directory=self.directory,
            added=self.writer.rows - before,
            total=self.writer.rows,
            shards_written=self.writer.next_shard - shards_before,
            seconds=time.perf_counter() - started,
            games=dataclasses.replace(self.games),
            counts=self.writer.count_summary(),
            engine=engine,
            already_complete=already_complete,
        )

    def _write_manifest(self, engine: str | None, run_seconds: float) -> None:
        manifest = {
            "command": "import-pgn",
            "complete": self.complete,
            "end_of_file": self.end_of_file,
            "pgn": str(Path(self.config.pgn).resolve()),
            **self.writer.count_summary(),
            "games": dataclasses.asdict(self.games),
            "engine": engine,
            "nodes": self.config.nodes,
            "multipv": self.config.multipv,
            "seed": self.config.seed,
            "min_elo": self.config.min_elo,
            "positions_per_game": self.config.positions_per_game,
            "test_fraction": self.config.test_fraction,
            "all_legal_values": self.config.all_legal_values,
            "game_columns": self.game_columns,
            "wall_time_s": round(self.earlier_seconds + run_seconds, 3),
            "updated": now_iso(),
            "identity": self.config.identity(),
        }
        schema.write_manifest(self.directory, manifest)


def import_pgn(
    config: ImportPgnConfig, *, pool: EnginePool | None = None, progress: Progress | None = None
) -> ImportSummary:
    """Import the PGN file described by `config` (see `PgnImporter`)."""
    return PgnImporter(config).run(pool=pool, progress=progress)
