"""A faster move generator for the hot loops, always checked against python-chess.

python-chess (pure Python) is the reference for every rule in chessgrpo. Move facts
(`board.move_facts`) are its most expensive use: one push, one check test, the first legal reply
and one pop per legal move, ~0.55 ms for a middlegame position on the 2-core VM, paid for every
position a policy reads (rollouts, search leaves, games, pretraining inputs). `rust_chess` (Python
bindings of the Rust `chess` crate, a pinned dependency) computes the same facts in ~0.09 ms
(docs/results.md, "Design choices"; the search speed-up: docs/benchmarks.md, "Search: `bench/search_speed.py`").
`move_facts_fast` is that path; tests/test_fast_moves.py checks it against the python-chess reference
move for move on thousands of positions (engine games, random playouts with promotions, castling,
en passant, checkmates, stalemates and bare-king endings).

What it guards against:
- rust_chess 0.4.3 aborts the whole process (a Rust panic, not an exception) when a FEN's halfmove
  clock is nonzero, because it indexes a repetition history it does not have. It never sees a
  clock: positions go in with ``0 1``, and the fifty-move fact comes from python-chess's clock.
- Rules where the two libraries differ are computed here, not taken from rust_chess: insufficient
  material follows python-chess's `Board.is_insufficient_material` exactly (rust_chess has no
  "bishops all on one colour" case with several bishops).
- Chess960 and variant boards never reach it (`available` says no, and callers use python-chess).

``CHESSGRPO_MOVEGEN=python`` in the environment forces the python-chess reference everywhere.
"""

from __future__ import annotations

import os

import chess

from chessgrpo.board.actions import ACTION_INDEX

try:  # pragma: no branch - both ways are exercised by the tests through the environment switch
    import rust_chess as _rc
except ImportError:  # a machine without the wheel still works, at python-chess speed
    _rc = None

BACKEND_ENV = "CHESSGRPO_MOVEGEN"

# Fact bits, as in board.move_facts (not imported from there: that module imports this one).
_CHECK, _CHECKMATE, _STALEMATE, _INSUFFICIENT_MATERIAL, _FIFTY_MOVES = (1 << i for i in range(5))
FACT_BITS = (_CHECK, _CHECKMATE, _STALEMATE, _INSUFFICIENT_MATERIAL, _FIFTY_MOVES)  # checked by board.move_facts

if _rc is not None:
    _PIECE_TYPES = (_rc.PAWN, _rc.KNIGHT, _rc.BISHOP, _rc.ROOK, _rc.QUEEN, _rc.KING)
    _COLOURS = ((_rc.WHITE, _rc.BLACK), (_rc.BLACK, _rc.WHITE))


def backend() -> str:
    """``rust_chess`` when the fast path is in use, else ``python-chess``."""
    if _rc is None or os.environ.get(BACKEND_ENV, "").strip().lower() in ("python", "python-chess", "reference"):
        return "python-chess"
    return "rust_chess"


def available(board: chess.Board) -> bool:
    """Whether `board` can take the fast path (standard chess, fast backend installed and not disabled)."""
    return not board.chess960 and board.uci_variant == "chess" and backend() == "rust_chess"


def _insufficient_material(board: object) -> bool:
    """python-chess's `Board.is_insufficient_material` on a rust_chess board (neither side can mate)."""
    pawns, knights, bishops, rooks, queens, kings = (int(board.get_piece_type_bitboard(p)) for p in _PIECE_TYPES)  # type: ignore[attr-defined]
    for colour, other in _COLOURS:
        mine = int(board.get_color_bitboard(colour))  # type: ignore[attr-defined]
        if mine & (pawns | rooks | queens):
            return False
        if mine & knights:
            theirs = int(board.get_color_bitboard(other))  # type: ignore[attr-defined]
            if bin(mine).count("1") > 2 or theirs & ~kings & ~queens:
                return False
        elif mine & bishops:
            same_colour = not (bishops & chess.BB_DARK_SQUARES) or not (bishops & chess.BB_LIGHT_SQUARES)
            if not same_colour or pawns or knights:
                return False
    return True


def _rust_board(board: chess.Board, fen: str | None) -> object | None:
    """`board` as a rust_chess board without its clocks (module docstring); None if the backend refuses it."""
    placement, turn, castling, ep = (board.fen() if fen is None else fen).split(" ", 4)[:4]
    try:
        return _rc.Board.from_fen(f"{placement} {turn} {castling} {ep} 0 1")
    except ValueError:
        return None


def _has_mate_in_one(board: object) -> bool:
    """Whether the side to move on a rust_chess board has a move that mates."""
    for move in board.generate_legal_moves():  # type: ignore[attr-defined]
        if board.make_move_new(move, False).is_checkmate():  # type: ignore[attr-defined]
            return True
    return False


def mate_in_two_fast(board: chess.Board, fen: str | None = None, checks: set[int] | None = None) -> list[int] | None:
    """`board.move_facts.mate_in_two_reference` computed by rust_chess: the actions of the checks after
    which the opponent has a reply and every reply allows a mate in one.

    The caller checks `available(board)` first. `checks`: the actions of the board's non-mating checks
    when the caller knows them (only those are searched); None for a position the backend refuses.
    Checkmate does not depend on the clocks, so dropping them changes nothing here.
    """
    assert _rc is not None
    fast = _rust_board(board, fen)
    if fast is None:
        return None
    out: list[int] = []
    for move in fast.generate_legal_moves():  # type: ignore[attr-defined]
        action = ACTION_INDEX[move.get_uci()]
        if checks is not None and action not in checks:
            continue
        after = fast.make_move_new(move, False)  # type: ignore[attr-defined]
        if checks is None and not after.is_check():
            continue
        replies = list(after.generate_legal_moves())
        if replies and all(_has_mate_in_one(after.make_move_new(reply, False)) for reply in replies):
            out.append(action)
    return out


def move_facts_fast(board: chess.Board, fen: str | None = None) -> list[tuple[int, int]] | None:
    """`board.move_facts.move_facts` computed by rust_chess: (action, fact byte) per legal move with a fact.

    The caller checks `available(board)` first. The same list as the reference, in the backend's move
    order; None for a position the backend refuses (an impossible check that python-chess reads anyway).
    `fen`: the board's FEN, when the caller has it.
    """
    assert _rc is not None
    fast = _rust_board(board, fen)
    if fast is None:
        return None
    fifty_possible = board.halfmove_clock >= 99  # one more non-zeroing ply reaches 100
    out: list[tuple[int, int]] = []
    for move in fast.generate_legal_moves():
        material_changes = move.promotion is not None or fast.is_capture(move)
        after = fast.make_move_new(move, False)  # legal by construction: skip the re-check
        check = after.is_check()
        if after.generate_next_legal_move() is None:
            bits = _CHECK | _CHECKMATE if check else _STALEMATE
        else:
            bits = _CHECK if check else 0
            if material_changes and _insufficient_material(after):
                bits |= _INSUFFICIENT_MATERIAL
            if fifty_possible and not fast.is_zeroing(move):
                bits |= _FIFTY_MOVES
        if bits:
            out.append((ACTION_INDEX[move.get_uci()], bits))
    return out
