"""What a study found: the trials, the best ones with their intervals, parameter importances, the
best config as a YAML for `chessgrpo train`, and the honest check of the winner.

`summarize(study)` reads everything from Optuna's storage (the trials' user attributes hold their
run directory, resolved config, final held-out metrics and interval, failure reason and health
events), so a summary works on any machine that reaches the storage. `write_best_config` writes
``<study_dir>/best_config.yaml``.

The best trial's objective is an optimistic estimate: it was *selected* on the same held-out
positions it is scored on (with many trials, one is lucky). `remeasure` evaluates the best trial's
final policy and the default trial's (the base config's own values) on positions and puzzles that
no trial was evaluated on, paired (`eval.compare`), and only that difference says whether the
search beat the default.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import warnings
from pathlib import Path
from typing import Any

from chessgrpo.config import ConfigError
from chessgrpo.sweep.config import STUDY_DB

BEST_CONFIG = "best_config.yaml"
REMEASURE_DIR = "remeasure"


@dataclasses.dataclass
class TrialOutcome:
    """One trial as the summary and the per-trial lines show it."""

    number: int
    state: str
    """complete, pruned, failed, running or waiting."""
    params: dict[str, Any]
    value: float | None = None
    """The objective (complete trials), or the last reported value (pruned ones)."""
    interval: tuple[float, float] | None = None
    """95% interval of the objective: the evaluation's own (final) or the paired bootstrap (change)."""
    reason: str | None = None
    """Why a trial was pruned or failed."""
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    """The last held-out evaluation's eval/ metrics (with _low/_high bounds)."""
    run_dir: str | None = None
    config: dict[str, Any] | None = None
    """The trial's run config without this machine's run directory and core split (what best_config.yaml holds)."""
    steps: int | None = None
    duration_s: float | None = None
    health: list[str] = dataclasses.field(default_factory=list)
    default: bool = False
    """The enqueued trial with the base config's own values."""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("config")
        return out


def outcome(trial: Any) -> TrialOutcome:
    """A `TrialOutcome` from an Optuna `FrozenTrial`."""
    from optuna.trial import TrialState

    attrs = trial.user_attrs
    state = {
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.FAIL: "failed",
        TrialState.RUNNING: "running",
        TrialState.WAITING: "waiting",
    }[trial.state]
    value = trial.value if trial.state == TrialState.COMPLETE else None
    if trial.state == TrialState.PRUNED and trial.intermediate_values:
        value = trial.intermediate_values[max(trial.intermediate_values)]
    reason = attrs.get("fail_reason") or attrs.get("pruned_reason")
    if trial.state == TrialState.FAIL and reason is None:
        reason = "no reason recorded: the process running it stopped (killed, or no heartbeat)"
    duration = attrs.get("duration_s")
    if duration is None and trial.datetime_start is not None and trial.datetime_complete is not None:
        duration = (trial.datetime_complete - trial.datetime_start).total_seconds()
    interval = attrs.get("interval")
    return TrialOutcome(
        number=trial.number,
        state=state,
        params=dict(trial.params),
        value=value,
        interval=tuple(interval) if interval else None,
        reason=reason,
        metrics=dict(attrs.get("metrics") or {}),
        run_dir=attrs.get("run_dir"),
        config=attrs.get("config"),
        steps=attrs.get("steps"),
        duration_s=duration,
        health=list(attrs.get("health") or []),
        default=bool(attrs.get("default")),
    )


def format_params(params: dict[str, Any]) -> str:
    return (
        ", ".join(
            f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in params.items()
        )
        or "-"
    )


def format_value(value: float | None, interval: tuple[float, float] | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.4f}"
    if interval is not None:
        text += f" [{interval[0]:.4f}, {interval[1]:.4f}]"
    return text


def trial_line(trial: TrialOutcome) -> str:
    """One line per finished trial: number, parameters, then the value or "pruned" / "failed: reason"."""
    head = f"trial {trial.number}{' (default)' if trial.default else ''}: {format_params(trial.params)} -> "
    if trial.state == "complete":
        body = format_value(trial.value, trial.interval)
    elif trial.state == "pruned":
        body = f"pruned {trial.reason or 'by the pruner'}"
    elif trial.state == "failed":
        body = f"failed: {trial.reason}"
    else:
        body = trial.state
    tail = f" ({trial.duration_s:.0f} s)" if trial.duration_s is not None else ""
    events = [h.split(":", 1)[0] for h in trial.health]
    if events and trial.state == "complete":
        counts = {e: events.count(e) for e in dict.fromkeys(events)}
        tail += " [health: " + ", ".join(f"{n} {e}" for e, n in counts.items()) + "]"
    return head + body + tail


