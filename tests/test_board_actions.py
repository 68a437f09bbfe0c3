"""Tests for the fixed 1968-move action space (chessgrpo.board.actions)."""

from __future__ import annotations

import csv

import chess
import numpy as np
import pytest

from chessgrpo.board import (
    ACTION_INDEX,
    ACTIONS,
    NUM_ACTIONS,
    action_to_move,
    legal_actions,
    legal_mask,
    legal_masks,
    move_to_action,
)
from helpers import data_file, random_playout_positions

# Hand-written positions covering the special move kinds.
SPECIAL_FENS = {
    "castle_white_both": "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1",
    "castle_black_both": "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R b KQkq - 0 1",
    "castle_white_kingside_only": "r3k2r/8/8/8/8/8/8/R3K2R w Kq - 0 1",
    "ep_white": "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
    "ep_black": "rnbqkbnr/pppp1ppp/8/8/3Pp3/8/PPP1PPPP/RNBQKBNR b KQkq d3 0 3",
    "promo_white": "1n1r4/P1P4P/8/8/8/8/8/K6k w - - 0 1",
    "promo_white_h_capture": "6nk/7P/8/8/8/8/8/K7 w - - 0 1",
    "promo_black": "7k/8/8/8/3K4/8/p5pp/1N3B2 b - - 0 1",
    "check_white": "4k3/8/8/8/8/8/4r3/4K3 w - - 0 1",
    "check_black": "4k3/8/8/1B6/8/8/8/4K3 b - - 0 1",
    "double_check": "4k3/8/5N2/8/8/8/8/4R1K1 b - - 0 1",
    "checkmate": "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3",
    "stalemate": "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1",
}


def _expected_indices(board: chess.Board) -> set[int]:
    """Legal moves via python-chess UCI strings: independent of the fast mask path."""
    return {ACTION_INDEX[move.uci()] for move in board.legal_moves}


def _puzzle_boards() -> list[chess.Board]:
    path = data_file("lichess_puzzles_dev.csv")
    with path.open(newline="") as handle:
        fens = [row["FEN"] for row in csv.DictReader(handle)]
    assert len(fens) == 500
    return [chess.Board(fen) for fen in fens]


RANDOM_BOARDS = random_playout_positions(300)


# --- table layout -----------------------------------------------------------------


def test_table_size_and_uniqueness() -> None:
    assert NUM_ACTIONS == 1968
    assert len(ACTIONS) == 1968
    assert len(set(ACTIONS)) == 1968
    assert len(ACTION_INDEX) == 1968
    assert sum(len(a) == 5 for a in ACTIONS) == 176


def test_first_entries_for_a1_are_queen_then_knight_moves() -> None:
    # Queen from a1 in ascending square index: rank 1, then b2/a2... per rank.
    queen_a1 = [
        "a1b1",
        "a1c1",
        "a1d1",
        "a1e1",
        "a1f1",
        "a1g1",
        "a1h1",
        "a1a2",
        "a1b2",
        "a1a3",
        "a1c3",
        "a1a4",
        "a1d4",
        "a1a5",
        "a1e5",
        "a1a6",
        "a1f6",
        "a1a7",
        "a1g7",
        "a1a8",
        "a1h8",
    ]
    knight_a1 = ["a1c2", "a1b3"]
    assert list(ACTIONS[:23]) == queen_a1 + knight_a1
    assert ACTIONS[23] == "b1a1"


def test_knight_moves_follow_queen_moves_for_e4() -> None:
    e4 = [a for a in ACTIONS if a.startswith("e4")]
    # Queen on e4 attacks 27 squares, knight 8; knights come last, ascending index.
    assert len(e4) == 35
    assert e4[-8:] == ["e4d2", "e4f2", "e4c3", "e4g3", "e4c5", "e4g5", "e4d6", "e4f6"]
    assert e4[:3] == ["e4b1", "e4e1", "e4h1"]
    # The e4 block is contiguous in the table.
    start = ACTION_INDEX["e4b1"]
    assert list(ACTIONS[start : start + 35]) == e4


