"""One UCI engine process driven over a pipe, with deadlines on every read.

This is deliberately lower level than `chess.engine.SimpleEngine`: reward computation issues
thousands of tiny searches per second, and a synchronous pipe with `poll` deadlines has less
per-search overhead and lets us detect a hung or crashed process ourselves (POSIX only).

It speaks UCI and assumes nothing about Stockfish. The handshake reads ``id name`` and the
``option`` lines; only options the engine advertises are set (Threads and Hash are clamped to the
engine's range, and skipped when it has none); an option asked for by name that the engine does
not advertise, or a value outside its range, is an `EngineUnsupported` error. Each way an engine
can misbehave is one `EngineError` whose message names the engine:

- no ``uciok`` before the deadline (`EngineTimeout`, quoting what it printed instead: an xboard
  engine such as Fairy-Max answers ``uci`` with an error), or an exit during the handshake
  (`EngineCrashed`);
- a search that does not end in ``bestmove`` before its deadline (`EngineTimeout`), an exit
  mid-search (`EngineCrashed`), an ``info ... score`` line that does not parse (`EngineError`);
- a node limit the engine ignores (`EngineUnsupported`): more than `NODE_LIMIT_SLACK` times the
  limit (plus `NODE_LIMIT_MARGIN`) searched; Toga II accepts ``go nodes N`` and never stops on it;
- MultiPV > 1 for an engine without a MultiPV option (`EngineUnsupported`).

Whether the ``bestmove`` is a legal move of the position is checked by the caller, which knows
the position (`EnginePool`); `SearchResult.best_move` is None for ``(none)``, ``0000`` or a bare
``bestmove``, and `SearchResult.bestmove_text` keeps what the engine sent.
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from chessgrpo.engine.locate import EngineError
from chessgrpo.errors import InputError, quote


class EngineCrashed(EngineError):
    """The engine process exited or closed its pipes."""


class EngineTimeout(EngineError):
    """The engine did not answer before its deadline."""


class EngineUnsupported(EngineError):
    """The engine lacks what was asked of it (an option, MultiPV, a node limit it obeys).

    Retrying on a fresh process cannot help, so callers raise it at once instead of retrying."""


NODE_LIMIT_SLACK = 10
NODE_LIMIT_MARGIN = 100_000
"""A search of ``go nodes N`` that reports more than SLACK * N + MARGIN nodes ignores the limit.
Engines overshoot a little (Glaurung 2.2 searches ~6000 nodes for ``go nodes 2000``); an engine
that ignores the limit passes this within a fraction of a second at any limit we use."""

NO_BESTMOVE = ("(none)", "0000", "NULL", "")
"""``bestmove`` arguments that mean "no move" (UCI's null move, Houdini's NULL, nothing at all)."""


@dataclasses.dataclass(frozen=True)
class UciOption:
    """One ``option name ... type ...`` line of the handshake."""

    name: str
    type: str
    """check, spin, combo, button or string."""
    default: str | None = None
    min: int | None = None
    max: int | None = None
    vars: tuple[str, ...] = ()

    def value_text(self, value: Any) -> str:
        """`value` as the text of ``setoption ... value``; `ValueError` says why it does not fit."""
        text = ("true" if value else "false") if isinstance(value, bool) else str(value).strip()
        if "\n" in text or "\r" in text:
            raise InputError(f"option {self.name!r}: value {quote(text)} spans lines")
        if self.type == "button":
            raise InputError(f"option {self.name!r} is a button: it takes no value")
        if self.type == "check":
            if text.lower() not in ("true", "false"):
                raise InputError(f"option {self.name!r} is a check option: true or false, got {quote(text)}")
            return text.lower()
        if self.type == "spin":
            try:
                number = int(text)
            except ValueError:
                raise InputError(f"option {self.name!r} is a spin option: an integer, got {quote(text)}") from None
            if (self.min is not None and number < self.min) or (self.max is not None and number > self.max):
                raise InputError(f"option {self.name!r} must be in {self.min}..{self.max}, got {number}")
            return str(number)
        if self.type == "combo" and self.vars:
            for choice in self.vars:
                if choice.lower() == text.lower():
                    return choice
            raise InputError(f"option {self.name!r} is one of {', '.join(self.vars)}; got {quote(text)}")
        return text

    def clamp(self, value: int) -> int:
        """A spin value moved into the option's range (for the Threads and Hash defaults)."""
        if self.min is not None:
            value = max(self.min, value)
        if self.max is not None:
            value = min(self.max, value)
        return value


