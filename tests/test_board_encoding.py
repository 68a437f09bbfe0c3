"""Tests for FEN tokenisation (chessgrpo.board.encoding)."""

from __future__ import annotations

import csv
import random

import chess
import numpy as np
import pytest

from chessgrpo.board import (
    SEQUENCE_LENGTH,
    VOCAB_SIZE,
    VOCABULARY,
    decode_tokens,
    encode_fen,
    encode_fens,
)
from helpers import data_file

EMPTY_RANK = "." * 8


def _tokens(chars: str) -> list[int]:
    """Hand-spelled token string -> indices (checks it is 77 chars long)."""
    assert len(chars) == 77, len(chars)
    return [VOCABULARY.index(c) for c in chars]


def _puzzle_fens() -> list[str]:
    path = data_file("lichess_puzzles_dev.csv")
    with path.open(newline="") as handle:
        fens = [row["FEN"] for row in csv.DictReader(handle)]
    assert len(fens) == 500
    return fens


def test_vocabulary_order() -> None:
    assert VOCABULARY == tuple("0123456789abcdefghpnrkqPBNRQKw.")
    assert VOCAB_SIZE == 31 == len(VOCABULARY)
    assert SEQUENCE_LENGTH == 77
    assert VOCABULARY.index("w") == 29 and VOCABULARY.index(".") == 30
    assert VOCABULARY.index("b") == 11


def test_start_position() -> None:
    expected = "w" + "rnbqkbnr" + "pppppppp" + "." * 32 + "PPPPPPPP" + "RNBQKBNR" + "KQkq" + ".." + "0.." + "1.."
    tokens = encode_fen(chess.STARTING_FEN)
    assert tokens.dtype == np.uint8 and tokens.shape == (77,)
    assert tokens.tolist() == _tokens(expected)
    # A Board is encoded through board.fen().
    assert np.array_equal(encode_fen(chess.Board()), tokens)


def test_black_to_move_with_en_passant() -> None:
    fen = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"
    expected = (
        "b"
        + "rnbqkbnr"
        + "pppppppp"
        + EMPTY_RANK
        + EMPTY_RANK
        + "....P..."
        + EMPTY_RANK
        + "PPPP.PPP"
        + "RNBQKBNR"
        + "KQkq"
        + "e3"
        + "0.."
        + "1.."
    )
    assert encode_fen(fen).tolist() == _tokens(expected)


def test_partial_castling_and_multi_digit_counters() -> None:
    fen = "r3k2r/1p3ppp/8/8/8/8/PPP2P2/R3K2R w Kq - 12 105"
    expected = "w" + "r...k..r" + ".p...ppp" + EMPTY_RANK * 4 + "PPP..P.." + "R...K..R" + "Kq.." + ".." + "12." + "105"
    assert encode_fen(fen).tolist() == _tokens(expected)


def test_no_castling_and_white_en_passant() -> None:
    fen = "4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 2"
    expected = (
        "w" + "....k..." + EMPTY_RANK * 2 + "...pP..." + EMPTY_RANK * 3 + "....K..." + "...." + "d6" + "0.." + "2.."
    )
    assert encode_fen(fen).tolist() == _tokens(expected)


@pytest.mark.parametrize(
    ("half", "full", "half_chars", "full_chars"),
    [
        ("1500", "1", "999", "1.."),
        ("0", "1500", "0..", "999"),
        ("999", "999", "999", "999"),
        ("1" * 5000, "1" * 5000, "999", "999"),  # no int() overflow on huge counters
        ("007", "0010", "7..", "10."),  # leading zeros are dropped
    ],
)
def test_counter_clamping(half: str, full: str, half_chars: str, full_chars: str) -> None:
    fen = f"8/8/8/8/8/8/8/K6k w - - {half} {full}"
    tokens = encode_fen(fen)
    assert tokens[-6:].tolist() == [VOCABULARY.index(c) for c in half_chars + full_chars]


def test_epd_like_four_fields_default_counters() -> None:
    assert np.array_equal(encode_fen("8/8/8/8/8/8/8/K6k b - -"), encode_fen("8/8/8/8/8/8/8/K6k b - - 0 1"))


