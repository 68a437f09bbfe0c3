"""A tiny UCI engine that misbehaves on purpose, for tests of how engine faults are reported.

Run it with the project's Python: ``python tests/fake_engine.py --mode MODE [--after K]``
(or set $FAKE_UCI_MODE / $FAKE_UCI_AFTER). It answers the ``uci`` handshake as "FakeEngine 1.0"
with a few options (Hash, Threads, Skill, and MultiPV unless ``--no-multipv``), and to ``go`` it
plays the first legal move (python-chess), with one ``info`` line. From its K-th ``go`` on
(default 1; counted per process) it misbehaves as MODE says:

=================  ===========================================================================
ok                 never misbehaves
no-uciok           never sends ``uciok`` (already at start-up)
garbage-bestmove   ``bestmove xyzzy``
illegal-bestmove   ``bestmove`` of a well-formed move that is illegal in the position
none-bestmove      ``bestmove (none)`` although there are legal moves
null-bestmove      ``bestmove 0000`` although there are legal moves
hang               stops answering (and reading) after ``go``
exit               prints one ``info`` line after ``go`` and exits with code 3
no-score           ``info`` lines without ``score``
no-pv              ``info`` lines with a score but without ``pv`` (harmless: a well-formed search)
ignore-nodes       ignores ``go nodes N``: searches "forever" (reports ever more nodes) until ``stop``
=================  ===========================================================================
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time

import chess

MODES = (
    "ok",
    "no-uciok",
    "garbage-bestmove",
    "illegal-bestmove",
    "none-bestmove",
    "null-bestmove",
    "hang",
    "exit",
    "no-score",
    "no-pv",
    "ignore-nodes",
)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class LineReader:
    """Lines from fd 0 with our own buffer, so `select` sees exactly what is unread."""

    def __init__(self) -> None:
        self.buffer = b""

    def readline(self, timeout: float | None = None) -> str | None:
        """The next line; None at end of input, "" when `timeout` passed first."""
        while b"\n" not in self.buffer:
            if timeout is not None and not select.select([0], [], [], timeout)[0]:
                return ""
            chunk = os.read(0, 4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


STDIN = LineReader()


def illegal_move(board: chess.Board) -> str:
    """A well-formed UCI move that is not legal in `board`."""
    for text in ("e2e5", "a1h8", "h8a1", "d1d8"):
        if not board.is_legal(chess.Move.from_uci(text)):
            return text
    raise AssertionError("no illegal move found")  # pragma: no cover


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default=os.environ.get("FAKE_UCI_MODE", "ok"), choices=MODES)
    parser.add_argument("--after", type=int, default=int(os.environ.get("FAKE_UCI_AFTER", "1")))
    parser.add_argument("--name", default=os.environ.get("FAKE_UCI_NAME", "FakeEngine 1.0"))
    parser.add_argument("--no-multipv", action="store_true", help="advertise no MultiPV option")
    args = parser.parse_args()
    board = chess.Board()
    searches = 0
    while (raw := STDIN.readline()) is not None:
        tokens = raw.split()
        if not tokens:
            continue
        command = tokens[0]
        if command == "uci":
            say(f"id name {args.name}")
            say("id author chessgrpo tests")
            say("option name Hash type spin default 16 min 1 max 64")
            say("option name Threads type spin default 1 min 1 max 4")
            if not args.no_multipv:
                say("option name MultiPV type spin default 1 min 1 max 8")
            say("option name Skill type spin default 10 min 0 max 20")
            if args.mode != "no-uciok":
                say("uciok")
        elif command == "isready":
            say("readyok")
        elif command == "position":
            board = parse_position(tokens)
        elif command == "go":
            searches += 1
            mode = args.mode if searches >= args.after else "ok"
            go(board, mode, tokens)
        elif command == "quit":
            return 0
        # setoption, ucinewgame, stop (outside a search): nothing to do
    return 0


def parse_position(tokens: list[str]) -> chess.Board:
    if tokens[1] == "startpos":
        board, rest = chess.Board(), tokens[2:]
    else:
        end = tokens.index("moves") if "moves" in tokens else len(tokens)
        board, rest = chess.Board(" ".join(tokens[2:end])), tokens[end:]
    for move in rest[1:]:
        board.push_uci(move)
    return board


def go(board: chess.Board, mode: str, tokens: list[str]) -> None:
    move = next(iter(board.legal_moves)).uci()
    if mode == "hang":
        while True:  # neither reads nor answers: only a kill ends it
            time.sleep(3600)
    if mode == "exit":
        say(f"info depth 1 score cp 0 nodes 1 pv {move}")
        sys.exit(3)
    if mode == "ignore-nodes":
        nodes = 0
        while True:  # "searches" until `stop`, reporting its node count as a real engine does
            nodes += 500_000
            say(f"info depth {nodes // 500_000} score cp 0 nodes {nodes} pv {move}")
            line = STDIN.readline(timeout=0.02)
            if line is None or line.strip() == "stop":
                break
    elif mode == "no-score":
        say(f"info depth 1 nodes 10 pv {move}")
    elif mode == "no-pv":
        say("info depth 1 score cp 12 nodes 10")
    else:
        say(f"info depth 1 seldepth 1 multipv 1 score cp 0 nodes 10 pv {move}")
    best = {
        "garbage-bestmove": "xyzzy",
        "illegal-bestmove": illegal_move(board),
        "none-bestmove": "(none)",
        "null-bestmove": "0000",
    }.get(mode, move)
    say(f"bestmove {best}")


if __name__ == "__main__":
    sys.exit(main())
