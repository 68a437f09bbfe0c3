"""A word-level tokenizer for RookWorld chess text, saved as a standard ``tokenizer.json``.

Built offline with Hugging Face `tokenizers` (a fixed vocabulary, no training) and wrapped in a
`transformers.PreTrainedTokenizerFast`, so a saved directory loads with `load_lm` *and* with plain
``AutoTokenizer.from_pretrained(directory, local_files_only=True)``, giving the same ids.

Tokens (short sequences: a P: answer is ~22 tokens instead of ~130 characters):

- ``<|endoftext|>`` (id 0): end of sequence and pad;
- task tags and field markers ``"P: "``, ``"M: "``, ``"E: "``, ``"B: "``, ``"A: "`` and the A:
  separator ``"+"``;
- every UCI move of `chessgrpo.board.ACTIONS` (1968, promotions included) as one token, and the
  same move with one leading space (``" e2e4"``) for moves inside space-separated lists (M:, the
  A: history), GPT-2 style; a move token is only used where a move can stand (after the start,
  a space or ``+``, and before a space, ``+``, newline or the end), so FEN ranks such as
  ``1b1b4`` are never read as moves;
- FEN: one token per piece letter, rank digit and ``/``; the side ``" w"`` / ``" b"``; the
  castling field as one token (``" KQkq"``, ``" Kq"``, ... or ``" -"``); the en-passant square
  (``" e3"``) or ``" -"``; clocks as numbers;
- numbers: integers of one or two digits (optionally with a leading space and/or ``-``) and
  fractions ``.d`` / ``.dd``: ``-3.06`` is ``-3`` ``.06``, `` 0.25`` is `` 0`` ``.25``; longer
  digit strings split into those (``999.85`` is ``99`` ``9`` ``.85``);
- runs of 1-96 spaces as one token each (the P: field padding);
- the 64 squares, with and without a leading space: a move-shaped string outside ACTIONS (an A:
  prompt may carry any square pair as an illegal move) becomes two squares (``d4`` ``a2``);
- every other character of the chess character vocabulary alone (``\\n``, ``:``, file letters...),
  so any text over that alphabet round-trips exactly: ``decode(encode(text)) == text``.

A regex `Split` pre-tokenizer (``isolated``) cuts the text into exactly these pieces; a `BPE`
model with ``ignore_merges=True`` maps each piece that is a vocabulary entry to its id (word-level
in effect) and its only merges (square = file + rank, then space + square) split the rest, the
non-ACTIONS moves; a `Fuse` decoder concatenates tokens back.
Characters outside the alphabet raise `ValueError` naming the text (`ChessTokenizer.encode`
checks first; they never become an "unknown" id).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
CHESS_TOKENIZER_NAME = "chessgrpo-chess-wordlevel-v1"
"""Recorded in ``tokenizer_config.json`` (``chess_tokenizer``) so `load_lm` can tell it apart."""

ALPHABET = "\n +-./0123456789:ABEKMNPQRabcdefghknpqrw"
"""Every character the tokenizer accepts (the same alphabet as `models.lm_tokenizers.CHAR_VOCAB`)."""
MAX_SPACE_RUN = 96
TAGS = ("P: ", "M: ", "E: ", "B: ", "A: ")

# Alternatives in priority order (the regex engine takes the first that matches at a position).
_MOVE = r"[a-h][1-8][a-h][1-8][qrbn]?(?=[ +\n]|$)"
SPLIT_PATTERN = "|".join(
    [
        r"[PMEBA]: ",  # task tags
        r"(?:(?<=[+ \n])|^)" + _MOVE,  # a move where a move can stand
        r" " + _MOVE,  # a move in a space-separated list
        r" [a-h][36](?= |$)",  # en-passant square
        r" (?=[KQkq])K?Q?k?q?(?= |$)",  # castling rights
        r" [wb](?= |$)",  # side to move
        r" ?-?[0-9]{1,2}",  # integers (clocks, evaluations, rewards, flags, FEN rank digits)
        r"\.[0-9]{1,2}",  # fractional parts
        r" -(?= |$)",  # no castling / no en-passant square
        rf" {{1,{MAX_SPACE_RUN}}}",  # spaces and padding
        r"[^ ]",  # any other single character (the alphabet is checked before encoding)
    ]
)

SQUARES = tuple(f + r for r in "12345678" for f in "abcdefgh")

_ALLOWED = re.compile("[" + re.escape(ALPHABET) + "]*")


def chess_vocabulary() -> list[str]:
    """The ordered vocabulary (id = index): every piece the split pattern can produce over `ALPHABET`."""
    from chessgrpo.board import ACTIONS

    vocab: list[str] = [EOS_TOKEN]
    vocab += list(TAGS)
    vocab += list(ACTIONS)
    vocab += [" " + move for move in ACTIONS]
    vocab += [f" {f}{r}" for r in "36" for f in "abcdefgh"]
    castling = ["".join(c for c, keep in zip("KQkq", mask) if keep) for mask in itertools.product((1, 0), repeat=4)]
    vocab += [" " + c for c in castling if c]
    vocab += [" w", " b", " -"]
    digits = [str(i) for i in range(10)] + [f"{i:02d}" for i in range(100)]
    for prefix in ("", "-", " ", " -"):
        vocab += [prefix + d for d in digits]
    vocab += ["." + d for d in digits]
    vocab += [" " * n for n in range(1, MAX_SPACE_RUN + 1)]
    vocab += [c for c in ALPHABET if c != " "]
    vocab += [prefix + square for prefix in ("", " ") for square in SQUARES]  # fallback of non-ACTIONS moves
    seen: set[str] = set()
    unique = []
    for token in vocab:
        if token not in seen:
            seen.add(token)
            unique.append(token)
    return unique


def build_chess_tokenizer() -> Any:
    """A `PreTrainedTokenizerFast` with the fixed chess vocabulary (offline, deterministic)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = chess_vocabulary()
    merges = [(square[0], square[1]) for square in SQUARES] + [(" ", square) for square in SQUARES]
    model = models.BPE({token: i for i, token in enumerate(vocab)}, merges, unk_token=None, ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([EOS_TOKEN])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.init_kwargs["chess_tokenizer"] = CHESS_TOKENIZER_NAME
    return fast


def is_chess_tokenizer_directory(directory: str | os.PathLike) -> bool:
    """True when `directory` holds a tokenizer saved by `ChessTokenizer.save`."""
    import json

    path = Path(directory) / "tokenizer_config.json"
    try:
        return json.loads(path.read_text()).get("chess_tokenizer") == CHESS_TOKENIZER_NAME
    except (OSError, ValueError, AttributeError):
        return False


class ChessTokenizer:
    """The chess word-level tokenizer behind the `models.lm_tokenizers.LMTokenizer` interface.

    Same behaviour as `models.lm_tokenizers.HFTokenizer` (no special tokens added, EOS = ``<|endoftext|>``)
    plus a strict `encode`: a character outside `ALPHABET` raises `ValueError` naming it and the
    text. `save` writes a standard ``tokenizer.json`` + ``tokenizer_config.json`` directory.
    """

    kind = "chess-wordlevel"

    def __init__(self, tokenizer: Any | None = None):
        self.tokenizer = build_chess_tokenizer() if tokenizer is None else tokenizer
        self.eos_token_id = int(self.tokenizer.eos_token_id)
        self.vocab_size = len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        if _ALLOWED.fullmatch(text) is None:
            bad = next(c for c in text if c not in ALPHABET)
            raise ValueError(f"character {bad!r} of {text[:80]!r} is not in the chess vocabulary")
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.vocab_size for i in ids):
            # Out-of-range ids (a model with a padded vocabulary) decode to U+FFFD like CharTokenizer's.
            return "".join(self.tokenizer.decode([i]) if 0 <= i < self.vocab_size else "\ufffd" for i in ids)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def tokens(self, text: str) -> list[str]:
        """The token strings of `text` (for inspection)."""
        return self.tokenizer.convert_ids_to_tokens(self.encode(text))

    def save(self, directory: str | os.PathLike) -> None:
        self.tokenizer.save_pretrained(str(directory))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ChessTokenizer:
        from transformers import PreTrainedTokenizerFast

        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as error:
            raise ValueError(f"{directory} has no loadable chess tokenizer ({TOKENIZER_FILE}): {error}") from None
        if tokenizer.eos_token_id is None:
            raise ValueError(f"{directory}: chess tokenizer has no EOS token")
        return cls(tokenizer)
