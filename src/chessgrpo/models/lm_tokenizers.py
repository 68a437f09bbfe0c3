"""The chess LM's tokenizers behind one interface (`LMTokenizer`: encode, decode, save, EOS id, vocabulary size):
`CharTokenizer`, one token per character of chess text (newline = end of sequence, saved as
``chess_char_tokenizer.json``), and `HFTokenizer`, a `transformers` tokenizer (e.g. GPT-2 BPE). The word-level
`models.chess_tokenizer.ChessTokenizer` implements the same interface. `models.lm` builds, saves and loads them
with the model."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from chessgrpo.errors import InputError

CHAR_TOKENIZER_FILE = "chess_char_tokenizer.json"

# Every character of the P: and A: formats: FEN (pieces, digits, files, '/', '-', side w/b),
# UCI moves (files, ranks, promotion pieces), evaluations ('-', '.', digits), the task markers
# ('P', 'A', 'M', 'E', 'B', ':'), the A: separators ('+') and newline, which ends a sequence.
CHAR_VOCAB = "\n +-./0123456789:ABEKMNPQRabcdefghknpqrw"

LM_TOKENIZERS = ("chess", "char")
"""The tokenizers of a fresh model (`LMModelConfig.tokenizer`)."""


class LMTokenizer(Protocol):
    """What the LM path needs from a tokenizer."""

    eos_token_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, directory: str | os.PathLike) -> None: ...


class CharTokenizer:
    """One token per character of `CHAR_VOCAB`; newline is the end-of-sequence token.

    `encode` raises `ValueError` naming the first character outside the vocabulary (a prompt is
    validated text; silently mapping it to an "unknown" id would hide a bug). `decode` never fails.
    """

    kind = "chess-char"

    def __init__(self, vocab: str = CHAR_VOCAB, eos: str = "\n"):
        if len(set(vocab)) != len(vocab):
            raise ValueError("character vocabulary has duplicates")
        if eos not in vocab:
            raise ValueError(f"end-of-sequence character {eos!r} is not in the vocabulary")
        self.vocab = vocab
        self.eos = eos
        self._ids = {c: i for i, c in enumerate(vocab)}
        self.eos_token_id = self._ids[eos]
        self.vocab_size = len(vocab)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as error:
            raise ValueError(f"character {error.args[0]!r} of {text[:80]!r} is not in the chess vocabulary") from None

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.vocab[i] if 0 <= i < self.vocab_size else "\ufffd" for i in ids)

    def save(self, directory: str | os.PathLike) -> None:
        path = Path(directory) / CHAR_TOKENIZER_FILE
        path.write_text(json.dumps({"type": self.kind, "version": 1, "vocab": self.vocab, "eos": self.eos}, indent=1))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> CharTokenizer:
        path = Path(directory) / CHAR_TOKENIZER_FILE
        try:
            data = json.loads(path.read_text())
            if data.get("type") != cls.kind:
                raise InputError(f"type is {data.get('type')!r}, expected {cls.kind!r}")
            return cls(str(data["vocab"]), str(data["eos"]))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(f"{path} is not a chess character tokenizer: {error}") from None


class HFTokenizer:
    """A `transformers` tokenizer (e.g. GPT-2 BPE) behind the `LMTokenizer` interface.

    No special tokens are added when encoding: the P:/A: prompt and completion are plain text and
    the end of a completion is the tokenizer's EOS (``<|endoftext|>`` for GPT-2).
    """

    kind = "transformers"

    def __init__(self, tokenizer: Any):
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no EOS token; completions could never end")
        self.tokenizer = tokenizer
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def save(self, directory: str | os.PathLike) -> None:
        self.tokenizer.save_pretrained(str(directory))
