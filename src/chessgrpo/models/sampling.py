"""The one way from logits to a distribution, and sampling from it.

`log_probs` is the single function that turns a policy's logits into log-probabilities (temperature and
legal-move mask applied): sampling, evaluation and every loss call it, so the behaviour policy and the
learner can never disagree on the distribution (docs/architecture.md, invariant 1). `multinomial_by_group`
draws each group's samples from the group's own generator (data-parallel ranks and resumed runs draw
the same moves).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def log_probs(logits: torch.Tensor, legal_mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the masked, tempered policy: log_softmax(logits / T) over legal actions.

    Illegal actions get -inf. Every sampler and every loss goes through this function.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for a distribution, got {temperature}")
    if legal_mask.shape != logits.shape:
        raise ValueError(f"mask shape {tuple(legal_mask.shape)} != logits shape {tuple(logits.shape)}")
    if not bool(legal_mask.any(dim=-1).all()):
        raise ValueError("a row of the legal mask has no legal action")
    scaled = logits.float() / temperature
    return scaled.masked_fill(~legal_mask, float("-inf")).log_softmax(dim=-1)


def sample_actions(
    logits: torch.Tensor,
    legal_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sample one action per row from `log_probs` (no top-k/top-p truncation: it would bias ratios)."""
    probs = log_probs(logits, legal_mask, temperature).exp()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


Generators = torch.Generator | Sequence[torch.Generator] | None
"""One generator for every row, one per group (index = the row's group), or None (torch's global one)."""


def multinomial_by_group(
    probs: torch.Tensor,
    num_samples: int,
    groups: Sequence[int] | torch.Tensor,
    generator: Generators,
    *,
    replacement: bool = False,
) -> torch.Tensor:
    """`torch.multinomial` of rows [R, A] where row r draws from ``generator[groups[r]]``.

    With one generator per group, a group's samples depend only on its own rows and its own seed
    (data-parallel ranks and resumed runs draw the same moves); a single generator (or None) is
    one plain call.
    """
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, num_samples, replacement=replacement, generator=generator)
    group_of_row = torch.as_tensor(groups, dtype=torch.long).cpu()
    if group_of_row.shape != probs.shape[:1]:
        raise ValueError(f"groups has {group_of_row.numel()} entries for {probs.shape[0]} rows")
    runs = _contiguous_runs(group_of_row.tolist())
    if runs is not None:  # each group's rows side by side (rollouts list games group by group): slices, no gathers
        return torch.cat(
            [
                torch.multinomial(probs[start:end], num_samples, replacement=replacement, generator=generator[group])
                for group, start, end in runs
            ]
        )
    out = torch.empty(probs.shape[0], num_samples, dtype=torch.long, device=probs.device)
    for group in torch.unique(group_of_row).tolist():
        rows = (group_of_row == group).nonzero().flatten().to(probs.device)
        out[rows] = torch.multinomial(probs[rows], num_samples, replacement=replacement, generator=generator[group])
    return out


def _contiguous_runs(groups: list[int]) -> list[tuple[int, int, int]] | None:
    """(group, start, end) of each run of equal groups, if every group forms one run; else None."""
    runs: list[tuple[int, int, int]] = []
    for index, group in enumerate(groups):
        if runs and runs[-1][0] == group:
            runs[-1] = (group, runs[-1][1], index + 1)
        else:
            runs.append((group, index, index + 1))
    return runs if len({group for group, _, _ in runs}) == len(runs) else None
