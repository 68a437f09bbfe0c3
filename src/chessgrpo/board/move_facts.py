"""Move facts: what the rules say about the position one legal move leads to, as bits per action.

A policy that reads only the board cannot see, in one forward pass, that a move leaves the
opponent without a legal reply: that takes the opponent's whole move generation. A small
transformer never learns it (docs/benchmarks.md, "Move facts": the quickstart policy stalemated
in 43% of its games against a random mover, and played a mate in one in 0.8% of the won positions
that had one). These facts are the legal-move mask's next step: exact, computed by python-chess,
and given to the policy as inputs (`models.policy.ActionPolicy` with ``move_facts``), where
learned, position-dependent weights decide what each fact is worth (a stalemate is bad for the
winning side and good for the losing one).

Bits of an action's fact byte (0 for an illegal move and for a legal move with none of them):
"""

from __future__ import annotations

from collections.abc import Sequence

import chess
import numpy as np

from chessgrpo.board.actions import NUM_ACTIONS, move_to_action
from chessgrpo.board.fast_moves import FACT_BITS, available, move_facts_fast

MOVE_FACTS = ("check", "checkmate", "stalemate", "insufficient_material", "fifty_moves")
"""Bit i of a fact byte is MOVE_FACTS[i]: the move gives check; mates; stalemates; leaves a dead
draw by insufficient material; reaches the fifty-move rule (100 plies without capture or pawn move)."""

CHECK, CHECKMATE, STALEMATE, INSUFFICIENT_MATERIAL, FIFTY_MOVES = (1 << i for i in range(len(MOVE_FACTS)))
# board.fast_moves cannot import these (this module imports it): its copies must stay the same bits.
assert FACT_BITS == (CHECK, CHECKMATE, STALEMATE, INSUFFICIENT_MATERIAL, FIFTY_MOVES), "fast_moves' fact bits differ"


def move_facts(board: chess.Board, fen: str | None = None) -> list[tuple[int, int]]:
    """(action, fact byte) for each legal move of `board` with at least one fact set, sorted by action.

    Computed by the fast backend (`board.fast_moves`, ~0.09 ms for a middlegame position) when it
    is installed, else by `move_facts_reference`; the two agree move for move (tests/test_fast_moves.py).
    `fen`: the board's FEN, when the caller has it.
    """
    facts = move_facts_fast(board, fen) if available(board) else None
    return sorted(move_facts_reference(board) if facts is None else facts)


def move_facts_reference(board: chess.Board) -> list[tuple[int, int]]:
    """python-chess's move facts, the reference: one push, one check test and the first legal
    reply per move (`any` stops at the first), ~0.55 ms for a middlegame position. The board is
    left as it was. Unsorted (legal-move order).
    """
    out: list[tuple[int, int]] = []
    for move in list(board.legal_moves):
        material_changes = board.is_capture(move) or move.promotion is not None
        board.push(move)
        try:
            bits = 0
            check = board.is_check()
            if not any(board.generate_legal_moves()):
                bits = CHECK | CHECKMATE if check else STALEMATE
            else:
                if check:
                    bits |= CHECK
                if material_changes and board.is_insufficient_material():
                    bits |= INSUFFICIENT_MATERIAL
                if board.halfmove_clock >= 100:
                    bits |= FIFTY_MOVES
        finally:
            board.pop()
        if bits:
            out.append((move_to_action(move), bits))
    return out


def move_fact_array(
    boards: Sequence[chess.Board], facts: Sequence[list[tuple[int, int]]] | None = None, fens: Sequence[str] | None = None
) -> np.ndarray:
    """uint8 [B, 1968]: the fact byte of every action of every board (0 where nothing holds).

    `facts`: each board's `move_facts`, when the caller has them already (search computes them
    once per leaf for its mate-in-one test and the network's input); `fens`: the boards' FENs, likewise.
    """
    if facts is not None and len(facts) != len(boards):
        raise ValueError(f"{len(facts)} fact lists for {len(boards)} boards")
    out = np.zeros((len(boards), NUM_ACTIONS), dtype=np.uint8)
    for row, board in enumerate(boards):
        for action, bits in move_facts(board, None if fens is None else fens[row]) if facts is None else facts[row]:
            out[row, action] = bits
    return out


def has_mate(facts: Sequence[tuple[int, int]]) -> bool:
    """Whether a position's `move_facts` include a checkmating move (a mate in one)."""
    return any(bits & CHECKMATE for _, bits in facts)
