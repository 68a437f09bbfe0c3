"""Sampling from the chess LM: `generate` (token ids in, a `Generation` out; batched with left
padding and a KV cache; the RL sampler) and `generate_texts` (strings in, completions out; greedy by
default; what the evaluations, the LM player and the SFT kind's held-out check use).

Sampling uses `models.lm.tempered_log_probs`, the one log-prob function (docs/architecture.md,
invariant 1): the behaviour log-probs of a rollout are recomputed by `models.lm.completion_log_probs`
on the finished sequences.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from chessgrpo.models.lm import left_pad, position_ids, tempered_log_probs
from chessgrpo.models.lm_tokenizers import LMTokenizer

StopRule = Callable[[list[int], list[bool]], list[bool]]
"""A row-stopping rule of `generate` (``stop``): called after each step with every row's token and whether the
row was still generating; returns the rows that end after that token (kept, no EOS), e.g.
`data.rookworld_format.MoveStop`. Stateful: one per `generate` call."""


@dataclasses.dataclass
class Generation:
    """Prompts and their sampled completions, in the layout `completion_log_probs` reads."""

    prompt_ids: Tensor
    """[N, P] long, left-padded."""
    prompt_mask: Tensor
    """[N, P] bool."""
    completion_ids: Tensor
    """[N, L] long; after EOS the pad id (excluded by the mask)."""
    completion_mask: Tensor
    """[N, L] bool: True for every generated token up to and including EOS."""
    finished: Tensor
    """[N] bool: the completion ended with EOS or by `generate`'s ``stop`` rule (False: cut at max_new_tokens)."""

    def completion_tokens(self, row: int) -> list[int]:
        return self.completion_ids[row][self.completion_mask[row]].tolist()

    def texts(self, tokenizer: LMTokenizer) -> list[str]:
        """Decoded completions without the EOS token."""
        out = []
        for row in range(self.completion_ids.shape[0]):
            tokens = self.completion_tokens(row)
            if self.finished[row] and tokens and tokens[-1] == tokenizer.eos_token_id:
                tokens = tokens[:-1]
            out.append(tokenizer.decode(tokens))
        return out

    @property
    def lengths(self) -> Tensor:
        """[N] completion lengths in tokens (EOS included)."""
        return self.completion_mask.sum(dim=1)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    eos_token_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    pad_token_id: int | None = None,
    row_groups: Sequence[int] | None = None,
    stop: StopRule | None = None,
) -> Generation:
    """Sample completions for token-id prompts, batched with left padding and a KV cache.

    `temperature` > 0 samples from `tempered_log_probs` (no top-k/top-p); 0 is greedy decoding.
    `generator` may be one generator per group, `row_groups` then naming each row's group (see
    `models.policy.multinomial_by_group`: a group's completions do not depend on the other rows).
    A row stops at its EOS (kept in the completion and its mask); the batch stops when every row
    has stopped or after `max_new_tokens`. `stop` may end rows earlier (`StopRule`). The model must be in eval mode.
    """
    if model.training:
        raise RuntimeError("generate needs the model in eval mode (no dropout while sampling)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    from chessgrpo.models.sampling import multinomial_by_group

    device = next(model.parameters()).device
    pad = eos_token_id if pad_token_id is None else pad_token_id
    prompt_ids, prompt_mask = left_pad(prompts, pad, device)
    limit = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if limit is not None and prompt_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({prompt_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's {limit} positions"
        )
    n = prompt_ids.shape[0]
    attention = prompt_mask.long()
    positions = position_ids(attention)
    out = model(
        input_ids=prompt_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    past = out.past_key_values
    next_logits = out.logits[:, -1]
    next_position = positions[:, -1] + 1
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    tokens: list[Tensor] = []
    valid: list[Tensor] = []
    for step in range(max_new_tokens):
        if temperature == 0:
            token = next_logits.float().argmax(dim=-1)
        else:
            probs = tempered_log_probs(next_logits, temperature).exp()
            groups = range(n) if row_groups is None else row_groups
            token = multinomial_by_group(probs, 1, groups, generator).squeeze(1)
        token = torch.where(finished, torch.full_like(token, pad), token)
        valid.append(~finished)
        tokens.append(token)
        finished = finished | (token == eos_token_id)
        if stop is not None:
            ended = stop(token.tolist(), valid[-1].tolist())
            finished = finished | torch.tensor(ended, dtype=torch.bool, device=device)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        # The token just chosen is attended to only when it is real (pads after EOS are not).
        attention = torch.cat([attention, valid[-1].long().unsqueeze(1)], dim=1)
        out = model(
            input_ids=token.unsqueeze(1),
            attention_mask=attention,
            position_ids=next_position.unsqueeze(1),
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        next_logits = out.logits[:, -1]
        next_position = next_position + 1
    completion_ids = torch.stack(tokens, dim=1)
    completion_mask = torch.stack(valid, dim=1)
    return Generation(prompt_ids, prompt_mask, completion_ids, completion_mask, finished)


def generate_texts(
    lm: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int,
    temperature: float = 0.0,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    new_stop: Callable[[], StopRule] | None = None,
) -> list[str]:
    """Completions (no EOS) of `prompts`, batched; greedy at temperature 0. `new_stop` makes each batch's
    `generate` ``stop`` rule."""
    if lm.model.training:
        raise RuntimeError("evaluation needs the model in eval mode")
    generator = torch.Generator(device=lm.device).manual_seed(seed)
    # Similar lengths together: less padding per batch. Results are put back in prompt order.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[str | None] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        generation = generate(
            lm.model,
            [lm.tokenizer.encode(prompts[i]) for i in chunk],
            eos_token_id=lm.tokenizer.eos_token_id,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
            stop=new_stop() if new_stop is not None else None,
        )
        for i, text in zip(chunk, generation.texts(lm.tokenizer)):
            out[i] = text
        if progress is not None:
            progress(len(chunk))
    return [t if t is not None else "" for t in out]
