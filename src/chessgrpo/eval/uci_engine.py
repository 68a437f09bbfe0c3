"""The policy as a UCI engine (`chessgrpo uci --checkpoint CKPT`): plays in any chess GUI,
cutechess-cli, fastchess or lichess-bot.

Supported commands (https://backscattering.de/chess/uci/):

- ``uci``: ``id name``/``id author``, the options ``Temperature`` (string, a number >= 0;
  0 = argmax) and ``Device`` (string, a torch device), then ``uciok``.
- ``isready`` -> ``readyok``; ``ucinewgame``; ``setoption name N value V``.
- ``position startpos|fen <FEN> [moves m1 m2 ...]``: the game history is kept, so the policy's
  repetition rule (`chessgrpo.eval.anchors.PolicyMover`) sees repetitions.
- ``go`` with any arguments (wtime, btime, movetime, depth, nodes, infinite, ...): the policy
  needs no search, so it answers at once with one ``info`` line and ``bestmove``; ``bestmove
  0000`` when the side to move has no legal move.
- ``stop``, ``ponderhit``, ``debug``, ``register``: accepted and ignored. ``quit`` or end of
  input: exit.

Robustness: no input makes it crash. Unknown commands are ignored with an ``info string``; a bad
``position`` (malformed FEN, illegal or malformed move) keeps the previous valid position and
answers ``info string error: ...``; a bad option value is refused the same way. Every response
is flushed at once.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TextIO

import chess

from chessgrpo.board.validation import parse_board, parse_move

logger = logging.getLogger(__name__)

ENGINE_AUTHOR = "chessgrpo"
MAX_LINE = 10_000
"""Longer input lines are refused (a position with ~1500 moves fits)."""


class UciEngine:
    """A UCI protocol loop around a `PolicyMover`; construct, then `run()`."""

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        device: str = "cpu",
        temperature: float = 0.0,
        input: TextIO | None = None,
        output: TextIO | None = None,
    ):
        from chessgrpo.eval.anchors import PolicyMover
        from chessgrpo.models.policy import load_policy, resolve_checkpoint

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.checkpoint = resolve_checkpoint(checkpoint)
        self.name = f"chessgrpo {Path(checkpoint).name or self.checkpoint.name}"
        self.device = device
        self.temperature = float(temperature)
        self.input = input or sys.stdin
        self.output = output or sys.stdout
        self.mover = PolicyMover(load_policy(self.checkpoint, device=device), temperature=self.temperature)
        self.mover.new_game(None, int(time.time_ns() % (2**62)))
        self.board = chess.Board()

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
        for line in self.input:
            try:
                if not self.handle(line):
                    break
            except Exception as error:  # noqa: BLE001 - a UCI engine must never die on input
                logger.exception("error handling %r", line)
                self.info(f"error: {type(error).__name__}: {error}")
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
            self.send(
                f"id name {self.name}",
                f"id author {ENGINE_AUTHOR}",
                f"option name Temperature type string default {self.temperature:g}",
                f"option name Device type string default {self.device}",
                "uciok",
            )
        elif command == "isready":
            self.send("readyok")
        elif command == "ucinewgame":
            self.board = chess.Board()
        elif command == "setoption":
            self.set_option(arguments)
        elif command == "position":
            self.set_position(arguments)
        elif command == "go":
            self.go()
        elif command in ("stop", "ponderhit", "debug", "register"):
            pass  # `go` has already answered; nothing runs in the background
        else:
            self.info(f"unknown command ignored: {line.strip()[:100]}")
        return True

    def set_option(self, arguments: list[str]) -> None:
        if not arguments or arguments[0] != "name":
            self.info("error: expected setoption name <name> [value <value>]")
            return
        if "value" in arguments:
            split = arguments.index("value")
            name, value = " ".join(arguments[1:split]), " ".join(arguments[split + 1 :])
        else:
            name, value = " ".join(arguments[1:]), ""
        key = name.lower()
        if key == "temperature":
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
        elif key == "device":
            import torch

            try:
                device = torch.device(value)
                self.mover.policy.to(device)
                torch.zeros(1, device=device)  # fails here, not mid-game, when the device is unusable
            except (RuntimeError, AssertionError, ValueError) as error:
                self.mover.policy.to(self.device)
                self.info(f"error: cannot use device {value!r} ({error}); keeping {self.device}")
                return
            self.device = value
        else:
            self.info(f"unknown option ignored: {name[:100]}")

    def set_position(self, arguments: list[str]) -> None:
        try:
            self.board = parse_position(arguments)
        except ValueError as error:
            self.info(f"error: {error}; keeping the previous position {self.board.fen()}")

    def go(self) -> None:
        started = time.perf_counter()
        if not any(self.board.generate_legal_moves()):
            self.info("no legal moves: the game is over")
            self.send("bestmove 0000")
            return
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
        self.send(f"bestmove {move.uci()}")


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
