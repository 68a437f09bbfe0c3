"""Running a sweep: an Optuna study whose trials are ordinary training runs on the spine.

`run_sweep(sweep)` opens (or continues) the study in its storage, enqueues the base config's own
values as the default trial once, and lets `optuna.Study.optimize` run the budget. Each trial
(`TrialRunner.objective`):

1. draws its parameters from the space (`Sweep.suggest`: conditional keys only when their
   condition holds) and builds its run config: the base, the sweep's overrides, the parameters,
   run directory ``<study_dir>/trial_NNNN`` (a `ConfigError` fails the trial with its message);
2. trains through `train.loop.Trainer`, as `chessgrpo train` does; at every held-out evaluation
   after step 0 the objective's value goes to ``trial.report(value, step)``, and when the pruner
   says so the run stops after that step and the trial is PRUNED;
3. scores the run: the metric at its last evaluation (``measure: final``, with the evaluation's
   interval) or its change since step 0 (``measure: change``, with the paired bootstrap interval
   of `eval.compare` when the evaluation wrote per-item records). A run that diverged
   (`TrainingDiverged`), stopped early, was interrupted, never logged the metric or crashed is
   FAILED with its reason (user attribute ``fail_reason``; a crash's traceback goes to
   ``RUN_DIR/sweep_error.txt``), never a silent success. Non-fatal health events of a finished run
   (skipped updates, rollbacks) are kept in the attribute ``health``.

Studies are resumable: rerunning the command loads the study (``load_if_exists``), runs `trials`
more (never the finished ones again: the sampler's seed moves with the study's trial count), and
the heartbeat of the RDB storage marks trials of a killed process as failed. With ``parallel: N``
the machine runs N worker processes against the same storage (Optuna's multi-process pattern),
each trial's torch threads and engine processes set to the cores divided by N.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import multiprocessing
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chessgrpo.config import ConfigError, to_dict
from chessgrpo.errors import ChessGRPOError
from chessgrpo.sweep.config import Sweep, sweep_record
from chessgrpo.sweep.storage import open_storage, quiet_optuna, redacted

logger = logging.getLogger(__name__)

StepProgress = Callable[[int, "dict[str, Any] | None"], None]
ProgressFactory = Callable[[str, int, int], contextlib.AbstractContextManager[StepProgress]]
"""(trial run name, first step, last step) -> a context giving the per-step progress callback (the CLI's bar)."""


class TrialFailed(ChessGRPOError):
    """A trial's run did not produce the objective (stopped early, never logged the metric, ...)."""


@dataclasses.dataclass
class SweepRun:
    """What one `run_sweep` call did."""

    study_name: str
    storage: str
    trials_run: int
    """Trials this invocation finished (complete, pruned or failed)."""
    stop_reason: str | None = None
    """Why the invocation stopped before its budget (failures in a row, a signal, max_trials reached)."""
    exit_code: int = 0
    """0, or 130 / 143 after SIGINT / SIGTERM."""


# ------------------------------------------------------------------------------------------------
# Optuna objects


def make_sampler(sweep: Sweep, seed_offset: int = 0) -> Any:
    import optuna

    config = sweep.config.sampler
    seed = None if config.seed is None else config.seed + seed_offset
    if config.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=config.n_startup_trials)


def make_pruner(sweep: Sweep) -> Any:
    import optuna

    config = sweep.config.pruner
    if config.name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=config.n_startup_trials, n_warmup_steps=config.n_warmup_steps
        )
    if config.name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=config.min_resource if config.min_resource is not None else "auto",
            reduction_factor=config.reduction_factor,
        )
    if config.name == "threshold":
        return optuna.pruners.ThresholdPruner(lower=config.lower, upper=config.upper)
    return optuna.pruners.NopPruner()


