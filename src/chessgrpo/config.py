"""Typed configuration: plain dataclasses, YAML files, dotted command-line overrides.

A command's configuration is a tree of dataclasses (see `EngineConfig`, `RunConfig` and the
command configs built from them). `load_config` builds that tree from an optional YAML file plus
overrides like ``engine.nodes=5000``. Every key is consumed: an unknown key or a value of the
wrong type raises `ConfigError` naming the dotted key, so a typo never silently falls back to a
default (one of the predecessor systems' failures). Every float must be finite (``lr=.inf`` or
``nan`` never reaches an optimizer); ranges are checked by each dataclass's ``__post_init__``, whose
``ValueError`` "<field> must be ..." becomes "config key <section>.<field> must be ...". A YAML
syntax error names the file, line and column. `save_config` writes the resolved tree into the run
directory.

We use a small layer over dataclasses + PyYAML instead of omegaconf: the type checks we need
(Optional, Literal, lists, nested dataclasses) fit in one readable file and the dataclasses stay
the single place where defaults and documentation live.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from chessgrpo.errors import InputError, one_line, quote
from chessgrpo.paths import SYZYGY_DEFAULT

T = TypeVar("T")


class ConfigError(InputError):
    """A configuration file or override is malformed: unknown key, wrong type, bad syntax, or a
    value a config dataclass's ``__post_init__`` rejects (`from_dict` converts its `ValueError`)."""