# ------------------------------------------------------------------------------------------------
# Finding and summarising a study


def is_study_directory(path: str | Path) -> bool:
    """Whether `path` is a sweep's study directory with its default SQLite storage."""
    return (Path(path) / STUDY_DB).is_file()


def load_study(target: str | Path, study_name: str | None = None) -> Any:
    """A study from a study directory (its study.db) or an Optuna storage URL; the only study there, or `study_name`."""
    import optuna

    from chessgrpo.sweep.storage import open_storage, quiet_optuna, redacted

    quiet_optuna()
    text = str(target)
    if "://" in text:
        url = text
    else:
        if not Path(text).is_dir():
            raise FileNotFoundError(
                f"{text!r} is neither a study directory nor a storage URL (sqlite:///..., postgresql://...)"
            )
        if not is_study_directory(text):
            raise FileNotFoundError(
                f"{text!r} has no {STUDY_DB}: not the directory of a `chessgrpo sweep` study with the default storage"
            )
        url = f"sqlite:///{Path(text).resolve() / STUDY_DB}"
    storage = open_storage(url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if study_name is None:
        if len(names) != 1:
            raise ConfigError(
                f"{redacted(url)} holds {len(names)} studies ({', '.join(names) or 'none'}): pass --study-name"
            )
        study_name = names[0]
    if study_name not in names:
        raise ConfigError(f"no study {study_name!r} in {redacted(url)} (studies: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=study_name, storage=storage)


@dataclasses.dataclass
class StudySummary:
    name: str
    metric: str
    measure: str
    direction: str
    study_dir: Path | None
    trials: list[TrialOutcome]
    importances: dict[str, float] | None
    importance_note: str | None = None

    @property
    def complete(self) -> list[TrialOutcome]:
        return [t for t in self.trials if t.state == "complete"]

    def ranked(self) -> list[TrialOutcome]:
        """Complete trials, best first."""
        return sorted(self.complete, key=lambda t: t.value if self.direction == "minimize" else -t.value)  # type: ignore[operator,return-value]

    @property
    def best(self) -> TrialOutcome | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    @property
    def default(self) -> TrialOutcome | None:
        return next((t for t in self.trials if t.default), None)

    def counts(self) -> dict[str, int]:
        states = ("complete", "pruned", "failed", "running", "waiting")
        return {s: n for s in states if (n := sum(t.state == s for t in self.trials))}

    def objective_text(self) -> str:
        what = (
            f"{self.metric} at the last evaluation"
            if self.measure == "final"
            else f"change of {self.metric} from step 0 (paired)"
        )
        return f"{what}, {self.direction}"

    def to_json(self) -> dict[str, Any]:
        return {
            "study": self.name,
            "metric": self.metric,
            "measure": self.measure,
            "direction": self.direction,
            "study_dir": str(self.study_dir) if self.study_dir else None,
            "counts": self.counts(),
            "best": self.best.number if self.best else None,
            "default": self.default.number if self.default else None,
            "importances": self.importances,
            "importance_note": self.importance_note,
            "trials": [t.to_json() for t in self.trials],
        }


def summarize(study: Any) -> StudySummary:
    """Every trial of `study` as a `TrialOutcome`, and the parameter importances (PED-ANOVA) when they can be computed."""
    import optuna

    record = study.user_attrs.get("sweep", {})
    objective = record.get("objective", {})
    trials = [outcome(t) for t in study.get_trials(deepcopy=False)]
    importances, note = None, None
    complete = [t for t in trials if t.state == "complete"]
    if len(complete) < 2:
        note = f"importances need at least 2 complete trials (have {len(complete)})"
    else:
        try:
            with warnings.catch_warnings(record=True) as caught:  # e.g. too few trials in a regime: said in the note
                warnings.simplefilter("always")
                evaluator = optuna.importance.PedAnovaImportanceEvaluator()
                importances = {
                    k: float(v) for k, v in optuna.importance.get_param_importances(study, evaluator=evaluator).items()
                }
            if caught:
                note = f"importances are rough with {len(complete)} complete trials: {caught[0].message}"
        except (RuntimeError, ValueError) as error:
            note = f"importances not computed: {error}"
        if importances is not None and not importances:
            note = "importances: no parameter varied among the complete trials"
    study_dir = record.get("study_dir")
    return StudySummary(
        name=study.study_name,
        metric=objective.get("metric", "?"),
        measure=objective.get("measure", "final"),
        direction=study.direction.name.lower(),
        study_dir=Path(study_dir) if study_dir else None,
        trials=trials,
        importances=importances,
        importance_note=note,
    )


def format_summary(summary: StudySummary, top: int = 5) -> list[str]:
    counts = ", ".join(f"{n} {s}" for s, n in summary.counts().items()) or "no trials"
    lines = [f"study {summary.name}: {len(summary.trials)} trials ({counts}); objective: {summary.objective_text()}"]
    ranked = summary.ranked()
    if ranked:
        lines.append("best trials (value [95% interval] on the positions the search selected on):")
        for trial in ranked[:top]:
            lines.append(f"  {trial_line(trial)}")
            held = _metric_texts(trial.metrics)
            if held:
                lines.append(f"      final held-out: {held}")
            if trial.run_dir:
                lines.append(f"      run: {trial.run_dir}")
    default = summary.default
    if default is not None and default not in ranked[:top]:
        lines.append(f"  {trial_line(default)}")
    stopped = [t for t in summary.trials if t.state in ("failed", "pruned") and t is not default]
    if stopped:
        lines.append(f"pruned and failed trials{' (the last 10)' if len(stopped) > 10 else ''}:")
        lines.extend(f"  {trial_line(trial)}" for trial in stopped[-10:])
    if summary.importances:
        lines.append(
            "parameter importances (PED-ANOVA): " + ", ".join(f"{k} {v:.2f}" for k, v in summary.importances.items())
        )
    if summary.importance_note:
        lines.append(summary.importance_note)
    return lines


def _metric_texts(metrics: dict[str, float]) -> str:
    parts = []
    for key, value in metrics.items():
        if key.endswith(("_low", "_high")) or not math.isfinite(value):
            continue
        if f"{key}_low" in metrics:
            parts.append(f"{key} {value:.4f} [{metrics[key + '_low']:.4f}, {metrics[key + '_high']:.4f}]")
        elif not key.startswith(("eval/random_", "perf/")):
            parts.append(f"{key} {value:.4g}")
    return ", ".join(parts)


def write_best_config(summary: StudySummary, out_dir: Path | None = None) -> Path:
    """``<study_dir>/best_config.yaml``: the best trial's run config, named ``<study>_best``, ready for `chessgrpo train --config`.

    It is checked by loading it into its kind's config class before this returns.
    """
    import yaml

    from chessgrpo.config import load_config
    from chessgrpo.files import write_text_atomic
    from chessgrpo.tasks.kinds import config_class

    best = summary.best
    if best is None:
        raise ValueError(f"study {summary.name} has no complete trial yet: no best config to write")
    if best.config is None:
        raise ValueError(f"trial {best.number} of study {summary.name} recorded no config")
    directory = out_dir or summary.study_dir
    if directory is None:
        raise ValueError("the study records no directory: pass --out DIR")
    config = json.loads(json.dumps(best.config))  # a deep copy
    config.setdefault("run", {})["name"] = f"{summary.name}_best"
    path = Path(directory) / BEST_CONFIG
    header = [
        f"# Best trial {best.number} of study {summary.name} ({summary.objective_text()}): {format_value(best.value, best.interval)}",
        f"# on the positions the search selected on (optimistic: `chessgrpo sweep --summary {directory} --remeasure` checks it",
        "# on unseen positions). Parameters: " + format_params(best.params),
        f"# Train it: chessgrpo train --config {path} [steps=N]",
        f"# Written {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} by chessgrpo sweep.",
    ]
    text = "\n".join(header) + "\n" + yaml.safe_dump(config, sort_keys=False)
    write_text_atomic(path, text)
    load_config(config_class(config.get("kind", "")), path)  # what `chessgrpo train --config` will do
    return path


# ------------------------------------------------------------------------------------------------
# Re-measuring the winner on positions the objective never saw


@dataclasses.dataclass
class Remeasurement:
    best: int
    default: int
    comparisons: list[Any]
    """`eval.compare.Comparison`s, B = best trial, A = default trial."""
    notes: list[str]
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "default": self.default,
            "notes": self.notes,
            "comparisons": [c.to_json() for c in self.comparisons],
        }


def _seen_items(trials: list[TrialOutcome], name: str) -> set[str]:
    """Every item (a position's FEN, a puzzle's id) any trial was evaluated on by evaluation `name`, from
    the trials' per-step evaluation files (`eval.registry`: their names and item keys)."""
    from chessgrpo.eval.registry import evaluation

    found = evaluation(name)
    key = found.item_key
    seen: set[str] = set()
    for trial in trials:
        if not trial.run_dir:
            continue
        for path in found.step_files(Path(trial.run_dir) / "eval"):
            try:
                records = json.loads(path.read_text()).get("records", {}).get("player", [])
            except (OSError, json.JSONDecodeError):
                continue
            seen.update(str(record.get(key)) for record in records)
    return seen


def _trial_checkpoint(trial: TrialOutcome) -> Path:
    from chessgrpo.train.checkpoint import latest_checkpoint

    if not trial.run_dir or latest_checkpoint(Path(trial.run_dir)) is None:
        raise FileNotFoundError(
            f"trial {trial.number}'s run directory {trial.run_dir!r} has no checkpoint on this machine"
        )
    return latest_checkpoint(Path(trial.run_dir))  # type: ignore[return-value]


def remeasure(
    summary: StudySummary,
    *,
    positions: str | None = None,
    puzzles: str | None = None,
    max_items: int = 500,
    seed: int = 1,
    out_dir: Path | None = None,
    trial: int | None = None,
) -> Remeasurement:
    """The best trial (or complete trial number `trial`, e.g. the runner-up when the default won)
    against the default trial on positions and puzzles no trial was evaluated on (paired).

    Positions: `positions` (any `eval offline` source), else the trials' own `eval.positions` (or
    `eval.offline_positions`) minus every position a trial saw; puzzles: `puzzles`, else the trials'
    `eval.puzzles`, minus every puzzle a trial saw. Each is skipped (with a note) when nothing
    unseen is left. Needs the trials' run directories on this machine and an action policy. Both run through the
    evaluation registry (`eval.registry`) with the unseen items lent, and are written by its one writer.
    """
    import random

    from chessgrpo.config import EngineConfig, from_dict
    from chessgrpo.engine import EnginePool
    from chessgrpo.eval.compare import compare_records
    from chessgrpo.eval.positions import load_eval_positions
    from chessgrpo.eval.puzzles import PuzzleSet, read_puzzles
    from chessgrpo.eval.registry import run_evaluation, write_result
    from chessgrpo.eval.running import EvalContext, Subject
    from chessgrpo.eval.standalone import EvalConfig
    from chessgrpo.files import write_json_atomic
    from chessgrpo.tasks.kinds.move_group import MoveGroupEvalConfig

    best, default = summary.best, summary.default
    if trial is not None:
        best = next((t for t in summary.trials if t.number == trial), None)
        if best is None or best.state != "complete":
            state = "does not exist" if best is None else f"is {best.state}"
            raise ValueError(f"trial {trial} of study {summary.name} {state}: only a complete trial can be re-measured")
    if best is None:
        raise ValueError(f"study {summary.name} has no complete trial to re-measure")
    if default is None:
        raise ValueError(
            f"study {summary.name} has no default trial (enqueue_default was off): nothing to compare the best with"
        )
    if best.number == default.number:
        raise ValueError(
            f"the {'chosen' if trial is not None else 'best'} trial is the default trial {default.number}: nothing to compare it with"
            + (
                ""
                if trial is not None
                else "; the search found nothing better on its own objective (--remeasure-trial N re-measures another)"
            )
        )
    if default.state != "complete":
        raise ValueError(
            f"the default trial {default.number} did not complete ({default.state}: {default.reason}); nothing to compare with"
        )
    config = best.config or {}
    if config.get("kind") not in ("move_group", "trajectory", "pretrain"):
        raise ValueError(
            f"--remeasure evaluates action policies (move_group, trajectory, pretrain runs), not kind {config.get('kind')!r}"
        )
    directory = Path(out_dir or summary.study_dir or ".") / REMEASURE_DIR
    checkpoints = {default.number: _trial_checkpoint(default), best.number: _trial_checkpoint(best)}
    kind, eval_config = config["kind"], config.get("eval") or {}
    evaluated = [t for t in summary.trials if t.run_dir]
    notes: list[str] = []
    comparisons = []
    label = "best trial" if trial is None else "trial"
    names = {"player_a": f"default trial {default.number}", "player_b": f"{label} {best.number}", "seed": seed}

    def run_trials(name: str, settings: EvalConfig, context: EvalContext) -> dict[int, list[dict[str, Any]]]:
        """Each trial's checkpoint evaluated by `name` through the registry, its file written beside the others
        (REMEASURE_DIR/trial_NNNN_<name>.json); each trial's per-item records."""
        records = {}
        for number, checkpoint in checkpoints.items():
            output = run_evaluation(name, settings, Subject(checkpoint=checkpoint), context)
            write_result(name, output, path=directory / f"trial_{number:04d}_{name}.json")
            records[number] = output.to_json()["records"]["player"]
        return records

    # Held-out positions: the trials' own source minus every position a trial was evaluated on.
    source = positions or {
        "move_group": eval_config.get("positions"),
        "trajectory": eval_config.get("offline_positions"),
    }.get(kind)
    if source is None:
        notes.append(
            "positions: the trials evaluate on no position source of their own; pass --remeasure-positions to add one"
        )
    else:
        seen = set() if positions else _seen_items(evaluated, "offline")
        engine = from_dict(EngineConfig, config.get("engine") or {})
        nodes = int(eval_config.get("nodes") or 2000)
        with EnginePool.from_config(engine) as pool:
            # Draw enough for max_items unseen ones, so only those are labelled by the engine (text sources).
            drawn = load_eval_positions(source, max_items + len(seen), seed=seed, pool=pool, nodes=nodes)
            candidates = [p for p in drawn if p.fen not in seen]
            if len(candidates) > max_items:
                candidates = [
                    candidates[i] for i in sorted(random.Random(seed).sample(range(len(candidates)), max_items))
                ]
            if not candidates:
                notes.append(
                    f"positions: every position of {source} was seen by the objective; pass --remeasure-positions"
                )
            else:
                offline = EvalConfig(engine=engine, positions=source, nodes=nodes, seed=seed, baselines=False)
                records = run_trials("offline", offline, EvalContext(pool=pool, items={"offline": candidates}))
                comparisons.append(compare_records("offline", records[default.number], records[best.number], **names))
                notes.append(
                    f"positions: {len(candidates)} from {source} that no trial was evaluated on ({len(seen)} seen excluded)"
                )

    # Puzzles: the trials' own file (move groups) or the shared development set, minus every puzzle a trial saw.
    puzzle_file = puzzles or eval_config.get("puzzles") or MoveGroupEvalConfig().puzzles
    if puzzle_file and Path(puzzle_file).is_file():
        seen_puzzles = set() if puzzles else _seen_items(evaluated, "puzzles")
        unseen = [p for p in read_puzzles(puzzle_file).puzzles if p.id not in seen_puzzles]
        if len(unseen) > max_items:
            unseen = [unseen[i] for i in sorted(random.Random(seed).sample(range(len(unseen)), max_items))]
        if not unseen:
            notes.append(f"puzzles: every puzzle of {puzzle_file} was seen by the objective; pass --remeasure-puzzles")
        else:
            puzzle_config = EvalConfig(positions=None, puzzles=str(puzzle_file), seed=seed, baselines=False)
            records = run_trials("puzzles", puzzle_config, EvalContext(items={"puzzles": PuzzleSet(tuple(unseen))}))
            comparisons.append(compare_records("puzzles", records[default.number], records[best.number], **names))
            notes.append(
                f"puzzles: {len(unseen)} from {puzzle_file} that no trial was evaluated on ({len(seen_puzzles)} seen excluded)"
            )
    elif puzzle_file:
        notes.append(f"puzzles: {puzzle_file} does not exist; pass --remeasure-puzzles")
    if not comparisons:
        raise ValueError(
            "nothing to re-measure on: " + "; ".join(notes or ["the trials name no evaluation positions or puzzles"])
        )
    result = Remeasurement(best.number, default.number, comparisons, notes, directory / "remeasure.json")
    write_json_atomic(result.path, result.to_json())
    return result


# ------------------------------------------------------------------------------------------------
# For the HTML report


@dataclasses.dataclass
class StudyPlotData:
    """What the report's study figure draws: values by trial number, and the importances."""

    name: str
    metric: str
    direction: str
    numbers: list[int]
    values: list[float | None]
    states: list[str]
    intervals: list[tuple[float, float] | None]
    importances: dict[str, float] | None
    importance_note: str | None


def plot_data(summary: StudySummary) -> StudyPlotData:
    trials = sorted(summary.trials, key=lambda t: t.number)
    return StudyPlotData(
        name=summary.name,
        metric=f"{summary.metric}{' change' if summary.measure == 'change' else ''}",
        direction=summary.direction,
        numbers=[t.number for t in trials],
        values=[t.value for t in trials],
        states=[t.state for t in trials],
        intervals=[t.interval for t in trials],
        importances=summary.importances,
        importance_note=summary.importance_note,
    )


__all__ = [
    "BEST_CONFIG",
    "StudySummary",
    "TrialOutcome",
    "format_summary",
    "is_study_directory",
    "load_study",
    "outcome",
    "plot_data",
    "remeasure",
    "summarize",
    "trial_line",
    "write_best_config",
]
