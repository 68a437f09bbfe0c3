"""Repetitions: what a move does to the game's repetition count, as move-fact bits.

A policy that reads one position sees no history, so a cycle it enters once it enters again: the
endgame policies from a random network lost every game they did not mate to a threefold repetition
(docs/results.md, "Endgames from a random network"). These facts give the history to the policy the
way the rule facts give it the rules (`board.move_facts`): per legal move, exact, from the game's
move stack.

- `REPETITION` (bit 8): the position after the move has stood on the board before in this game.
- `THREEFOLD` (bit 9): it has stood there twice before: the move draws by threefold repetition
  (`engine.tablebase_values.game_over`).
- `ALLOWS_THREEFOLD` (bit 10): the opponent has a reply that draws by threefold repetition. Without it a
  policy that avoids its own third repetitions still walks into cycles the opponent closes: the KQvK policy
  from a random network with the two facts above lost 25-35% of its held-out games to repetitions the perfect
  defender completed (docs/results.md, "Endgames from a random network").

A board without a move stack (a dataset's FEN, a search's copied leaf) has no history: neither bit
is ever set there. Hot loops that push moves themselves keep the counts as they go (`record`) and
pass them in, instead of walking the move stack back for every position (`position_counts`).
"""

from __future__ import annotations

import chess

from chessgrpo.board.actions import move_to_action

REPETITION = 1 << 8
"""Bit 8 of a move's facts: the position after the move stood on the board before in this game."""
THREEFOLD = 1 << 9
"""Bit 9: the position after the move stood on the board twice before (the move draws by threefold repetition)."""

ALLOWS_THREEFOLD = 1 << 10
"""Bit 10: after the move the opponent has a reply that brings a position on the board for the third time."""

PositionKey = tuple
"""`position_key` of a board."""


def position_key(board: chess.Board) -> PositionKey:
    """What makes two positions the same for repetition: pieces, side to move, castling rights and
    a legal en-passant capture (as python-chess's own repetition check)."""
    return (
        board.pawns,
        board.knights,
        board.bishops,
        board.rooks,
        board.queens,
        board.kings,
        board.occupied_co[chess.WHITE],
        board.occupied_co[chess.BLACK],
        board.turn,
        board.clean_castling_rights(),
        board.ep_square if board.has_legal_en_passant() else None,
    )


def position_counts(board: chess.Board) -> dict[PositionKey, int]:
    """How often each position since the last capture or pawn move has stood on the board (the current one included)."""
    counts: dict[PositionKey, int] = {}
    history = board.copy()
    counts[position_key(history)] = 1
    while history.move_stack:
        move = history.pop()
        key = position_key(history)
        counts[key] = counts.get(key, 0) + 1
        if history.is_zeroing(move):  # nothing before an irreversible move can recur
            break
    return counts


def record(counts: dict[PositionKey, int], board: chess.Board, zeroing: bool) -> dict[PositionKey, int]:
    """The counts after a move was pushed on `board`: `zeroing` (a capture or pawn move, `chess.Board.is_zeroing`
    before the push) starts them afresh, since no earlier position can recur. Updates `counts` in place otherwise."""
    key = position_key(board)
    if zeroing:
        return {key: 1}
    counts[key] = counts.get(key, 0) + 1
    return counts


def repetition_facts(
    board: chess.Board, counts: dict[PositionKey, int] | None = None, *, allows: bool = False
) -> list[tuple[int, int]]:
    """(action, `REPETITION` | `THREEFOLD` bits, with `allows` also `ALLOWS_THREEFOLD`) of each legal move of
    `board` with one of them, sorted by action; empty for a board with no history.

    `counts`: the game's `position_counts`, when the caller keeps them (then the move stack is not read).
    Only a quiet move (no capture, pawn move or castling) can repeat a position, and only one that moves a piece
    between the squares where the position and a position of the history differ: the others are not pushed at
    all (~0.03 ms for a position without repeats).
    """
    if counts is None:
        if not board.move_stack:
            return []
        counts = position_counts(board)
    bits: dict[int, int] = {}
    # After our move the opponent is to move: only those positions of the history can come back.
    targets = {key: count for key, count in counts.items() if key[8] != board.turn}
    for move in _quiet_moves(board, {key[6] | key[7] for key in targets}) if targets else []:
        board.push(move)
        try:
            seen = targets.get(position_key(board), 0)
        finally:
            board.pop()
        if seen:
            bits[move_to_action(move)] = REPETITION | (THREEFOLD if seen >= 2 else 0)
    # Positions with us to move seen twice: a move and a reply that lead back to one draw the game.
    twice = {key for key, count in counts.items() if count >= 2 and key[8] == board.turn} if allows else set()
    ours = {key[6] if board.turn == chess.WHITE else key[7] for key in twice}
    for move in _quiet_moves(board, ours, own=True) if twice else []:
        board.push(move)
        try:
            for reply in _quiet_moves(board, {key[6] | key[7] for key in twice}):
                board.push(reply)
                closes = position_key(board) in twice
                board.pop()
                if closes:
                    action = move_to_action(move)
                    bits[action] = bits.get(action, 0) | ALLOWS_THREEFOLD
                    break
        finally:
            board.pop()
    return sorted(bits.items())


def _quiet_moves(board: chess.Board, occupancies: set[int], *, own: bool = False) -> list[chess.Move]:
    """The legal moves of `board` that are not captures, pawn moves or castling and after which the occupied squares
    (with `own`: the mover's occupied squares) are one of `occupancies`: the only moves that can lead back to a
    position with those squares."""
    occupied = board.occupied_co[board.turn] if own else board.occupied
    out = []
    for move in board.generate_legal_moves():
        if occupied ^ chess.BB_SQUARES[move.from_square] ^ chess.BB_SQUARES[move.to_square] not in occupancies:
            continue
        if not board.is_zeroing(move) and not board.is_castling(move):
            out.append(move)
    return out