def resumable(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that a resumed run may change (it does not touch the training math).

    `resumable_keys` collects these markers, so the list of resumable keys lives on the fields.
    """
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"resumable": True})


def resumable_keys(cls: type, prefix: str = "") -> frozenset[str]:
    """Dotted names of every field of config class `cls` (and its nested sections) marked `resumable`.

    A nested section whose class sets ``RESUMABLE = True`` is resumable as a whole.
    """
    keys: set[str] = set()
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        name = _dotted(prefix, field.name)
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            if getattr(tp, "RESUMABLE", False) or field.metadata.get("resumable"):
                keys |= {_dotted(name, f.name) for f in dataclasses.fields(tp)}
            else:
                keys |= resumable_keys(tp, name)
        elif field.metadata.get("resumable"):
            keys.add(name)
    return frozenset(keys)


@dataclasses.dataclass
class EngineConfig:
    """How Stockfish is run for rewards, labels and evaluation."""

    path: str | None = resumable(None)
    """Stockfish binary; None searches $CHESSGRPO_STOCKFISH, PATH and /usr/games."""
    processes: int = resumable(0)
    """Engine processes evaluated in parallel; 0 = one per CPU core (in a torchrun job: per rank, the
    machine's cores divided by its ranks)."""
    threads: int = 1
    """UCI Threads per process. 1 keeps node-limited searches deterministic."""
    hash_mb: int = 1
    """UCI Hash per process in MiB. Small on purpose: node-limited searches of <= ~10^4 nodes fit,
    and the table is cleared before every search (a 16 MiB table costs ~10% throughput at 10^4
    nodes: docs/benchmarks.md, "Engine pool: `bench/engine_throughput.py` (`make bench`)"; results
    were identical at 1 and 16 MiB on 400 positions: docs/results.md, "Design choices")."""
    nodes: int | None = 10_000
    """Node limit per search (the default limit kind: reproducible, unlike time)."""
    depth: int | None = None
    """Depth limit per search; used instead of nodes when set."""
    timeout_s: float = resumable(60.0)
    """A search (or a start-up handshake, capped at 30 s) taking longer than this counts as a hung
    engine (e.g. a SIGSTOPped process): it is killed, replaced and the search retried."""
    retries_per_position: int = resumable(3)
    """Fresh-engine retries of one search after a crash or hang; one more failure stops the run with
    an error naming the position (a retried search returns exactly what an undisturbed one would)."""
    max_failures: int = resumable(1000)
    """Engine faults (crashes, hangs, failed starts) one pool tolerates before it stops the run."""
    startup_attempts: int = resumable(5)
    """Attempts to start one engine process (exponential backoff with jitter between them)."""
    clear_hash: bool = True
    """Send ucinewgame before each search so results do not depend on earlier searches."""
    cache: bool = True
    """Persistent SQLite cache of evaluations."""
    cache_path: str = resumable("runs/cache/evaluations.sqlite")
    """Where the evaluation cache lives."""
    syzygy_path: str | None = SYZYGY_DEFAULT
    """Directory (or os.pathsep-separated directories) of Syzygy tables; None disables."""

    def __post_init__(self) -> None:
        for name, low in (
            ("processes", 0),
            ("threads", 1),
            ("hash_mb", 1),
            ("retries_per_position", 0),
            ("max_failures", 0),
            ("startup_attempts", 1),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        for name in ("nodes", "depth"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or null, got {getattr(self, name)}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {self.timeout_s}")


@dataclasses.dataclass
class RunConfig:
    """Where a run writes its outputs."""

    name: str = "default"
    """Run name (a plain name: no path separators, no ..); outputs go to <out_dir>/<name>/."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    seed: int = 0
    """Seed for every random generator of the run."""

    def __post_init__(self) -> None:
        if not _PLAIN_NAME.fullmatch(self.name) or self.name in (".", ".."):
            raise ConfigError(
                f"config key run.name: {quote(self.name)} is not a plain name (letters, digits, . _ - only; no path "
                "separators, no ..); put the parent directory in run.out_dir"
            )

    @property
    def directory(self) -> Path:
        return Path(self.out_dir) / self.name


@dataclasses.dataclass
class EngineEvalConfig:
    """`chessgrpo engine eval`: evaluate positions with the engine pool (a smoke job and a demo)."""

    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="engine_eval"))
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    random_positions: int = 200
    """Number of positions from seeded random playouts when no FEN/file is given."""
    max_plies: int = 60
    """Longest random playout used to make a position."""

    def __post_init__(self) -> None:
        if self.random_positions < 0 or self.max_plies < 1:
            raise ValueError(
                f"need random_positions >= 0 and max_plies >= 1, got {self.random_positions}, {self.max_plies}"
            )


# --------------------------------------------------------------------------------------------
# Building dataclasses from plain data


def from_dict(cls: type[T], data: dict[str, Any] | None, *, prefix: str = "", base: T | None = None) -> T:
    """Build dataclass `cls` from a nested dict, checking every key and type.

    Keys missing from `data` keep the values of `base` (default: `cls()`), so a nested section's
    defaults set by its parent (e.g. ``run: RunConfig(name="pretrain")``) survive an override of
    one of its keys. Unknown keys raise `ConfigError` naming the dotted key and the valid ones.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)  # YAML keys may be numbers
    if unknown:
        names = ", ".join(_dotted(prefix, k) for k in unknown)
        raise ConfigError(
            f"unknown config key {names}{_closest(unknown, fields)}; valid keys here: {', '.join(sorted(fields))}"
        )
    if base is None:
        try:
            base = cls()
        except TypeError:  # a dataclass with required fields: no base, every key must be given
            base = None
    kwargs = {}
    for name, value in data.items():
        child_base = getattr(base, name, None) if base is not None else None
        kwargs[name] = _coerce(value, hints[name], _dotted(prefix, name), base=child_base)
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as error:  # a __post_init__ check: say which section (and key) it came from
        raise ConfigError(_section_error(prefix, str(error), fields)) from None


def to_dict(config: Any) -> dict[str, Any]:
    """The plain-data form of a config dataclass (what `save_config` writes)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


def _section_error(prefix: str, message: str, fields: typing.Iterable[str]) -> str:
    """A section's ``__post_init__`` message with its place: "timeout_s must be > 0" of section
    `engine` becomes "config key engine.timeout_s must be > 0"; other messages get "engine: "."""
    first = re.split(r"[\s:=]", message, maxsplit=1)[0]
    if prefix and first in set(fields):
        return f"config key {prefix}.{message}"
    return f"{prefix or 'config'}: {message}"


def _dotted(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, base: Any = None) -> Any:
    """Check `value` against type `tp`; convert only where lossless (int -> float, list -> tuple)."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise ConfigError(f"config key {key}: null is not allowed (expected {_type_name(tp)})")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as error:
                errors.append(str(error))
        if len(errors) == 1:  # `X | None`: the one type's own message says what is wrong
            raise ConfigError(errors[0])
        raise ConfigError(f"config key {key}: {quote(value)} does not match {_type_name(tp)}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(f"config key {key}: {quote(value)} is not one of {list(allowed)}")
        return value
    if origin is dict or tp is dict:  # e.g. task.rewards: {name: weight}; each value checked under its own key
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key}: expected a mapping, got {quote(value)}")
        key_type, value_type = get_args(tp) or (Any, Any)
        return {
            _coerce(k, key_type, f"{key} (its key {k!r})"): _coerce(v, value_type, _dotted(key, k))
            for k, v in value.items()
        }
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key}: expected a list, got {quote(value)}")
        args = get_args(tp)
        item_type = args[0] if args else Any
        items = [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        return from_dict(tp, value, prefix=key, base=base if isinstance(base, tp) else None)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key}: expected true or false, got {quote(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key}: expected an integer, got {quote(value)}")
    if tp is float:
        number = None
        try:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                number = float(value)
            # YAML 1.1 reads 3e-4 (no dot) as a string; accept any decimal or scientific literal.
            elif isinstance(value, str) and _FLOAT_LITERAL.fullmatch(value.strip()):
                number = float(value)
        except OverflowError:  # an integer beyond float range
            number = math.inf
        if (
            number is None
            and isinstance(value, str)
            and value.strip().lower().lstrip("+-.") in ("nan", "inf", "infinity")
        ):
            number = math.nan  # "nan" and "inf" (YAML strings) get the same message as .nan and .inf
        if number is None:
            raise ConfigError(f"config key {key}: expected a number, got {quote(value)}")
        if not math.isfinite(number):  # .inf / .nan / 1e999: no knob means "infinite" (null disables)
            raise ConfigError(f"config key {key}: expected a finite number, got {quote(value)}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key {key}: expected a string, got {quote(value)}")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"config key {key}: {quote(value)} is not a {_type_name(tp)}")


def engine_limits_unused(engine: EngineConfig, rules: str) -> None:
    """A `ConfigError` when `engine.nodes` or `engine.depth` is set in a config whose every search passes
    its own limit (the GRPO kinds): such a key would have no effect. `rules` names the keys that do."""
    for key in ("nodes", "depth"):
        if getattr(engine, key) is not None:
            raise ConfigError(
                f"config key engine.{key}: has no effect in this kind ({rules} set the search limits); leave it null"
            )


def grpo_engine_config() -> EngineConfig:
    """The engine section of a GRPO kind: no engine-wide search limit (each search passes its own)."""
    return EngineConfig(nodes=None)


# --------------------------------------------------------------------------------------------
# Files and overrides


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_FLOAT_LITERAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into (["a", "b", "c"], parsed value). Values are YAML scalars."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. engine.nodes=5000")
    key, raw = text.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p.isidentifier() for p in parts):
        raise ConfigError(f"override {text!r}: {key!r} is not a dotted key like engine.nodes")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        raise ConfigError(f"override {quote(text)}: cannot parse value: {one_line(error)}") from None
    return parts, value


