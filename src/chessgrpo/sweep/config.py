"""The sweep YAML (`chessgrpo sweep --config sweep.yaml`) and how it turns into trial run configs.

A sweep file names a base run config (a path or an inline mapping, any kind), overrides applied to
every trial, the search space over dotted keys of that config, the objective (a held-out metric
the run logs at its evaluations), the budget, the sampler, the pruner and where the study lives::

    base: configs/grpo_tiny.yaml
    overrides: {steps: 40, eval_every: 10}
    space:
      lr: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      grpo.kl_schedule: [fixed, adaptive]                       # a list is a categorical
      grpo.kl_target: {type: float, low: 0.001, high: 0.1, log: true, when: {grpo.kl_schedule: adaptive}}
    objective: {metric: eval/esl, measure: change, direction: minimize}

Every key is checked like any config (`chessgrpo.config`: unknown key or wrong type = one error
naming it); `resolve_sweep` also checks that every space key exists in the base kind's config
class and that the ends of its range (or every choice) make a valid run config, before anything runs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml

from chessgrpo.config import ConfigError, from_dict, load_config, parse_override, to_dict

SCALAR = (bool, int, float, str, type(None))
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
STUDY_DB = "study.db"
"""The default storage's file in the study directory (``sqlite:///<study_dir>/study.db``)."""


@dataclasses.dataclass
class ParamSpace:
    """One searched key (`space.<dotted key>`): a float or int range (optionally log) or a categorical."""

    type: Literal["float", "int", "categorical"]
    """float (`trial.suggest_float`), int (`suggest_int`) or categorical (`suggest_categorical`)."""
    low: float | None = None
    """Lower end of a float/int range (inclusive)."""
    high: float | None = None
    """Upper end of a float/int range (inclusive)."""
    log: bool = False
    """Sample a float/int range uniformly in log space (low > 0), e.g. learning rates."""
    step: float | None = None
    """Discretisation of a float/int range (null = continuous float, step 1 for int); not with log."""
    choices: list | None = None
    """The values of a categorical (scalars: numbers, strings, booleans, null)."""
    when: dict | None = None
    """Conditional key: searched only when every `{dotted key: value or [values]}` holds for the trial (a key
    searched earlier in `space`, else the base config's value); otherwise the base value stays."""

    def __post_init__(self) -> None:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical needs a non-empty `choices` list")
            bad = [c for c in self.choices if not isinstance(c, SCALAR)]
            if bad:
                raise ValueError(f"categorical choices must be scalars (number, string, boolean, null), got {bad[0]!r}")
            if len({repr(c) for c in self.choices}) != len(self.choices):
                raise ValueError(f"categorical choices repeat a value: {self.choices}")
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError("a categorical takes `choices` only (no low, high, log or step)")
        else:
            if self.choices is not None:
                raise ValueError(f"a {self.type} range takes low and high, not choices (use type: categorical)")
            if self.low is None or self.high is None or not (math.isfinite(self.low) and math.isfinite(self.high)):
                raise ValueError(f"a {self.type} range needs finite `low` and `high`")
            if not self.low < self.high:
                raise ValueError(f"need low < high, got low={self.low:g}, high={self.high:g}")
            if self.log and self.low <= 0:
                raise ValueError(f"a log range needs low > 0, got {self.low:g}")
            if self.log and self.step is not None:
                raise ValueError("log and step cannot be combined (Optuna samples log ranges continuously)")
            if self.step is not None and not self.step > 0:
                raise ValueError(f"step must be > 0, got {self.step:g}")
            if self.type == "int":
                for name in ("low", "high", "step"):
                    value = getattr(self, name)
                    if value is not None and not float(value).is_integer():
                        raise ValueError(f"an int range needs whole numbers, got {name}={value:g}")
        if self.when is not None and not self.when:
            raise ValueError("`when` must name at least one key (or be left out)")

    def values_to_check(self) -> list[Any]:
        """The values that must make a valid run config: both ends of a range, every choice."""
        if self.type == "categorical":
            return list(self.choices or [])
        if self.type == "int":
            return [int(self.low), int(self.high)]  # type: ignore[arg-type]
        return [float(self.low), float(self.high)]  # type: ignore[arg-type]

    def contains(self, value: Any) -> bool:
        """Whether `value` is one the space can propose (the base value must be, for the default trial)."""
        if self.type == "categorical":
            return any(value == choice and type(value) is type(choice) for choice in self.choices or [])
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return self.low <= value <= self.high  # type: ignore[operator]

    def suggest(self, trial: Any, key: str) -> Any:
        """Draw this key's value for an Optuna trial (its parameter is named by the dotted key)."""
        if self.type == "categorical":
            return trial.suggest_categorical(key, self.choices)
        if self.type == "int":
            step = int(self.step) if self.step is not None else 1
            return trial.suggest_int(key, int(self.low), int(self.high), step=step, log=self.log)  # type: ignore[arg-type]
        return trial.suggest_float(key, self.low, self.high, step=self.step, log=self.log)


