"""A persistent evaluation cache in SQLite (WAL mode, safe for several processes).

Keys are strings built by the pool from the engine identity, the search limit and the position
(FEN without move counters, plus the halfmove clock where the 50-move rule can matter); values
are JSON. Only successful searches are ever written, so a failure is never cached.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping


class EvaluationCache:
    """A key -> JSON store with hit/miss counters. Thread-safe; one connection per instance."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._connection = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False)
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=NORMAL")
            self._connection.execute("CREATE TABLE IF NOT EXISTS evaluations (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._connection.commit()
        except sqlite3.DatabaseError as error:
            raise RuntimeError(f"evaluation cache {str(self.path)!r} is not a usable SQLite database: {error}") from error
        self.hits = 0
        self.misses = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """Values of the keys present; counts a hit or a miss for each distinct key asked."""
        keys = list(dict.fromkeys(keys))
        found: dict[str, Any] = {}
        with self._lock:
            for start in range(0, len(keys), 500):  # stay below SQLite's host-parameter limit
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._connection.execute(f"SELECT key, value FROM evaluations WHERE key IN ({marks})", chunk)
                for key, value in rows:
                    found[key] = json.loads(value)
            self.hits += len(found)
            self.misses += len(keys) - len(found)
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
