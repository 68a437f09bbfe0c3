"""The training spine's configuration: the knobs every kind of run shares, each with one name.

Every kind's config (`kind: pretrain | sft | move_group | trajectory | rookworld`) subclasses
`TrainConfig` and adds only its own knobs; a kind may change a shared knob's default by
re-declaring the field. Keys a resumed run may change are marked on the fields (`resumable`),
not listed per trainer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

from chessgrpo.config import ConfigError, RunConfig, resumable
from chessgrpo.train.backends import TrackingConfig


@dataclasses.dataclass
class DivergenceConfig:
    """What the loop does on a non-finite loss or gradient (docs/architecture.md, invariant 9)."""

    max_consecutive_skips: int = 3
    """A non-finite update is skipped (no optimizer step); after this many skipped steps in a row the run
    rolls back to its last good checkpoint."""
    lr_backoff: float = 0.5
    """Each rollback multiplies the learning rate by this factor (kept for the rest of the run)."""
    max_rollbacks: int = 2
    """After this many rollbacks a further divergence stops the run with an error."""

    def __post_init__(self) -> None:
        if self.max_consecutive_skips < 1 or self.max_rollbacks < 0 or not 0.0 < self.lr_backoff <= 1.0:
            raise ValueError("need max_consecutive_skips >= 1, max_rollbacks >= 0, 0 < lr_backoff <= 1")


@dataclasses.dataclass
class EarlyStopConfig:
    """Stop rules; each stop checkpoints, logs `health/` metrics and says why. null disables a rule."""

    kl_max: float | None = None
    """Stop when the KL to the frozen reference (exact, or the non-negative k3/k2 estimate; never a signed
    one) stays above this for `kl_patience` steps in a row."""
    kl_patience: int = 3
    entropy_min: float | None = None
    """Stop when the policy's mean entropy (nats) stays below this for `entropy_patience` steps in a row."""
    entropy_patience: int = 3
    heldout_patience: int | None = None
    """Stop when `checkpoint_best_metric` has not improved for this many held-out evaluations."""

    def __post_init__(self) -> None:
        if self.kl_max is not None and not self.kl_max > 0:
            raise ValueError(f"kl_max must be > 0 (KL is exactly 0 at step 0) or null, got {self.kl_max}")
        if (
            self.kl_patience < 1
            or self.entropy_patience < 1
            or (self.heldout_patience is not None and self.heldout_patience < 1)
        ):
            raise ValueError("patiences must be >= 1")


@dataclasses.dataclass
class DebugConfig:
    """Hooks to watch the safety machinery work (tests use them; keep them null in real runs)."""

    nonfinite_at_step: int | None = None
    """Inject a non-finite loss into the update of this step (1-based), once per process."""
    nonfinite_steps: int = 1
    """... and of this many steps from there (more than divergence.max_consecutive_skips forces a rollback)."""

    def __post_init__(self) -> None:
        if (self.nonfinite_at_step is not None and self.nonfinite_at_step < 1) or self.nonfinite_steps < 1:
            raise ValueError("need nonfinite_at_step >= 1 or null and nonfinite_steps >= 1")