def _closest(unknown: list[Any], valid: Collection[str]) -> str:
    """ ", did you mean 'lr'?" for the valid key nearest to the first unknown one (difflib), or ""."""
    matches = difflib.get_close_matches(str(unknown[0]), list(valid), n=1, cutoff=0.6) if unknown else []
    return f", did you mean {matches[0]!r}?" if matches else ""


def _apply_override(data: dict[str, Any], parts: list[str], value: Any, cls: type, text: str) -> None:
    """Set data[parts] = value, using the dataclass tree to resolve types of string-ish values."""
    node = data
    current_cls: Any = cls
    for depth, part in enumerate(parts):
        names = {f.name for f in dataclasses.fields(current_cls)}
        if part not in names:
            raise ConfigError(
                f"unknown config key {'.'.join(parts[: depth + 1])} (in override {text!r}){_closest([part], names)}; "
                f"valid keys here: {', '.join(sorted(names))}"
            )
        field_type = get_type_hints(current_cls)[part]
        if depth == len(parts) - 1:
            # `run.name=123` means the string "123": YAML would read it as an int.
            if _accepts_str(field_type) and not isinstance(value, str) and value is not None:
                value = text.split("=", 1)[1].strip()
            node[part] = value
            return
        if field_type is Any:  # free-form (e.g. a mixture task's config): checked where it is parsed
            child = node.setdefault(part, {})
            for key in parts[depth + 1 : -1]:
                if not isinstance(child, dict):
                    break
                child = child.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(parts[:-1])} is not a mapping")
            child[parts[-1]] = value
            return
        if _is_mapping(field_type) and depth + 1 == len(parts) - 1:
            # One entry of a mapping (task.rewards.win_prob=0.5): set beside the file's other entries.
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node[part][parts[-1]] = value
            return
        item_type = _named_list_item(field_type)
        if item_type is not None and depth + 1 < len(parts) - 1:
            # A list of named items (a mixture's tasks): the next part names the item, e.g. tasks.games.weight=0.5.
            items = node.get(part) or []
            chosen = [item for item in items if isinstance(item, dict) and item.get("name") == parts[depth + 1]]
            if not chosen:
                names = [item.get("name") for item in items if isinstance(item, dict)]
                raise ConfigError(
                    f"override {text!r}: no item named {parts[depth + 1]!r} in {'.'.join(parts[: depth + 1])} (names: {names})"
                )
            _apply_override(chosen[0], parts[depth + 2 :], value, item_type, text)
            return
        if not dataclasses.is_dataclass(field_type):
            raise ConfigError(f"override {text!r}: {'.'.join(parts[: depth + 1])} has no sub-keys")
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {'.'.join(parts[: depth + 1])} is not a mapping")
        node, current_cls = child, field_type


