"""The checks that judge a fault's outcome: two checkpoints' tensors byte for byte (`weights_difference`), metrics
and dataset rows (`rows_difference`, `dataset_difference`), a file tree before and after (`tree_digest`), and whether
a malformed input was refused with one clear line naming it (`error_problem`)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from chessgrpo.testing.faults import CommandResult


def tree_digest(*paths: str | os.PathLike) -> dict[str, str]:
    """SHA-256 of every file below `paths` (and the target of every symlink), by path. Directories
    themselves are not listed: an empty directory created or removed is no change."""
    digest: dict[str, str] = {}
    for root in map(Path, paths):
        files = [root] if not root.is_dir() or root.is_symlink() else sorted(root.rglob("*"))
        for path in files:
            if path.is_symlink():
                digest[str(path)] = f"-> {os.readlink(path)}"
            elif path.is_file():
                digest[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def digest_difference(before: Mapping[str, str], after: Mapping[str, str]) -> str | None:
    """None when equal, else which paths changed, appeared or vanished."""
    changed = sorted(p for p in before.keys() & after.keys() if before[p] != after[p])
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    if not (changed or added or removed):
        return None
    parts = [
        f"{label}: {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}"
        for label, paths in (("changed", changed), ("new", added), ("removed", removed))
        if paths
    ]
    return "; ".join(parts)


def safetensors_tensors(path: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every tensor of a safetensors file as (dtype, shape, raw bytes): a bitwise view, no torch."""
    data = Path(path).read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_size])
    body = data[8 + header_size :]
    return {
        name: (spec["dtype"], tuple(spec["shape"]), body[spec["data_offsets"][0] : spec["data_offsets"][1]])
        for name, spec in header.items()
        if name != "__metadata__"
    }


def checkpoint_weights(run_or_checkpoint: str | os.PathLike) -> dict[str, dict]:
    """The tensors of every ``*.safetensors`` file of a checkpoint (a run directory: its newest
    intact checkpoint), by file name."""
    from chessgrpo.train.checkpoint import is_step_dir, latest_checkpoint

    path = Path(run_or_checkpoint)
    checkpoint = path if is_step_dir(path) or not (path / "checkpoints").is_dir() else latest_checkpoint(path)
    if checkpoint is None:
        raise FileNotFoundError(f"{path}: no intact checkpoint")
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint}: no .safetensors file")
    return {file.name: safetensors_tensors(file) for file in files}


def weights_difference(a: str | os.PathLike, b: str | os.PathLike) -> str | None:
    """None when the newest intact checkpoints of `a` and `b` hold bitwise-equal tensors, else the
    first difference (file and tensor name)."""
    left, right = checkpoint_weights(a), checkpoint_weights(b)
    if left.keys() != right.keys():
        return f"weight files differ: {sorted(left)} vs {sorted(right)}"
    for file, tensors in left.items():
        other = right[file]
        if tensors.keys() != other.keys():
            return f"{file}: tensor names differ ({len(tensors)} vs {len(other)})"
        for name, value in tensors.items():
            if value != other[name]:
                return f"{file}: tensor {name} differs"
    return None


