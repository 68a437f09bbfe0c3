"""One Stockfish process driven over a UCI pipe, with deadlines on every read.

This is deliberately lower level than `chess.engine.SimpleEngine`: reward computation issues
thousands of tiny searches per second, and a synchronous pipe with `select` deadlines has less
per-search overhead and lets us detect a hung or crashed process ourselves (POSIX only).
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import time
from pathlib import Path

from chessgrpo.engine.locate import EngineError


class EngineCrashed(EngineError):
    """The engine process exited or closed its pipes."""


class EngineTimeout(EngineError):
    """The engine did not answer before its deadline."""


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
    lines: list[SearchLine]  # ordered by multipv rank, best first


def parse_info(line: str) -> SearchLine | None:
    """Parse an ``info ... score ...`` line; None for lines without a final score."""
    tokens = line.split()
    if "score" not in tokens or "lowerbound" in tokens or "upperbound" in tokens:
        return None
    multipv, depth, nodes = 1, 0, 0
    cp = mate = None
    pv: tuple[str, ...] = ()
    i = 1
    while i < len(tokens):
        token = tokens[i]
        if token == "pv":
            pv = tuple(tokens[i + 1 :])
            break
        if token == "score":
            kind, value = tokens[i + 1], int(tokens[i + 2])
            if kind == "cp":
                cp = value
            else:
                mate = value
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
    return SearchLine(multipv=multipv, cp=cp, mate=mate, pv=pv, depth=depth, nodes=nodes)


class UciProcess:
    """A running engine process. Not thread-safe: one owner thread at a time."""

    def __init__(self, path: Path, *, threads: int = 1, hash_mb: int = 1, startup_timeout_s: float = 30.0):
        self.path = path
        self.name = ""
        self._buffer = b""
        self._multipv = 1
        try:
            self._process = subprocess.Popen(
                [str(path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
            )
        except OSError as error:
            raise EngineError(f"cannot start engine {str(path)!r}: {error}") from error
        self._stdout_fd = self._process.stdout.fileno()  # type: ignore[union-attr]
        # poll, not select: select fails on descriptors >= 1024, common in big training processes.
        self._poller = select.poll()
        self._poller.register(self._stdout_fd, select.POLLIN)
        deadline = time.monotonic() + startup_timeout_s
        try:
            self.send("uci")
            for line in self._lines_until("uciok", deadline):
                if line.startswith("id name "):
                    self.name = line[len("id name ") :].strip()
            self.send(f"setoption name Threads value {threads}\nsetoption name Hash value {hash_mb}\nisready")
            for _ in self._lines_until("readyok", deadline):
                pass
        except BaseException:  # a failed handshake leaves no process behind
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.poll() is None

    def send(self, commands: str) -> None:
        try:
            self._process.stdin.write((commands + "\n").encode())  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError) as error:
            raise EngineCrashed(f"engine process {self.pid} is gone (write failed: {error})") from None

    def _read_line(self, deadline: float) -> str:
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line, self._buffer = self._buffer[:newline], self._buffer[newline + 1 :]
                return line.decode(errors="replace").rstrip("\r")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineTimeout(f"engine process {self.pid} did not answer in time")
            if not self._poller.poll(max(1, int(remaining * 1000))):
                continue
            chunk = os.read(self._stdout_fd, 65536)
            if not chunk:
                code = self._process.poll()
                raise EngineCrashed(f"engine process {self.pid} exited (code {code})")
            self._buffer += chunk

    def _lines_until(self, terminator: str, deadline: float):
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
        multipv: int = 1,
        clear_hash: bool = True,
        timeout_s: float = 60.0,
    ) -> SearchResult:
        """Search a (validated) FEN and return the final line of each multipv rank."""
        commands = []
        if clear_hash:
            # ucinewgame clears the hash table and the history heuristics, so a node-limited
            # search gives the same answer whatever this process searched before.
            commands.append("ucinewgame")
        if multipv != self._multipv:
            commands.append(f"setoption name MultiPV value {multipv}")
            self._multipv = multipv
        commands.append(f"position fen {fen}")
        commands.append(f"go nodes {nodes}" if nodes is not None else f"go depth {depth}")
        self.send("\n".join(commands))
        deadline = time.monotonic() + timeout_s
        # Stockfish prints one block of lines (multipv 1..k) per iteration, and a last block when
        # the node limit stops it mid-iteration. Ranks in that last block can carry bounds or
        # scores from the previous depth, so lines are kept per block and `_final_lines` picks
        # the last block whose lines are all exact (never mixing blocks: that duplicated moves).
        blocks: list[list[str]] = []
        while True:
            line = self._read_line(deadline)
            if line.startswith("info") and " score " in line:
                rank = _multipv_of(line)
                if rank == 1 or not blocks:
                    blocks.append([])
                blocks[-1].append(line)
            elif line.startswith("bestmove"):
                parts = line.split()
                best = parts[1] if len(parts) > 1 and parts[1] != "(none)" else None
                return SearchResult(best_move=best, lines=_final_lines(blocks))

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
        if len(block) == widest and not any(" lowerbound" in l or " upperbound" in l for l in block):
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
