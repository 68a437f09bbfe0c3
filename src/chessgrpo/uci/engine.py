"""The policy as a UCI engine (`chessgrpo uci --checkpoint CKPT`): plays in any chess GUI,
cutechess-cli, fastchess or lichess-bot. The protocol as implemented, option by option and with
the score conventions, is described in ``docs/uci.md``.

A chess language model plays through `chessgrpo.uci.lm.LMUciEngine`, this protocol loop with the
LM as the player (``docs/uci.md``, "The chess LM as a player").

When the checkpoint's policy has a value head, ``go`` **searches** (`chessgrpo.search`: PUCT by
default, or policy-pruned alpha-beta) under the ``go`` limits; without a value head, or with
``Search none``, it plays the policy's own move.

Supported commands (https://backscattering.de/chess/uci/):

- ``uci``: ``id name``/``id author``, the options, then ``uciok``. Options:

  - ``Search`` (combo ``puct``/``alphabeta``/``none``, default puct): ``none`` = the policy's move
    without search (the only choice for a checkpoint without a value head, which falls back to
    it and says so once with an ``info string`` at the first ``go``).
  - ``Nodes`` (spin, default 256): the node budget of ``go`` without a node or time limit.
  - ``MultiPV`` (spin, default 1, at most 16): ``info`` lines per search, best first.
  - ``SyzygyPath`` (string, default empty = off): Syzygy tables for exact 3-4-piece values;
    a directory without tables is refused.
  - ``Temperature`` (string: 0 = argmax, or a number in [0.001, 100]): the policy-only player's
    sampling temperature (search always plays its most visited move). NaN, infinities,
    negatives and values in (0, 0.001) (denormals included) are refused.
  - ``Device`` (string, a torch device): the model is copied to the device and run once on a
    position there; only when that gives finite logits matching the current device's does the
    copy replace the model (``meta``, a missing GPU or an unknown name is refused, and the model
    in use is never touched).
  - ``UCI_Chess960`` (check, default false): positions (``startpos``, Shredder-FEN or X-FEN) are
    Chess960 positions and castling is written king-takes-rook (``e1h1``) in ``bestmove``,
    ``pv`` and ``searchmoves``; the standard-chess network sees them through
    `chessgrpo.uci.chess960`.
  - ``UCI_ShowWDL`` (check, default false): ``wdl W D L`` after every score.
  - ``Ponder`` (check): announced so GUIs offer pondering; ``go ponder`` works either way.
  - ``Move Overhead`` (spin, ms, default 50, at most 5000): kept back from every clock and
    ``movetime`` budget (bots raise it when they flag on a slow network).
  - ``Threads`` (spin, default: torch's threads): torch's intra-op threads for the network's
    forwards; values above the machine's CPUs are clamped (bots set what their machine has), and
    more than 1 is kept only when a search step is measured faster with them (`set_threads`).
  - ``Hash`` (spin, MiB, default 391): bounds the search tree: a search stops growing at
    Hash * 256 nodes (~4 kB a node), at most `MAX_NODES`.

  A time limit is kept by never starting a search step that would end past it
  (`chessgrpo.play.search_control.SearchControl`; the first step's time is measured at startup, `warm_up`).

- ``isready`` -> ``readyok`` (also while a search runs); ``ucinewgame``; ``setoption name N value V``.
- ``position startpos|fen <FEN> [moves m1 m2 ...]``: the game history is kept, so the search
  sees repetitions (it scores a repeated position as a draw), and so does the policy-only
  player's repetition rule (`chessgrpo.play.movers.PolicyMover.repetition_moves`). A rejected
  ``position`` (malformed FEN, illegal or malformed move) leaves **no** position: ``go`` answers
  ``info string error: no valid position ...`` and ``bestmove 0000`` (the UCI null move) until a
  valid ``position`` (or ``ucinewgame``) arrives, so no move for another position is ever played.
- ``go`` (`chessgrpo.play.search_control`: `parse_go`, `parse_go_flags`): ``nodes N`` = N search
  nodes; ``movetime MS`` = a time limit; ``wtime/btime/winc/binc [movestogo]`` = simple time
  management (`clock_seconds`); with both a node and a time limit, whichever comes first. ``depth``, ``mate`` and a plain ``go``
  search the ``Nodes`` budget (the network search has no meaningful depth).
  ``infinite`` searches until ``stop`` (growing the tree up to `MAX_NODES` or ``Hash``'s bound, then waiting);
  ``ponder`` searches the same way until ``stop`` (answered with the current best move) or
  ``ponderhit``, after which the ``go`` command's own limits apply, the clock counting from the
  ``ponderhit``. ``searchmoves m1 m2 ...`` restricts the root to those moves (illegal ones are
  ignored with an error; none legal = every move). One ``info depth .. seldepth .. multipv K
  score cp X|mate N [wdl W D L] nodes .. nps .. time .. pv ..`` line per MultiPV line (also every
  `INFO_INTERVAL_S` during a long search), then ``bestmove M [ponder P]``; ``bestmove 0000``
  when the side to move has no legal move.
- Searches run in a thread while the main thread keeps reading: ``isready`` is answered at once,
  ``stop`` ends the search (its ``bestmove`` follows), ``ponderhit`` switches a ponder search to
  its limits, ``quit`` stops the search and exits. Any other command during a search (a GUI
  should send none) first waits for a finite search to finish, or stops an infinite or ponder
  one, and then runs. End of input: a finite search finishes, an infinite one is stopped, exit.

Scores (``cp``/``mate``/``wdl``, always from the side to move's view) follow
`chessgrpo.uci.scores`; searches are `chessgrpo.search`'s, stopped, restricted to
``searchmoves`` and followed through its hooks (`chessgrpo.search.base`).

Robustness: no input makes it crash. Unknown commands are ignored with an ``info string``; a bad
option value or ``go`` argument is refused with ``info string error: ...`` and changes nothing.
A search that fails falls back to the policy's move. Every response is flushed at once.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import chess
import numpy as np
import torch

from chessgrpo.board.validation import parse_board
from chessgrpo.play.search_control import (
    DEFAULT_HASH_MB,
    MAX_MOVE_OVERHEAD_MS,
    MAX_NODES,
    MOVE_OVERHEAD_MS,
    SearchControl,
    hash_nodes,
    parse_go,
    parse_go_flags,
)
from chessgrpo.search.base import SearchResult
from chessgrpo.uci.chess960 import (
    Chess960Evaluator,
    parse_board_960,
    parse_uci_move,
    policy_logits,
    softmax,
    standard_view,
)
from chessgrpo.uci.scores import ExactValue, Score, claimable_value, decided_score, estimate_score, policy_estimate

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.search import Searcher

logger = logging.getLogger(__name__)

ENGINE_AUTHOR = "chessgrpo"
MAX_LINE = 10_000
"""Longer input lines are refused (a position with ~1500 moves fits)."""

SEARCH_CHOICES = ("puct", "alphabeta", "none")
DEFAULT_NODES = 256
MAX_MULTIPV = 16
MAX_THREADS = 1024
"""``Threads`` takes any value up to this (bots set what their machine has); it is clamped to the CPUs."""
MAX_HASH_MB = 1 << 20
"""``Hash`` takes any value up to this; above `DEFAULT_HASH_MB` it changes nothing (the tree stops at `MAX_NODES`)."""
INFO_INTERVAL_S = 1.0
"""A long search (``infinite``, ``ponder``, long clocks) sends its ``info`` lines this often."""
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
"""Temperature is 0 (argmax) or lies in this range: below it softmax(logits / T) overflows to argmax anyway."""
WINNING_MATERIAL = 3
"""The policy-only player avoids repetitions when this many pawns ahead (as `PolicyMover`)."""
DEVICE_TOLERANCE = 0.05
"""A new device's logits may differ from the current device's by this much (TF32, fused kernels)."""
QUIT_JOIN_S = 60.0
"""After ``quit`` the stopped search gets this long to answer (it stops after its current batch)."""


# ------------------------------------------------------------------------------------------------
# info lines


def pv_text(board: chess.Board, moves: Sequence[chess.Move]) -> str:
    """The moves in UCI notation, each written in its own position (Chess960 castling = king takes rook)."""
    board = board.copy(stack=False)
    words = []
    for move in moves:
        words.append(board.uci(move))
        board.push(move)
    return " ".join(words)


def info_lines(
    board: chess.Board,
    result: SearchResult,
    multipv: int,
    elapsed_s: float,
    *,
    exact_value: ExactValue = claimable_value,
    show_wdl: bool = False,
) -> list[str]:
    """One ``info`` line per MultiPV line (root moves are already best first)."""
    elapsed_ms = int(1000 * elapsed_s)
    nps = int(result.nodes / max(elapsed_s, 1e-3))
    depth = max(result.depth, 1)
    seldepth = max(result.seldepth, depth)
    board = board.copy()
    lines = []
    for rank, root_move in enumerate(result.root_moves[:multipv], start=1):
        score = decided_score(board, root_move.move, exact_value) or estimate_score(root_move.value)
        lines.append(
            f"info depth {depth} seldepth {seldepth} multipv {rank} score {score.text(show_wdl)} "
            f"nodes {result.nodes} nps {nps} time {elapsed_ms} pv {pv_text(board, root_move.pv)}"
        )
    return lines


# ------------------------------------------------------------------------------------------------
# Positions


def parse_position(arguments: list[str], *, chess960: bool = False) -> chess.Board:
    """The board of ``position startpos|fen <FEN> [moves ...]`` (arguments after "position").

    The FEN is validated (`parse_board`, or `parse_board_960` with `chess960`) and every move
    must be legal in turn; a problem raises `ValueError` describing it.
    """
    if not arguments:
        raise ValueError("position needs startpos or fen")
    if "moves" in arguments:
        split = arguments.index("moves")
        setup, moves = arguments[:split], arguments[split + 1 :]
    else:
        setup, moves = arguments, []
    if setup == ["startpos"]:
        board = chess.Board(chess960=chess960)
    elif setup and setup[0] == "fen" and len(setup) > 1:
        board = parse_board_960(" ".join(setup[1:])) if chess960 else parse_board(" ".join(setup[1:]))
    else:
        raise ValueError(f"expected 'startpos' or 'fen <FEN>', got {' '.join(setup)[:100]!r}")
    for text in moves:
        board.push(parse_uci_move(board, text))
    return board


def parse_spin(value: str, low: int, high: int) -> int | None:
    """The integer `value` when it lies in [low, high], else None."""
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if low <= number <= high else None


def parse_check(value: str) -> bool | None:
    """A UCI check option's value (true/false), else None."""
    text = value.strip().lower()
    return {"true": True, "false": False}.get(text)


