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
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from chessgrpo.errors import one_line
from chessgrpo.files import file_sha256

SCHEMA_VERSION = 1
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
    ]
)


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


def read_parquet(path: str | os.PathLike, columns: Sequence[str] | None = None, *, what: str = "Parquet file") -> pa.Table:
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
            raise ValueError(f"{what} {str(path)!r} lacks columns {missing}")
        return pq.read_table(path, columns=list(columns) if columns is not None else None, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{what} {str(path)!r} is not a readable Parquet file (truncated or corrupt): {one_line(error)}") from None


def shard_checksums(directory: str | os.PathLike) -> dict[str, str]:
    """{relative path: SHA-256} of every shard of a dataset directory: the manifest's ``shard_sha256``."""
    directory = Path(directory)
    return {path.relative_to(directory).as_posix(): file_sha256(path) for path in sorted(directory.glob("*/shard-*.parquet"))}


def verify_shard(directory: Path, path: Path, checksums: dict[str, str]) -> None:
    """Raise `ValueError` naming `path` when its bytes differ from the SHA-256 the dataset's manifest
    recorded when it was written (a shard without a recorded checksum passes: older datasets)."""
    expected = checksums.get(path.relative_to(directory).as_posix())
    if expected is not None and file_sha256(path) != expected:
        raise ValueError(
            f"dataset shard {str(path)!r} differs from the SHA-256 its manifest recorded when it was written "
            "(changed or corrupted on disk); restore it, or regenerate the dataset in a new directory"
        )


def shard_paths(directory: str | os.PathLike, split: Split | None = None) -> list[Path]:
    """Completed shard files of a dataset directory (optionally one split), sorted."""
    directory = Path(directory)
    splits = [split] if split else list(SPLITS)
    return sorted(p for s in splits for p in (directory / s).glob("shard-*.parquet"))


def read_positions(source: str | os.PathLike, split: Split | None = None, columns: Iterable[str] | None = None) -> pa.Table:
    """Read a dataset directory (all shards of `split`, or both) or a single Parquet file.

    Raises `ValueError` naming the file when a shard is unreadable (truncated, scrambled pages), differs
    from the checksum the directory's manifest recorded, lacks schema columns or has columns of other types.
    """
    source = Path(source)
    paths = [source] if source.is_file() else shard_paths(source, split)
    if not paths:
        raise FileNotFoundError(f"no Parquet shards for split {split or 'any'} under {str(source)!r}")
    wanted = list(columns) if columns is not None else POSITION_SCHEMA.names
    checksums = read_manifest(source).get("shard_sha256", {}) if source.is_dir() else {}
    tables = []
    for path in paths:
        if checksums:
            verify_shard(source, path, checksums)
        table = read_parquet(path, wanted, what="dataset shard")
        try:
            tables.append(table.cast(pa.schema([POSITION_SCHEMA.field(n) for n in wanted])))
        except (pa.ArrowException, ValueError) as error:
            raise ValueError(f"dataset shard {str(path)!r} does not have the position schema: {one_line(error)}") from None
    return pa.concat_tables(tables)


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Write DIR/manifest.json atomically, stamping the schema version."""
    from chessgrpo.files import write_json_atomic

    write_json_atomic(Path(directory) / "manifest.json", {"schema_version": SCHEMA_VERSION, **manifest}, indent=2)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}
