"""The engine pool's processes and their worker threads (`EngineWorkers`), and what they work with: the search
limit (`SearchLimit`), the retry budgets (`RetryPolicy`), the pool's counters (`PoolStats`) and one queued search
(`SearchTask`). One thread per UCI process takes searches from a shared priority queue and runs each to completion;
a process that fails to start, crashes or hangs is killed and replaced after a backoff and the search is run again
from scratch, within the `RetryPolicy`'s budgets (`engine.pool`'s docstring has the whole design).
`engine.pool.EnginePool` is the front end: it validates positions, answers from the cache and queues the rest here.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import queue
import random
import re
import threading
import time
from pathlib import Path

import chess

from chessgrpo.engine.locate import EngineError
from chessgrpo.engine.uci import EngineUnsupported, SearchResult, UciProcess

logger = logging.getLogger(__name__)

_UCI_MOVE = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")


@dataclasses.dataclass(frozen=True)
class SearchLimit:
    """A node or depth limit; exactly one is set."""

    nodes: int | None = None
    depth: int | None = None

    def __post_init__(self) -> None:
        if (self.nodes is None) == (self.depth is None):
            raise ValueError(f"give exactly one search limit: nodes={self.nodes}, depth={self.depth}")
        value = self.nodes if self.nodes is not None else self.depth
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"search limit must be a positive integer, got {value!r}")

    def __str__(self) -> str:
        return f"nodes={self.nodes}" if self.nodes is not None else f"depth={self.depth}"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How the pool retries engine faults (see the module docstring)."""

    retries_per_position: int = 3
    """Fresh-engine retries of one search before the run stops with an error naming the position."""
    max_failures: int = 1000
    """Engine faults (crashes, hangs, failed starts) the pool tolerates in its lifetime; one more
    stops the run. A fault storm this large means the engine or the machine is broken."""
    startup_attempts: int = 5
    """Attempts to start (and handshake) one engine process before giving up."""
    backoff_s: float = 0.05
    """First retry delay; doubled on each further attempt, plus up to 100% random jitter."""
    max_backoff_s: float = 2.0
    """Cap of the retry delay."""

    def __post_init__(self) -> None:
        for name in ("retries_per_position", "max_failures"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.startup_attempts < 1:
            raise ValueError(f"startup_attempts must be >= 1, got {self.startup_attempts}")
        if not (0 <= self.backoff_s <= self.max_backoff_s):
            raise ValueError(f"need 0 <= backoff_s <= max_backoff_s, got {self.backoff_s} and {self.max_backoff_s}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number `attempt` (0-based): exponential, capped, jittered."""
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return base * (1.0 + rng.random())


@dataclasses.dataclass
class PoolStats:
    """Counters since the pool started."""

    searches: int = 0
    """Engine searches completed (cache hits and terminal positions excluded)."""
    search_seconds: float = 0.0
    """Wall time spent inside batches waiting for engines."""
    retries: int = 0
    """Searches retried on a fresh process after a crash or timeout."""
    failures: int = 0
    """Searches that exhausted their retries and raised `EngineError`."""
    engine_failures: int = 0
    """Engine faults seen (crashes, timeouts, failed starts), each counted against `max_failures`."""
    restarts: int = 0
    """Engine processes started to replace a failed one."""
    cache_hits: int = 0
    cache_misses: int = 0

    @property
    def cache_hit_rate(self) -> float:
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if total else 0.0


@dataclasses.dataclass(frozen=True)
class SearchTask:
    """One queued search: the position as the engine sees it, its limit and how many lines (MultiPV)."""

    fen: str  # normalised FEN sent to the engine
    limit: SearchLimit
    multipv: int


class EngineWorkers:
    """The pool's engine processes, one worker thread each, fed by one priority queue (`submit`).

    Construction starts every process (in parallel, each with start-up retries; a binary that never starts raises
    its error and the processes that did start are shut down); `start` then starts the threads. A worker delivers
    each search's result or error to its future, never swallowing one."""

    def __init__(
        self,
        path: Path,
        processes: int,
        *,
        threads: int,
        hash_mb: int,
        timeout_s: float,
        clear_hash: bool,
        retry: RetryPolicy,
        stats: PoolStats,
        stats_lock: threading.Lock,
    ):
        self.path = path
        self.retry = retry
        self._jitter = random.Random()  # retry delays only: results never depend on it
        self.processes = processes
        self.threads = threads
        self.hash_mb = hash_mb
        self.timeout_s = timeout_s
        self.clear_hash = clear_hash
        self.stats = stats
        self._stats_lock = stats_lock
        # (priority, arrival, (task, future) or None to stop a worker): urgent searches (an opponent's
        # move the caller waits for) overtake background ones (rewards prefetched during a rollout).
        self._queue: queue.PriorityQueue[tuple[float, int, tuple[SearchTask, concurrent.futures.Future] | None]] = (
            queue.PriorityQueue()
        )
        self._arrival = itertools.count()
        self._engines: list[UciProcess | None] = [None] * self.processes
        self.engine_name = "engine"
        self._healthy = False  # set by the first complete search
        self._broken: EngineError | None = None  # set when the engine is known not to work at all

        # Start all processes in parallel, each with retries (an engine killed in its first
        # milliseconds is replaced); a binary that never starts is one clear error, and the
        # processes that did start are shut down rather than leaked.
        with concurrent.futures.ThreadPoolExecutor(self.processes) as starter:
            attempts = [starter.submit(self._start_engine) for _ in range(self.processes)]
        failures = [a.exception() for a in attempts if a.exception() is not None]
        if failures:
            for attempt in attempts:
                if attempt.exception() is None:
                    attempt.result().quit()
            raise failures[0]
        started = [attempt.result() for attempt in attempts]
        self._engines = list(started)
        self.engine_name = started[0].name or "unknown engine"
        self.engine_options = frozenset(started[0].options)
        """The options the engine advertised (lower-case names)."""
        self.is_stockfish = started[0].is_stockfish
        # Stockfish's moves are trusted (a python-chess board per search costs ~0.1 ms, a real share
        # of a small node-limited search); any other engine's bestmove is checked against the position.
        self._verify_moves = not self.is_stockfish

        self._threads = [
            threading.Thread(target=self._worker_loop, args=(slot,), name=f"engine-{slot}", daemon=True)
            for slot in range(self.processes)
        ]

    def start(self) -> None:
        """Start the worker threads."""
        for worker in self._threads:
            worker.start()

    def submit(self, priority: int, task: SearchTask, future: concurrent.futures.Future) -> None:
        """Queue `task`; its result (or error) is set on `future`. Lower `priority` is taken first, then arrival."""
        self._queue.put((priority, next(self._arrival), (task, future)))

    def new_batch(self) -> None:
        """Each batch gets its own chance: forget the engine found broken in an earlier batch (the fast failure is within
        a batch)."""
        self._broken = None

    @property
    def pids(self) -> list[int]:
        """Process ids of the running engines."""
        return [engine.pid for engine in self._engines if engine is not None]

    def close(self) -> None:
        """Stop the workers after every queued search, then the engines."""
        for _ in self._threads:
            self._queue.put((float("inf"), next(self._arrival), None))  # after every queued search
        for worker in self._threads:
            worker.join(timeout=self.timeout_s + 5)
        for engine in self._engines:
            if engine is not None:
                engine.quit()

    def _start_engine(self) -> UciProcess:
        """A fresh, handshaken engine (``uci``, options, ``isready``), retried with backoff.

        Each failed attempt counts as an engine fault; after `startup_attempts` the error names
        the binary and the last failure (a binary deleted mid-run ends here)."""
        last_error: EngineError | None = None
        for attempt in range(self.retry.startup_attempts):
            if attempt:
                time.sleep(self.retry.delay(attempt - 1, self._jitter))
            try:
                return UciProcess(
                    self.path,
                    threads=self.threads,
                    hash_mb=self.hash_mb,
                    startup_timeout_s=min(30.0, self.timeout_s),
                )
            except EngineError as error:
                last_error = error
                logger.warning(
                    "engine %s failed to start (attempt %d of %d): %s",
                    self.path,
                    attempt + 1,
                    self.retry.startup_attempts,
                    error,
                )
                self._count_engine_failure(f"starting {self.path}")
        reason = str(last_error).replace(f"cannot start engine {str(self.path)!r}: ", "")  # the path once
        raise EngineError(
            f"engine {str(self.path)!r} could not be started in {self.retry.startup_attempts} attempts: {reason}"
        )

    def _count_engine_failure(self, doing: str) -> None:
        """Count one engine fault against the pool's budget; raise when the budget is spent."""
        with self._stats_lock:
            self.stats.engine_failures += 1
            failures = self.stats.engine_failures
        if failures > self.retry.max_failures:
            raise EngineError(
                f"{self.engine_name} ({self.path}) failed {failures} times in this run, more than "
                f"engine.max_failures={self.retry.max_failures}; stopped while {doing}"
            )

    def _worker_loop(self, slot: int) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is None:
                return
            task, future = item
            if not future.set_running_or_notify_cancel():
                continue
            if self._broken is not None:  # no restarts for a search that cannot succeed
                future.set_exception(self._broken)
                continue
            try:
                future.set_result(self._search_with_retry(slot, task))
            except BaseException as exc:  # delivered to the caller, never swallowed
                future.set_exception(exc)

    def _search_with_retry(self, slot: int, task: SearchTask) -> SearchResult:
        """One complete search of `task` on slot `slot`'s engine, replacing the engine on faults.

        Partial output of a failed search is discarded, and a retry is a new search from scratch
        on a fresh process, so what is returned is what a healthy engine returns."""
        failures = 0
        while True:
            engine = self._engines[slot]
            try:
                if engine is None:
                    engine = self._engines[slot] = self._start_engine()
                    with self._stats_lock:
                        self.stats.restarts += 1
                try:
                    result = engine.search(
                        task.fen,
                        nodes=task.limit.nodes,
                        depth=task.limit.depth,
                        multipv=task.multipv,
                        clear_hash=self.clear_hash,
                        timeout_s=self.timeout_s,
                    )
                except (ValueError, IndexError) as error:  # output we cannot parse: a broken engine
                    raise EngineError(f"unparsable engine output ({error})") from error
                self._check_result(task, result)
                self._healthy = True
                return result
            except EngineUnsupported as error:  # retrying cannot help: one clear error, now
                if engine is not None:
                    engine.kill()
                    self._engines[slot] = None
                with self._stats_lock:
                    self.stats.failures += 1
                self._broken = EngineUnsupported(f"{error} (while searching {task.fen!r}, {task.limit})")
                raise self._broken from None
            except EngineError as error:
                failures += 1
                if engine is not None:
                    logger.warning(
                        "engine %d (pid %d) failed on %r (%s); replacing it", slot, engine.pid, task.fen, error
                    )
                    engine.kill()
                    self._engines[slot] = None
                    self._count_engine_failure(f"searching {task.fen!r} ({task.limit})")
                # else: the replacement never started (its start-up attempts, already counted, are
                # spent); a storm of kills can do that, so it is one more retry of this search.
                if failures > self.retry.retries_per_position:
                    with self._stats_lock:
                        self.stats.failures += 1
                    final = EngineError(
                        f"{self.engine_name} ({self.path}) failed {failures} times on position "
                        f"{task.fen!r} ({task.limit}, engine.retries_per_position="
                        f"{self.retry.retries_per_position}); last error: "
                        + str(error).replace(f"engine {str(self.path)!r} ", "the engine ", 1)  # the path once
                    )
                    if not self._healthy:  # not one search ever worked: the engine is broken
                        self._broken = final
                    raise final from None
                with self._stats_lock:
                    self.stats.retries += 1
                time.sleep(self.retry.delay(failures - 1, self._jitter))

    def _check_result(self, task: SearchTask, result: SearchResult) -> None:
        """`EngineError` (so the search is retried) unless `result` is a usable search of `task`:
        a legal best move (the pool only sends positions with legal moves) and a score."""
        best = result.best_move
        if best is None:
            sent = f"bestmove {result.bestmove_text}" if result.bestmove_text else "bestmove"
            raise EngineError(f"answered `{sent}` in a position with legal moves")
        if not _UCI_MOVE.match(best):
            raise EngineError(f"answered `bestmove {best}`, which is not a UCI move")
        if self._verify_moves and not chess.Board(task.fen).is_legal(chess.Move.from_uci(best)):
            raise EngineError(f"answered `bestmove {best}`, an illegal move in this position")
        if not result.lines:
            raise EngineError("sent no usable `info ... score` line (a score is what the search is for)")


def result_to_json(result: SearchResult) -> dict:
    """The cacheable form of a search: best move and [cp, mate, pv, depth, nodes] per rank."""
    return {
        "best": result.best_move,
        "lines": [[line.cp, line.mate, list(line.pv), line.depth, line.nodes] for line in result.lines],
    }
