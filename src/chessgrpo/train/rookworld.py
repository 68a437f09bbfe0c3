"""GRPO on text for the chess language model (`kind: rookworld` in `chessgrpo train`).

One step, top to bottom (`RookWorldTrainer.train_step`):

1. **prompts**: B prompts from the dataset's train split, round(B * policy_fraction) P: prompts
   and the rest A: prompts, drawn without replacement as a function of (seed, step, rank), so a
   resumed run sees what a straight run would;
2. **sample**: G completions per prompt from the current model at the rollout temperature
   (`tasks.rookworld.sample_completion_groups`: batched, left-padded, KV cache, temperature only);
   the behaviour and reference log-probs and the exact per-token entropy are then computed by
   `models.lm.completion_log_probs` on the finished sequences;
3. **reward**: `tasks.rookworld.score_completions` (engine pool with its cache for P:, python-chess
   for A:), each component logged per task, malformed completions at the configured penalty;
4. **learn**: `rl.optimize` with L = completion tokens and their mask: token-level (or GSPO
   sequence-level) ratios against the behaviour log-probs, the chosen aggregation, KL to the frozen
   SFT reference (k3 by default, fixed/warmup/adaptive coefficient), the first-minibatch ratio
   check. Optional reward normalisation: `reward_scale` "none" or "batch_std"
   (`grpo.advantage_estimator: batch_std`) are the GRPO core's.

The policy and the reference run with every dropout off and in eval mode (`models.lm.prepare_for_rl`),
whatever the model config says. Every `eval.every` steps (and at step 0 and the end) the greedy
policy is evaluated on the same held-out prompts (`eval.lm.evaluate_lm`): RUN_DIR/eval/step_NNNNNN_lm.json,
and at the end the paired difference last - first (`eval.lm.compare_lm_results`) is logged and
written to RUN_DIR/eval/paired_first_last.json.

Checkpoints hold the model (a `save_pretrained` directory), the optimizer, the KL controller, the
sampling generator, the RNG states and the step: `--resume` continues exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chessgrpo.config import ConfigError, EngineConfig, RunConfig, to_dict
from chessgrpo.models.lm import (
    ChessLM,
    LMModelConfig,
    build_lm,
    load_lm,
    prepare_for_rl,
    save_lm,
)
from chessgrpo.rl import GRPOConfig, KLController, optimize
from chessgrpo.tasks.rookworld import (
    ENVIRONMENT_COMPONENTS,
    POLICY_COMPONENTS,
    RookWorldRewardConfig,
    RookWorldTaskConfig,
    make_forward,
    sample_completion_groups,
    score_completions,
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
from chessgrpo.train.common import rank_and_world_size
from chessgrpo.train.schedule import WarmupCosine

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RookWorldEvalConfig:
    """Periodic held-out evaluation during GRPO (the same code as `chessgrpo eval lm`)."""

    every: int = 50
    """Evaluate every this many steps (0 = only at the start and the end)."""
    at_start: bool = True
    """Also evaluate the starting model (step 0): every run has its own paired before/after."""
    policy_prompts: int = 200
    """Held-out P: positions (the first N of the test split: the same ones every time)."""
    environment_prompts: int = 100
    """Held-out A: prompts."""
    puzzles: str | None = None
    """Lichess puzzle CSV, solved through the P: prompt; null = skip."""
    max_puzzles: int = 200
    batch_size: int = 64
    resamples: int = 2000
    """Bootstrap resamples of the intervals."""

    def __post_init__(self) -> None:
        if self.every < 0 or self.policy_prompts < 0 or self.environment_prompts < 0 or self.max_puzzles < 1:
            raise ValueError("need every, policy_prompts, environment_prompts >= 0 and max_puzzles >= 1")
        if self.batch_size < 1 or self.resamples < 10:
            raise ValueError("need batch_size >= 1 and resamples >= 10")


@dataclasses.dataclass
class RookWorldTrainConfig:
    """`chessgrpo train` with `kind: rookworld`: GRPO of a chess LM on the P:/A: text tasks."""

    kind: str = "rookworld"
    """Which trainer reads this config (`chessgrpo.commands.train.TRAINERS`); this one is rookworld."""
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="rookworld_grpo"))
    init_checkpoint: str | None = "runs/rookworld_sft"
    """Starting model, also the frozen KL reference: an SFT run or checkpoint, or any local
    `save_pretrained` directory (e.g. RookWorld-LM-124M). null = a fresh `model` (for tests)."""
    model: LMModelConfig = dataclasses.field(default_factory=LMModelConfig)
    """Shape of a fresh model (only with init_checkpoint: null). Its dropout is ignored: RL runs without."""
    data: str = "data/rookworld_tiny"
    """`chessgrpo data rookworld` directory: prompts from its train split, evaluation on its test split."""
    task: RookWorldTaskConfig = dataclasses.field(default_factory=RookWorldTaskConfig)
    rewards: RookWorldRewardConfig = dataclasses.field(default_factory=RookWorldRewardConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """Stockfish pool for P: rewards (rewards.policy.nodes is the limit); keep the cache on."""
    eval: RookWorldEvalConfig = dataclasses.field(default_factory=RookWorldEvalConfig)
    steps: int = 100
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = 5
    min_lr_ratio: float = 1.0
    """Cosine floor as a fraction of lr (1.0 = constant after warmup)."""
    log_every: int = 1
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    stop_at: int | None = None
    device: str = "cpu"
    threads: int = 0
    """Torch CPU threads (0 = torch's default); bitwise resume needs the same value."""

    def __post_init__(self) -> None:
        if self.kind != "rookworld":
            raise ConfigError(f"config key kind must be rookworld for this trainer, got {self.kind!r}")
        for name in ("steps", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key {name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key {name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.weight_decay < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError("need lr > 0, weight_decay >= 0, min_lr_ratio in [0, 1]")
        if self.stop_at is not None and self.stop_at < 1:
            raise ConfigError(f"config key stop_at must be >= 1 or null, got {self.stop_at}")


RESUMABLE_KEYS = frozenset(
    {"steps", "stop_at", "log_every", "checkpoint_every", "keep_checkpoints", "threads", "eval.every", "eval.batch_size",
     "engine.processes", "engine.timeout_s", "engine.cache_path", "engine.path"}
)  # fmt: skip
"""Keys a resumed run may change (they do not touch the training math)."""


@dataclasses.dataclass
class RookWorldResult:
    step: int
    finished: bool
    checkpoint: Path
    eval_metrics: dict[str, float] | None
    paired: dict[str, Any] | None = None


class RookWorldTrainer:
    """Set up a text GRPO run (fresh or resumed), then `train`. Construction writes nothing."""

    def __init__(self, config: RookWorldTrainConfig, *, resume: bool = False):
        from chessgrpo.data.rookworld import read_rookworld
        from chessgrpo.engine import EnginePool

        self.config = config
        self.run_dir = config.run.directory
        self.rank, self.world_size = rank_and_world_size()
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device!r} requested but CUDA is not available (use device=cpu)")
        if config.threads:
            torch.set_num_threads(config.threads)

        train = read_rookworld(config.data, "train")
        self.policy_prompts = [e.prompt for e in train if e.task == "policy"]
        self.environment_prompts = [e.prompt for e in train if e.task == "environment"]
        n_policy, n_environment = config.task.split()
        for name, pool_, wanted in (("P:", self.policy_prompts, n_policy), ("A:", self.environment_prompts, n_environment)):
            if wanted and not pool_:
                raise ValueError(f"dataset {config.data!r} has no {name} train prompts but the task mix asks for {wanted} per step")
        test = read_rookworld(config.data, "test")
        self.eval_policy_fens = [e.fen for e in test if e.task == "policy"][: config.eval.policy_prompts]
        self.eval_environment_prompts = [e.prompt for e in test if e.task == "environment"][: config.eval.environment_prompts]

        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            raise FileNotFoundError(f"no checkpoint to resume under {str(self.run_dir / 'checkpoints')!r}")
        torch.manual_seed(config.run.seed)
        if config.init_checkpoint:
            self.reference = load_lm(config.init_checkpoint, device=self.device)
        else:
            self.reference = build_lm(config.model, seed=config.run.seed)
            self.reference.model.to(self.device)
        prepare_for_rl(self.reference.model).requires_grad_(False)
        if checkpoint is not None:
            self.lm = load_lm(checkpoint, device=self.device)
        else:
            self.lm = ChessLM(copy.deepcopy(self.reference.model), self.reference.tokenizer, self.reference.source)
        prepare_for_rl(self.lm.model).requires_grad_(True)  # dropout off, eval mode (invariant 2)
        limit = self.lm.max_positions
        longest = max(len(self.lm.tokenizer.encode(p)) for p in self.policy_prompts[:2000] + self.environment_prompts[:2000])
        if limit is not None and longest + config.task.max_new_tokens > limit:
            raise ConfigError(
                f"task.max_new_tokens={config.task.max_new_tokens} + the longest prompt ({longest} tokens) exceeds the "
                f"model's {limit} positions"
            )

        decay = [p for p in self.lm.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.lm.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.lr, betas=tuple(config.betas),
        )  # fmt: skip
        self.kl_controller = KLController.from_config(config.grpo)
        self.generator = torch.Generator(device=self.device).manual_seed(config.run.seed * 1_000_003 + self.rank)
        self.schedule = WarmupCosine(config.lr, config.warmup_steps, config.steps, config.min_lr_ratio)
        self.step = 0
        if checkpoint is not None:
            state = load_trainer_state(checkpoint)
            self.optimizer.load_state_dict(state["optimizer"])
            self.kl_controller.load_state_dict(state["kl_controller"])
            self.generator.set_state(state["generator"])
            self.step = int(state["step"])
            restore_rng_state(state["rng"])
            logger.info("resumed %s from %s (step %d)", self.run_dir, checkpoint, self.step)
        self.last_checkpoint: Path | None = checkpoint
        self.pool = EnginePool.from_config(config.engine) if (n_policy or self.eval_policy_fens) else None
        self._stop_requested = False
        self._puzzles: list | None = None
        self._evals: list[tuple[int, dict[str, Any]]] = []

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> RookWorldTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request_stop(self) -> None:
        self._stop_requested = True

    # --------------------------------------------------------------------------------------------

    def draw_prompts(self, step: int) -> list[str]:
        """The prompts of `step` (P: first, then A:), a function of (seed, step, rank)."""
        n_policy, n_environment = self.config.task.split()
        rng = np.random.default_rng([self.config.run.seed, step, self.rank])
        prompts = []
        for pool_, count in ((self.policy_prompts, n_policy), (self.environment_prompts, n_environment)):
            if count:
                chosen = rng.choice(len(pool_), count, replace=count > len(pool_))
                prompts += [pool_[int(i)] for i in chosen]
        return prompts

    def train_step(self) -> dict[str, float]:
        """One GRPO step: sample, reward, learn. Returns the step's metrics."""
        config, task = self.config, self.config.task
        lr = self.schedule.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        stats_before = dataclasses.replace(self.pool.stats) if self.pool is not None else None

        tick = time.perf_counter()
        prompts = self.draw_prompts(self.step)
        groups = sample_completion_groups(
            self.lm, prompts, task.group_size, temperature=task.temperature, max_new_tokens=task.max_new_tokens,
            generator=self.generator, reference=self.reference.model,
        )  # fmt: skip
        sample_s = time.perf_counter() - tick

        tick = time.perf_counter()
        row_prompts = groups.row_prompts()
        scored = score_completions(self.pool, row_prompts, groups.texts, config.rewards)
        rewards = torch.tensor([r.total for r in scored], dtype=torch.float32)
        reward_s = time.perf_counter() - tick

        tick = time.perf_counter()
        batch = to_rollout_batch(groups, rewards.to(self.device))
        forward = make_forward(self.lm.model, temperature=task.temperature)
        metrics = optimize(
            batch, forward, self.optimizer, config.grpo, self.kl_controller,
            parameters=list(self.lm.model.parameters()), generator=self.generator,
        )  # fmt: skip
        learn_s = time.perf_counter() - tick
        self.step += 1

        mask = groups.generation.completion_mask
        lengths = groups.generation.lengths.float()
        metrics.update(
            {
                "lr": lr,
                "entropy/rollout": float(groups.entropy[mask].mean()),
                "rollout/completion_tokens": float(lengths.mean()),
                "rollout/completion_tokens_max": float(lengths.max()),
                "rollout/truncated_frac": float((~groups.generation.finished).float().mean()),
                "rollout/malformed_rate": sum(r.malformed is not None for r in scored) / len(scored),
                "rollout/prompts": float(len(prompts)),
                "perf/sample_s": sample_s,
                "perf/reward_s": reward_s,
                "perf/learn_s": learn_s,
                "perf/step_s": sample_s + reward_s + learn_s,
                "perf/samples_per_s": len(scored) / max(sample_s + reward_s + learn_s, 1e-9),
            }
        )
        for name, components in (("policy", POLICY_COMPONENTS), ("environment", ENVIRONMENT_COMPONENTS)):
            rows = [r for r, p in zip(scored, row_prompts) if p.startswith("P:" if name == "policy" else "A:")]
            if not rows:
                continue
            metrics[f"reward/{name}_total"] = sum(r.total for r in rows) / len(rows)
            metrics[f"reward/{name}_malformed_rate"] = sum(r.malformed is not None for r in rows) / len(rows)
            for component in components:
                metrics[f"reward/{name}_{component}"] = sum(r.components[component] for r in rows) / len(rows)
            errors = [r.components["eval_error"] for r in rows if "eval_error" in r.components]
            if errors:
                metrics[f"reward/{name}_eval_error"] = sum(errors) / len(errors)
        if self.pool is not None and stats_before is not None:
            stats = self.pool.stats
            lookups = (stats.cache_hits - stats_before.cache_hits) + (stats.cache_misses - stats_before.cache_misses)
            metrics["perf/engine_searches"] = float(stats.searches - stats_before.searches)
            metrics["perf/cache_hit_rate"] = (stats.cache_hits - stats_before.cache_hits) / lookups if lookups else 0.0
        return metrics

    # --------------------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Greedy held-out evaluation; writes RUN_DIR/eval/step_NNNNNN_lm.json."""
        from chessgrpo.eval.lm import evaluate_lm, write_result

        config = self.config.eval
        if self._puzzles is None and config.puzzles:
            from chessgrpo.eval.puzzles import read_puzzles

            self._puzzles = list(read_puzzles(config.puzzles, config.max_puzzles, self.config.run.seed).puzzles)
        result = evaluate_lm(
            self.lm, policy_fens=self.eval_policy_fens, environment_prompts=self.eval_environment_prompts,
            puzzles=self._puzzles or (), pool=self.pool, rewards=self.config.rewards, batch_size=config.batch_size,
            policy_max_new_tokens=self.config.task.max_new_tokens, environment_max_new_tokens=self.config.task.max_new_tokens,
            seed=self.config.run.seed, resamples=config.resamples,
        )  # fmt: skip
        payload = {**result.to_json(), "step": self.step}
        write_result(self.run_dir / "eval" / f"step_{self.step:06d}_lm.json", payload)
        self._evals.append((self.step, payload))
        return result.flat()

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
            self.run_dir, self.step, save_model=lambda d: save_lm(self.lm, d), trainer_state=state,
            keep=self.config.keep_checkpoints,
        )  # fmt: skip
        return self.last_checkpoint

    def _paired(self) -> dict[str, Any] | None:
        """Paired last - first difference of the evaluations of this run directory (also across resumes)."""
        from chessgrpo.eval.lm import compare_lm_results, write_result

        files = sorted((self.run_dir / "eval").glob("step_*_lm.json"))
        if len(files) < 2:
            return None
        first, last = json.loads(files[0].read_text()), json.loads(files[-1].read_text())
        diffs = compare_lm_results(first, last, resamples=self.config.eval.resamples, seed=self.config.run.seed)
        payload = {"a": files[0].name, "b": files[-1].name, "differences": {k: v.to_json() for k, v in diffs.items()}}
        write_result(self.run_dir / "eval" / "paired_first_last.json", payload)
        for name, interval in diffs.items():
            logger.info("held-out %s, %s -> %s: %s", name, files[0].name, files[-1].name, interval.format(4))
        return payload

    def train(self, progress: Callable[[int, dict[str, Any] | None], None] | None = None) -> RookWorldResult:
        config = self.config
        end = config.steps if config.stop_at is None else min(config.steps, config.stop_at)
        resume_step = self.step if self.last_checkpoint is not None else None
        eval_metrics: dict[str, float] | None = None
        evaluating = bool(self.eval_policy_fens or self.eval_environment_prompts or config.eval.puzzles)
        with MetricsWriter(self.run_dir / METRICS_FILE, resume_step=resume_step) as writer:
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
                    keys = dict.fromkeys(k for w in window for k in w)
                    row_values = {k: sum(w[k] for w in window if k in w) / sum(k in w for w in window) for k in keys}
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
        paired = self._paired() if evaluating and self.step >= config.steps else None
        return RookWorldResult(self.step, self.step >= config.steps, self.last_checkpoint, eval_metrics, paired)


CONFIG_CLASS = RookWorldTrainConfig
TRAINER_CLASS = RookWorldTrainer