@dataclasses.dataclass
class ObjectiveConfig:
    """What a trial is scored by: a held-out metric of the run's own evaluations."""

    metric: str = ""
    """A held-out metric the kind logs at each evaluation (metrics.jsonl), e.g. eval/esl, eval/top1,
    eval/puzzle_first_move_accuracy, eval/mate_rate, eval/nll. Training metrics are not allowed."""
    measure: Literal["final", "change"] = "final"
    """final: the metric at the last evaluation; change: the last evaluation minus the step-0 one (the
    paired change on the same positions; needs eval_at_start)."""
    direction: Literal["minimize", "maximize"] | None = None
    """minimize or maximize (required: a search in the wrong direction finds the worst settings)."""

    def __post_init__(self) -> None:  # metric and direction are required: `resolve_sweep` says so when they are missing
        if self.metric and (not self.metric.startswith("eval/") or self.metric.endswith(("_low", "_high"))):
            raise ValueError(f"objective.metric must be a held-out evaluation metric (eval/...), got {self.metric!r}")


@dataclasses.dataclass
class BudgetConfig:
    """How many trials this invocation runs, and for how long."""

    trials: int = 10
    """Trials this invocation runs (a rerun adds as many again, up to max_trials)."""
    timeout_s: float | None = None
    """No new trial starts after this many seconds of this invocation (a running trial finishes)."""
    max_trials: int | None = None
    """Cap on the study's trials over every invocation and machine (null = none)."""
    max_failures_in_a_row: int | None = 5
    """Stop the sweep after this many failed trials in a row (a broken base config fails every trial)."""

    def __post_init__(self) -> None:
        if self.trials < 1 or (self.max_trials is not None and self.max_trials < 1):
            raise ValueError("trials and max_trials must be >= 1")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or null, got {self.timeout_s}")
        if self.max_failures_in_a_row is not None and self.max_failures_in_a_row < 1:
            raise ValueError("max_failures_in_a_row must be >= 1 or null")


@dataclasses.dataclass
class SamplerConfig:
    """How trials' parameters are proposed (Optuna samplers)."""

    name: Literal["tpe", "random"] = "tpe"
    """tpe (Tree-structured Parzen Estimator, Bergstra et al. 2011) or random."""
    seed: int | None = 0
    """Seed of the proposals (each invocation and worker derives its own from it and the trial count,
    so a rerun proposes new points instead of repeating the first ones); null = unseeded."""
    n_startup_trials: int = 10
    """TPE: random trials before the model takes over."""

    def __post_init__(self) -> None:
        if self.n_startup_trials < 0:
            raise ValueError("n_startup_trials must be >= 0")


@dataclasses.dataclass
class PrunerConfig:
    """What stops bad trials early; fed with the objective at every held-out evaluation after step 0."""

    name: Literal["median", "successive_halving", "threshold", "none"] = "median"
    """median (stop a trial worse than the median of earlier trials at the same step), successive_halving
    (asynchronous successive halving, Li et al. 2020), threshold (outside [lower, upper]) or none."""
    n_startup_trials: int = 5
    """median: no pruning until this many trials finished."""
    n_warmup_steps: int = 0
    """median: no pruning of a trial before this training step."""
    min_resource: int | None = None
    """successive_halving: training steps before the first rung (null = Optuna's estimate)."""
    reduction_factor: int = 4
    """successive_halving: 1/reduction_factor of the trials climb each rung."""
    lower: float | None = None
    """threshold: prune when the objective falls below this."""
    upper: float | None = None
    """threshold: prune when the objective rises above this."""

    def __post_init__(self) -> None:
        if self.n_startup_trials < 0 or self.n_warmup_steps < 0 or self.reduction_factor < 2:
            raise ValueError("need n_startup_trials >= 0, n_warmup_steps >= 0, reduction_factor >= 2")
        if self.min_resource is not None and self.min_resource < 1:
            raise ValueError("min_resource must be >= 1 or null")
        if self.name == "threshold" and self.lower is None and self.upper is None:
            raise ValueError("the threshold pruner needs lower and/or upper")


