"""Supervised learning of the action policy on engine-labelled positions: targets, losses, metrics.

Two objectives, both cross-entropies against `models.policy.log_probs` (the one way from logits
to a distribution, legal mask applied):

- ``bc`` (behaviour cloning): the target is the engine's best move.
- ``distill`` (value-aware distillation): the target is ``softmax(win_probs / T)`` over the
  labelled multipv moves (moves outside the top-M get probability 0). Win probabilities lie in
  [0, 1], so the temperature is in win-probability units: at T = 0.05 a move 0.05 worse gets
  e^-1 = 0.37 times the weight of the best, one 0.15 worse e^-3 = 0.05 times. T -> 0 recovers
  behaviour cloning (up to ties); a large T spreads mass evenly over the top-M list.

A policy with a value head also learns the labelled position value (the side to move's expected
score, ``win_probs[:, 0]``: the value after the best move) by binary cross-entropy with that soft
target (`value_loss`), added to the move objective with a weight.

Everything here is a pure function of tensors (no optimizer, no run directory); the training
kind that uses them is `tasks.kinds.pretrain`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F

from chessgrpo.board import NUM_ACTIONS
from chessgrpo.models.policy import ActionPolicy, log_probs
from chessgrpo.train.dataset import Batch, PositionTensors

Objective = Literal["bc", "distill"]
OBJECTIVES: tuple[str, ...] = ("bc", "distill")


def distill_targets(actions: torch.Tensor, win_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Dense targets [B, 1968]: softmax(win_probs / T) over each row's labelled moves, 0 elsewhere.

    Args:
        actions: [B, M] action indices of the multipv moves, -1 where a row has fewer than M.
        win_probs: [B, M] win probability (side to move) after each move.
        temperature: T > 0, in win-probability units.
    """
    if temperature <= 0:
        raise ValueError(f"distill temperature must be > 0, got {temperature}")
    valid = actions >= 0
    scores = (win_probs.float() / temperature).masked_fill(~valid, float("-inf"))
    weights = torch.softmax(scores, dim=-1).masked_fill(~valid, 0.0)
    targets = torch.zeros(actions.shape[0], NUM_ACTIONS, dtype=torch.float32, device=actions.device)
    return targets.scatter_add_(1, actions.clamp(min=0), weights)


def soft_cross_entropy(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-row -sum(target * logp); entries with target 0 contribute 0 even where logp is -inf."""
    terms = torch.where(targets > 0, targets * logp, torch.zeros_like(logp))
    return -terms.sum(dim=-1)


def best_move_nll(logp: torch.Tensor, best_action: torch.Tensor) -> torch.Tensor:
    """Per-row -log p(best move): the behaviour-cloning cross-entropy."""
    return -logp.gather(1, best_action.unsqueeze(1)).squeeze(1)


def objective_loss(logp: torch.Tensor, batch: Batch, objective: Objective, temperature: float) -> torch.Tensor:
    """Per-row loss of the chosen objective."""
    if objective == "bc":
        return best_move_nll(logp, batch.best_action)
    if objective == "distill":
        return soft_cross_entropy(logp, distill_targets(batch.actions, batch.win_probs, temperature))
    raise ValueError(f"unknown objective {objective!r}; choose bc or distill")


def value_targets(batch: Batch) -> torch.Tensor:
    """[B] the labelled value of each position: the side to move's expected score after the best move."""
    return batch.win_probs[:, 0].float()


def value_loss(value_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-row binary cross-entropy of sigmoid(value_logits) against soft targets in [0, 1]."""
    return F.binary_cross_entropy_with_logits(value_logits.float(), targets, reduction="none")


@torch.no_grad()
def value_sums(value_logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Sums over the batch: absolute error of the predicted value, and its cross-entropy."""
    predicted = torch.sigmoid(value_logits.float())
    return {
        "value_mae": float((predicted - targets).abs().sum()),
        "value_bce": float(value_loss(value_logits, targets).sum()),
    }


@torch.no_grad()
def accuracy_sums(logp: torch.Tensor, batch: Batch) -> dict[str, float]:
    """Sums over the batch: top-1/top-5 hits of the best move, BC nll, and whether the argmax is
    among the labelled multipv moves."""
    best = batch.best_action.unsqueeze(1)
    top5 = logp.topk(min(5, logp.shape[1]), dim=-1).indices
    top1 = top5[:, :1]
    return {
        "top1": float((top1 == best).sum()),
        "top5": float((top5 == best).any(dim=-1).sum()),
        "nll": float(best_move_nll(logp, batch.best_action).sum()),
        "in_multipv": float((batch.actions == top1).any(dim=-1).sum()),
    }


@torch.no_grad()
def split_sums(
    model: ActionPolicy,
    data: PositionTensors,
    *,
    batch_size: int,
    device: torch.device,
    extra: Callable[[torch.Tensor, Batch], dict[str, float]] | None = None,
    totals: dict[str, float] | None = None,
) -> dict[str, float]:
    """Sums over a split's rows, in fp32 and eval mode (the model's mode is restored afterwards): the
    accuracy sums (`accuracy_sums`), ``extra(logp, batch)``'s, and with a value head the value sums;
    added onto `totals` (whose keys keep their order)."""
    was_training = model.training
    model.eval()
    totals = dict(totals or {})
    with_value = model.value_head is not None
    try:
        for start in range(0, len(data), batch_size):
            batch = data.batch(torch.arange(start, min(len(data), start + batch_size))).to(device)
            output = model(batch.tokens, with_value=with_value)
            logits, value_logits = output if with_value else (output, None)
            logp = log_probs(logits.float(), batch.legal_mask)
            sums = {**accuracy_sums(logp, batch), **(extra(logp, batch) if extra is not None else {})}
            if value_logits is not None:
                sums.update(value_sums(value_logits, value_targets(batch)))
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
    finally:
        model.train(was_training)
    return totals


def evaluate_policy_on_split(
    model: ActionPolicy,
    data: PositionTensors,
    *,
    objective: Objective,
    temperature: float,
    batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Held-out metrics in fp32 and eval mode (the model's mode is restored afterwards): eval/loss
    (the objective), eval/top1, eval/top5, eval/nll (cross-entropy to the best move, comparable
    across objectives), eval/perplexity, eval/in_multipv (share of argmax moves among the labelled
    top-M); with a value head also eval/value_mae and eval/value_bce against the labelled values."""

    def loss(logp: torch.Tensor, batch: Batch) -> dict[str, float]:
        return {"loss": float(objective_loss(logp, batch, objective, temperature).sum())}

    totals = split_sums(
        model,
        data,
        batch_size=batch_size,
        device=device,
        extra=loss,
        totals={"loss": 0.0, "top1": 0.0, "top5": 0.0, "nll": 0.0, "in_multipv": 0.0},
    )
    metrics = {f"eval/{key}": value / len(data) for key, value in totals.items()}
    metrics["eval/perplexity"] = math.exp(metrics["eval/nll"])
    return metrics
