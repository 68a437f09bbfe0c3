"""Move groups: G moves sampled from the same position, rewarded by the engine.

A step of the one-move task:

1. `StartPositions.draw` picks B start positions, seeded by (seed, step, rank): every step sees
   fresh positions and data-parallel ranks never share a draw (the predecessor replayed the same
   512 positions every epoch).
2. `sample_groups` runs the policy once per position and samples G moves from
   `models.policy.log_probs` at the rollout temperature (no top-k/top-p). The behaviour
   log-probs, the exact entropy and, when a reference is given, the reference log-probs and the
   exact KL(policy || reference) over all legal moves are recorded at the same time.
3. `score_groups` values each sampled move as the expected score of the position after it, for
   the mover: ``1 - win_probability(after)``, the engine evaluating from the opponent's side.
   Mate is exactly 1 and stalemate/insufficient material/fifty moves exactly 0.5 (the pool scores
   terminal positions without searching). Duplicate moves of a group are evaluated once. With
   `best_move_values` the engine's best move is valued the same way (after the move), giving the
   regret ``v(move) - max(v(best), v(move)) <= 0`` = -ESL of the move, the exact quantity the
   offline evaluation measures.
4. `to_rollout_batch` makes a `rl.RolloutBatch` with L = 1 (one action per row) and group id =
   position; `make_forward` recomputes log-probs for any subset of rows, running the model once
   per distinct position of the minibatch.

Reward ``win_prob`` or ``regret``: with a per-group baseline (grpo, dr_grpo, rloo) the two give
identical advantages, because they differ by a constant per position (the best move's value);
they differ only in what is logged, and under ``batch_std``, whose scale spans positions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import chess
import torch
import torch.nn.functional as F

from chessgrpo.board import ACTIONS
from chessgrpo.data.start_positions import StartPositions  # noqa: F401  (re-exported: tasks draw from it)
from chessgrpo.models.policy import ActionPolicy
from chessgrpo.models.sampling import Generators, log_probs, multinomial_by_group
from chessgrpo.rl import PolicyOutputs, RolloutBatch, categorical_entropy, eval_mode_forward, exact_kl
from chessgrpo.tasks.policy_forward import distinct_position_log_probs, exact_reference_kl
from chessgrpo.tasks.reward_registry import (
    USER_SEPARATOR,
    RegisteredReward,
    RewardRegistry,
    WeightedReward,
    one_reward_weights,
)
from chessgrpo.tasks.rewards import probe_tablebase, shaped_value, tablebase_evaluation

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool, Tablebase


@dataclasses.dataclass
class MoveGroupConfig:
    """What a group is and how it is rewarded (the `task:` section of a GRPO config)."""

    group_size: int = 8
    """G: moves sampled per position (with replacement; duplicates are evaluated once)."""
    positions_per_step: int = 32
    """B: start positions per training step; a step learns from B * G samples."""
    temperature: float = 1.0
    """Rollout temperature. The learner uses the same one (docs/architecture.md, invariant 1)."""
    reward: str = "win_prob"
    """The one reward of the run (weight 1), a name of `MOVE_GROUP_REWARDS`: win_prob: the mover's expected score
    after the move; regret: that minus the best move's (needs best_move_values). Same advantages under a
    per-group baseline (module docstring). shaped: `tasks.rewards.shaped_value`, ordered among winning moves
    (mate distance, tablebase DTZ, material) and with every draw at 0.5: signal in decided positions too."""
    rewards: dict[str, float] | None = None
    """Several rewards with weights, {name: weight} (names of `MOVE_GROUP_REWARDS` or a user's ``module:function``):
    the run trains on their weighted sum and logs each as reward/<name>. null = `reward` alone (or `reward_fn`).
    With it set, `reward` keeps its default or names one of these."""
    reward_nodes: int = 1000
    """Stockfish node limit for valuing moves (and the best move)."""
    best_move_values: bool = True
    """Also value the engine's best move, to log reward/esl (one more search per position)."""
    reward_fn: str | None = None
    """A reward you write, ``module:function`` (importable; `tasks.user_rewards.MoveReward`: (board, move,
    win_probability) -> float): it replaces `reward` for training (the same as ``rewards: {"module:function": 1}``).
    Checked when the config is built."""

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a group of one has no baseline), got {self.group_size}")
        if self.positions_per_step < 1:
            raise ValueError(f"positions_per_step must be >= 1, got {self.positions_per_step}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if USER_SEPARATOR not in self.reward and self.reward not in MOVE_GROUP_REWARDS:
            raise ValueError(f"reward must be one of {MOVE_GROUP_REWARDS.known()}, got {self.reward!r}")
        if self.reward_nodes < 1:
            raise ValueError(f"reward_nodes must be >= 1, got {self.reward_nodes}")
        # Every reward resolves now (a user's function imports), so a typo fails before any engine starts.
        for item in self.weighted_rewards():
            if "best_move_values" in item.reward.needs_of() and not self.best_move_values:
                raise ValueError(f"reward {item.name!r} needs best_move_values: true")

    @property
    def weights(self) -> dict[str, float]:
        """The run's rewards, {name: weight}: `rewards`, else {`reward_fn` or `reward`: 1}."""
        return one_reward_weights(self.reward, self.rewards, "win_prob", self.reward_fn)

    def weighted_rewards(self) -> list[WeightedReward[MoveGroupReward]]:
        """The run's rewards and weights (a `ValueError` naming the key for an unknown name or a bad weight)."""
        if self.rewards is None and self.reward_fn is not None:  # always the user's function, colon or not
            return [WeightedReward(user_move_group_reward(self.reward_fn, "reward_fn"), 1.0)]
        return MOVE_GROUP_REWARDS.weighted(self.weights, "rewards" if self.rewards is not None else "reward")


# ------------------------------------------------------------------------------------------------
# Sampling


@dataclasses.dataclass
class MoveGroups:
    """B positions with G sampled moves each, and what the policy thought while sampling them."""

    boards: list[chess.Board]
    tokens: torch.Tensor
    """[B, 77] token ids."""
    legal: torch.Tensor
    """[B, 1968] legal-move masks."""
    actions: torch.Tensor
    """[B, G] sampled action ids."""
    behaviour_logp: torch.Tensor
    """[B, G] log-probs of the sampled actions at sampling time (rollout temperature)."""
    entropy: torch.Tensor
    """[B] exact entropy of the policy at the rollout temperature."""
    ln_legal: torch.Tensor
    """[B] ln(number of legal moves): the entropy of the uniform policy, for comparison."""
    ref_logp: torch.Tensor | None = None
    """[B, G] reference log-probs of the sampled actions (rollout temperature)."""
    exact_kl: torch.Tensor | None = None
    """[B] exact KL(policy || reference) over all legal moves."""
    fens: list[str] | None = None
    """The boards' FENs, computed once by `sample_groups` for everything downstream (None: compute them)."""

    @property
    def group_size(self) -> int:
        return int(self.actions.shape[1])

    def moves(self) -> list[list[chess.Move]]:
        return [[chess.Move.from_uci(ACTIONS[a]) for a in row] for row in self.actions.tolist()]


@torch.no_grad()
def sample_groups(
    model: ActionPolicy,
    boards: Sequence[chess.Board],
    group_size: int,
    *,
    temperature: float,
    generator: Generators = None,
    reference: ActionPolicy | None = None,
    bf16: bool = False,
) -> MoveGroups:
    """Sample `group_size` moves per board from `model` (eval mode: no dropout) with `log_probs`."""
    if model.training or (reference is not None and reference.training):
        raise RuntimeError("sample_groups needs models in eval mode (no dropout in RL forwards)")
    fens = [board.fen() for board in boards]  # once: the encoding, the move facts and the engine all read them
    tokens, legal = model.inputs(boards, fens=fens)
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(tokens)
    logp_full = log_probs(logits, legal, temperature)
    # Row b is group b: with one generator per group, each group's moves depend only on its seed.
    actions = multinomial_by_group(logp_full.exp(), group_size, range(len(boards)), generator, replacement=True)
    groups = MoveGroups(
        boards=list(boards),
        tokens=tokens,
        legal=legal,
        actions=actions,
        behaviour_logp=logp_full.gather(1, actions),
        entropy=categorical_entropy(logp_full),
        ln_legal=legal.sum(dim=-1).float().log(),
        fens=fens,
    )
    if reference is not None:
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
            ref_logits = reference(tokens)
        ref_full = log_probs(ref_logits, legal, temperature)
        groups.ref_logp = ref_full.gather(1, actions)
        groups.exact_kl = exact_kl(logp_full, ref_full)
    return groups


# ------------------------------------------------------------------------------------------------
# Rewards


@dataclasses.dataclass
class GroupRewards:
    """Values of the sampled moves for the mover, and what it took to get them."""

    values: torch.Tensor
    """[B, G] expected score for the mover after each sampled move (1 = mate, 0.5 = draw)."""
    best_values: torch.Tensor | None
    """[B] the same for the engine's best move (None without best_move_values)."""
    shaped: torch.Tensor
    """[B, G] `tasks.rewards.shaped_value` of each sampled move."""
    evaluations: int
    """Distinct positions sent to the pool this step (cache hits included)."""
    groups: MoveGroups | None = None
    """The sampled groups these values score (the raw rollout: boards and moves), for rewards that read them."""

    @property
    def regret(self) -> torch.Tensor:
        """[B, G] v(move) - max(v(best), v(move)) <= 0; -regret is the move's ESL."""
        if self.best_values is None:
            raise ValueError("regret needs best_move_values")
        best = torch.maximum(self.best_values.unsqueeze(1), self.values)
        return self.values - best

    def rewards(self, name: str) -> torch.Tensor:
        """[B, G] the reward `name` of `MOVE_GROUP_REWARDS` (or a user's ``module:function``)."""
        return MOVE_GROUP_REWARDS.record(name, "reward").function(self)


# The move-group rewards: one registered record each (`tasks.reward_registry`). A reward maps the scored
# groups (`GroupRewards`: the engine's values of the sampled moves, and with them the groups themselves) to
# [B, G] rewards from the mover's point of view; the learner's group baseline does the rest. A run names one
# (`task.reward`) or several with weights (`task.rewards`). Adding a reward is one function here and one
# `register` line (docs/architecture.md, "Rewards").
MoveGroupReward = Callable[[GroupRewards], torch.Tensor]


def win_prob_reward(scored: GroupRewards) -> torch.Tensor:
    """The mover's expected score after the move (the engine's win probability; 1 = mate, 0.5 = draw)."""
    return scored.values


def regret_reward(scored: GroupRewards) -> torch.Tensor:
    """The expected score minus the best move's (<= 0; needs best_move_values): the same advantages
    as win_prob under a per-group baseline, on a scale comparable across positions."""
    return scored.regret


def shaped_reward(scored: GroupRewards) -> torch.Tensor:
    """`tasks.rewards.shaped_value`: ordered among winning moves (mate distance, DTZ, material), every draw 0.5."""
    return scored.shaped


def user_move_group_reward(spec: str, key: str = "rewards") -> RegisteredReward[MoveGroupReward]:
    """The user's one-move function ``module:function`` (`tasks.user_rewards.MoveReward`: (board, move,
    win_probability) -> float) as a move-group reward named `spec`: it is called on every sampled move with the
    engine's value of it. A `ValueError` naming `key` and `spec` when it does not import or cannot take those."""
    from chessgrpo.tasks.user_rewards import load_reward_function, user_rewards

    function = load_reward_function(spec, key)

    def reward(scored: GroupRewards) -> torch.Tensor:
        if scored.groups is None:
            raise ValueError(f"{key} {spec!r} reads the sampled moves: score the groups with `score_groups`")
        return user_rewards(function, scored.groups.boards, scored.groups.moves(), scored.values, spec, key)

    return RegisteredReward(spec, reward, frozenset({"pool"}), user=True)


MOVE_GROUP_REWARDS: RewardRegistry[MoveGroupReward] = RewardRegistry(
    "move-group",
    "(scored: GroupRewards) -> [B, G] tensor",
    needs={
        "pool": "the Stockfish pool values every sampled move (every move-group run has it)",
        "best_move_values": "the engine's best move is valued too (task.best_move_values must be true)",
        "tablebase": "the Syzygy tables value the positions they cover exactly (opened when engine.syzygy_path is set)",
    },
    user=user_move_group_reward,
)
"""`task.reward` / `task.rewards` -> a move-group reward."""
MOVE_GROUP_REWARDS.register("win_prob", win_prob_reward, needs={"pool"})
MOVE_GROUP_REWARDS.register("regret", regret_reward, needs={"pool", "best_move_values"})
MOVE_GROUP_REWARDS.register("shaped", shaped_reward, needs={"pool", "tablebase"})


def move_value_positions(
    boards: Sequence[chess.Board], moves: Sequence[Sequence[chess.Move]]
) -> tuple[list[chess.Board], list[list[int]], list[str]]:
    """The distinct positions after each (board, move), per board each move's index into them, and their FENs.

    A group samples with replacement, so a row repeats moves: each (board, move) is played and
    written as FEN once (the FEN is what the engine and its cache read), and positions reached from
    two boards are merged by FEN. The order is that of first appearance, row by row.
    """
    distinct: dict[str, int] = {}
    after_boards: list[chess.Board] = []
    after_fens: list[str] = []
    indices: list[list[int]] = []
    for board, row in zip(boards, moves):
        played: dict[chess.Move, int] = {}
        row_indices = []
        for move in row:
            if move not in played:
                after = board.copy(stack=False)
                after.push(move)
                key = after.fen()
                if key not in distinct:
                    distinct[key] = len(after_boards)
                    after_boards.append(after)
                    after_fens.append(key)
                played[move] = distinct[key]
            row_indices.append(played[move])
        indices.append(row_indices)
    return after_boards, indices, after_fens


def score_groups(
    pool: EnginePool,
    groups: MoveGroups,
    *,
    nodes: int,
    best_move_values: bool = True,
    tablebase: Tablebase | None = None,
) -> GroupRewards:
    """Value every sampled move (and the best move) for the mover with the engine pool.

    `values` are win probabilities (what ESL measures); `shaped` are `tasks.rewards.shaped_value`,
    with `tablebase` (optional) giving exact values at few pieces.

    An engine failure is retried by the pool on a fresh process and raises if it persists:
    never a silent 0 reward (docs/architecture.md, invariant 5).
    """
    moves = groups.moves()
    best_moves: list[chess.Move] = []
    if best_move_values:
        for board, evaluation in zip(groups.boards, pool.evaluate(groups.boards, nodes=nodes, fens=groups.fens)):
            if evaluation.best_move is None:
                raise RuntimeError(f"the engine returned no best move for {board.fen()!r}")
            best_moves.append(chess.Move.from_uci(evaluation.best_move))
        rows = [[*row, best] for row, best in zip(moves, best_moves)]
    else:
        rows = moves
    after_boards, indices, after_fens = move_value_positions(groups.boards, rows)
    # Positions the tables cover need no search: their values are exact, probed once for both rewards.
    probes = [probe_tablebase(board, tablebase) for board in after_boards]
    unprobed = [i for i, probe in enumerate(probes) if probe is None]
    searched = iter(
        pool.evaluate([after_boards[i] for i in unprobed], nodes=nodes, fens=[after_fens[i] for i in unprobed])
    )
    evaluations = [
        tablebase_evaluation(b, p) if p is not None else next(searched) for b, p in zip(after_boards, probes)
    ]
    mover_value = torch.tensor([1.0 - e.win_probability for e in evaluations], dtype=torch.float32)
    mover_shaped = torch.tensor([shaped_value(e, p) for e, p in zip(evaluations, probes)], dtype=torch.float32)
    table = torch.tensor(indices, dtype=torch.long)
    values, shaped = mover_value[table], mover_shaped[table]  # [B, G (+1)]
    best_values = None
    if best_move_values:
        values, best_values = values[:, :-1].contiguous(), values[:, -1].contiguous()
        shaped = shaped[:, :-1].contiguous()
    count = len(after_boards) + (len(groups.boards) if best_move_values else 0)
    return GroupRewards(values=values, best_values=best_values, shaped=shaped, evaluations=count, groups=groups)


# ------------------------------------------------------------------------------------------------
# To the learner


def to_rollout_batch(groups: MoveGroups, rewards: torch.Tensor) -> RolloutBatch:
    """Rows = the B * G sampled moves (L = 1); group id = position index."""
    batch_size, group_size = groups.actions.shape
    if rewards.shape != (batch_size, group_size):
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} for groups of shape {(batch_size, group_size)}")
    position = torch.arange(batch_size, device=groups.actions.device).repeat_interleave(group_size)
    return RolloutBatch(
        inputs={"position": position},
        actions=groups.actions.reshape(-1, 1),
        behaviour_logp=groups.behaviour_logp.reshape(-1, 1).float(),
        mask=torch.ones(batch_size * group_size, 1, dtype=torch.bool, device=groups.actions.device),
        rewards=rewards.reshape(-1).float().to(groups.actions.device),
        group_ids=position.clone(),
        ref_logp=None if groups.ref_logp is None else groups.ref_logp.reshape(-1, 1).float(),
    )


