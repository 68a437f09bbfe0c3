"""Supervised pretraining of the action policy on engine-labelled positions.

Two objectives, both cross-entropies against `models.policy.log_probs` (the one way from logits
to a distribution, legal mask applied):

- ``bc`` (behaviour cloning): the target is the engine's best move.
- ``distill`` (value-aware distillation): the target is ``softmax(win_probs / T)`` over the
  labelled multipv moves (moves outside the top-M get probability 0). Win probabilities lie in
  [0, 1], so the temperature is in win-probability units: at T = 0.05 a move 0.05 worse gets
  e^-1 = 0.37 times the weight of the best, one 0.15 worse e^-3 = 0.05 times. T -> 0 recovers
  behaviour cloning (up to ties); a large T spreads mass evenly over the top-M list.

The loop (`Pretrainer.train`) is AdamW with a warmup + cosine rate (`train.schedule`), gradient
clipping, optional bf16 autocast around the forward (the loss stays fp32), metrics every
`log_every` steps into ``RUN_DIR/metrics.jsonl`` and held-out evaluation every `eval_every`
steps. Checkpoints (`train.checkpoint`) carry the optimizer, RNG and data-sampler state, so a
resumed run is bitwise identical to a straight one on the same device and thread count.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from chessgrpo.board import NUM_ACTIONS
from chessgrpo.config import ConfigError, RunConfig, to_dict
from chessgrpo.models.policy import (
    ActionPolicy,
    PolicyConfig,
    load_policy,
    log_probs,
    masked_entropy,
    save_policy,
)
from chessgrpo.track.metrics import METRICS_FILE, MetricsWriter
from chessgrpo.track.backends import TRACKING_KEYS, TrackingConfig
from chessgrpo.train.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_trainer_state,
    restore_rng_state,
    save_checkpoint,
)
from chessgrpo.train.dataset import (
    Batch,
    EpochSampler,
    PositionTensors,
    has_split,
    load_split,
)
from chessgrpo.train.schedule import WarmupCosine

logger = logging.getLogger(__name__)

Objective = Literal["bc", "distill"]


class TrainingDiverged(RuntimeError):
    """A training step produced a non-finite loss, gradient norm or metric (nothing is saved)."""


@dataclasses.dataclass
class ModelConfig:
    """The policy's shape: a named size, optionally with some of its fields replaced."""

    size: str = "tiny"
    """Named size from `models.policy.MODEL_SIZES`: tiny (~0.2M), small (~7M), medium (~39M)."""
    n_layers: int | None = None
    """Override the size's number of transformer blocks (null = the size's value)."""
    d_model: int | None = None
    """Override the size's width (null = the size's value)."""
    n_heads: int | None = None
    """Override the size's attention heads (null = the size's value)."""
    d_ff: int | None = None
    """Override the MLP hidden width (null = the size's value, 4 * d_model)."""
    dropout: float = 0.0
    """Dropout during pretraining only (evaluation and every RL forward run without it)."""
    head: str = "square_pair"
    """Policy head: square_pair (from-square query . to-square key) or pooled (linear over the mean token)."""
    head_dim: int | None = None
    """Override the square_pair head's query/key width (null = d_model)."""

    def overrides(self) -> dict[str, int]:
        """The fields of the named size that this config replaces."""
        return {f: getattr(self, f) for f in ("n_layers", "d_model", "n_heads", "d_ff", "head_dim") if getattr(self, f) is not None}

    def policy_config(self) -> PolicyConfig:
        base = dataclasses.asdict(PolicyConfig.from_size(self.size))
        return PolicyConfig(**{**base, **self.overrides(), "dropout": self.dropout, "head": self.head})

    def describe(self) -> str:
        """The size's name, with the replaced fields when there are any (e.g. "tiny, n_layers=4, d_model=128")."""
        return ", ".join([self.size, *(f"{f}={v}" for f, v in self.overrides().items())])


