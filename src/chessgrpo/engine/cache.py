"""A persistent evaluation cache in SQLite (WAL mode, safe for several processes).

Keys are strings built by the pool from the engine identity, the search limit and the position
(FEN without move counters, plus the halfmove clock where the 50-move rule can matter); values
are JSON. Only successful searches are ever written, so a failure is never cached.

A value that does not read back (not JSON, or not the shape `is_search_value` expects: a torn
write, a disk error, another program's row) is deleted and reported as a miss, with one warning
naming the cache file; the pool then searches the position again and writes a good value.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from chessgrpo.errors import ChessGRPOError, one_line

logger = logging.getLogger(__name__)


class CacheError(ChessGRPOError, RuntimeError):
    """The cache file is not a usable SQLite database (the message names it)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_search_value(value: Any) -> bool:
    """True when `value` has the shape the pool caches for a search (`pool_workers.result_to_json`):
    ``{"best": UCI or null, "lines": [[cp, mate, pv, depth, nodes], ...]}`` with cp and mate
    integers or null, pv a list of move strings, depth and nodes integers."""
    if not isinstance(value, dict) or not isinstance(value.get("lines"), list) or "best" not in value:
        return False
    if not value["lines"]:  # the pool only searches (and caches) positions with legal moves
        return False
    if value["best"] is not None and not isinstance(value["best"], str):
        return False
    for line in value["lines"]:
        if not isinstance(line, list) or len(line) != 5:
            return False
        cp, mate, pv, depth, nodes = line
        if not all(x is None or _is_int(x) for x in (cp, mate)) or not (_is_int(depth) and _is_int(nodes)):
            return False
        if not isinstance(pv, list) or not all(isinstance(move, str) for move in pv):
            return False
    return True


class EvaluationCache:
    """A key -> JSON store with hit/miss counters. Thread-safe; one connection per instance.

    `validate` checks each value read (default `is_search_value`, what the pool stores; None
    accepts any JSON): a value that fails it, or is not JSON, is deleted and counted as a miss.
    """

    def __init__(self, path: str | Path, validate: Callable[[Any], bool] | None = is_search_value):
        self.path = Path(path)
        self.validate = validate
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._connection = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False)
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=NORMAL")
            self._connection.execute(
                "CREATE TABLE IF NOT EXISTS evaluations (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            self._connection.commit()
        except sqlite3.DatabaseError as error:
            raise CacheError(
                f"evaluation cache {str(self.path)!r} is not a usable SQLite database: {one_line(error)}"
            ) from error
        self.hits = 0
        self.misses = 0
        self.dropped = 0
        """Unreadable entries deleted so far (each was searched again by the caller)."""

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def _decode(self, value: Any) -> tuple[bool, Any]:
        """(True, the value) when the stored text is JSON that passes `validate`; else (False, None)."""
        try:
            decoded = json.loads(value)
        except (TypeError, ValueError, RecursionError):  # not text, not JSON, absurdly nested
            return False, None
        if self.validate is not None and not self.validate(decoded):
            return False, None
        return True, decoded

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """Values of the keys present; counts a hit or a miss for each distinct key asked.

        An unreadable entry is deleted and counts as a miss (the caller searches it again); the
        first one per cache logs a warning naming the cache file.
        """
        keys = list(dict.fromkeys(keys))
        found: dict[str, Any] = {}
        bad: list[tuple[str, Any]] = []
        with self._lock:
            try:
                for start in range(0, len(keys), 500):  # stay below SQLite's host-parameter limit
                    chunk = keys[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    rows = self._connection.execute(f"SELECT key, value FROM evaluations WHERE key IN ({marks})", chunk)
                    for key, value in rows:
                        ok, decoded = self._decode(value)
                        if ok:
                            found[key] = decoded
                        else:
                            bad.append((key, value))
            except sqlite3.DatabaseError as error:
                raise CacheError(f"evaluation cache {str(self.path)!r} cannot be read: {one_line(error)}") from None
            if bad:
                try:
                    with self._connection:  # only the value read: another process may have rewritten it since
                        self._connection.executemany("DELETE FROM evaluations WHERE key = ? AND value IS ?", bad)
                except sqlite3.DatabaseError as error:  # e.g. locked: the fresh value replaces it anyway
                    logger.debug("evaluation cache %s: could not delete unreadable entries: %s", self.path, error)
            self.hits += len(found)
            self.misses += len(keys) - len(found)
            if bad and not self.dropped:
                logger.warning(
                    "evaluation cache %s: dropped %d unreadable entr%s (e.g. key %s); searching again",
                    self.path,
                    len(bad),
                    "y" if len(bad) == 1 else "ies",
                    bad[0][0][:200],
                )
            self.dropped += len(bad)
        return found

    def put_many(self, items: Mapping[str, Any]) -> None:
        if not items:
            return
        rows = [(key, json.dumps(value, separators=(",", ":"))) for key, value in items.items()]
        with self._lock:
            with self._connection:  # one transaction per batch
                self._connection.executemany("INSERT OR REPLACE INTO evaluations (key, value) VALUES (?, ?)", rows)

    def __len__(self) -> int:
        with self._lock:
            return self._connection.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._connection.close()
