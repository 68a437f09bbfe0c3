"""A run directory belongs to one process at a time (docs/architecture.md, invariant 9).

`RunLock` creates ``RUN_DIR/.lock`` exclusively (``O_CREAT | O_EXCL``) holding the owner's PID and
host. A second process finds the file, sees that the PID is alive and stops with `RunLocked`
naming it; a lock whose process is dead (a killed run) is taken over with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from chessgrpo.errors import RunLocked

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """Hold ``RUN_DIR/.lock`` from `acquire` to `release` (or use as a context manager)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self.held = False
        self._created_dir = False

    def acquire(self) -> RunLock:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True)
            self._created_dir = True  # removed again on release if the run never wrote anything
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                host = holder.get("host")
                pid = holder.get("pid")
                if isinstance(pid, int) and (host not in (None, socket.gethostname()) or _alive(pid)):
                    raise RunLocked(
                        f"run directory {str(self.path.parent)!r} is in use by process {pid} on {host or 'this host'} "
                        f"(lock {self.path}); wait for it, stop it, or pick another run.name"
                    ) from None
                logger.warning(
                    "taking over the stale lock %s of process %s, which is no longer running", self.path, pid
                )
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump({"pid": os.getpid(), "host": socket.gethostname()}, handle)
            self.held = True
            return self
        raise RunLocked(f"could not take the lock {self.path} (another process keeps taking it)")

    def _holder(self) -> dict:
        for _attempt in range(3):
            try:
                data = json.loads(self.path.read_text() or "{}")
                if isinstance(data, dict) and data:
                    return data
            except (OSError, ValueError):
                pass
            time.sleep(0.1)  # the holder may be between creating the file and writing its PID
        return {}  # garbage: treated as stale

    def release(self) -> None:
        if self.held:
            holder = self._holder()
            if holder.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False
            if self._created_dir and not any(self.path.parent.iterdir()):
                self.path.parent.rmdir()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
