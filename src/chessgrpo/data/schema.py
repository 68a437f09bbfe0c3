"""The labelled-position dataset: Parquet schema, deterministic split, shard I/O.

A dataset is a directory::

    DIR/config.yaml              the resolved config of the command that made it
    DIR/manifest.json            what made it (command, settings, counts), schema version
    DIR/resume/                  generator state for resuming (engine games in flight)
    DIR/train/shard-00000.parquet
    DIR/test/shard-00000.parquet

Each row is one position labelled by Stockfish from the side to move's point of view:

| column            | type          | meaning |
|-------------------|---------------|---------|
| fen               | string        | full FEN |
| source            | string        | "engine_game", "random_playout", "pgn" |
| best_move         | string        | engine's best move (UCI) = moves[0] |
| best_action       | int16         | index of best_move in `chessgrpo.board.ACTIONS` |
| moves             | list<string>  | top-M moves, best first (multipv order) |
| win_probs         | list<float32> | win probability for the side to move after each of `moves` |
| value             | float32       | win probability of the position for the side to move (= win_probs[0]) |
| legal_moves       | list<string>  | every legal move, or null when not requested |
| legal_win_probs   | list<float32> | win probability after each legal move (side to move), or null |
| nodes             | int32         | node limit of the labelling search |

Game columns, kept by `data import-pgn` (null in the rows of the other data commands, `data generate`,
`data endgame`, `data search-label`, and in every dataset written before they existed, whose shards
lack them and read back as nulls):

| column            | type          | meaning |
|-------------------|---------------|---------|
| ply               | int32         | half-moves played in the game before this position (0 = the game's first position) |
| human_move        | string        | the move the player to move actually played here (UCI); null at the game's last position |
| mover_rating      | int32         | the side to move's rating (WhiteElo or BlackElo); null when absent, not an integer or negative |
| opponent_rating   | int32         | the other player's rating, the same way |
| pgn_eval_cp       | int32         | the game's ``[%eval]`` of this position in centipawns, from the side to move's point of view |
| pgn_eval_mate     | int32         | the ``[%eval #N]`` of this position: N > 0 the side to move mates in N, N < 0 it is mated |
| mover_clock       | float32       | the side to move's remaining clock (s) when the position arose: its own last ``[%clk]`` |
| result            | string        | the game's Result header ("1-0", "0-1", "1/2-1/2", "*"), as written |
| time_control      | string        | the game's TimeControl header as written ("300+3", "-", ...); null when absent |

Which annotation belongs to which position (`data.pgn_import` has the details): a PGN comment
follows a move, so ``[%eval]`` and ``[%clk]`` describe the position *after* that move. A row's
``pgn_eval_*`` is therefore the comment after the move that led to it (for the game's first position,
the comment before the first move); at most one of the two is set, both are null without an eval.
``mover_clock`` is the comment after the side to move's *previous* move (its clock when this position
came up, Lichess's clocks include the increment), null for each player's first move.

`OPTIONAL_COLUMNS` are the columns a shard may lack: `read_positions` fills them with nulls, so a
dataset of either age reads the same way everywhere.

The split is a pure function of the position (FEN without move counters), so a position lands in
the same split whatever run, source or order produced it, and train and test never share one.

Shards are written with a CRC-32 per page and read with the CRCs verified (`read_parquet`): a shard
with scrambled bytes fails with one `ValueError` naming it instead of decoding into wrong rows
(without the CRCs about a quarter of random 16-byte scrambles read back as silently changed data).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from chessgrpo.errors import InputError, one_line
from chessgrpo.files import file_sha256
from chessgrpo.paths import find_data_path

SCHEMA_VERSION = 1
# Stamped into manifests for the record; no reader decides anything by it. Adding the nullable game
# columns did not change it: a shard without them reads as one with them all null (`read_positions`).
Split = Literal["train", "test"]
SPLITS: tuple[Split, ...] = ("train", "test")

POSITION_SCHEMA = pa.schema(
    [
        ("fen", pa.string()),
        ("source", pa.string()),
        ("best_move", pa.string()),
        ("best_action", pa.int16()),
        ("moves", pa.list_(pa.string())),
        ("win_probs", pa.list_(pa.float32())),
        ("value", pa.float32()),
        ("legal_moves", pa.list_(pa.string())),
        ("legal_win_probs", pa.list_(pa.float32())),
        ("nodes", pa.int32()),
        # Game columns (nullable; absent from shards written before they existed).
        ("ply", pa.int32()),
        ("human_move", pa.string()),
        ("mover_rating", pa.int32()),
        ("opponent_rating", pa.int32()),
        ("pgn_eval_cp", pa.int32()),
        ("pgn_eval_mate", pa.int32()),
        ("mover_clock", pa.float32()),
        ("result", pa.string()),
        ("time_control", pa.string()),
    ]
)
GAME_COLUMNS: tuple[str, ...] = (
    "ply",
    "human_move",
    "mover_rating",
    "opponent_rating",
    "pgn_eval_cp",
    "pgn_eval_mate",
    "mover_clock",
    "result",
    "time_control",
)
OPTIONAL_COLUMNS: frozenset[str] = frozenset(GAME_COLUMNS)
"""Columns a shard may lack (written before they existed): they read back as nulls."""


def position_key(fen: str) -> str:
    """The position without move counters: piece placement, side, castling, en passant."""
    return " ".join(fen.split()[:4])


def split_of(fen: str, test_fraction: float = 0.05) -> Split:
    """Deterministic split by a hash of `position_key(fen)`; ~test_fraction of positions are test."""
    digest = hashlib.sha256(position_key(fen).encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64
    return "test" if bucket < test_fraction else "train"


def write_shard(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write rows (dicts with the schema's columns) to `path` atomically (tmp file, then rename)."""
    return write_parquet(pa.Table.from_pylist(list(rows), schema=POSITION_SCHEMA), path)