@dataclasses.dataclass
class PretrainConfig:
    """`chessgrpo pretrain`: supervised pretraining of the action policy."""

    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="pretrain"))
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: str = "data/tiny"
    """Dataset directory with train/ and test/ Parquet shards (`chessgrpo data generate`)."""
    objective: Objective = "bc"
    """bc: cross-entropy to the best move; distill: cross-entropy to softmax(win_probs / T) over the multipv moves."""
    distill_temperature: float = 0.05
    """T of the distill target, in win-probability units (0.05: a move 0.05 worse gets e^-1 of the weight)."""
    batch_size: int = 256
    """Positions per optimizer step."""
    steps: int = 1000
    """Total optimizer steps of the run (the cosine reaches its floor here)."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay, on matrices and embeddings only (not biases or norms)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""
    warmup_steps: int = 50
    """Linear warmup steps before the cosine decay."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine as a fraction of lr."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping); grad_norm is logged before clipping."""
    bf16: bool = False
    """Run the forward under bfloat16 autocast (the loss is computed in fp32); eval stays fp32."""
    log_every: int = 10
    """Write train metrics (averaged over the steps since the last row) every this many steps."""
    eval_every: int = 200
    """Evaluate on the test split every this many steps (0 = only at the end)."""
    eval_batch_size: int = 1024
    """Positions per forward pass during evaluation."""
    checkpoint_every: int = 200
    """Save a checkpoint every this many steps (0 = only at the end); the last step is always saved."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk, newest first."""
    stop_at: int | None = None
    """Stop this invocation after this step (checkpointed) without finishing; --resume continues to `steps`."""
    device: str = "cpu"
    """Torch device: cpu, cuda, cuda:1, ..."""
    threads: int = 0
    """CPU threads for torch (0 = torch's default); results are bitwise reproducible for a fixed value."""
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    """Metrics backends: RUN_DIR/metrics.jsonl always; tensorboard and wandb when listed."""

    def __post_init__(self) -> None:
        positive = ("batch_size", "steps", "log_every", "eval_batch_size", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"config key {name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key {name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError(f"need lr > 0, weight_decay >= 0, grad_clip >= 0; got {self.lr}, {self.weight_decay}, {self.grad_clip}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"config key min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"config key betas must be two numbers in [0, 1), got {self.betas}")
        if self.distill_temperature <= 0:
            raise ConfigError(f"config key distill_temperature must be > 0, got {self.distill_temperature}")
        if self.stop_at is not None and self.stop_at < 1:
            raise ConfigError(f"config key stop_at must be >= 1 or null, got {self.stop_at}")
        try:
            self.model.policy_config()
        except ValueError as error:
            raise ConfigError(f"config key model: {error}") from None


# Keys a resumed run may change: they do not touch the training math. `steps` is allowed so a
# finished run can be extended; note that it moves the cosine's end, so the continuation follows
# the new schedule (an extension is not identical to a run planned that long from the start).
RESUMABLE_KEYS = frozenset(
    {"steps", "stop_at", "log_every", "eval_every", "eval_batch_size", "checkpoint_every", "keep_checkpoints", "threads"} | TRACKING_KEYS
)


# ------------------------------------------------------------------------------------------------
# Losses and targets (pure functions)


def distill_targets(actions: torch.Tensor, win_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Dense targets [B, 1968]: softmax(win_probs / T) over each row's labelled moves, 0 elsewhere.

    Args:
        actions: [B, M] action indices of the multipv moves, -1 where a row has fewer than M.
        win_probs: [B, M] win probability (side to move) after each move.
        temperature: T > 0, in win-probability units.
    """
    if temperature <= 0:
        raise ValueError(f"distill temperature must be > 0, got {temperature}")
    valid = actions >= 0
    scores = (win_probs.float() / temperature).masked_fill(~valid, float("-inf"))
    weights = torch.softmax(scores, dim=-1).masked_fill(~valid, 0.0)
    targets = torch.zeros(actions.shape[0], NUM_ACTIONS, dtype=torch.float32, device=actions.device)
    return targets.scatter_add_(1, actions.clamp(min=0), weights)


def soft_cross_entropy(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-row -sum(target * logp); entries with target 0 contribute 0 even where logp is -inf."""
    terms = torch.where(targets > 0, targets * logp, torch.zeros_like(logp))
    return -terms.sum(dim=-1)


def best_move_nll(logp: torch.Tensor, best_action: torch.Tensor) -> torch.Tensor:
    """Per-row -log p(best move): the behaviour-cloning cross-entropy."""
    return -logp.gather(1, best_action.unsqueeze(1)).squeeze(1)


def objective_loss(logp: torch.Tensor, batch: Batch, objective: Objective, temperature: float) -> torch.Tensor:
    """Per-row loss of the chosen objective."""
    if objective == "bc":
        return best_move_nll(logp, batch.best_action)
    if objective == "distill":
        return soft_cross_entropy(logp, distill_targets(batch.actions, batch.win_probs, temperature))
    raise ValueError(f"unknown objective {objective!r}; choose bc or distill")


@torch.no_grad()
def accuracy_sums(logp: torch.Tensor, batch: Batch) -> dict[str, float]:
    """Sums over the batch: top-1/top-5 hits of the best move, BC nll, and whether the argmax is
    among the labelled multipv moves."""
    best = batch.best_action.unsqueeze(1)
    top5 = logp.topk(min(5, logp.shape[1]), dim=-1).indices
    top1 = top5[:, :1]
    return {
        "top1": float((top1 == best).sum()),
        "top5": float((top5 == best).any(dim=-1).sum()),
        "nll": float(best_move_nll(logp, batch.best_action).sum()),
        "in_multipv": float((batch.actions == top1).any(dim=-1).sum()),
    }


@torch.no_grad()
def evaluate(
    model: ActionPolicy, data: PositionTensors, *, objective: Objective, temperature: float, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Held-out metrics in fp32 and eval mode: eval/loss (the objective), eval/top1, eval/top5,
    eval/nll (cross-entropy to the best move, comparable across objectives), eval/perplexity,
    eval/in_multipv (share of argmax moves among the labelled top-M)."""
    was_training = model.training
    model.eval()
    totals = {"loss": 0.0, "top1": 0.0, "top5": 0.0, "nll": 0.0, "in_multipv": 0.0}
    try:
        for start in range(0, len(data), batch_size):
            batch = data.batch(torch.arange(start, min(len(data), start + batch_size))).to(device)
            logp = log_probs(model(batch.tokens).float(), batch.legal_mask)
            totals["loss"] += float(objective_loss(logp, batch, objective, temperature).sum())
            for key, value in accuracy_sums(logp, batch).items():
                totals[key] += value
    finally:
        model.train(was_training)
    metrics = {f"eval/{key}": value / len(data) for key, value in totals.items()}
    metrics["eval/perplexity"] = math.exp(metrics["eval/nll"])
    return metrics


def _optimizer(model: ActionPolicy, config: PretrainConfig) -> torch.optim.AdamW:
    # nanoGPT's rule: decay every tensor with >= 2 dims (matrices, embeddings), not biases or norms.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))


# ------------------------------------------------------------------------------------------------
# The loop


@dataclasses.dataclass
class PretrainResult:
    """What a `Pretrainer.train` call did."""

    step: int
    """Optimizer steps completed (over the whole run, resumes included)."""
    finished: bool
    """True when the run reached `steps`; False when it stopped early (stop_at or a stop request)."""
    checkpoint: Path
    """The checkpoint written last."""
    samples_per_s: float
    """Training throughput of this invocation (evaluation and checkpoint time excluded)."""
    eval_metrics: dict[str, float] | None
    """Held-out metrics at the end (None when the dataset has no test split)."""


Progress = Callable[[int, dict[str, Any] | None], None]
"""Called after every step with the step and the metrics row when one was written, else None."""


class Pretrainer:
    """Set up a pretraining run (fresh or resumed from the run's latest checkpoint), then `train`.

    Construction loads the data, builds the model and optimizer and restores a checkpoint when
    `resume` is set; it writes nothing. `train` opens the metrics file (a fresh run replaces it, a
    resumed one keeps the rows up to the checkpoint's step) and writes checkpoints.
    """

    def __init__(self, config: PretrainConfig, *, resume: bool = False):
        self.config = config
        self.run_dir = config.run.directory
        try:
            self.device = torch.device(config.device)
        except RuntimeError:
            raise ValueError(f"config key device: {config.device!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device!r} requested but CUDA is not available (use device=cpu)")
        if config.threads:
            torch.set_num_threads(config.threads)

        started = time.perf_counter()
        self.train_data = load_split(config.data, "train")
        self.test_data = load_split(config.data, "test") if has_split(config.data, "test") else None
        if self.test_data is None:
            logger.warning("dataset %s has no test split: held-out evaluation is skipped", config.data)
        logger.info(
            "loaded %d train and %d test positions from %s in %.1fs",
            len(self.train_data), len(self.test_data or ()), config.data, time.perf_counter() - started,
        )

        self.schedule = WarmupCosine(config.lr, config.warmup_steps, config.steps, config.min_lr_ratio)
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            raise FileNotFoundError(f"no checkpoint to resume under {str(self.run_dir / 'checkpoints')!r}")
        if checkpoint is None:
            torch.manual_seed(config.run.seed)  # the one explicit seeding: model init and dropout
            self.model = ActionPolicy(config.model.policy_config()).to(self.device)
            self.optimizer = _optimizer(self.model, config)
            self.sampler = EpochSampler(len(self.train_data), config.batch_size, config.run.seed)
            self.step = 0
        else:
            state = load_trainer_state(checkpoint)
            self.model = load_policy(checkpoint, device=self.device).train()
            self.optimizer = _optimizer(self.model, config)
            self.optimizer.load_state_dict(state["optimizer"])
            self.sampler = EpochSampler.from_state(state["sampler"], len(self.train_data), config.batch_size, config.run.seed)
            self.step = int(state["step"])
            restore_rng_state(state["rng"])
            logger.info("resumed %s from %s (step %d)", self.run_dir, checkpoint, self.step)
        self.model.train()
        self.last_checkpoint: Path | None = checkpoint
        self._stop_requested = False
        logger.info("model: %s, %.2fM parameters", self.model.config, self.model.num_parameters() / 1e6)

    def request_stop(self) -> None:
        """Finish the current step, checkpoint and return from `train` (e.g. on Ctrl-C)."""
        self._stop_requested = True

    def _state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "schedule": dataclasses.asdict(self.schedule),
            "sampler": self.sampler.state_dict(),
            "rng": capture_rng_state(),
            "config": to_dict(self.config),
        }

    def _checkpoint(self) -> Path:
        self.last_checkpoint = save_checkpoint(
            self.run_dir,
            self.step,
            save_model=lambda directory: save_policy(self.model, directory),
            trainer_state=self._state(),
            keep=self.config.keep_checkpoints,
        )
        return self.last_checkpoint

    def _evaluate(self) -> dict[str, float]:
        assert self.test_data is not None
        return evaluate(
            self.model, self.test_data, objective=self.config.objective, temperature=self.config.distill_temperature,
            batch_size=self.config.eval_batch_size, device=self.device,
        )  # fmt: skip

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer update on `batch`; returns the step's train metrics (batch means)."""
        config = self.config
        lr = self.schedule.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.bf16):
            logits = self.model(batch.tokens)
        logp = log_probs(logits, batch.legal_mask)  # float32 whatever the autocast dtype
        loss = objective_loss(logp, batch, config.objective, config.distill_temperature).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = config.grad_clip if config.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.step += 1

        with torch.no_grad():
            sums = accuracy_sums(logp.detach(), batch)
            size = len(batch.best_action)
            return {
                "loss/train": float(loss),
                "train/top1": sums["top1"] / size,
                "train/top5": sums["top5"] / size,
                "train/nll": sums["nll"] / size,
                "entropy/mean": float(masked_entropy(logits.detach(), batch.legal_mask).mean()),
                "entropy/ln_legal": float(batch.legal_mask.sum(dim=-1).float().log().mean()),
                "lr": lr,
                "grad_norm": float(grad_norm),
            }

    def train(self, progress: Progress | None = None) -> PretrainResult:
        """Train from the current step to `steps` (or `stop_at`); returns what happened."""
        config = self.config
        end = config.steps if config.stop_at is None else min(config.steps, config.stop_at)
        resume_step = self.step if self.last_checkpoint is not None else None
        window: list[dict[str, float]] = []
        window_samples, window_seconds = 0, 0.0
        total_samples, total_seconds = 0, 0.0
        eval_metrics: dict[str, float] | None = None
        with MetricsWriter(
            self.run_dir / METRICS_FILE, resume_step=resume_step, tracking=config.tracking, run_config=to_dict(config)
        ) as metrics:
            while self.step < end and not self._stop_requested:
                tick = time.perf_counter()
                batch = self.sampler_batch()
                window.append(self.train_step(batch))
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                seconds = time.perf_counter() - tick
                window_samples += config.batch_size
                window_seconds += seconds
                total_samples += config.batch_size
                total_seconds += seconds
                if not all(math.isfinite(v) for v in window[-1].values()):
                    self._raise_diverged(window[-1])

                last = self.step == end or self._stop_requested
                row: dict[str, Any] | None = None
                values: dict[str, float] = {}
                if self.step % config.log_every == 0 or last:
                    values = {key: sum(w[key] for w in window) / len(window) for key in window[0]}
                    values["lr"] = window[-1]["lr"]
                    values["train/perplexity"] = math.exp(values.pop("train/nll"))
                    values["perf/samples_per_s"] = window_samples / max(window_seconds, 1e-9)
                    window, window_samples, window_seconds = [], 0, 0.0
                at_end = self.step == config.steps
                if self.test_data is not None and ((config.eval_every and self.step % config.eval_every == 0) or at_end):
                    eval_metrics = self._evaluate()
                    values.update(eval_metrics)
                if values:
                    row = metrics.log(self.step, values)
                if (config.checkpoint_every and self.step % config.checkpoint_every == 0) or last:
                    self._checkpoint()
                if progress is not None:
                    progress(self.step, row)
        if self.last_checkpoint is None:
            self._checkpoint()  # stopped before the first step: still leave a resumable checkpoint
        finished = self.step >= config.steps
        if finished and eval_metrics is None and self.test_data is not None:
            eval_metrics = self._evaluate()
        return PretrainResult(
            step=self.step,
            finished=finished,
            checkpoint=self.last_checkpoint,
            samples_per_s=total_samples / total_seconds if total_seconds else 0.0,
            eval_metrics=eval_metrics,
        )

    def sampler_batch(self) -> Batch:
        return self.train_data.batch(self.sampler.next_indices()).to(self.device)

    def _raise_diverged(self, values: dict[str, float]) -> None:
        bad = {k: v for k, v in values.items() if not math.isfinite(v)}
        raise TrainingDiverged(
            f"non-finite training metrics at step {self.step}: {bad}; the last good checkpoint is "
            f"{self.last_checkpoint or 'none'} (try a lower lr or bf16=false)"
        )
