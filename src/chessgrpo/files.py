"""Atomic file writes and checkpoint manifests: the one place that writes files crash-safely.

Every writer here writes into a temporary file beside the target, fsyncs it and renames it over
the target, so a reader (or a process killed mid-write) sees the old file or the new one, never
half of one.

A *manifest* (``manifest.json``) lists every file of a directory with its size and SHA-256. A
checkpoint directory counts as complete only when its manifest exists and every listed file
matches (`verify_manifest`); loaders use `newest_intact_checkpoint` to skip a truncated or
half-written checkpoint with a warning and fall back to the newest intact one.

Readers of untrusted text (`read_text`, `text_lines`) decode UTF-8 themselves, so a file with a
stray byte fails with one `ValueError` naming the file, the line and the byte offset instead of a
codec error that names neither. `open_decompressed` opens a plain, gzip or zstd file by its magic
bytes, so the same readers take the Lichess databases as they are published (``.csv.zst``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from chessgrpo.errors import InputError, one_line

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
CHECKPOINTS_DIR = "checkpoints"
STEP_DIR = re.compile(r"^step_(\d{6,})$")


def fsync_path(path: Path) -> None:
    """fsync a file or directory (so a rename that follows is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` via a temporary file, fsync and rename (parent created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """`write_bytes_atomic` for UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, payload: Any, *, indent: int | None = 1) -> Path:
    """Write `payload` as JSON atomically, so readers never see half a file."""
    return write_text_atomic(path, json.dumps(payload, indent=indent))


# ------------------------------------------------------------------------------------------------
# Reading untrusted text


def _not_utf8(path: str | os.PathLike, line: int, offset: int, byte: int) -> InputError:
    return InputError(f"{path}:{line}: not a UTF-8 text file (byte 0x{byte:02x} at byte offset {offset})")


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of `path` with universal newlines and without a byte-order mark.

    Raises `FileNotFoundError` for a missing file and `ValueError` naming the file for anything
    else: undecodable bytes (with the line and byte offset of the first one), a directory, no
    permission.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as error:
        raise InputError(f"{path}: cannot read it: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        start = error.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        raise _not_utf8(path, data.count(b"\n", 0, start) + 1, start, data[start]) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def text_lines(lines: Iterable[bytes], path: str | os.PathLike) -> Iterator[str]:
    """Decode the byte lines of a file opened in binary mode (line endings kept; a byte-order mark
    dropped), raising one `ValueError` that names `path`, the line and the byte offset of the first
    byte that is not UTF-8. Line by line, so a stray byte is reported where it is, and a file is
    never read whole."""
    offset = 0
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            start = error.start + (3 if number == 1 and raw.startswith(b"\xef\xbb\xbf") else 0)
            raise _not_utf8(path, number, offset + start, raw[start]) from None
        offset += len(raw)
        yield text


GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def compression_of(path: str | os.PathLike) -> str | None:
    """ "gzip" or "zstd" when the first bytes of `path` say so (whatever its name), else None."""
    with open(path, "rb") as probe:
        magic = probe.read(4)
    if magic.startswith(GZIP_MAGIC):
        return "gzip"
    if magic == ZSTD_MAGIC:
        return "zstd"
    return None


class CorruptCompressedFile(InputError):
    """A gzip or zstd file that is truncated or corrupt (the message names it)."""


class _Decompressing(io.RawIOBase):
    """A decompressing byte stream whose read errors (truncated or corrupt data) are one
    `ValueError` naming the file, instead of a codec's bare EOFError or OSError."""

    def __init__(self, stream: Any, path: Path, codec: str):
        self._stream, self._path, self._codec = stream, path, codec

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            # read1: what the decompressor has now, so the data before a truncation is delivered
            # before the error (readinto would try to fill the buffer and lose it).
            data = (getattr(self._stream, "read1", None) or self._stream.read)(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        except (
            OSError,
            EOFError,
            ValueError,
            zlib.error,
        ) as error:  # pyarrow: OSError/ArrowInvalid; gzip: EOFError, zlib.error
            raise CorruptCompressedFile(
                f"{self._path}: truncated or corrupt {self._codec} file: {one_line(error)}"
            ) from None

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            super().close()


def open_decompressed(path: str | os.PathLike) -> BinaryIO:
    """`path` opened for reading bytes, decompressed when its magic bytes say gzip or zstd.

    The Lichess databases ship as ``.zst`` (zstd; decompressed by pyarrow, already a dependency)
    and older dumps as ``.gz``; a plain file is opened as it is. Iterating the result gives byte
    lines, for `text_lines`. A truncated or corrupt compressed file raises one `ValueError` naming
    it when the bad data is reached; opening errors are `OSError`s as from `open`.
    """
    path = Path(path)
    codec = compression_of(path)
    if codec is None:
        return path.open("rb")
    if codec == "gzip":
        import gzip

        stream: Any = gzip.open(path, "rb")
    else:
        import pyarrow as pa

        stream = pa.CompressedInputStream(pa.OSFile(str(path)), "zstd")
    # Small reads: a truncated stream fails only after the whole blocks before the damage were read
    # (a larger read-ahead would lose them, e.g. the games an import could still write as whole shards).
    return io.BufferedReader(_Decompressing(stream, path, codec), buffer_size=io.DEFAULT_BUFFER_SIZE)


# ------------------------------------------------------------------------------------------------
# Manifests


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
    """Write ``manifest.json`` listing every regular file under `directory` (size and SHA-256)."""
    directory = Path(directory)
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MANIFEST_FILE:
            files[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    return write_json_atomic(directory / MANIFEST_FILE, {"files": files, **(extra or {})})


def verify_manifest(directory: str | os.PathLike) -> str | None:
    """None when every file listed in `directory`'s manifest matches it; else what is wrong.

    A directory without a manifest (a checkpoint from before manifests) is accepted unverified."""
    directory = Path(directory)
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        # Checkpoints of versions before manifests: their directory rename was atomic, so accept them.
        logger.debug("%s has no %s (written before manifests); not verified", directory, MANIFEST_FILE)
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{MANIFEST_FILE} is unreadable ({error})"
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes, the manifest says {expected['size']}"
        if file_sha256(path) != expected["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def step_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every ``checkpoints/step_NNNNNN`` directory of a run as (step, path), oldest first (unverified)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def newest_intact_checkpoint(run_dir: str | os.PathLike, *, warn: bool = True) -> Path | None:
    """The newest checkpoint directory of a run whose manifest verifies, or None.

    A newer checkpoint that fails verification (truncated weights, a missing file, no manifest)
    is skipped with a warning naming it and what is wrong with it.
    """
    for _step, directory in reversed(step_checkpoints(run_dir)):
        problem = verify_manifest(directory)
        if problem is None:
            return directory.resolve()
        if warn:
            logger.warning("skipping checkpoint %s: %s", directory, problem)
    return None


def resolve_model_directory(path: str | os.PathLike, is_model_dir: Any) -> Path | None:
    """A model directory from itself, a run directory or its checkpoints/ directory.

    `path` itself wins when `is_model_dir(path)` holds and it is not a corrupt checkpoint (a
    ``step_NNNNNN`` directory with a failing manifest is an error, not silently used). For a run
    directory (or its checkpoints/) the newest intact checkpoint is used. None when nothing fits.
    """
    path = Path(path)
    if is_model_dir(path) and not (path / CHECKPOINTS_DIR).is_dir():
        if (path / MANIFEST_FILE).is_file():
            problem = verify_manifest(path)
            if problem is not None:
                raise_corrupt(path, problem)
        return path.resolve()
    run_dir = path.parent if path.name == CHECKPOINTS_DIR else path
    if (run_dir / CHECKPOINTS_DIR).is_dir():
        checkpoint = newest_intact_checkpoint(run_dir)
        if checkpoint is not None and is_model_dir(checkpoint):
            return checkpoint
    return None


def raise_corrupt(path: Path, problem: str) -> None:
    from chessgrpo.errors import CheckpointError

    raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or incomplete: {problem}")