def make_forward(
    model: ActionPolicy,
    groups: MoveGroups,
    *,
    temperature: float,
    bf16: bool = False,
    value_targets: torch.Tensor | None = None,
    value_loss_weight: float = 0.0,
    reference: ActionPolicy | None = None,
):
    """The learner's forward for these groups: log-probs and exact entropy of any subset of rows, and with
    `reference` the exact KL(policy || reference) over all legal moves of each row's position (`PolicyOutputs.kl`,
    the KL term under ``grpo.kl_estimator: exact``).

    The model runs once per distinct position in the minibatch (G rows share a position). It must
    be in eval mode (no dropout); gradients flow. With `value_targets` ([B] expected scores of the
    positions for their side to move) and `value_loss_weight` > 0 the same trunk pass also gives the
    value head's logits, and each row's aux loss (`PolicyOutputs.aux_row_loss`, which the learner averages
    over the minibatch's rows) is the weight times the value head's cross-entropy to its position's target
    (the pretraining value loss). Losses on labelled positions are not the rows': `labelled_loss`.
    """
    with_value = value_targets is not None and value_loss_weight > 0

    def outputs(minibatch: RolloutBatch) -> PolicyOutputs:
        at = distinct_position_log_probs(
            model,
            groups.tokens,
            groups.legal,
            minibatch.inputs["position"],
            temperature,
            bf16=bf16,
            with_value=with_value,
        )
        aux_rows = None
        if at.value_logits is not None:
            assert value_targets is not None
            target = value_targets.to(at.value_logits.device)[at.positions].float()
            # Per row (each row's position), not per distinct position: the learner averages it over the
            # minibatch's rows, which data-parallel ranks and micro-batches split exactly.
            per_position = F.binary_cross_entropy_with_logits(at.value_logits.float(), target, reduction="none")
            aux_rows = value_loss_weight * per_position[at.inverse.to(per_position.device)]
        logp = at.logp_full[at.inverse].gather(1, minibatch.actions)
        entropy = categorical_entropy(at.logp_full)[at.inverse].unsqueeze(1)
        kl = None
        if reference is not None:
            kl = exact_reference_kl(reference, groups.tokens, groups.legal, at, temperature, bf16=bf16)[
                at.inverse
            ].unsqueeze(1)
        return PolicyOutputs(logp=logp, entropy=entropy, kl=kl, aux_row_loss=aux_rows)

    return eval_mode_forward(model, outputs)


