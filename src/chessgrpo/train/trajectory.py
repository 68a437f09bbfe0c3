"""The GRPO training loop over multi-ply trajectory groups (`tasks.trajectory`), e.g. the endgame curriculum.

One step, top to bottom (`TrajectoryTrainer.train_step`):

1. **sample**: draw B fresh start positions (seeded by seed, step and rank; endgame positions are
   generated uniformly among the won ones and never include a held-out evaluation position),
   play G games from each, T own plies at most, against the configured opponent, recording the
   behaviour log-prob, exact entropy and (when the KL is used) the reference log-prob of every ply;
2. **reward**: per own ply from the tablebase (exact) or the engine pool (win probability);
3. **learn**: `rl.optimize` with L = T and the mask: outcome supervision (rewards [N]), process
   supervision (rewards [N, T]) or per-step advantages (`tasks.trajectory.step_advantages`); the
   first-minibatch ratio check, clipping, KL as in the GRPO core.

The reference policy is the starting checkpoint (or the random initialisation), frozen. Every
forward runs in eval mode (no dropout). Checkpoints hold the model, the optimizer, the KL
controller, the sampling generator, the global RNG states and the step, and start positions are a
function of (seed, step, rank), so ``--resume`` continues bitwise identically to a straight run.

Evaluation (every `eval.every` steps, at the start and at the end):

- endgame runs (``positions: endgame:KQvK``): the policy at argmax plays the strong side of
  `eval.positions` held-out won start positions for up to `eval.max_moves` own moves against the
  tablebase-perfect defender (`tasks.endgame.evaluate_endgame`): ``eval/mate_rate`` with a Wilson
  interval, ``eval/dtz_optimal_rate``, ``eval/moves_to_mate`` vs ``eval/optimal_moves_to_mate``,
  ``eval/win_lost_rate``. At step 0 the random mover is evaluated too (``eval/random_*``); the
  tablebase itself mates every position in ``eval/optimal_moves_all`` moves on average.
- other runs: the held-out offline evaluation of ``chessgrpo eval offline`` (ESL, top-1, blunder
  rate with bootstrap intervals) on `eval.offline_positions`.

Results go to RUN_DIR/eval/step_NNNNNN_{endgame,offline}.json.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from chessgrpo.board.endgames import COLOURS
from chessgrpo.config import ConfigError, EngineConfig, RunConfig, to_dict
from chessgrpo.models.policy import ActionPolicy, load_policy, save_policy
from chessgrpo.rl import GRPOConfig, KLController, optimize
from chessgrpo.tasks.endgame import (
    EndgameStarts,
    TablebaseOracle,
    evaluate_endgame,
    policy_picker,
    random_picker,
)
from chessgrpo.tasks.move_group import StartPositions
from chessgrpo.tasks.trajectory import (
    Opponent,
    PolicyOpponent,
    StockfishOpponent,
    TablebaseOpponent,
    TrajectoryConfig,
    engine_step_rewards,
    make_forward,
    play_trajectories,
    tablebase_step_rewards,
    to_rollout_batch,
)
from chessgrpo.track.metrics import METRICS_FILE, MetricsWriter
from chessgrpo.train.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_trainer_state,
    restore_rng_state,
    save_checkpoint,
)
from chessgrpo.train.common import (
    policy_optimizer,
    rank_and_world_size,
    write_json_atomic,
)
from chessgrpo.train.grpo import GRPOResult, Progress
from chessgrpo.train.pretrain import ModelConfig
from chessgrpo.train.schedule import WarmupCosine

logger = logging.getLogger(__name__)

ENDGAME_PREFIX = "endgame:"


@dataclasses.dataclass
class TrajectoryEvalConfig:
    """Periodic held-out evaluation during trajectory GRPO (module docstring)."""

    every: int = 50
    """Evaluate every this many steps (0 = only at the start and the end)."""
    at_start: bool = True
    """Also evaluate the starting policy (step 0), so every run has its own before/after."""
    positions: int = 200
    """Endgame runs: held-out won start positions (generated once, never drawn for training)."""
    max_moves: int = 50
    """Endgame runs: own moves allowed to mate against the perfect defender."""
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

    def __post_init__(self) -> None:
        if self.every < 0 or self.positions < 1 or self.max_moves < 1 or self.max_offline_positions < 1 or self.nodes < 1:
            raise ValueError("need every >= 0, positions >= 1, max_moves >= 1, max_offline_positions >= 1, nodes >= 1")
        if self.resamples < 10:
            raise ValueError(f"resamples must be >= 10, got {self.resamples}")


@dataclasses.dataclass
class TrajectoryTrainConfig:
    """`chessgrpo train` with ``kind: trajectory``: GRPO over multi-ply trajectory groups."""

    kind: str = "trajectory"
    """Which trainer reads this config (`chessgrpo.commands.train.TRAINERS`); this one is trajectory."""
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="trajectory"))
    init_checkpoint: str | None = None
    """Starting policy (checkpoint or run directory), also the frozen reference; null = randomly initialised `model`."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy's shape when init_checkpoint is null."""
    positions: str = "endgame:KQvK"
    """Start positions: ``endgame:<material>`` (uniform won positions of e.g. KQvK, KRvK, KBBvK, KBNvK from the
    Syzygy tables in engine.syzygy_path) or any `tasks.move_group.StartPositions` source (dataset dir, .parquet,
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
    task: TrajectoryConfig = dataclasses.field(default_factory=TrajectoryConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    engine: EngineConfig = dataclasses.field(default_factory=lambda: EngineConfig(cache=False))
    """Stockfish pool (started only for engine rewards, the stockfish opponent or offline evaluation) and
    engine.syzygy_path, the Syzygy tables (for tablebase rewards/opponent and endgame positions)."""
    eval: TrajectoryEvalConfig = dataclasses.field(default_factory=TrajectoryEvalConfig)
    steps: int = 100
    """Training steps (one rollout batch and `grpo.num_iterations` epochs over it per step)."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    head_lr: float | None = None
    """Separate peak learning rate for the policy head (null = lr)."""
    freeze_layers: int = 0
    """Freeze the embeddings and the first N transformer blocks (0 = train everything)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay on matrices."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW (beta1, beta2)."""
    warmup_steps: int = 5
    """Linear learning-rate warmup steps."""
    min_lr_ratio: float = 1.0
    """Cosine floor as a fraction of lr (1.0 = constant after warmup)."""
    bf16: bool = False
    """bfloat16 autocast for policy forwards (the ratio check then uses grpo.ratio_tolerance_bf16)."""
    debug_learn_temperature: float | None = None
    """DEBUG: learn at this temperature instead of task.temperature, to watch the ratio check fire."""
    log_every: int = 1
    """Write a metrics row every this many steps."""
    checkpoint_every: int = 50
    """Checkpoint every this many steps (0 = only at the end); the last step is always saved."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk, newest first."""
    stop_at: int | None = None
    """Stop this invocation after this step (checkpointed); `--resume` continues to `steps`."""
    device: str = "cpu"
    """Torch device: cpu, cuda, cuda:1, ..."""
    threads: int = 0
    """Torch CPU threads (0 = torch's default); bitwise resume needs the same value."""

    def __post_init__(self) -> None:
        if self.kind != "trajectory":
            raise ConfigError(f"config key kind must be trajectory for this trainer, got {self.kind!r}")
        for name in ("steps", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key {name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "threads", "freeze_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key {name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or (self.head_lr is not None and self.head_lr <= 0) or self.weight_decay < 0:
            raise ConfigError(f"need lr > 0, head_lr > 0 or null, weight_decay >= 0; got {self.lr}, {self.head_lr}, {self.weight_decay}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"config key min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.stop_at is not None and self.stop_at < 1:
            raise ConfigError(f"config key stop_at must be >= 1 or null, got {self.stop_at}")
        if self.curriculum_start_dtz is not None and (self.curriculum_start_dtz < 1 or self.curriculum_dtz_per_step < 0):
            raise ConfigError("config keys curriculum_start_dtz must be >= 1 (or null) and curriculum_dtz_per_step >= 0")
        if self.endgame_colours not in COLOURS:
            raise ConfigError(f"config key endgame_colours must be one of {list(COLOURS)}, got {self.endgame_colours!r}")
        if self.debug_learn_temperature is not None and self.debug_learn_temperature <= 0:
            raise ConfigError(f"config key debug_learn_temperature must be > 0 or null, got {self.debug_learn_temperature}")
        needs_tables = self.is_endgame or self.task.reward == "tablebase" or self.task.opponent == "tablebase"
        if needs_tables and not self.engine.syzygy_path:
            raise ConfigError("endgame positions and tablebase rewards/opponents need engine.syzygy_path")
        if self.task.supervision == "critic" and not (self.task.reward == "tablebase" and self.task.regret):
            raise ConfigError("task.supervision: critic needs task.reward: tablebase and task.regret: true (rewards relative to the exact value)")
        if self.task.reward == "tablebase" and not self.is_endgame:
            logger.warning("tablebase rewards with positions %r: every position must be covered by the tables", self.positions)

    @property
    def is_endgame(self) -> bool:
        return self.positions.startswith(ENDGAME_PREFIX)


RESUMABLE_KEYS = frozenset(
    {"steps", "stop_at", "log_every", "checkpoint_every", "keep_checkpoints", "threads", "eval.every", "engine.processes",
     "engine.timeout_s", "engine.cache_path", "engine.path"}
)  # fmt: skip
"""Keys a resumed run may change (they do not touch the training math)."""


class TrajectoryTrainer:
    """Set up a trajectory GRPO run (fresh or resumed), then `train`. Construction writes nothing."""

    def __init__(self, config: TrajectoryTrainConfig, *, resume: bool = False):
        self.config = config
        self.run_dir = config.run.directory
        self.rank, self.world_size = rank_and_world_size()
        try:
            self.device = torch.device(config.device)
        except RuntimeError:
            raise ValueError(f"config key device: {config.device!r} is not a torch device") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device!r} requested but CUDA is not available (use device=cpu)")
        if config.threads:
            torch.set_num_threads(config.threads)
        task = config.task

        needs_tables = config.is_endgame or task.reward == "tablebase" or task.opponent == "tablebase"
        self.oracle = TablebaseOracle(config.engine.syzygy_path) if needs_tables else None
        self.endgame: EndgameStarts | None = None
        self.start_positions: StartPositions | None = None
        self._held_out: list | None = None
        if config.is_endgame:
            assert self.oracle is not None
            self.endgame = EndgameStarts(config.positions[len(ENDGAME_PREFIX):], self.oracle, colours=config.endgame_colours)
            # Held out first, so that no training draw can ever contain an evaluation position.
            self._held_out = self.endgame.hold_out(config.eval.positions, seed=config.run.seed)
        else:
            self.start_positions = StartPositions.from_source(
                config.positions, split=config.positions_split, max_positions=config.max_start_positions, seed=config.run.seed
            )  # fmt: skip

        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            raise FileNotFoundError(f"no checkpoint to resume under {str(self.run_dir / 'checkpoints')!r}")
        torch.manual_seed(config.run.seed)
        if config.init_checkpoint:
            self.reference = load_policy(config.init_checkpoint, device=self.device)
        else:
            self.reference = ActionPolicy(config.model.policy_config()).to(self.device)
        self.reference.eval().requires_grad_(False)
        self.model = copy.deepcopy(self.reference).requires_grad_(True)
        self.model.eval()  # eval mode for every RL forward: dropout off (invariant 2)
        self.optimizer = policy_optimizer(self.model, config)
        self.kl_controller = KLController.from_config(config.grpo)
        self.generator = torch.Generator(device=self.device).manual_seed(config.run.seed * 1_000_003 + self.rank)
        self.schedule = WarmupCosine(config.lr, config.warmup_steps, config.steps, config.min_lr_ratio)
        self.step = 0
        if checkpoint is not None:
            state = load_trainer_state(checkpoint)
            self.model.load_state_dict(load_policy(checkpoint, device=self.device).state_dict())
            self.optimizer.load_state_dict(state["optimizer"])
            self.kl_controller.load_state_dict(state["kl_controller"])
            self.generator.set_state(state["generator"])
            self.step = int(state["step"])
            restore_rng_state(state["rng"])
            logger.info("resumed %s from %s (step %d)", self.run_dir, checkpoint, self.step)
        self.last_checkpoint: Path | None = checkpoint

        needs_pool = task.reward == "engine" or task.opponent == "stockfish" or (
            not config.is_endgame and config.eval.offline_positions is not None
        )
        self.pool = None
        if needs_pool:
            from chessgrpo.engine import EnginePool

            self.pool = EnginePool.from_config(config.engine)
        self.opponent: Opponent | None = self._make_opponent()
        self._stop_requested = False
        self._offline_positions: list | None = None

    def _make_opponent(self) -> Opponent | None:
        kind = self.config.task.opponent
        if kind == "self":
            return None
        if kind == "reference":
            return PolicyOpponent(self.reference, self.config.task.temperature, self.generator)
        if kind == "stockfish":
            assert self.pool is not None
            return StockfishOpponent(self.pool, self.config.task.opponent_nodes)
        assert self.oracle is not None
        return TablebaseOpponent(self.oracle)

    # --------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.oracle is not None:
            self.oracle.close()

    def __enter__(self) -> TrajectoryTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request_stop(self) -> None:
        """Finish the current step, checkpoint and return from `train`."""
        self._stop_requested = True

    def _set_lr(self) -> float:
        lr = self.schedule.lr(self.step)
        head_scale = (self.config.head_lr / self.config.lr) if self.config.head_lr else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = lr * head_scale if group.get("head") else lr
        return lr

    @property
    def _uses_kl(self) -> bool:
        grpo = self.config.grpo
        return grpo.kl_coef > 0 or grpo.kl_schedule == "adaptive"

    @property
    def curriculum_max_plies(self) -> int | None:
        """The DTZ limit (plies) of this step's endgame start positions, None without a curriculum."""
        start = self.config.curriculum_start_dtz
        if start is None:
            return None
        return int(start + self.step * self.config.curriculum_dtz_per_step)

    def draw_starts(self) -> list:
        count, seed = self.config.task.positions_per_step, self.config.run.seed
        if self.endgame is not None:
            return self.endgame.draw(count, seed=seed, step=self.step, rank=self.rank, max_plies=self.curriculum_max_plies)
        assert self.start_positions is not None
        return self.start_positions.draw(count, seed=seed, step=self.step, rank=self.rank)

    def train_step(self) -> dict[str, float]:
        """One step: sample trajectories, reward every own ply, learn. Returns the step's metrics."""
        config, task = self.config, self.config.task
        lr = self._set_lr()
        probes_before = self.oracle.probes if self.oracle is not None else 0
        searches_before = self.pool.stats.searches if self.pool is not None else 0

        tick = time.perf_counter()
        starts = self.draw_starts()
        trajectories = play_trajectories(
            self.model, starts, task, opponent=self.opponent, generator=self.generator,
            reference=self.reference if self._uses_kl else None, bf16=config.bf16,
        )  # fmt: skip
        sample_s = time.perf_counter() - tick

        tick = time.perf_counter()
        evaluations = 0
        if task.reward == "tablebase":
            assert self.oracle is not None
            step_rewards = tablebase_step_rewards(trajectories, self.oracle, shaping=task.shaping, regret=task.regret)
        else:
            assert self.pool is not None
            step_rewards, evaluations = engine_step_rewards(trajectories, self.pool, nodes=task.reward_nodes)
        reward_s = time.perf_counter() - tick

        tick = time.perf_counter()
        batch = to_rollout_batch(
            trajectories, step_rewards, task.supervision, estimator=config.grpo.advantage_estimator,
            epsilon=config.grpo.advantage_epsilon,
        )  # fmt: skip
        learn_temperature = config.debug_learn_temperature or task.temperature
        forward = make_forward(self.model, trajectories, temperature=learn_temperature, bf16=config.bf16)
        metrics = optimize(
            batch, forward, self.optimizer, config.grpo, self.kl_controller,
            parameters=[p for p in self.model.parameters() if p.requires_grad], generator=self.generator, bf16=config.bf16,
        )  # fmt: skip
        learn_s = time.perf_counter() - tick
        self.step += 1

        mask = trajectories.mask
        plies = int(mask.sum())
        step_s = sample_s + reward_s + learn_s
        metrics.update(
            {
                "lr": lr,
                "entropy/mean": float(trajectories.entropy[mask].mean()),
                "entropy/ln_legal": float(trajectories.ln_legal[mask].mean()),
                "rollout/positions": float(len(starts)),
                "rollout/curriculum_max_dtz": float(self.curriculum_max_plies or 0),
                "rollout/rows": float(trajectories.num_rows),
                "rollout/plies": float(plies),
                "rollout/unique_positions": float(trajectories.tokens.shape[0]),
                "reward/step_mean": float(step_rewards[mask].mean()),
                "perf/sample_s": sample_s,
                "perf/reward_s": reward_s,
                "perf/learn_s": learn_s,
                "perf/step_s": step_s,
                "perf/samples_per_s": plies / max(step_s, 1e-9),
            }
        )
        metrics.update(
            _outcome_metrics(
                trajectories, step_rewards, task.reward, shaping=task.shaping, tablebase_opponent=task.opponent == "tablebase",
                regret=task.regret,
            )
        )
        if trajectories.exact_kl is not None:
            metrics["kl/exact"] = float(trajectories.exact_kl[mask].mean())
        if self.oracle is not None:
            metrics["perf/tablebase_probes"] = float(self.oracle.probes - probes_before)
        if self.pool is not None:
            metrics["perf/engine_searches"] = float(self.pool.stats.searches - searches_before)
            metrics["perf/engine_evals_per_s"] = evaluations / max(reward_s, 1e-9)
            metrics["perf/engine_retries"] = float(self.pool.stats.retries)
            metrics["perf/engine_failures"] = float(self.pool.stats.failures)
        return metrics

    # --------------------------------------------------------------------------------------------
    # Evaluation

    def evaluate(self) -> dict[str, float]:
        """Held-out evaluation of the current policy at argmax (module docstring); writes RUN_DIR/eval/*.json."""
        out_dir = self.run_dir / "eval"
        out_dir.mkdir(parents=True, exist_ok=True)
        config = self.config.eval
        metrics: dict[str, float] = {}
        if self._held_out is not None:
            assert self.oracle is not None
            tick = time.perf_counter()
            result = evaluate_endgame(policy_picker(self.model), self._held_out, self.oracle, max_moves=config.max_moves)
            metrics.update(result.metrics("eval/"))
            payload: dict[str, Any] = {"step": self.step, "positions": self.config.positions, "policy": result.to_json(),
                                       "starts": [board.fen() for board in self._held_out]}  # fmt: skip
            if config.baselines and self.step == 0:
                baseline = evaluate_endgame(random_picker(self.config.run.seed), self._held_out, self.oracle, max_moves=config.max_moves)
                metrics.update(baseline.metrics("eval/random_"))
                payload["random"] = baseline.to_json()
            metrics["perf/eval_s"] = time.perf_counter() - tick
            write_json_atomic(out_dir / f"step_{self.step:06d}_endgame.json", payload)
        elif config.offline_positions:
            from chessgrpo.eval.offline import evaluate_offline
            from chessgrpo.eval.players import PolicyPlayer
            from chessgrpo.eval.positions import load_eval_positions

            assert self.pool is not None
            if self._offline_positions is None:
                self._offline_positions = load_eval_positions(
                    config.offline_positions, config.max_offline_positions, self.config.run.seed, pool=self.pool, nodes=config.nodes
                )  # fmt: skip
            player = PolicyPlayer(self.model, temperature=0.0, name=f"{self.run_dir} step {self.step}")
            result = evaluate_offline(
                player, self._offline_positions, self.pool, nodes=config.nodes, resamples=config.resamples, seed=self.config.run.seed
            )  # fmt: skip
            for name in ("top1", "esl", "blunder_rate"):
                interval = getattr(result, name)
                metrics.update({f"eval/{name}": interval.value, f"eval/{name}_low": interval.low, f"eval/{name}_high": interval.high})
            payload = {**result.to_json(), "step": self.step, "records": {"player": [r.to_json() for r in result.records]}}
            write_json_atomic(out_dir / f"step_{self.step:06d}_offline.json", payload)
        return metrics

    @property
    def _evaluating(self) -> bool:
        return self._held_out is not None or bool(self.config.eval.offline_positions)

    # --------------------------------------------------------------------------------------------
    # Checkpoints and the loop

    def _checkpoint(self) -> Path:
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
            "generator": self.generator.get_state(),
            "rng": capture_rng_state(),
            "config": to_dict(self.config),
        }
        self.last_checkpoint = save_checkpoint(
            self.run_dir, self.step, save_model=lambda d: save_policy(self.model, d), trainer_state=state,
            keep=self.config.keep_checkpoints,
        )  # fmt: skip
        return self.last_checkpoint

    def train(self, progress: Progress | None = None) -> GRPOResult:
        """Train from the current step to `steps` (or `stop_at`)."""
        config = self.config
        end = config.steps if config.stop_at is None else min(config.steps, config.stop_at)
        resume_step = self.step if self.last_checkpoint is not None else None
        eval_metrics: dict[str, float] | None = None
        with MetricsWriter(self.run_dir / METRICS_FILE, resume_step=resume_step) as writer:
            if self._evaluating and config.eval.at_start and self.step == 0:
                eval_metrics = self.evaluate()
                row = writer.log(0, eval_metrics)
                if progress is not None:
                    progress(0, row)
            window: list[dict[str, float]] = []
            while self.step < end and not self._stop_requested:
                values = self.train_step()
                bad = {k: v for k, v in values.items() if not math.isfinite(v) and k != "ratio/first_max_abs_dev"}
                if bad:
                    raise RuntimeError(f"step {self.step}: non-finite metrics {bad}; nothing saved for this step")
                window.append(values)
                last = self.step == end or self._stop_requested
                row_values: dict[str, float] = {}
                if self.step % config.log_every == 0 or last:
                    keys = {key for w in window for key in w}
                    row_values = {key: sum(w[key] for w in window if key in w) / sum(key in w for w in window) for key in keys}
                    window = []
                if self._evaluating and ((config.eval.every and self.step % config.eval.every == 0) or self.step == config.steps):
                    eval_metrics = self.evaluate()
                    row_values.update(eval_metrics)
                row = writer.log(self.step, row_values) if row_values else None
                if (config.checkpoint_every and self.step % config.checkpoint_every == 0) or last:
                    self._checkpoint()
                if progress is not None:
                    progress(self.step, row)
        if self.last_checkpoint is None:
            self._checkpoint()
        return GRPOResult(step=self.step, finished=self.step >= config.steps, checkpoint=self.last_checkpoint, eval_metrics=eval_metrics)


def _outcome_metrics(
    trajectories, step_rewards: torch.Tensor, reward: str, *, shaping: float = 0.0, tablebase_opponent: bool = False,
    regret: bool = False,
) -> dict[str, float]:
    """rollout/length, rollout/{mate,mated,draw,horizon}_rate, reward/outcome and, for tablebase rewards,
    rollout/win_lost_rate and (against the tablebase) rollout/dtz_optimal_rate.

    The tablebase outcome (+1 mate, -1 mated or drawn, 0 undecided) assumes the row's mover starts
    winning, as in the endgame curriculum."""
    outcomes = trajectories.outcomes()
    n = max(len(outcomes), 1)
    metrics = {
        "rollout/length": float(trajectories.lengths.float().mean()),
        "rollout/mate_rate": sum(o == "mate" for o in outcomes) / n,
        "rollout/mated_rate": sum(o == "mated" for o in outcomes) / n,
        "rollout/draw_rate": sum(o.startswith("draw:") for o in outcomes) / n,
        "rollout/horizon_rate": sum(o == "horizon" for o in outcomes) / n,
    }
    if reward == "tablebase":
        # Outcome of a row: +1 mate, -1 the mover's win given away / mated, 0 otherwise (undecided at the horizon).
        scores = [1.0 if o == "mate" else -1.0 if (o == "mated" or o.startswith("draw:")) else 0.0 for o in outcomes]
        metrics["reward/outcome"] = sum(scores) / n
        metrics["rollout/win_lost_rate"] = sum(s < 0 for s in scores) / n
        if shaping > 0 and tablebase_opponent:
            # Against the perfect defender a ply earns >= shaping exactly when it mates or shortens DTZ by 2 plies.
            valid = step_rewards[trajectories.mask]
            threshold = -1e-6 if regret else shaping - 1e-6  # regret: an optimal ply scores 0
            metrics["rollout/dtz_optimal_rate"] = float((valid >= threshold).float().mean())
    else:
        # The final expected score for the mover is the start value plus the summed step rewards.
        metrics["reward/outcome"] = float(torch.where(trajectories.mask, step_rewards, torch.zeros_like(step_rewards)).sum(1).mean())
    return metrics


CONFIG_CLASS = TrajectoryTrainConfig
TRAINER_CLASS = TrajectoryTrainer
