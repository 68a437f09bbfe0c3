"""What code and machine produced a run: written by the training loop as ``RUN_DIR/run_info.json``
at the start of a fresh run, read by `chessgrpo report` (its "Run metadata" section).

Every field is best effort: a machine without git or /proc still trains, the field just says so.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

RUN_INFO_FILE = "run_info.json"
_SOURCE = Path(__file__).resolve().parent


def package_version(name: str) -> str:
    """The installed version of distribution `name`, or "not installed"."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(_SOURCE), *args], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_commit() -> str:
    """The git commit of the chessgrpo source in use, when it is a git checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return "unknown (git not available or not a git checkout)"
    return commit or "unknown (not a git checkout)"


def collect_run_info(device: str | None = None) -> dict[str, Any]:
    """The run_info.json payload for the current process (the format docs/report.md describes)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    gpu = None
    if device is not None and device.startswith("cuda"):
        try:
            import torch

            gpu = torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001 - metadata only: never stop a run over it
            gpu = None
    memory_gb = None
    try:
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "git_commit": source_commit(),
        "git_dirty": None if status is None else bool(status),
        "versions": {name: package_version(name) for name in ("chessgrpo", "torch", "chess")},
        "python": platform.python_version(),
        "hardware": {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "gpu": gpu, "memory_gb": memory_gb},
        "hostname": socket.gethostname(),
        "platform": f"{platform.system()} {platform.release()}",
        "command": " ".join(sys.argv),
        "started": time.time(),
    }
