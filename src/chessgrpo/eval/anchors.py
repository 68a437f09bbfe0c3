"""Opponents for rating games ("anchors"), their names, ratings, and the players that move in games.

Anchors on the command line (`parse_anchor`):

- ``random``: a uniformly random legal mover. Its rating is a **convention** (`random_rating`,
  default 0): no rating list measures it, it only fixes where the scale starts.
- ``sf-skill:N``: Stockfish with ``Skill Level`` N (0..20) at a fixed node (or depth) limit.
- ``sf-elo:N``: Stockfish with ``UCI_LimitStrength`` and ``UCI_Elo`` N at the same limit. The
  allowed range is read from the engine at runtime (Stockfish 15.1: 1350..2850; 16: 1320..3190).
- ``sf-nodes:N``: full-strength Stockfish searching N nodes per move (deterministic with one
  thread; no published rating).
- ``uci:PATH[:KEY=VALUE]...``: any UCI engine, the way cutechess-cli and fastchess take engines.
  PATH is a binary path or a name looked up on PATH and /usr/games (``uci:glaurung``). Settings
  after it, each ``:KEY=VALUE``: one limit, ``nodes=N``, ``depth=N`` or ``movetime=MS`` (default:
  the anchor node/depth limit), ``option.NAME=VALUE`` (``setoption``; the engine must advertise
  NAME), ``name=NAME`` (the name in the PGN and the summary; default: the engine's ``id name``) and
  ``elo=R`` (its rating; default: unrated). E.g. ``uci:/usr/games/toga2:depth=4:option.Hash=32``.
- NAME of an engine in an engines file (`load_engines`, ``--engines FILE``): a YAML list of
  engines, each with a name, a command (+ args), UCI options, a limit and an optional Elo rating.
- a checkpoint path: another policy (a checkpoint or run directory, `resolve_checkpoint`).

``sf-*`` anchors need Stockfish at ``engine.path``; ``uci:`` and engines-file anchors play
whatever engine they name. Before any game each engine anchor is started once (`prepare_anchors`):
its handshake, its options and one search of the start position with its limit, so an engine that
is not UCI, lacks an option, ignores its node limit or answers nonsense is one clear error up
front (docs/engines.md).

Where anchor ratings come from (`anchor_rating`), and what they mean:

- Stockfish's ``UCI_Elo`` is calibrated against **CCRL** ratings, not human (FIDE, Lichess)
  ratings: Stockfish 15.1's source says it is "anchored to CCRL Elo (goldfish 1.13 = 2000)" with
  "a fit through Ordo derived Elo for match (TC 60+0.6) results". ``sf-elo:N`` is rated N.
- ``sf-skill:N`` is rated by inverting Stockfish 15/15.1's own map from UCI_Elo to skill level,
  level = ((Elo - 1346.6) / 143.4) ^ (1 / 0.806), i.e. Elo = 1346.6 + 143.4 * N^0.806 (level 0:
  1347, 5: 1871, 10: 2264). Level 20 is full strength and has no rating. Other Stockfish
  versions use other maps; their skill anchors are unrated unless `anchor_ratings` gives one.
- Skill play is calibrated at 60s+0.6s, but Stockfish picks its weakened move from the MultiPV=4
  lines of iteration depth 1 + level, so the node/depth limit only has to reach that depth
  (level 0 picks at depth 1; 1000 nodes reach depth ~5-7 in the middlegame).
- Stockfish's weakened move choice is randomised (its PRNG is seeded from the clock), so games
  against ``sf-skill``/``sf-elo`` are **not** reproducible; ``random`` (seeded), ``sf-nodes`` and
  argmax checkpoints are. Engine anchors therefore run in a dedicated UCI process per game
  worker, never through the cached `EnginePool`.
- Other engines are rated by what the user says (``elo=`` or the engines file's ``elo``, or
  ``anchor_ratings``), else unrated.

Players (`Mover`) choose one move given a `chess.Board` that carries the game's move stack, so
repetitions are visible: `RandomMover`, `EngineMover` (any UCI engine, python-chess's client), and
`PolicyMover` (an `ActionPolicy`: argmax or sampled; when it is winning on material it avoids
moves that allow a threefold repetition, see `PolicyMover`; or, with `SearchSettings`, the move
of a search with its value head, which scores repeated positions as draws).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol

import chess
import chess.engine

from chessgrpo.engine.locate import EngineError, EngineNotFoundError, find_engine, find_stockfish
from chessgrpo.engine.pool import RetryPolicy
from chessgrpo.engine.uci import EngineTimeout, EngineUnsupported, UciOption, UciProcess, choose_settings
from chessgrpo.errors import quote
from chessgrpo.eval.players import build_searcher

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from chessgrpo.search import SearchResult, SearchSettings

logger = logging.getLogger(__name__)

CALIBRATION_NOTE = (
    "Stockfish's UCI_Elo and Skill Level ratings are CCRL-anchored engine ratings (CCRL 40/4, Goldfish 1.13 = 2000, "
    "fitted at 60s+0.6s), not human FIDE or Lichess ratings; 'random' is rated by convention."
)

SKILL_LEVELS = range(0, 21)
DEFAULT_ANCHOR_NODES = 1000
ENGINE_HASH_MB = 16
PIECE_VALUES = {chess.PAWN: 1, chess.KNIGHT: 3, chess.BISHOP: 3, chess.ROOK: 5, chess.QUEEN: 9, chess.KING: 0}

_ENGINE_ANCHOR = re.compile(r"^(sf-skill|sf-elo|sf-nodes):(-?\d+)$")
_UCI_SETTING = re.compile(r"^(nodes|depth|movetime|name|elo|option\.[^=]+)=(.*)$", re.DOTALL)
_SETTING_SHAPE = re.compile(r"^([A-Za-z_]\w*|option\.[^=]+)=")
"""Where the path of ``uci:PATH:...`` ends: at the first ``:KEY=`` (known key or not)."""
MANAGED_OPTIONS = ("multipv", "ponder", "uci_chess960", "uci_variant")
"""Options the game runner sets itself (python-chess manages them); an anchor may not set them."""
UCI_GRAMMAR = "uci:PATH[:nodes=N|:depth=N|:movetime=MS][:option.NAME=VALUE]...[:name=NAME][:elo=R]"
ENGINE_FILE_KEYS = ("name", "command", "args", "options", "limit", "elo", "timeout_s")
LIMIT_KEYS = ("nodes", "depth", "movetime")


# --------------------------------------------------------------------------------------------
# Anchor specifications


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """A UCI engine as an opponent (``uci:`` anchors and engines-file entries). Picklable.

    Exactly one of `nodes`, `depth`, `movetime_ms` is set."""

    command: tuple[str, ...]
    """The resolved binary, then its arguments."""
    name: str = ""
    """The name given (``name=`` or the engines file); "" = name it by its ``id name``."""
    options: tuple[tuple[str, str], ...] = ()
    """UCI options to set (name, value text); each must be advertised by the engine."""
    nodes: int | None = None
    depth: int | None = None
    movetime_ms: int | None = None
    elo: float | None = None
    """The rating given for it (None: unrated unless anchor_ratings gives one)."""
    source: str = ""
    """Where it was defined: "the anchor" or "engines file PATH"."""
    timeout_s: float = 60.0
    """Seconds beyond the limit for a move (and, capped at 30, for the handshake)."""
    retry: RetryPolicy = RetryPolicy()
    """How a crashed, hung or nonsense-answering engine is replaced and its move asked again."""
    id_name: str = ""
    """The engine's ``id name``, filled in by `prepare_anchors`."""
    applied: tuple[tuple[str, str], ...] = ()
    """The options actually set (Threads/Hash where the engine has them, then `options`), filled
    in by `prepare_anchors`."""

    def __post_init__(self) -> None:
        limits = [v for v in (self.nodes, self.depth, self.movetime_ms) if v is not None]
        if len(limits) != 1:
            raise ValueError(f"engine {self.name or self.command[0]!r}: give exactly one limit of nodes, depth, movetime")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in limits):
            raise ValueError(f"engine {self.name or self.command[0]!r}: the limit must be a positive integer, got {limits[0]!r}")

    def limit(self) -> chess.engine.Limit:
        if self.nodes is not None:
            return chess.engine.Limit(nodes=self.nodes)
        if self.depth is not None:
            return chess.engine.Limit(depth=self.depth)
        return chess.engine.Limit(time=self.movetime_ms / 1000)  # type: ignore[operator]

    def limit_text(self) -> str:
        if self.nodes is not None:
            return f"nodes={self.nodes}"
        return f"depth={self.depth}" if self.depth is not None else f"movetime={self.movetime_ms}ms"