@dataclasses.dataclass
class SweepConfig:
    """`chessgrpo sweep --config FILE`: Optuna hyperparameter search over training runs (docs/sweep.md)."""

    base: str | dict | None = None
    """The run config every trial starts from: a path to a `chessgrpo train` config (any kind) or an inline mapping."""
    overrides: dict = dataclasses.field(default_factory=dict)
    """`{dotted key: value}` applied to every trial after `base` (shorter runs, fewer evaluation positions)."""
    space: dict = dataclasses.field(default_factory=dict)
    """`{dotted key: ParamSpace or [choices]}`: what is searched."""
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    budget: BudgetConfig = dataclasses.field(default_factory=BudgetConfig)
    sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
    pruner: PrunerConfig = dataclasses.field(default_factory=PrunerConfig)
    study_name: str | None = None
    """The study's name and directory (<run.out_dir>/<study_name>/); null = the sweep file's name."""
    storage: str | None = None
    """Optuna RDB URL (e.g. postgresql://host/db for several machines); null = sqlite:///<study_dir>/study.db."""
    parallel: int = 1
    """Trials at once on this machine (worker processes); each trial's threads and engine processes
    are set to the machine's cores divided by this."""
    enqueue_default: bool = True
    """Run the base config's own values first (trial 0), the reference the best trial is compared with."""

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {self.parallel}")
        if self.study_name is not None and (
            not _PLAIN_NAME.fullmatch(self.study_name) or self.study_name in (".", "..")
        ):
            raise ValueError(f"study_name {self.study_name!r} is not a plain name (letters, digits, . _ - only)")
        if self.space:
            parse_space(self.space)


def parse_space(raw: dict) -> dict[str, ParamSpace]:
    """The `space:` mapping as `ParamSpace`s (a list is a categorical); errors name `space.<key>`."""
    if not raw:
        raise ConfigError("sweep key space is empty: name at least one config key to search")
    space: dict[str, ParamSpace] = {}
    for key, entry in raw.items():
        if not isinstance(key, str) or not all(part.isidentifier() for part in key.split(".")):
            raise ConfigError(f"space key {key!r} is not a dotted config key like grpo.kl_coef")
        if isinstance(entry, list):
            entry = {"type": "categorical", "choices": entry}
        if not isinstance(entry, dict) or "type" not in entry:
            raise ConfigError(
                f"space.{key}: expected a mapping with type: float | int | categorical (or a list of choices), got {entry!r}"
            )
        space[key] = from_dict(ParamSpace, entry, prefix=f"space.{key}")
    searched: list[str] = []
    for key, param in space.items():
        for condition in param.when or {}:
            if condition in space and condition not in searched:
                raise ConfigError(
                    f"space.{key}.when names {condition}, which is searched later: list {condition} first"
                )
        searched.append(key)
    return space


# ------------------------------------------------------------------------------------------------
# Resolving a sweep against its base config


