"""Advantage estimators against hand-computed numbers (chessgrpo.rl.advantages)."""

from __future__ import annotations

import math

import pytest
import torch

from chessgrpo.rl import (
    GRPOConfig,
    RolloutBatch,
    compute_advantages,
    critic_advantages,
    group_advantages,
    process_advantages,
    stepwise_advantages,
    zero_std_groups,
)

# Two groups of different sizes, interleaved, with non-contiguous ids:
#   group 7  = rows 0, 1, 2, 5 with rewards 1, 0, 0, 3   (n = 4)
#   group 42 = rows 3, 4       with rewards 2, 5         (n = 2)
REWARDS = torch.tensor([1.0, 0.0, 0.0, 2.0, 5.0, 3.0])
GROUPS = torch.tensor([7, 7, 7, 42, 42, 7])


def assert_close(actual: torch.Tensor, expected: list, tol: float = 1e-5) -> None:
    assert actual.shape == torch.Size([len(expected)])
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


def test_grpo_by_hand() -> None:
    # group 7:  mean 1, deviations 0, -1, -1, 2; sum of squares 6; unbiased var 6/3 = 2, std sqrt(2)
    #           -> 0, -1/sqrt2, -1/sqrt2, 2/sqrt2 = 0, -0.70711, -0.70711, 1.41421
    # group 42: mean 3.5, deviations -1.5, 1.5; unbiased var 4.5/1, std 2.12132 -> -0.70711, 0.70711
    got = group_advantages(REWARDS, GROUPS, "grpo", epsilon=0.0)
    assert_close(got, [0.0, -0.70710678, -0.70710678, -0.70710678, 0.70710678, 1.41421356])


def test_grpo_epsilon_is_added_to_the_std() -> None:
    # row 5: 2 / (sqrt(2) + 0.5) = 2 / 1.91421356 = 1.04481550
    got = group_advantages(REWARDS, GROUPS, "grpo", epsilon=0.5)
    assert got[5].item() == pytest.approx(1.04481550, abs=1e-6)


def test_dr_grpo_by_hand() -> None:
    # r - mean_g: group 7 mean 1, group 42 mean 3.5
    got = group_advantages(REWARDS, GROUPS, "dr_grpo", epsilon=0.0)
    assert_close(got, [0.0, -1.0, -1.0, -1.5, 1.5, 2.0])


def test_rloo_by_hand() -> None:
    # group 7 (sum 4, n 4): r_i - (4 - r_i)/3 -> 1-1 = 0, 0-4/3, 0-4/3, 3-1/3 = 8/3
    # group 42 (sum 7, n 2): 2 - 5 = -3, 5 - 2 = 3
    got = group_advantages(REWARDS, GROUPS, "rloo", epsilon=0.0)
    assert_close(got, [0.0, -4 / 3, -4 / 3, -3.0, 3.0, 8 / 3])


def test_batch_std_by_hand() -> None:
    # batch: sum 11, mean 11/6; sum of squares 39 - 6 (11/6)^2 = 18.8333; unbiased var 18.8333/5 = 3.76667,
    # std 1.94079. Advantages = dr_grpo advantages / 1.94079.
    got = group_advantages(REWARDS, GROUPS, "batch_std", epsilon=0.0)
    std = math.sqrt(18.833333333 / 5)
    assert std == pytest.approx(1.94079, abs=1e-5)
    assert_close(got, [0.0, -0.51525402, -0.51525402, -0.77288103, 0.77288103, 1.03050804])


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "batch_std"])
def test_singleton_group_gets_zero(estimator: str) -> None:
    rewards = torch.tensor([4.0, 1.0, 3.0])
    groups = torch.tensor([-3, 100, 100])
    got = group_advantages(rewards, groups, estimator, epsilon=1e-4)
    assert got[0].item() == 0.0
    assert torch.isfinite(got).all()
    assert group_advantages(torch.tensor([2.5]), torch.tensor([9]), estimator).tolist() == [0.0]


def test_all_equal_group_gives_zero_not_nan() -> None:
    got = group_advantages(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([3, 3, 3]), "grpo", epsilon=1e-4)
    assert got.tolist() == [0.0, 0.0, 0.0]


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="advantage estimator"):
        group_advantages(REWARDS, GROUPS, "ppo")
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(REWARDS, GROUPS[:3])
    with pytest.raises(ValueError, match="integer"):
        group_advantages(REWARDS, GROUPS.float())


def test_zero_std_groups() -> None:
    # group 9: rewards 1, 1 (all equal); group 4: 0, 2; group -1: 5 (singleton, all equal)
    rewards = torch.tensor([1.0, 0.0, 1.0, 5.0, 2.0])
    groups = torch.tensor([9, 4, 9, -1, 4])
    rows, fraction = zero_std_groups(rewards, groups)
    assert rows.tolist() == [True, False, True, True, False]
    assert fraction == pytest.approx(2 / 3)


def test_zero_std_groups_with_step_rewards_ignores_masked_steps() -> None:
    rewards = torch.tensor([[1.0, 1.0, 7.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, False]])
    # group 0 = rows 0, 1: valid steps 1, 1, 1 -> all equal (the 7 is masked); group 5 = row 2: 0, 2
    rows, fraction = zero_std_groups(rewards, torch.tensor([0, 0, 5]), mask)
    assert rows.tolist() == [True, True, False]
    assert fraction == 0.5