@dataclasses.dataclass(frozen=True)
class AnchorSpec:
    """A parsed anchor: what it is and its search limit. Picklable (sent to game workers)."""

    text: str
    """The anchor's name: as named on the command line ("random", "sf-skill:0", the checkpoint
    path); for a UCI engine its given name or (after `prepare_anchors`) its ``id name``. PGN
    player names, the summary and `anchor_ratings` use it."""
    kind: str
    """"random", "sf-skill", "sf-elo", "sf-nodes", "uci" or "checkpoint"."""
    value: int | None = None
    """Skill level, UCI_Elo or node count for Stockfish anchors."""
    nodes: int | None = None
    """Node limit per move of sf-skill / sf-elo anchors (sf-nodes: `value`)."""
    depth: int | None = None
    """Depth limit per move of sf-skill / sf-elo anchors (instead of nodes)."""
    path: str | None = None
    """The resolved checkpoint directory of a checkpoint anchor."""
    engine: EngineSpec | None = None
    """The engine of a "uci" anchor."""
    given: str = ""
    """The anchor as given, when `text` is another name (a renamed ``uci:`` anchor)."""

    @property
    def is_engine(self) -> bool:
        return self.is_stockfish or self.kind == "uci"

    @property
    def is_stockfish(self) -> bool:
        """An ``sf-*`` anchor: Stockfish at ``engine.path``."""
        return self.kind.startswith("sf-")

    def engine_options(self) -> dict[str, Any]:
        """UCI options set on the anchor's engine: Threads 1 and a fixed Hash (where the engine has
        them), then the anchor's own (Skill Level, UCI_Elo, or a UCI engine's `options`)."""
        options: dict[str, Any] = {"Threads": 1, "Hash": ENGINE_HASH_MB}
        options.update(self.required_options())
        return options

    def required_options(self) -> dict[str, Any]:
        """The options the anchor cannot play without (the engine must advertise each)."""
        if self.kind == "sf-skill":
            return {"Skill Level": self.value}
        if self.kind == "sf-elo":
            return {"UCI_LimitStrength": True, "UCI_Elo": self.value}
        if self.engine is not None:
            return dict(self.engine.options)
        return {}

    def limit(self) -> chess.engine.Limit:
        if self.engine is not None:
            return self.engine.limit()
        if self.kind == "sf-nodes":
            return chess.engine.Limit(nodes=self.value)
        return chess.engine.Limit(nodes=self.nodes) if self.depth is None else chess.engine.Limit(depth=self.depth)

    def describe(self, engine_name: str = "Stockfish") -> str:
        """A reproducible description: engine id name, options, limit (or the policy's path)."""
        if self.kind == "random":
            return "uniform random legal mover"
        if self.kind == "checkpoint":
            return f"policy {self.path}"
        if self.engine is not None:
            engine = self.engine
            options = engine.applied or tuple((name, _uci_value(value)) for name, value in self.engine_options().items())
            parts = [engine.id_name or "UCI engine", " ".join(engine.command), *(f"{n}={v}" for n, v in options), engine.limit_text()]
            return "; ".join(parts)
        options = "; ".join(f"{name}={_uci_value(value)}" for name, value in self.engine_options().items())
        limit = self.limit()
        bound = f"nodes={limit.nodes}" if limit.nodes is not None else f"depth={limit.depth}"
        return f"{engine_name}; {options}; {bound}"


