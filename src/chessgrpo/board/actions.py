"""The fixed 1968-move action space, in the same order as searchless_chess.

Order of ``ACTIONS``:

1. For each from-square 0..63 (python-chess indices, a1=0, b1=1, ..., h8=63):
   the squares a queen there attacks on an empty board (ascending index), then
   the squares a knight there attacks (ascending index). 1456 + 336 moves.
   Non-promoting pawn moves, king moves and castling (as the king's two-square
   move, e.g. ``e1g1``) are all among these.
2. Promotions, 176 moves: rank 2 -> rank 1 first, then rank 7 -> rank 8; for each
   file a..h the straight move, then the capture towards the lower file, then
   towards the higher file, each with pieces ``q, r, b, n``.

Legal-move masks use a precomputed integer lookup table keyed by
``promotion_piece_type_or_0 * 4096 + from_square * 64 + to_square`` so no UCI
strings are built per move.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping, Sequence

import chess
import numpy as np

from chessgrpo.errors import quote

__all__ = [
    "ACTIONS",
    "NUM_ACTIONS",
    "ACTION_INDEX",
    "move_to_action",
    "action_to_move",
    "legal_mask",
    "legal_masks",
    "legal_actions",
]

_FILES = "abcdefgh"
# Promotion suffixes in table order, with their python-chess piece types.
_PROMOTION_PIECES = (("q", chess.QUEEN), ("r", chess.ROOK), ("b", chess.BISHOP), ("n", chess.KNIGHT))
_KNIGHT_STEPS = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))


def _square(file: int, rank: int) -> int:
    return rank * 8 + file


def _queen_targets(square: int) -> list[int]:
    """Squares a queen on ``square`` attacks on an empty board, ascending."""
    f0, r0 = square % 8, square // 8
    targets = []
    for target in range(64):
        df, dr = target % 8 - f0, target // 8 - r0
        if target != square and (df == 0 or dr == 0 or abs(df) == abs(dr)):
            targets.append(target)
    return targets


def _knight_targets(square: int) -> list[int]:
    """Squares a knight on ``square`` attacks, ascending."""
    f0, r0 = square % 8, square // 8
    targets = [_square(f0 + df, r0 + dr) for df, dr in _KNIGHT_STEPS if 0 <= f0 + df < 8 and 0 <= r0 + dr < 8]
    return sorted(targets)


def _build_actions() -> tuple[tuple[str, int, int, int], ...]:
    """Return (uci, from_square, to_square, promotion_or_0) in table order."""
    entries: list[tuple[str, int, int, int]] = []
    for src in range(64):
        for dst in _queen_targets(src) + _knight_targets(src):
            entries.append((chess.SQUARE_NAMES[src] + chess.SQUARE_NAMES[dst], src, dst, 0))
    for from_rank, to_rank in ((1, 0), (6, 7)):  # 0-based: rank 2 -> 1, rank 7 -> 8
        for file in range(8):
            src = _square(file, from_rank)
            for to_file in (file, file - 1, file + 1):
                if not 0 <= to_file < 8:
                    continue
                dst = _square(to_file, to_rank)
                for suffix, piece in _PROMOTION_PIECES:
                    uci = chess.SQUARE_NAMES[src] + chess.SQUARE_NAMES[dst] + suffix
                    entries.append((uci, src, dst, piece))
    return tuple(entries)


_ENTRIES = _build_actions()

ACTIONS: tuple[str, ...] = tuple(entry[0] for entry in _ENTRIES)
NUM_ACTIONS: int = 1968
ACTION_INDEX: Mapping[str, int] = types.MappingProxyType({uci: i for i, uci in enumerate(ACTIONS)})

assert len(ACTIONS) == NUM_ACTIONS == 1456 + 336 + 176, len(ACTIONS)
assert len(ACTION_INDEX) == NUM_ACTIONS, "duplicate entries in the action table"

# (promotion or 0) * 4096 + from * 64 + to -> action index, -1 where no action.
# Promotion piece types go up to KING (6), so 7 blocks cover every chess.Move.
_KEY_BLOCK = 64 * 64
_MOVE_KEY_TO_ACTION = np.full(7 * _KEY_BLOCK, -1, dtype=np.int64)
for _i, (_uci, _src, _dst, _promo) in enumerate(_ENTRIES):
    _MOVE_KEY_TO_ACTION[_promo * _KEY_BLOCK + _src * 64 + _dst] = _i
_MOVE_KEY_TO_ACTION.setflags(write=False)
del _i, _uci, _src, _dst, _promo

_UCI_RE = re.compile(r"[a-h][1-8][a-h][1-8][qrbnk]?")


def _move_key(move: chess.Move) -> int:
    return (move.promotion or 0) * _KEY_BLOCK + move.from_square * 64 + move.to_square


def move_to_action(move: chess.Move | str) -> int:
    """Return the action index of a move.

    Args:
        move: a ``chess.Move`` or a lowercase UCI string such as ``"e2e4"`` or
            ``"e7e8q"``. Castling must be given as the king move (``"e1g1"``).

    Returns:
        Index in ``[0, NUM_ACTIONS)``.

    Raises:
        ValueError: if the move is malformed or not in the action table
            (e.g. ``"a1a1"``, ``"e2e4q"``, a drop or the null move).
    """
    if isinstance(move, str):
        index = ACTION_INDEX.get(move)
        if index is not None:
            return index
        if _UCI_RE.fullmatch(move) is None:
            raise ValueError(f"malformed UCI move {quote(move)}: expected e.g. 'e2e4' or 'e7e8q'")
        raise ValueError(f"move {quote(move)} is not in the {NUM_ACTIONS}-move action table")
    if isinstance(move, chess.Move):
        if move.drop is None and move:  # drops and the null move have no action
            index = int(_MOVE_KEY_TO_ACTION[_move_key(move)])
            if index >= 0:
                return index
        raise ValueError(f"move {move.uci()!r} is not in the {NUM_ACTIONS}-move action table")
    raise TypeError(f"expected a chess.Move or UCI string, got {type(move).__name__}: {quote(move)}")


def action_to_move(index: int) -> chess.Move:
    """Return a new ``chess.Move`` for an action index.

    Args:
        index: integer in ``[0, NUM_ACTIONS)`` (numpy integers are accepted).

    Raises:
        ValueError: if ``index`` is out of range or not an integer.
    """
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise ValueError(f"action index must be an integer, got {index!r}")
    if not 0 <= index < NUM_ACTIONS:
        raise ValueError(f"action index {index!r} out of range [0, {NUM_ACTIONS})")
    _, src, dst, promo = _ENTRIES[int(index)]
    # A fresh Move each call: chess.Move is mutable, so never hand out shared ones.
    return chess.Move(src, dst, promotion=promo or None)


def _check_board(board: chess.Board) -> None:
    if not isinstance(board, chess.Board):
        raise TypeError(f"expected a chess.Board, got {type(board).__name__}: {board!r}")
    if board.chess960:
        raise ValueError(f"chess960 board {board.fen()!r} is not supported by the action space")
    if board.uci_variant != "chess":
        raise ValueError(f"variant {board.uci_variant!r} board {board.fen()!r} is not supported")


def _legal_indices(board: chess.Board) -> np.ndarray:
    """Unsorted action indices of the legal moves of a validated board."""
    keys = np.fromiter((_move_key(m) for m in board.legal_moves), dtype=np.int64)
    indices = _MOVE_KEY_TO_ACTION[keys]
    if indices.size and indices.min() < 0:
        # Cannot happen for standard chess; guards against exotic Board subclasses.
        bad = [m.uci() for m in board.legal_moves if _MOVE_KEY_TO_ACTION[_move_key(m)] < 0]
        raise ValueError(f"board {board.fen()!r} has legal moves outside the action table: {bad}")
    return indices


def legal_mask(board: chess.Board) -> np.ndarray:
    """Boolean mask of shape ``(NUM_ACTIONS,)``, True exactly at the legal moves.

    Raises:
        ValueError: for chess960 or variant boards.
    """
    _check_board(board)
    mask = np.zeros(NUM_ACTIONS, dtype=bool)
    mask[_legal_indices(board)] = True
    return mask


def legal_masks(boards: Sequence[chess.Board]) -> np.ndarray:
    """Stacked legal masks, bool array of shape ``(len(boards), NUM_ACTIONS)``."""
    if isinstance(boards, chess.Board):
        raise TypeError("legal_masks expects a sequence of boards; use legal_mask for one")
    boards = list(boards)
    masks = np.zeros((len(boards), NUM_ACTIONS), dtype=bool)
    for row, board in enumerate(boards):
        _check_board(board)
        masks[row, _legal_indices(board)] = True
    return masks


def legal_actions(board: chess.Board) -> np.ndarray:
    """Sorted int64 action indices of the legal moves of ``board``."""
    _check_board(board)
    return np.sort(_legal_indices(board))
