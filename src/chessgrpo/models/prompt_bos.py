"""BOS before every prompt: the prompt encoding of a chess LM trained with ``<|endoftext|>`` before each sample.

Upstream RookWorld-LM was trained that way; models fine-tuned here are not unless `kind: sft`'s
``prompt_bos`` says so. `with_prompt_bos` wraps a `ChessLM` for the code paths that encode only
prompts (sampling, `eval.lm`); `prompt_bos_id` is the id SFT puts before its prompt ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.models.lm import ChessLM


class PromptBOSTokenizer:
    """An `LMTokenizer` whose `encode` puts the BOS token before the text: the prompt encoding of a
    model trained, as upstream RookWorld-LM was, with ``<|endoftext|>`` before every sample.
    Decoding, EOS and saving are the wrapped tokenizer's. Wrap for prompts only (`with_prompt_bos`)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.bos_token_id = prompt_bos_id(inner)
        self.eos_token_id = inner.eos_token_id
        self.vocab_size = inner.vocab_size
        self.kind = getattr(inner, "kind", "unknown")

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *self.inner.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def save(self, directory: Any) -> None:
        self.inner.save(directory)


def prompt_bos_id(tokenizer: Any) -> int:
    """The BOS id of an `LMTokenizer`: a `transformers` tokenizer's bos_token_id, else its EOS id
    (GPT-2's BOS and EOS are both ``<|endoftext|>``; the character tokenizer's EOS is newline)."""
    bos = getattr(getattr(tokenizer, "tokenizer", None), "bos_token_id", None)
    return int(bos) if bos is not None else int(tokenizer.eos_token_id)


def with_prompt_bos(lm: ChessLM, enabled: bool) -> ChessLM:
    """`lm` itself, or (`enabled`) the same model whose tokenizer prefixes BOS to every encoded text:
    for the code paths that encode only prompts (sampling, `eval.lm`)."""
    if not enabled:
        return lm
    from chessgrpo.models.lm import ChessLM

    return ChessLM(lm.model, PromptBOSTokenizer(lm.tokenizer), lm.source, lm.policy_prompt)
