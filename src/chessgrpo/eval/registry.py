"""The evaluation registry: one entry per evaluation, what runs it and everything that handles its results.

An `Evaluation` says what its producers and consumers need to know about it:

- its **name** (``offline``) and the command that runs it;
- **how to run it**: its config dataclass (`config`) and its runner (`runner`: ``(config, subject, context) ->
  EvalOutput``, `eval.running`), each given as the object or as its ``module:name`` (imported when first used,
  so the readers of results never import torch). `run_evaluation` runs one by name; `write_result` is **the one
  writer** of result files (a command's ``output=FILE`` and a training run's step file alike: atomic, the config
  beside the summary and records); `run_at_step` does both for a training run's held-out evaluation and returns
  its metrics; `extra_evaluations` reads a kind's ``eval.extra`` (evaluations a run adds by name);
- **its result files**: a training run writes ``eval/step_NNNNNN_<name>.json`` at each held-out
  evaluation (`step_file`, `step_files`); a result file is recognised by a top-level key of its
  summary (`summary_marker`, what `track.run_data` reads) and by a field of its per-item records
  (`record_marker`, what `eval compare` reads);
- **pairing** (`eval compare`): the record field that identifies an item in two result files
  (`item_key`), the paired metrics with their direction (`paired`) and the descriptive rows shown
  after them when the records carry their fields (`descriptive`);
- **held-out metrics** (`held_out`): the names a training run logs as ``eval/<name>`` with
  ``_low``/``_high`` interval keys, the summary field and record field each is read from, its
  direction and unit. `track.run_data` (and through it `diagnose`, `report`, `plots`) reads these,
  and a sweep objective ``eval/<name>`` of a paired metric gets a paired interval of its change.

Adding an evaluation is its module (a config dataclass and a runner) plus one entry here (`register` for one
defined elsewhere, e.g. in a test): ``chessgrpo eval <name>`` runs it (a generic command for an entry without its
own), a training run runs it when its config lists it in ``eval.extra``, and `eval compare`, run data, diagnose,
report and sweeps pick up its files.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chessgrpo.config import ConfigError, from_dict, to_dict
from chessgrpo.eval.running import EvalContext, EvalOutput, Subject
from chessgrpo.files import write_json_atomic

Runner = Callable[[Any, Subject, EvalContext], EvalOutput]
"""``runner(config, subject, context) -> EvalOutput``: runs one evaluation (`eval.running`)."""


@dataclasses.dataclass(frozen=True)
class PairedMetric:
    """A metric `eval compare` pairs item by item: the mean of a per-item record field."""

    name: str
    field: str
    """The per-item record field (a 0/1 outcome or a number)."""
    higher_is_better: bool | None
    """None for a descriptive rate (e.g. how often the first move is a check): neither direction is better."""
    subset: tuple[str, Any] | None = None
    """(field, value): only the items whose A record has that value; None = every item."""


@dataclasses.dataclass(frozen=True)
class HeldOutMetric:
    """A metric a training run logs at each held-out evaluation as ``eval/<name>`` (with ``_low``/``_high``)."""

    name: str
    summary_field: str
    """Its field in the evaluation's result JSON ({value, low, high, n})."""
    record_field: str
    """Its field in the per-item records (for paired differences)."""
    higher_is_better: bool
    unit: str
    """What one unit of it is (axis labels)."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation and how its results are named, recognised, paired and read back."""

    name: str
    command: str
    """The command that writes a standalone result (``output=FILE``)."""
    item_key: str | None = None
    """The record field that identifies an item in two result files; None = `eval compare` does not pair it."""
    item_noun: str = "positions"
    """What its items are, in `eval compare`'s messages."""
    record_marker: str | None = None
    """A field only this evaluation's per-item records carry (how `eval compare` recognises a file)."""
    records_label: str = ""
    """How `eval compare` names its records in the error for an unrecognised file."""
    paired: tuple[PairedMetric, ...] = ()
    descriptive: tuple[PairedMetric, ...] = ()
    """Rows shown after `paired` when the records carry their fields (older files do not)."""
    held_out: tuple[HeldOutMetric, ...] = ()
    summary_marker: str | None = None
    """A top-level key of its result JSON by which run data recognises a file (None: run data reads
    only its ``eval/`` metric rows)."""
    config: type | str | None = None
    """Its config dataclass, or its ``module:Name``; None: it cannot be run through the registry."""
    runner: Runner | str | None = None
    """How to run it (`Runner`), or its ``module:function``; None: it cannot be run through the registry."""
    in_training: bool = True
    """Whether a training run may list it in ``eval.extra`` (its runner evaluates a model in memory)."""

    @property
    def runnable(self) -> bool:
        """Whether the registry can run it (it has a config and a runner)."""
        return self.config is not None and self.runner is not None

    def config_class(self) -> type:
        """Its config dataclass (imported on first use)."""
        if self.config is None:
            raise ValueError(f"evaluation {self.name!r} has no config class: it cannot be run through the registry")
        return _resolve(self.config)

    def run(self, config: Any, subject: Subject, context: EvalContext | None = None) -> EvalOutput:
        """Run it with `config` on `subject` (nothing is written: `write_result` writes its result)."""
        if self.runner is None:
            raise ValueError(f"evaluation {self.name!r} has no runner: it cannot be run through the registry")
        if not isinstance(config, self.config_class()):
            raise TypeError(f"evaluation {self.name!r} runs with a {self.config_class().__name__}, got {config!r}")
        runner: Runner = _resolve(self.runner)
        return runner(config, subject, context if context is not None else EvalContext())

    def step_file(self, step: int) -> str:
        """The file name of its result at a training step: ``step_NNNNNN_<name>.json``."""
        return f"step_{step:06d}_{self.name}.json"

    def step_files(self, directory: Path) -> list[Path]:
        """Its per-step result files in a run's eval/ directory, oldest step first."""
        return sorted(Path(directory).glob(f"step_*_{self.name}.json"))