def test_last_entries_are_h7_promotions() -> None:
    assert list(ACTIONS[-12:]) == [
        "g7h8q",
        "g7h8r",
        "g7h8b",
        "g7h8n",
        "h7h8q",
        "h7h8r",
        "h7h8b",
        "h7h8n",
        "h7g8q",
        "h7g8r",
        "h7g8b",
        "h7g8n",
    ]


def test_first_promotions_are_rank2_to_rank1() -> None:
    first = ACTION_INDEX["a2a1q"]
    assert first == 1456 + 336
    assert list(ACTIONS[first : first + 12]) == [
        "a2a1q",
        "a2a1r",
        "a2a1b",
        "a2a1n",
        "a2b1q",
        "a2b1r",
        "a2b1b",
        "a2b1n",
        "b2b1q",
        "b2b1r",
        "b2b1b",
        "b2b1n",
    ]
    # b-file: straight, then left (a), then right (c).
    assert [a for a in ACTIONS[first:] if a.startswith("b2")][::4] == ["b2b1q", "b2a1q", "b2c1q"]
    # All rank-2 promotions precede all rank-7 promotions.
    assert ACTION_INDEX["h2g1n"] < ACTION_INDEX["a7a8q"]
    assert ACTION_INDEX["a7a8q"] == first + 88


def test_table_matches_python_chess_attack_sets() -> None:
    # Rebuild the non-promotion part with python-chess attacks as an independent oracle.
    board = chess.BaseBoard.empty()
    expected = []
    for square in range(64):
        targets = []
        for symbol in "QN":
            board.set_piece_at(square, chess.Piece.from_symbol(symbol))
            targets += list(board.attacks(square))
        board.remove_piece_at(square)
        expected += [chess.square_name(square) + chess.square_name(t) for t in targets]
    assert list(ACTIONS[: len(expected)]) == expected
    assert len(expected) == 1456 + 336


def test_castling_moves_present() -> None:
    for uci in ("e1g1", "e1c1", "e8g8", "e8c8"):
        assert uci in ACTION_INDEX


def test_every_entry_parses_as_move() -> None:
    for uci in ACTIONS:
        move = chess.Move.from_uci(uci)
        assert move.uci() == uci


# --- conversions --------------------------------------------------------------------


def test_round_trip_all_actions() -> None:
    for index in range(NUM_ACTIONS):
        move = action_to_move(index)
        assert isinstance(move, chess.Move)
        assert move.uci() == ACTIONS[index]
        assert move_to_action(move) == index
        assert move_to_action(ACTIONS[index]) == index


def test_action_to_move_accepts_numpy_ints_and_returns_fresh_moves() -> None:
    assert action_to_move(np.int64(5)).uci() == ACTIONS[5]
    assert action_to_move(3) is not action_to_move(3)


def test_promotion_moves_map_to_promotion_actions() -> None:
    assert ACTIONS[move_to_action(chess.Move.from_uci("e7e8n"))] == "e7e8n"
    assert ACTIONS[move_to_action(chess.Move(chess.E7, chess.E8))] == "e7e8"
    assert move_to_action("e7e8q") != move_to_action("e7e8")


@pytest.mark.parametrize(
    "bad",
    ["a1a1", "e2e4q", "e7e8k", "a1b4", "e2e9", "E2E4", "e2e4 ", "", "0000", "e7e8Q", "xyz"],
)
def test_bad_uci_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        move_to_action(bad)
    assert repr(bad) in str(excinfo.value)


@pytest.mark.parametrize(
    "move",
    [
        chess.Move(chess.A1, chess.A1),
        chess.Move(chess.E2, chess.E4, promotion=chess.QUEEN),
        chess.Move(chess.A1, chess.B4),
        chess.Move.null(),
        chess.Move(chess.E4, chess.E4, drop=chess.KNIGHT),
    ],
)
def test_bad_move_object_raises_value_error(move: chess.Move) -> None:
    with pytest.raises(ValueError, match=move.uci()):
        move_to_action(move)


@pytest.mark.parametrize("index", [-1, 1968, 10**6, 1.0, True, "3"])
def test_action_to_move_out_of_range(index: object) -> None:
    with pytest.raises(ValueError):
        action_to_move(index)  # type: ignore[arg-type]


