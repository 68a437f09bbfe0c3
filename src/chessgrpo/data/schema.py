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
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows), schema=POSITION_SCHEMA)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)  # a killed writer leaves a .tmp file, never a truncated shard
    return path


def shard_paths(directory: str | os.PathLike, split: Split | None = None) -> list[Path]:
    """Completed shard files of a dataset directory (optionally one split), sorted."""
    directory = Path(directory)
    splits = [split] if split else list(SPLITS)
    return sorted(p for s in splits for p in (directory / s).glob("shard-*.parquet"))


def read_positions(source: str | os.PathLike, split: Split | None = None, columns: Iterable[str] | None = None) -> pa.Table:
    """Read a dataset directory (all shards of `split`, or both) or a single Parquet file.

    Raises `ValueError` naming the file when a shard is unreadable or lacks schema columns.
    """
    source = Path(source)
    paths = [source] if source.is_file() else shard_paths(source, split)
    if not paths:
        raise FileNotFoundError(f"no Parquet shards for split {split or 'any'} under {str(source)!r}")
    wanted = list(columns) if columns is not None else POSITION_SCHEMA.names
    tables = []
    for path in paths:
        try:
            file_schema = pq.read_schema(path)
        except (pa.ArrowException, OSError) as error:
            raise ValueError(f"dataset shard {str(path)!r} is not a readable Parquet file: {error}") from None
        missing = [name for name in wanted if name not in file_schema.names]
        if missing:
            raise ValueError(f"dataset shard {str(path)!r} lacks columns {missing}")
        tables.append(pq.read_table(path, columns=wanted).cast(pa.schema([POSITION_SCHEMA.field(n) for n in wanted])))
    return pa.concat_tables(tables)


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Write DIR/manifest.json atomically, stamping the schema version."""
    from chessgrpo.files import write_json_atomic

    write_json_atomic(Path(directory) / "manifest.json", {"schema_version": SCHEMA_VERSION, **manifest}, indent=2)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}
