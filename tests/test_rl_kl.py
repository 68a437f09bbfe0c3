"""The KL term of the GRPO loss penalises KL(policy || reference), with the gradient docs/architecture.md states for
each `grpo.kl_estimator` ("The KL term"), on-policy and off-policy; k1 is refused as a loss; the tasks' forwards
deliver the exact KL (action policy over legal moves, chess LM over its vocabulary) with real tiny models.

The expected gradient of a per-sample loss is computed exactly, without sampling noise: sum over every action a of
behaviour(a) * grad loss(a), each a one-row `policy_loss` call.
"""

from __future__ import annotations

import copy

import pytest
import torch

from chessgrpo.models.lm import LMModelConfig, build_lm, completion_log_probs, prepare_for_rl
from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.rl import GRPOConfig, PolicyOutputs, exact_kl, policy_loss
from chessgrpo.tasks import lm_rollout
from chessgrpo.tasks.move_group import StartPositions, make_forward, sample_groups, to_rollout_batch

ACTIONS = 6


def _distributions(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Policy logits (leaf, with grad), reference log-probs, and a behaviour policy's log-probs that differ from both."""
    generator = torch.Generator().manual_seed(seed)
    theta = torch.randn(ACTIONS, generator=generator).requires_grad_(True)
    ref = torch.randn(ACTIONS, generator=generator).log_softmax(-1)
    behaviour = torch.randn(ACTIONS, generator=generator).log_softmax(-1)
    return theta, ref, behaviour


def _expected_kl_gradient(
    config: GRPOConfig, theta: torch.Tensor, ref: torch.Tensor, behaviour: torch.Tensor
) -> torch.Tensor:
    """E_{a ~ behaviour}[grad of the loss's KL term of a one-row batch that sampled a], exactly."""
    total = torch.zeros_like(theta)
    mask = torch.ones(1, 1, dtype=torch.bool)
    for action in range(ACTIONS):
        logp_full = theta.log_softmax(-1)
        new = logp_full[action].reshape(1, 1)
        kl = exact_kl(logp_full.unsqueeze(0), ref.unsqueeze(0)).reshape(1, 1)
        out = policy_loss(
            new,
            behaviour[action].reshape(1, 1),
            torch.zeros(1),
            mask,
            config,
            ref_logp=ref[action].reshape(1, 1),
            kl=kl,
            kl_coef=1.0,
        )
        (grad,) = torch.autograd.grad(out.terms["kl"], theta)
        total += behaviour[action].exp() * grad
    return total


def _kl_gradient(theta: torch.Tensor, p_first: bool, ref: torch.Tensor) -> torch.Tensor:
    """grad KL(policy || ref) (p_first) or grad KL(ref || policy) with respect to theta."""
    logp = theta.log_softmax(-1)
    kl = (logp.exp() * (logp - ref)).sum() if p_first else (ref.exp() * (ref - logp)).sum()
    (grad,) = torch.autograd.grad(kl, theta)
    return grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_default_kl_term_is_the_gradient_of_kl_policy_to_reference_on_and_off_policy(seed: int) -> None:
    theta, ref, behaviour = _distributions(seed)
    config = GRPOConfig(kl_coef=0.1)
    assert config.kl_estimator == "exact"
    want = _kl_gradient(theta, True, ref)
    on_policy = theta.detach().log_softmax(-1)
    assert torch.allclose(_expected_kl_gradient(config, theta, ref, on_policy), want, atol=1e-6)
    assert torch.allclose(_expected_kl_gradient(config, theta, ref, behaviour), want, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_estimators_have_the_documented_gradient_also_off_policy(seed: int) -> None:
    """k2 follows grad KL(p || ref), k3 grad KL(ref || p); both stay right when the sample came from another policy
    (num_iterations > 1, the pipelined step): the learner importance-weights them."""
    theta, ref, behaviour = _distributions(seed)
    on_policy = theta.detach().log_softmax(-1)
    reverse, forward = _kl_gradient(theta, True, ref), _kl_gradient(theta, False, ref)
    assert not torch.allclose(reverse, forward, atol=1e-3)  # the two directions differ here
    for samples in (on_policy, behaviour):
        k2 = _expected_kl_gradient(GRPOConfig(kl_coef=0.1, kl_estimator="k2"), theta, ref, samples)
        k3 = _expected_kl_gradient(GRPOConfig(kl_coef=0.1, kl_estimator="k3"), theta, ref, samples)
        assert torch.allclose(k2, reverse, atol=1e-5)
        assert torch.allclose(k3, forward, atol=1e-5)


def test_k1_is_refused_as_a_loss_and_only_measures() -> None:
    with pytest.raises(ValueError, match="k1.*zero gradient"):
        GRPOConfig(kl_estimator="k1", kl_coef=0.1)
    with pytest.raises(ValueError, match="k1"):
        GRPOConfig(kl_estimator="k1", kl_coef=0.1, kl_schedule="adaptive")
    config = GRPOConfig(kl_estimator="k1")  # kl_coef 0: the estimate is logged, nothing is penalised
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    out = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1, dtype=torch.bool), config, ref_logp=ref, kl_coef=0.0)
    assert out.metrics["kl/value"] == pytest.approx(1.0)