def _uci_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _positive_int(text: Any, what: str) -> int:
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a positive integer, got {text!r}")
    try:
        number = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{what} must be a positive integer, got {quote(str(text))}") from None
    if number < 1:
        raise ValueError(f"{what} must be a positive integer, got {number}")
    return number


def _check_name(name: str, where: str) -> str:
    name = str(name).strip()
    if not name or "," in name or "\n" in name or name == "random" or name.startswith(("sf-", "uci:")):
        raise ValueError(
            f"{where}: engine name {quote(name)} is not usable: it must be non-empty, without commas or line breaks, "
            "and not random, sf-* or uci:*"
        )
    return name


def _option_pair(name: Any, value: Any, where: str) -> tuple[str, str]:
    name = str(name).strip()
    if not name or "\n" in name:
        raise ValueError(f"{where}: bad option name {quote(name)}")
    if name.lower() in MANAGED_OPTIONS:
        raise ValueError(f"{where}: option {name!r} is set by the game runner itself and cannot be given")
    text = _uci_value(value) if isinstance(value, bool) else str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"{where}: option {name!r} value {quote(text)} spans lines")
    return name, text


def _engine_limit(limit: Mapping[str, Any], nodes: int | None, depth: int | None, where: str) -> dict[str, int | None]:
    """One of nodes/depth/movetime from `limit`, else the default (`depth` if set, else `nodes`)."""
    given = {key: value for key, value in limit.items() if value is not None}
    unknown = sorted(set(given) - set(LIMIT_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown limit {unknown[0]!r}; use one of nodes, depth, movetime (milliseconds)")
    if len(given) > 1:
        raise ValueError(f"{where}: give one limit, not {' and '.join(sorted(given))}")
    if not given:
        given = {"depth": depth} if depth is not None else {"nodes": nodes}
    key, value = next(iter(given.items()))
    number = _positive_int(value, f"{where}: {key}")
    return {"nodes": number if key == "nodes" else None, "depth": number if key == "depth" else None,
            "movetime_ms": number if key == "movetime" else None}  # fmt: skip


def parse_uci_anchor(
    text: str, *, nodes: int | None = DEFAULT_ANCHOR_NODES, depth: int | None = None, timeout_s: float = 60.0,
    retry: RetryPolicy | None = None,
) -> AnchorSpec:
    """Parse ``uci:PATH[:KEY=VALUE]...`` (`UCI_GRAMMAR`); the binary must exist."""
    body = text[len("uci:") :]
    parts = body.split(":")
    split = next((i for i, part in enumerate(parts) if i > 0 and _SETTING_SHAPE.match(part)), len(parts))
    command, settings = ":".join(parts[:split]), parts[split:]
    where = f"anchor {quote(text)}"
    if not command.strip():
        raise ValueError(f"{where}: no engine path; expected {UCI_GRAMMAR}")
    limit: dict[str, str] = {}
    options: list[tuple[str, str]] = []
    name, elo = "", None
    for setting in settings:
        match = _UCI_SETTING.match(setting)
        if match is None:
            raise ValueError(f"{where}: {quote(setting)} is not KEY=VALUE with KEY one of nodes, depth, movetime, "
                             f"option.NAME, name, elo; expected {UCI_GRAMMAR}")  # fmt: skip
        key, value = match.groups()
        if key in LIMIT_KEYS:
            limit[key] = value
        elif key == "name":
            name = _check_name(value, where)
        elif key == "elo":
            try:
                elo = float(value)
            except ValueError:
                raise ValueError(f"{where}: elo must be a number, got {quote(value)}") from None
        else:
            options.append(_option_pair(key[len("option.") :], value, where))
    try:
        binary = find_engine(command)
    except EngineNotFoundError as error:
        raise EngineNotFoundError(f"{where}: {error}") from None
    engine = EngineSpec(
        command=(str(binary),), name=name, options=tuple(options), elo=elo, source="the anchor", timeout_s=timeout_s,
        retry=retry or RetryPolicy(), **_engine_limit(limit, nodes, depth, where),
    )  # fmt: skip
    return AnchorSpec(text=name or text, kind="uci", engine=engine, given=text)


def load_engines(
    path: str | Path, *, nodes: int | None = DEFAULT_ANCHOR_NODES, depth: int | None = None, timeout_s: float = 60.0,
    retry: RetryPolicy | None = None,
) -> dict[str, EngineSpec]:
    """The engines of an engines file, by name (docs/engines.md)::

        engines:
          - name: ethereal               # how anchors, the PGN and the summary name it
            command: ethereal-chess      # a path (relative: to this file) or a name on PATH / in /usr/games
            args: []                     # command-line arguments
            options: {Hash: 16}          # UCI setoption; each must be advertised by the engine
            limit: {depth: 4}            # one of nodes, depth, movetime (ms); default: anchor_nodes / anchor_depth
            elo: 2400                    # optional rating; unrated without
            timeout_s: 60                # optional: seconds beyond the limit before a move counts as hung

    `ValueError` names the file, the entry and the key at fault; a missing binary is
    `EngineNotFoundError`."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"engines file {str(path)!r} not found") from None
    except yaml.YAMLError as error:
        raise ValueError(f"engines file {str(path)!r} is not valid YAML: {error}") from None
    entries = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(data, dict) or set(data) != {"engines"} or not isinstance(entries, list) or not entries:
        raise ValueError(f"engines file {str(path)!r}: expected a mapping with one key, engines: a non-empty list of engines")
    engines: dict[str, EngineSpec] = {}
    for index, entry in enumerate(entries):
        where = f"engines file {str(path)!r}, engine {index + 1}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping with keys {', '.join(ENGINE_FILE_KEYS)}")
        unknown = sorted(set(entry) - set(ENGINE_FILE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(ENGINE_FILE_KEYS)}")
        for key in ("name", "command"):
            if key not in entry:
                raise ValueError(f"{where}: {key} is required")
        name = _check_name(entry["name"], where)
        where = f"engines file {str(path)!r}, engine {name!r}"
        if name in engines:
            raise ValueError(f"{where}: the name is used twice")
        command = entry["command"]
        command = [command] if isinstance(command, str) else command
        args = entry.get("args") or []
        if not isinstance(command, list) or not command or not isinstance(args, list):
            raise ValueError(f"{where}: command is a string or a list of strings, args a list")
        try:
            binary = find_engine(str(command[0]), base=path.parent)
        except EngineNotFoundError as error:
            raise EngineNotFoundError(f"{where}: {error}") from None
        options = entry.get("options") or {}
        limit = entry.get("limit") or {}
        if not isinstance(options, dict) or not isinstance(limit, dict):
            raise ValueError(f"{where}: options and limit are mappings (e.g. limit: {{depth: 4}})")
        elo = entry.get("elo")
        if elo is not None and (isinstance(elo, bool) or not isinstance(elo, (int, float))):
            raise ValueError(f"{where}: elo must be a number, got {elo!r}")
        timeout = entry.get("timeout_s", timeout_s)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"{where}: timeout_s must be a positive number of seconds, got {timeout!r}")
        engines[name] = EngineSpec(
            command=(str(binary), *(str(a) for a in command[1:]), *(str(a) for a in args)),
            name=name,
            options=tuple(_option_pair(key, value, where) for key, value in options.items()),
            elo=None if elo is None else float(elo),
            source=f"engines file {path}",
            timeout_s=float(timeout),
            retry=retry or RetryPolicy(),
            **_engine_limit(limit, nodes, depth, where),
        )
    return engines


def parse_anchor(
    text: str,
    *,
    nodes: int | None = DEFAULT_ANCHOR_NODES,
    depth: int | None = None,
    engines: Mapping[str, EngineSpec] | None = None,
    timeout_s: float = 60.0,
    retry: RetryPolicy | None = None,
) -> AnchorSpec:
    """Parse one anchor name (see the module docstring); `ValueError` says what is accepted.

    `nodes` / `depth` are the search limit of sf-skill and sf-elo anchors (depth wins when set)
    and the default limit of UCI engines; `engines` are the engines of an engines file, by name;
    `timeout_s` and `retry` govern the UCI engines of ``uci:`` anchors."""
    text = text.strip()
    if depth is not None and (depth < 1 or isinstance(depth, bool)):
        raise ValueError(f"anchor depth must be >= 1, got {depth!r}")
    if depth is None and (nodes is None or nodes < 1):
        raise ValueError(f"anchor nodes must be >= 1, got {nodes!r}")
    if text == "random":
        return AnchorSpec(text=text, kind="random")
    if engines and text in engines:
        return AnchorSpec(text=text, kind="uci", engine=engines[text])
    if text.startswith("uci:"):
        return parse_uci_anchor(text, nodes=nodes, depth=depth, timeout_s=timeout_s, retry=retry)
    match = _ENGINE_ANCHOR.match(text)
    if match:
        kind, value = match.group(1), int(match.group(2))
        if kind == "sf-skill" and value not in SKILL_LEVELS:
            raise ValueError(f"anchor {text!r}: Skill Level must be 0..20, got {value}")
        if kind == "sf-nodes" and value < 1:
            raise ValueError(f"anchor {text!r}: the node count must be >= 1")
        if kind == "sf-nodes":
            return AnchorSpec(text=text, kind=kind, value=value)
        # UCI_Elo's range depends on the engine; `check_anchor` checks it against the running one.
        return AnchorSpec(text=text, kind=kind, value=value, nodes=None if depth is not None else nodes, depth=depth)
    known = f"; engines from the engines file: {', '.join(engines)}" if engines else "; other engines: uci:PATH or --engines FILE"
    if text.startswith("sf-") or ":" in text and not Path(text).exists():
        raise ValueError(
            f"unknown anchor {text!r}: use random, sf-skill:N (0..20), sf-elo:N, sf-nodes:N, {UCI_GRAMMAR}, "
            f"an engine's name from an engines file, or a checkpoint directory{known}"
        )
    from chessgrpo.models.policy import resolve_checkpoint  # lazy: torch only for checkpoint anchors

    try:
        directory = resolve_checkpoint(text)
    except FileNotFoundError as error:
        raise ValueError(
            f"unknown anchor {text!r}: not random, sf-skill:N, sf-elo:N, sf-nodes:N or uci:PATH, not an engine's "
            f"name{known}, and not a checkpoint ({error})"
        ) from None
    return AnchorSpec(text=text, kind="checkpoint", path=str(directory))


def parse_anchors(texts: str | list[str], **limits: Any) -> list[AnchorSpec]:
    """Anchors from a comma-separated string or a list; duplicates are an error.

    `limits` go to `parse_anchor` (nodes, depth, engines, timeout_s, retry)."""
    items = [t for t in (texts.split(",") if isinstance(texts, str) else texts) if t.strip()]
    if not items:
        raise ValueError("no anchors given: e.g. --anchors random,sf-skill:0")
    specs = [parse_anchor(item, **limits) for item in items]
    _check_unique(specs)
    return specs


def _check_unique(specs: list[AnchorSpec]) -> None:
    names = [spec.text for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"anchor {duplicates[0]!r} is listed twice")


# --------------------------------------------------------------------------------------------
# The engine and its limits


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What an engine binary says about itself (read once, before any game)."""

    path: str
    name: str
    """``id name``, e.g. "Stockfish 15.1"."""
    elo_min: int | None
    elo_max: int | None
    """The ``UCI_Elo`` option's range (None when the engine has no such option)."""
    options: frozenset[str] = frozenset()
    """The options it advertises (lower-case names)."""

    @property
    def is_stockfish(self) -> bool:
        return self.name.startswith("Stockfish")


def probe_engine(path: str | None = None, timeout_s: float = 30.0) -> EngineInfo:
    """Start the engine at `path` (Stockfish by default) once: its ``id name`` and options
    (``UCI_Elo ... min X max Y``)."""
    binary = find_stockfish(path)
    engine = UciProcess(binary, threads=None, hash_mb=None, startup_timeout_s=timeout_s)
    try:
        option = engine.options.get("uci_elo")
        return EngineInfo(
            path=str(binary),
            name=engine.name or "unknown engine",
            elo_min=option.min if option is not None else None,
            elo_max=option.max if option is not None else None,
            options=frozenset(engine.options),
        )
    finally:
        engine.quit()


def check_anchor(spec: AnchorSpec, info: EngineInfo) -> None:
    """`ValueError` when the engine at ``engine.path`` cannot play the Stockfish anchor `spec`
    (it is not Stockfish; UCI_Elo outside its range)."""
    if not spec.is_stockfish:
        return
    if not info.is_stockfish:
        raise ValueError(
            f"anchor {spec.text!r} plays Stockfish, but engine.path is {info.name} ({info.path}); set engine.path to "
            f"Stockfish, and play other engines with uci:{info.path}[:depth=N|:nodes=N] (docs/engines.md)"
        )
    if spec.kind != "sf-elo":
        return
    if info.elo_min is None or info.elo_max is None:
        raise ValueError(f"anchor {spec.text!r}: {info.name} has no UCI_Elo option; use sf-skill:N instead")
    if not info.elo_min <= spec.value <= info.elo_max:  # type: ignore[operator]
        raise ValueError(
            f"anchor {spec.text!r}: {info.name} accepts UCI_Elo {info.elo_min}..{info.elo_max} only "
            f"(for weaker play use sf-skill:0..20)"
        )


def probe_anchor(spec: AnchorSpec) -> AnchorSpec:
    """Start a UCI anchor's engine once, set its options and search the start position with its
    limit: the spec with the engine's ``id name`` and the options it got. Anything wrong (not
    UCI, an option it lacks, a node limit it ignores, no legal ``bestmove``, a hang) is one
    `EngineError` naming the anchor and the engine, before any game."""
    engine = spec.engine
    if engine is None:
        raise ValueError(f"{spec.text!r} is not a UCI engine anchor")
    where = f"anchor {spec.text!r}"
    try:
        process = UciProcess(
            engine.command[0], args=engine.command[1:], threads=1, hash_mb=ENGINE_HASH_MB,
            options=dict(engine.options), startup_timeout_s=min(30.0, engine.timeout_s),
        )  # fmt: skip
    except EngineUnsupported as error:
        raise EngineUnsupported(f"{where}: {error}") from None
    except EngineError as error:
        raise EngineError(f"{where}: {error}") from None
    board = chess.Board()
    try:
        result = process.search(
            board.fen(), nodes=engine.nodes, depth=engine.depth, movetime_ms=engine.movetime_ms, timeout_s=engine.timeout_s
        )
        best = result.best_move
        try:
            legal = best is not None and board.is_legal(chess.Move.from_uci(best))
        except ValueError:
            legal = False
        if not legal:
            raise EngineError(
                f"engine {process.label} answered `bestmove {result.bestmove_text}` to the start position "
                f"({engine.limit_text()}): not a legal move"
            )
    except EngineUnsupported as error:
        raise EngineUnsupported(f"{where}: {error}") from None
    except EngineError as error:
        raise EngineError(f"{where}: {error} (checked once, searching the start position, before any game)") from None
    finally:
        process.quit()
    id_name = process.name or Path(engine.command[0]).name
    return dataclasses.replace(spec, engine=dataclasses.replace(engine, id_name=id_name, applied=tuple(process.settings.items())))


def prepare_anchors(specs: list[AnchorSpec]) -> list[AnchorSpec]:
    """`probe_anchor` every UCI anchor, and name the unnamed ones (``uci:PATH`` without ``name=``)
    by their ``id name``, followed by their limit when two would share a name."""
    probed = [probe_anchor(spec) if spec.kind == "uci" else spec for spec in specs]
    taken = {spec.text for spec in probed if not _unnamed(spec)}
    ids = [spec.engine.id_name for spec in probed if _unnamed(spec)]  # type: ignore[union-attr]
    named = []
    for spec in probed:
        if _unnamed(spec):
            engine: EngineSpec = spec.engine  # type: ignore[assignment]
            shared = engine.id_name in taken or ids.count(engine.id_name) > 1
            name = f"{engine.id_name} {engine.limit_text()}" if shared else engine.id_name
            spec = dataclasses.replace(spec, text=name)
        named.append(spec)
    try:
        _check_unique(named)
    except ValueError as error:
        raise ValueError(f"{error}: give each engine its own name (uci:PATH:name=NAME)") from None
    return named


def _unnamed(spec: AnchorSpec) -> bool:
    return spec.kind == "uci" and spec.engine is not None and not spec.engine.name


# --------------------------------------------------------------------------------------------
# Ratings


@dataclasses.dataclass(frozen=True)
class AnchorRating:
    value: float | None
    """None: unrated (the anchor still gets its own score and Elo difference)."""
    source: str


def skill_level_elo(level: float) -> float:
    """Stockfish 15/15.1's nominal UCI_Elo of a skill level: 1346.6 + 143.4 * level^0.806."""
    if not 0 <= level < 20:
        raise ValueError(f"skill level {level} has no nominal Elo (0 <= level < 20)")
    return 1346.6 + 143.4 * level**0.806


def anchor_rating(
    spec: AnchorSpec, engine_name: str = "", *, random_rating: float = 0.0, overrides: dict[str, float] | None = None
) -> AnchorRating:
    """The fixed rating of an anchor and where it comes from (see the module docstring)."""
    for name in (spec.text, spec.given):
        if overrides and name and name in overrides:
            return AnchorRating(overrides[name], "given in anchor_ratings")
    if spec.engine is not None:
        if spec.engine.elo is not None:
            return AnchorRating(spec.engine.elo, f"given in {spec.engine.source}")
        return AnchorRating(None, "unrated: give it elo (in the engines file, or uci:...:elo=R) or an anchor_ratings entry")
    if spec.kind == "random":
        return AnchorRating(random_rating, "convention (random_rating), not a measured rating")
    if spec.kind == "sf-elo":
        return AnchorRating(float(spec.value), "UCI_Elo, Stockfish's CCRL-anchored calibration")  # type: ignore[arg-type]
    if spec.kind == "sf-skill":
        if spec.value == 20:
            return AnchorRating(None, "full strength: no nominal rating (give one in anchor_ratings)")
        if re.search(r"Stockfish 15(\.1)?\b", engine_name):
            return AnchorRating(
                round(skill_level_elo(spec.value), 1),  # type: ignore[arg-type]
                "nominal: Stockfish 15.1's UCI_Elo for this level, 1346.6 + 143.4 * level^0.806 (CCRL-anchored)",
            )
        return AnchorRating(None, f"no known skill calibration for {engine_name or 'this engine'} (give one in anchor_ratings)")
    return AnchorRating(None, "no published rating; give one in anchor_ratings")


def parse_ratings(entries: list[str]) -> dict[str, float]:
    """``["sf-nodes:50=1800", ...]`` -> {"sf-nodes:50": 1800.0}; `ValueError` names a bad entry."""
    ratings = {}
    for entry in entries:
        name, sep, value = entry.rpartition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            ratings[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"anchor_ratings entry {entry!r}: expected ANCHOR=RATING, e.g. sf-nodes:50=1800") from None
    return ratings


# --------------------------------------------------------------------------------------------
# Players in a game


class Mover(Protocol):
    """Chooses moves in games; the board carries the game's move stack (for repetitions)."""

    def new_game(self, game_id: object, seed: int) -> None:
        """Called before each game: reset per-game state and seed any randomness."""
        ...

    def move(self, board: chess.Board) -> chess.Move:
        """One legal move in `board` (which has at least one)."""
        ...

    def close(self) -> None: ...


class RandomMover:
    """A uniformly random legal move, reproducible per game seed."""

    def __init__(self) -> None:
        self._rng = random.Random(0)

    def new_game(self, game_id: object, seed: int) -> None:
        self._rng = random.Random(seed)

    def move(self, board: chess.Board) -> chess.Move:
        return self._rng.choice(list(board.legal_moves))

    def close(self) -> None:
        pass


class EngineMover:
    """An engine anchor in its own UCI process (python-chess's client), configured per `AnchorSpec`:
    Stockfish at ``engine.path`` for ``sf-*`` anchors, the anchor's own engine for UCI anchors.

    Threads 1 and Hash 16 are set where the engine has them (clamped to its range); the anchor's
    own options (Skill Level, UCI_Elo, ``option.NAME``) must be advertised, else
    `EngineUnsupported` at start-up. ``ucinewgame`` is sent at each new game. Every move has a
    deadline (`timeout_s` beyond the limit: python-chess's ``play`` has none for node and depth
    limits). A crashed engine, a hang past the deadline, or an answer that is not a legal move
    (``bestmove (none)`` or ``0000`` with legal moves, garbage, an illegal move) is a fault: the
    process is replaced after a backoff with jitter and the move asked again, within the same
    budgets as the reward pool (`RetryPolicy`); past them `EngineError` names the anchor, the
    engine, the position and the last fault (never a silent fallback move).
    """

    def __init__(
        self, spec: AnchorSpec, path: str | None = None, timeout_s: float | None = None, retry: RetryPolicy | None = None
    ):
        if not spec.is_engine:
            raise ValueError(f"{spec.text!r} is not an engine anchor")
        self.spec = spec
        if spec.engine is not None:
            self.command = list(spec.engine.command)
            self.timeout_s = spec.engine.timeout_s if timeout_s is None else timeout_s
            self.retry = retry or spec.engine.retry
        else:
            self.command = [str(find_stockfish(path))]
            self.timeout_s = 60.0 if timeout_s is None else timeout_s
            self.retry = retry or RetryPolicy()
        self.path = self.command[0]
        self.engine_name = ""
        """The engine's ``id name`` once started."""
        self._jitter = random.Random()  # retry delays only
        self._engine: chess.engine.SimpleEngine | None = None
        self._game: object = None

    @property
    def label(self) -> str:
        engine = f"{self.engine_name} ({self.path})" if self.engine_name else self.path
        return f"anchor {self.spec.text!r} ({engine})"

    def _start(self) -> chess.engine.SimpleEngine:
        last_error: BaseException | None = None
        handshake_s = min(30.0, self.timeout_s)
        for attempt in range(self.retry.startup_attempts):
            if attempt:
                time.sleep(self.retry.delay(attempt - 1, self._jitter))
            try:
                engine = chess.engine.SimpleEngine.popen_uci(self.command, timeout=handshake_s)
            except (TimeoutError, asyncio.TimeoutError):
                last_error = EngineTimeout(
                    f"no `uciok` within {handshake_s:g} s of `uci` (is it a UCI engine? xboard engines such as "
                    "fairymax are not supported)"
                )
                continue
            except (chess.engine.EngineError, OSError) as error:
                last_error = error
                continue
            self.engine_name = engine.id.get("name", "")
            try:
                advertised = {
                    name.lower(): UciOption(o.name, o.type, None, o.min, o.max, tuple(o.var or ()))
                    for name, o in engine.options.items()
                }
                settings = choose_settings(
                    advertised, self.label, threads=1, hash_mb=ENGINE_HASH_MB, options=self.spec.required_options()
                )
                engine.configure(settings)
                return engine
            except EngineUnsupported:
                engine.close()
                raise  # a missing option stays missing: no retries
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError) as error:
                last_error = error
                try:
                    engine.close()
                except Exception:  # noqa: BLE001 - already broken; only released here
                    pass
        raise EngineError(f"cannot start {self.label} in {self.retry.startup_attempts} attempts: {last_error}")

    def new_game(self, game_id: object, seed: int) -> None:
        self._game = game_id

    def _play(self, engine: chess.engine.SimpleEngine, board: chess.Board) -> chess.Move:
        """One move from `engine` within the deadline; `EngineError` for any answer that is not
        a legal move of `board`."""
        limit = self.spec.limit()
        timeout = self.timeout_s + (limit.time or 0.0)
        protocol = engine.protocol
        try:
            future = asyncio.run_coroutine_threadsafe(
                asyncio.wait_for(protocol.play(board, limit, game=self._game), timeout), protocol.loop
            )
        except RuntimeError as error:  # python-chess closes the client's event loop when the process dies
            raise EngineError(f"the engine process has ended ({error})") from None
        try:
            result = future.result()
        except (TimeoutError, asyncio.TimeoutError):
            raise EngineTimeout(f"no `bestmove` within {timeout:g} s ({self._limit_text()} plus engine.timeout_s)") from None
        if not result.move:  # None for `bestmove (none)`, the null move for `0000`
            text = "(none)" if result.move is None else result.move.uci()
            raise EngineError(f"answered `bestmove {text}` in a position with legal moves")
        if not board.is_legal(result.move):  # python-chess already refuses these; kept as the contract
            raise EngineError(f"answered `bestmove {result.move.uci()}`, an illegal move")
        return result.move

    def _limit_text(self) -> str:
        if self.spec.engine is not None:
            return self.spec.engine.limit_text()
        limit = self.spec.limit()
        return f"nodes={limit.nodes}" if limit.nodes is not None else f"depth={limit.depth}"

    def move(self, board: chess.Board) -> chess.Move:
        failures = 0
        while True:
            if self._engine is None:
                self._engine = self._start()
            try:
                return self._play(self._engine, board)
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, EngineError) as error:
                failures += 1
                logger.warning("%s failed in %s (%s); replacing it", self.label, board.fen(), error)
                self._kill()
                if failures > self.retry.retries_per_position:
                    raise EngineError(
                        f"{self.label} failed {failures} times in {board.fen()!r} ({self._limit_text()}, "
                        f"retries_per_position={self.retry.retries_per_position}); last error: {error}"
                    ) from None
                time.sleep(self.retry.delay(failures - 1, self._jitter))

    def _kill(self) -> None:
        if self._engine is not None:
            try:
                self._engine.close()
            except Exception:  # noqa: BLE001 - the process is already broken; we only release it
                pass
            self._engine = None

    def close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.quit()
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError):
                pass
            self._kill()


