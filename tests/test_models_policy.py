"""The action-policy transformer (models/policy.py) and the single logits -> log-probs function."""

from __future__ import annotations

import math

import chess
import numpy as np
import pytest
import torch

from chessgrpo.board import ACTIONS, legal_mask, random_playout_positions
from chessgrpo.models import (
    ActionPolicy,
    PolicyConfig,
    load_policy,
    log_probs,
    resolve_checkpoint,
    sample_actions,
    save_policy,
)
from chessgrpo.rl import categorical_entropy


def _mask(rows: list[list[int]], width: int = 6) -> torch.Tensor:
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        mask[i, row] = True
    return mask


def test_log_probs_hand_computed_with_mask_and_temperature():
    logits = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[True, True, True, False]])
    got = log_probs(logits, mask, temperature=2.0)
    scaled = torch.tensor([0.5, 1.0, 1.5])
    expected = scaled - torch.logsumexp(scaled, 0)
    assert torch.allclose(got[0, :3], expected)
    assert got[0, 3] == float("-inf")  # an illegal move has probability exactly 0


def test_log_probs_rejects_bad_inputs():
    with pytest.raises(ValueError, match="temperature"):
        log_probs(torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool), temperature=0.0)
    with pytest.raises(ValueError, match="no legal action"):
        log_probs(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="shape"):
        log_probs(torch.zeros(1, 3), torch.ones(1, 4, dtype=torch.bool))


def test_entropy_of_the_masked_policy_is_exact():
    # The one entropy function (rl.categorical_entropy) of the one log-prob function's output.
    mask = _mask([[0, 1, 2], [4]])
    logits = torch.zeros(2, 6)
    logits[:, 5] = 50.0  # a huge illegal logit must not leak into the entropy
    entropy = categorical_entropy(log_probs(logits, mask))
    assert torch.allclose(entropy, torch.tensor([math.log(3), 0.0]))
    skewed = torch.tensor([[math.log(1.0), math.log(3.0), 0, 0, 0, 0]])
    p = torch.tensor([0.25, 0.75])
    assert torch.allclose(categorical_entropy(log_probs(skewed, _mask([[0, 1]]))), -(p * p.log()).sum().unsqueeze(0))
    # With a temperature: the entropy of the tempered distribution (logits / 2 -> probabilities 1/(1+sqrt3), sqrt3/(1+sqrt3)).
    q = torch.tensor([1.0, math.sqrt(3.0)]) / (1.0 + math.sqrt(3.0))
    tempered = categorical_entropy(log_probs(skewed, _mask([[0, 1]]), temperature=2.0))
    assert torch.allclose(tempered, -(q * q.log()).sum().unsqueeze(0))


def test_sampling_only_returns_legal_actions_at_the_right_rate():
    logits = torch.tensor([[0.0, math.log(3.0), 9.0, 0.0]]).repeat(4000, 1)
    mask = torch.tensor([[True, True, False, False]]).repeat(4000, 1)
    actions = sample_actions(logits, mask, generator=torch.Generator().manual_seed(0))
    assert set(actions.tolist()) <= {0, 1}
    assert abs((actions == 1).float().mean().item() - 0.75) < 0.03


def test_forward_shapes_and_predicted_moves_are_legal():
    model = ActionPolicy(PolicyConfig.from_size("tiny"))
    boards = random_playout_positions(40, seed=3)
    tokens, masks = model.inputs(boards)
    assert model(tokens).shape == (40, len(ACTIONS))
    for board, move in zip(boards, model.predict_moves(boards)):
        assert move in board.legal_moves
    sampled = model.predict_moves(boards, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert all(move in board.legal_moves for board, move in zip(boards, sampled))
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(2, 76, dtype=torch.long))


def test_predict_moves_is_deterministic_even_with_dropout_configured():
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig(dropout=0.5))
    model.train()
    boards = random_playout_positions(20, seed=4)
    assert model.predict_moves(boards) == model.predict_moves(boards)
    assert model.training  # the caller's mode is restored


def test_save_and_load_round_trip(tmp_path):
    model = ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2))
    save_policy(model, tmp_path / "run" / "checkpoints" / "step_000010")
    (tmp_path / "run" / "checkpoints" / "latest").symlink_to("step_000010")
    loaded = load_policy(tmp_path / "run")
    assert loaded.config == model.config
    assert resolve_checkpoint(tmp_path / "run") == (tmp_path / "run" / "checkpoints" / "step_000010").resolve()
    tokens, _ = model.inputs([chess.Board()])
    assert torch.equal(loaded(tokens), model.eval()(tokens))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_policy(tmp_path / "missing")


def test_unknown_size_and_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="unknown model size"):
        PolicyConfig.from_size("huge")
    with pytest.raises(ValueError, match="divisible"):
        PolicyConfig(d_model=30, n_heads=4)


