"""`RolloutBatch` validation and row selection (chessgrpo.rl.batch)."""

from __future__ import annotations

import pytest
import torch

from chessgrpo.rl import RolloutBatch


def make_batch(**overrides: object) -> RolloutBatch:
    fields = dict(
        inputs={"ids": torch.arange(12).reshape(3, 4), "pair": (torch.zeros(3, 2), torch.ones(3))},
        actions=torch.tensor([[1, 2], [3, 0], [4, 4]]),
        behaviour_logp=torch.tensor([[-0.5, -1.0], [-0.1, 0.0], [-2.0, -3.0]]),
        mask=torch.tensor([[True, True], [True, False], [True, True]]),
        rewards=torch.tensor([1.0, 0.0, 0.5]),
        group_ids=torch.tensor([10, 10, 3]),
        extras={"legal": torch.ones(3, 2, 5, dtype=torch.bool)},
    )
    fields.update(overrides)
    return RolloutBatch(**fields)  # type: ignore[arg-type]


def test_valid_batch_passes() -> None:
    batch = make_batch()
    batch.validate()
    assert batch.num_rows == 3
    make_batch(rewards=torch.zeros(3, 2), inputs=["a", "b", "c"], advantages=torch.zeros(3)).validate()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(actions=torch.tensor([[1, 2], [3, 0], [4, 4]], dtype=torch.int32)), "actions"),
        (dict(behaviour_logp=torch.zeros(3, 3)), "behaviour_logp"),
        (dict(behaviour_logp=torch.zeros(3, 2, dtype=torch.bfloat16)), "behaviour_logp"),
        (dict(behaviour_logp=torch.tensor([[-0.5, 0.3], [0.0, 0.0], [0.0, 0.0]])), "behaviour_logp"),
        (dict(mask=torch.tensor([[True, True], [False, False], [True, True]])), "mask"),
        (dict(mask=torch.ones(3, 2)), "mask"),
        (dict(rewards=torch.tensor([1.0, float("nan"), 0.0])), "rewards"),
        (dict(rewards=torch.zeros(2)), "rewards"),
        (dict(group_ids=torch.tensor([1.0, 1.0, 2.0])), "group_ids"),
        (dict(ref_logp=torch.zeros(3, 1)), "ref_logp"),
        (dict(advantages=torch.zeros(4)), "advantages"),
        (dict(extras={"legal": torch.ones(2, 5)}), "extras"),
        (dict(inputs=torch.zeros(4, 2)), "inputs"),
        (dict(inputs=["a"]), "inputs"),
        (dict(supervision="reward_to_go"), "supervision"),
        (dict(supervision="step"), "supervision"),  # step rewards are [N, L]
        (dict(rewards=torch.zeros(3, 2), supervision="outcome"), "supervision"),  # outcome rewards are [N]
    ],
)
def test_invalid_batches_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_batch(**overrides).validate()


def test_select_indexes_every_per_row_field() -> None:
    batch = make_batch(
        ref_logp=torch.tensor([[-1.0, -1.0], [-2.0, -2.0], [-3.0, -3.0]]), advantages=torch.tensor([0.1, 0.2, 0.3])
    )
    batch.extras["legal"][2, 0, 0] = False
    picked = batch.select(torch.tensor([2, 0]))
    picked.validate()
    assert picked.num_rows == 2
    assert picked.inputs["ids"].tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]
    assert picked.inputs["pair"][1].shape == (2,)
    assert picked.actions.tolist() == [[4, 4], [1, 2]]
    assert picked.group_ids.tolist() == [3, 10]
    assert picked.rewards.tolist() == [0.5, 1.0]
    assert picked.ref_logp is not None and picked.ref_logp[:, 0].tolist() == [-3.0, -1.0]
    assert picked.advantages is not None and picked.advantages.tolist() == pytest.approx([0.3, 0.1])
    assert picked.extras["legal"][0, 0, 0].item() is False
    by_mask = make_batch(inputs=["a", "b", "c"]).select(torch.tensor([False, True, True]))
    assert by_mask.inputs == ["b", "c"]
    assert by_mask.mask.tolist() == [[True, False], [True, True]]
    # The original is untouched.
    assert batch.num_rows == 3 and batch.actions[0].tolist() == [1, 2]
    # The supervision names the batch, so its rows keep it.
    assert make_batch(rewards=torch.zeros(3, 2), supervision="critic").select(torch.tensor([1])).supervision == "critic"


def test_supervision_defaults_by_the_rewards_shape() -> None:
    assert make_batch().reward_supervision == "outcome"
    assert make_batch(rewards=torch.zeros(3, 2)).reward_supervision == "process"
    step = make_batch(rewards=torch.zeros(3, 2), supervision="step")
    step.validate()
    assert step.reward_supervision == "step"
