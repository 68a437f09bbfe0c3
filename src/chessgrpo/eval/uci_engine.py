"""The policy as a UCI engine (`chessgrpo uci --checkpoint CKPT`): plays in any chess GUI,
cutechess-cli, fastchess or lichess-bot.

When the checkpoint's policy has a value head, ``go`` **searches** (`chessgrpo.search`: PUCT by
default, or policy-pruned alpha-beta) under the ``go`` limits; without a value head, or with
``Search none``, it plays the policy's own move at once, as before search existed.

Supported commands (https://backscattering.de/chess/uci/):

- ``uci``: ``id name``/``id author``, the options, then ``uciok``. Options:

  - ``Search`` (combo ``puct``/``alphabeta``/``none``, default puct): ``none`` = the policy's move
    without search (the only choice for a checkpoint without a value head, which falls back to
    it and says so once with an ``info string`` at the first ``go``).
  - ``Nodes`` (spin, default 256): the node budget of ``go`` without a node or time limit.
  - ``MultiPV`` (spin, default 1, at most 16): ``info`` lines per search, best first.
  - ``SyzygyPath`` (string, default empty = off): Syzygy tables for exact 3-4-piece values;
    a directory without tables is refused.
  - ``Temperature`` (string, a number >= 0; 0 = argmax): the policy-only player's sampling
    temperature (search always plays its most visited move).
  - ``Device`` (string, a torch device).

- ``isready`` -> ``readyok``; ``ucinewgame``; ``setoption name N value V``.
- ``position startpos|fen <FEN> [moves m1 m2 ...]``: the game history is kept, so the search
  sees repetitions (it scores a repeated position as a draw), and so does the policy-only
  player's repetition rule (`chessgrpo.eval.anchors.PolicyMover`).
- ``go`` (`parse_go`): ``nodes N`` = N search nodes; ``movetime MS`` = a time limit;
  ``wtime/btime/winc/binc [movestogo]`` = simple time management (`clock_seconds`); with both a
  node and a time limit, whichever comes first. ``depth``, ``mate``, ``infinite`` and a plain
  ``go`` search the ``Nodes`` budget (the network search has no meaningful depth; ``infinite``
  stops on its own instead of waiting for ``stop``). One ``info depth .. seldepth .. multipv K
  score cp X|mate 1 nodes .. nps .. time .. pv ..`` line per MultiPV line, then ``bestmove``;
  ``bestmove 0000`` when the side to move has no legal move. Search runs in the foreground:
  ``stop`` arriving later finds the answer already given.
- ``stop``, ``ponderhit``, ``debug``, ``register``: accepted and ignored. ``quit`` or end of
  input: exit.

Robustness: no input makes it crash. Unknown commands are ignored with an ``info string``; a bad
``position`` (malformed FEN, illegal or malformed move) keeps the previous valid position and
answers ``info string error: ...``; a bad option value or ``go`` argument is refused the same
way. A search that fails falls back to the policy's move. Every response is flushed at once.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import chess

from chessgrpo.board.validation import parse_board, parse_move

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.search import SearchResult, Searcher

logger = logging.getLogger(__name__)

ENGINE_AUTHOR = "chessgrpo"
MAX_LINE = 10_000
"""Longer input lines are refused (a position with ~1500 moves fits)."""

SEARCH_CHOICES = ("puct", "alphabeta", "none")
DEFAULT_NODES = 256
MAX_NODES = 100_000
"""The most nodes one ``go`` searches, also when only time limits it (bounds the tree's memory: ~4 kB a node)."""
MAX_MULTIPV = 16
MOVE_OVERHEAD_MS = 50
"""Kept back from every time limit: the pipe, the GUI and the batch the search finishes."""
DEFAULT_MOVES_TO_GO = 30
"""Moves the remaining clock time is spread over when the GUI gives no ``movestogo``."""
INCREMENT_SHARE = 0.75
MAX_CLOCK_FRACTION = 0.2
"""One move never takes more than this share of the remaining clock time."""
MIN_SEARCH_SECONDS = 0.001


# ------------------------------------------------------------------------------------------------
# `go` limits


@dataclasses.dataclass(frozen=True)
class GoLimits:
    """What one ``go`` searches: `nodes` always, `seconds` when a time limit applies."""

    nodes: int
    seconds: float | None = None


INTEGER_ARGUMENTS = ("wtime", "btime", "winc", "binc", "movestogo", "movetime", "nodes", "depth", "mate")


def parse_go(arguments: list[str], turn: chess.Color, default_nodes: int) -> tuple[GoLimits, list[str]]:
    """The limits of ``go <arguments>`` for the side `turn`, and a description of every argument
    that was malformed and ignored.

    ``nodes`` caps the nodes (at most `MAX_NODES`); ``movetime`` or else the clock
    (`clock_seconds`) sets the time. A time limit without ``nodes`` searches up to `MAX_NODES`;
    neither (``depth``, ``mate``, ``infinite``, nothing) searches `default_nodes`.
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
        index += 1  # other tokens (infinite, ponder, searchmoves and its moves) change nothing
    seconds = None
    if "movetime" in values:
        seconds = movetime_seconds(values["movetime"])
    else:
        clock, increment = ("wtime", "winc") if turn == chess.WHITE else ("btime", "binc")
        if clock in values:
            seconds = clock_seconds(values[clock], values.get(increment, 0), values.get("movestogo", 0))
    if "nodes" in values:
        nodes = values["nodes"]
    else:
        nodes = MAX_NODES if seconds is not None else default_nodes
    return GoLimits(nodes=min(max(nodes, 1), MAX_NODES), seconds=seconds), problems


def movetime_seconds(movetime_ms: int) -> float:
    """``go movetime MS``: MS less the overhead (`MOVE_OVERHEAD_MS`, at most half of MS)."""
    movetime_ms = max(movetime_ms, 0)
    return max((movetime_ms - min(MOVE_OVERHEAD_MS, movetime_ms / 2)) / 1000, MIN_SEARCH_SECONDS)


def clock_seconds(remaining_ms: int, increment_ms: int = 0, moves_to_go: int = 0) -> float:
    """The time for one move from the clock: with ``usable = remaining - MOVE_OVERHEAD_MS``,

        min(usable / (movestogo or 30) + 0.75 * increment, usable / 5)

    so the clock is spread over the moves still to play, the increment is mostly spent, and no
    move takes more than a fifth of what is left (at least `MIN_SEARCH_SECONDS`).
    """
    usable = max(remaining_ms - MOVE_OVERHEAD_MS, 0)
    moves = moves_to_go if moves_to_go > 0 else DEFAULT_MOVES_TO_GO
    target = usable / moves + INCREMENT_SHARE * max(increment_ms, 0)
    return max(min(target, MAX_CLOCK_FRACTION * usable) / 1000, MIN_SEARCH_SECONDS)


# ------------------------------------------------------------------------------------------------
# `info` lines


def score_text(board: chess.Board, move: chess.Move, value: float) -> str:
    """``mate 1`` when `move` checkmates at once, else ``cp X`` from the expected score `value`."""
    from chessgrpo.search import value_to_centipawns

    board.push(move)
    try:
        mates = board.is_checkmate()
    finally:
        board.pop()
    return "mate 1" if mates else f"cp {value_to_centipawns(value)}"


def info_lines(board: chess.Board, result: "SearchResult", multipv: int, elapsed_s: float) -> list[str]:
    """One ``info`` line per MultiPV line (root moves are already best first)."""
    elapsed_ms = int(1000 * elapsed_s)
    nps = int(result.nodes / max(elapsed_s, 1e-3))
    depth = max(result.depth, 1)
    seldepth = max(result.seldepth, depth)
    lines = []
    for rank, root_move in enumerate(result.root_moves[:multipv], start=1):
        lines.append(
            f"info depth {depth} seldepth {seldepth} multipv {rank} score {score_text(board, root_move.move, root_move.value)} "
            f"nodes {result.nodes} nps {nps} time {elapsed_ms} pv {' '.join(move.uci() for move in root_move.pv)}"
        )
    return lines


# ------------------------------------------------------------------------------------------------
# The engine


def check_syzygy_path(path: str) -> None:
    """Raise `FileNotFoundError` unless `path` is a directory (or several) holding Syzygy tables."""
    from chessgrpo.engine.tablebase import Tablebase

    Tablebase(path).close()


class UciEngine:
    """A UCI protocol loop around a policy checkpoint (a `Searcher` or a `PolicyMover`); construct, then `run()`."""

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
        from chessgrpo.eval.anchors import PolicyMover
        from chessgrpo.models.policy import load_policy, resolve_checkpoint

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if search not in SEARCH_CHOICES:
            raise ValueError(f"unknown search {search!r}; choose one of {', '.join(SEARCH_CHOICES)}")
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in [1, {MAX_NODES}], got {nodes}")
        if not 1 <= multipv <= MAX_MULTIPV:
            raise ValueError(f"multipv must be in [1, {MAX_MULTIPV}], got {multipv}")
        if syzygy_path:
            check_syzygy_path(syzygy_path)  # fail at startup, not at the first endgame
        self.checkpoint = resolve_checkpoint(checkpoint)
        self.name = f"chessgrpo {Path(checkpoint).name or self.checkpoint.name}"
        self.device = device
        self.temperature = float(temperature)
        self.search_algorithm = search
        self.nodes = nodes
        self.multipv = multipv
        self.syzygy_path = syzygy_path or ""
        self.input = input or sys.stdin
        self.output = output or sys.stdout
        self.policy = load_policy(self.checkpoint, device=device)
        self.mover = PolicyMover(self.policy, temperature=self.temperature)
        self.mover.new_game(None, int(time.time_ns() % (2**62)))
        self._searcher: Searcher | None = None
        self._fallback_announced = False
        self.board = chess.Board()

    @property
    def has_value_head(self) -> bool:
        return self.policy.value_head is not None

    # ----------------------------------------------------------------------------------------

    def send(self, *lines: str) -> None:
        for line in lines:
            self.output.write(line + "\n")
        self.output.flush()

    def info(self, text: str) -> None:
        """An ``info string`` line; newlines removed so it stays one line."""
        self.send("info string " + " ".join(text.split())[:500])

    def run(self) -> int:
        """Read commands until ``quit`` or end of input; returns the exit code (0)."""
        try:
            for line in self.input:
                try:
                    if not self.handle(line):
                        break
                except Exception as error:  # noqa: BLE001 - a UCI engine must never die on input
                    logger.exception("error handling %r", line)
                    self.info(f"error: {type(error).__name__}: {error}")
        finally:
            self.reset_searcher()
        return 0

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
        if command == "uci":
            self.send(f"id name {self.name}", f"id author {ENGINE_AUTHOR}", *self.option_lines(), "uciok")
        elif command == "isready":
            self.send("readyok")
        elif command == "ucinewgame":
            self.board = chess.Board()
        elif command == "setoption":
            self.set_option(arguments)
        elif command == "position":
            self.set_position(arguments)
        elif command == "go":
            self.go(arguments)
        elif command in ("stop", "ponderhit", "debug", "register"):
            pass  # `go` has already answered; nothing runs in the background
        else:
            self.info(f"unknown command ignored: {line.strip()[:100]}")
        return True

    def option_lines(self) -> list[str]:
        """The ``option`` lines of the ``uci`` reply, with the current values as defaults."""
        return [
            f"option name Search type combo default {self.search_algorithm} " + " ".join(f"var {c}" for c in SEARCH_CHOICES),
            f"option name Nodes type spin default {self.nodes} min 1 max {MAX_NODES}",
            f"option name MultiPV type spin default {self.multipv} min 1 max {MAX_MULTIPV}",
            f"option name SyzygyPath type string default {self.syzygy_path or '<empty>'}",
            f"option name Temperature type string default {self.temperature:g}",
            f"option name Device type string default {self.device}",
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
        setters = {
            "search": self.set_search,
            "nodes": self.set_nodes,
            "multipv": self.set_multipv,
            "syzygypath": self.set_syzygy_path,
            "temperature": self.set_temperature,
            "device": self.set_device,
        }
        setter = setters.get(name.lower())
        if setter is None:
            self.info(f"unknown option ignored: {name[:100]}")
        else:
            setter(value)

    def set_search(self, value: str) -> None:
        choice = value.strip().lower()
        if choice not in SEARCH_CHOICES:
            self.info(f"error: Search must be one of {', '.join(SEARCH_CHOICES)}, got {value[:50]!r}; keeping {self.search_algorithm}")
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
            self.info(f"error: MultiPV must be an integer in [1, {MAX_MULTIPV}], got {value[:50]!r}; keeping {self.multipv}")
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
            temperature = float(value)
            if not temperature >= 0 or temperature == float("inf"):
                raise ValueError
        except ValueError:
            self.info(f"error: Temperature must be a number >= 0, got {value!r}; keeping {self.temperature:g}")
            return
        self.temperature = temperature
        self.mover.temperature = temperature
        self.mover.new_game(None, int(time.time_ns() % (2**62)))

    def set_device(self, value: str) -> None:
        import torch

        try:
            device = torch.device(value)
            self.policy.to(device)
            torch.zeros(1, device=device)  # fails here, not mid-game, when the device is unusable
        except (RuntimeError, AssertionError, ValueError) as error:
            self.policy.to(self.device)
            self.info(f"error: cannot use device {value!r} ({error}); keeping {self.device}")
            return
        self.device = value
        self.reset_searcher()  # rebuilt on the new device at the next `go`

    # --------------------------------------------------------------------------------- position

    def set_position(self, arguments: list[str]) -> None:
        try:
            self.board = parse_position(arguments)
        except ValueError as error:
            self.info(f"error: {error}; keeping the previous position {self.board.fen()}")

    # ----------------------------------------------------------------------------------- search

    def reset_searcher(self) -> None:
        """Drop the searcher (closing its tablebases); the next `go` builds one from the options."""
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None

    def searcher(self) -> "Searcher | None":
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

            settings = SearchSettings(nodes=self.nodes, algorithm=self.search_algorithm, syzygy_path=self.syzygy_path or None)
            self._searcher = Searcher(self.policy, settings)
        return self._searcher

    def go(self, arguments: list[str] | None = None) -> None:
        started = time.perf_counter()
        if not any(self.board.generate_legal_moves()):
            self.info("no legal moves: the game is over")
            self.send("bestmove 0000")
            return
        limits, problems = parse_go(arguments or [], self.board.turn, self.nodes)
        for problem in problems:
            self.info(f"error: {problem}")
        move = None
        try:
            searcher = self.searcher()
            if searcher is not None:
                result = searcher.search(self.board, nodes=limits.nodes, seconds=limits.seconds)
                self.send(*info_lines(self.board, result, self.multipv, time.perf_counter() - started))
                move = result.move
        except Exception as error:  # noqa: BLE001 - the policy's move beats a hung GUI
            logger.exception("search failed in %s", self.board.fen())
            self.info(f"error: the search failed ({type(error).__name__}: {error}); playing the policy's move")
        if move is None:
            move = self.policy_move(started)
        self.send(f"bestmove {move.uci()}")

    def policy_move(self, started: float) -> chess.Move:
        """The policy's own move (with its repetition rule), announced with one ``info`` line."""
        try:
            move = self.mover.move(self.board)
            probability = self.mover.last_probability
        except Exception as error:  # noqa: BLE001 - answer with a legal move rather than hang the GUI
            logger.exception("policy failed in %s", self.board.fen())
            move = min(self.board.legal_moves, key=lambda m: m.uci())
            self.info(f"error: the policy failed ({type(error).__name__}: {error}); playing {move.uci()}")
            probability = None
        elapsed = int(1000 * (time.perf_counter() - started))
        self.send(f"info depth 1 seldepth 1 nodes 1 time {elapsed} pv {move.uci()}")
        if probability is not None:
            self.info(f"policy probability {probability:.3f}")
        return move


def parse_spin(value: str, low: int, high: int) -> int | None:
    """The integer `value` when it lies in [low, high], else None."""
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if low <= number <= high else None


def parse_position(arguments: list[str]) -> chess.Board:
    """The board of ``position startpos|fen <FEN> [moves ...]`` (arguments after "position").

    The FEN is validated (`parse_board`) and every move must be legal in turn; a problem raises
    `ValueError` describing it.
    """
    if not arguments:
        raise ValueError("position needs startpos or fen")
    if "moves" in arguments:
        split = arguments.index("moves")
        setup, moves = arguments[:split], arguments[split + 1 :]
    else:
        setup, moves = arguments, []
    if setup == ["startpos"]:
        board = chess.Board()
    elif setup and setup[0] == "fen" and len(setup) > 1:
        board = parse_board(" ".join(setup[1:]))
    else:
        raise ValueError(f"expected 'startpos' or 'fen <FEN>', got {' '.join(setup)[:100]!r}")
    for text in moves:
        board.push(parse_move(board, text))
    return board