@dataclasses.dataclass
class TrainConfig:
    """Knobs shared by every kind of run; a kind's config subclasses this and adds its own."""

    kind: str = ""
    """Which kind of run this is: pretrain, sft, move_group, trajectory, mixture or rookworld."""
    # Any, not type[Kind]: config.from_dict resolves this class's type hints at run time, and train.kind imports
    # this module (Kind.config_class), so Kind cannot be imported here.
    kind_class: ClassVar[Any] = None
    """The `train.kind.Kind` plug-in that runs this config class (set when the kind is defined)."""
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    steps: int = resumable(100)
    """Optimizer steps of the run (the cosine ends here). A resume may extend it (the schedule then moves)."""
    stop_at: int | None = resumable(None)
    """Stop this invocation after this step (checkpointed); `--resume` continues to `steps`."""
    time_limit_minutes: float | None = resumable(None)
    """Stop this invocation (checkpointed) after the step that brings its summed step time to this many minutes
    (evaluations and checkpoints not counted): two arms given the same limit on the same machine get equal
    wall-clock. The learning-rate schedule still runs to `steps`. null = no limit."""
    lr: float = 1e-4
    """Peak AdamW learning rate."""
    head_lr: float | None = None
    """Separate peak learning rate for the model's head (null = lr)."""
    freeze_layers: int = 0
    """Freeze the embeddings and the first N transformer blocks (0 = train everything)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay, on matrices and embeddings only (not biases or norms)."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW (beta1, beta2)."""
    warmup_steps: int = 5
    """Linear learning-rate warmup steps."""
    min_lr_ratio: float = 1.0
    """Cosine floor as a fraction of lr (1.0 = constant after warmup)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this before every optimizer update (0 = off); logged before clipping."""
    bf16: bool = False
    """bfloat16 autocast for the forwards (losses stay fp32; GRPO's ratio check then uses its bf16 tolerance)."""
    device: str = "cpu"
    """Torch device: cpu, cuda, cuda:1, ... (in a torchrun job ``cuda`` means each rank's own GPU, cuda:LOCAL_RANK)."""
    reference_device: str | None = resumable(None)
    """GRPO kinds: where the frozen KL reference (and a reference opponent) runs, e.g. cuda:1 next to
    a policy on cuda:0 (null = the policy's device). Supervised kinds have no reference."""
    compile: bool = resumable(False)
    """torch.compile the trained model's forward (worth it on GPUs; on CPU the first steps pay the compilation)."""
    threads: int = resumable(0)
    """Torch CPU threads (0 = torch's default); bitwise resume needs the same value."""
    log_every: int = resumable(1)
    """Write a metrics row (the mean over the steps since the last row) every this many steps."""
    eval_every: int = resumable(50)
    """Held-out evaluation every this many steps, and at the last step (0 = at the last step only)."""
    eval_at_start: bool = True
    """Also evaluate the starting model (step 0), so every run has its own paired before/after."""
    checkpoint_every: int = resumable(50)
    """Checkpoint every this many steps (0 = only at the end); the last step is always saved."""
    keep_checkpoints: int = resumable(2)
    """Newest checkpoints kept on disk (the best one by checkpoint_best_metric is kept besides)."""
    checkpoint_optimizer: bool = resumable(True)
    """Save the optimizer state (AdamW moments: twice the model's size, ~1 GB for a 124M model) in
    checkpoints. false = model, step, RNG and schedule only: a resume (or divergence rollback) from
    such a checkpoint logs a warning that the optimizer state was not saved and starts AdamW fresh
    (the learning-rate schedule still continues from the saved step)."""
    checkpoint_best_metric: str | None = None
    """Held-out metric that picks `checkpoints/best` (e.g. eval/esl); null = the kind's default. The pick is made on the
    run's own held-out evaluation, so that evaluation of `checkpoints/best` is the best of several on the same data and
    reads high: report the last evaluation (or evaluate `best` on other data)."""
    checkpoint_best_mode: Literal["min", "max"] | None = None
    """Whether lower or higher is better for the best metric; null = the kind's default."""
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    """Metrics backends: RUN_DIR/metrics.jsonl always; tensorboard and wandb when listed."""
    divergence: DivergenceConfig = dataclasses.field(default_factory=DivergenceConfig)
    early_stop: EarlyStopConfig = dataclasses.field(default_factory=EarlyStopConfig)
    debug: DebugConfig = dataclasses.field(default_factory=DebugConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key {name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "threads", "freeze_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key {name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "head_lr"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"config key {name} must be a finite number > 0, got {value}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"config key weight_decay must be >= 0, got {self.weight_decay}")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
            raise ConfigError(f"config key max_grad_norm must be >= 0, got {self.max_grad_norm}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"config key min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"config key betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.time_limit_minutes is not None and not (
            math.isfinite(self.time_limit_minutes) and self.time_limit_minutes > 0
        ):
            raise ConfigError(f"config key time_limit_minutes must be > 0 or null, got {self.time_limit_minutes}")
        if self.stop_at is not None and self.stop_at < 1:
            raise ConfigError(f"config key stop_at must be >= 1 or null, got {self.stop_at}")
        if self.early_stop.heldout_patience is not None and not (
            self.checkpoint_best_metric or self.default_best_metric()
        ):
            raise ConfigError("config key early_stop.heldout_patience needs checkpoint_best_metric")

    def default_best_metric(self) -> tuple[str, str] | None:
        """The kind's default (held-out metric, min|max) for `checkpoints/best`; None = no best tracking."""
        return None

    def best_metric(self) -> tuple[str, str] | None:
        """(metric, mode) that picks the best checkpoint, from the config or the kind's default."""
        default = self.default_best_metric()
        name = self.checkpoint_best_metric or (default[0] if default else None)
        if name is None:
            return None
        mode = self.checkpoint_best_mode or (default[1] if default and default[0] == name else None)
        if mode is None:
            mode = "min" if any(word in name for word in ("loss", "esl", "blunder", "nll", "error")) else "max"
        return name, mode
