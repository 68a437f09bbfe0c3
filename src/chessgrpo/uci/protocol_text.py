"""The UCI protocol's text, without state: the board of a ``position`` command (validated FEN, every move legal in
turn) and the ``info`` lines of a search result (one per MultiPV line, scores from the side to move's view, moves
written in their own positions). `uci.engine.UciEngine` reads and writes through these."""

from __future__ import annotations

from collections.abc import Sequence

import chess

from chessgrpo.board.validation import parse_board
from chessgrpo.search.base import SearchResult
from chessgrpo.uci.chess960 import parse_board_960, parse_uci_move
from chessgrpo.uci.scores import ExactValue, claimable_value, decided_score, estimate_score


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