def test_process_advantages_by_hand() -> None:
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 100.0], [3.0, 1.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, False]])
    groups = torch.tensor([0, 0, 11])
    # group 0 valid steps: 1, 0, 2, 0, 1 -> mean 0.8; deviations .2 -.8 1.2 -.8 .2; squares sum 2.8;
    #   unbiased var 2.8/4 = 0.7, std 0.83666 -> normalised .23905 -.95618 1.43427 | -.95618 .23905
    #   row 0 to-go: .23905 - .95618 + 1.43427 = .71714, -.95618 + 1.43427 = .47809, 1.43427
    #   row 1 to-go: -.95618 + .23905 = -.71714, .23905, 0 (masked; the 100 is ignored)
    # group 11 valid steps: 3, 1 -> mean 2, std sqrt(2) -> .70711 -.70711; to-go 0, -.70711, 0
    got = process_advantages(rewards, mask, groups, epsilon=0.0)
    expected = torch.tensor([[0.71714, 0.47809, 1.43427], [-0.71714, 0.23905, 0.0], [0.0, -0.70711, 0.0]])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_process_advantages_dr_grpo_skips_the_std() -> None:
    rewards = torch.tensor([[3.0, 1.0]])
    mask = torch.tensor([[True, True]])
    # mean 2 -> 1, -1; to-go 0, -1
    got = process_advantages(rewards, mask, torch.tensor([4]), estimator="dr_grpo")
    assert got.tolist() == [[0.0, -1.0]]
    with pytest.raises(ValueError, match="process supervision"):
        process_advantages(rewards, mask, torch.tensor([4]), estimator="rloo")


def test_stepwise_advantages_by_hand() -> None:
    # The rewards of test_process_advantages_by_hand: each valid step gets its own normalised reward.
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 100.0], [3.0, 1.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, False]])
    groups = torch.tensor([0, 0, 11])
    # group 0: (r - 0.8) / sqrt(0.7) -> .23905 -.95618 1.43427 | -.95618 .23905; group 11: (r - 2) / sqrt(2)
    got = stepwise_advantages(rewards, mask, groups, epsilon=0.0)
    expected = torch.tensor([[0.23905, -0.95618, 1.43427], [-0.95618, 0.23905, 0.0], [0.70711, -0.70711, 0.0]])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # dr_grpo: centred only -> .2 -.8 1.2 | -.8 .2 | 1 -1
    got = stepwise_advantages(rewards, mask, groups, estimator="dr_grpo")
    torch.testing.assert_close(
        got, torch.tensor([[0.2, -0.8, 1.2], [-0.8, 0.2, 0.0], [1.0, -1.0, 0.0]]), atol=1e-6, rtol=0
    )
    with pytest.raises(ValueError, match="prefix"):
        stepwise_advantages(rewards, torch.tensor([[True, False, True]] * 3), groups)


def test_critic_advantages_by_hand() -> None:
    # Valid steps 0.5, -1, 0, 2: mean 0.375, deviations .125 -1.375 -.375 1.625, squares sum 4.6875,
    # unbiased var 4.6875 / 3 = 1.5625, std 1.25; + epsilon 0.25 -> every valid reward / 1.5, not centred.
    rewards = torch.tensor([[0.5, -1.0, 0.0], [2.0, 9.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    got = critic_advantages(rewards, mask, epsilon=0.25)
    torch.testing.assert_close(got, torch.tensor([[1 / 3, -2 / 3, 0.0], [4 / 3, 0.0, 0.0]]), atol=1e-6, rtol=0)
    # A data-parallel learner's std over every rank replaces the local one.
    got = critic_advantages(rewards, mask, epsilon=0.25, batch_std=torch.tensor(0.75, dtype=torch.float64))
    assert got.tolist() == [[0.5, -1.0, 0.0], [2.0, 0.0, 0.0]]
    # A single valid step: std 0, so A = r / epsilon.
    assert critic_advantages(torch.tensor([[2.0, 5.0]]), torch.tensor([[True, False]]), epsilon=0.5).tolist() == [
        [4.0, 0.0]
    ]


class _TwoRanks:
    """A data-parallel stand-in whose std over 'all ranks' is a fixed number."""

    world_size, rank = 2, 0

    def std(self, values: torch.Tensor) -> torch.Tensor:
        return torch.tensor(0.75, dtype=torch.float64)


def test_compute_advantages_runs_the_batchs_supervision() -> None:
    rewards = torch.tensor([[0.5, -1.0, 0.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    groups = torch.tensor([3, 3])
    config = GRPOConfig(advantage_epsilon=0.25)

    def batch(supervision: str | None, batch_rewards: torch.Tensor = rewards) -> RolloutBatch:
        return RolloutBatch(
            inputs=None,
            actions=torch.zeros(2, 3, dtype=torch.long),
            behaviour_logp=torch.zeros(2, 3),
            mask=mask,
            rewards=batch_rewards,
            group_ids=groups,
            supervision=supervision,
        )

    process = process_advantages(rewards, mask, groups, 0.25)
    assert torch.equal(compute_advantages(batch(None), config), process)
    assert torch.equal(compute_advantages(batch("process"), config), process)
    assert torch.equal(compute_advantages(batch("step"), config), stepwise_advantages(rewards, mask, groups, 0.25))
    assert torch.equal(compute_advantages(batch("critic"), config), critic_advantages(rewards, mask, 0.25))
    assert compute_advantages(batch("critic"), config, _TwoRanks()).tolist() == [[0.5, -1.0, 0.0], [2.0, 0.0, 0.0]]
    outcome = torch.tensor([1.0, 0.0])
    expected = group_advantages(outcome, groups, "grpo", 0.25)
    assert torch.equal(compute_advantages(batch("outcome", outcome), config), expected)
    assert torch.equal(compute_advantages(batch(None, outcome), config), expected)
