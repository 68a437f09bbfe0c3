"""The training spine: one loop that every kind of run plugs into.

Read top to bottom, a run is:

1. **set-up** (`Trainer.__init__`): take the run directory's lock (`train.lock`); device, threads, seed; build
   the kind (its models and data; the config's `kind_class` plug-in, registered in `tasks.kinds`); AdamW over the trainable parameters (head and
   frozen parameters as the kind says, decay on matrices only) with a warmup + cosine schedule;
   on ``--resume`` restore the newest *intact* checkpoint (model, optimizer, RNG, the kind's
   state, the health state).
2. **the loop** (`Trainer.train`): write RUN_DIR/config.yaml (the resolved config); evaluate the start (step 0); save a step-0 checkpoint (a
   rollback target); then per step: set the learning rate, let the kind do the step (it calls
   `Learner.update` for each optimizer update: backward, clip, step), apply the divergence policy
   and the early-stop rules, log the mean of the window every `log_every` steps (metrics.jsonl and
   every tracking backend), evaluate every `eval_every` steps and at the last, checkpoint every
   `checkpoint_every` steps, when the held-out metric improves, and at the end.
3. **stops**: `request_stop` (SIGINT/SIGTERM), `stop_at`, `time_limit_minutes` of step time (evaluated at that last
   step), an early-stop rule, or the last step; every stop checkpoints first.

Divergence policy (``divergence:``): a non-finite loss or gradient skips that optimizer update
(`rl.NonFiniteError`); after `max_consecutive_skips` skipped steps in a row the run rolls back to
its newest intact checkpoint with the learning rate multiplied by `lr_backoff`, at most
`max_rollbacks` times, then stops with `TrainingDiverged`. Checkpoints are never written while
steps are being skipped, and the best checkpoint is never pruned. Every event goes to
``RUN_DIR/events.jsonl`` and to ``health/`` metrics, which `chessgrpo diagnose` reads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from chessgrpo.config import ConfigError, save_config, to_dict
from chessgrpo.engine.pool import available_cores
from chessgrpo.errors import TrainingDiverged
from chessgrpo.files import write_json_atomic
from chessgrpo.models.placement import resolve_device
from chessgrpo.rl.invariants import NonFiniteError
from chessgrpo.run_info import RUN_INFO_FILE, collect_run_info
from chessgrpo.train.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_trainer_state,
    optimizer_state,
    restore_optimizer,
    restore_rng_state,
    save_checkpoint,
)
from chessgrpo.train.config import TrainConfig
from chessgrpo.train.distributed import Parallel
from chessgrpo.train.kind import Kind, RunContext
from chessgrpo.train.learner import Learner
from chessgrpo.train.lock import RunLock
from chessgrpo.train.metrics import EVENTS_FILE, METRICS_FILE, MetricsWriter
from chessgrpo.train.schedule import WarmupCosine

logger = logging.getLogger(__name__)

Progress = Callable[[int, dict[str, Any] | None], None]
"""Called after every step with the step and the metrics row when one was written, else None."""

# Metrics that may legitimately be NaN (e.g. no first minibatch when a step learned nothing).
_MAY_BE_NAN = frozenset({"ratio/first_max_abs_dev"})


@dataclasses.dataclass
class TrainResult:
    """What a `Trainer.train` call did."""

    step: int
    """Optimizer steps completed (over the whole run, resumes included)."""
    finished: bool
    """True when the run reached `steps`."""
    checkpoint: Path
    """The checkpoint written last."""
    eval_metrics: dict[str, float] | None
    """The last held-out evaluation (None when the run has none)."""
    stop_reason: str | None = None
    """Why the run stopped before `steps` (interrupt, stop_at, time_limit_minutes, an early-stop rule)."""
    best_checkpoint: Path | None = None
    """The checkpoint `checkpoints/best` points to, when the run tracks a best metric."""


def build_optimizer(kind: Kind, config: TrainConfig) -> tuple[torch.optim.AdamW, list[torch.nn.Parameter]]:
    """AdamW over the kind's trainable parameters: (body, head) x (decay on >= 2-D tensors, no decay).

    The parameters of the first `freeze_layers` blocks (and embeddings) are frozen (requires_grad
    off). Groups carry ``head: bool`` so `Trainer` can scale the head's learning rate.
    """
    model = kind.model
    frozen = {id(p) for p in kind.frozen_parameters(config.freeze_layers)}
    head = {id(p) for p in kind.head_parameters()}
    groups: list[dict[str, Any]] = []
    for is_head in (False, True):
        params = [p for p in model.parameters() if id(p) not in frozen and (id(p) in head) == is_head]
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            if chosen:
                groups.append(
                    {"params": chosen, "weight_decay": config.weight_decay if decay else 0.0, "head": is_head}
                )
    for param in model.parameters():
        param.requires_grad_(id(param) not in frozen)
    trainable = [p for p in model.parameters() if id(p) not in frozen]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.betas[0], config.betas[1])), trainable


class Trainer:
    """Set up a run of any kind (fresh or resumed), then `train`. See the module docstring.

    Construction takes the run directory's lock and writes nothing else; call `close` (or use it
    as a context manager) to release the lock and the kind's processes.
    """

    def __init__(self, config: TrainConfig, *, resume: bool = False):
        self.config = config
        self.run_dir = config.run.directory
        kind_cls: type[Kind] | None = type(config).kind_class
        if kind_cls is None or kind_cls.name != config.kind:
            raise ConfigError(
                f"config key kind: {config.kind!r} is not what a {type(config).__name__} runs; build the config with "
                "chessgrpo.tasks.kinds.config_class(kind)"
            )
        device = resolve_device(config.device)
        # torchrun's process group (world size 1 without torchrun); rank 0 owns the run directory.
        self.parallel = Parallel.from_env(device)
        self.lock = RunLock(self.run_dir).acquire() if self.parallel.is_main else None
        self._kind: Kind | None = None
        self._restore_compile_flags: Callable[[], None] | None = None
        try:
            self.device = self.parallel.device_for(device)
            if config.threads:
                torch.set_num_threads(config.threads)
            elif self.parallel.local_world_size > 1:  # share the machine's cores between its ranks
                torch.set_num_threads(max(1, available_cores() // self.parallel.local_world_size))
            context = RunContext(self.run_dir, self.device, config.run.seed, config.bf16, self.parallel)
            checkpoint = self.parallel.broadcast(
                latest_checkpoint(self.run_dir) if resume and self.parallel.is_main else None
            )
            if resume and checkpoint is None:
                raise FileNotFoundError(f"no intact checkpoint to resume under {str(self.run_dir / 'checkpoints')!r}")

            torch.manual_seed(config.run.seed)  # the one explicit seeding: model init, dropout
            self._kind = kind_cls(config, context)
            self.optimizer, trainable = build_optimizer(self.kind, config)
            if config.compile:  # in place: the module (its mode, its state dict) stays the same object
                self._restore_compile_flags = compile_in_place(
                    self.kind.model, retain_graph=_measures_term_gradients(config, self.parallel)
                )
            # After build_optimizer: DDP registers gradient hooks on the parameters that train.
            self.kind.learner_model = self.parallel.wrap(self.kind.model)
            self.learner = Learner(self.optimizer, trainable, config.max_grad_norm, self.parallel)
            self.schedule = WarmupCosine(config.lr, config.warmup_steps, config.steps, config.min_lr_ratio)
            self.best = config.best_metric()

            self.step = 0
            self.lr_scale = 1.0  # divergence backoff, kept across rollbacks and resumes
            self.rollbacks = 0
            self.best_value: float | None = None
            self.best_step: int | None = None
            self.evals_since_best = 0
            self.consecutive_skips = 0
            self._stop_reason: str | None = None
            self._breaches = {"kl": 0, "entropy": 0}
            self._injected: set[int] = set()
            self.last_checkpoint: Path | None = None
            self.resumed = checkpoint is not None
            if checkpoint is not None:
                self._restore(checkpoint, health=True)
                logger.info("resumed %s from %s (step %d)", self.run_dir, checkpoint, self.step)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------------------------
    # Lifecycle

    @property
    def kind(self) -> Kind:
        """The kind of run this trainer runs (built in the constructor)."""
        if self._kind is None:
            raise RuntimeError("the trainer's kind was not built (its construction failed)")
        return self._kind

    def close(self, together: bool = False) -> None:
        """Release the kind, the lock and the process group (`together`: a clean finish on every rank), and give torch's
        compile flags back (`compile_in_place`)."""
        if self._kind is not None:
            self._kind.close()
        restore, self._restore_compile_flags = self._restore_compile_flags, None
        if restore is not None:
            restore()
        if self.lock is not None:
            self.lock.release()
        self.parallel.close(together=together)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(together=exc_type is None)

    def request_stop(self, reason: str = "interrupted") -> None:
        """Finish the current step, checkpoint and return from `train`."""
        self._stop_reason = self._stop_reason or reason

    @property
    def end_step(self) -> int:
        config = self.config
        return config.steps if config.stop_at is None else min(config.steps, config.stop_at)

    # ---------------------------------------------------------------------------------------------
    # Checkpoints

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            **optimizer_state(self.optimizer, self.config.checkpoint_optimizer),
            "rng": capture_rng_state(),
            "kind": self.kind.state_dict(),
            "health": {"lr_scale": self.lr_scale, "rollbacks": self.rollbacks},
            "best": {"value": self.best_value, "step": self.best_step, "evals_since": self.evals_since_best},
            "config": to_dict(self.config),
        }

    def _checkpoint(self) -> Path | None:
        """Save a checkpoint of the current step unless the model is not healthy (then keep the last good one).

        Rank 0 writes it; every rank returns its path once it is complete (the ranks hold the same
        weights, so they take the same decision).
        """
        if self.parallel.enabled:
            path = self._save_checkpoint() if self.parallel.is_main else None
            self.last_checkpoint = self.parallel.broadcast(path) or self.last_checkpoint
            return path
        return self._save_checkpoint()

    def _save_checkpoint(self) -> Path | None:
        if self.consecutive_skips:
            logger.warning("step %d: not checkpointing while updates are being skipped", self.step)
            return None
        if not all(bool(torch.isfinite(p).all()) for p in self.kind.model.parameters()):
            logger.warning("step %d: the weights are not finite; not checkpointing", self.step)
            return None
        self.last_checkpoint = save_checkpoint(
            self.run_dir,
            self.step,
            save_model=self.kind.save_model,
            trainer_state=self._trainer_state(),
            keep=self.config.keep_checkpoints,
            best_step=self.best_step,
        )
        if self._writer is not None:  # no rollback or resume goes back before this step: its rows are final (W&B)
            self._writer.commit(self.step)
        return self.last_checkpoint

    def _restore(self, checkpoint: Path, *, health: bool) -> None:
        """Load a checkpoint into the model, optimizer, kind and RNGs (and the health state when `health`)."""
        state = load_trainer_state(checkpoint)
        self.kind.load_model(checkpoint)
        restore_optimizer(self.optimizer, state, checkpoint)  # fresh, with a warning, if it was not saved
        self.kind.load_state_dict(state.get("kind", {}))
        self.step = int(state["step"])
        if health:
            self.lr_scale = float(state.get("health", {}).get("lr_scale", 1.0))
            self.rollbacks = int(state.get("health", {}).get("rollbacks", 0))
            best = state.get("best", {})
            self.best_value, self.best_step = best.get("value"), best.get("step")
            self.evals_since_best = int(best.get("evals_since", 0))
        restore_rng_state(state["rng"])
        self.last_checkpoint = checkpoint

    # ---------------------------------------------------------------------------------------------
    # One step

    def _set_lr(self) -> float:
        lr = self.schedule.lr(self.step) * self.lr_scale
        head_scale = (self.config.head_lr / self.config.lr) if self.config.head_lr else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = lr * head_scale if group.get("head") else lr
        return lr

    def _inject(self) -> bool:
        """Whether the debug hook poisons this step's loss (each step at most once per process)."""
        debug = self.config.debug
        number = self.step + 1  # 1-based, as the config says
        if debug.nonfinite_at_step is None or number in self._injected:
            return False
        if debug.nonfinite_at_step <= number < debug.nonfinite_at_step + debug.nonfinite_steps:
            self._injected.add(number)
            return True
        return False

    def train_step(self) -> dict[str, float]:
        """One step of the kind under the divergence policy; returns the step's metrics."""
        lr = self._set_lr()
        self.learner.inject_nonfinite = self._inject()
        tick = time.perf_counter()
        try:
            values = self.parallel.mean_metrics(self.kind.train_step(self.step, self.learner))
            bad = {k: v for k, v in values.items() if k not in _MAY_BE_NAN and not math.isfinite(v)}
            if bad:
                raise NonFiniteError(f"non-finite metrics {bad}")
        except NonFiniteError as error:
            self.step += 1
            return self._skipped(lr, error)
        finally:
            self.learner.inject_nonfinite = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.step += 1
        self.consecutive_skips = 0
        values.setdefault("lr", lr)
        values.setdefault("perf/step_s", time.perf_counter() - tick)
        return values

    def _skipped(self, lr: float, error: Exception) -> dict[str, float]:
        self.consecutive_skips += 1
        self._event(
            "nonfinite_skip",
            f"step {self.step}: update skipped ({self.consecutive_skips} in a row): {str(error)[:300]}",
        )
        values = {"health/nonfinite_skip": 1.0, "health/consecutive_skips": float(self.consecutive_skips), "lr": lr}
        if self.consecutive_skips >= self.config.divergence.max_consecutive_skips:
            self._rollback(error)
            values = {
                "health/rollback": 1.0,
                "health/lr_scale": self.lr_scale,
                "lr": self.schedule.lr(self.step) * self.lr_scale,
            }
        return values

    def _rollback(self, error: Exception) -> None:
        divergence = self.config.divergence
        checkpoint = self.parallel.broadcast(latest_checkpoint(self.run_dir) if self.parallel.is_main else None)
        if self.rollbacks >= divergence.max_rollbacks or checkpoint is None:
            message = (
                f"training diverged at step {self.step}: {self.consecutive_skips} non-finite steps in a row after "
                f"{self.rollbacks} rollback(s) (divergence.max_rollbacks={divergence.max_rollbacks}); last error: "
                f"{str(error)[:300]}. The last good checkpoint is {checkpoint}; try a lower lr, a larger KL "
                f"coefficient or bf16=false"
            )
            self._event("diverged", message)
            raise TrainingDiverged(message)
        failed_at = self.step
        self._restore(checkpoint, health=False)
        self.rollbacks += 1
        self.lr_scale *= divergence.lr_backoff
        self.consecutive_skips = 0
        self._event(
            "rollback",
            f"step {failed_at}: rolled back to {checkpoint.name} (rollback {self.rollbacks} of at most "
            f"{divergence.max_rollbacks}); learning rate now x{self.lr_scale:g}",
        )
        if self._writer is not None:
            self._writer.rewind(self.step)

    # ---------------------------------------------------------------------------------------------
    # Stop rules

    def _check_early_stop(self, values: dict[str, float]) -> None:
        rules = self.config.early_stop
        kl = values.get("kl/exact", values.get("kl/value") if self._kl_estimate_is_nonnegative() else None)
        checks = (
            ("kl", rules.kl_max, kl, rules.kl_patience, lambda v, t: v > t, "KL to the reference", "above"),
            (
                "entropy",
                rules.entropy_min,
                values.get("entropy/mean"),
                rules.entropy_patience,
                lambda v, t: v < t,
                "mean entropy",
                "below",
            ),
        )
        for name, threshold, value, patience, breached, label, side in checks:
            if threshold is None or value is None:
                continue
            self._breaches[name] = self._breaches[name] + 1 if breached(value, threshold) else 0
            if self._breaches[name] >= patience:
                self._early_stop(f"{label} {value:.4g} {side} {threshold:g} for {patience} step(s) in a row")

    def _kl_estimate_is_nonnegative(self) -> bool:
        grpo = getattr(self.config, "grpo", None)
        return grpo is not None and grpo.kl_estimator in ("exact", "k2", "k3")

    def _early_stop(self, why: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = f"early stop: {why}"
            self._event("early_stop", f"step {self.step}: {why}")

    def _track_best(self, eval_metrics: dict[str, float]) -> bool:
        """Update the best held-out value; True when this evaluation is the new best."""
        if self.best is None:
            return False
        name, mode = self.best
        value = eval_metrics.get(name)
        if value is None or not math.isfinite(value):
            return False
        better = self.best_value is None or (value < self.best_value if mode == "min" else value > self.best_value)
        if better:
            self.best_value, self.best_step, self.evals_since_best = value, self.step, 0
            return True
        self.evals_since_best += 1
        patience = self.config.early_stop.heldout_patience
        if patience is not None and self.evals_since_best >= patience:
            self._early_stop(
                f"held-out {name} has not improved on {self.best_value:.4g} (step {self.best_step}) for {patience} evaluations"
            )
        return False

    def _event(self, event: str, message: str) -> None:
        if not self.parallel.is_main:  # every rank took the same decision; rank 0 records it
            return
        logger.warning("%s", message)
        record = {"step": self.step, "time": time.time(), "event": event, "message": message}
        with open(self.run_dir / EVENTS_FILE, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    # ---------------------------------------------------------------------------------------------
    # The loop

    def _evaluate(self) -> dict[str, float]:
        """The kind's held-out evaluation, on rank 0 (the other ranks wait and receive its metrics)."""
        metrics: dict[str, float] | None = None
        if self.parallel.is_main:
            tick = time.perf_counter()
            metrics = self.kind.evaluate(self.step, self.run_dir / "eval")
            metrics.setdefault("perf/eval_s", time.perf_counter() - tick)
        return self.parallel.broadcast(metrics)

    def _sync_stop(self) -> None:
        """A stop requested on any rank (a signal reaches each process on its own) stops every rank."""
        if self.parallel.enabled:
            reasons = [r for r in self.parallel.all_gather(self._stop_reason) if r is not None]
            self._stop_reason = reasons[0] if reasons else None

    def train(self, progress: Progress | None = None) -> TrainResult:
        """Train from the current step to `steps` (or `stop_at`, or an earlier stop)."""
        config, kind = self.config, self.kind
        end = self.end_step
        eval_metrics: dict[str, float] | None = None
        resume_step = self.step if self.resumed else None
        main = self.parallel.is_main
        if main:
            save_config(config, self.run_dir / "config.yaml")
            if not self.resumed:
                (self.run_dir / EVENTS_FILE).unlink(missing_ok=True)
            if not self.resumed or not (self.run_dir / RUN_INFO_FILE).exists():
                # What code and machine made the run (the report's metadata); a resume keeps the original.
                write_json_atomic(self.run_dir / RUN_INFO_FILE, collect_run_info(str(self.device)), indent=1)
        if not main:  # rank 0 alone writes metrics; the others compute the same rows and drop them
            progress = None
        writer_context = (
            MetricsWriter(
                self.run_dir / METRICS_FILE,
                resume_step=resume_step,
                tracking=config.tracking,
                run_config=to_dict(config),
            )
            if main
            else _NullWriter()
        )
        with writer_context as writer:
            self._writer = writer
            if self.step == 0 and not self.resumed:
                if kind.evaluates and config.eval_at_start:
                    eval_metrics = self._evaluate()
                    self._track_best(eval_metrics)
                    row: dict[str, Any] | None = writer.log(0, eval_metrics)
                    if progress is not None:
                        progress(0, row)
                self._checkpoint()  # the rollback target of a fresh run
            window: list[dict[str, float]] = []
            step_seconds = 0.0  # this invocation's summed step time (time_limit_minutes)
            while self.step < end and self._stop_reason is None:
                tick = time.perf_counter()
                values = self.train_step()
                step_seconds += time.perf_counter() - tick
                if config.time_limit_minutes is not None and step_seconds >= 60 * config.time_limit_minutes:
                    self.request_stop(f"time_limit_minutes={config.time_limit_minutes:g}")
                self._sync_stop()
                if "health/rollback" in values:
                    window = []
                    writer.log(self.step, values)
                    continue
                if "health/nonfinite_skip" not in values:
                    self._check_early_stop(values)
                window.append(values)
                last = self.step == end or self._stop_reason is not None
                row_values: dict[str, float] = {}
                if self.step % config.log_every == 0 or last:
                    row_values = kind.finish_window(_window_mean(window))
                    row_values["lr"] = window[-1]["lr"]
                    window = []
                best_now = False
                timed_out = (self._stop_reason or "").startswith("time_limit_minutes")  # its last step is evaluated
                if kind.evaluates and (
                    (config.eval_every and self.step % config.eval_every == 0) or self.step == config.steps or timed_out
                ):
                    eval_metrics = self._evaluate()
                    best_now = self._track_best(eval_metrics)
                    row_values.update(eval_metrics)
                    last = last or self._stop_reason is not None
                if self._stop_reason is not None:
                    row_values["health/early_stop"] = float(self._stop_reason.startswith("early stop"))
                row = writer.log(self.step, row_values) if row_values else None
                if (config.checkpoint_every and self.step % config.checkpoint_every == 0) or last or best_now:
                    self._checkpoint()
                if progress is not None:
                    progress(self.step, row)
            self._writer = None
        if self.last_checkpoint is None:
            self._checkpoint()
        checkpoint = self.last_checkpoint
        if checkpoint is None:
            raise RuntimeError(f"no checkpoint was written under {self.run_dir}")
        finished = self.step >= config.steps
        if finished and kind.evaluates and main:
            kind.after_run(self.run_dir / "eval")
        # Every rank leaves together: a rank tearing down the process group while rank 0 still
        # writes its last evaluation aborts the job at exit.
        self.parallel.barrier()
        stop_reason = self._stop_reason
        if stop_reason is None and not finished:
            stop_reason = f"stop_at={config.stop_at}"
        from chessgrpo.train.checkpoint import best_checkpoint

        return TrainResult(
            step=self.step,
            finished=finished,
            checkpoint=checkpoint,
            eval_metrics=eval_metrics,
            stop_reason=stop_reason,
            best_checkpoint=best_checkpoint(self.run_dir),
        )

    _writer: MetricsWriter | _NullWriter | None = None


class _NullWriter:
    """What the ranks other than 0 log to: nothing (`MetricsWriter`'s interface)."""

    def __enter__(self) -> _NullWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def log(self, step: int, values: dict[str, float]) -> dict[str, Any]:
        return {"step": step, **values}

    def commit(self, step: int) -> None:
        pass

    def rewind(self, step: int) -> None:
        pass


def _window_mean(window: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the rows of a log window that hold it."""
    keys = dict.fromkeys(key for row in window for key in row)
    return {key: sum(row[key] for row in window if key in row) / sum(key in row for row in window) for key in keys}


def _measures_term_gradients(config: TrainConfig, parallel: Parallel) -> bool:
    """Whether the learner will take several gradients of one graph (`rl.learner.term_gradient_norms`): a GRPO kind
    with ``grpo.term_gradient_every`` > 0, in one process (DDP runs never measure them)."""
    grpo = getattr(config, "grpo", None)
    return parallel.world_size == 1 and int(getattr(grpo, "term_gradient_every", 0) or 0) > 0


def compile_in_place(model: torch.nn.Module, *, retain_graph: bool = False) -> Callable[[], None]:
    """`torch.compile` the model's forward in place (config key ``compile``); returns a function that gives torch's
    process-global compile flags back (`Trainer.close` calls it).

    With `retain_graph` (the learner's per-term gradient norms, `rl.learner.term_gradient_norms`, take several
    gradients of one graph with ``retain_graph=True``) AOTAutograd must not donate the saved tensors' buffers to the
    backward (torch._functorch.config: "This flag must be set False if a user wants to retain_graph=True"). The flag
    is process-global and read whenever a graph is (re)compiled, so it stays False while this run trains and is
    restored after; runs that never retain a graph keep torch's default. Keeping the buffers costs a little memory
    and changes no value.
    """
    import torch._functorch.config as functorch_config  # noqa: PLC0415 (only compiled runs need it)

    previous = functorch_config.donated_buffer
    if retain_graph:
        functorch_config.donated_buffer = False
    model.compile()

    def restore() -> None:
        functorch_config.donated_buffer = previous

    return restore
