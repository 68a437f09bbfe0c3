"""Fault injection into real processes, from the outside, and the checks that judge the outcome.

What `tests/test_faults.py` (the fast subset, in CI) and `bench/faults.py` (the whole matrix) share:

- **Finding engines** (`testing.processes`): `engine_processes(root)` walks ``/proc`` (``/proc/<pid>/stat``: parent pid,
  command name, start time) for the Stockfish processes below a process: a pool in this process
  (``root=os.getpid()``) or a ``chessgrpo`` command and its game workers. No psutil.
- **Injecting faults**: `EngineFaults` sends a signal (SIGKILL, or SIGSTOP for a hung engine) to a
  random engine every ``uniform(low, high)`` seconds from a seeded generator; `StartupKiller`
  kills new engine processes in their first milliseconds (during the UCI handshake), once each.
  Every signal is checked against the process's start time first, so a reused pid is never hit.
- **Killing a command**: `run_command` runs a command in its own session and can ``kill -9`` it
  after a delay or when a condition turns true (a checkpoint being written, a shard appearing),
  with an injector attached; afterwards it reaps whatever the kill orphaned and counts it.
- **Judging** (`testing.outcomes`): `weights_difference` (every tensor of two checkpoints, byte for byte),
  `rows_difference` (metrics rows, dataset rows), `tree_digest` (a file tree before and after),
  and `error_problem` (a malformed input must give one clear line naming it, no traceback).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from chessgrpo.testing.processes import (
    CLOCK_TICKS,
    ENGINE_NAMES,
    NewProcessWatcher,
    ProcessInfo,
    engine_processes,
    process_info,
    send_signal,
)

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
                    if info.age_s <= self.max_age_s + 1.0 / CLOCK_TICKS and len(self.faults) < self.limit:
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