MALFORMED_FENS = [
    "xyz",  # one field
    "8/8/8/8/8/8/8/K6k w - - 0",  # five fields
    "8/8/8/8/8/8/8/K6k w - - 0 1 extra",  # seven fields
    "8/8/8/8/8/8/8/K6k w - - 0 1\nquit",  # newline injection
    "8/8/8/8/8/8/8/K6k w - - 0 1\n",
    "8/8/8/8/8/8/8/K6k  w - - 0 1",  # double space
    " 8/8/8/8/8/8/8/K6k w - - 0 1",  # leading space
    "8/8/8/8/8/8/8/K6k\tw - - 0 1",  # tab
    "rnbqkbnr/ppppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",  # 9 squares
    "rnbqkbnr/ppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",  # 7 squares
    "8/8/8/8/8/8/K6k w - - 0 1",  # 7 ranks
    "8/8/8/8/8/8/8/8/K6k w - - 0 1",  # 9 ranks
    "8/8/8/8/8/8/8/K6k/ w - - 0 1",  # trailing slash
    "8/8/8/8/8/8/8/K5xk w - - 0 1",  # bad piece char
    "8/8/8/8/8/8/9/K6k w - - 0 1",  # digit 9
    "8/8/8/8/8/8/08/K6k w - - 0 1",  # digit 0
    "8/8/8/8/8/8/44/K6k w - - 0 1",  # two digits in a row
    "8/8/8/8/8/8/8/K6k W - - 0 1",  # bad side
    "8/8/8/8/8/8/8/K6k x - - 0 1",
    "8/8/8/8/8/8/8/K6k - - - 0 1",
    "8/8/8/8/8/8/8/K6k w QK - 0 1",  # castling out of order
    "8/8/8/8/8/8/8/K6k w KK - 0 1",  # repeated
    "8/8/8/8/8/8/8/K6k w KQkqK - 0 1",
    "8/8/8/8/8/8/8/K6k w HAha - 0 1",  # Shredder-FEN not supported
    "8/8/8/8/8/8/8/K6k w -- - 0 1",
    "8/8/8/8/8/8/8/K6k w - e4 0 1",  # ep not on rank 3/6
    "8/8/8/8/8/8/8/K6k w - e3 0 1",  # ep rank inconsistent with side
    "8/8/8/8/8/8/8/K6k b - e6 0 1",
    "8/8/8/8/8/8/8/K6k w - z6 0 1",
    "8/8/8/8/8/8/8/K6k w - e66 0 1",
    "8/8/8/8/8/8/8/K6k w - - -1 1",  # negative counter
    "8/8/8/8/8/8/8/K6k w - - 0 1.5",
    "8/8/8/8/8/8/8/K6k w - - a 1",
    "8/8/8/8/8/8/8/K6k w - - 0 \u00b2",  # non-ASCII digit
    "",
]


@pytest.mark.parametrize("fen", MALFORMED_FENS)
def test_malformed_fen_raises_with_fen_in_message(fen: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        encode_fen(fen)
    assert repr(fen) in str(excinfo.value)


def test_malformed_fen_in_batch_is_named() -> None:
    bad = "8/8/8/8/8/8/8/K6k w - - 0 1\nquit"
    with pytest.raises(ValueError) as excinfo:
        encode_fens([chess.STARTING_FEN, bad])
    assert repr(bad) in str(excinfo.value)


def test_non_string_input_rejected() -> None:
    with pytest.raises(TypeError):
        encode_fen(None)  # type: ignore[arg-type]


def test_batch_shape_and_dtype() -> None:
    fens = [chess.STARTING_FEN, "8/8/8/8/8/8/8/K6k b - - 3 40", chess.Board()]
    batch = encode_fens(fens)
    assert batch.shape == (3, 77) and batch.dtype == np.uint8
    for row, fen in zip(batch, fens):
        assert np.array_equal(row, encode_fen(fen))
    empty = encode_fens([])
    assert empty.shape == (0, 77) and empty.dtype == np.uint8


def test_puzzle_fens_round_trip() -> None:
    fens = _puzzle_fens()
    batch = encode_fens(fens)
    assert batch.shape == (500, 77)
    assert int(batch.max()) < VOCAB_SIZE
    for fen, row in zip(fens, batch):
        assert np.array_equal(row, encode_fen(fen))
        assert decode_tokens(row) == fen


def test_random_playout_fens_round_trip_and_match_boards() -> None:
    rng = random.Random(0)
    board = chess.Board()
    for _ in range(400):
        moves = list(board.legal_moves)
        if not moves:
            board = chess.Board()
            continue
        board.push(rng.choice(moves))
        fen = board.fen()
        tokens = encode_fen(fen)
        assert np.array_equal(tokens, encode_fen(board))
        assert decode_tokens(tokens) == fen
        assert chess.Board(decode_tokens(tokens)) == board


def test_decode_clamped_counters() -> None:
    tokens = encode_fen("8/8/8/8/8/8/8/K6k w - - 1500 2000")
    assert decode_tokens(tokens) == "8/8/8/8/8/8/8/K6k w - - 999 999"
    assert decode_tokens(tokens.astype(np.int64).tolist()) == "8/8/8/8/8/8/8/K6k w - - 999 999"


def test_decode_rejects_bad_tokens() -> None:
    good = encode_fen(chess.STARTING_FEN)
    with pytest.raises(ValueError):
        decode_tokens(good[:76])
    bad = good.astype(np.int64)
    bad[5] = 31
    with pytest.raises(ValueError):
        decode_tokens(bad)
    bad = good.copy()
    bad[0] = VOCABULARY.index("K")  # side to move must be w/b
    with pytest.raises(ValueError):
        decode_tokens(bad)
    bad = good.copy()
    bad[-1] = VOCABULARY.index("1")  # fullmove '1.1' is not a number
    with pytest.raises(ValueError):
        decode_tokens(bad)
    bad = good.copy()
    bad[10] = VOCABULARY.index("3")  # digit on the board
    with pytest.raises(ValueError):
        decode_tokens(bad)
