"""The processes below a process, read from ``/proc`` (no psutil): one process's ``/proc/<pid>/stat`` (`ProcessInfo`:
parent pid, command name, state, start time), the descendants of a root, its engine processes, new processes as
they appear (`NewProcessWatcher`), and a signal sent only to the process that was seen (`send_signal` checks the
start time first, so a reused pid is never hit). The fault injectors of `testing.faults` find their victims here."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

ENGINE_NAMES = ("stockfish",)
"""Command-name prefixes (``/proc/<pid>/comm``, at most 15 characters) of engine processes."""

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

"""Clock ticks per second: the unit of a process's start time in ``/proc/<pid>/stat``."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """One line of ``/proc/<pid>/stat``: what fault injection needs to know about a process."""

    pid: int
    ppid: int
    comm: str
    state: str
    """R running, S sleeping, T stopped, Z zombie, ..."""
    start_ticks: int
    """Start time in clock ticks since boot: with the pid, the identity of a process."""

    @property
    def age_s(self) -> float:
        """Seconds since the process started (resolution: one clock tick, usually 10 ms)."""
        return max(0.0, _uptime_s() - self.start_ticks / CLOCK_TICKS)

    def is_engine(self, names: Sequence[str] = ENGINE_NAMES) -> bool:
        return self.state != "Z" and self.comm.startswith(tuple(names))


def _uptime_s() -> float:
    with open("/proc/uptime", "rb") as handle:
        return float(handle.read().split()[0])


def process_info(pid: int) -> ProcessInfo | None:
    """The process `pid`, or None when it does not exist (any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces and parentheses.
    open_paren, close_paren = data.find(b"("), data.rfind(b")")
    fields = data[close_paren + 2 :].split()
    return ProcessInfo(
        pid=pid,
        ppid=int(fields[1]),
        comm=data[open_paren + 1 : close_paren].decode(errors="replace"),
        state=fields[0].decode(),
        start_ticks=int(fields[19]),  # field 22 of stat; fields[0] is field 3
    )


def process_table() -> dict[int, ProcessInfo]:
    """Every process visible in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (info := process_info(int(name))) is not None:
            table[info.pid] = info
    return table


def descendants(root: int, table: Mapping[int, ProcessInfo] | None = None) -> list[ProcessInfo]:
    """Children, grandchildren, ... of `root` (not `root` itself), in pid order."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            found.append(table[child])
            frontier.append(child)
    return sorted(found, key=lambda info: info.pid)


def engine_processes(root: int, names: Sequence[str] = ENGINE_NAMES) -> list[ProcessInfo]:
    """Live engine processes below `root` (a pool's owner, a command, a game worker's parent)."""
    return [info for info in descendants(root) if info.is_engine(names)]


def send_signal(info: ProcessInfo, sig: int) -> bool:
    """Send `sig` to the process `info` describes, unless it is gone or its pid was reused."""
    now = process_info(info.pid)
    if now is None or now.start_ticks != info.start_ticks or now.state == "Z":
        return False
    try:
        os.kill(info.pid, sig)
    except ProcessLookupError:
        return False
    return True


class NewProcessWatcher:
    """New descendants of `root` as they appear, cheaply enough to poll every few milliseconds.

    Each poll lists /proc (pids only) and reads the stat file of the pids not listed last time;
    a parent always exists before its child, so checking new pids in order against the set of
    known descendants finds them all. (Pids wrap around, so "new" cannot mean "higher".)"""

    def __init__(self, root: int):
        self.root = root
        self._known = {info.pid for info in descendants(root)}
        self._listed = _pids()

    def poll(self) -> list[ProcessInfo]:
        """Descendants started since the last poll, in pid order."""
        listed = _pids()
        fresh = []
        for pid in sorted(listed - self._listed):
            info = process_info(pid)
            if info is not None and (info.ppid == self.root or info.ppid in self._known):
                self._known.add(pid)
                fresh.append(info)
        self._listed = listed
        return fresh


def _pids() -> set[int]:
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}