_OFFLINE = Evaluation(
    name="offline",
    command="chessgrpo eval offline",
    item_key="fen",
    record_marker="esl",
    records_label="offline",
    paired=(
        PairedMetric("top1", "top1", True),
        PairedMetric("esl", "esl", False),
        PairedMetric("blunder_rate", "blunder", False),
    ),
    descriptive=(
        PairedMetric("played_check_rate", "chosen_check", None),
        PairedMetric("label_check_rate", "best_check", None),
        PairedMetric("played_en_prise_rate", "chosen_en_prise", None),
        PairedMetric("label_en_prise_rate", "best_en_prise", None),
    ),
    held_out=(
        HeldOutMetric("esl", "esl", "esl", False, "expected score loss (win-prob units)"),
        HeldOutMetric("top1", "top1", "top1", True, "fraction of positions"),
        HeldOutMetric("blunder_rate", "blunder_rate", "blunder", False, "fraction of positions"),
    ),
    summary_marker="esl",
    config="chessgrpo.eval.standalone:EvalConfig",
    runner="chessgrpo.eval.standalone:run_offline",
)
# Puzzles split by whether the solution starts with a check: a policy that gives up (or takes up)
# checking moves one group against the other, which the overall accuracy hides.
_PUZZLES = Evaluation(
    name="puzzles",
    command="chessgrpo eval puzzles",
    item_key="id",
    item_noun="puzzles",
    record_marker="first_move_correct",
    records_label="puzzle",
    paired=(
        PairedMetric("first_move_accuracy", "first_move_correct", True),
        PairedMetric("solve_rate", "solved", True),
    ),
    descriptive=(
        PairedMetric("check_first_accuracy", "first_move_correct", True, ("solution_check", True)),
        PairedMetric("quiet_first_accuracy", "first_move_correct", True, ("solution_check", False)),
        PairedMetric("played_check_rate", "played_check", None),
    ),
    held_out=(
        HeldOutMetric(
            "puzzle_first_move_accuracy", "first_move_accuracy", "first_move_correct", True, "fraction of puzzles"
        ),
        HeldOutMetric("puzzle_solve_rate", "solve_rate", "solved", True, "fraction of puzzles"),
    ),
    summary_marker="first_move_accuracy",
    config="chessgrpo.eval.standalone:EvalConfig",
    runner="chessgrpo.eval.standalone:run_puzzles",
)
# Endgame runs (kind: trajectory, positions: endgame:...): against the tablebase-perfect defender.
_ENDGAME = Evaluation(
    name="endgame",
    command="chessgrpo eval endgame",
    item_key="fen",
    record_marker="mate",
    records_label="endgame",
    paired=(PairedMetric("mate_rate", "mate", True),),
    held_out=(
        HeldOutMetric("mate_rate", "mate_rate", "mated", True, "fraction of held-out endgame positions"),
        HeldOutMetric("dtz_optimal_rate", "dtz_optimal_rate", "dtz_optimal", True, "fraction of own moves"),
    ),
    config="chessgrpo.eval.endgame:EndgameEvalConfig",
    runner="chessgrpo.eval.endgame:run_endgame",
)
# Chess language model runs (kind: rookworld): greedy answers to held-out P:/A: prompts; paired by
# `eval lm --compare` (`eval.lm.compare_lm_results`), not `eval compare`.
_LM = Evaluation(
    name="lm",
    command="chessgrpo eval lm",
    held_out=(
        HeldOutMetric("p_reward", "p_reward", "total", True, "P: reward per prompt"),
        HeldOutMetric("p_format_rate", "p_format_rate", "malformed", True, "fraction of P: answers"),
        HeldOutMetric("p_best_accuracy", "p_best_accuracy", "best", True, "fraction of P: answers"),
        HeldOutMetric("a_format_rate", "a_format_rate", "malformed", True, "fraction of A: answers"),
        HeldOutMetric(
            "a_exact_state_accuracy", "a_exact_state_accuracy", "exact_state", True, "fraction of A: answers"
        ),
    ),
    config="chessgrpo.eval.lm:LMEvalConfig",
    runner="chessgrpo.eval.lm:run_lm",
)
# Games: one record per colour-swapped pair (same anchor, pair index and opening); values are
# per-game shares. Run data reads the summaries themselves (`track.run_data.read_games`).
_GAMES = Evaluation(
    name="games",
    command="chessgrpo eval games",
    item_key="pair_id",
    item_noun="game pairs (same anchors, seed and openings)",
    record_marker="pair_score",
    records_label="games",
    paired=(
        PairedMetric("score", "pair_score", True),
        PairedMetric("win_rate", "pair_win", True),
        PairedMetric("stalemate_rate", "pair_stalemate", False),
    ),
    config="chessgrpo.play.match:GamesConfig",
    runner="chessgrpo.eval.games:run_games",
    in_training=False,  # games are played by checkpoints, in worker processes
)
_EPD = Evaluation(
    name="epd",
    command="chessgrpo eval epd",
    config="chessgrpo.eval.standalone:EvalConfig",
    runner="chessgrpo.eval.standalone:run_epd",
)
_VALUE = Evaluation(
    name="value",
    command="chessgrpo eval value",
    config="chessgrpo.eval.value:ValueEvalConfig",
    runner="chessgrpo.eval.value:run_value",
    in_training=False,  # its caller loads its positions (`ValueItems`); pretraining logs eval/value_mae itself
)