# --- legal masks --------------------------------------------------------------------


def _assert_mask_matches(board: chess.Board) -> None:
    mask = legal_mask(board)
    assert mask.shape == (NUM_ACTIONS,) and mask.dtype == np.bool_
    expected = _expected_indices(board)
    assert set(np.flatnonzero(mask).tolist()) == expected, board.fen()
    assert int(mask.sum()) == board.legal_moves.count()
    actions = legal_actions(board)
    assert actions.dtype == np.int64
    assert actions.tolist() == sorted(expected)


def test_random_playout_masks_match_python_chess() -> None:
    assert len(RANDOM_BOARDS) == 300
    # The sample must actually exercise the special move kinds.
    # (En passant is covered by the hand-written positions; random play rarely allows it.)
    saw_promotion = saw_castling = saw_check = False
    for board in RANDOM_BOARDS:
        _assert_mask_matches(board)
        for move in board.legal_moves:
            saw_promotion |= move.promotion is not None
            saw_castling |= board.is_castling(move)
        saw_check |= board.is_check()
    assert saw_promotion and saw_castling and saw_check


@pytest.mark.parametrize("name", sorted(SPECIAL_FENS))
def test_special_position_masks(name: str) -> None:
    _assert_mask_matches(chess.Board(SPECIAL_FENS[name]))


def test_special_moves_are_in_mask() -> None:
    cases = {
        "castle_white_both": ["e1g1", "e1c1"],
        "castle_black_both": ["e8g8", "e8c8"],
        "ep_white": ["e5f6"],
        "ep_black": ["e4d3"],
        "promo_white": ["a7a8q", "a7a8n", "a7b8r", "c7b8b", "c7d8q", "h7h8q"],
        "promo_white_h_capture": ["h7g8q", "h7g8n"],
        "promo_black": ["a2a1q", "a2b1n", "g2f1r", "h2h1b", "g2g1q"],
    }
    for name, ucis in cases.items():
        mask = legal_mask(chess.Board(SPECIAL_FENS[name]))
        for uci in ucis:
            assert mask[ACTION_INDEX[uci]], (name, uci)
    # Kingside-only castling rights: queenside castle must be masked out.
    mask = legal_mask(chess.Board(SPECIAL_FENS["castle_white_kingside_only"]))
    assert mask[ACTION_INDEX["e1g1"]] and not mask[ACTION_INDEX["e1c1"]]
    # Non-promoting pawn move to the last rank is never legal.
    mask = legal_mask(chess.Board(SPECIAL_FENS["promo_white"]))
    assert not mask[ACTION_INDEX["a7a8"]]


def test_terminal_positions_have_empty_masks() -> None:
    for name in ("checkmate", "stalemate"):
        board = chess.Board(SPECIAL_FENS[name])
        assert not legal_mask(board).any()
        assert legal_actions(board).shape == (0,)


def test_check_masks_only_evasions() -> None:
    board = chess.Board(SPECIAL_FENS["double_check"])
    # Double check: only king moves are legal.
    assert all(ACTIONS[i].startswith("e8") for i in legal_actions(board))
    assert len(legal_actions(board)) > 0


def test_puzzle_position_masks() -> None:
    for board in _puzzle_boards():
        _assert_mask_matches(board)


def test_batched_masks_equal_single_masks() -> None:
    boards = RANDOM_BOARDS[:50] + [chess.Board(f) for f in SPECIAL_FENS.values()]
    batched = legal_masks(boards)
    assert batched.shape == (len(boards), NUM_ACTIONS) and batched.dtype == np.bool_
    assert np.array_equal(batched, np.stack([legal_mask(b) for b in boards]))
    assert legal_masks([]).shape == (0, NUM_ACTIONS)


def test_chess960_board_rejected() -> None:
    board = chess.Board.from_chess960_pos(518)
    with pytest.raises(ValueError, match="chess960"):
        legal_mask(board)
    with pytest.raises(ValueError, match="chess960"):
        legal_masks([chess.Board(), board])
    with pytest.raises(ValueError, match="chess960"):
        legal_actions(board)
