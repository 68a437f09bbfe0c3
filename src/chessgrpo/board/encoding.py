"""FEN <-> fixed-length token sequence, compatible with DeepMind's searchless_chess.

A position becomes exactly ``SEQUENCE_LENGTH`` (77) tokens:

====================  ======  ==================================================
part                  tokens  content
====================  ======  ==================================================
side to move          1       ``w`` or ``b``
board                 64      FEN order (rank 8 to 1, file a to h), empty = ``.``
castling rights       4       e.g. ``KQkq``, ``Kq..``; ``-`` becomes ``....``
en passant square     2       e.g. ``e3``; ``-`` becomes ``..``
halfmove clock        3       decimal, right-padded with ``.`` (``0..``, ``12.``)
fullmove number       3       decimal, right-padded with ``.`` (``1..``, ``105``)
====================  ======  ==================================================

Counters above 999 are clamped to 999 so they still fit in three tokens.

Input FEN strings are validated strictly at the string level (no python-chess
parsing, which keeps batch encoding fast):

* exactly 6 fields separated by single spaces, or 4 fields (EPD-like) in which
  case the halfmove clock defaults to 0 and the fullmove number to 1;
* no leading/trailing whitespace, tabs or newlines;
* 8 ranks separated by ``/``, each made of ``pnbrqkPNBRQK`` and the digits
  ``1``-``8`` (no two digits in a row) summing to exactly 8 squares;
* side ``w`` or ``b``;
* castling ``-`` or a non-empty subset of ``KQkq`` written in that order;
* en passant ``-`` or a square on rank 6 when white is to move / rank 3 when
  black is to move;
* counters are non-negative ASCII decimal integers (leading zeros are accepted
  and dropped, so they do not survive :func:`decode_tokens`).

Piece counts (e.g. exactly one king per side) are *not* checked: this is a
structural validation, not a legality check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import chess
import numpy as np

from chessgrpo.errors import quote

__all__ = [
    "VOCABULARY",
    "VOCAB_SIZE",
    "SEQUENCE_LENGTH",
    "encode_fen",
    "encode_fens",
    "decode_tokens",
]

# Index order is part of the model interface (must match searchless_chess).
# 'b' is shared by black-to-move, the black bishop and the b-file.
VOCABULARY: tuple[str, ...] = (
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "p",
    "n",
    "r",
    "k",
    "q",
    "P",
    "B",
    "N",
    "R",
    "Q",
    "K",
    "w",
    ".",
)
VOCAB_SIZE: int = 31
SEQUENCE_LENGTH: int = 77

assert len(VOCABULARY) == VOCAB_SIZE == len(set(VOCABULARY))

# Byte -> token index lookup; 255 marks bytes that are not in the vocabulary.
# Encoding works on the ASCII bytes of an already-validated 77-char string.
_BYTE_TO_TOKEN = np.full(256, 255, dtype=np.uint8)
for _index, _char in enumerate(VOCABULARY):
    _BYTE_TO_TOKEN[ord(_char)] = _index
_BYTE_TO_TOKEN.setflags(write=False)
del _index, _char

# Token index -> ASCII byte, for decoding.
_TOKEN_TO_BYTE = np.frombuffer("".join(VOCABULARY).encode("ascii"), dtype=np.uint8)

# Expands FEN digits into runs of '.' and drops the rank separators.
_EXPAND_BOARD = str.maketrans({str(n): "." * n for n in range(1, 9)} | {"/": None})

# One rank: pieces and digits 1-8, never two digits in a row (python-chess also
# rejects '44'); the square count is checked separately.
_RANK_RE = re.compile(r"(?:[pnbrqkPNBRQK]|[1-8](?![0-9]))+")
_CASTLING_RE = re.compile(r"-|(?=.)K?Q?k?q?")
_COUNTER_RE = re.compile(r"[0-9]+")
_EP_RANK_FOR_SIDE = {"w": "6", "b": "3"}

_MAX_COUNTER = 999
_PART_LENGTHS = (1, 64, 4, 2, 3, 3)  # side, board, castling, ep, halfmove, fullmove
assert sum(_PART_LENGTHS) == SEQUENCE_LENGTH


def _bad_fen(fen: str, reason: str) -> ValueError:
    return ValueError(f"malformed FEN {quote(fen)}: {reason}")


def _counter_chars(fen: str, value: str, name: str) -> str:
    """Validate a move counter and return its 3-char, '.'-padded form."""
    if _COUNTER_RE.fullmatch(value) is None:
        raise _bad_fen(fen, f"{name} must be a non-negative integer, got {quote(value)}")
    # String-level normalisation avoids int() on huge digit strings.
    digits = value.lstrip("0") or "0"
    if len(digits) > 3:
        digits = str(_MAX_COUNTER)
    return digits.ljust(3, ".")


def _fen_to_chars(fen: str) -> str:
    """Validate ``fen`` and return its 77-character token string."""
    fields = fen.split(" ")
    if len(fields) == 4:
        # EPD-like input: missing counters default to those of a fresh game.
        fields += ["0", "1"]
    elif len(fields) != 6:
        raise _bad_fen(fen, f"expected 6 space-separated fields, got {len(fields)}")
    board, side, castling, ep, halfmove, fullmove = fields

    ranks = board.split("/")
    if len(ranks) != 8:
        raise _bad_fen(fen, f"board must have 8 ranks separated by '/', got {len(ranks)}")
    for rank_index, rank in enumerate(ranks):
        if _RANK_RE.fullmatch(rank) is None:
            raise _bad_fen(
                fen,
                f"rank {8 - rank_index} {quote(rank)} must contain only pnbrqkPNBRQK and single digits 1-8",
            )
        squares = sum(int(c) if c.isdigit() else 1 for c in rank)
        if squares != 8:
            raise _bad_fen(fen, f"rank {8 - rank_index} {quote(rank)} has {squares} squares, expected 8")

    if side not in _EP_RANK_FOR_SIDE:
        raise _bad_fen(fen, f"side to move must be 'w' or 'b', got {quote(side)}")

    if _CASTLING_RE.fullmatch(castling) is None:
        raise _bad_fen(fen, f"castling must be '-' or a subset of 'KQkq' in that order, got {quote(castling)}")

    if ep != "-":
        expected_rank = _EP_RANK_FOR_SIDE[side]
        if len(ep) != 2 or ep[0] not in "abcdefgh" or ep[1] != expected_rank:
            raise _bad_fen(
                fen,
                f"en passant must be '-' or a square on rank {expected_rank} "
                f"when {quote(side)} is to move, got {quote(ep)}",
            )

    half_chars = _counter_chars(fen, halfmove, "halfmove clock")
    full_chars = _counter_chars(fen, fullmove, "fullmove number")

    castling_chars = "" if castling == "-" else castling
    ep_chars = ".." if ep == "-" else ep
    return side + board.translate(_EXPAND_BOARD) + castling_chars.ljust(4, ".") + ep_chars + half_chars + full_chars


def _as_fen(position: str | chess.Board) -> str:
    if isinstance(position, str):
        return position
    if isinstance(position, chess.Board):
        return position.fen()
    raise TypeError(f"expected a FEN string or chess.Board, got {type(position).__name__}: {quote(position)}")


def encode_fen(fen: str | chess.Board) -> np.ndarray:
    """Encode one position as ``SEQUENCE_LENGTH`` uint8 token indices.

    Args:
        fen: a FEN string (6 fields, or 4 EPD-like fields with default counters)
            or a ``chess.Board`` (encoded from ``board.fen()``).

    Returns:
        Array of shape ``(77,)`` and dtype uint8 with values in ``[0, VOCAB_SIZE)``.

    Raises:
        ValueError: if the FEN string is malformed (the message names the FEN).
        TypeError: if ``fen`` is neither a string nor a ``chess.Board``.
    """
    chars = _fen_to_chars(_as_fen(fen))
    return _BYTE_TO_TOKEN[np.frombuffer(chars.encode("ascii"), dtype=np.uint8)]


def encode_fens(fens: Sequence[str | chess.Board]) -> np.ndarray:
    """Encode many positions at once.

    Args:
        fens: FEN strings and/or ``chess.Board`` objects.

    Returns:
        uint8 array of shape ``(len(fens), 77)``; ``(0, 77)`` for empty input.

    Raises:
        ValueError: if any FEN is malformed (the message names that FEN).
    """
    if isinstance(fens, (str, chess.Board)):
        raise TypeError("encode_fens expects a sequence of positions; use encode_fen for one")
    # One join + one lookup for the whole batch instead of per-row numpy calls.
    joined = "".join(_fen_to_chars(_as_fen(f)) for f in fens)
    flat = _BYTE_TO_TOKEN[np.frombuffer(joined.encode("ascii"), dtype=np.uint8)]
    return flat.reshape(-1, SEQUENCE_LENGTH)


def _strip_padding(part: str) -> str:
    return part.rstrip(".")


def decode_tokens(tokens: Iterable[int] | np.ndarray) -> str:
    """Turn 77 token indices back into a FEN string (inverse of :func:`encode_fen`).

    Counters are written without their '.' padding. Decoding is lossy only where
    encoding was: counters clamped at 999 and leading zeros in counters.

    Args:
        tokens: 77 integer token indices (any integer array-like).

    Returns:
        The FEN string.

    Raises:
        ValueError: if the tokens have the wrong shape, are out of range, or do
            not describe a structurally valid FEN.
    """
    arr = np.asarray(tokens)
    if arr.shape != (SEQUENCE_LENGTH,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be {SEQUENCE_LENGTH} integers, got shape {arr.shape} dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() >= VOCAB_SIZE:
        raise ValueError(f"tokens must lie in [0, {VOCAB_SIZE}), got {arr.tolist()!r}")
    chars = _TOKEN_TO_BYTE[arr.astype(np.intp)].tobytes().decode("ascii")

    parts = []
    start = 0
    for length in _PART_LENGTHS:
        parts.append(chars[start : start + length])
        start += length
    side, squares, castling, ep, halfmove, fullmove = parts

    ranks = []
    for r in range(8):
        # Collapse runs of '.' into their FEN digit.
        rank = re.sub(r"\.+", lambda m: str(len(m.group())), squares[8 * r : 8 * r + 8])
        ranks.append(rank)

    fen = " ".join(
        [
            "/".join(ranks),
            side,
            _strip_padding(castling) or "-",
            "-" if ep == ".." else ep,
            _strip_padding(halfmove),
            _strip_padding(fullmove),
        ]
    )
    # Re-encoding must reproduce the tokens; otherwise the tokens were not a
    # valid encoding (e.g. '.' inside a counter, a digit on the board).
    try:
        roundtrip = _fen_to_chars(fen)
    except ValueError as exc:
        raise ValueError(f"tokens {chars!r} do not encode a valid FEN: {exc}") from None
    if roundtrip != chars:
        raise ValueError(f"tokens {chars!r} do not encode a valid FEN (decoded {fen!r})")
    return fen