def test_mask_used_by_the_model_matches_the_board():
    board = chess.Board("r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1")
    model = ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2))
    _, masks = model.inputs([board])
    assert np.array_equal(masks[0].numpy(), legal_mask(board))


def test_square_pair_head_reads_the_squares_a_move_connects():
    from chessgrpo.board import VOCABULARY, encode_fen
    from chessgrpo.models.policy import _board_token_positions, _square_pair_tables

    tokens = encode_fen(chess.STARTING_FEN)
    positions = _board_token_positions()
    assert VOCABULARY[tokens[int(positions[chess.E2])]] == "P"
    assert VOCABULARY[tokens[int(positions[chess.G8])]] == "n"
    assert VOCABULARY[tokens[int(positions[chess.E4])]] == "."
    pair, source, promotion = _square_pair_tables()
    e2e4 = ACTIONS.index("e2e4")
    assert int(pair[e2e4]) == chess.E2 * 64 + chess.E4 and int(source[e2e4]) == chess.E2 and int(promotion[e2e4]) == 0
    a7b8n = ACTIONS.index("a7b8n")
    assert int(pair[a7b8n]) == chess.A7 * 64 + chess.B8 and int(promotion[a7b8n]) == 4


def test_square_pair_head_logit_is_query_dot_key_plus_biases():
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    with torch.no_grad():
        model.head.action_bias.normal_()
    board = chess.Board()
    tokens, _ = model.inputs([board])
    with torch.no_grad():
        x = model.token_embedding(tokens) + model.position_embedding
        for block in model.blocks:
            x = block(x)
        x = model.ln_final(x)[0]
        head = model.head
        e2, e4 = x[1 + 6 * 8 + 4], x[1 + 4 * 8 + 4]  # FEN order: rank 8 first
        expected = head.query(e2) @ head.key(e4) * head.scale + head.action_bias[ACTIONS.index("e2e4")]
        assert float(model(tokens)[0, ACTIONS.index("e2e4")]) == pytest.approx(float(expected), abs=1e-5)


def test_pooled_head_still_available():
    model = ActionPolicy(PolicyConfig(head="pooled"))
    tokens, mask = model.inputs([chess.Board()])
    assert model(tokens).shape == (1, len(ACTIONS))
    with pytest.raises(ValueError, match="unknown policy head"):
        PolicyConfig(head="mlp")


def test_entropy_gradient_is_finite_with_masked_actions():
    logits = torch.randn(2, 5, requires_grad=True)
    mask = torch.tensor([[True, True, False, True, False], [True, False, False, False, False]])
    categorical_entropy(log_probs(logits, mask)).sum().backward()
    assert torch.isfinite(logits.grad).all()


def _facts_policy() -> tuple[ActionPolicy, torch.Tensor, torch.Tensor]:
    """A seeded 2 x 64 policy reading every move fact, with non-zero fact weights, and inputs of real positions."""
    torch.manual_seed(0)
    model = ActionPolicy(
        PolicyConfig(
            n_layers=2, d_model=64, n_heads=4, move_facts=True, en_prise=True, mate_in_two=True, leaves_hanging=True
        )
    )
    assert model.move_facts is not None
    torch.nn.init.normal_(
        model.move_facts.weights.weight, std=0.5
    )  # zero-initialised otherwise: the head would add nothing
    model.eval()
    boards = random_playout_positions(48, seed=3)
    tokens, legal = model.inputs(boards)
    assert int((tokens[:, 77:] > 0).sum()) > 100  # facts are set, so the head's lookup is exercised
    return model, tokens, legal


def test_cpu_inference_attention_computes_what_training_computes():
    """No-grad forwards on the CPU use an explicit attention product (faster there), training the fused kernel:
    the same logits to float rounding, and the same sampled moves."""
    model, tokens, legal = _facts_policy()
    with torch.no_grad():
        inference = model(tokens)
    training = model(tokens).detach()  # gradients on: the fused kernel
    assert torch.allclose(inference, training, atol=1e-5, rtol=0)
    draws = [
        torch.multinomial(log_probs(logits, legal).exp(), 1, generator=torch.Generator().manual_seed(1))
        for logits in (inference, training)
    ]
    assert torch.equal(draws[0], draws[1])


def test_move_facts_head_lookup_equals_summing_each_actions_fact_weights():
    """The head looks each action's bias up by its fact byte; the definition is the sum of the weights of the
    facts the byte sets (bits past the named facts ignored), which this computes action by action."""
    model, tokens, _ = _facts_policy()
    head = model.move_facts
    assert head is not None
    x = torch.randn(tokens.shape[0], 77, 64)
    facts = tokens[:, 77:]
    weights = head.weights(x.mean(dim=1))  # [B, F]
    bits = ((facts.unsqueeze(-1) >> head.shifts) & 1).float()  # [B, 1968, F]
    assert torch.allclose(head(x, facts), (bits * weights.unsqueeze(1)).sum(-1), atol=1e-6)