def write_parquet(table: pa.Table, path: str | os.PathLike) -> Path:
    """Write `table` to `path` atomically (tmp file, then rename; parents created), zstd, with page CRCs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
        os.replace(tmp, path)  # a killed writer leaves a .tmp file, never a truncated shard
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_parquet(
    path: str | os.PathLike, columns: Sequence[str] | None = None, *, what: str = "Parquet file"
) -> pa.Table:
    """Read `columns` (None = all) of one Parquet file, verifying its page CRCs where it has them.

    Raises `FileNotFoundError` for a missing file and one `ValueError` naming the file for anything
    pyarrow cannot read: a truncated file, scrambled pages (decompression or CRC failures, dictionary
    indices out of bounds), missing columns. `what` names the file's role in the message.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    try:
        names = pq.read_schema(path).names
        missing = [name for name in columns or () if name not in names]
        if missing:
            raise InputError(f"{what} {str(path)!r} lacks columns {missing}")
        return pq.read_table(
            path, columns=list(columns) if columns is not None else None, page_checksum_verification=True
        )
    except (pa.ArrowException, OSError) as error:
        raise InputError(
            f"{what} {str(path)!r} is not a readable Parquet file (truncated or corrupt): {one_line(error)}"
        ) from None


def shard_checksums(directory: str | os.PathLike) -> dict[str, str]:
    """{relative path: SHA-256} of every shard of a dataset directory: the manifest's ``shard_sha256``."""
    directory = Path(directory)
    return {
        path.relative_to(directory).as_posix(): file_sha256(path)
        for path in sorted(directory.glob("*/shard-*.parquet"))
    }


def verify_shard(directory: Path, path: Path, checksums: dict[str, str]) -> None:
    """Raise `ValueError` naming `path` when its bytes differ from the SHA-256 the dataset's manifest
    recorded when it was written (a shard without a recorded checksum passes: older datasets)."""
    expected = checksums.get(path.relative_to(directory).as_posix())
    if expected is not None and file_sha256(path) != expected:
        raise InputError(
            f"dataset shard {str(path)!r} differs from the SHA-256 its manifest recorded when it was written "
            "(changed or corrupted on disk); restore it, or regenerate the dataset in a new directory"
        )


def shard_paths(directory: str | os.PathLike, split: Split | None = None) -> list[Path]:
    """Completed shard files of a dataset directory (optionally one split), sorted."""
    directory = Path(directory)
    splits = [split] if split else list(SPLITS)
    return sorted(p for s in splits for p in (directory / s).glob("shard-*.parquet"))


def read_positions(
    source: str | os.PathLike, split: Split | None = None, columns: Iterable[str] | None = None
) -> pa.Table:
    """Read a dataset directory (all shards of `split`, or both) or a single Parquet file.

    `columns` None reads every column of `POSITION_SCHEMA`. A shard written before the game columns
    existed reads with those columns null (`OPTIONAL_COLUMNS`), whether they are asked for by name or not.

    Raises `ValueError` naming the file when a shard is unreadable (truncated, scrambled pages), differs
    from the checksum the directory's manifest recorded, lacks schema columns or has columns of other types.
    """
    source = find_data_path(source) or Path(source)  # a relative path, from any current directory
    paths = [source] if source.is_file() else shard_paths(source, split)
    if not paths:
        raise FileNotFoundError(f"no Parquet shards for split {split or 'any'} under {str(source)!r}")
    wanted = list(columns) if columns is not None else POSITION_SCHEMA.names
    unknown = [name for name in wanted if name not in POSITION_SCHEMA.names]
    if unknown:
        raise ValueError(f"unknown dataset columns {unknown}; the position schema has {POSITION_SCHEMA.names}")
    target = pa.schema([POSITION_SCHEMA.field(n) for n in wanted])
    checksums = read_manifest(source).get("shard_sha256", {}) if source.is_dir() else {}
    tables = []
    for path in paths:
        if checksums:
            verify_shard(source, path, checksums)
        tables.append(_read_shard(path, target))
    return pa.concat_tables(tables)


def _read_shard(path: Path, target: pa.Schema) -> pa.Table:
    """The `target` columns of one shard, cast to their schema types; `OPTIONAL_COLUMNS` the shard
    lacks (an older dataset) come back as nulls, any other missing column is an error naming it."""
    try:
        present = set(pq.read_schema(path).names)
    except (pa.ArrowException, OSError) as error:
        raise InputError(
            f"dataset shard {str(path)!r} is not a readable Parquet file (truncated or corrupt): {one_line(error)}"
        ) from None
    absent = [name for name in target.names if name in OPTIONAL_COLUMNS and name not in present]
    table = read_parquet(path, [name for name in target.names if name not in absent], what="dataset shard")
    for name in absent:
        table = table.append_column(target.field(name), pa.nulls(table.num_rows, target.field(name).type))
    try:
        return table.select(target.names).cast(target)
    except (pa.ArrowException, ValueError) as error:
        raise InputError(f"dataset shard {str(path)!r} does not have the position schema: {one_line(error)}") from None


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Write DIR/manifest.json atomically, stamping the schema version."""
    from chessgrpo.files import write_json_atomic

    write_json_atomic(Path(directory) / "manifest.json", {"schema_version": SCHEMA_VERSION, **manifest}, indent=2)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}
