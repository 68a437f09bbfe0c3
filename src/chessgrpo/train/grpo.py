"""The GRPO training loop for the action policy with one-move groups (`tasks.move_group`).

One step, top to bottom (`GRPOTrainer.train_step`):

1. **sample**: draw B fresh start positions (seeded by seed, step and rank), sample G moves each
   from the current policy at the rollout temperature, recording behaviour and reference
   log-probs, exact entropy and exact KL to the reference;
2. **reward**: value every distinct sampled move with the engine pool (cached);
3. **learn**: `rl.optimize` (advantages, clipped surrogate, KL, PPO epochs over minibatches, the
   first-minibatch ratio check, gradient clipping).

The reference policy is the starting checkpoint, frozen. Every forward of the policy and the
reference runs in eval mode (no dropout, ARCHITECTURE invariant 2); the learner recomputes
log-probs with the same `log_probs`, temperature and masks as the sampler (invariant 1).

Every `eval_every` steps the policy is evaluated with the same code as ``chessgrpo eval``
(held-out ESL, top-1 and blunder rate with bootstrap intervals; puzzle first-move accuracy with
Wilson intervals); the full results go to RUN_DIR/eval/step_NNNNNN_{offline,puzzles}.json, in
the format ``chessgrpo eval compare`` reads.

A checkpoint holds the model, the optimizer, the KL controller, the sampling generator and the
global RNG states and the step; the start positions of a step are a function of (seed, step,
rank), so ``--resume`` continues bitwise identically to a straight run on CPU.

Data parallelism: seeding and position draws already depend on the rank (`RANK`,
`WORLD_SIZE` from torchrun's environment); averaging gradients with DDP is the missing piece.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from chessgrpo.config import ConfigError, EngineConfig, RunConfig, to_dict
from chessgrpo.models.policy import ActionPolicy, load_policy, save_policy
from chessgrpo.rl import GRPOConfig, KLController, optimize
from chessgrpo.tasks.move_group import (
    MoveGroupConfig,
    StartPositions,
    make_forward,
    sample_groups,
    score_groups,
    to_rollout_batch,
)
from chessgrpo.track.backends import TRACKING_KEYS, TrackingConfig
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
from chessgrpo.train.pretrain import ModelConfig
from chessgrpo.train.schedule import WarmupCosine

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class GRPOEvalConfig:
    """Periodic held-out evaluation during GRPO (same code as `chessgrpo eval offline|puzzles`)."""

    every: int = 50
    """Evaluate every this many steps (0 = only at the start and the end)."""
    at_start: bool = True
    """Also evaluate the starting policy (step 0), so every run has its own before/after."""
    positions: str | None = "data/tiny"
    """Held-out positions: a dataset directory (its test split), .parquet, .epd/.fen/.txt or .pgn; null = skip."""
    max_positions: int = 1000
    """Positions sampled (seeded) from `positions`; the same ones at every evaluation (paired)."""
    nodes: int = 2000
    """Stockfish nodes for labelling and valuing moves (as `chessgrpo eval offline`)."""
    puzzles: str | None = "../shared/data/lichess_puzzles_dev.csv"
    """Lichess puzzle CSV for first-move accuracy and solve rate; null = skip."""
    max_puzzles: int = 500
    """Puzzles sampled (seeded) from `puzzles`."""
    resamples: int = 2000
    """Bootstrap resamples of the offline intervals."""

    def __post_init__(self) -> None:
        if self.every < 0 or self.max_positions < 1 or self.nodes < 1 or self.max_puzzles < 1 or self.resamples < 10:
            raise ValueError("need every >= 0, max_positions >= 1, nodes >= 1, max_puzzles >= 1, resamples >= 10")


@dataclasses.dataclass
class GRPOTrainConfig:
    """`chessgrpo train`: GRPO of the action policy on one-move groups with engine rewards."""

    kind: str = "move_group"
    """Which trainer reads this config (`chessgrpo.commands.train.TRAINERS`); this one is move_group."""
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="grpo"))
    init_checkpoint: str | None = "runs/pretrain_tiny"
    """Starting policy (checkpoint or run directory); it is also the frozen reference. null = from scratch (`model`)."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy's shape when training from scratch (ignored with init_checkpoint)."""
    positions: str = "data/tiny"
    """Start positions: a dataset directory (its `positions_split`), .parquet, .epd/.fen/.txt, .pgn or random:N."""
    positions_split: str = "train"
    """Split of a dataset directory to draw start positions from (keep evaluation on the other)."""
    max_start_positions: int | None = None
    """Keep at most this many start positions (a seeded sample); null = all."""
    start_win_prob_range: tuple[float, float] | None = None
    """Datasets only: keep start positions whose best move's labelled win probability is in [low, high]
    (e.g. [0.05, 0.95]); decided positions give every move the same reward. null = keep all."""
    task: MoveGroupConfig = dataclasses.field(default_factory=MoveGroupConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """The Stockfish pool for rewards and evaluation (task.reward_nodes / eval.nodes set the limits)."""
    eval: GRPOEvalConfig = dataclasses.field(default_factory=GRPOEvalConfig)
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    """Metrics backends: RUN_DIR/metrics.jsonl always; tensorboard and wandb when listed."""
    steps: int = 100
    """Training steps (one rollout batch and `grpo.num_iterations` epochs over it per step)."""
    lr: float = 1e-4
    """Peak AdamW learning rate."""
    head_lr: float | None = None
    """Separate peak learning rate for the policy head (null = lr)."""
    freeze_layers: int = 0
    """Freeze the embeddings and the first N transformer blocks (0 = train everything)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay on matrices (0: the KL term, not decay, keeps the policy near its start)."""
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
        if self.kind != "move_group":
            raise ConfigError(f"config key kind must be move_group for this trainer, got {self.kind!r}")
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
        if self.start_win_prob_range is not None and not 0.0 <= self.start_win_prob_range[0] <= self.start_win_prob_range[1] <= 1.0:
            raise ConfigError(f"config key start_win_prob_range must be [low, high] within [0, 1], got {self.start_win_prob_range}")
        if self.debug_learn_temperature is not None and self.debug_learn_temperature <= 0:
            raise ConfigError(f"config key debug_learn_temperature must be > 0 or null, got {self.debug_learn_temperature}")


RESUMABLE_KEYS = frozenset(
    {"steps", "stop_at", "log_every", "checkpoint_every", "keep_checkpoints", "threads", "eval.every", "engine.processes",
     "engine.timeout_s", "engine.cache_path", "engine.path"} | TRACKING_KEYS
)  # fmt: skip
"""Keys a resumed run may change (they do not touch the training math)."""


@dataclasses.dataclass
class GRPOResult:
    step: int
    finished: bool
    checkpoint: Path
    eval_metrics: dict[str, float] | None


Progress = Callable[[int, dict[str, Any] | None], None]


class GRPOTrainer:
    """Set up a GRPO run (fresh or resumed), then `train`. Construction writes nothing."""

    def __init__(self, config: GRPOTrainConfig, *, resume: bool = False):
        from chessgrpo.engine import EnginePool

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

        self.start_positions = StartPositions.from_source(
            config.positions, split=config.positions_split, max_positions=config.max_start_positions, seed=config.run.seed,
            win_prob_range=config.start_win_prob_range,
        )  # fmt: skip
        logger.info("%d start positions from %s", len(self.start_positions), config.positions)

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
        self.pool = EnginePool.from_config(config.engine)
        self._stop_requested = False
        self._eval_positions: list | None = None
        self._puzzles: list | None = None

    # --------------------------------------------------------------------------------------------

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> GRPOTrainer:
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

    def train_step(self) -> dict[str, float]:
        """One GRPO step: sample, reward, learn. Returns the step's metrics."""
        config, task = self.config, self.config.task
        lr = self._set_lr()
        stats_before = dataclasses.replace(self.pool.stats)

        tick = time.perf_counter()
        boards = self.start_positions.draw(task.positions_per_step, seed=config.run.seed, step=self.step, rank=self.rank)
        # The reference forward always runs (one forward of B positions): KL is logged even at kl_coef = 0.
        groups = sample_groups(
            self.model, boards, task.group_size, temperature=task.temperature, generator=self.generator,
            reference=self.reference, bf16=config.bf16,
        )  # fmt: skip
        sample_s = time.perf_counter() - tick

        tick = time.perf_counter()
        scored = score_groups(self.pool, groups, nodes=task.reward_nodes, best_move_values=task.best_move_values)
        rewards = scored.rewards(task.reward)
        reward_s = time.perf_counter() - tick

        tick = time.perf_counter()
        batch = to_rollout_batch(groups, rewards.to(self.device))
        learn_temperature = config.debug_learn_temperature or task.temperature
        forward = make_forward(self.model, groups, temperature=learn_temperature, bf16=config.bf16)
        metrics = optimize(
            batch, forward, self.optimizer, config.grpo, self.kl_controller,
            parameters=[p for p in self.model.parameters() if p.requires_grad], generator=self.generator, bf16=config.bf16,
        )  # fmt: skip
        learn_s = time.perf_counter() - tick
        self.step += 1

        stats = self.pool.stats
        lookups = (stats.cache_hits - stats_before.cache_hits) + (stats.cache_misses - stats_before.cache_misses)
        samples = task.positions_per_step * task.group_size
        unique_moves = torch.tensor([len(set(row)) for row in groups.actions.tolist()], dtype=torch.float32)
        metrics.update(
            {
                "lr": lr,
                "entropy/mean": float(groups.entropy.mean()),
                "entropy/ln_legal": float(groups.ln_legal.mean()),
                "reward/win_prob": float(scored.values.mean()),
                "rollout/unique_moves": float(unique_moves.mean()),
                "rollout/positions": float(len(boards)),
                "perf/sample_s": sample_s,
                "perf/reward_s": reward_s,
                "perf/learn_s": learn_s,
                "perf/step_s": sample_s + reward_s + learn_s,
                "perf/samples_per_s": samples / max(sample_s + reward_s + learn_s, 1e-9),
                "perf/engine_evals_per_s": scored.evaluations / max(reward_s, 1e-9),
                "perf/engine_searches": float(stats.searches - stats_before.searches),
                "perf/cache_hit_rate": (stats.cache_hits - stats_before.cache_hits) / lookups if lookups else 0.0,
                "perf/engine_retries": float(stats.retries),
                "perf/engine_failures": float(stats.failures),
            }
        )
        if groups.exact_kl is not None:
            metrics["kl/exact"] = float(groups.exact_kl.mean())
        if scored.best_values is not None:
            metrics["reward/regret"] = float(scored.regret.mean())
            metrics["reward/esl"] = float(-scored.regret.mean())
            metrics["reward/best_win_prob"] = float(scored.best_values.mean())
        return metrics

    # --------------------------------------------------------------------------------------------
    # Evaluation

    def evaluate(self) -> dict[str, float]:
        """Held-out offline metrics and puzzle accuracy of the current policy (argmax), with intervals.

        Writes RUN_DIR/eval/step_NNNNNN_{offline,puzzles}.json (readable by `chessgrpo eval compare`).
        """
        from chessgrpo.eval.offline import evaluate_offline
        from chessgrpo.eval.players import PolicyPlayer
        from chessgrpo.eval.positions import load_eval_positions
        from chessgrpo.eval.puzzles import read_puzzles, solve_puzzles

        config = self.config.eval
        player = PolicyPlayer(self.model, temperature=0.0, name=f"{self.run_dir} step {self.step}")
        metrics: dict[str, float] = {}
        out_dir = self.run_dir / "eval"
        out_dir.mkdir(parents=True, exist_ok=True)
        if config.positions:
            if self._eval_positions is None:
                self._eval_positions = load_eval_positions(
                    config.positions, config.max_positions, self.config.run.seed, pool=self.pool, nodes=config.nodes
                )
            result = evaluate_offline(
                player, self._eval_positions, self.pool, nodes=config.nodes, resamples=config.resamples, seed=self.config.run.seed
            )
            for name in ("top1", "esl", "blunder_rate"):
                interval = getattr(result, name)
                metrics.update({f"eval/{name}": interval.value, f"eval/{name}_low": interval.low, f"eval/{name}_high": interval.high})
            payload = {**result.to_json(), "step": self.step, "records": {"player": [r.to_json() for r in result.records]}}
            write_json_atomic(out_dir / f"step_{self.step:06d}_offline.json", payload)
        if config.puzzles:
            if self._puzzles is None:
                self._puzzles = list(read_puzzles(config.puzzles, config.max_puzzles, self.config.run.seed).puzzles)
            result = solve_puzzles(player, self._puzzles)
            for name in ("first_move_accuracy", "solve_rate"):
                interval = getattr(result, name)
                key = f"eval/puzzle_{name}"
                metrics.update({key: interval.value, f"{key}_low": interval.low, f"{key}_high": interval.high})
            payload = {**result.to_json(), "step": self.step, "records": {"player": [r.to_json() for r in result.records]}}
            write_json_atomic(out_dir / f"step_{self.step:06d}_puzzles.json", payload)
        return metrics

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
        evaluating = bool(config.eval.positions or config.eval.puzzles)
        with MetricsWriter(
            self.run_dir / METRICS_FILE, resume_step=resume_step, tracking=config.tracking, run_config=to_dict(config)
        ) as writer:
            if evaluating and config.eval.at_start and self.step == 0:
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
                    row_values = {key: sum(w[key] for w in window if key in w) / sum(key in w for w in window) for key in window[-1]}
                    window = []
                if evaluating and ((config.eval.every and self.step % config.eval.every == 0) or self.step == config.steps):
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


CONFIG_CLASS = GRPOTrainConfig
TRAINER_CLASS = GRPOTrainer
