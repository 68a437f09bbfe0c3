"""Opponents for rating games ("anchors"): what an anchor is (`AnchorSpec`, `EngineSpec`), its name,
its rating, and how it is parsed.

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

Under a clock (``eval games --tc``, `AnchorSpec.clock`) an engine plays on it, keeping only a limit
given for it (``sf-nodes:N``, ``uci:...:nodes=N``, an engines file's limit); `AnchorSpec.asked` is
what it is asked, which `play.anchor_runs` holds against what it ran.

``sf-*`` anchors need Stockfish at ``engine.path``; ``uci:`` and engines-file anchors play
whatever engine they name. Their engines are checked before any game in
`chessgrpo.play.anchor_checks`, and the players that make their moves are in
`chessgrpo.play.movers`.

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
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import chess
import chess.engine

from chessgrpo.engine.locate import EngineNotFoundError, find_engine
from chessgrpo.engine.pool_workers import RetryPolicy
from chessgrpo.errors import InputError, quote

CALIBRATION_NOTE = (
    "Stockfish's UCI_Elo and Skill Level ratings are CCRL-anchored engine ratings (CCRL 40/4, Goldfish 1.13 = 2000, "
    "fitted at 60s+0.6s), not human FIDE or Lichess ratings; 'random' is rated by convention."
)

SKILL_LEVELS = range(0, 21)
DEFAULT_ANCHOR_NODES = 1000
ENGINE_HASH_MB = 16

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
    default_limit: bool = False
    """The limit is the anchor default (anchor_nodes / anchor_depth), not given for this engine: under
    a clock (`AnchorSpec.clock`) the engine then plays on the clock alone."""

    def __post_init__(self) -> None:
        limits = [v for v in (self.nodes, self.depth, self.movetime_ms) if v is not None]
        if len(limits) != 1:
            raise InputError(
                f"engine {self.name or self.command[0]!r}: give exactly one limit of nodes, depth, movetime"
            )
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in limits):
            raise InputError(
                f"engine {self.name or self.command[0]!r}: the limit must be a positive integer, got {limits[0]!r}"
            )

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
    clock: str | None = None
    """The time control it plays on (`play.game_clock`, e.g. "40/10+0.1"); None = per-move limits only.
    Under a clock an engine keeps only a limit given for it (sf-nodes:N, ``uci:...:nodes=N``, an
    engines file's limit); the default anchor_nodes / anchor_depth give way to the clock."""

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

    def asked(self) -> tuple[str, int | None]:
        """The per-move limit the engine is asked to keep: ("nodes" | "depth" | "movetime", value), or
        ("clock", None) on a clock without a limit of its own (see `clock`)."""
        if self.clock is not None and (
            self.engine.default_limit if self.engine is not None else self.kind != "sf-nodes"
        ):
            return "clock", None
        limit = self.limit()
        if limit.nodes is not None:
            return "nodes", limit.nodes
        if limit.depth is not None:
            return "depth", limit.depth
        return "movetime", round((limit.time or 0) * 1000)

    def asked_text(self) -> str:
        """What the engine was asked, e.g. "nodes=200", "depth=3", "movetime=50ms", "tc=40/10+0.1", "tc=40/10+0.1, nodes=200"."""
        kind, value = self.asked()
        limit = "" if kind == "clock" else (f"movetime={value}ms" if kind == "movetime" else f"{kind}={value}")
        return ", ".join(part for part in (f"tc={self.clock}" if self.clock else "", limit) if part)

    def describe(self, engine_name: str = "Stockfish") -> str:
        """A reproducible description: engine id name, options, limit (or the policy's path)."""
        clock = f"; tc={self.clock}" if self.clock else ""
        if self.kind == "random":
            return "uniform random legal mover" + clock
        if self.kind == "checkpoint":
            return f"policy {self.path}{clock}"
        bound = self.asked_text().replace(", ", "; ")
        if self.engine is not None:
            engine = self.engine
            options = engine.applied or tuple(
                (name, _uci_value(value)) for name, value in self.engine_options().items()
            )
            parts = [engine.id_name or "UCI engine", " ".join(engine.command), *(f"{n}={v}" for n, v in options), bound]
            return "; ".join(parts)
        options = "; ".join(f"{name}={_uci_value(value)}" for name, value in self.engine_options().items())
        return f"{engine_name}; {options}; {bound}"


def _uci_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _positive_int(text: Any, what: str) -> int:
    if isinstance(text, bool):
        raise InputError(f"{what} must be a positive integer, got {text!r}")
    try:
        number = int(str(text).strip())
    except ValueError:
        raise InputError(f"{what} must be a positive integer, got {quote(str(text))}") from None
    if number < 1:
        raise InputError(f"{what} must be a positive integer, got {number}")
    return number


def _check_name(name: str, where: str) -> str:
    name = str(name).strip()
    if not name or "," in name or "\n" in name or name == "random" or name.startswith(("sf-", "uci:")):
        raise InputError(
            f"{where}: engine name {quote(name)} is not usable: it must be non-empty, without commas or line breaks, "
            "and not random, sf-* or uci:*"
        )
    return name


def _option_pair(name: Any, value: Any, where: str) -> tuple[str, str]:
    name = str(name).strip()
    if not name or "\n" in name:
        raise InputError(f"{where}: bad option name {quote(name)}")
    if name.lower() in MANAGED_OPTIONS:
        raise InputError(f"{where}: option {name!r} is set by the game runner itself and cannot be given")
    text = _uci_value(value) if isinstance(value, bool) else str(value)
    if "\n" in text or "\r" in text:
        raise InputError(f"{where}: option {name!r} value {quote(text)} spans lines")
    return name, text


def _engine_limit(limit: Mapping[str, Any], nodes: int | None, depth: int | None, where: str) -> dict[str, Any]:
    """One of nodes/depth/movetime from `limit`, else the default (`depth` if set, else `nodes`;
    ``default_limit`` says which)."""
    given = {key: value for key, value in limit.items() if value is not None}
    unknown = sorted(set(given) - set(LIMIT_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown limit {unknown[0]!r}; use one of nodes, depth, movetime (milliseconds)")
    if len(given) > 1:
        raise InputError(f"{where}: give one limit, not {' and '.join(sorted(given))}")
    default = not given
    if default:
        given = {"depth": depth} if depth is not None else {"nodes": nodes}
    key, value = next(iter(given.items()))
    number = _positive_int(value, f"{where}: {key}")
    return {
        "nodes": number if key == "nodes" else None,
        "depth": number if key == "depth" else None,
        "movetime_ms": number if key == "movetime" else None,
        "default_limit": default,
    }


def parse_uci_anchor(
    text: str,
    *,
    nodes: int | None = DEFAULT_ANCHOR_NODES,
    depth: int | None = None,
    timeout_s: float = 60.0,
    retry: RetryPolicy | None = None,
) -> AnchorSpec:
    """Parse ``uci:PATH[:KEY=VALUE]...`` (`UCI_GRAMMAR`); the binary must exist."""
    body = text[len("uci:") :]
    parts = body.split(":")
    split = next((i for i, part in enumerate(parts) if i > 0 and _SETTING_SHAPE.match(part)), len(parts))
    command, settings = ":".join(parts[:split]), parts[split:]
    where = f"anchor {quote(text)}"
    if not command.strip():
        raise InputError(f"{where}: no engine path; expected {UCI_GRAMMAR}")
    limit: dict[str, str] = {}
    options: list[tuple[str, str]] = []
    name, elo = "", None
    for setting in settings:
        match = _UCI_SETTING.match(setting)
        if match is None:
            raise InputError(
                f"{where}: {quote(setting)} is not KEY=VALUE with KEY one of nodes, depth, movetime, "
                f"option.NAME, name, elo; expected {UCI_GRAMMAR}"
            )
        key, value = match.groups()
        if key in LIMIT_KEYS:
            limit[key] = value
        elif key == "name":
            name = _check_name(value, where)
        elif key == "elo":
            try:
                elo = float(value)
            except ValueError:
                raise InputError(f"{where}: elo must be a number, got {quote(value)}") from None
        else:
            options.append(_option_pair(key[len("option.") :], value, where))
    try:
        binary = find_engine(command)
    except EngineNotFoundError as error:
        raise EngineNotFoundError(f"{where}: {error}") from None
    engine = EngineSpec(
        command=(str(binary),),
        name=name,
        options=tuple(options),
        elo=elo,
        source="the anchor",
        timeout_s=timeout_s,
        retry=retry or RetryPolicy(),
        **_engine_limit(limit, nodes, depth, where),
    )
    return AnchorSpec(text=name or text, kind="uci", engine=engine, given=text)


def load_engines(
    path: str | Path,
    *,
    nodes: int | None = DEFAULT_ANCHOR_NODES,
    depth: int | None = None,
    timeout_s: float = 60.0,
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
        raise InputError(f"engines file {str(path)!r} is not valid YAML: {error}") from None
    entries = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(data, dict) or set(data) != {"engines"} or not isinstance(entries, list) or not entries:
        raise InputError(
            f"engines file {str(path)!r}: expected a mapping with one key, engines: a non-empty list of engines"
        )
    engines: dict[str, EngineSpec] = {}
    for index, entry in enumerate(entries):
        where = f"engines file {str(path)!r}, engine {index + 1}"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping with keys {', '.join(ENGINE_FILE_KEYS)}")
        unknown = sorted(set(entry) - set(ENGINE_FILE_KEYS))
        if unknown:
            raise InputError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(ENGINE_FILE_KEYS)}")
        for key in ("name", "command"):
            if key not in entry:
                raise InputError(f"{where}: {key} is required")
        name = _check_name(entry["name"], where)
        where = f"engines file {str(path)!r}, engine {name!r}"
        if name in engines:
            raise InputError(f"{where}: the name is used twice")
        command = entry["command"]
        command = [command] if isinstance(command, str) else command
        args = entry.get("args") or []
        if not isinstance(command, list) or not command or not isinstance(args, list):
            raise InputError(f"{where}: command is a string or a list of strings, args a list")
        try:
            binary = find_engine(str(command[0]), base=path.parent)
        except EngineNotFoundError as error:
            raise EngineNotFoundError(f"{where}: {error}") from None
        options = entry.get("options") or {}
        limit = entry.get("limit") or {}
        if not isinstance(options, dict) or not isinstance(limit, dict):
            raise InputError(f"{where}: options and limit are mappings (e.g. limit: {{depth: 4}})")
        elo = entry.get("elo")
        if elo is not None and (isinstance(elo, bool) or not isinstance(elo, (int, float))):
            raise InputError(f"{where}: elo must be a number, got {elo!r}")
        timeout = entry.get("timeout_s", timeout_s)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InputError(f"{where}: timeout_s must be a positive number of seconds, got {timeout!r}")
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
        raise InputError(f"anchor depth must be >= 1, got {depth!r}")
    if depth is None and (nodes is None or nodes < 1):
        raise InputError(f"anchor nodes must be >= 1, got {nodes!r}")
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
            raise InputError(f"anchor {text!r}: Skill Level must be 0..20, got {value}")
        if kind == "sf-nodes" and value < 1:
            raise InputError(f"anchor {text!r}: the node count must be >= 1")
        if kind == "sf-nodes":
            return AnchorSpec(text=text, kind=kind, value=value)
        # UCI_Elo's range depends on the engine; `check_anchor` checks it against the running one.
        return AnchorSpec(text=text, kind=kind, value=value, nodes=None if depth is not None else nodes, depth=depth)
    known = (
        f"; engines from the engines file: {', '.join(engines)}"
        if engines
        else "; other engines: uci:PATH or --engines FILE"
    )
    if text.startswith("sf-") or ":" in text and not Path(text).exists():
        raise InputError(
            f"unknown anchor {text!r}: use random, sf-skill:N (0..20), sf-elo:N, sf-nodes:N, {UCI_GRAMMAR}, "
            f"an engine's name from an engines file, or a checkpoint directory{known}"
        )
    from chessgrpo.models.policy import resolve_checkpoint  # lazy: torch only for checkpoint anchors

    try:
        directory = resolve_checkpoint(text)
    except FileNotFoundError as error:
        raise InputError(
            f"unknown anchor {text!r}: not random, sf-skill:N, sf-elo:N, sf-nodes:N or uci:PATH, not an engine's "
            f"name{known}, and not a checkpoint ({error})"
        ) from None
    return AnchorSpec(text=text, kind="checkpoint", path=str(directory))


def parse_anchors(texts: str | list[str], **limits: Any) -> list[AnchorSpec]:
    """Anchors from a comma-separated string or a list; duplicates are an error.

    `limits` go to `parse_anchor` (nodes, depth, engines, timeout_s, retry)."""
    items = [t for t in (texts.split(",") if isinstance(texts, str) else texts) if t.strip()]
    if not items:
        raise InputError("no anchors given: e.g. --anchors random,sf-skill:0")
    specs = [parse_anchor(item, **limits) for item in items]
    check_unique(specs)
    return specs


def check_unique(specs: list[AnchorSpec]) -> None:
    """`ValueError` when two anchors share a name."""
    names = [spec.text for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InputError(f"anchor {duplicates[0]!r} is listed twice")


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
        return AnchorRating(
            None, "unrated: give it elo (in the engines file, or uci:...:elo=R) or an anchor_ratings entry"
        )
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
        return AnchorRating(
            None, f"no known skill calibration for {engine_name or 'this engine'} (give one in anchor_ratings)"
        )
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
            raise InputError(f"anchor_ratings entry {entry!r}: expected ANCHOR=RATING, e.g. sf-nodes:50=1800") from None
    return ratings