def metrics_rows(path: str | os.PathLike, ignore: Sequence[str] = ("time", "perf/")) -> list[dict]:
    """The rows of a metrics.jsonl without the keys that measure time (or start with `ignore`)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.append(
                {
                    k: v
                    for k, v in row.items()
                    if not any(k == p or (p.endswith("/") and k.startswith(p)) for p in ignore)
                }
            )
    return rows


def rows_difference(a: Sequence[Mapping], b: Sequence[Mapping], what: str = "row") -> str | None:
    """None when `a` and `b` are equal row for row, else the first difference."""
    for index, (left, right) in enumerate(zip(a, b)):
        if left != right:
            keys = sorted(k for k in left.keys() | right.keys() if left.get(k, "<absent>") != right.get(k, "<absent>"))
            return f"{what} {index} differs in {', '.join(map(str, keys[:4]))}{' ...' if len(keys) > 4 else ''}"
    if len(a) != len(b):
        return f"{len(a)} {what}s vs {len(b)}"
    return None


def parquet_rows(directory: str | os.PathLike) -> dict[str, list[dict]]:
    """Every row of every Parquet file below `directory`, by relative path, in file order."""
    import pyarrow.parquet as pq

    root = Path(directory)
    return {str(path.relative_to(root)): pq.read_table(path).to_pylist() for path in sorted(root.rglob("*.parquet"))}


def dataset_difference(a: str | os.PathLike, b: str | os.PathLike) -> str | None:
    """None when two dataset directories hold the same Parquet files with the same rows in the same
    order, else the first difference (an unreadable file is one)."""
    try:
        left = parquet_rows(a)
    except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        return f"{a}: unreadable ({type(error).__name__}: {error})"
    try:
        right = parquet_rows(b)
    except Exception as error:  # noqa: BLE001
        return f"{b}: unreadable ({type(error).__name__}: {error})"
    if left.keys() != right.keys():
        return f"shards differ: {sorted(left.keys() ^ right.keys())[:4]}"
    for name in left:
        if (problem := rows_difference(left[name], right[name], what=f"{name} row")) is not None:
            return problem
    return None


# --------------------------------------------------------------------------------------------
# Errors


MAX_ERROR_LINE = 400
"""An error line longer than this echoes too much of its input."""


def error_lines(stderr: str) -> list[str]:
    """The lines of `stderr` that are errors the CLI printed (``chessgrpo...``), not log lines."""
    return [line for line in stderr.splitlines() if line.startswith("chessgrpo")]


def warning_lines(stderr: str) -> list[str]:
    """The WARNING (and ERROR) log lines of `stderr` (the CLI's format: ``HH:MM:SS LEVEL name: ...``)."""
    return [line for line in stderr.splitlines() if " WARNING " in line[:20] or " ERROR " in line[:20]]


def error_problem(result: CommandResult, names: Sequence[str], *, skip_ok: bool = False) -> tuple[str, str] | None:
    """None when a command refused a malformed input cleanly, else (category, reason).

    Clean: a non-zero exit code, no traceback, exactly one error line (log lines may precede it),
    at most `MAX_ERROR_LINE` characters, containing one of `names` (the file, the key, the start
    of the bad string). With `skip_ok` (a bad row in a data file the command may skip), exit code
    0 with a warning line naming the input is clean too. Category ``crashed`` for a traceback, a
    signal, a hang or an unclear message; ``wrong`` when the malformed input was accepted silently."""
    if result.timed_out:
        return "crashed", f"hung (killed after {result.seconds:.0f} s)"
    if result.returncode is None or result.returncode < 0:
        return "crashed", f"killed by signal {-(result.returncode or 0)}"
    if "Traceback (most recent call last)" in result.stderr:
        last = [line for line in result.stderr.strip().splitlines() if line.strip()][-1:]
        return "crashed", f"traceback: {last[0][:200] if last else '?'}"
    if result.returncode == 0:
        named = [line for line in warning_lines(result.stderr) if any(name in line for name in names)]
        if skip_ok and named and all(len(line) <= MAX_ERROR_LINE for line in named):
            return None
        return "wrong", "accepted (exit code 0)" + (
            f"; the warning: {named[0][:200]}" if named else ", no warning naming it"
        )
    lines = error_lines(result.stderr)
    if len(lines) != 1:
        return "crashed", f"{len(lines)} error lines: {result.tail(2)}"
    [line] = lines
    if len(line) > MAX_ERROR_LINE:
        return "crashed", f"error line of {len(line)} characters"
    if not any(name in line for name in names):
        return "crashed", f"does not name {names[0]!r}: {line[:200]}"
    return None