def parse_temperature(value: str | float) -> float:
    """0 or a number in [`MIN_TEMPERATURE`, `MAX_TEMPERATURE`]; anything else raises `ValueError`."""
    try:
        temperature = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Temperature must be a number, got {str(value)[:50]!r}") from None
    if temperature == 0.0:
        return 0.0
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:  # also NaN, inf, negatives, denormals
        raise ValueError(
            f"Temperature must be 0 or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {str(value)[:50]!r}"
        )
    return temperature


# ------------------------------------------------------------------------------------------------
# The engine


def check_syzygy_path(path: str) -> None:
    """Raise `FileNotFoundError` unless `path` is a directory (or several) holding Syzygy tables."""
    from chessgrpo.engine.tablebase import Tablebase

    Tablebase(path).close()


@dataclasses.dataclass
class SearchJob:
    """One ``go``: a snapshot of what it searches, run by `UciEngine._run_job` in its own thread."""

    board: chess.Board | None
    """None: no valid position (answered with bestmove 0000)."""
    allowed: list[chess.Move]
    """The root moves to consider (``searchmoves``, else every legal move; empty: no move)."""
    restricted: bool
    control: SearchControl
    searcher: Searcher | None
    multipv: int
    show_wdl: bool
    temperature: float
    thread: threading.Thread | None = None