def open_study(sweep: Sweep, seed_offset: int = 0, *, create: bool = False) -> Any:
    """The sweep's study (created when `create`, else loaded), with its sampler and pruner.

    A study created by another sweep (another objective or direction) is refused, since its
    values would not be comparable.
    """
    import optuna

    quiet_optuna()
    storage = open_storage(sweep.storage)
    objective = sweep.config.objective
    direction = objective.direction
    sampler, pruner = make_sampler(sweep, seed_offset), make_pruner(sweep)
    if create:
        study = optuna.create_study(
            storage=storage,
            study_name=sweep.study_name,
            direction=direction,
            sampler=sampler,
            pruner=pruner,
            load_if_exists=True,
        )
    else:
        study = optuna.load_study(storage=storage, study_name=sweep.study_name, sampler=sampler, pruner=pruner)
    recorded = study.user_attrs.get("sweep")
    if recorded is None:
        if study.trials:
            raise ConfigError(
                f"study {sweep.study_name!r} in {redacted(sweep.storage)} was not created by `chessgrpo sweep`; choose another study_name"
            )
        study.set_user_attr("sweep", sweep_record(sweep))
    else:
        before = recorded.get("objective", {})
        now = to_dict(objective)
        if (
            study.direction.name.lower() != direction
            or before.get("metric") != now["metric"]
            or before.get("measure") != now["measure"]
        ):
            raise ConfigError(
                f"study {sweep.study_name!r} optimises {before.get('metric')} ({before.get('measure')}, {study.direction.name.lower()}); "
                f"this sweep asks for {now['metric']} ({now['measure']}, {direction}): set another study_name to start a new study"
            )
        changed = base_differences(sweep, recorded.get("base") or {})
        if changed:
            raise ConfigError(
                f"study {sweep.study_name!r} was run with another base config: {', '.join(changed[:8])} differ, so new trials would "
                "not be comparable with its earlier ones; restore them or set another study_name"
            )
    return study


