"""Move facts added to a trained policy (`models.add_facts`): the widened policy plays exactly as before, keeps the
weights of the facts it had, and a run started from a checkpoint without the repetition facts trains with them."""

from __future__ import annotations

import chess
import pytest
import torch

from chessgrpo.models.add_facts import with_move_facts
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, save_policy
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from test_mixture import ENDGAME, ONE_MOVE, _mixture

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

HISTORY = ("repetition", "threefold", "allows_threefold")


def trained_policy(**facts: bool) -> ActionPolicy:
    """A tiny policy whose move-fact weights are not zero (as after training), so a copy that lost or moved them
    would play differently."""
    torch.manual_seed(0)
    policy = ActionPolicy(PolicyConfig(**facts)).eval()
    if policy.move_facts is not None:
        with torch.no_grad():
            policy.move_facts.weights.weight.normal_(std=1.0)
            policy.move_facts.weights.bias.normal_(std=1.0)
    return policy


def game_with_repeats() -> chess.Board:
    """A game whose position after a knight's move back stood on the board before (the history facts are set)."""
    board = chess.Board()
    for uci in ["g1f3", "g8f6", "f3g1", "f6g8", "g1f3", "g8f6", "f3g1"]:
        board.push_uci(uci)
    return board


@pytest.mark.parametrize("start", [dict(move_facts=True, en_prise=True, leaves_hanging=True), dict()])
def test_the_widened_policy_plays_as_before_and_keeps_its_facts(start):
    """On a game whose moves set the repetition bits, the widened policy's logits equal the original's (which cannot
    see them); the facts it had keep their weights by name, the new ones start at zero."""
    original = trained_policy(**start)
    widened = with_move_facts(original, HISTORY)
    assert all(getattr(widened.config, key) for key in HISTORY) and widened.config.move_facts
    boards = [game_with_repeats(), chess.Board(), chess.Board("8/8/8/8/8/2k5/8/K6Q w - - 0 1")]
    inputs, masks = widened.inputs(boards)
    assert bool((inputs[:, 77:] >= 1 << 8).any()), "the game's history set no repetition bit"
    old_inputs, old_masks = original.inputs(boards)
    assert torch.equal(masks, old_masks)
    with torch.no_grad():
        assert torch.allclose(widened(inputs), original(old_inputs), atol=1e-6)
    if original.move_facts is not None:
        names = widened.config.fact_names
        for row, name in enumerate(original.config.fact_names):
            assert torch.equal(
                widened.move_facts.weights.weight[names.index(name)], original.move_facts.weights.weight[row]
            )
        for name in HISTORY:
            assert not widened.move_facts.weights.weight[names.index(name)].any()


def test_unknown_fact_is_refused():
    with pytest.raises(ValueError, match="unknown move facts"):
        with_move_facts(trained_policy(move_facts=True), ["repetitions"])


def test_a_run_from_a_checkpoint_without_the_facts_trains_with_them(tmp_path):
    """A mixture (one-move groups and KQvK games) from a checkpoint saved without the history facts, its `model`
    section asking for them: the run trains (the first step's sampling ratios are exact), its checkpoints read the
    facts, and the starting checkpoint is left as it was (that the added facts leave the policy unchanged: above)."""
    start = save_policy(trained_policy(move_facts=True, en_prise=True), tmp_path / "start")
    before = (start / "model.safetensors").read_bytes()
    model = {"size": "tiny", "move_facts": True, "en_prise": True, **{key: True for key in HISTORY}}
    config = _mixture(tmp_path, "widened", [ONE_MOVE, ENDGAME], init_checkpoint=str(start), model=model, steps=2)
    with Trainer(config) as trainer:
        trainer.train()
    rows = read_metrics(tmp_path / "widened" / "metrics.jsonl")
    assert len(rows) == 2 and rows[0]["ratio/first_max_abs_dev"] < 1e-4
    saved = load_policy(tmp_path / "widened")
    assert all(getattr(saved.config, key) for key in HISTORY) and saved.config.en_prise
    assert (start / "model.safetensors").read_bytes() == before