EVALUATIONS: dict[str, Evaluation] = {e.name: e for e in (_OFFLINE, _PUZZLES, _ENDGAME, _LM, _GAMES, _EPD, _VALUE)}
"""Every evaluation by name, in the order tables list them."""


def register(evaluation: Evaluation) -> Evaluation:
    """Add an evaluation (after the built-in ones); its name must be new."""
    if evaluation.name in EVALUATIONS:
        raise ValueError(f"an evaluation named {evaluation.name!r} is already registered")
    EVALUATIONS[evaluation.name] = evaluation
    return evaluation


def unregister(name: str) -> None:
    """Remove a registered evaluation (a test's own entry)."""
    EVALUATIONS.pop(name, None)


def evaluation(name: str) -> Evaluation:
    """The evaluation named `name`; a ValueError naming the registered ones otherwise."""
    if name not in EVALUATIONS:
        raise ValueError(f"unknown evaluation {name!r}: expected one of {', '.join(EVALUATIONS)}")
    return EVALUATIONS[name]


def comparable() -> list[Evaluation]:
    """The evaluations `eval compare` pairs (those with an item key), in registry order."""
    return [e for e in EVALUATIONS.values() if e.item_key is not None]


def recognise_records(record: dict[str, Any]) -> Evaluation | None:
    """The comparable evaluation whose per-item records look like `record` (first match in registry order)."""
    return next((e for e in comparable() if e.record_marker is not None and e.record_marker in record), None)


def recognise_summary(payload: dict[str, Any]) -> Evaluation | None:
    """The evaluation whose result JSON `payload` is, for run data (first match in registry order)."""
    return next((e for e in EVALUATIONS.values() if e.summary_marker is not None and e.summary_marker in payload), None)


def read_by_run_data() -> list[Evaluation]:
    """The evaluations whose result files run data reads (those with a summary marker)."""
    return [e for e in EVALUATIONS.values() if e.summary_marker is not None]


def step_file_pattern() -> re.Pattern[str]:
    """``step_(NNNNNN)_(name).json`` of the evaluations run data reads per step."""
    names = "|".join(re.escape(e.name) for e in read_by_run_data())
    return re.compile(rf"^step_(\d+)_({names})\.json$")