_OPTION_KEYWORDS = ("type", "default", "min", "max", "var")


def parse_option(line: str) -> UciOption | None:
    """Parse ``option name NAME type T [default D] [min A max B] [var V]...``; None if malformed."""
    if not line.startswith("option name "):
        return None
    rest = line[len("option name ") :]
    index = rest.find(" type ")
    if index <= 0:
        return None
    fields: dict[str, str] = {}
    choices: list[str] = []
    key, words = "", []
    for token in rest[index + 1 :].split() + ["var"]:  # a final keyword flushes the last field
        if token in _OPTION_KEYWORDS:
            if key == "var":
                choices.append(" ".join(words))
            elif key:
                fields[key] = " ".join(words)
            key, words = token, []
        else:
            words.append(token)

    def integer(text: str | None) -> int | None:
        try:
            return int(text) if text is not None else None
        except ValueError:
            return None

    return UciOption(
        name=rest[:index].strip(),
        type=fields.get("type", "").lower(),
        default=fields.get("default"),
        min=integer(fields.get("min")),
        max=integer(fields.get("max")),
        vars=tuple(choices),
    )


def choose_settings(
    advertised: Mapping[str, UciOption],
    label: str,
    *,
    threads: int | None = 1,
    hash_mb: int | None = 1,
    options: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The ``setoption`` name -> value text for an engine that advertised `advertised` (by
    lower-case name): Threads and Hash only if it has them, clamped to their range; every one of
    `options` must be advertised and fit, else `EngineUnsupported` naming the engine (`label`)
    and what it has."""
    settings: dict[str, str] = {}
    for name, value in (("Threads", threads), ("Hash", hash_mb)):
        option = advertised.get(name.lower())
        if value is not None and option is not None and option.type == "spin":
            settings[option.name] = str(option.clamp(int(value)))
    for name, value in (options or {}).items():
        option = advertised.get(str(name).lower())
        if option is None:
            have = ", ".join(sorted(o.name for o in advertised.values())) or "none"
            raise EngineUnsupported(f"engine {label} has no UCI option {str(name)!r} (it has: {have})")
        try:
            settings[option.name] = option.value_text(value)
        except ValueError as error:
            raise EngineUnsupported(f"engine {label}: {error}") from None
    return settings


@dataclasses.dataclass
class SearchLine:
    """The final score of one multipv line of a search."""

    multipv: int
    cp: int | None
    mate: int | None
    pv: tuple[str, ...]
    depth: int
    nodes: int


@dataclasses.dataclass
class SearchResult:
    best_move: str | None
    """The ``bestmove``; None for ``(none)``, ``0000`` or nothing."""
    lines: list[SearchLine]  # ordered by multipv rank, best first
    bestmove_text: str = ""
    """What followed ``bestmove`` (for error messages)."""


def parse_info(line: str) -> SearchLine | None:
    """Parse an ``info ... score ...`` line; None for lines without a final score.

    `ValueError` for a score line that does not parse (a number that is not one, a cut line)."""
    tokens = line.split()
    if "score" not in tokens or "lowerbound" in tokens or "upperbound" in tokens:
        return None
    multipv, depth, nodes = 1, 0, 0
    cp = mate = None
    pv: tuple[str, ...] = ()
    i = 1
    try:
        while i < len(tokens):
            token = tokens[i]
            if token == "pv":
                pv = tuple(tokens[i + 1 :])
                break
            if token == "score":
                kind, value = tokens[i + 1], int(tokens[i + 2])
                if kind == "cp":
                    cp = value
                elif kind == "mate":
                    mate = value
                else:
                    raise ValueError(f"unknown score kind {kind!r}")
                i += 3
                continue
            if token == "multipv":
                multipv = int(tokens[i + 1])
            elif token == "depth":
                depth = int(tokens[i + 1])
            elif token == "nodes":
                nodes = int(tokens[i + 1])
            elif token == "string":
                return None
            i += 2
    except IndexError:
        raise ValueError("the line ends inside a field") from None
    return SearchLine(multipv=multipv, cp=cp, mate=mate, pv=pv, depth=depth, nodes=nodes)


def _nodes_of(line: str) -> int | None:
    """The ``nodes`` count of an info line (None when absent or not a number); as cheap as
    `_multipv_of`, since it runs on every info line of a node-limited search."""
    index = line.find(" nodes ")
    if index < 0 or " string " in line[: index + 1]:
        return None
    rest = line[index + 7 :]
    end = rest.find(" ")
    try:
        return int(rest if end < 0 else rest[:end])
    except ValueError:
        return None


class UciProcess:
    """A running UCI engine process. Not thread-safe: one owner thread at a time.

    `options` are set after the handshake (names as the engine spells them or in any case; each
    must be advertised, else `EngineUnsupported`); `threads` and `hash_mb` are set only when the
    engine has Threads / Hash options, clamped to their range (Ethereal 12 aborts on Hash 1).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        args: Sequence[str] = (),
        threads: int | None = 1,
        hash_mb: int | None = 1,
        options: Mapping[str, Any] | None = None,
        startup_timeout_s: float = 30.0,
    ):
        self.path = Path(path)
        self.args = tuple(str(arg) for arg in args)
        self.name = ""
        """The engine's ``id name`` ("" until the handshake read it, or if it sent none)."""
        self.options: dict[str, UciOption] = {}
        """Advertised options by lower-case name."""
        self.settings: dict[str, str] = {}
        """The options this process was given, as sent."""
        self._buffer = b""
        self._multipv = 1
        try:
            self._process = subprocess.Popen(
                [str(self.path), *self.args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
            )
        except OSError as error:
            # strerror, not str(error): the latter repeats the path, and these errors nest in longer ones.
            raise EngineError(f"cannot start engine {str(self.path)!r}: {error.strerror or error}") from error
        self._stdout_fd = self._process.stdout.fileno()  # type: ignore[union-attr]
        # poll, not select: select fails on descriptors >= 1024, common in big training processes.
        self._poller = select.poll()
        self._poller.register(self._stdout_fd, select.POLLIN)
        deadline = time.monotonic() + startup_timeout_s
        try:
            self._handshake(deadline, startup_timeout_s)
            wanted = choose_settings(self.options, self.label, threads=threads, hash_mb=hash_mb, options=options)
            self.settings = wanted
            commands = [f"setoption name {name} value {value}" for name, value in wanted.items()]
            self.send("\n".join([*commands, "isready"]))
            for _ in self._lines_until("readyok", deadline):
                pass
        except BaseException:  # a failed handshake leaves no process behind
            self.kill()
            raise

    # ----------------------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """How messages name this engine: its id name and binary, or the binary alone."""
        return f"{self.name} ({self.path})" if self.name else str(self.path)

    @property
    def is_stockfish(self) -> bool:
        return self.name.startswith("Stockfish")

    @property
    def pid(self) -> int:
        return self._process.pid

    def supports(self, option: str) -> bool:
        """Whether the engine advertised `option` (case-insensitive, as UCI says)."""
        return option.lower() in self.options

    def _value(self, option: UciOption, value: Any) -> str:
        try:
            return option.value_text(value)
        except ValueError as error:
            raise EngineUnsupported(f"engine {self.label}: {error}") from None

    def alive(self) -> bool:
        return self._process.poll() is None

    def send(self, commands: str) -> None:
        try:
            self._process.stdin.write((commands + "\n").encode())  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError) as error:
            raise EngineCrashed(f"engine {self.label} (pid {self.pid}) is gone (write failed: {error})") from None

    def _handshake(self, deadline: float, timeout_s: float) -> None:
        """``uci`` ... ``uciok``: the id name and the options; a clear error for anything else."""
        self.send("uci")
        other: list[str] = []  # what a non-UCI engine says instead, for the error message
        try:
            for line in self._lines_until("uciok", deadline):
                if line.startswith("id name "):
                    self.name = line[len("id name ") :].strip()
                elif line.startswith("option "):
                    option = parse_option(line)
                    if option is not None and option.name:
                        self.options[option.name.lower()] = option
                elif line.strip() and not line.startswith(("id ", "uciok")) and len(other) < 3:
                    other.append(line.strip())
        except EngineTimeout:
            said = f"it printed {quote(' | '.join(other), 160)}" if other else "it printed no UCI answer"
            raise EngineTimeout(
                f"engine {self.label} did not answer `uci` with `uciok` within {timeout_s:g} s; {said} "
                "(is it a UCI engine? xboard/WinBoard engines such as fairymax are not supported)"
            ) from None
        except EngineCrashed as error:
            raise EngineCrashed(f"engine {self.label} exited during the `uci` handshake ({error})") from None

    def _read_line(self, deadline: float) -> str:
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line, self._buffer = self._buffer[:newline], self._buffer[newline + 1 :]
                return line.decode(errors="replace").rstrip("\r")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineTimeout(f"engine {self.label} (pid {self.pid}) did not answer in time")
            if not self._poller.poll(max(1, int(remaining * 1000))):
                continue
            chunk = os.read(self._stdout_fd, 65536)
            if not chunk:
                try:  # its pipe closes just before it exits: wait a moment for the exit code
                    code = self._process.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    code = None  # closed its output and kept running
                raise EngineCrashed(f"engine {self.label} (pid {self.pid}) exited (code {code})")
            self._buffer += chunk

    def _lines_until(self, terminator: str, deadline: float) -> Iterator[str]:
        while True:
            line = self._read_line(deadline)
            yield line
            if line.startswith(terminator):
                return

    def search(
        self,
        fen: str,
        *,
        nodes: int | None = None,
        depth: int | None = None,
        movetime_ms: int | None = None,
        multipv: int = 1,
        clear_hash: bool = True,
        timeout_s: float = 60.0,
    ) -> SearchResult:
        """Search a (validated) FEN and return the final line of each multipv rank.

        Exactly one limit: `nodes`, `depth` or `movetime_ms`. The deadline is `timeout_s` (plus
        the move time). `EngineTimeout`, `EngineCrashed`, `EngineUnsupported` (MultiPV the engine
        lacks; a node limit it ignores) or `EngineError` (a score line that does not parse)."""
        if sum(limit is not None for limit in (nodes, depth, movetime_ms)) != 1:
            raise ValueError(f"give exactly one limit: nodes={nodes}, depth={depth}, movetime_ms={movetime_ms}")
        commands = []
        if clear_hash:
            # ucinewgame clears the hash table and the history heuristics, so a node-limited
            # search gives the same answer whatever this process searched before.
            commands.append("ucinewgame")
        if multipv != self._multipv:
            option = self.options.get("multipv")
            if option is None:
                raise EngineUnsupported(
                    f"engine {self.label} has no MultiPV option, so it cannot analyse {multipv} moves per position "
                    "(multipv labels and move-ranking rewards need Stockfish)"
                )
            commands.append(f"setoption name {option.name} value {self._value(option, multipv)}")
            self._multipv = multipv
        commands.append(f"position fen {fen}")
        if nodes is not None:
            commands.append(f"go nodes {nodes}")
        elif depth is not None:
            commands.append(f"go depth {depth}")
        else:
            commands.append(f"go movetime {movetime_ms}")
        self.send("\n".join(commands))
        deadline = time.monotonic() + timeout_s + (movetime_ms or 0) / 1000
        node_ceiling = NODE_LIMIT_SLACK * nodes + NODE_LIMIT_MARGIN if nodes is not None else None
        # Stockfish prints one block of lines (multipv 1..k) per iteration, and a last block when
        # the node limit stops it mid-iteration. Ranks in that last block can carry bounds or
        # scores from the previous depth, so lines are kept per block and `_final_lines` picks
        # the last block whose lines are all exact (never mixing blocks: that duplicated moves).
        blocks: list[list[str]] = []
        while True:
            line = self._read_line(deadline)
            if line.startswith("info"):
                if node_ceiling is not None:
                    searched = _nodes_of(line)
                    if searched is not None and searched > node_ceiling:
                        self._stop_quietly()
                        raise EngineUnsupported(
                            f"engine {self.label} ignores the node limit: asked for `go nodes {nodes}`, it had searched "
                            f"{searched} nodes and went on; give it a depth or movetime limit instead"
                        )
                if " score " in line:
                    try:
                        rank = _multipv_of(line)
                    except ValueError:
                        raise EngineError(f"engine {self.label} sent an unparsable info line {quote(line)}") from None
                    if rank == 1 or not blocks:
                        blocks.append([])
                    blocks[-1].append(line)
            elif line.startswith("bestmove"):
                parts = line.split()
                text = parts[1] if len(parts) > 1 else ""
                try:
                    lines = _final_lines(blocks)
                except ValueError as error:
                    raise EngineError(f"engine {self.label} sent an unparsable info line ({error})") from None
                return SearchResult(best_move=None if text in NO_BESTMOVE else text, lines=lines, bestmove_text=text)

    def _stop_quietly(self, timeout_s: float = 2.0) -> None:
        """``stop`` a search we give up on and read to its ``bestmove``; a process that does not
        stop is killed (the caller replaces it either way if it must)."""
        try:
            self.send("stop")
            deadline = time.monotonic() + timeout_s
            for _ in self._lines_until("bestmove", deadline):
                pass
        except EngineError:
            self.kill()

    def quit(self, timeout_s: float = 2.0) -> None:
        """Ask the engine to quit; kill it if it does not."""
        if self.alive():
            try:
                self.send("quit")
                self._process.wait(timeout=timeout_s)
            except (EngineError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        if self.alive():
            self._process.kill()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass
        for stream in (self._process.stdin, self._process.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass


def _score_key(line: SearchLine) -> float:
    """Sort key, higher is better for the side to move: mates beat any cp, faster mates first."""
    if line.mate is not None:
        return 1e6 - line.mate if line.mate > 0 else -1e6 - line.mate
    return float(line.cp if line.cp is not None else 0)


def _final_lines(blocks: list[list[str]]) -> list[SearchLine]:
    """The lines of the last block with every rank present and exact (no bound), best first.

    Falls back to the exact lines of the last block that has any, so a search always yields a
    score when Stockfish printed one.
    """
    widest = max((len(block) for block in blocks), default=0)
    for block in reversed(blocks):
        if len(block) == widest and not any(" lowerbound" in line or " upperbound" in line for line in block):
            parsed = [parse_info(line) for line in block]
            lines = [entry for entry in parsed if entry is not None]
            if len(lines) == len(block):
                return sorted(lines, key=_score_key, reverse=True)
    for block in reversed(blocks):
        lines = [entry for entry in (parse_info(line) for line in block) if entry is not None]
        if lines:
            return sorted(lines, key=_score_key, reverse=True)
    return []


def _multipv_of(line: str) -> int:
    index = line.find(" multipv ")
    if index < 0:
        return 1
    rest = line[index + 9 :]
    end = rest.find(" ")
    return int(rest if end < 0 else rest[:end])