def set_dotted(data: dict, key: str, value: Any) -> None:
    """data[a][b][c] = value for key "a.b.c" (creating the mappings on the way)."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def get_dotted(data: Any, key: str) -> Any:
    """The value at dotted `key` of a config dataclass or mapping (KeyError when absent)."""
    node = data
    for part in key.split("."):
        if isinstance(node, dict):
            node = node[part]
        elif dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        else:
            raise KeyError(key)
    return node


def _condition_holds(expected: Any, actual: Any) -> bool:
    options = expected if isinstance(expected, list) else [expected]
    return any(actual == option for option in options)


@dataclasses.dataclass
class Sweep:
    """A resolved sweep: its config, the base run config as data, the parsed space, where the study lives."""

    config: SweepConfig
    kind: str
    config_class: type
    base: dict[str, Any]
    """The base run config with the sweep's and the command line's overrides (plain data)."""
    space: dict[str, ParamSpace]
    study_name: str
    study_dir: Path
    storage: str
    base_config: Any
    """`base` as the kind's config object."""
    default_params: dict[str, Any]
    """The base config's value of every space key that applies to it (the default trial's parameters)."""

    def portable_config(self, params: dict[str, Any], name: str | None = None) -> Any:
        """The run config of `params` on top of the base (its run.out_dir and run.name, or `name`)."""
        data = copy.deepcopy(self.base)
        for key, value in params.items():
            set_dotted(data, key, value)
        if name is not None:
            set_dotted(data, "run.name", name)
        return from_dict(self.config_class, data)

    def trial_config(self, number: int, params: dict[str, Any], cores: int | None = None) -> tuple[Any, Any]:
        """(the run config of trial `number`, the same without this machine's core split).

        The run lives at <study_dir>/trial_NNNN; with `parallel` > 1 its torch threads and engine
        processes are the machine's `cores` divided by `parallel`.
        """
        portable = self.portable_config(params)
        data = to_dict(portable)
        set_dotted(data, "run.out_dir", str(self.study_dir))
        set_dotted(data, "run.name", trial_name(number))
        if self.config.parallel > 1 and cores is not None:
            share = max(1, cores // self.config.parallel)
            set_dotted(data, "threads", share)
            if "engine" in data:
                set_dotted(data, "engine.processes", share)
        return from_dict(self.config_class, data), portable

    def active(self, key: str, params: dict[str, Any]) -> bool:
        """Whether space key `key` is searched for a trial whose earlier keys took `params`."""
        for condition, expected in (self.space[key].when or {}).items():
            actual = params[condition] if condition in params else get_dotted(self.base_config, condition)
            if not _condition_holds(expected, actual):
                return False
        return True

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The trial's parameters: each active space key drawn in `space` order."""
        params: dict[str, Any] = {}
        for key, param in self.space.items():
            if self.active(key, params):
                params[key] = param.suggest(trial, key)
        return params


def trial_name(number: int) -> str:
    return f"trial_{number:04d}"


def _base_data(base: str | dict | None) -> dict[str, Any]:
    if base is None:
        raise ConfigError(
            "sweep key base is required: a run config file (e.g. configs/grpo_tiny.yaml) or an inline mapping"
        )
    if isinstance(base, dict):
        return copy.deepcopy(base)
    path = Path(base)
    if not path.is_file():
        raise ConfigError(f"sweep key base: config file {base!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"sweep key base: {base!r} is not a valid YAML text file: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"sweep key base: {base!r} must hold a mapping")
    return data


def _checked(config_class: type, data: dict, what: str) -> Any:
    try:
        return from_dict(config_class, copy.deepcopy(data))
    except ConfigError as error:
        raise ConfigError(f"{what}: {error}") from None


def _check_key_exists(config_class: type, key: str, what: str) -> None:
    """A `ConfigError` naming `key` unless it is a field (or a nested field) of `config_class`."""
    from typing import get_type_hints

    node: Any = config_class
    for depth, part in enumerate(key.split(".")):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            raise ConfigError(f"{what} {key}: {'.'.join(key.split('.')[:depth])} has no sub-keys")
        fields = {f.name for f in dataclasses.fields(node)}
        if part not in fields:
            prefix = ".".join(key.split(".")[:depth])
            where = f" under {prefix}" if prefix else ""
            raise ConfigError(
                f"{what} {key}: unknown config key{where} of {config_class.__name__}; valid keys here: "
                f"{', '.join(sorted(fields))}"
            )
        node = get_type_hints(node)[part]


def resolve_sweep(config: SweepConfig, sweep_path: str | Path | None = None, run_overrides: list[str] = ()) -> Sweep:
    """Check a sweep against its base config class and resolve where its study lives.

    `run_overrides` are ``key=value`` texts for the run config (the command line's), applied after
    the sweep's `overrides`. Raises `ConfigError` naming the first bad key.
    """
    from chessgrpo.tasks.kinds import config_class as kind_config_class

    if not config.objective.metric:
        raise ConfigError("sweep key objective.metric is required: a held-out metric such as eval/esl")
    if config.objective.direction is None:
        raise ConfigError("sweep key objective.direction is required: minimize or maximize")
    data = _base_data(config.base)
    for key, value in config.overrides.items():
        if not isinstance(key, str) or not all(part.isidentifier() for part in key.split(".")):
            raise ConfigError(f"sweep overrides: {key!r} is not a dotted config key like steps or grpo.kl_coef")
        set_dotted(data, key, value)
    for text in run_overrides:
        parts, value = parse_override(text)
        set_dotted(data, ".".join(parts), value)
    kind = data.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ConfigError("sweep base config has no `kind:` (pretrain, sft, move_group, trajectory or rookworld)")
    config_class = kind_config_class(kind)
    for key in config.overrides:
        _check_key_exists(config_class, key, "sweep overrides:")
    base_config = _checked(config_class, data, "sweep base config (with the overrides)")
    if config.objective.measure == "change" and not getattr(base_config, "eval_at_start", False):
        raise ConfigError(
            "objective.measure: change needs the step-0 evaluation: set eval_at_start: true in the base or overrides"
        )

    space = parse_space(config.space)
    for key, param in space.items():
        _check_key_exists(config_class, key, "space")
        if key in ("kind", "run", "run.out_dir", "run.name"):
            raise ConfigError(f"space {key}: this key places the trial's run directory; it cannot be searched")
        for value in param.values_to_check():
            trial = copy.deepcopy(data)
            for condition, expected in (param.when or {}).items():  # a conditional key is checked where it applies
                set_dotted(trial, condition, expected[0] if isinstance(expected, list) and expected else expected)
            set_dotted(trial, key, value)
            _checked(config_class, trial, f"space {key} = {value!r}")
        for condition in param.when or {}:
            if condition not in space:
                _check_key_exists(config_class, condition, f"space.{key}.when:")

    study_name = config.study_name or (Path(sweep_path).stem if sweep_path is not None else "sweep")
    if not _PLAIN_NAME.fullmatch(study_name) or study_name in (".", ".."):
        raise ConfigError(
            f"study_name {study_name!r} is not a plain name (letters, digits, . _ - only): set study_name"
        )
    study_dir = (Path(base_config.run.out_dir) / study_name).resolve()
    storage = config.storage or f"sqlite:///{study_dir / STUDY_DB}"
    sweep = Sweep(config, kind, config_class, data, space, study_name, study_dir, storage, base_config, {})
    if config.enqueue_default:
        defaults: dict[str, Any] = {}
        for key, param in space.items():
            if not sweep.active(key, defaults):
                continue
            value = get_dotted(base_config, key)
            if param.type == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not param.contains(value):
                raise ConfigError(
                    f"space {key}: the base config's value {value!r} is outside the space, so the default trial cannot "
                    "run it; widen the space or set enqueue_default: false"
                )
            defaults[key] = value
        sweep.default_params = defaults
    return sweep


def load_sweep(path: str | Path | None, overrides: list[str] = ()) -> Sweep:
    """`chessgrpo sweep --config FILE [overrides]`: ``sweep.<key>=...`` and the study's own keys (``budget.trials=2``,
    ``parallel=2``: `SweepConfig`'s fields, none of which a run config has) set sweep keys, any other the runs' config."""
    study_keys = {field.name for field in dataclasses.fields(SweepConfig)}

    def is_study_key(text: str) -> bool:
        return text.startswith("sweep.") or text.partition("=")[0].split(".")[0] in study_keys

    sweep_overrides = [text.removeprefix("sweep.") for text in overrides if is_study_key(text)]
    run_overrides = [text for text in overrides if not is_study_key(text)]
    try:
        config = load_config(SweepConfig, path, sweep_overrides)
    except ConfigError as error:
        raise ConfigError(f"sweep config: {error}") from None
    return resolve_sweep(config, path, run_overrides)


def sweep_record(sweep: Sweep) -> dict[str, Any]:
    """What the study keeps about its sweep (Optuna user attributes): enough for a summary on another machine."""
    return {
        "kind": sweep.kind,
        "study_dir": str(sweep.study_dir),
        "objective": to_dict(sweep.config.objective),
        "space": {key: to_dict(param) for key, param in sweep.space.items()},
        "base": to_dict(sweep.base_config),
    }