def position_key(board: chess.Board) -> tuple:
    """What makes two positions the same for repetition: pieces, side to move, castling rights and
    a legal en-passant capture (as python-chess's own repetition check)."""
    return (
        board.pawns,
        board.knights,
        board.bishops,
        board.rooks,
        board.queens,
        board.kings,
        board.occupied_co[chess.WHITE],
        board.occupied_co[chess.BLACK],
        board.turn,
        board.clean_castling_rights(),
        board.ep_square if board.has_legal_en_passant() else None,
    )


def position_counts(board: chess.Board) -> dict[tuple, int]:
    """How often each position since the last capture or pawn move has stood on the board."""
    counts: dict[tuple, int] = {}
    history = board.copy()
    counts[position_key(history)] = 1
    while history.move_stack:
        move = history.pop()
        key = position_key(history)
        counts[key] = counts.get(key, 0) + 1
        if history.is_zeroing(move):  # nothing before an irreversible move can recur
            break
    return counts


def material_balance(board: chess.Board) -> int:
    """Material of the side to move minus the opponent's, in pawns (P1 N3 B3 R5 Q9)."""
    balance = 0
    for piece_type, value in PIECE_VALUES.items():
        balance += value * (len(board.pieces(piece_type, board.turn)) - len(board.pieces(piece_type, not board.turn)))
    return balance


