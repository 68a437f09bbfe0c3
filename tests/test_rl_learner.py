"""`optimize` on a tiny real torch policy: invariants, minibatching, DAPO skipping and actual learning."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from chessgrpo.rl import (
    GRPOConfig,
    InvariantViolation,
    KLController,
    PolicyOutputs,
    RolloutBatch,
    categorical_entropy,
    exact_kl,
    optimize,
)
from chessgrpo.rl.learner import compute_advantages
from chessgrpo.rl.loss import policy_loss
from chessgrpo.train.learner import Learner

NUM_ACTIONS = 5
FEATURES = 4
TARGET_ACTION = 2


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def log_probs(model: nn.Module, inputs: torch.Tensor, legal: torch.Tensor, temperature: float) -> torch.Tensor:
    """[N, L, A] masked, tempered log-probs: the one function sampling and learning share."""
    logits = model(inputs) / temperature
    return logits.masked_fill(~legal, float("-inf")).log_softmax(dim=-1)


def make_positions(num_positions: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features [P, L, F] and legal masks [P, L, A]: action 4 is illegal in every other position."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(num_positions, length, FEATURES, generator=generator)
    legal = torch.ones(num_positions, length, NUM_ACTIONS, dtype=torch.bool)
    legal[::2, :, 4] = False
    return features, legal


def rollout(
    model: nn.Module,
    positions: tuple[torch.Tensor, torch.Tensor],
    group_size: int,
    temperature: float,
    generator: torch.Generator,
    reward: Callable[[torch.Tensor], torch.Tensor] = lambda actions: (actions[:, 0] == TARGET_ACTION).float(),
) -> RolloutBatch:
    features, legal = positions
    inputs = features.repeat_interleave(group_size, dim=0)
    legal_rows = legal.repeat_interleave(group_size, dim=0)
    with torch.no_grad():
        logp_full = log_probs(model, inputs, legal_rows, temperature)
        n, length, _ = logp_full.shape
        actions = torch.multinomial(logp_full.exp().reshape(n * length, -1), 1, generator=generator).reshape(n, length)
        behaviour = logp_full.gather(2, actions.unsqueeze(2)).squeeze(2)
    # Non-contiguous group ids: 3, 10, 17, ...
    group_ids = torch.arange(features.shape[0]).repeat_interleave(group_size) * 7 + 3
    return RolloutBatch(
        inputs=inputs,
        actions=actions,
        behaviour_logp=behaviour,
        mask=torch.ones(n, length, dtype=torch.bool),
        rewards=reward(actions),
        group_ids=group_ids,
        extras={"legal": legal_rows},
    )


def make_forward(
    model: nn.Module, temperature: float, reference: nn.Module | None = None
) -> Callable[[RolloutBatch], PolicyOutputs]:
    def forward(batch: RolloutBatch) -> PolicyOutputs:
        legal = batch.extras["legal"]
        logp_full = log_probs(model, batch.inputs, legal, temperature)
        logp = logp_full.gather(2, batch.actions.unsqueeze(2)).squeeze(2)
        ref_logp = kl = None
        if reference is not None:
            with torch.no_grad():
                ref_full = log_probs(reference, batch.inputs, legal, temperature)
                ref_logp = ref_full.gather(2, batch.actions.unsqueeze(2)).squeeze(2)
            kl = exact_kl(logp_full, ref_full)
        return PolicyOutputs(logp=logp, entropy=categorical_entropy(logp_full), ref_logp=ref_logp, kl=kl)

    return forward


def spine_update(model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float = 1.0):
    """The one optimizer update (the training spine's `Learner.update`) over all of `model`'s parameters."""
    return Learner(optimizer, list(model.parameters()), max_grad_norm).update


def random_model(seed: int, scale: float = 1.0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Linear(FEATURES, NUM_ACTIONS)
    with torch.no_grad():
        model.weight.normal_(0.0, scale)
        model.bias.normal_(0.0, scale)
    return model


def run_optimize(
    model: nn.Module,
    batch: RolloutBatch,
    config: GRPOConfig,
    *,
    temperature: float = 1.0,
    reference: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    controller: KLController | None = None,
) -> dict[str, float]:
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=0.01)
    return optimize(
        batch,
        make_forward(model, temperature, reference),
        spine_update(model, optimizer),
        config,
        controller or KLController.from_config(config),
        parameters=model.parameters(),
        generator=torch.Generator().manual_seed(0),
    )


def test_consistent_forward_passes_the_first_minibatch_invariant() -> None:
    model = random_model(0)
    batch = rollout(model, make_positions(8, 1, seed=1), 8, temperature=1.3, generator=torch.Generator().manual_seed(2))
    metrics = run_optimize(model, batch, GRPOConfig(), temperature=1.3)
    assert metrics["ratio/first_max_abs_dev"] < 1e-6
    assert metrics["ratio/clip_frac"] == 0.0
    assert metrics["loss/skipped"] == 0.0 and metrics["learn/minibatches"] == 1.0
    assert metrics["grad_norm"] > 0.0
    assert batch.advantages is not None and batch.advantages.shape == (64,)
    for key in (
        "adv/mean",
        "adv/std",
        "reward/mean",
        "reward/std",
        "reward/min",
        "reward/max",
        "rollout/frac_reward_zero_std",
        "entropy/mean",
        "kl/coef",
        "loss/share_policy",
    ):
        assert key in metrics, key
    assert metrics["adv/mean"] == pytest.approx(0.0, abs=1e-6)


def test_temperature_mismatch_raises_before_any_step() -> None:
    model = random_model(0)
    before = copy.deepcopy(model.state_dict())
    batch = rollout(model, make_positions(8, 1, seed=1), 8, temperature=1.3, generator=torch.Generator().manual_seed(2))
    with pytest.raises(InvariantViolation, match="temperature"):
        run_optimize(model, batch, GRPOConfig(), temperature=1.0)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_invariant_check_can_be_disabled() -> None:
    model = random_model(0)
    batch = rollout(model, make_positions(8, 1, seed=1), 8, temperature=1.3, generator=torch.Generator().manual_seed(2))
    metrics = run_optimize(model, batch, GRPOConfig(check_invariants=False), temperature=1.0)
    assert metrics["ratio/first_max_abs_dev"] > 1e-2


def test_grpo_learns_to_pick_the_rewarded_action() -> None:
    model = nn.Linear(FEATURES, NUM_ACTIONS)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    positions = make_positions(16, 1, seed=3)
    features, legal = positions

    def target_probability() -> float:
        with torch.no_grad():
            return log_probs(model, features, legal, 1.0)[..., TARGET_ACTION].exp().mean().item()

    initial = target_probability()
    assert 0.2 <= initial <= 0.25  # uniform over 5 (or 4) legal actions
    config = GRPOConfig()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    controller = KLController.from_config(config)
    sampler = torch.Generator().manual_seed(4)
    shuffler = torch.Generator().manual_seed(5)
    for _ in range(300):
        batch = rollout(model, positions, 8, temperature=1.0, generator=sampler)
        optimize(
            batch,
            make_forward(model, 1.0),
            spine_update(model, optimizer),
            config,
            controller,
            parameters=model.parameters(),
            generator=shuffler,
        )
    assert target_probability() > 0.9
    assert controller.steps == 300


def test_ppo_epochs_with_minibatches() -> None:
    model = random_model(1, scale=0.3)
    batch = rollout(model, make_positions(4, 1, seed=6), 8, temperature=1.0, generator=torch.Generator().manual_seed(7))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    config = GRPOConfig(num_iterations=2, minibatch_size=12)  # 32 rows -> 12, 12, 8 per epoch
    metrics = run_optimize(model, batch, config, optimizer=optimizer)
    assert metrics["learn/minibatches"] == 6.0
    assert metrics["learn/rows"] == 32.0
    assert optimizer.state[model.weight]["step"].item() == 6
    # Later minibatches run on updated weights: their ratio moved, the first one's did not.
    assert metrics["ratio/first_max_abs_dev"] < 1e-6
    assert metrics["ratio/max_abs_dev"] > 1e-4


def test_trajectories_with_step_rewards_and_kl() -> None:
    model = random_model(2, scale=0.3)
    reference = copy.deepcopy(model)
    sampler = torch.Generator().manual_seed(8)
    # L = 3 steps per row, reward 1 at each step that picked the target action; last step masked in half the rows.
    batch = rollout(
        model,
        make_positions(4, 3, seed=9),
        4,
        temperature=1.0,
        generator=sampler,
        reward=lambda actions: (actions == TARGET_ACTION).float(),
    )
    batch.mask[::2, 2] = False
    config = GRPOConfig(kl_coef=0.05, kl_schedule="adaptive", num_iterations=2, kl_horizon=100)
    controller = KLController.from_config(config)
    metrics = run_optimize(model, batch, config, reference=reference, controller=controller)
    assert batch.advantages is not None and batch.advantages.shape == (16, 3)
    assert (batch.advantages[~batch.mask] == 0).all()
    assert metrics["kl/min"] >= 0.0
    assert metrics["kl/value"] >= 0.0
    assert metrics["kl/coef"] == 0.05
    assert controller.steps == 1 and controller.coef < 0.05  # KL below target 0.01 -> coefficient shrinks


def test_kl_coef_without_reference_raises() -> None:
    model = random_model(3)
    batch = rollout(model, make_positions(2, 1, seed=1), 4, temperature=1.0, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="PolicyOutputs.kl"):
        run_optimize(model, batch, GRPOConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="ref_logp"):
        run_optimize(model, batch, GRPOConfig(kl_coef=0.1, kl_estimator="k3"))


def test_drop_zero_std_groups_skips_an_all_equal_batch() -> None:
    model = random_model(4)
    before = copy.deepcopy(model.state_dict())
    batch = rollout(
        model,
        make_positions(4, 1, seed=1),
        4,
        temperature=1.0,
        generator=torch.Generator().manual_seed(1),
        reward=lambda actions: torch.ones(actions.shape[0]),
    )
    controller = KLController.from_config(GRPOConfig())
    metrics = run_optimize(model, batch, GRPOConfig(drop_zero_std_groups=True), controller=controller)
    assert metrics["loss/skipped"] == 1.0
    assert metrics["rollout/frac_reward_zero_std"] == 1.0
    assert metrics["learn/minibatches"] == 0.0
    assert controller.steps == 0
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_drop_zero_std_groups_keeps_only_informative_groups() -> None:
    model = random_model(5)
    batch = rollout(model, make_positions(4, 1, seed=1), 4, temperature=1.0, generator=torch.Generator().manual_seed(1))
    # Rewards by hand: groups 3 and 10 (rows 0-7) all-equal, groups 17 and 24 (rows 8-15) mixed.
    batch.rewards = torch.tensor([1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    metrics = run_optimize(model, batch, GRPOConfig(drop_zero_std_groups=True))
    assert metrics["rollout/frac_reward_zero_std"] == 0.5
    assert metrics["learn/rows"] == 8.0
    assert metrics["loss/skipped"] == 0.0
    batch = rollout(model, make_positions(4, 1, seed=1), 4, 1.0, torch.Generator().manual_seed(1))
    metrics = run_optimize(model, batch, GRPOConfig(drop_zero_std_groups=False))
    assert metrics["learn/rows"] == 16.0


def test_drop_zero_std_groups_keeps_equal_nonzero_critic_advantages() -> None:
    """Under critic supervision a group of equal regrets (every move 0.2 worse than the exact value's) still teaches:
    dynamic sampling drops only the group of all-zero regrets (issue 64, item 2)."""
    model = random_model(5)
    batch = rollout(model, make_positions(2, 2, seed=1), 4, temperature=1.0, generator=torch.Generator().manual_seed(1))
    # Groups 3 (rows 0-3): every regret -0.2, all equal but not zero; 10 (rows 4-7): every move optimal.
    batch.rewards = torch.tensor([[-0.2, -0.2]] * 4 + [[0.0, 0.0]] * 4)
    batch.supervision = "critic"
    metrics = run_optimize(model, batch, GRPOConfig(drop_zero_std_groups=True))
    assert metrics["rollout/frac_reward_zero_std"] == 1.0  # both groups' rewards are all equal ...
    assert metrics["loss/skipped"] == 0.0 and metrics["learn/rows"] == 4.0  # ... yet the first one is learned from


def test_bf16_flag_selects_the_looser_tolerance() -> None:
    model = random_model(6)

    def shifted_batch() -> RolloutBatch:
        batch = rollout(model, make_positions(4, 1, seed=2), 4, 1.0, torch.Generator().manual_seed(3))
        batch.behaviour_logp = batch.behaviour_logp - 1e-3  # ratio off by ~1e-3: bf16 noise, an fp32 bug
        return batch

    with pytest.raises(InvariantViolation):
        run_optimize(model, shifted_batch(), GRPOConfig())
    batch = shifted_batch()
    metrics = optimize(
        batch,
        make_forward(model, 1.0),
        spine_update(model, torch.optim.SGD(model.parameters(), lr=0.1)),
        GRPOConfig(),
        KLController(),
        parameters=model.parameters(),
        generator=None,
        bf16=True,
    )
    assert metrics["ratio/first_max_abs_dev"] == pytest.approx(1e-3, rel=1e-2)


def test_sequence_level_ratio_runs_through_optimize() -> None:
    model = random_model(7, scale=0.3)
    batch = rollout(model, make_positions(4, 3, seed=4), 4, 1.0, torch.Generator().manual_seed(5))
    config = GRPOConfig(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, num_iterations=2)
    metrics = run_optimize(model, batch, config)
    assert metrics["ratio/first_max_abs_dev"] < 1e-6
    assert metrics["learn/minibatches"] == 2.0


def test_term_gradient_norms_are_each_terms_own_gradient() -> None:
    """grad_norm/<term> on measured steps (0, k, 2k, ...) is the norm of that term alone, computed by hand
    here on the same weights; unmeasured steps log none, and a missing term is 0."""
    model = random_model(3, scale=0.3)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference.bias.add_(0.5)  # a reference that differs, so the KL term has a gradient
    positions = make_positions(4, 2, seed=5)
    config = GRPOConfig(kl_coef=0.1, entropy_coef=0.01, term_gradient_every=3)
    batch = rollout(model, positions, 4, temperature=1.0, generator=torch.Generator().manual_seed(1))
    forward = make_forward(model, 1.0, reference)

    # By hand, before the step: each term of the loss, its gradient, its norm.
    batch.advantages = compute_advantages(batch, config)
    outputs = forward(batch)
    out = policy_loss(
        outputs.logp,
        batch.behaviour_logp,
        batch.advantages,
        batch.mask,
        config,
        ref_logp=outputs.ref_logp,
        kl=outputs.kl,
        entropy=outputs.entropy,
        kl_coef=0.1,
    )
    expected = {}
    for name, term in out.terms.items():
        grads = torch.autograd.grad(term, list(model.parameters()), retain_graph=True)
        expected[name] = float(torch.sqrt(sum((g**2).sum() for g in grads)))

    def step(number: int, settings: GRPOConfig = config) -> dict[str, float]:
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        return optimize(
            batch,
            forward,
            spine_update(model, optimizer),
            settings,
            KLController.from_config(settings),
            parameters=model.parameters(),
            generator=torch.Generator().manual_seed(0),
            step=number,
        )

    metrics = step(3)
    for name in ("policy", "kl", "entropy"):
        assert metrics[f"grad_norm/{name}"] == pytest.approx(expected[name], rel=1e-5) and expected[name] > 0
    assert metrics["grad_norm/aux"] == 0.0
    stale = dataclasses.replace(config, check_invariants=False)  # the weights moved since this batch was sampled
    assert not any(key.startswith("grad_norm/") for key in step(4, stale))


def _first_update_gradient(
    model: nn.Module, batch: RolloutBatch, forward: Callable, config: GRPOConfig
) -> torch.Tensor:
    """The gradient `optimize` hands to its first optimizer step (micro-batches accumulated), flattened."""
    model.zero_grad()
    steps: list[torch.Tensor] = []

    def update(loss: torch.Tensor, step: bool = True) -> float:
        loss.backward()
        if step:
            steps.append(torch.cat([p.grad.flatten().clone() for p in model.parameters()]))
            model.zero_grad()
        return 0.0

    optimize(
        batch,
        forward,
        update,
        config,
        KLController.from_config(config),
        parameters=[],
        generator=torch.Generator().manual_seed(0),
    )
    return steps[0]


def test_a_per_row_aux_loss_is_the_minibatch_mean_however_the_rows_are_split() -> None:
    # aux_row_loss (e.g. a value loss per row's position) must add up to its mean over the minibatch's rows,
    # with or without micro-batches (and, the same arithmetic, over data-parallel ranks).
    model = random_model(2, scale=0.3)
    batch = rollout(model, make_positions(4, 1, seed=8), 4, temperature=1.0, generator=torch.Generator().manual_seed(9))
    batch.extras["row"] = torch.arange(batch.num_rows)
    base = make_forward(model, 1.0)
    target = torch.linspace(-1.0, 1.0, batch.num_rows)

    def per_row(inputs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        # A loss of the model's output per row, different for every row (so the weighting matters).
        return (model(inputs[:, 0]).sum(dim=1) - target[rows]) ** 2

    def forward(minibatch: RolloutBatch) -> PolicyOutputs:
        return dataclasses.replace(base(minibatch), aux_row_loss=per_row(minibatch.inputs, minibatch.extras["row"]))

    def config(micro: int) -> GRPOConfig:
        return GRPOConfig(
            num_iterations=1, minibatch_size=batch.num_rows, micro_batch_size=micro, check_invariants=False
        )

    whole = _first_update_gradient(model, batch, forward, config(0))
    assert torch.allclose(whole, _first_update_gradient(model, batch, forward, config(3)), atol=1e-6)
    # ... and the term in it is the rows' mean: with it minus without it is the mean's own gradient.
    without = _first_update_gradient(model, batch, base, config(0))
    model.zero_grad()
    per_row(batch.inputs, batch.extras["row"]).mean().backward()
    mean_gradient = torch.cat([p.grad.flatten().clone() for p in model.parameters()])
    assert torch.allclose(whole - without, mean_gradient, atol=1e-6)
