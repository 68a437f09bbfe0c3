"""`kind: trajectory`: GRPO over multi-ply trajectory groups (`tasks.trajectory`), e.g. the endgame curriculum.

One step (`TrajectoryKind.train_step`):

1. **sample**: draw B fresh start positions (seeded by seed and step, each rank playing its share; endgame positions are
   generated uniformly among the won ones and never include a held-out evaluation position),
   play G games from each, T own plies at most, against the configured opponent, recording the
   behaviour log-prob, exact entropy and (when the KL is used) the reference log-prob of every ply;
2. **reward**: per own ply from the tablebase (exact) or the engine pool (win probability), or the weighted
   sum of several rewards (`task.rewards`), each logged as reward/<name>;
3. **learn**: `rl.optimize` with L = T and the mask: outcome supervision (rewards [N]), process, step
   or critic supervision (rewards [N, T]; `RolloutBatch.supervision` names the `rl.advantages`
   estimator); the first-minibatch ratio check and KL as in the GRPO core, each update through the
   loop's `Learner` (backward, clipping to `max_grad_norm`, the optimizer step).

The reference policy is the starting checkpoint (or the random initialisation), frozen. Every
forward runs in eval mode (no dropout). The kind's resumable state is the KL controller and the
sampling generator (the loop saves the rest); start positions are a function of (seed, step,
rank), so ``--resume`` continues bitwise identically to a straight run.

Evaluation (every `eval_every` steps, at the start with `eval_at_start`, and at the end):

- endgame runs (``positions: endgame:KQvK``): the policy at argmax plays the strong side of
  `eval.positions` held-out won start positions for up to `eval.max_moves` own moves against the
  tablebase-perfect defender (`eval.endgame.evaluate_endgame`): ``eval/mate_rate`` with a Wilson
  interval, ``eval/dtz_optimal_rate``, ``eval/moves_to_mate`` vs ``eval/optimal_moves_to_mate``,
  ``eval/win_lost_rate``. At step 0 the random mover is evaluated too (``eval/random_*``); the
  tablebase itself mates every position in ``eval/optimal_moves_all`` moves on average.
- other runs: the held-out offline evaluation of ``chessgrpo eval offline`` (ESL, top-1, blunder
  rate with bootstrap intervals) on `eval.offline_positions`.

Both run through the evaluation registry (`eval.registry`), as do the evaluations ``eval.extra`` adds.
Results go to RUN_DIR/eval/step_NNNNNN_{endgame,offline,<extra>}.json.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch

from chessgrpo.board.endgames import COLOURS, EndgameStarts
from chessgrpo.config import ConfigError, EngineConfig, RunConfig, engine_limits_unused
from chessgrpo.data.start_positions import StartPositions
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.eval.endgame import EndgameEvalConfig
from chessgrpo.eval.registry import EVALUATIONS, extra_evaluations  # result file names, eval.extra
from chessgrpo.models.policy import ModelConfig
from chessgrpo.rl import GRPOConfig
from chessgrpo.tasks.engine_values import EngineValues
from chessgrpo.tasks.kinds.policy_base import PolicyGRPOKind, policy_eval_line
from chessgrpo.tasks.reward_registry import WeightedReward, combine, reward_metrics
from chessgrpo.tasks.trajectory import (
    Opponent,
    PolicyOpponent,
    StockfishOpponent,
    TablebaseOpponent,
    Trajectories,
    TrajectoryConfig,
    play_trajectories,
)
from chessgrpo.tasks.trajectory_learner import make_forward, outcome_metrics, to_rollout_batch
from chessgrpo.tasks.trajectory_rewards import TRAJECTORY_REWARDS, RewardSources, TrajectoryReward, sibling_baselines
from chessgrpo.train.config import TrainConfig
from chessgrpo.train.distributed import group_generators
from chessgrpo.train.kind import RunContext, SharedParts, StepGroups, TaskRollout, postfix

logger = logging.getLogger(__name__)

MAX_CURRICULUM_DTZ = 200
"""The adaptive curriculum's DTZ limit stops here (above every 3-5-piece win's distance: all won positions)."""

ENDGAME_PREFIX = "endgame:"


@dataclasses.dataclass
class TrajectoryEvalConfig:
    """What trajectory GRPO evaluates on held-out data (module docstring); cadence: eval_every, eval_at_start."""

    positions: int = 200
    """Endgame runs: held-out won start positions (generated once, never drawn for training)."""
    max_moves: int = 50
    """Endgame runs: own moves allowed to mate against the perfect defender."""
    max_dtz: int | None = None
    """Endgame runs: hold out only won starts at most this many plies from mate or conversion (DTZ), e.g. 3 for the
    mate-in-one and mate-in-two starts a curriculum begins with; null = uniform over all won starts."""
    baselines: bool = True
    """Endgame runs: at step 0 also evaluate the random mover on the same positions (eval/random_*)."""
    offline_positions: str | None = None
    """Other runs: held-out positions for ESL/top-1 (dataset dir's test split, .parquet, .epd/.fen/.txt, .pgn); null = skip."""
    max_offline_positions: int = 1000
    """Other runs: positions sampled (seeded) from offline_positions; the same ones at every evaluation."""
    nodes: int = 2000
    """Other runs: Stockfish nodes for labelling and valuing moves."""
    resamples: int = 2000
    """Other runs: bootstrap resamples of the offline intervals."""
    extra: Any = dataclasses.field(default_factory=dict)
    """More evaluations of the registry (`eval.registry`) run at each held-out evaluation, each writing its
    step_NNNNNN_<name>.json and logging its eval/ metrics: a list of names, or a mapping name -> its config keys."""

    def __post_init__(self) -> None:
        if self.positions < 1 or self.max_moves < 1 or self.max_offline_positions < 1 or self.nodes < 1:
            raise ValueError("need positions >= 1, max_moves >= 1, max_offline_positions >= 1, nodes >= 1")
        extra_evaluations(self.extra)  # a ConfigError now names an unknown evaluation or a bad key of its config
        if self.resamples < 10:
            raise ValueError(f"resamples must be >= 10, got {self.resamples}")
        if self.max_dtz is not None and self.max_dtz < 1:
            raise ValueError(f"max_dtz must be >= 1 (plies) or null, got {self.max_dtz}")


@dataclasses.dataclass
class TrajectoryTrainConfig(TrainConfig):
    """`chessgrpo train` with ``kind: trajectory``: GRPO over multi-ply trajectory groups."""

    kind: str = "trajectory"
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="trajectory"))
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    init_checkpoint: str | None = None
    """Starting policy (checkpoint or run directory), also the frozen reference; null = randomly initialised `model`."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy's shape when init_checkpoint is null. With a checkpoint only its move-fact keys count: each set true
    that the checkpoint lacks is added with zero weights, the starting policy unchanged (`models.add_facts`)."""
    positions: str = "endgame:KQvK"
    """Start positions: ``endgame:<material>`` (uniform won positions of e.g. KQvK, KRvK, KBBvK, KBNvK from the
    Syzygy tables in engine.syzygy_path) or any `data.start_positions.StartPositions` source (dataset dir, .parquet,
    .epd/.fen/.txt, .pgn, random:N)."""
    positions_split: str = "train"
    """Split of a dataset directory to draw start positions from (not used by endgame positions)."""
    max_start_positions: int | None = None
    """Keep at most this many start positions of a file or dataset (a seeded sample); null = all."""
    endgame_colours: str = "white"
    """Endgame positions: the strong side's colour, white | black | both."""
    curriculum_start_dtz: int | None = None
    """Endgame positions: reverse curriculum (Florensa et al. 2017): at step s only won positions with DTZ <=
    curriculum_start_dtz + s * curriculum_dtz_per_step plies are drawn (near-mate first); null = uniform over all won."""
    curriculum_dtz_per_step: float = 0.2
    """Endgame positions: growth of the curriculum's DTZ limit in plies per step (KQvK's longest DTZ is 19 plies)."""
    curriculum_widen_at: float | None = None
    """Endgame positions: a reverse curriculum that widens as the mate rate holds. With curriculum_start_dtz set, the
    DTZ limit grows by curriculum_widen_plies each time the rollouts' mate rate over the last curriculum_window steps
    reaches this share (curriculum_dtz_per_step is then unused); null = the linear schedule."""
    curriculum_widen_plies: int = 2
    """(curriculum_widen_at) plies added to the DTZ limit at each widening."""
    curriculum_window: int = 5
    """(curriculum_widen_at) steps whose rollout mate rate must reach curriculum_widen_at before the next widening."""
    task: TrajectoryConfig = dataclasses.field(default_factory=TrajectoryConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    engine: EngineConfig = dataclasses.field(default_factory=lambda: EngineConfig(nodes=None, cache=False))
    """Stockfish pool (started only for engine rewards, the stockfish opponent or offline evaluation) and
    engine.syzygy_path, the Syzygy tables (for tablebase rewards/opponent and endgame positions)."""
    eval: TrajectoryEvalConfig = dataclasses.field(default_factory=TrajectoryEvalConfig)
    debug_learn_temperature: float | None = None
    """DEBUG: learn at this temperature instead of task.temperature, to watch the ratio check fire."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind != "trajectory":
            raise ConfigError(f"config key kind must be trajectory for this config, got {self.kind!r}")
        engine_limits_unused(self.engine, "task.reward_nodes, task.opponent_nodes and eval.nodes")
        if self.task.rewards is None and self.task.reward not in TRAJECTORY_REWARDS:
            raise ConfigError(
                f"config key task.reward must be one of {TRAJECTORY_REWARDS.known()}, got {self.task.reward!r}"
            )
        try:
            self.weighted_rewards()
        except ValueError as error:
            raise ConfigError(f"config key {error}") from None
        if self.max_start_positions is not None and self.max_start_positions < 1:
            raise ConfigError(f"config key max_start_positions must be >= 1 or null, got {self.max_start_positions}")
        if self.curriculum_start_dtz is not None and (
            self.curriculum_start_dtz < 1 or self.curriculum_dtz_per_step < 0
        ):
            raise ConfigError(
                "config keys curriculum_start_dtz must be >= 1 (or null) and curriculum_dtz_per_step >= 0"
            )
        if self.curriculum_widen_at is not None:
            if self.curriculum_start_dtz is None:
                raise ConfigError(
                    "config key curriculum_widen_at needs curriculum_start_dtz (the DTZ limit it widens from)"
                )
            if not 0.0 < self.curriculum_widen_at <= 1.0:
                raise ConfigError(
                    f"config key curriculum_widen_at must be a mate rate in (0, 1] or null, got {self.curriculum_widen_at}"
                )
            if self.curriculum_widen_plies < 1 or self.curriculum_window < 1:
                raise ConfigError("config keys curriculum_widen_plies and curriculum_window must be >= 1")
        if self.endgame_colours not in COLOURS:
            raise ConfigError(
                f"config key endgame_colours must be one of {list(COLOURS)}, got {self.endgame_colours!r}"
            )
        if self.debug_learn_temperature is not None and self.debug_learn_temperature <= 0:
            raise ConfigError(
                f"config key debug_learn_temperature must be > 0 or null, got {self.debug_learn_temperature}"
            )
        if self.needs_tables and not self.engine.syzygy_path:
            raise ConfigError("endgame positions and tablebase rewards/opponents need engine.syzygy_path")
        if self.task.supervision == "critic" and not (self.task.only_tablebase and self.task.regret):
            raise ConfigError(
                "task.supervision: critic needs task.reward: tablebase (alone, weight 1) and task.regret: true "
                "(rewards relative to the exact value)"
            )
        if self.eval.max_dtz is not None and not self.is_endgame:
            raise ConfigError(
                f"config key eval.max_dtz limits held-out endgame starts; positions {self.positions!r} are not endgame:..."
            )
        if "tablebase" in self.reward_needs and not self.is_endgame:
            logger.warning(
                "tablebase rewards with positions %r: every position must be covered by the tables", self.positions
            )

    @property
    def is_endgame(self) -> bool:
        return self.positions.startswith(ENDGAME_PREFIX)

    def weighted_rewards(self) -> list[WeightedReward[TrajectoryReward]]:
        """The run's rewards and weights (`task.rewards`, else `task.reward` at weight 1); a `ValueError` naming the key."""
        return TRAJECTORY_REWARDS.weighted(
            self.task.weights, "task.rewards" if self.task.rewards is not None else "task.reward"
        )

    @property
    def reward_needs(self) -> frozenset[str]:
        """What the run's rewards need, from their registered records (`TRAJECTORY_REWARDS`)."""
        return TRAJECTORY_REWARDS.needs_of(self.weighted_rewards(), self)

    @property
    def needs_tables(self) -> bool:
        """Whether the run probes the Syzygy tables (endgame positions, a reward that needs them, the tablebase opponent)."""
        return self.is_endgame or "tablebase" in self.reward_needs or self.task.opponent == "tablebase"

    @property
    def needs_pool(self) -> bool:
        """Whether the run starts Stockfish (a reward that needs it, the stockfish opponent, offline evaluation)."""
        return (
            "pool" in self.reward_needs
            or self.task.opponent == "stockfish"
            or (not self.is_endgame and self.eval.offline_positions is not None)
        )

    def default_best_metric(self) -> tuple[str, str] | None:
        if self.is_endgame:
            return "eval/mate_rate", "max"
        return ("eval/esl", "min") if self.eval.offline_positions else None


class TrajectoryKind(PolicyGRPOKind):
    """Trajectory-group GRPO of an `ActionPolicy` (module docstring)."""

    name = "trajectory"
    config_class = TrajectoryTrainConfig
    group_count_name = "task.positions_per_step"

    def __init__(self, config: TrajectoryTrainConfig, context: RunContext, shared: SharedParts | None = None):
        super().__init__(config, context, shared)
        # Nothing here draws from torch's global generator before the model is built (endgame and file
        # start positions use their own seeded generators), so building them after the loop's seeding
        # gives the same weights as the old trainer, which built them before.
        self.oracle = Tablebase(config.engine.syzygy_path) if config.needs_tables else None
        self.pool = None
        self.rewards = config.weighted_rewards()
        self.reward_needs = config.reward_needs
        # The adaptive curriculum's state (curriculum_widen_at): the DTZ limit and the recent steps' rollout mate rates.
        self._curriculum_limit = config.curriculum_start_dtz or 0
        self._curriculum_rates: list[float] = []
        try:
            self.endgame: EndgameStarts | None = None
            self.start_positions: StartPositions | None = None
            self._held_out: list | None = None
            if config.is_endgame:
                assert self.oracle is not None
                self.endgame = EndgameStarts(
                    config.positions[len(ENDGAME_PREFIX) :],
                    self.oracle.is_won,
                    tables=self.oracle.names,
                    plies=self.oracle.probe_dtz,
                    colours=config.endgame_colours,
                )
                # Held out first, so that no training draw can ever contain an evaluation position.
                self._held_out = self.endgame.hold_out(
                    config.eval.positions, seed=config.run.seed, max_plies=config.eval.max_dtz
                )
            else:
                self.start_positions = StartPositions.from_source(
                    config.positions,
                    split=config.positions_split,
                    max_positions=config.max_start_positions,
                    seed=config.run.seed,
                )
                logger.info("%d start positions from %s", len(self.start_positions), config.positions)

            self.build_policy(config.init_checkpoint, config.model, config.grpo)

            if config.needs_pool:
                self.pool = self.make_pool(config.engine)
            self.opponent: Opponent | None = self._make_opponent()
        except BaseException:
            self.close()
            raise

    def _make_opponent(self) -> Opponent | None:
        kind = self.config.task.opponent
        if kind == "self":
            return None
        if kind == "reference":
            task = self.config.task
            temperature = task.opponent_temperature if task.opponent_temperature is not None else task.temperature
            return PolicyOpponent(self.reference, temperature)  # per-step generators: train_step
        if kind == "stockfish":
            assert self.pool is not None
            return StockfishOpponent(self.pool, self.config.task.opponent_nodes)
        assert self.oracle is not None
        return TablebaseOpponent(self.oracle)

    def close(self) -> None:
        self.stop_pipeline()  # a pipelined step's rollout may still be playing against the pool
        self.close_pool(self.pool)
        if self.oracle is not None:
            self.oracle.close()

    # -- the step -----------------------------------------------------------------------------------

    def curriculum_max_plies(self, step: int) -> int | None:
        """The DTZ limit (plies) of step `step`'s endgame start positions, None without a curriculum."""
        start = self.config.curriculum_start_dtz
        if start is None:
            return None
        if self.config.curriculum_widen_at is not None:
            return self._curriculum_limit
        return int(start + step * self.config.curriculum_dtz_per_step)

    def _update_curriculum(self, trajectories: Trajectories) -> None:
        """The adaptive curriculum (curriculum_widen_at): record this step's rollout mate rate over all ranks, and
        widen the DTZ limit when the last curriculum_window steps' rate reached the threshold (then start a new window)."""
        config = self.config
        if config.curriculum_widen_at is None or config.curriculum_start_dtz is None:
            return
        outcomes = trajectories.outcomes()
        mates, rows = self.context.parallel.sum([sum(o == "mate" for o in outcomes), len(outcomes)])
        self._curriculum_rates = [*self._curriculum_rates, mates / max(rows, 1)][-config.curriculum_window :]
        window = self._curriculum_rates
        if len(window) == config.curriculum_window and sum(window) / len(window) >= config.curriculum_widen_at:
            self._curriculum_limit = min(self._curriculum_limit + config.curriculum_widen_plies, MAX_CURRICULUM_DTZ)
            self._curriculum_rates = []

    def rollout_state(self) -> dict[str, Any]:
        """The adaptive curriculum (each rollout records its mate rate): part of `state_dict`."""
        if self.config.curriculum_widen_at is None:
            return {}
        return {"curriculum": {"limit": self._curriculum_limit, "rates": list(self._curriculum_rates)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.config.curriculum_widen_at is not None:
            if "curriculum" not in state:
                raise ValueError(
                    "this checkpoint holds no adaptive curriculum state (curriculum_widen_at was not set when it was written)"
                )
            self._curriculum_limit = int(state["curriculum"]["limit"])
            self._curriculum_rates = [float(rate) for rate in state["curriculum"]["rates"]]

    def draw_starts(self, step: int, groups: range | None = None, count: int | None = None) -> list:
        """The start positions of step `step` (0-based), a function of (seed, step); `groups` selects this rank's share.

        `count`: how many to draw (default task.positions_per_step; a task mixture gives its share)."""
        count = self.config.task.positions_per_step if count is None else count
        seed = self.config.run.seed
        if self.endgame is not None:
            starts = self.endgame.draw(count, seed=seed, step=step, max_plies=self.curriculum_max_plies(step))
        else:
            assert self.start_positions is not None
            starts = self.start_positions.draw(count, seed=seed, step=step)
        return starts if groups is None else [starts[i] for i in groups]

    def group_count(self) -> int:
        return self.config.task.positions_per_step

    @classmethod
    def exclusive_evaluations(cls, config: TrajectoryTrainConfig) -> tuple[str, ...]:
        return ("held-out positions",) if config.eval.offline_positions else ()

    def rollout(self, step: int, groups: StepGroups, sampler: torch.nn.Module | None = None) -> TaskRollout:
        """Play and reward step `step`'s trajectory groups `groups`; the learner's batch and forward.
        `sampler`: the weights that play (a pipelined step's snapshot, `GRPOKind.train_step`); None = `model`."""
        config, task, bf16 = self.config, self.config.task, self.context.bf16
        probes_before = self.oracle.probes if self.oracle is not None else 0
        searches_before = self.pool.stats.searches if self.pool is not None else 0

        tick = time.perf_counter()
        starts = self.draw_starts(step, groups.mine, count=groups.count)
        generators = group_generators(self.context.seed, step, groups.seeds, self.context.device)
        if isinstance(self.opponent, PolicyOpponent):  # the reference opponent samples from the same group streams
            self.opponent.generator = generators
        # task.overlap_rewards: the pool values each position as the rollout reaches it (same searches, same rewards).
        # A pipelined step (`sampler` given) always does: its rollout runs beside the learner, so the engines search
        # rewards while the policy plays instead of idling until the games end (1.33x -> 1.46x the serial step rate
        # with one torch thread and one engine process: docs/benchmarks.md, "Pipelined GRPO steps").
        overlap = (
            (task.overlap_rewards or sampler is not None)
            and "engine_values" in self.reward_needs
            and self.pool is not None
        )
        prefetch = EngineValues(self.pool, task.reward_nodes) if overlap else None
        trajectories = play_trajectories(
            self.model if sampler is None else sampler,
            starts,
            task,
            opponent=self.opponent,
            generator=generators,
            reference=self.reference if config.grpo.uses_kl else None,
            bf16=bf16,
            prefetch=prefetch,
        )
        sample_s = time.perf_counter() - tick
        curriculum_dtz = self.curriculum_max_plies(step)  # the limit these starts were drawn under
        self._update_curriculum(trajectories)

        tick = time.perf_counter()
        sources = RewardSources(tablebase=self.oracle, pool=self.pool, prefetched=prefetch)
        # Each reward of the run on the same trajectories, then their weighted sum per ply (one of weight 1: itself).
        scored = {item.name: item.reward.function(trajectories, sources, task) for item in self.rewards}
        step_rewards = combine([(item.weight, scored[item.name].rewards) for item in self.rewards])
        evaluations = sum(part.evaluations for part in scored.values())
        learner_rewards = step_rewards
        if (
            task.sibling_moves
        ):  # each ply's regret against its siblings' at the same position (TrajectoryConfig.sibling_moves)
            assert self.oracle is not None
            baselines = sibling_baselines(trajectories, self.oracle, shaping=task.shaping)
            learner_rewards = torch.where(trajectories.mask, step_rewards - baselines, torch.zeros_like(step_rewards))
        reward_s = time.perf_counter() - tick

        batch = to_rollout_batch(trajectories, learner_rewards, task.supervision)  # the learner computes its advantages
        learn_temperature = config.debug_learn_temperature or task.temperature
        forward = make_forward(
            self.learner_model,
            trajectories,
            temperature=learn_temperature,
            bf16=bf16,
            reference=self.reference if config.grpo.exact_kl_term else None,
        )
        # Pipelined: the first-minibatch ratio check runs on the weights that sampled (`rl.optimize`'s behaviour_forward).
        behaviour = (
            None if sampler is None else make_forward(sampler, trajectories, temperature=learn_temperature, bf16=bf16)
        )

        mask = trajectories.mask
        # The step's rows and plies over every rank (the ranks step together).
        rows, plies = self.context.parallel.sum([trajectories.num_rows, int(mask.sum())])
        metrics = {
            "entropy/mean": float(trajectories.entropy[mask].mean()),
            "entropy/ln_legal": float(trajectories.ln_legal[mask].mean()),
            "rollout/positions": float(groups.count),
            "rollout/curriculum_max_dtz": float(curriculum_dtz or 0),
            "rollout/rows": float(rows),
            "rollout/plies": float(plies),
            "rollout/unique_positions": float(trajectories.tokens.shape[0]),
            "reward/step_mean": float(step_rewards[mask].mean()),
            "perf/sample_s": sample_s,
            "perf/policy_s": trajectories.timings.get("policy_s", 0.0),
            "perf/opponent_s": trajectories.timings.get("opponent_s", 0.0),
            "perf/reward_s": reward_s,
        }
        # The outcome metrics read the exact tablebase reward's own plies when the run has it (its DTZ-optimal rate),
        # else the combined reward's sum per row.
        exact = scored.get("tablebase")
        metrics.update(
            outcome_metrics(
                trajectories,
                step_rewards if exact is None else exact.rewards,
                "combined" if exact is None else "tablebase",
                shaping=task.shaping,
                tablebase_opponent=task.opponent == "tablebase",
                regret=task.regret,
            )
        )
        for (
            name,
            part,
        ) in scored.items():  # each reward of the run by name, over the valid plies, beside reward/step_mean
            metrics.update(reward_metrics(name, part.rewards[mask]))
        if task.sibling_moves:
            metrics["reward/sibling_regret"] = float(baselines[mask].mean())
            metrics["reward/regret_vs_siblings"] = float(learner_rewards[mask].mean())
        if trajectories.exact_kl is not None:
            metrics["kl/exact"] = float(trajectories.exact_kl[mask].mean())
        if self.oracle is not None:
            metrics["perf/tablebase_probes"] = float(self.oracle.probes - probes_before)
        if self.pool is not None:
            metrics["perf/engine_searches"] = float(self.pool.stats.searches - searches_before)
            metrics["perf/engine_evals_per_s"] = evaluations / max(reward_s, 1e-9)
            metrics["perf/engine_retries"] = float(self.pool.stats.retries)
            metrics["perf/engine_failures"] = float(self.pool.stats.failures)
        return TaskRollout(
            batch,
            forward,
            metrics,
            samples=int(plies),
            rollout_s=sample_s + reward_s,
            row_groups=trajectories.row_start,
            behaviour_forward=behaviour,
        )

    # -- evaluation ---------------------------------------------------------------------------------

    @property
    def evaluates(self) -> bool:
        return self._held_out is not None or bool(self.config.eval.offline_positions or self.config.eval.extra)

    def evaluate(self, step: int, out_dir: Path) -> dict[str, float]:
        """Held-out evaluation of the current policy at argmax (module docstring), and the evaluations of
        ``eval.extra``, each through the registry; writes out_dir/step_NNNNNN_*.json."""
        config, seed = self.config.eval, self.config.run.seed
        self.wait_for_rollout()  # a pipelined next rollout uses the pool and the tables: let it finish first
        metrics: dict[str, float] = {}
        if self._held_out is not None:
            assert self.oracle is not None
            endgame = EndgameEvalConfig(
                material=self.config.positions[len(ENDGAME_PREFIX) :],
                positions=config.positions,
                seed=seed,
                colours=self.config.endgame_colours,
                max_moves=config.max_moves,
                syzygy_path=self.config.engine.syzygy_path,  # an endgame run has its tables (the oracle's)
                baselines=config.baselines and step == 0,  # the random mover, once: eval/random_*
                baseline_players=["random"],
            )
            self.eval_items["endgame"] = self._held_out  # never drawn for training (`EndgameStarts.hold_out`)
            metrics.update(self.held_out_evaluation("endgame", endgame, step, out_dir, tablebase=self.oracle))
        elif config.offline_positions:
            metrics.update(
                self.offline_evaluation(
                    step,
                    out_dir,
                    self.pool,
                    config.offline_positions,
                    config.max_offline_positions,
                    config.nodes,
                    config.resamples,
                )
            )
        metrics.update(self.extra_evaluations(config.extra, step, out_dir, pool=self.pool))
        return metrics

    # -- presentation -------------------------------------------------------------------------------

    def progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        return postfix(
            row,
            (
                ("rollout/mate_rate", "mate", ".3f"),
                ("reward/mean", "reward_mean", ".3f"),
                ("eval/mate_rate", "heldout_mate", ".3f"),
                ("eval/esl", "heldout_esl", ".3f"),
            ),
        )

    def eval_line(self, step: int, row: dict[str, Any]) -> str | None:
        return policy_eval_line(step, row)

    def summary(self) -> list[str]:
        out = self.context.run_dir / "eval"
        offline = EVALUATIONS["offline"].step_files(out)
        if len(offline) >= 2:
            return [f"paired before/after: chessgrpo eval compare {offline[0]} {offline[-1]}"]
        if any(EVALUATIONS["endgame"].step_files(out)):
            return [f"held-out endgame results: {out}/step_NNNNNN_endgame.json"]
        return []