def labelled_loss(
    model: ActionPolicy,
    *,
    value_batches: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
    value_loss_weight: float = 0.0,
    bc_batches: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
    bc_loss_weight: float = 0.0,
    bf16: bool = False,
) -> Callable[[], torch.Tensor] | None:
    """The losses on labelled positions that anchor a GRPO update (None when there are none): each call
    draws the next `value_batches` / `bc_batches` and returns value_loss_weight x the value head's
    cross-entropy to their labelled values (so the head stays fitted to the data's positions) plus
    bc_loss_weight x the behaviour-cloning cross-entropy to their labelled best moves (the pretraining
    objective at temperature 1: the pretraining-mix anchor of PPO-ptx, Ouyang et al. 2022, which keeps the
    policy on the engine's moves where the rewards do not reach). A term of the whole minibatch, not of its
    rows (`TaskRollout.minibatch_terms`).
    """
    with_value = value_batches is not None and value_loss_weight > 0
    with_bc = bc_batches is not None and bc_loss_weight > 0
    if not (with_value or with_bc):
        return None

    def loss() -> torch.Tensor:
        total = None
        if with_value:
            assert value_batches is not None
            tokens, labelled = value_batches()
            with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
                _, data_logits = model(tokens.to(model.device), with_value=True)
            total = value_loss_weight * F.binary_cross_entropy_with_logits(
                data_logits.float(), labelled.to(data_logits.device).float()
            )
        if with_bc:
            assert bc_batches is not None
            tokens, legal, best = bc_batches()
            with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
                bc_logits = model(tokens.to(model.device))
            bc_logp = log_probs(bc_logits, legal.to(bc_logits.device))
            bc = bc_loss_weight * -bc_logp.gather(1, best.to(bc_logits.device).unsqueeze(1)).mean()
            total = bc if total is None else total + bc
        assert total is not None
        return total

    return loss