def base_differences(sweep: Sweep, recorded: dict[str, Any]) -> list[str]:
    """Dotted keys whose value differs between the study's recorded base config and this sweep's.

    Keys that leave the training math alone may differ (run directory, engine paths and process
    counts, threads, evaluation cadence, tracking): several machines run one study with their own.
    """
    from chessgrpo.config import resumable_keys

    def flat(data: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(data, dict):
            return {prefix: data}
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out

    free = (resumable_keys(sweep.config_class) - {"steps"}) | {"run.out_dir", "run.name"}
    before, now = flat(recorded), flat(to_dict(sweep.base_config))
    return sorted(
        k for k in set(before) | set(now) if k not in free and json.dumps(before.get(k)) != json.dumps(now.get(k))
    )


def enqueue_default(study: Any, sweep: Sweep) -> None:
    """Queue the base config's own values as a trial: once per study, and again only when every earlier
    default trial was interrupted (a signal, a killed process), since it is the reference of `--remeasure`."""
    from optuna.trial import TrialState

    if not sweep.config.enqueue_default:
        return
    for trial in study.get_trials(deepcopy=False):
        if not trial.user_attrs.get("default"):
            continue
        reason = trial.user_attrs.get("fail_reason")
        interrupted = trial.state == TrialState.FAIL and (reason is None or "interrupted by" in reason)
        if not interrupted:
            return
    study.enqueue_trial(dict(sweep.default_params), user_attrs={"default": True})


# ------------------------------------------------------------------------------------------------
# One trial


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's health events (RUN_DIR/events.jsonl, written by the spine)."""
    from chessgrpo.train.metrics import EVENTS_FILE

    path = run_dir / EVENTS_FILE
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def paired_change(run_dir: Path, metric: str, first_step: int, last_step: int) -> tuple[Any, int] | None:
    """(the paired bootstrap interval of `metric`'s change, items paired) from the run's per-item evaluation files.

    None when the kind writes no per-item records for this metric (e.g. pretraining's test split):
    which metrics pair, and from which files, is `eval.registry.paired_objective`.
    """
    from chessgrpo.eval.compare import compare_files
    from chessgrpo.eval.registry import paired_objective

    found = paired_objective(metric)
    if found is None:
        return None
    evaluation, name = found
    first, last = (run_dir / "eval" / evaluation.step_file(step) for step in (first_step, last_step))
    if not (first.is_file() and last.is_file()):
        return None
    comparison = compare_files(first, last)
    paired = next(m for m in comparison.metrics if m.metric == name)
    return paired.difference, comparison.n


@dataclasses.dataclass
class _Tracker:
    """Follows a trial's held-out evaluations: reports the objective to Optuna and asks the pruner."""

    trial: Any
    metric: str
    change: bool
    last_step: int
    pruning: bool
    start: float | None = None
    last: tuple[int, float, dict[str, Any]] | None = None
    pruned: str | None = None
    seen: set[str] = dataclasses.field(default_factory=set)

    def __call__(self, step: int, row: dict[str, Any] | None, trainer: Any) -> None:
        if row is None:
            return
        self.seen.update(k for k in row if k.startswith("eval/") and not k.endswith(("_low", "_high")))
        value = row.get(self.metric)
        if value is None:
            return
        if step == 0:
            self.start = float(value)
            return
        if self.change and self.start is None:
            return  # no step-0 value: reported as a failure after the run
        objective = float(value) - self.start if self.change and self.start is not None else float(value)
        self.last = (step, objective, row)
        if not math.isfinite(objective):
            return
        self.trial.report(objective, step)
        if self.pruning and step < self.last_step and self.trial.should_prune():
            self.pruned = f"at step {step}: {self.metric}{' change' if self.change else ''} {objective:.4g}"
            trainer.request_stop(f"pruned {self.pruned}")


class TrialRunner:
    """The Optuna objective (one trial = one training run) and the after-trial callback."""

    def __init__(
        self,
        sweep: Sweep,
        *,
        cores: int | None = None,
        on_trial: Callable[[Any], None] | None = None,
        progress: ProgressFactory | None = None,
    ):
        self.sweep = sweep
        self.cores = cores
        self.on_trial = on_trial
        self.progress = progress
        self.failures_in_a_row = 0
        self.trials_run = 0
        self.stop_reason: str | None = None
        self.signal: int | None = None
        self._trainer: Any = None

    def interrupt(self, signum: int) -> None:
        """Stop after the current trial's current step (the trial is FAILED as interrupted) and end the sweep."""
        self.signal = self.signal or signum
        reason = f"interrupted by {signal.Signals(signum).name}"
        self.stop_reason = self.stop_reason or reason
        if self._trainer is not None:
            self._trainer.request_stop(reason)

    def objective(self, trial: Any) -> float:
        import optuna

        from chessgrpo.train.checkpoint import latest_checkpoint
        from chessgrpo.train.loop import Trainer

        tick = time.time()
        params = self.sweep.suggest(trial)
        try:
            config, portable = self.sweep.trial_config(trial.number, params, self.cores)
        except ConfigError as error:
            return self._fail(trial, f"invalid run config: {error}")
        run_dir = config.run.directory
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("config", to_dict(portable))
        if latest_checkpoint(run_dir) is not None:
            return self._fail(
                trial, f"{run_dir} already holds a run (a study of the same name was deleted?); move it away"
            )
        if self.signal is not None:
            return self._fail(trial, self.stop_reason or "interrupted")
        objective = self.sweep.config.objective
        tracker = _Tracker(
            trial,
            objective.metric,
            objective.measure == "change",
            config.steps,
            pruning=self.sweep.config.pruner.name != "none",
        )
        result = None
        try:
            with Trainer(config) as trainer:
                self._trainer = trainer
                if self.signal is not None:
                    trainer.request_stop(self.stop_reason or "interrupted")
                bar = (
                    self.progress(run_dir.name, trainer.step, trainer.end_step)
                    if self.progress
                    else contextlib.nullcontext(None)
                )
                with bar as step_progress:

                    def progress(step: int, row: dict[str, Any] | None) -> None:
                        if step_progress is not None:
                            step_progress(step, row)
                        tracker(step, row, trainer)

                    result = trainer.train(progress)
        except Exception as error:  # noqa: BLE001 - every failure of a trial is recorded, the sweep goes on
            expected = isinstance(error, (ChessGRPOError, ValueError, FileNotFoundError))
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            if not expected:
                path = run_dir / "sweep_error.txt"
                with contextlib.suppress(OSError):
                    run_dir.mkdir(parents=True, exist_ok=True)
                    path.write_text("".join(traceback.format_exception(error)))
                reason += f" (traceback: {path})"
            self._health(trial, run_dir)
            trial.set_user_attr("duration_s", time.time() - tick)
            trial.set_user_attr("fail_reason", reason[:1000])
            raise
        finally:
            self._trainer = None
        self._health(trial, run_dir)
        trial.set_user_attr("steps", result.step)
        trial.set_user_attr("duration_s", time.time() - tick)
        if tracker.last is not None:
            trial.set_user_attr("metrics", _eval_metrics(tracker.last[2]))
        if tracker.pruned is not None:
            trial.set_user_attr("pruned_reason", tracker.pruned)
            raise optuna.TrialPruned(tracker.pruned)
        if not result.finished:
            return self._fail(trial, f"stopped before step {config.steps}: {result.stop_reason}")
        if objective.measure == "change" and tracker.start is None:
            return self._fail(
                trial, f"no step-0 value of {objective.metric} (is eval_at_start on?); measure: change needs it"
            )
        if tracker.last is None or tracker.last[0] != result.step:
            seen = ", ".join(sorted(tracker.seen)) or "none"
            return self._fail(
                trial, f"the run never logged {objective.metric} at its last step (its held-out metrics: {seen})"
            )
        step, value, row = tracker.last
        if not math.isfinite(value):
            return self._fail(trial, f"{objective.metric} is not finite ({value}) at step {step}")
        interval = None
        if objective.measure == "change":
            trial.set_user_attr("start_value", tracker.start)
            paired = paired_change(run_dir, objective.metric, 0, step)
            if paired is not None:
                difference, n = paired
                interval = [difference.low, difference.high]
                trial.set_user_attr("paired_items", n)
        elif f"{objective.metric}_low" in row:
            interval = [row[f"{objective.metric}_low"], row[f"{objective.metric}_high"]]
        trial.set_user_attr("interval", interval)
        return value

    def _fail(self, trial: Any, reason: str) -> float:
        trial.set_user_attr("fail_reason", reason[:1000])
        raise TrialFailed(reason)

    @staticmethod
    def _health(trial: Any, run_dir: Path) -> None:
        events = read_events(run_dir)
        if events:
            trial.set_user_attr(
                "health", [f"{e.get('event')}: {str(e.get('message', ''))[:300]}" for e in events][-20:]
            )

    def after_trial(self, study: Any, frozen: Any) -> None:
        """Optuna callback: report the finished trial, count failures in a row, stop on a signal."""
        from optuna.trial import TrialState

        from chessgrpo.sweep.summary import outcome

        self.trials_run += 1
        if self.on_trial is not None:
            self.on_trial(outcome(frozen))
        self.failures_in_a_row = self.failures_in_a_row + 1 if frozen.state == TrialState.FAIL else 0
        limit = self.sweep.config.budget.max_failures_in_a_row
        if self.signal is not None:
            study.stop()
        elif limit is not None and self.failures_in_a_row >= limit:
            reason = frozen.user_attrs.get("fail_reason", "no reason recorded")
            self.stop_reason = (
                f"{self.failures_in_a_row} trials failed in a row (budget.max_failures_in_a_row); the last: {reason}"
            )
            study.stop()


def _eval_metrics(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k.startswith("eval/") and isinstance(v, (int, float))}


# ------------------------------------------------------------------------------------------------
# The sweep


@contextlib.contextmanager
def _signals_stop(runner: TrialRunner) -> Iterator[None]:
    """SIGINT / SIGTERM: finish the current step, checkpoint, mark the trial interrupted, end the sweep."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        logger.warning("%s: stopping the current trial after its step; the sweep ends", signal.Signals(signum).name)
        runner.interrupt(signum)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _finished_count(study: Any) -> int:
    from optuna.trial import TrialState

    return sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in study.get_trials(deepcopy=False)
    )


def optimize(
    sweep: Sweep,
    n_trials: int,
    *,
    worker: int = 0,
    cores: int | None = None,
    on_trial: Callable[[Any], None] | None = None,
    progress: ProgressFactory | None = None,
) -> SweepRun:
    """Run `n_trials` trials of the (existing) study in this process; what a worker does."""
    import optuna
    from optuna.trial import TrialState

    probe = open_study(sweep)
    existing = len(probe.trials)
    # A seed per invocation and worker: the same seed again would propose the first points again.
    study = open_study(sweep, seed_offset=7919 * existing + 104_729 * worker)
    runner = TrialRunner(sweep, cores=cores, on_trial=on_trial, progress=progress)
    callbacks: list[Any] = [runner.after_trial]
    budget = sweep.config.budget
    if budget.max_trials is not None:
        callbacks.append(
            optuna.study.MaxTrialsCallback(
                budget.max_trials, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
            )
        )
    with _signals_stop(runner):
        study.optimize(
            runner.objective,
            n_trials=n_trials,
            timeout=budget.timeout_s,
            catch=(Exception,),
            callbacks=callbacks,
            gc_after_trial=True,
        )
    exit_code = {signal.SIGINT: 130, signal.SIGTERM: 143}.get(runner.signal, 0) if runner.signal else 0
    return SweepRun(sweep.study_name, sweep.storage, runner.trials_run, runner.stop_reason, exit_code)


def _worker(sweep: Sweep, n_trials: int, worker: int, cores: int, on_trial: Callable[[Any], None] | None) -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    run = optimize(sweep, n_trials, worker=worker, cores=cores, on_trial=on_trial)
    if run.stop_reason:
        logger.warning("worker %d: %s", worker, run.stop_reason)
    raise SystemExit(run.exit_code)


def run_sweep(
    sweep: Sweep, *, on_trial: Callable[[Any], None] | None = None, progress: ProgressFactory | None = None
) -> SweepRun:
    """Create or continue the sweep's study and run this invocation's budget (see the module docstring).

    `on_trial(TrialOutcome)` is called as each trial finishes (from the worker processes too, so it
    must be a module-level function when ``parallel`` > 1); `progress` draws a trial's steps (only
    with ``parallel: 1``).
    """
    from chessgrpo.engine.pool import available_cores

    study = open_study(sweep, create=True)
    enqueue_default(study, sweep)
    budget = sweep.config.budget
    n_trials = budget.trials
    if budget.max_trials is not None:
        left = budget.max_trials - _finished_count(study)
        if left <= 0:
            return SweepRun(
                sweep.study_name,
                sweep.storage,
                0,
                f"the study already has {budget.max_trials} finished trials (budget.max_trials)",
            )
        n_trials = min(n_trials, left)
    cores = available_cores()
    parallel = min(sweep.config.parallel, n_trials)
    if parallel == 1:
        return optimize(sweep, n_trials, cores=cores, on_trial=on_trial, progress=progress)

    before = _finished_count(study)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no torch or engine state shared
    shares = [n_trials // parallel + (i < n_trials % parallel) for i in range(parallel)]
    workers = [
        context.Process(target=_worker, args=(sweep, share, i, cores, on_trial), name=f"sweep-worker-{i}")
        for i, share in enumerate(shares)
    ]
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:  # the workers get the terminal's signal themselves
        received.append(signum)
        for process in workers:
            if process.pid is not None and process.is_alive() and signum == signal.SIGTERM:
                process.terminate()

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Optuna can hand one waiting (enqueued) trial to two workers that pop it at the same
        # moment from SQLite (both then run the same trial directory): the first worker takes the
        # waiting trials alone, the others start once none is left waiting.
        import optuna

        workers[0].start()
        waiting = (optuna.trial.TrialState.WAITING,)
        while workers[0].is_alive() and open_study(sweep).get_trials(deepcopy=False, states=waiting):
            time.sleep(0.5)  # a fresh read of the storage each time
        for process in workers[1:]:
            process.start()
        for process in workers:
            process.join()
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
    codes = [process.exitcode for process in workers]
    trials_run = _finished_count(open_study(sweep)) - before
    stop = None
    exit_code = 0
    if received:
        exit_code = {signal.SIGINT: 130, signal.SIGTERM: 143}[received[0]]
        stop = f"interrupted by {signal.Signals(received[0]).name}"
    elif any(code not in (0, None) for code in codes):
        stop = f"worker exit codes {codes} (see their messages above)"
    return SweepRun(sweep.study_name, sweep.storage, trials_run, stop, exit_code)
