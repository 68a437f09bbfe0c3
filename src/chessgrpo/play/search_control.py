"""What one UCI ``go`` asks for and when its search stops: the limits (`parse_go`: ``nodes``,
``movetime``, the clock with simple time management in `clock_seconds`), the other arguments
(`parse_go_flags`: ``infinite``, ``ponder``, ``searchmoves``), and the stop rule the protocol thread
and the search thread share (`SearchControl`: ``stop``, ``ponderhit``, node limit, deadline).

The protocol that uses them is `chessgrpo.uci.engine`; ``docs/uci.md`` has the user's view.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import chess

SEARCH_CHOICES = ("puct", "alphabeta", "none")
"""The UCI option ``Search`` (and ``chessgrpo uci --search``): PUCT, policy-pruned alpha-beta, or the policy's own move."""
MAX_NODES = 100_000
"""The most nodes one ``go`` searches, also when only time limits it or ``infinite`` (bounds the tree's memory: ~4 kB a node)."""
MOVE_OVERHEAD_MS = 50
"""Kept back from every time limit by default (the UCI option ``Move Overhead``): the pipe, the GUI and the batch
the search finishes."""
MAX_MOVE_OVERHEAD_MS = 5000
NODE_BYTES = 4096
"""The search tree's memory per node (about 4 kB): ``Hash`` MiB hold ``Hash * 2**20 / NODE_BYTES`` nodes."""
DEFAULT_HASH_MB = -(-MAX_NODES * NODE_BYTES // 2**20)
"""The default ``Hash``: what `MAX_NODES` nodes take (391 MiB); a larger Hash changes nothing."""

DEFAULT_MOVES_TO_GO = 30
"""Moves the remaining clock time is spread over when the GUI gives no ``movestogo``."""
INCREMENT_SHARE = 0.75
MAX_CLOCK_FRACTION = 0.2
"""One move never takes more than this share of the remaining clock time."""
MIN_SEARCH_SECONDS = 0.001
STEP_DECAY = 0.9
"""The guess of one search step's time is the longest recent gap between two ``should_stop`` questions: each
question it shrinks by this factor, so it follows the last network call (a PUCT batch asks 16 questions, one
of them after the call) and forgets a one-off stall within a batch or two."""


def hash_nodes(hash_mb: int) -> int:
    """The most nodes a tree of `hash_mb` MiB holds (at least 1, at most `MAX_NODES`)."""
    return max(1, min(MAX_NODES, hash_mb * 2**20 // NODE_BYTES))


@dataclasses.dataclass(frozen=True)
class GoLimits:
    """What one ``go`` searches: `nodes` always, `seconds` when a time limit applies."""

    nodes: int
    seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class GoFlags:
    """The ``go`` arguments that are not limits: ``infinite``, ``ponder`` and ``searchmoves``'s moves (as given)."""

    infinite: bool = False
    ponder: bool = False
    searchmoves: tuple[str, ...] = ()


INTEGER_ARGUMENTS = ("wtime", "btime", "winc", "binc", "movestogo", "movetime", "nodes", "depth", "mate")
GO_KEYWORDS = frozenset(INTEGER_ARGUMENTS) | {"infinite", "ponder", "searchmoves"}


def parse_go(
    arguments: list[str],
    turn: chess.Color,
    default_nodes: int,
    *,
    overhead_ms: int = MOVE_OVERHEAD_MS,
    max_nodes: int = MAX_NODES,
) -> tuple[GoLimits, list[str]]:
    """The limits of ``go <arguments>`` for the side `turn`, and a description of every argument
    that was malformed and ignored.

    ``nodes`` caps the nodes (at most `max_nodes`: `MAX_NODES`, or fewer under a small ``Hash``);
    ``movetime`` or else the clock (`clock_seconds`, less `overhead_ms`) sets the time. A time limit
    without ``nodes`` searches up to `max_nodes`; neither (``depth``, ``mate``, ``infinite``, nothing)
    searches `default_nodes`. ``infinite``, ``ponder`` and ``searchmoves`` are `parse_go_flags`'s.
    """
    values: dict[str, int] = {}
    problems: list[str] = []
    index = 0
    while index < len(arguments):
        key = arguments[index]
        if key in INTEGER_ARGUMENTS:
            text = arguments[index + 1] if index + 1 < len(arguments) else ""
            try:
                values[key] = int(text)
                index += 1
            except ValueError:
                problems.append(f"go {key} needs an integer, got {text[:20]!r}; ignored")
        index += 1  # other tokens (infinite, ponder, searchmoves and its moves): parse_go_flags
    seconds = None
    if "movetime" in values:
        seconds = movetime_seconds(values["movetime"], overhead_ms)
    else:
        clock, increment = ("wtime", "winc") if turn == chess.WHITE else ("btime", "binc")
        if clock in values:
            seconds = clock_seconds(values[clock], values.get(increment, 0), values.get("movestogo", 0), overhead_ms)
    if "nodes" in values:
        nodes = values["nodes"]
    else:
        nodes = max_nodes if seconds is not None else default_nodes
    return GoLimits(nodes=min(max(nodes, 1), max_nodes), seconds=seconds), problems


def parse_go_flags(arguments: list[str]) -> GoFlags:
    """``infinite``, ``ponder`` and the tokens after ``searchmoves`` up to the next ``go`` keyword."""
    searchmoves: list[str] = []
    index = 0
    while index < len(arguments):
        if arguments[index] == "searchmoves":
            index += 1
            while index < len(arguments) and arguments[index] not in GO_KEYWORDS:
                searchmoves.append(arguments[index])
                index += 1
            continue
        index += 1
    return GoFlags(infinite="infinite" in arguments, ponder="ponder" in arguments, searchmoves=tuple(searchmoves))


def movetime_seconds(movetime_ms: int, overhead_ms: int = MOVE_OVERHEAD_MS) -> float:
    """``go movetime MS``: MS less the overhead (``Move Overhead``, at most half of MS)."""
    movetime_ms = max(movetime_ms, 0)
    return max((movetime_ms - min(overhead_ms, movetime_ms / 2)) / 1000, MIN_SEARCH_SECONDS)


def clock_seconds(
    remaining_ms: int, increment_ms: int = 0, moves_to_go: int = 0, overhead_ms: int = MOVE_OVERHEAD_MS
) -> float:
    """The time for one move from the clock: with ``usable = remaining - overhead_ms`` (``Move Overhead``),

        min(usable / (movestogo or 30) + 0.75 * increment, usable / 5)

    so the clock is spread over the moves still to play, the increment is mostly spent, and no
    move takes more than a fifth of what is left (at least `MIN_SEARCH_SECONDS`).
    """
    usable = max(remaining_ms - overhead_ms, 0)
    moves = moves_to_go if moves_to_go > 0 else DEFAULT_MOVES_TO_GO
    target = usable / moves + INCREMENT_SHARE * max(increment_ms, 0)
    return max(min(target, MAX_CLOCK_FRACTION * usable) / 1000, MIN_SEARCH_SECONDS)


class SearchControl:
    """When a running search stops, shared by the protocol thread and the search thread.

    A plain ``go`` stops at its node limit or deadline. ``infinite`` and an unanswered ``ponder``
    are *unbounded*: the search grows up to `MAX_NODES`, then `wait_for_release` holds the
    ``bestmove`` back until ``stop`` (or, for ``ponder``, ``ponderhit``, which starts the
    ``go`` limits' clock).

    The deadline is kept by never *starting* a step that would end past it: the search asks
    `should_stop` between its steps (a PUCT batch, an alpha-beta network call), and one step of a
    larger network on a CPU takes a few hundred ms, more than a bullet increment. The guess of the
    next step's time (`step_seconds`) is the longest recent gap between two questions (fading by
    `STEP_DECAY` a question); the first question, after the root's evaluation and the first call's
    warm-up, uses the last search's guess (`next_step_seed`).

    A ``ponder`` search that misses (``stop``) still finishes its step in flight, on the engine's
    clock. So while pondering it takes no step longer than the ``go``'s own time budget: it waits
    between steps for ``ponderhit`` or ``stop`` instead (`should_stop`).
    """

    def __init__(
        self,
        limits: GoLimits,
        *,
        infinite: bool = False,
        ponder: bool = False,
        started: float | None = None,
        step_seconds: float = 0.0,
    ):
        self.limits = limits
        self.started = time.perf_counter() if started is None else started
        self.step_seconds = max(step_seconds, 0.0)
        """The guess of one search step's time: the last search's (`next_step_seed`) until a step is seen."""
        self._last_question: float | None = None
        self._saw_step = False
        self.infinite = infinite
        self._pondering = ponder
        self._stopped = False
        self._condition = threading.Condition()
        bounded = not (infinite or ponder)
        self.deadline = self.started + limits.seconds if bounded and limits.seconds is not None else None

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def pondering(self) -> bool:
        return self._pondering

    @property
    def unbounded(self) -> bool:
        return self.infinite or self._pondering

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    def ponderhit(self) -> None:
        """The opponent played the expected move: the ``go`` limits apply from now."""
        with self._condition:
            if self._pondering:
                self._pondering = False
                if not self.infinite and self.limits.seconds is not None:
                    self.deadline = time.perf_counter() + self.limits.seconds
            self._condition.notify_all()

    def node_limit(self) -> int:
        """The nodes the search may run now (`MAX_NODES` while unbounded, the ``go`` limit after ``ponderhit``)."""
        return MAX_NODES if self.unbounded else self.limits.nodes

    def should_stop(self, nodes: int) -> bool:
        """The search's ``should_stop`` hook (`chessgrpo.search.base`): True when it must not grow
        to `nodes` nodes: after ``stop``, beyond the node limit, or when a step begun now would end
        past the deadline (a step's time guessed as `step_seconds`)."""
        now = time.perf_counter()
        if self._last_question is not None:  # before the first question: the root and warm-up, not a step
            self.step_seconds = max(now - self._last_question, STEP_DECAY * self.step_seconds)
            self._saw_step = True
        self._last_question = now
        seconds = self.limits.seconds
        if self._pondering and seconds is not None and self.step_seconds >= seconds:
            with self._condition:  # a missed ponder would wait out this step: wait here, with nothing in flight
                self._condition.wait_for(lambda: self._stopped or not self._pondering)
            now = self._last_question = time.perf_counter()  # the wait is no step
        if self._stopped or nodes > self.node_limit():
            return True
        deadline = self.deadline
        return deadline is not None and now + self.step_seconds >= deadline

    def next_step_seed(self) -> float:
        """`step_seconds` for the next search: this one's last guess; faded by `STEP_DECAY` when this search saw no
        step (it stopped before one): an unchecked guess, say from before a faster device, must not stop every
        search for ever."""
        return self.step_seconds if self._saw_step else STEP_DECAY * self.step_seconds

    def wait_for_release(self) -> None:
        """Block while the search is unbounded and not stopped (an answer ready early waits for ``stop``)."""
        with self._condition:
            self._condition.wait_for(lambda: self._stopped or not self.unbounded)