def test_the_move_group_forward_gives_the_exact_kl_over_legal_moves() -> None:
    """The learner's forward, given the reference, returns per row the exact KL the rollout measured at its position."""
    torch.manual_seed(0)
    reference = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    model = copy.deepcopy(reference)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    boards = StartPositions.from_source("random:6", seed=1).draw(4, seed=0, step=0)
    groups = sample_groups(
        model, boards, 3, temperature=1.2, generator=torch.Generator().manual_seed(0), reference=reference
    )
    batch = to_rollout_batch(groups, torch.rand(4, 3))
    outputs = make_forward(model, groups, temperature=1.2, reference=reference)(batch)
    assert isinstance(outputs, PolicyOutputs) and outputs.kl is not None and outputs.kl.requires_grad
    assert outputs.kl.shape == (12, 1)
    assert torch.allclose(outputs.kl.squeeze(1), groups.exact_kl.repeat_interleave(3), atol=1e-6)
    assert bool((groups.exact_kl > 1e-4).all())
    assert make_forward(model, groups, temperature=1.2)(batch).kl is None  # no reference, no KL


def test_the_lm_forward_gives_the_exact_per_token_kl_over_the_vocabulary() -> None:
    torch.manual_seed(0)
    lm = build_lm(LMModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=128), seed=0)
    prepare_for_rl(lm.model)
    reference = copy.deepcopy(lm.model).requires_grad_(False)
    with torch.no_grad():
        for parameter in lm.model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    prompts = ["P: 8/8/8/4k3/8/8/3QK3/8 w - - 0 1 ", "A: 8/8/8/4k3/8/8/3QK3/8 w - - 0 1+d2d4+"]
    groups = lm_rollout.sample_completion_groups(
        lm,
        prompts,
        2,
        temperature=0.9,
        max_new_tokens=8,
        generator=torch.Generator().manual_seed(0),
        reference=reference,
    )
    batch = lm_rollout.to_rollout_batch(groups, torch.zeros(4))
    outputs = lm_rollout.make_forward(lm.model, temperature=0.9, chunk_rows=3, reference=reference)(batch)
    assert outputs.kl is not None and outputs.kl.requires_grad
    g = groups.generation
    ids = torch.cat([g.prompt_ids, g.completion_ids], 1)
    attention = torch.cat([g.prompt_mask, g.completion_mask], 1).long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    start = g.prompt_ids.shape[1] - 1
    with torch.no_grad():
        p = (
            lm.model(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, start:-1].float() / 0.9
        ).log_softmax(-1)
        q = (
            reference(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, start:-1].float() / 0.9
        ).log_softmax(-1)
    want = torch.where(g.completion_mask, (p.exp() * (p - q)).sum(-1), torch.zeros(()))
    assert torch.allclose(outputs.kl.detach(), want, atol=1e-5)
    assert bool((want[g.completion_mask] > 0).all())
    logp, _ = completion_log_probs(
        lm.model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, temperature=0.9
    )
    assert torch.allclose(outputs.logp.detach(), logp.detach(), atol=1e-6)
