"""Fault injection into real processes, from the outside, and the checks that judge the outcome.

What `tests/test_faults.py` (the fast subset, in CI) and `bench/faults.py` (the whole matrix) share:

- **Finding engines**: `engine_processes(root)` walks ``/proc`` (``/proc/<pid>/stat``: parent pid,
  command name, start time) for the Stockfish processes below a process: a pool in this process
  (``root=os.getpid()``) or a ``chessgrpo`` command and its game workers. No psutil.
- **Injecting faults**: `EngineFaults` sends a signal (SIGKILL, or SIGSTOP for a hung engine) to a
  random engine every ``uniform(low, high)`` seconds from a seeded generator; `StartupKiller`
  kills new engine processes in their first milliseconds (during the UCI handshake), once each.
  Every signal is checked against the process's start time first, so a reused pid is never hit.
- **Killing a command**: `run_command` runs a command in its own session and can ``kill -9`` it
  after a delay or when a condition turns true (a checkpoint being written, a shard appearing),
  with an injector attached; afterwards it reaps whatever the kill orphaned and counts it.
- **Judging**: `weights_difference` (every tensor of two checkpoints, byte for byte),
  `rows_difference` (metrics rows, dataset rows), `tree_digest` (a file tree before and after),
  and `error_problem` (a malformed input must give one clear line naming it, no traceback).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import signal
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

ENGINE_NAMES = ("stockfish",)
"""Command-name prefixes (``/proc/<pid>/comm``, at most 15 characters) of engine processes."""

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------------
# /proc


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
        return max(0.0, _uptime_s() - self.start_ticks / _CLOCK_TICKS)

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


# --------------------------------------------------------------------------------------------
# Injectors


@dataclasses.dataclass(frozen=True)
class Fault:
    """One signal sent: when (seconds since the injector started), to whom, which."""

    at_s: float
    pid: int
    comm: str
    signal: str
    age_s: float


class _Injector(threading.Thread):
    """Common part: a daemon thread with a stop event, a fault log, and a context manager."""

    def __init__(self, root: int, *, names: Sequence[str], name: str):
        super().__init__(name=name, daemon=True)
        self.root = root
        self.names = tuple(names)
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()
        self._started_at = time.monotonic()

    def _record(self, info: ProcessInfo, sig: int) -> bool:
        age = info.age_s
        if not send_signal(info, sig):
            return False
        self.faults.append(
            Fault(time.monotonic() - self._started_at, info.pid, info.comm, signal.Signals(sig).name, age)
        )
        return True

    def run(self) -> None:
        try:
            self._loop()
        except Exception as error:  # pragma: no cover - reported by the caller, never silent
            self.errors.append(f"{type(error).__name__}: {error}")

    def _loop(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EngineFaults(_Injector):
    """Every ``uniform(*every)`` seconds, send `sig` to one random engine process below `root`.

    SIGKILL is a crash; SIGSTOP freezes the engine, which only a deadline (``engine.timeout_s``)
    notices. On `stop` every process this injector stopped and that is still alive gets SIGCONT,
    so nothing stays frozen after a test. The generator is seeded; which engines exist at each
    moment depends on timing, so the exact victims are not reproducible, the rates are."""

    def __init__(
        self,
        root: int,
        *,
        every: tuple[float, float] = (0.3, 1.0),
        sig: int = signal.SIGKILL,
        seed: int = 0,
        start_after_s: float = 0.0,
        max_faults: int | None = None,
        names: Sequence[str] = ENGINE_NAMES,
    ):
        super().__init__(root, names=names, name=f"engine-faults-{signal.Signals(sig).name}")
        if not 0 < every[0] <= every[1]:
            raise ValueError(f"need 0 < low <= high, got {every}")
        self.every = every
        self.sig = sig
        self.max_faults = max_faults
        self.start_after_s = start_after_s
        self._rng = random.Random(seed)
        self._stopped: list[ProcessInfo] = []

    def _loop(self) -> None:
        if self._stop_event.wait(self.start_after_s):
            return
        while not self._stop_event.wait(self._rng.uniform(*self.every)):
            if self.max_faults is not None and len(self.faults) >= self.max_faults:
                return
            victims = [info for info in engine_processes(self.root, self.names) if info.state != "T"]
            if victims and self._record(victim := self._rng.choice(victims), self.sig) and self.sig == signal.SIGSTOP:
                self._stopped.append(victim)

    def stop(self) -> None:
        super().stop()
        for info in self._stopped:
            send_signal(info, signal.SIGCONT)


class StartupKiller(_Injector):
    """Kill each new engine process below `root` while it is at most `max_age_s` old (in its UCI
    handshake), at most `limit` of them, then stop. Processes that existed before, and new ones
    first seen when already older, are spared; so is every process once `limit` are dead, so a
    pool that retries its start-up survives."""

    def __init__(
        self,
        root: int,
        *,
        limit: int,
        max_age_s: float = 0.05,
        poll_s: float = 0.003,
        names: Sequence[str] = ENGINE_NAMES,
    ):
        super().__init__(root, names=names, name="startup-killer")
        self.limit = limit
        self.max_age_s = max_age_s
        self.poll_s = poll_s
        self.missed = 0
        """New engines first seen too old to count as a start-up kill."""
        self._watcher = NewProcessWatcher(root)

    def _loop(self) -> None:
        # A child is seen between fork and exec under its parent's name: it stays pending until
        # it shows the engine's name (then judged by age) or is too old to become an engine.
        pending: dict[int, ProcessInfo] = {}
        while len(self.faults) < self.limit and not self._stop_event.wait(self.poll_s):
            for info in self._watcher.poll():
                pending[info.pid] = info
            for pid, seen in list(pending.items()):
                info = process_info(pid)
                if info is None or info.start_ticks != seen.start_ticks or info.state == "Z":
                    del pending[pid]
                elif info.is_engine(self.names):
                    del pending[pid]
                    # Ticks are 10 ms: an age just above max_age_s may be a few ms younger.
                    if info.age_s <= self.max_age_s + 1.0 / _CLOCK_TICKS and len(self.faults) < self.limit:
                        self._record(info, signal.SIGKILL)
                    else:
                        self.missed += 1
                elif info.age_s > 1.0:
                    del pending[pid]


class KillEnginesWhen(_Injector):
    """Once `trigger()` turns true (polled every 5 ms), call `before()` (e.g. delete the engine
    binary), then send `sig` to every engine below `root`, and to each new one, for `window_s`
    seconds. With a trigger such as "the run's last checkpoint exists" it hits a run that is
    shutting down; SIGSTOPped engines get SIGCONT on `stop`."""

    def __init__(
        self,
        root: int,
        trigger: Callable[[], bool],
        *,
        sig: int = signal.SIGKILL,
        window_s: float = 2.0,
        before: Callable[[], object] | None = None,
        names: Sequence[str] = ENGINE_NAMES,
    ):
        super().__init__(root, names=names, name="kill-engines-when")
        self.trigger = trigger
        self.sig = sig
        self.window_s = window_s
        self.before = before
        self.triggered_at: float | None = None
        self._hit: dict[int, ProcessInfo] = {}

    def _loop(self) -> None:
        while not self.trigger():
            if self._stop_event.wait(0.005):
                return
        self.triggered_at = time.monotonic() - self._started_at
        if self.before is not None:
            self.before()
        until = time.monotonic() + self.window_s
        while time.monotonic() < until and not self._stop_event.is_set():
            for info in engine_processes(self.root, self.names):
                if info.pid not in self._hit and info.state != "T" and self._record(info, self.sig):
                    self._hit[info.pid] = info
            self._stop_event.wait(0.01)

    def stop(self) -> None:
        super().stop()
        if self.sig == signal.SIGSTOP:
            for info in self._hit.values():
                send_signal(info, signal.SIGCONT)


# --------------------------------------------------------------------------------------------
# Commands


@dataclasses.dataclass
class CommandResult:
    """How a command ended, with what it printed and what was done to it."""

    args: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    killed: bool = False
    """We sent it SIGKILL (a planned kill -9, not a time-out)."""
    timed_out: bool = False
    leftovers: int = 0
    """Processes of its session still alive 3 s after it ended (then killed): orphans or leaks."""
    faults: list[Fault] = dataclasses.field(default_factory=list)
    injector_errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.killed and not self.timed_out

    def tail(self, lines: int = 3) -> str:
        text = (self.stderr or self.stdout).strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:])[:400]


Injector = Callable[[int], _Injector]
"""Builds an injector for the pid of the command it will attack."""


def run_command(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
    kill_after_s: float | None = None,
    kill_when: Callable[[], bool] | None = None,
    kill_poll_s: float = 0.01,
    injectors: Iterable[Injector] = (),
    stdin: str | None = None,
) -> CommandResult:
    """Run `args` in a new session; ``kill -9`` it after `kill_after_s` or once `kill_when()` is
    true (polled every `kill_poll_s`), with `injectors` attacking it while it runs.

    Only the command's own process is killed, as ``kill -9 PID`` does; what that orphans (engines,
    game workers) is given 3 s to notice and exit, then its session is killed and counted in
    `leftovers`. A command past `timeout_s` is killed with its whole session (`timed_out`)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        process = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=out,
            stderr=err,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            start_new_session=True,
        )
        if stdin is not None:
            try:
                process.stdin.write(stdin.encode())  # type: ignore[union-attr]
                process.stdin.close()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
        running = [build(process.pid) for build in injectors]
        for injector in running:
            injector.start()
        killed = timed_out = False
        try:
            while process.poll() is None:
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    _kill_session(process.pid)
                    timed_out = True
                    break
                if (kill_after_s is not None and elapsed >= kill_after_s) or (kill_when is not None and kill_when()):
                    process.kill()
                    killed = True
                    break
                time.sleep(kill_poll_s)
            process.wait()
        finally:
            for injector in running:
                injector.stop()
            if process.poll() is None:  # an exception in a condition: leave nothing behind
                _kill_session(process.pid)
                process.wait()
        seconds = time.monotonic() - started
        leftovers = _reap_session(process.pid)
        out.seek(0)
        err.seek(0)
        return CommandResult(
            args=list(args),
            returncode=process.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            seconds=seconds,
            killed=killed,
            timed_out=timed_out,
            leftovers=leftovers,
            faults=[f for i in running for f in i.faults],
            injector_errors=[e for i in running for e in i.errors],
        )


def _session_members(session: int) -> list[int]:
    """Live processes whose session id is `session` (field 6 of stat)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[3]) == session and fields[0] != b"Z":
            members.append(int(name))
    return members


def _kill_session(session: int) -> None:
    try:
        os.killpg(session, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_session(session: int, grace_s: float = 3.0) -> int:
    """Wait up to `grace_s` for the session's other processes to exit; kill and count the rest."""
    deadline = time.monotonic() + grace_s
    while (members := _session_members(session)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if members:
        _kill_session(session)
        for pid in members:  # a stopped process must be resumed to die of a queued signal on some kernels
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    return len(members)


# --------------------------------------------------------------------------------------------
# Comparisons


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