def held_out_metrics() -> dict[str, tuple[Evaluation, HeldOutMetric]]:
    """Every held-out metric (``eval/<name>`` in metrics.jsonl) -> its evaluation and definition, in registry order."""
    return {metric.name: (e, metric) for e in EVALUATIONS.values() for metric in e.held_out}


def paired_objective(metric: str) -> tuple[Evaluation, str] | None:
    """(evaluation, `eval compare` metric) for a held-out metric key ``eval/<name>`` whose change
    `eval compare` can pair from the run's per-step files; None when none can."""
    if not metric.startswith("eval/"):
        return None
    found = held_out_metrics().get(metric[len("eval/") :])
    if found is None:
        return None
    owner, held = found
    names = {m.name for m in owner.paired}
    return (owner, held.summary_field) if owner.item_key is not None and held.summary_field in names else None


# --------------------------------------------------------------------------------------------
# Running an evaluation and writing its result


def _resolve(reference: Any) -> Any:
    """The object a ``module:name`` reference names (imported now), or `reference` itself."""
    if not isinstance(reference, str):
        return reference
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def run_evaluation(name: str, config: Any, subject: Subject, context: EvalContext | None = None) -> EvalOutput:
    """Run the evaluation registered as `name` with `config` on `subject` (nothing written; see `write_result`)."""
    return evaluation(name).run(config, subject, context)


def write_result(
    entry: Evaluation | str,
    output: EvalOutput,
    *,
    path: str | Path | None = None,
    eval_dir: str | Path | None = None,
    step: int | None = None,
) -> Path:
    """The one writer of evaluation result files: ``{"config": ..., **output.to_json()}`` written atomically.

    At `path` (a command's ``output=FILE``, a re-measure's file), or at a training step's
    ``eval_dir/step_NNNNNN_<name>.json`` (`eval_dir` and `step`: the payload also gets ``"step"``). The layout is
    the same either way: the config the evaluation ran with (its dataclass as plain data), then its summary and
    its per-item records (``records``). Returns the path written.
    """
    found = evaluation(entry) if isinstance(entry, str) else entry
    if (path is None) == (eval_dir is None) or (eval_dir is not None) != (step is not None):
        raise ValueError("write_result takes either path, or eval_dir and step")
    target = Path(path) if path is not None else Path(eval_dir) / found.step_file(step)  # type: ignore[arg-type]
    config = output.config
    payload: dict[str, Any] = {}
    if config is not None:
        payload["config"] = to_dict(config) if dataclasses.is_dataclass(config) else config
    payload.update(output.to_json())
    if step is not None:
        payload["step"] = step
    return write_json_atomic(target, payload)


def run_at_step(
    name: str, config: Any, subject: Subject, context: EvalContext, *, eval_dir: Path, step: int
) -> dict[str, float]:
    """A training run's held-out evaluation `name` at `step`: run it through the registry, write
    ``eval_dir/step_NNNNNN_<name>.json`` with `write_result`, and return its ``eval/`` metrics."""
    output = run_evaluation(name, config, subject, context)
    write_result(name, output, eval_dir=eval_dir, step=step)
    return output.metrics("eval/")


def extra_evaluations(extra: Any, key: str = "eval.extra") -> dict[str, Any]:
    """A kind's ``eval.extra`` as {evaluation name: its config}: a list of registered names (each with its config's
    defaults) or a mapping name -> that config's keys. A `ConfigError` names the key for an unknown evaluation, one
    the registry cannot run in a training run (`Evaluation.in_training`), or a bad config key."""
    if extra is None:
        return {}
    if isinstance(extra, (list, tuple)):
        extra = {name: {} for name in extra}
    if not isinstance(extra, dict):
        raise ConfigError(f"config key {key}: expected a list of evaluation names or a mapping name -> its config keys")
    configs: dict[str, Any] = {}
    for name, keys in extra.items():
        found = EVALUATIONS.get(name) if isinstance(name, str) else None
        if found is None or not (found.runnable and found.in_training):
            runnable = [e.name for e in EVALUATIONS.values() if e.runnable and e.in_training]
            raise ConfigError(
                f"config key {key}: {name!r} is not a registered evaluation a training run can run "
                f"(one of {', '.join(runnable)})"
            )
        if keys is not None and not isinstance(keys, dict):
            raise ConfigError(f"config key {key}.{name}: expected a mapping of {found.config_class().__name__} keys")
        configs[name] = from_dict(found.config_class(), keys or {}, prefix=f"{key}.{name}")
    return configs
