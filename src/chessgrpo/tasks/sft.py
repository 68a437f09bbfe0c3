"""Supervised fine-tuning on RookWorld text: tokenized examples and the completion-only LM loss.

Pure helpers of ``kind: sft`` (`chessgrpo.tasks.kinds.sft`); they own no optimizer.

- `tokenize_examples`: prompt ids and completion ids (EOS appended) of `data.rookworld` examples;
- `sft_loss`: mean negative log-likelihood of the completion tokens given the prompt, from
  `models.lm.completion_log_probs` at temperature 1: the same function and the same left-padded
  layout that sampling and GRPO use, so SFT trains exactly the distribution RL starts from.
  Prompt tokens carry no loss unless `prompt_weight` > 0 (then they count at that weight);
- `any_of_loss`: the negative log of the probability that the completion starts with any one of several
  candidates (issue 66's any-optimal SFT arm: the candidates are `` B: <move>`` for every DTZ-optimal move);
- `policy_answers`: the P: examples whose M:/E: pairs can be listed in another order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from chessgrpo.data.rookworld_format import parse_policy_line
from chessgrpo.models.lm import ChessLM, completion_log_probs, left_pad, right_pad
from chessgrpo.models.prompt_bos import prompt_bos_id


@dataclasses.dataclass
class TokenizedExamples:
    """Examples as token ids: prompt ids and completion ids ending with EOS."""

    prompts: list[list[int]]
    completions: list[list[int]]
    tasks: list[str]

    def __len__(self) -> int:
        return len(self.prompts)


def tokenize_examples(lm: ChessLM, examples: list[Any], *, prompt_bos: bool = False) -> TokenizedExamples:
    """Token ids of `examples` (with ``prompt``, ``completion``, ``task``, ``line``); EOS ends each completion.

    Prompt and completion are encoded separately, exactly as sampling sees them (the prompt's ids,
    then generated ids), so where a joint encoding of the line would merge tokens across the
    boundary, SFT still trains the split that generation produces. `prompt_bos` puts the
    tokenizer's BOS before each prompt (`models.prompt_bos.with_prompt_bos`, upstream RookWorld's layout).
    Raises `ValueError` when an example is longer than the model's positions.
    """
    eos = lm.tokenizer.eos_token_id
    limit = lm.max_positions
    prefix = [prompt_bos_id(lm.tokenizer)] if prompt_bos else []
    prompts, completions, tasks = [], [], []
    for example in examples:
        prompt = prefix + lm.tokenizer.encode(example.prompt)
        completion = lm.tokenizer.encode(example.completion) + [eos]
        if limit is not None and len(prompt) + len(completion) > limit:
            raise ValueError(
                f"example of {len(prompt) + len(completion)} tokens exceeds the model's {limit} positions: {example.line[:60]!r}"
            )
        prompts.append(prompt)
        completions.append(completion)
        tasks.append(example.task)
    return TokenizedExamples(prompts, completions, tasks)


def policy_answers(examples: list[Any]) -> dict[int, tuple[str, Any]]:
    """index -> (FEN, PolicyAnswer) of the P: examples whose line parses and whose moves can be
    reordered (two or more); other lines are always used as written."""
    answers = {}
    for index, example in enumerate(examples):
        if example.task != "policy":
            continue
        try:
            fen, answer = parse_policy_line(example.line)
        except ValueError:
            continue
        if len(answer.moves) > 1:
            answers[index] = (fen, answer)
    return answers


def sft_loss(
    lm: ChessLM,
    prompts: list[list[int]],
    completions: list[list[int]],
    model: torch.nn.Module | None = None,
    *,
    chunk_rows: int = 0,
    prompt_weight: float = 0.0,
) -> tuple[torch.Tensor, float]:
    """(weighted mean NLL per token, the weight it is a mean over) for a batch, via `completion_log_probs` at T = 1.

    With `prompt_weight` = 0 (the default) only completion tokens count: the mean NLL per completion
    token and the completion token count. With `prompt_weight` w > 0 every prompt token after the first
    counts too, at weight w (upstream RookWorld trained on whole lines): the loss is
    (completion NLL + w x prompt NLL) / (completion tokens + w x prompt tokens), and that denominator
    is returned. Token positions are the same either way (positions follow the attention mask).
    `model` replaces ``lm.model`` in the forward (the spine's DDP wrapper of it in a data-parallel run).
    `chunk_rows` > 0: rows per forward (bounds the no-grad evaluation's logits; see `completion_log_probs`).
    """
    if prompt_weight < 0:
        raise ValueError(f"prompt_weight must be >= 0, got {prompt_weight}")
    device = lm.device
    pad = lm.tokenizer.eos_token_id
    if prompt_weight == 0:
        heads, tails = prompts, completions
    else:  # the same sequences split after their first token: the rest of the prompt is scored too
        heads, tails = [p[:1] for p in prompts], [p[1:] + c for p, c in zip(prompts, completions)]
    prompt_ids, prompt_mask = left_pad(heads, pad, device)
    completion_ids, completion_mask = right_pad(tails, pad, device)
    model = model if model is not None else lm.model
    logp, _ = completion_log_probs(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0, chunk_rows=chunk_rows
    )
    if prompt_weight == 0:
        tokens = float(completion_mask.sum())
        return -logp.sum() / max(tokens, 1.0), tokens
    weights = torch.zeros_like(logp)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        scored_prompt = len(prompt) - 1
        weights[row, :scored_prompt] = prompt_weight
        weights[row, scored_prompt : scored_prompt + len(completion)] = 1.0
    total = float(weights.sum())
    return -(logp * weights).sum() / max(total, 1e-9), total


def any_of_loss(
    lm: ChessLM, prompts: list[list[int]], candidates: list[list[list[int]]], model: torch.nn.Module | None = None
) -> torch.Tensor:
    """Mean over the prompts of -log sum_c p(c | prompt): the likelihood that the completion begins with any one of
    the prompt's candidate token sequences (no EOS: what follows a candidate is left free). Every prompt needs one
    candidate at least; candidates are scored by `completion_log_probs` at T = 1, as `sft_loss` scores completions."""
    if len(prompts) != len(candidates) or not all(candidates):
        raise ValueError("any_of_loss needs one non-empty candidate list per prompt")
    owners = [i for i, options in enumerate(candidates) for _ in options]
    pad = lm.tokenizer.eos_token_id
    prompt_ids, prompt_mask = left_pad([prompts[i] for i in owners], pad, lm.device)
    completion_ids, completion_mask = right_pad([c for options in candidates for c in options], pad, lm.device)
    logp, _ = completion_log_probs(
        model if model is not None else lm.model,
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        temperature=1.0,
    )
    sequence = logp.sum(dim=1)  # masked positions are 0
    owner = torch.tensor(owners, device=sequence.device)
    per_prompt = torch.stack([torch.logsumexp(sequence[owner == i], dim=0) for i in range(len(prompts))])
    return -per_prompt.mean()


def loss_tokens(prompt: list[int], completion: list[int], prompt_weight: float = 0.0) -> float:
    """The weight one example adds to `sft_loss`'s denominator (its completion tokens plus
    `prompt_weight` x its scored prompt tokens)."""
    return len(completion) + (prompt_weight * (len(prompt) - 1) if prompt_weight else 0.0)
