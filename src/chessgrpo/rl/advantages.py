"""Group-relative advantages: pure, vectorised functions of rewards and group ids.

A group is the set of rows sampled from the same prompt (position, trajectory start); its rewards
are the baseline, so no value network is needed (GRPO, Shao et al. 2024). Group ids are arbitrary
integers (not necessarily contiguous or sorted); they are mapped to 0..G-1 with
`torch.unique(return_inverse=True)` and reduced with `index_add_`/`scatter_reduce`, never with a
Python loop over rows. Statistics are computed in float64 and returned in the rewards' dtype.

The standard deviation is the unbiased one (divisor n - 1, torch's default and TRL's choice). A
group of size 1 has no baseline: its advantage is 0 under every estimator.

A batch's `supervision` (`RolloutBatch.supervision`) says what its rewards are and so which
function turns them into advantages (`rl.compute_advantages` dispatches):

- ``outcome``: one reward per row [N] -> `group_advantages`;
- ``process``: one reward per step [N, L] -> `process_advantages` (reward-to-go);
- ``step``: per-step rewards [N, L] -> `stepwise_advantages` (each step's own, no reward-to-go);
- ``critic``: per-step rewards [N, L] already relative to an external baseline -> `critic_advantages`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from chessgrpo.rl.config import ADVANTAGE_ESTIMATORS

PROCESS_ESTIMATORS = ("grpo", "dr_grpo")
"""The `GRPOConfig.advantage_estimator` values that apply to step rewards [N, L] (``process``, ``step``)."""
SUPERVISIONS = ("outcome", "process", "step", "critic")
"""What a batch's rewards are, and so how they become advantages (module docstring)."""


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    estimator: str = "grpo",
    epsilon: float = 1e-4,
    *,
    batch_std: Tensor | None = None,
) -> Tensor:
    """Advantages [N] of outcome rewards [N] relative to their groups.

    With mean_g and std_g the mean and unbiased std of the rewards of row i's group g (size n_g):

    - ``grpo``:      A_i = (r_i - mean_g) / (std_g + epsilon)                 (DeepSeekMath)
    - ``dr_grpo``:   A_i = r_i - mean_g                                       (Dr. GRPO)
    - ``rloo``:      A_i = r_i - (sum_g - r_i) / (n_g - 1) = n_g / (n_g - 1) * (r_i - mean_g)  (RLOO)
    - ``batch_std``: A_i = (r_i - mean_g) / (std(r over the whole batch) + epsilon)  (REINFORCE++ / Lite PPO)

    A group of size 1 gets A = 0. For ``batch_std`` the batch std is the unbiased std of all N
    rewards (0 when N = 1), as TRL's ``scale_rewards="batch"``; a data-parallel learner passes the
    std of the whole batch over all ranks as `batch_std`.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator must be one of {list(ADVANTAGE_ESTIMATORS)}, got {estimator!r}")
    _check_rows(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    r = rewards.double()
    inverse, counts = _group_index(group_ids)
    mean, std = _group_mean_std(r, inverse, counts)
    deviation = r - mean[inverse]
    if estimator == "grpo":
        advantages = deviation / (std[inverse] + epsilon)
    elif estimator == "dr_grpo":
        advantages = deviation
    elif estimator == "rloo":
        n = counts.double()
        scale = torch.where(counts > 1, n / (n - 1).clamp(min=1.0), torch.zeros_like(n))
        advantages = deviation * scale[inverse]
    else:  # batch_std
        if batch_std is None:
            batch_std = r.std() if r.numel() > 1 else r.new_zeros(())
        advantages = deviation / (batch_std.to(r) + epsilon)
    return advantages.to(rewards.dtype)


def zero_std_groups(rewards: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> tuple[Tensor, float]:
    """(rows [N] bool whose group's rewards are all equal, fraction of groups that are so).

    Such groups carry no learning signal (every advantage is 0); DAPO's dynamic sampling drops
    them. For step rewards [N, L], pass `mask` [N, L]: a group is all-equal when every valid step
    of every row of the group has the same reward. A group of size 1 counts as all-equal.
    """
    if rewards.dim() == 2:
        if mask is None or mask.shape != rewards.shape:
            raise ValueError("step rewards [N, L] need a mask of the same shape")
        _check_group_ids(group_ids, rewards.shape[0])
        rows = torch.arange(rewards.shape[0], device=rewards.device).unsqueeze(1).expand_as(rewards)[mask]
        values = rewards[mask]
    else:
        _check_rows(rewards, group_ids)
        rows = torch.arange(rewards.shape[0], device=rewards.device)
        values = rewards
    if rewards.shape[0] == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device), 0.0
    inverse, counts = _group_index(group_ids)
    step_groups = inverse[rows]
    values = values.double()
    num_groups = counts.numel()
    high = values.new_full((num_groups,), float("-inf")).scatter_reduce(0, step_groups, values, reduce="amax")
    low = values.new_full((num_groups,), float("inf")).scatter_reduce(0, step_groups, values, reduce="amin")
    equal = high == low
    return equal[inverse], float(equal.double().mean())


def process_advantages(
    step_rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    epsilon: float = 1e-4,
    estimator: str = "grpo",
) -> Tensor:
    """Advantages [N, L] from per-step rewards: DeepSeekMath process supervision (Shao et al. 2024, 4.1.3).

    Every valid step reward of a group is normalised by the group's statistics over all valid
    steps of all its rows (count m_g, unbiased std):

        r~_{i,t} = (r_{i,t} - mean_g) / (std_g + epsilon)      (``grpo``)
        r~_{i,t} =  r_{i,t} - mean_g                           (``dr_grpo``: no std scaling)

    and the advantage of step t is the sum of the normalised rewards from t to the end of its row,
    A_{i,t} = sum_{s >= t, mask_{i,s}} r~_{i,s}. Masked positions get 0. A group with a single
    valid step has r~ = 0.
    """
    if estimator not in PROCESS_ESTIMATORS:
        raise ValueError(
            f"process supervision supports advantage estimators {list(PROCESS_ESTIMATORS)}, got {estimator!r}"
        )
    _check_steps(step_rewards, mask)
    _check_group_ids(group_ids, step_rewards.shape[0])
    if step_rewards.numel() == 0:
        return step_rewards.clone()
    inverse, counts = _group_index(group_ids)
    step_groups = inverse.unsqueeze(1).expand_as(step_rewards)[mask]
    values = step_rewards[mask].double()
    num_groups = counts.numel()
    step_counts = torch.zeros(num_groups, dtype=torch.long, device=values.device).index_add_(
        0, step_groups, torch.ones_like(step_groups)
    )
    mean, std = _group_mean_std(values, step_groups, step_counts)
    normalised = values - mean[step_groups]
    if estimator == "grpo":
        normalised = normalised / (std[step_groups] + epsilon)
    dense = torch.zeros(step_rewards.shape, dtype=torch.float64, device=step_rewards.device)
    dense[mask] = normalised
    # Reward-to-go: reverse cumulative sum along the row (masked positions hold 0, so they add nothing).
    to_go = dense.flip(1).cumsum(1).flip(1)
    return torch.where(mask, to_go, torch.zeros_like(to_go)).to(step_rewards.dtype)


def stepwise_advantages(
    step_rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    epsilon: float = 1e-4,
    estimator: str = "grpo",
) -> Tensor:
    """Advantages [N, L] from per-step rewards: each step's own normalised reward, no reward-to-go.

    The normalisation is `process_advantages`' (group statistics over all valid steps), without the
    sum over later steps: A_{i,t} = r~_{i,t}. When a step's reward already is its exact advantage
    (e.g. a potential difference of an exact value against a deterministic opponent), the later
    steps' rewards only add noise; here each step is credited with what it did alone. Computed as
    the difference of consecutive reward-to-go values, A_t = to_go_t - to_go_{t+1}, so it is exactly
    `process_advantages`' normalisation. Rows' masks must be prefixes (valid steps first); masked
    positions get 0.
    """
    _check_steps(step_rewards, mask)
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("stepwise advantages need prefix masks: a valid step follows a masked one")
    to_go = process_advantages(step_rewards, mask, group_ids, epsilon, estimator=estimator)
    following = torch.zeros_like(to_go)
    following[:, :-1] = to_go[:, 1:]
    return torch.where(mask, to_go - following, torch.zeros_like(to_go))


def critic_advantages(
    step_rewards: Tensor, mask: Tensor, epsilon: float = 1e-4, *, batch_std: Tensor | None = None
) -> Tensor:
    """Advantages [N, L] of per-step rewards that are already relative to an external baseline.

    A_{i,t} = r_{i,t} / (std(valid r over the whole batch) + epsilon), not centred: REINFORCE with a
    critic's baseline (e.g. a regret reward, 0 for the move the exact value prefers, has a perfect
    per-position baseline, which a group mean would only blur); the batch std only sets the step
    size. The std is the unbiased one of all valid step rewards (0 for a single one); a
    data-parallel learner passes the std over all ranks' valid rewards as `batch_std`. Masked
    positions get 0. No group ids: rows are never compared with each other.
    """
    _check_steps(step_rewards, mask)
    if batch_std is None:
        valid = step_rewards[mask].double()
        batch_std = valid.std() if valid.numel() > 1 else valid.new_zeros(())
    scale = float(batch_std)
    return torch.where(mask, step_rewards / (scale + epsilon), torch.zeros_like(step_rewards))


# ------------------------------------------------------------------------------------------------


def _check_rows(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N], got shape {list(rewards.shape)}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float tensor, got {rewards.dtype}")
    _check_group_ids(group_ids, rewards.shape[0])


def _check_steps(step_rewards: Tensor, mask: Tensor) -> None:
    if step_rewards.dim() != 2 or mask.shape != step_rewards.shape:
        raise ValueError(
            f"step_rewards and mask must both be [N, L]; got {list(step_rewards.shape)} and {list(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be torch.bool, got {mask.dtype}")
    if not step_rewards.is_floating_point():
        raise ValueError(f"step_rewards must be a float tensor, got {step_rewards.dtype}")


def _check_group_ids(group_ids: Tensor, n: int) -> None:
    if tuple(group_ids.shape) != (n,):
        raise ValueError(f"group_ids must have shape [{n}], got {list(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def zero_advantage_groups(advantages: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> Tensor:
    """Rows [N] bool whose group's advantages are all exactly 0 (every valid step of [N, L] advantages, `mask`).

    These are the groups without signal whatever the supervision, the ones dynamic sampling may drop. For the
    group-relative supervisions they are the groups of all-equal rewards (`zero_std_groups`); under ``critic``
    supervision the advantages are not centred on the group, so a group whose moves are all equally worse than the
    exact value's (every regret -0.2) still teaches and only a group of all-zero regrets does not.
    """
    if advantages.dim() == 2:
        if mask is None or mask.shape != advantages.shape:
            raise ValueError("step advantages [N, L] need a mask of the same shape")
        zero_rows = ((advantages == 0) | ~mask).all(dim=1)
    else:
        zero_rows = advantages == 0
    if advantages.shape[0] == 0:
        return zero_rows
    inverse, counts = _group_index(group_ids)
    informative = torch.zeros(counts.numel(), dtype=torch.long, device=advantages.device)
    informative.index_add_(0, inverse, (~zero_rows).long())
    return informative[inverse] == 0


def _group_index(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(inverse [N] in 0..G-1, counts [G]) for arbitrary integer group ids."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return inverse, counts


def _group_mean_std(values: Tensor, groups: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """Per-group mean [G] and unbiased std [G] (0 for groups of one) of `values` indexed by `groups`."""
    num_groups = counts.numel()
    n = counts.to(values.dtype)
    sums = values.new_zeros(num_groups).index_add_(0, groups, values)
    mean = sums / n.clamp(min=1.0)
    squares = values.new_zeros(num_groups).index_add_(0, groups, (values - mean[groups]) ** 2)
    var = torch.where(counts > 1, squares / (n - 1).clamp(min=1.0), torch.zeros_like(squares))
    return mean, var.sqrt()
