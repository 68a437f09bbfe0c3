"""The fast move-facts path (rust_chess) against the python-chess reference, move for move."""

from __future__ import annotations

import random

import chess
import pytest

from chessgrpo.board import fast_moves
from chessgrpo.board.move_facts import (
    CHECKMATE,
    FIFTY_MOVES,
    INSUFFICIENT_MATERIAL,
    STALEMATE,
    move_facts,
    move_facts_reference,
)

pytestmark = pytest.mark.skipif(fast_moves.backend() != "rust_chess", reason="rust_chess is not installed")


def playout_positions(games: int, seed: int) -> list[chess.Board]:
    """Positions of random games (every 3rd ply), to the end: promotions, castling, en passant,
    long endgames with high halfmove clocks, mates, stalemates and bare kings all occur."""
    rng = random.Random(seed)
    out = []
    for _ in range(games):
        board = chess.Board()
        while not board.is_game_over(claim_draw=False) and board.ply() < 400:
            moves = list(board.legal_moves)
            # Prefer captures and promotions now and then, so that material runs out and endings are reached.
            sharp = [m for m in moves if board.is_capture(m) or m.promotion]
            board.push(rng.choice(sharp) if sharp and rng.random() < 0.3 else rng.choice(moves))
            if board.ply() % 3 == 0:
                out.append(board.copy(stack=False))
    return out


SPECIAL = [
    "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1",  # back-rank mate in one
    "7k/8/6QK/8/8/8/8/8 w - - 0 1",  # queen moves that stalemate
    "8/8/8/8/8/2k5/1p6/1K6 b - - 0 1",  # king and pawn: promotions
    "8/8/8/4k3/8/8/3n4/3NK3 w - - 0 1",  # KN v KN: Nxd2 leaves K v KN (insufficient)
    "8/8/3k4/8/8/2b5/3B4/4K3 w - - 0 1",  # KB v KB: Bxc3 leaves bare kings
    "k7/8/8/8/8/4B3/3b4/B6K w - - 0 1",  # several bishops: Bxd2 leaves two bishops on dark squares
    "4k3/8/8/8/8/8/4r3/R3K2R w KQ - 99 80",  # fifty moves on the next quiet ply; castling
    "4k3/8/8/8/8/8/4r3/R3K2R w KQ - 16 75",  # a nonzero clock (it aborted rust_chess when passed through)
    "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",  # en passant
    "r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1",  # castling both ways
    "2n5/8/2P4k/8/pR2N2p/7K/8/1R4r1 b - - 16 75",  # the position that aborted the process
]


@pytest.mark.slow
def test_fast_facts_match_the_reference_on_thousands_of_positions():
    boards = playout_positions(60, seed=0) + [chess.Board(fen) for fen in SPECIAL]
    assert len(boards) > 3000
    seen = 0
    for board in boards:
        expected = sorted(move_facts_reference(board))
        assert sorted(fast_moves.move_facts_fast(board) or []) == expected, board.fen()
        assert move_facts(board) == expected  # the public function: sorted, same facts
        seen |= sum(bits for _, bits in expected)
    # Every fact occurred, so each rule was compared at least once.
    assert seen & CHECKMATE and seen & STALEMATE and seen & INSUFFICIENT_MATERIAL and seen & FIFTY_MOVES


def test_environment_switch_forces_the_reference(monkeypatch):
    board = chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")
    monkeypatch.setenv(fast_moves.BACKEND_ENV, "python")
    assert fast_moves.backend() == "python-chess" and not fast_moves.available(board)
    assert move_facts(board) == sorted(move_facts_reference(board))
    monkeypatch.delenv(fast_moves.BACKEND_ENV)
    assert fast_moves.available(board)


def test_a_position_the_backend_rejects_falls_back_to_the_reference():
    board = chess.Board("8/8/8/2k5/8/4B3/3b4/B3K3 w - - 0 1")  # an impossible check: python-chess reads it anyway
    assert move_facts(board) == sorted(move_facts_reference(board))


def test_chess960_boards_stay_on_python_chess():
    board = chess.Board.from_chess960_pos(518)
    assert not fast_moves.available(board)


def won_endgames(count: int, seed: int) -> list[chess.Board]:
    """Random king + two pieces against a bare king, the side with the pieces to move and able to
    check: positions where checks that force mate in two are common."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        board = chess.Board(None)
        squares = rng.sample(chess.SQUARES, 4)
        board.set_piece_at(squares[0], chess.Piece(chess.KING, chess.WHITE))
        board.set_piece_at(squares[1], chess.Piece(chess.KING, chess.BLACK))
        for square in squares[2:]:
            board.set_piece_at(
                square, chess.Piece(rng.choice([chess.QUEEN, chess.ROOK, chess.BISHOP, chess.KNIGHT]), chess.WHITE)
            )
        if board.is_valid() and not board.is_game_over() and any(board.gives_check(m) for m in board.legal_moves):
            out.append(board)
    return out


@pytest.mark.slow
def test_fast_mate_in_two_matches_the_reference(monkeypatch):
    from chessgrpo.board.move_facts import mate_in_two_actions, mate_in_two_reference

    boards = playout_positions(40, seed=1) + won_endgames(400, seed=2)
    assert len(boards) > 2000
    fast = [sorted(fast_moves.mate_in_two_fast(board) or []) for board in boards]
    public = [sorted(mate_in_two_actions(board)) for board in boards]
    monkeypatch.setenv(fast_moves.BACKEND_ENV, "python")  # the reference all the way down (its inner move facts too)
    for board, fast_actions, public_actions in zip(boards, fast, public):
        expected = sorted(mate_in_two_reference(board))
        assert fast_actions == expected == public_actions, board.fen()
    assert sum(map(len, fast)) > 100  # the sample holds mates in two to find
