"""`kind: move_group`: GRPO of the action policy on one-move groups with engine rewards.

One step (`MoveGroupKind.train_step`):

1. **sample**: draw B fresh start positions (seeded by seed and step; each rank plays its share), sample G moves each
   from the current policy at the rollout temperature, recording behaviour and reference
   log-probs, exact entropy and exact KL to the reference;
2. **reward**: value every distinct sampled move with the engine pool (cached); the run's rewards
   (`task.reward`, or several with weights: `task.rewards`) map those values to the training reward,
   their weighted sum, each logged as reward/<name>;
3. **learn**: `rl.optimize` (advantages, clipped surrogate, KL, PPO epochs over minibatches, the
   first-minibatch ratio check), each update through the loop's `Learner`.

The reference policy is the starting checkpoint, frozen. Every forward of the policy and the
reference runs in eval mode (no dropout, docs/architecture.md, invariant 2); the learner recomputes
log-probs with the same `log_probs`, temperature and masks as the sampler (invariant 1).

Evaluation is the code of ``chessgrpo eval offline|puzzles`` (held-out ESL, top-1 and blunder
rate with bootstrap intervals; puzzle first-move accuracy with Wilson intervals); full results go
to RUN_DIR/eval/step_NNNNNN_{offline,puzzles}.json, the format ``chessgrpo eval compare`` reads.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chess
import torch

from chessgrpo.config import ConfigError, EngineConfig, RunConfig, engine_limits_unused, grpo_engine_config
from chessgrpo.data.start_positions import PositionSource, StartPositionMixture, StartPositions
from chessgrpo.eval.registry import EVALUATIONS, extra_evaluations  # result file names, eval.extra
from chessgrpo.models.policy import ModelConfig
from chessgrpo.paths import PUZZLES_DEFAULT
from chessgrpo.rl import GRPOConfig
from chessgrpo.tasks.kinds.policy_base import PolicyGRPOKind, policy_eval_line
from chessgrpo.tasks.move_group import (
    MOVE_GROUP_REWARDS,
    MoveGroupConfig,
    labelled_loss,
    make_forward,
    sample_groups,
    score_groups,
    to_rollout_batch,
)
from chessgrpo.tasks.policy_games import SOURCE_PREFIX, cached_policy_game_positions, parse_policy_games
from chessgrpo.tasks.reward_registry import combine, reward_metrics
from chessgrpo.train.config import TrainConfig
from chessgrpo.train.distributed import derived_seed, group_generators
from chessgrpo.train.kind import RunContext, SharedParts, StepGroups, TaskRollout, postfix

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class MoveGroupEvalConfig:
    """Held-out evaluation during GRPO (the code of `chessgrpo eval offline|puzzles`); cadence: eval_every."""

    positions: str | None = "data/tiny"
    """Held-out positions: a dataset directory (its test split), .parquet, .epd/.fen/.txt or .pgn; null = skip."""
    max_positions: int = 1000
    """Positions sampled (seeded) from `positions`; the same ones at every evaluation (paired)."""
    nodes: int = 2000
    """Stockfish nodes for labelling and valuing moves (as `chessgrpo eval offline`)."""
    puzzles: str | None = PUZZLES_DEFAULT
    """Lichess puzzle CSV for first-move accuracy and solve rate; null = skip."""
    max_puzzles: int = 500
    """Puzzles sampled (seeded) from `puzzles`."""
    resamples: int = 2000
    """Bootstrap resamples of the offline intervals."""
    extra: Any = dataclasses.field(default_factory=dict)
    """More evaluations of the registry (`eval.registry`) run at each held-out evaluation, each writing its
    step_NNNNNN_<name>.json and logging its eval/ metrics: a list of names ([epd]), or a mapping name -> that
    evaluation's config keys ({epd: {epd: suite.epd}}). docs/architecture.md, "Evaluations: one registry"."""

    def __post_init__(self) -> None:
        if self.max_positions < 1 or self.nodes < 1 or self.max_puzzles < 1 or self.resamples < 10:
            raise ValueError("need max_positions >= 1, nodes >= 1, max_puzzles >= 1, resamples >= 10")
        extra_evaluations(self.extra)  # a ConfigError now names an unknown evaluation or a bad key of its config