def _is_mapping(tp: Any) -> bool:
    """Whether config type `tp` is a mapping (``dict[...]`` or ``dict[...] | None``)."""
    options = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    return any(option is dict or get_origin(option) is dict for option in options)


def _named_list_item(tp: Any) -> Any:
    """The item dataclass of a ``list[X]`` field whose items have a ``name`` (else None)."""
    if get_origin(tp) is not list:
        return None
    (item,) = get_args(tp) or (None,)
    if dataclasses.is_dataclass(item) and "name" in {f.name for f in dataclasses.fields(item)}:
        return item
    return None


def _accepts_str(tp: Any) -> bool:
    if tp is str:
        return True
    if get_origin(tp) in (Union, types.UnionType):
        return str in get_args(tp)
    return False


def read_yaml_file(path: str | os.PathLike) -> dict[str, Any]:
    """The top-level mapping of a YAML config file ({} for an empty one).

    Raises `ConfigError` naming the file when it is missing, not UTF-8 text (with the line and
    byte), not valid YAML (with the line and column of the error) or not a mapping at the top.
    """
    from chessgrpo.files import read_text

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = read_text(path)
    except ValueError as error:
        raise ConfigError(f"config file {error}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_yaml_problem(error)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {str(path)!r}: top level must be a mapping, got {type(loaded).__name__}")
    return loaded


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line for a YAML error: "line L, column C: <problem> (<context> started at line K)"."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None or problem is None:
        return one_line(error)
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and context_mark is not None and context_mark.line != mark.line:
        context += f" started at line {context_mark.line + 1}"
    return one_line(f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else ""))


def load_config(cls: type[T], path: str | os.PathLike | None = None, overrides: typing.Sequence[str] = ()) -> T:
    """Build a `cls` config from an optional YAML file and ``key=value`` overrides (applied last)."""
    data: dict[str, Any] = read_yaml_file(path) if path is not None else {}
    for text in overrides:
        parts, value = parse_override(text)
        _apply_override(data, parts, value, cls, text)
    return from_dict(cls, data)


def save_config(config: Any, path: str | os.PathLike) -> Path:
    """Write the resolved config as YAML (creating parent directories); returns the path."""
    from chessgrpo.files import write_text_atomic

    return write_text_atomic(path, yaml.safe_dump(to_dict(config), sort_keys=False))  # never half-written