class PolicyMover:
    """An `ActionPolicy` as a game player.

    Argmax over legal moves at temperature 0, else a sample from `log_probs` at that
    temperature (seeded per game). Repetition: our policy has no value head, so "winning" is
    approximated by material: the side to move is ahead by at least `winning_material` pawns
    (3 = a minor piece). When winning, the choice excludes moves that allow a threefold
    repetition claim (`repetition_moves`): moves after which the position stands for the third
    time, and moves after which the opponent has a reply that makes some position stand for the
    third time. The highest-probability remaining move is played (or sampled among the rest).
    If every move allows a claim, only the direct repeats are excluded; if every move repeats,
    none is. searchless_chess does the same with its value estimate.

    With an enabled `search` (`chessgrpo.search.SearchSettings`) the move is the search's
    instead, searched from the board with its full move stack: the search scores a repeated
    position as a draw, so the material rule above is not applied on that path. A search is
    deterministic, so `temperature` must be 0 (`ValueError` otherwise), and it needs a policy with
    a value head (`ValueError` from `search.NetworkEvaluator` otherwise).
    """

    def __init__(
        self,
        policy: Any,
        *,
        temperature: float = 0.0,
        avoid_repetition: bool = True,
        winning_material: int = 3,
        search: "SearchSettings | None" = None,
    ):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        self.policy = policy.eval()
        self.temperature = float(temperature)
        self.avoid_repetition = avoid_repetition
        self.winning_material = winning_material
        self.searcher = build_searcher(self.policy, search, self.temperature)
        self._generator: "torch.Generator | None" = None
        self.last_probability: float | None = None
        """Probability (at temperature 1, legal moves) of the last chosen move, for `info` lines;
        None for a searched move (the search's numbers are in `last_search`)."""
        self.last_search: "SearchResult | None" = None
        """The last search's result (value, nodes, principal variation); None without search."""

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "cpu", **kwargs: Any) -> "PolicyMover":
        """Load a checkpoint or run directory; a `ValueError` of the player names the checkpoint."""
        from chessgrpo.models.policy import load_policy

        policy = load_policy(path, device=device)
        try:
            return cls(policy, **kwargs)
        except ValueError as error:
            raise ValueError(f"checkpoint {path}: {error}") from None

    def new_game(self, game_id: object, seed: int) -> None:
        import torch

        self._generator = torch.Generator().manual_seed(seed) if self.temperature > 0 else None

    @staticmethod
    def repetition_moves(board: chess.Board) -> tuple[list[chess.Move], list[chess.Move]]:
        """(moves that make a position stand for the third time, moves that let the opponent do so).

        Only positions since the last capture or pawn move can recur, and only those already seen
        twice can become a threefold, so the two-ply look-ahead runs only when one exists.
        """
        counts = position_counts(board)
        twice = {key for key, count in counts.items() if count >= 2}
        if not twice:
            return [], []
        repeats, allows = [], []
        for move in list(board.legal_moves):
            board.push(move)
            try:
                if position_key(board) in twice:
                    repeats.append(move)
                    continue
                for reply in list(board.legal_moves):
                    board.push(reply)
                    hit = position_key(board) in twice
                    board.pop()
                    if hit:
                        allows.append(move)
                        break
            finally:
                board.pop()
        return repeats, allows

    def move(self, board: chess.Board) -> chess.Move:
        if self.searcher is not None:
            return self._searched_move(board)
        import torch

        from chessgrpo.board import ACTIONS, move_to_action
        from chessgrpo.models.policy import log_probs, sample_actions

        with torch.no_grad():
            tokens, masks = self.policy.inputs([board])
            logits = self.policy(tokens).float()
            full_mask = masks.clone()
            if self.avoid_repetition and material_balance(board) >= self.winning_material:
                repeats, allows = self.repetition_moves(board)
                legal = int(masks[0].sum().item())
                for excluded in (repeats + allows, repeats):
                    if excluded and len(excluded) < legal:
                        for move in excluded:
                            masks[0, move_to_action(move)] = False
                        break
            if self.temperature == 0.0:
                action = int(logits.masked_fill(~masks, float("-inf")).argmax(dim=-1).item())
            else:
                action = int(sample_actions(logits, masks, temperature=self.temperature, generator=self._generator).item())
            self.last_probability = float(log_probs(logits, full_mask)[0, action].exp().item())
        move = chess.Move.from_uci(ACTIONS[action])
        if not board.is_legal(move):
            raise RuntimeError(f"policy chose illegal move {move.uci()} in {board.fen()!r}")
        return move

    def _searched_move(self, board: chess.Board) -> chess.Move:
        """The search's move in `board` (searched with the game's move stack, so repetitions count)."""
        result = self.searcher.search(board)  # type: ignore[union-attr]
        self.last_search = result
        self.last_probability = None  # the move is the search's, not a draw from the policy
        if not board.is_legal(result.move):
            raise RuntimeError(f"search chose illegal move {result.move.uci()} in {board.fen()!r}")
        return result.move

    def close(self) -> None:
        """Release the search's tablebase (a no-op without search)."""
        if self.searcher is not None:
            self.searcher.close()


def make_mover(
    spec: AnchorSpec, *, engine_path: str | None = None, device: str = "cpu", temperature: float = 0.0, **policy_options: Any
) -> Mover:
    """The game player of an anchor (checkpoint anchors play like the evaluated policy)."""
    if spec.kind == "random":
        return RandomMover()
    if spec.is_engine:
        return EngineMover(spec, engine_path if spec.is_stockfish else None)
    return PolicyMover.from_checkpoint(spec.path or spec.text, device=device, temperature=temperature, **policy_options)