class UciEngine:
    """A UCI protocol loop around a policy checkpoint (a `Searcher`, or the policy alone); construct, then `run()`."""

    STEP_NAME = "a search step"
    """What `measure_step` times, in the ``info string`` of ``Threads`` (the chess LM's engine times an answer)."""

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        device: str = "cpu",
        temperature: float = 0.0,
        search: str = "puct",
        nodes: int = DEFAULT_NODES,
        multipv: int = 1,
        syzygy_path: str | None = None,
        input: TextIO | None = None,
        output: TextIO | None = None,
    ):
        temperature = parse_temperature(temperature)
        if search not in SEARCH_CHOICES:
            raise ValueError(f"unknown search {search!r}; choose one of {', '.join(SEARCH_CHOICES)}")
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in [1, {MAX_NODES}], got {nodes}")
        if not 1 <= multipv <= MAX_MULTIPV:
            raise ValueError(f"multipv must be in [1, {MAX_MULTIPV}], got {multipv}")
        if syzygy_path:
            check_syzygy_path(syzygy_path)  # fail at startup, not at the first endgame
        self.checkpoint = self.resolve(checkpoint)
        self.name = f"chessgrpo {Path(checkpoint).name or self.checkpoint.name}"
        self.device = device
        self.temperature = temperature
        self.search_algorithm = search
        self.nodes = nodes
        self.multipv = multipv
        self.syzygy_path = syzygy_path or ""
        self.chess960 = False
        self.show_wdl = False
        self.ponder = False
        self.move_overhead_ms = MOVE_OVERHEAD_MS
        self.hash_mb = DEFAULT_HASH_MB
        self.threads = torch.get_num_threads()
        self.step_seconds = 0.0
        """The last search's guess of one search step's time (`SearchControl.next_step_seed`): the next deadline keeps it."""
        self.stale_clock_s = 0.0
        """How long the last ``stop`` of a ``ponder`` took: kept back, beside Move Overhead, from the next go's budget."""
        self.input = input or sys.stdin
        self.output = output or sys.stdout
        self.policy = self.load(device)
        self._rng = np.random.default_rng(time.time_ns() % (2**62))
        self._searcher: Searcher | None = None
        self._fallback_announced = False
        self._job: SearchJob | None = None
        self._output_lock = threading.Lock()
        self._output_closed = False
        self.board: chess.Board | None = chess.Board()
        self.warm_up()

    def resolve(self, checkpoint: str | Path) -> Path:
        """The model directory of `checkpoint` (a subclass playing another kind of model resolves its own)."""
        from chessgrpo.models.policy import resolve_checkpoint

        return resolve_checkpoint(checkpoint)

    def load(self, device: str):
        """The model of `self.checkpoint` on `device`, in eval mode (`uci.lm` loads a chess LM instead)."""
        from chessgrpo.models.policy import load_policy

        return load_policy(self.checkpoint, device=device).eval()

    @property
    def has_value_head(self) -> bool:
        return self.policy.value_head is not None

    # ----------------------------------------------------------------------------------------

    def send(self, *lines: str) -> None:
        with self._output_lock:
            if self._output_closed:
                return
            try:
                for line in lines:
                    self.output.write(line + "\n")
                self.output.flush()
            except (OSError, ValueError):  # the GUI closed the pipe: nobody is listening
                self._output_closed = True

    def info(self, text: str) -> None:
        """An ``info string`` line; newlines removed so it stays one line."""
        self.send("info string " + " ".join(text.split())[:500])

    def run(self) -> int:
        """Read commands until ``quit`` or end of input; returns the exit code (0)."""
        quit_requested = False
        try:
            for line in self.input:
                try:
                    if not self.handle(line):
                        quit_requested = True
                        break
                except Exception as error:  # noqa: BLE001 - a UCI engine must never die on input
                    logger.exception("error handling %r", line)
                    self.info(f"error: {type(error).__name__}: {error}")
        finally:
            # quit: stop at once; end of input: let a finite search answer, stop an unbounded one
            self.finish_search(stop=quit_requested, timeout=QUIT_JOIN_S if quit_requested else None)
            self.reset_searcher()
        return 0

    def finish_search(self, *, stop: bool, timeout: float | None = None) -> None:
        """End the running search: stop it (`stop`, or when it is unbounded) or wait for it; its bestmove is sent."""
        job = self._job
        if job is None:
            return
        if stop or job.control.unbounded:
            job.control.stop()
        if job.thread is not None:
            job.thread.join(timeout)
        self._job = None

    def handle(self, line: str) -> bool:
        """Handle one command line; False means quit."""
        if len(line) > MAX_LINE:
            self.info(f"error: line of {len(line)} characters ignored (limit {MAX_LINE})")
            return True
        tokens = line.split()
        if not tokens:
            return True
        command, arguments = tokens[0], tokens[1:]
        if command == "quit":
            return False
        if command == "isready":
            self.send("readyok")
            return True
        if command in ("debug", "register"):
            return True
        if command == "stop":
            pondering = self._job is not None and self._job.control.pondering
            asked = time.perf_counter()
            self.finish_search(stop=True)
            # A missed ponder: python-chess (so lichess-bot) read the clock it sends with the next go before this
            # stop, so the step the search had in flight is spent from that clock too.
            self.stale_clock_s = time.perf_counter() - asked if pondering else 0.0
            return True
        if command == "ponderhit":
            if self._job is not None:
                self._job.control.ponderhit()
            return True
        if self._job is not None:  # a GUI sends nothing else during a search: finish it first
            self.finish_search(stop=False)
        if command == "uci":
            self.send(f"id name {self.name}", f"id author {ENGINE_AUTHOR}", *self.option_lines(), "uciok")
        elif command == "ucinewgame":
            self.board = chess.Board(chess960=self.chess960)
            self._rng = np.random.default_rng(time.time_ns() % (2**62))
        elif command == "setoption":
            self.set_option(arguments)
        elif command == "position":
            self.set_position(arguments)
        elif command == "go":
            self.go(arguments)
        else:
            self.info(f"unknown command ignored: {line.strip()[:100]}")
        return True

    def option_lines(self) -> list[str]:
        """The ``option`` lines of the ``uci`` reply, with the current values as defaults."""
        check = {True: "true", False: "false"}
        return [
            f"option name Search type combo default {self.search_algorithm} "
            + " ".join(f"var {c}" for c in SEARCH_CHOICES),
            f"option name Nodes type spin default {self.nodes} min 1 max {MAX_NODES}",
            f"option name MultiPV type spin default {self.multipv} min 1 max {MAX_MULTIPV}",
            f"option name SyzygyPath type string default {self.syzygy_path or '<empty>'}",
            f"option name Temperature type string default {self.temperature:g}",
            f"option name Device type string default {self.device}",
            f"option name UCI_Chess960 type check default {check[self.chess960]}",
            f"option name UCI_ShowWDL type check default {check[self.show_wdl]}",
            f"option name Ponder type check default {check[self.ponder]}",
            f"option name Move Overhead type spin default {self.move_overhead_ms} min 0 max {MAX_MOVE_OVERHEAD_MS}",
            f"option name Threads type spin default {self.threads} min 1 max {MAX_THREADS}",
            f"option name Hash type spin default {self.hash_mb} min 1 max {MAX_HASH_MB}",
        ]

    # ---------------------------------------------------------------------------------- options

    def set_option(self, arguments: list[str]) -> None:
        if not arguments or arguments[0] != "name":
            self.info("error: expected setoption name <name> [value <value>]")
            return
        if "value" in arguments:
            split = arguments.index("value")
            name, value = " ".join(arguments[1:split]), " ".join(arguments[split + 1 :])
        else:
            name, value = " ".join(arguments[1:]), ""
        setter = self.option_setters().get(name.lower())
        if setter is None:
            self.info(f"unknown option ignored: {name[:100]}")
        else:
            setter(value)

    def option_setters(self) -> dict[str, Callable[[str], None]]:
        """The setter of each option `option_lines` announces, by lower-case name."""
        return {
            "search": self.set_search,
            "nodes": self.set_nodes,
            "multipv": self.set_multipv,
            "syzygypath": self.set_syzygy_path,
            "temperature": self.set_temperature,
            "device": self.set_device,
            "uci_chess960": self.set_chess960,
            "uci_showwdl": self.set_show_wdl,
            "ponder": self.set_ponder,
            "move overhead": self.set_move_overhead,
            "threads": self.set_threads,
            "hash": self.set_hash,
        }

    def set_search(self, value: str) -> None:
        choice = value.strip().lower()
        if choice not in SEARCH_CHOICES:
            self.info(
                f"error: Search must be one of {', '.join(SEARCH_CHOICES)}, got {value[:50]!r}; keeping {self.search_algorithm}"
            )
            return
        self.search_algorithm = choice
        self.reset_searcher()

    def set_nodes(self, value: str) -> None:
        nodes = parse_spin(value, 1, MAX_NODES)
        if nodes is None:
            self.info(f"error: Nodes must be an integer in [1, {MAX_NODES}], got {value[:50]!r}; keeping {self.nodes}")
            return
        self.nodes = nodes

    def set_multipv(self, value: str) -> None:
        multipv = parse_spin(value, 1, MAX_MULTIPV)
        if multipv is None:
            self.info(
                f"error: MultiPV must be an integer in [1, {MAX_MULTIPV}], got {value[:50]!r}; keeping {self.multipv}"
            )
            return
        self.multipv = multipv

    def set_syzygy_path(self, value: str) -> None:
        path = "" if value.strip() in ("", "<empty>") else value.strip()
        if path:
            try:
                check_syzygy_path(path)
            except (OSError, ValueError) as error:
                self.info(f"error: SyzygyPath refused ({error}); keeping {self.syzygy_path or '<empty>'}")
                return
        self.syzygy_path = path
        self.reset_searcher()

    def set_temperature(self, value: str) -> None:
        try:
            temperature = parse_temperature(value)
        except ValueError as error:
            self.info(f"error: {error}; keeping {self.temperature:g}")
            return
        self.temperature = temperature
        self._rng = np.random.default_rng(time.time_ns() % (2**62))

    def set_device(self, value: str) -> None:
        """Validate the device on a copy of the model (module docstring); only then swap it in."""
        text = value.strip()
        try:
            candidate = self.validated_copy(text)
        except Exception as error:  # noqa: BLE001 - any failure means: keep the device in use
            self.info(
                f"error: cannot use device {text[:50]!r} ({type(error).__name__}: {' '.join(str(error).split())[:200]}); keeping {self.device}"
            )
            return
        self.policy = candidate
        self.device = text
        self.reset_searcher()  # rebuilt on the new device at the next `go`

    def validated_copy(self, text: str):
        """A copy of the model on device `text` that computes what the current one does; raises otherwise."""
        import torch

        device = torch.device(text)
        if device.type == "meta":
            raise ValueError("the meta device holds no data and cannot run the model")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("CUDA is not available")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ValueError(f"there are {torch.cuda.device_count()} CUDA devices")
        if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError("MPS is not available")
        candidate = copy.deepcopy(self.policy).to(device).eval()
        probe = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
        with torch.no_grad():
            tokens, _ = self.policy.inputs([probe])
            reference = self.policy(tokens).float().cpu()
            logits = candidate(tokens.to(device)).float().cpu()
        if logits.shape != reference.shape or not torch.isfinite(logits).all():
            raise ValueError("the model gives no finite logits there")
        difference = float((logits - reference).abs().max())
        if difference > DEVICE_TOLERANCE * max(1.0, float(reference.abs().max())):
            raise ValueError(f"the model computes different logits there (max difference {difference:.3g})")
        return candidate

    def set_chess960(self, value: str) -> None:
        flag = parse_check(value)
        if flag is None:
            self.info(
                f"error: UCI_Chess960 must be true or false, got {value[:50]!r}; keeping {str(self.chess960).lower()}"
            )
            return
        if flag == self.chess960:
            return
        self.chess960 = flag
        if self.board is not None:
            board = self.board.copy()
            board.chess960 = flag
            if board.status() != chess.STATUS_VALID:
                self.board = None
                self.info("error: the current position has Chess960 castling rights; send a new position")
            else:
                self.board = board

    def set_show_wdl(self, value: str) -> None:
        flag = parse_check(value)
        if flag is None:
            self.info(
                f"error: UCI_ShowWDL must be true or false, got {value[:50]!r}; keeping {str(self.show_wdl).lower()}"
            )
            return
        self.show_wdl = flag

    def set_ponder(self, value: str) -> None:
        flag = parse_check(value)
        if flag is None:
            self.info(f"error: Ponder must be true or false, got {value[:50]!r}; keeping {str(self.ponder).lower()}")
            return
        self.ponder = flag  # `go ponder` works either way; the option only tells the GUI it may ponder

    def set_move_overhead(self, value: str) -> None:
        overhead = parse_spin(value, 0, MAX_MOVE_OVERHEAD_MS)
        if overhead is None:
            self.info(
                f"error: Move Overhead must be an integer in [0, {MAX_MOVE_OVERHEAD_MS}] ms, got {value[:50]!r}; "
                f"keeping {self.move_overhead_ms}"
            )
            return
        self.move_overhead_ms = overhead

    def set_threads(self, value: str) -> None:
        """Torch's intra-op threads for the network's forwards (the search itself is one thread). More than
        the CPUs is clamped; more than one is kept only when a search step is measured faster with them than
        with one (on busy cores, threads that wait for each other make a small batch many times slower)."""
        threads = parse_spin(value, 1, MAX_THREADS)
        if threads is None:
            self.info(
                f"error: Threads must be an integer in [1, {MAX_THREADS}], got {value[:50]!r}; keeping {self.threads}"
            )
            return
        from chessgrpo.engine.pool import available_cores  # affinity masks and containers, not the host's count

        usable = min(threads, available_cores())
        if usable < threads:
            self.info(f"Threads {threads}: this process may use {usable} CPUs; using {usable}")
        torch.set_num_threads(usable)
        self.threads = usable
        if usable == 1:
            return
        torch.set_num_threads(1)
        one = self.measure_step()  # warm: the startup's threads (1 under chessgrpo uci)
        torch.set_num_threads(usable)
        # one call, with the new threads' start-up in it: it is several seconds on busy cores, and errs towards 1
        many = self.measure_step(warm=False)
        if one is None or many is None:  # no search to measure (policy-only play: one position per call)
            return
        if one < many:
            self.info(
                f"Threads {usable}: {self.STEP_NAME} takes {1000 * many:.0f} ms with {usable} threads and "
                f"{1000 * one:.0f} ms with 1 (busy cores?); using 1"
            )
            torch.set_num_threads(1)
            self.threads, self.step_seconds = 1, one
        else:
            self.step_seconds = many

    def set_hash(self, value: str) -> None:
        """The search tree's memory bound in MiB: a search stops growing at `hash_nodes` nodes (~4 kB each)."""
        hash_mb = parse_spin(value, 1, MAX_HASH_MB)
        if hash_mb is None:
            self.info(
                f"error: Hash must be an integer in [1, {MAX_HASH_MB}] MiB, got {value[:50]!r}; keeping {self.hash_mb}"
            )
            return
        self.hash_mb = hash_mb
        if hash_nodes(hash_mb) < self.nodes:
            self.info(
                f"Hash {hash_mb} MiB holds {hash_nodes(hash_mb)} nodes: searches stop there (Nodes is {self.nodes})"
            )

    @property
    def max_nodes(self) -> int:
        """The most nodes one search may grow: `MAX_NODES`, or fewer under a small ``Hash``."""
        return hash_nodes(self.hash_mb)

    # --------------------------------------------------------------------------------- position

    def set_position(self, arguments: list[str]) -> None:
        try:
            self.board = parse_position(arguments, chess960=self.chess960)
        except ValueError as error:
            self.board = None  # never answer the next `go` for an older position
            self.info(f"error: {error}; no valid position until the next valid position command")

    # ----------------------------------------------------------------------------------- search

    def warm_up(self) -> None:
        """A search step's network calls at startup: the first `go` does not pay torch's first call (allocations,
        a few hundred ms on a CPU), and its deadline knows a step's time (`step_seconds`) instead of guessing 0."""
        seconds = self.measure_step()
        if seconds is not None:
            self.step_seconds = seconds

    def measure_step(self, *, warm: bool = True) -> float | None:
        """The time of one search step's network call (a PUCT batch of the start position), after one untimed
        call when `warm`; None without a search (policy-only play) or when the network fails (the next go says why)."""
        if self.search_algorithm == "none" or not self.has_value_head:
            return None
        try:
            searcher = self.searcher()
            if searcher is None:
                return None
            boards = [chess.Board()] * searcher.settings.batch_size
            if warm:
                searcher.evaluator.evaluate(boards, exact=False)
            started = time.perf_counter()
            searcher.evaluator.evaluate(boards, exact=False)
            return time.perf_counter() - started
        except Exception:  # noqa: BLE001 - a failing network fails the first go, with its own message
            logger.exception("measuring a search step failed")
            return None

    def reset_searcher(self) -> None:
        """Drop the searcher (closing its tablebases); the next `go` builds one from the options."""
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None

    def searcher(self) -> Searcher | None:
        """The searcher for the current options, or None for policy-only play (``Search none``, or
        no value head: said once with an ``info string``)."""
        if self.search_algorithm == "none":
            return None
        if not self.has_value_head:
            if not self._fallback_announced:
                self._fallback_announced = True
                self.info("this checkpoint has no value head: playing the policy's move without search")
            return None
        if self._searcher is None:
            from chessgrpo.search import Searcher, SearchSettings

            settings = SearchSettings(
                nodes=self.nodes, algorithm=self.search_algorithm, syzygy_path=self.syzygy_path or None
            )
            self._searcher = Searcher(self.policy, settings, evaluator_class=Chess960Evaluator)
        return self._searcher

    def go(self, arguments: list[str] | None = None) -> None:
        """Start the search of ``go <arguments>`` in a thread (`_run_job` sends its bestmove)."""
        started = time.perf_counter()
        arguments = arguments or []
        board = self.board.copy() if self.board is not None else None
        limits, problems = parse_go(
            arguments,
            board.turn if board is not None else chess.WHITE,
            min(self.nodes, self.max_nodes),
            overhead_ms=self.move_overhead_ms + round(1000 * self.stale_clock_s),
            max_nodes=self.max_nodes,
        )
        self.stale_clock_s = 0.0
        flags = parse_go_flags(arguments)
        for problem in problems:
            self.info(f"error: {problem}")
        control = SearchControl(
            limits, infinite=flags.infinite, ponder=flags.ponder, started=started, step_seconds=self.step_seconds
        )
        allowed: list[chess.Move] = []
        restricted = False
        searcher = None
        if board is None:
            self.info("error: no valid position (the last position command was rejected); send a valid position")
        elif not any(board.generate_legal_moves()):
            self.info("no legal moves: the game is over")
        else:
            allowed, restricted = self.root_moves(board, flags.searchmoves)
            try:
                searcher = self.searcher()
            except Exception as error:  # noqa: BLE001 - e.g. tables gone: play the policy's move
                logger.exception("cannot build the searcher")
                self.info(f"error: cannot search ({type(error).__name__}: {error}); playing the policy's move")
        job = SearchJob(board, allowed, restricted, control, searcher, self.multipv, self.show_wdl, self.temperature)
        job.thread = threading.Thread(target=self._run_job, args=(job,), name="uci-search", daemon=True)
        self._job = job
        job.thread.start()

    def root_moves(self, board: chess.Board, searchmoves: Sequence[str]) -> tuple[list[chess.Move], bool]:
        """The legal moves of ``searchmoves`` (errors for the others), or every legal move; and whether restricted."""
        legal = list(board.legal_moves)
        if not searchmoves:
            return legal, False
        chosen: list[chess.Move] = []
        for text in searchmoves:
            try:
                move = parse_uci_move(board, text)
            except ValueError as error:
                self.info(f"error: searchmoves: {error}; ignored")
                continue
            if move not in chosen:
                chosen.append(move)
        if not chosen:
            self.info("error: searchmoves has no legal move; searching every move")
            return legal, False
        return chosen, len(chosen) < len(legal)

    def _run_job(self, job: SearchJob) -> None:
        """The search thread: search (or ask the policy), send the info lines, wait while
        ``infinite``/``ponder`` holds the answer back, then send ``bestmove``."""
        move: chess.Move | None = None
        ponder: chess.Move | None = None
        board = job.board
        try:
            if board is not None and job.allowed:
                if job.searcher is not None:
                    move, ponder = self._searched_move(job)
                if move is None:
                    move = self._policy_move(job)
        except Exception as error:  # noqa: BLE001 - answer with a legal move rather than hang the GUI
            logger.exception("go failed in %s", board.fen() if board is not None else None)
            move = min(job.allowed, key=lambda m: m.uci()) if job.allowed else None
            self.info(f"error: {type(error).__name__}: {error}")
        self.step_seconds = job.control.next_step_seed()  # before bestmove: the next go comes after it
        job.control.wait_for_release()
        if move is None or board is None:
            self.send("bestmove 0000")
            return
        answer = f"bestmove {board.uci(move)}"
        if ponder is not None:
            after = board.copy(stack=False)
            after.push(move)
            if after.is_legal(ponder):
                answer += f" ponder {after.uci(ponder)}"
        self.send(answer)

    def _searched_move(self, job: SearchJob) -> tuple[chess.Move | None, chess.Move | None]:
        """The search's move and its expected reply (None, None when the search fails: the policy answers)."""
        board, control, searcher = job.board, job.control, job.searcher
        assert board is not None and searcher is not None

        def report(result: SearchResult) -> None:
            self.send(*self.search_info(job, result))

        try:
            result = searcher.search(
                board,
                nodes=self.max_nodes if control.unbounded else control.limits.nodes,
                root_moves=job.allowed if job.restricted else None,
                should_stop=control.should_stop,  # stop, ponderhit's node limit and deadline
                report=report,
                report_interval=INFO_INTERVAL_S,
            )
        except Exception as error:  # noqa: BLE001 - the policy's move beats a hung GUI
            logger.exception("search failed in %s", board.fen())
            self.info(f"error: the search failed ({type(error).__name__}: {error}); playing the policy's move")
            return None, None
        try:
            result = self._more_lines(job, result)
        except Exception:  # noqa: BLE001 - the lines are a courtesy; the best move is already known
            logger.exception("MultiPV lines after a decided root failed in %s", board.fen())
        self.send(*self.search_info(job, result))
        pv = result.root_moves[0].pv if result.root_moves else []
        return result.move, (pv[1] if len(pv) > 1 else None)

    def _more_lines(self, job: SearchJob, result: SearchResult) -> SearchResult:
        """`result` with as many lines as MultiPV asks. A root decided without search (a mate in one, a tablebase
        move: `search.base.decided_root`) has one line; the other allowed moves are then searched for the rest, with the
        same budget, each further decided move first (several mates in one are each a line), best first."""
        board, control, searcher = job.board, job.control, job.searcher
        assert board is not None and searcher is not None
        lines = list(result.root_moves)
        nodes = result.nodes
        while len(lines) < job.multipv and not control.should_stop(nodes):
            shown = {line.move for line in lines}
            rest = [move for move in job.allowed if move not in shown]
            if not rest:
                break
            more = searcher.search(
                board,
                nodes=self.max_nodes if control.unbounded else control.limits.nodes,
                root_moves=rest,
                should_stop=control.should_stop,
            )
            new = [line for line in more.root_moves if line.move not in shown]
            if not new:
                break
            lines += new[: job.multipv - len(lines)]
            nodes += more.nodes
        return (
            result
            if len(lines) == len(result.root_moves)
            else dataclasses.replace(result, root_moves=lines, nodes=nodes)
        )

    def search_info(self, job: SearchJob, result: SearchResult) -> list[str]:
        assert job.board is not None and job.searcher is not None
        elapsed = time.perf_counter() - job.control.started
        return info_lines(
            job.board,
            result,
            job.multipv,
            elapsed,
            exact_value=job.searcher.evaluator.exact_value,
            show_wdl=job.show_wdl,
        )

    def _policy_move(self, job: SearchJob) -> chess.Move:
        """The policy's own move among the allowed moves (argmax or a sample at the temperature,
        with `PolicyMover`'s repetition rule), announced with MultiPV ``info`` lines and its probability."""
        from chessgrpo.play.movers import PolicyMover, material_balance

        board = job.board
        assert board is not None
        moves = job.allowed
        logits, actions = policy_logits(self.policy, board, moves)
        probabilities = softmax(logits)
        candidates = list(range(len(moves)))
        if material_balance(board) >= WINNING_MATERIAL:
            repeats, allows = PolicyMover.repetition_moves(board.copy())
            for excluded in (set(repeats + allows), set(repeats)):
                kept = [i for i in candidates if moves[i] not in excluded]
                if excluded and kept and len(kept) < len(candidates):
                    candidates = kept
                    break
        if job.temperature == 0.0:
            best = max(logits[i] for i in candidates)
            chosen = min(
                (i for i in candidates if logits[i] == best), key=lambda i: actions[i]
            )  # ties: the first action, as argmax
        else:
            weights = softmax(np.array([logits[i] for i in candidates]) / job.temperature)
            chosen = candidates[int(self._rng.choice(len(candidates), p=weights))]
        shown = [chosen] + sorted((i for i in range(len(moves)) if i != chosen), key=lambda i: -probabilities[i])
        shown = shown[: job.multipv]
        scores = self.policy_scores(
            board, [moves[i] for i in shown], [float(probabilities[i]) for i in shown], float(probabilities.max())
        )
        elapsed = time.perf_counter() - job.control.started
        elapsed_ms = int(1000 * elapsed)
        nps = int(1 / max(elapsed, 1e-3))
        self.send(
            *[
                f"info depth 1 seldepth 1 multipv {rank} score {score.text(job.show_wdl)} nodes 1 nps {nps} time {elapsed_ms} pv {board.uci(moves[i])}"
                for rank, (i, score) in enumerate(zip(shown, scores), start=1)
            ]
        )
        self.info(f"policy probability {probabilities[chosen]:.3f}")
        return moves[chosen]

    def policy_scores(
        self, board: chess.Board, moves: list[chess.Move], probabilities: list[float], best: float
    ) -> list[Score]:
        """Scores of the policy's moves: decided by the rules, else the value head on the position
        after the move when there is one, else `policy_estimate`."""
        scores: list[Score | None] = [decided_score(board, move, claimable_value) for move in moves]
        pending = [i for i, score in enumerate(scores) if score is None]
        if pending and self.has_value_head:
            import torch

            afters = []
            for i in pending:
                after = board.copy(stack=False)
                after.push(moves[i])
                afters.append(standard_view(after))
            with torch.no_grad():
                tokens, _ = self.policy.inputs(afters)
                _, value_logits = self.policy(tokens, with_value=True)
                values = torch.sigmoid(value_logits.float()).cpu().numpy()
            for i, value in zip(pending, values):
                scores[i] = estimate_score(1.0 - float(value))
        else:
            for i in pending:
                scores[i] = policy_estimate(board, moves[i], probabilities[i], best)
        return scores  # type: ignore[return-value]
