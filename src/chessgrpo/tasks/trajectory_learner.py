"""From trajectory groups to the learner: the batch (`to_rollout_batch`), the learner's forward over the rollout's
distinct positions (`make_forward`), and the rollout's outcome metrics (`outcome_metrics`).

The rollout itself (opponents, `play_trajectories`) is `tasks.trajectory`; its module docstring describes a step.
"""

from __future__ import annotations

import torch

from chessgrpo.models.policy import ActionPolicy
from chessgrpo.rl import SUPERVISIONS, PolicyOutputs, RolloutBatch, categorical_entropy, eval_mode_forward
from chessgrpo.tasks.policy_forward import distinct_position_log_probs, exact_reference_kl
from chessgrpo.tasks.trajectory import Trajectories


def to_rollout_batch(trajectories: Trajectories, step_rewards: torch.Tensor, supervision: str) -> RolloutBatch:
    """Rows = trajectories (L = T, masked), named with their `supervision`; the learner computes the
    advantages (`rl.compute_advantages`).

    outcome: rewards [N] = row sums of the step rewards (one advantage per row); process, step and
    critic: the step rewards [N, T], 0 at masked plies.
    """
    if step_rewards.shape != trajectories.mask.shape:
        raise ValueError(
            f"step rewards of shape {tuple(step_rewards.shape)} for trajectories {tuple(trajectories.mask.shape)}"
        )
    if supervision not in SUPERVISIONS:
        raise ValueError(f"supervision must be one of {list(SUPERVISIONS)}, got {supervision!r}")
    masked = torch.where(trajectories.mask, step_rewards.float(), torch.zeros_like(step_rewards, dtype=torch.float32))
    rewards = masked.sum(dim=1) if supervision == "outcome" else masked
    return RolloutBatch(
        inputs={"position": trajectories.position},
        actions=trajectories.actions,
        behaviour_logp=trajectories.behaviour_logp,
        mask=trajectories.mask,
        rewards=rewards,
        group_ids=trajectories.group_ids.clone(),
        ref_logp=trajectories.ref_logp,
        supervision=supervision,
    )


def make_forward(
    model: ActionPolicy,
    trajectories: Trajectories,
    *,
    temperature: float,
    bf16: bool = False,
    reference: ActionPolicy | None = None,
):
    """The learner's forward: log-probs and exact entropy [n, T] of every valid ply of a minibatch, and with
    `reference` the exact KL(policy || reference) over all legal moves at each ply (`PolicyOutputs.kl`).

    All valid plies of the minibatch go through the model in one call, once per distinct position.
    Masked positions hold 0 (the loss ignores them). The model must be in eval mode; gradients flow.
    """

    def outputs(minibatch: RolloutBatch) -> PolicyOutputs:
        valid = minibatch.mask
        at = distinct_position_log_probs(
            model, trajectories.tokens, trajectories.legal, minibatch.inputs["position"][valid], temperature, bf16=bf16
        )
        chosen = at.logp_full[at.inverse].gather(1, minibatch.actions[valid].unsqueeze(1)).squeeze(1)
        entropy = categorical_entropy(at.logp_full)[at.inverse]
        zeros = torch.zeros(valid.shape, dtype=chosen.dtype, device=chosen.device)
        kl = None
        if reference is not None:
            per_position = exact_reference_kl(
                reference, trajectories.tokens, trajectories.legal, at, temperature, bf16=bf16
            )
            kl = zeros.masked_scatter(valid, per_position[at.inverse])
        return PolicyOutputs(
            logp=zeros.masked_scatter(valid, chosen), entropy=zeros.masked_scatter(valid, entropy), kl=kl
        )

    return eval_mode_forward(model, outputs)


# ------------------------------------------------------------------------------------------------
# Metrics


def outcome_metrics(
    trajectories: Trajectories,
    step_rewards: torch.Tensor,
    reward: str,
    *,
    shaping: float = 0.0,
    tablebase_opponent: bool = False,
    regret: bool = False,
) -> dict[str, float]:
    """rollout/length, rollout/{mate,mated,draw,horizon}_rate, reward/outcome and, for tablebase rewards,
    rollout/win_lost_rate and (against the tablebase) rollout/dtz_optimal_rate.

    The tablebase outcome (+1 mate, -1 mated or drawn, 0 undecided) assumes the row's mover starts
    winning, as in the endgame curriculum."""
    outcomes = trajectories.outcomes()
    n = max(len(outcomes), 1)
    metrics = {
        "rollout/length": float(trajectories.lengths.float().mean()),
        "rollout/mate_rate": sum(o == "mate" for o in outcomes) / n,
        "rollout/mated_rate": sum(o == "mated" for o in outcomes) / n,
        "rollout/draw_rate": sum(o.startswith("draw:") for o in outcomes) / n,
        "rollout/horizon_rate": sum(o == "horizon" for o in outcomes) / n,
    }
    if reward == "tablebase":
        # Outcome of a row: +1 mate, -1 the mover's win given away / mated, 0 otherwise (undecided at the horizon).
        scores = [1.0 if o == "mate" else -1.0 if (o == "mated" or o.startswith("draw:")) else 0.0 for o in outcomes]
        metrics["reward/outcome"] = sum(scores) / n
        metrics["rollout/win_lost_rate"] = sum(s < 0 for s in scores) / n
        if shaping > 0 and tablebase_opponent:
            # Against the perfect defender a ply earns >= shaping exactly when it mates or shortens DTZ by 2 plies.
            valid = step_rewards[trajectories.mask]
            threshold = -1e-6 if regret else shaping - 1e-6  # regret: an optimal ply scores 0
            metrics["rollout/dtz_optimal_rate"] = float((valid >= threshold).float().mean())
    else:
        # The final expected score for the mover is the start value plus the summed step rewards.
        metrics["reward/outcome"] = float(
            torch.where(trajectories.mask, step_rewards, torch.zeros_like(step_rewards)).sum(1).mean()
        )
    return metrics