@dataclasses.dataclass
class MoveGroupTrainConfig(TrainConfig):
    """`chessgrpo train` with ``kind: move_group``: GRPO on one-move groups with Stockfish rewards."""

    kind: str = "move_group"
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="grpo"))
    init_checkpoint: str | None = "runs/pretrain_tiny"
    """Starting policy (checkpoint or run directory); it is also the frozen reference. null = from scratch (`model`)."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy's shape when training from scratch. With init_checkpoint only its move-fact keys count: each set
    true that the checkpoint lacks is added with zero weights, the starting policy unchanged (`models.add_facts`)."""
    positions: str | None = "data/tiny"
    """Start positions: a dataset directory (its `positions_split`), .parquet, .epd/.fen/.txt, .pgn or random:N;
    null when `position_mixture` is given."""
    positions_split: str = "train"
    """Split of a dataset directory to draw start positions from (keep evaluation on the other)."""
    max_start_positions: int | None = None
    """Keep at most this many start positions (a seeded sample); null = all."""
    start_win_prob_range: tuple[float, float] | None = None
    """Datasets only: keep start positions whose best move's labelled win probability is in [low, high]
    (e.g. [0.05, 0.95]); decided positions give every move the same reward. null = keep all."""
    position_mixture: list[PositionSource] = dataclasses.field(default_factory=list)
    """Draw each step's start positions from several sources with weights (each item: positions, weight,
    name, split, max_positions, win_prob_range, skip_mover); replaces `positions` (set it to null)."""
    task: MoveGroupConfig = dataclasses.field(default_factory=MoveGroupConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    engine: EngineConfig = dataclasses.field(default_factory=grpo_engine_config)
    """The Stockfish pool for rewards and evaluation (task.reward_nodes / eval.nodes set the limits)."""
    eval: MoveGroupEvalConfig = dataclasses.field(default_factory=MoveGroupEvalConfig)
    value_loss_weight: float = 0.0
    """Policies with a value head: also train the head during GRPO, on the step's engine values of its
    start positions (the best move's value, `task.best_move_values`), with the pretraining value loss at
    this weight. 0 = the head stays as pretraining left it while the shared trunk moves under it."""
    value_positions: str | None = None
    """With value_loss_weight > 0: a dataset directory whose train split's labelled values (the best move's
    win probability) also train the value head, `value_batch_size` positions per update, so the head stays
    fitted to the positions of the data, which the step's own start positions are not. null = only those."""
    value_batch_size: int = 64
    """Labelled positions of `value_positions` per update (one more forward and backward of that many)."""
    bc_loss_weight: float = 0.0
    """Also minimise this weight x the pretraining objective (cross-entropy to the labelled best move) on
    `bc_batch_size` labelled positions of `bc_positions` per update: the pretraining-mix anchor of PPO-ptx
    (InstructGPT), so GRPO keeps the engine's moves where its rewards do not reach (e.g. tactics the start
    positions rarely hold). 0 = off."""
    bc_positions: str | None = None
    """With bc_loss_weight > 0: the dataset directory (its train split) of those positions; null = value_positions."""
    bc_batch_size: int = 64
    """Labelled positions per update for the bc term (one more forward and backward of that many)."""
    debug_learn_temperature: float | None = None
    """DEBUG: learn at this temperature instead of task.temperature, to watch the ratio check fire."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind != "move_group":
            raise ConfigError(f"config key kind must be move_group for this config, got {self.kind!r}")
        engine_limits_unused(self.engine, "task.reward_nodes (rewards) and eval.nodes (evaluation)")
        if self.position_mixture and self.positions is not None:
            raise ConfigError(
                "config keys positions and position_mixture are exclusive: set positions: null to use the mixture, or position_mixture: [] (override position_mixture=[]) for one source"
            )
        if not self.position_mixture and self.positions is None:
            raise ConfigError("config key positions is null and position_mixture is empty: no start positions")
        if self.max_start_positions is not None and self.max_start_positions < 1:
            raise ConfigError(f"config key max_start_positions must be >= 1 or null, got {self.max_start_positions}")
        low_high = self.start_win_prob_range
        if low_high is not None and not 0.0 <= low_high[0] <= low_high[1] <= 1.0:
            raise ConfigError(
                f"config key start_win_prob_range must be [low, high] within [0, 1], got {list(low_high)}"
            )
        if self.debug_learn_temperature is not None and self.debug_learn_temperature <= 0:
            raise ConfigError(
                f"config key debug_learn_temperature must be > 0 or null, got {self.debug_learn_temperature}"
            )
        if not (math.isfinite(self.value_loss_weight) and self.value_loss_weight >= 0):
            raise ConfigError(
                f"config key value_loss_weight must be a finite number >= 0, got {self.value_loss_weight}"
            )
        if self.value_batch_size < 1:
            raise ConfigError(f"config key value_batch_size must be >= 1, got {self.value_batch_size}")
        if self.value_positions is not None and self.value_loss_weight <= 0:
            raise ConfigError("config key value_positions needs value_loss_weight > 0 (it is what trains on them)")
        if not (math.isfinite(self.bc_loss_weight) and self.bc_loss_weight >= 0):
            raise ConfigError(f"config key bc_loss_weight must be a finite number >= 0, got {self.bc_loss_weight}")
        if self.bc_batch_size < 1:
            raise ConfigError(f"config key bc_batch_size must be >= 1, got {self.bc_batch_size}")
        if self.bc_loss_weight > 0 and self.bc_dataset is None:
            raise ConfigError(
                "config key bc_loss_weight > 0 needs bc_positions (or value_positions): the labelled positions it trains on"
            )
        if self.bc_positions is not None and self.bc_loss_weight <= 0:
            raise ConfigError("config key bc_positions needs bc_loss_weight > 0 (it is what trains on them)")
        if self.value_loss_weight > 0 and not self.task.best_move_values:
            raise ConfigError(
                "config key value_loss_weight > 0 needs task.best_move_values: true (the positions' engine values)"
            )

    @property
    def bc_dataset(self) -> str | None:
        """The dataset the bc term draws from: bc_positions, else value_positions."""
        return self.bc_positions or self.value_positions

    @property
    def needs_pool(self) -> bool:
        """Always: the Stockfish pool values every sampled move (a mixture starts its shared pool for it)."""
        return True

    def default_best_metric(self) -> tuple[str, str] | None:
        if self.eval.positions:
            return "eval/esl", "min"
        return ("eval/puzzle_first_move_accuracy", "max") if self.eval.puzzles else None


class MoveGroupKind(PolicyGRPOKind):
    """One-move-group GRPO of an `ActionPolicy` (module docstring)."""

    name = "move_group"
    config_class = MoveGroupTrainConfig
    group_count_name = "task.positions_per_step"

    def __init__(self, config: MoveGroupTrainConfig, context: RunContext, shared: SharedParts | None = None):
        super().__init__(config, context, shared)
        self.build_policy(config.init_checkpoint, config.model, config.grpo)
        if config.value_loss_weight > 0 and self.model.value_head is None:
            raise ConfigError(
                f"config key value_loss_weight is {config.value_loss_weight}, but the policy has no value head (model.value_head)"
            )
        # Labelled positions for the auxiliary losses, each dataset loaded once (value and bc may share one).
        loaded: dict[str, Any] = {}

        def labelled(path: str, what: str) -> Any:
            from chessgrpo.train.dataset import load_split

            if path not in loaded:
                loaded[path] = load_split(
                    path, "train", move_facts=self.model.config.move_facts, extra_facts=self.model.config.extra_facts
                )
            logger.info("%s: %d labelled positions from %s", what, len(loaded[path]), path)
            return loaded[path]

        self.value_data = labelled(config.value_positions, "value loss") if config.value_positions is not None else None
        self.bc_data = (
            labelled(config.bc_dataset, "bc loss") if config.bc_loss_weight > 0 and config.bc_dataset else None
        )
        self._policy_games: dict[str, list] = {}
        self.start_positions: StartPositions | StartPositionMixture
        if config.position_mixture:
            self.start_positions = StartPositionMixture.from_config(
                config.position_mixture, seed=config.run.seed, load=self._policy_games_source
            )
        else:
            assert config.positions is not None  # __post_init__
            self.start_positions = self._policy_games_source(
                PositionSource(config.positions)
            ) or StartPositions.from_source(
                config.positions,
                split=config.positions_split,
                max_positions=config.max_start_positions,
                seed=config.run.seed,
                win_prob_range=config.start_win_prob_range,
            )
        logger.info("%d start positions from %s", len(self.start_positions), self.start_positions.source)
        # The run's rewards and weights (a user's function imported once); what they need decides what starts.
        self.rewards = config.task.weighted_rewards()
        needs = MOVE_GROUP_REWARDS.needs_of(self.rewards, config)
        self.pool = self.make_pool(config.engine)  # every run values its moves (and evaluates) with it
        # Exact values at few pieces where a reward asks for them (the shaped reward, tasks/rewards.py).
        self.tablebase = None
        if "tablebase" in needs and config.engine.syzygy_path:
            from chessgrpo.engine import Tablebase

            self.tablebase = Tablebase(config.engine.syzygy_path)

    def _policy_games_source(self, item: PositionSource) -> StartPositions | None:
        """``policy_games:N``: positions from N games of the starting (reference) policy against a random mover."""
        if not item.positions.startswith(SOURCE_PREFIX):
            return None
        games = parse_policy_games(item.positions)
        tick = time.perf_counter()
        source = "the games of an earlier source"
        if item.positions not in self._policy_games:  # two sources may filter the same games differently
            engine = self.config.engine
            cache_dir = Path(engine.cache_path).parent if engine.cache and engine.cache_path else None
            self._policy_games[item.positions], source = cached_policy_game_positions(
                self.reference, games, cache_dir, seed=self.config.run.seed + 7919
            )
        boards = self._policy_games[item.positions]
        if item.max_positions is not None and len(boards) > item.max_positions:
            boards = StartPositions(boards, item.positions).draw(
                item.max_positions, seed=self.config.run.seed, step=0, stream=99
            )
        logger.info(
            "%s: %d positions from %d games against a random mover (%s, %.1f s)",
            item.positions,
            len(boards),
            games,
            source,
            time.perf_counter() - tick,
        )
        return StartPositions(boards, item.positions)

    def close(self) -> None:
        self.stop_pipeline()  # a pipelined step's rollout may still be searching with the pool
        self.close_pool(self.pool)
        if self.tablebase is not None:
            self.tablebase.close()

    # -- the step -----------------------------------------------------------------------------------

    def group_count(self) -> int:
        return self.config.task.positions_per_step

    @classmethod
    def exclusive_evaluations(cls, config: MoveGroupTrainConfig) -> tuple[str, ...]:
        return ("held-out positions",) if config.eval.positions else ()

    def rollout(self, step: int, groups: StepGroups, sampler: torch.nn.Module | None = None) -> TaskRollout:
        """Sample and reward step `step`'s one-move groups `groups`; the learner's batch and forward.
        `sampler`: the weights to sample from (a pipelined step's snapshot, `GRPOKind.train_step`); None = `model`."""
        config, task, bf16 = self.config, self.config.task, self.context.bf16
        stats_before = dataclasses.replace(self.pool.stats)

        tick = time.perf_counter()
        # The step's positions are a function of (seed, step); this rank plays its share of them.
        drawn = self.start_positions.draw(groups.count, seed=config.run.seed, step=step)
        boards = [drawn[i] for i in groups.mine]
        # The reference forward always runs (one forward of B positions): KL is logged even at kl_coef = 0.
        groups_ = sample_groups(
            self.model if sampler is None else sampler,
            boards,
            task.group_size,
            temperature=task.temperature,
            generator=group_generators(self.context.seed, step, groups.seeds, self.context.device),
            reference=self.reference,
            bf16=bf16,
        )
        sample_s = time.perf_counter() - tick

        tick = time.perf_counter()
        scored = score_groups(
            self.pool,
            groups_,
            nodes=task.reward_nodes,
            best_move_values=task.best_move_values,
            tablebase=self.tablebase,
        )
        # Each reward of the run on the same scored groups, then their weighted sum (one reward of weight 1: itself).
        named = {item.name: item.reward.function(scored) for item in self.rewards}
        rewards = combine([(item.weight, named[item.name]) for item in self.rewards])
        reward_s = time.perf_counter() - tick

        batch = to_rollout_batch(groups_, rewards.to(self.context.device))
        learn_temperature = config.debug_learn_temperature or task.temperature
        forward = make_forward(
            self.learner_model,
            groups_,
            temperature=learn_temperature,
            bf16=bf16,
            value_targets=scored.best_values if config.value_loss_weight > 0 else None,
            value_loss_weight=config.value_loss_weight,
            reference=self.reference if config.grpo.exact_kl_term else None,
        )
        # Pipelined: the first-minibatch ratio check runs on the weights that sampled (`rl.optimize`'s behaviour_forward).
        behaviour = (
            None if sampler is None else make_forward(sampler, groups_, temperature=learn_temperature, bf16=bf16)
        )

        stats = self.pool.stats
        lookups = (stats.cache_hits - stats_before.cache_hits) + (stats.cache_misses - stats_before.cache_misses)
        unique_moves = torch.tensor([len(set(row)) for row in groups_.actions.tolist()], dtype=torch.float32)
        metrics = {
            "entropy/mean": float(groups_.entropy.mean()),
            "entropy/ln_legal": float(groups_.ln_legal.mean()),
            "reward/win_prob": float(scored.values.mean()),
            "reward/shaped": float(scored.shaped.mean()),
            "rollout/unique_moves": float(unique_moves.mean()),
            "rollout/positions": float(groups.count),
            "perf/sample_s": sample_s,
            "perf/reward_s": reward_s,
            "perf/engine_evals_per_s": scored.evaluations / max(reward_s, 1e-9),
            "perf/engine_searches": float(stats.searches - stats_before.searches),
            "perf/cache_hit_rate": (stats.cache_hits - stats_before.cache_hits) / lookups if lookups else 0.0,
            "perf/engine_retries": float(stats.retries),
            "perf/engine_failures": float(stats.failures),
        }
        if isinstance(self.start_positions, StartPositionMixture):
            for label, fraction in self.start_positions.source_fractions().items():
                metrics[f"rollout/source/{label}"] = fraction
        if groups_.exact_kl is not None:
            metrics["kl/exact"] = float(groups_.exact_kl.mean())
        if scored.best_values is not None:
            metrics["reward/regret"] = float(scored.regret.mean())
            metrics["reward/esl"] = float(-scored.regret.mean())
            metrics["reward/best_win_prob"] = float(scored.best_values.mean())
        for name, values in named.items():  # each reward of the run by name, beside the combined reward/mean
            metrics.update(reward_metrics(name, values))
        # every rank's samples: the ranks step together
        return TaskRollout(
            batch,
            forward,
            metrics,
            samples=groups.count * task.group_size,
            rollout_s=sample_s + reward_s,
            row_groups=batch.inputs["position"],
            minibatch_terms=self.minibatch_terms(step),
            behaviour_forward=behaviour,
        )

    def minibatch_terms(self, step: int) -> Callable[[], torch.Tensor] | None:
        """The value and bc losses on labelled positions (`value_positions`, `bc_positions`), drawn per call from
        generators seeded by (seed, step). With a value loss but no labelled value positions, the value head
        still runs (x 0) on one position, so that every data-parallel rank uses it in every update (DDP needs
        a gradient for every trained parameter on every rank, and a rank of a task mixture may hold no
        one-move row to train it on)."""
        config = self.config
        labelled = labelled_loss(
            self.learner_model,
            value_batches=self._value_batches(step) if self.value_data is not None else None,
            value_loss_weight=config.value_loss_weight,
            bc_batches=self._bc_batches(step) if self.bc_data is not None else None,
            bc_loss_weight=config.bc_loss_weight,
            bf16=self.context.bf16,
        )
        if not (self.trains_value_head and self.value_data is None):
            return labelled
        touch = self.model.inputs([chess.Board()])[0]

        def with_value_head() -> torch.Tensor:
            _, value_logits = self.learner_model(touch.to(self.context.device), with_value=True)
            zero = value_logits.sum() * 0.0
            return zero if labelled is None else labelled() + zero

        return with_value_head

    def _labelled_draws(self, data: Any, size: int, step: int, stream: int):
        """A function drawing `size` positions of `data` per call, from a generator seeded by (seed, step, stream)."""
        generator = torch.Generator().manual_seed(derived_seed(self.context.seed, step, stream))
        return lambda: data.batch(torch.randint(len(data), (size,), generator=generator))

    def _value_batches(self, step: int):
        """Draws of `value_batch_size` labelled positions for the value loss: (inputs, targets), a function of (seed, step)."""
        from chessgrpo.tasks.supervised import value_targets

        assert self.value_data is not None
        draw = self._labelled_draws(self.value_data, self.config.value_batch_size, step, 0x7A)

        def inputs_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
            batch = draw()
            return batch.tokens, value_targets(batch)

        return inputs_and_targets

    def _bc_batches(self, step: int):
        """Draws of `bc_batch_size` labelled positions for the bc term: (inputs, legal mask, best action), a function of (seed, step)."""
        assert self.bc_data is not None
        draw = self._labelled_draws(self.bc_data, self.config.bc_batch_size, step, 0xBC)

        def inputs_and_best_moves() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            batch = draw()
            return batch.tokens, batch.legal_mask, batch.best_action

        return inputs_and_best_moves

    # -- evaluation ---------------------------------------------------------------------------------

    @property
    def evaluates(self) -> bool:
        return bool(self.config.eval.positions or self.config.eval.puzzles or self.config.eval.extra)

    def evaluate(self, step: int, out_dir: Path) -> dict[str, float]:
        """Held-out offline metrics and puzzle accuracy of the current policy (argmax), with intervals, and the
        evaluations of ``eval.extra``: each through the registry (`PolicyGRPOKind.held_out_evaluation`)."""
        from chessgrpo.eval.standalone import EvalConfig

        self.wait_for_rollout()  # a pipelined next rollout uses the pool: let it finish first
        config = self.config.eval
        metrics: dict[str, float] = {}
        if config.positions:
            metrics.update(
                self.offline_evaluation(
                    step, out_dir, self.pool, config.positions, config.max_positions, config.nodes, config.resamples
                )
            )
        if config.puzzles:
            puzzles = EvalConfig(
                positions=None,
                puzzles=config.puzzles,
                max_puzzles=config.max_puzzles,
                seed=self.context.seed,
                baselines=False,
            )
            metrics.update(self.held_out_evaluation("puzzles", puzzles, step, out_dir))
        metrics.update(self.extra_evaluations(config.extra, step, out_dir, pool=self.pool))
        return metrics

    # -- presentation -------------------------------------------------------------------------------

    def progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        return postfix(
            row,
            (
                ("reward/win_prob", "reward", ".3f"),
                ("reward/esl", "esl", ".3f"),
                ("perf/samples_per_s", "sps", ".0f"),
                ("eval/esl", "heldout_esl", ".3f"),
            ),
        )

    def eval_line(self, step: int, row: dict[str, Any]) -> str | None:
        return policy_eval_line(step, row)

    def summary(self) -> list[str]:
        out = self.context.run_dir / "eval"
        files = EVALUATIONS["offline"].step_files(out)
        if len(files) >= 2:
            return [f"paired before/after: chessgrpo eval compare {files[0]} {files[-1]}"]
        return []
