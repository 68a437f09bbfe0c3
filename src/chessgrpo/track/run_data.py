"""A run directory read back for diagnosis and reports: config, metric rows, evaluation files.

`load_run` reads whatever is there, also while the run is still writing: ``config.yaml`` (plain
data, not re-validated, so a run of an older or newer version still reads), ``metrics.jsonl``
(a torn last line is skipped) and the evaluation files under ``eval/``:

- ``eval/step_NNNNNN_<evaluation>.json``: written by ``chessgrpo train`` at each held-out
  evaluation, with per-item records (so evaluation points can be compared *paired*);
- any other ``eval/*.json`` written by ``chessgrpo eval offline|puzzles ... output=...`` (kept as
  standalone evaluations for the report's tables).

  Which evaluations these are, how a file is recognised and which metrics it holds is
  `eval.registry` (the evaluations with a `summary_marker`: offline and puzzles);
- game evaluations: any JSON under ``eval/`` (or ``games*.json`` in the run directory) with the
  structure ``chessgrpo eval games ... output=FILE`` (or ``--json``) writes: per-anchor W/D/L,
  score and Elo difference with intervals, and the maximum-likelihood Elo (`GamesEvaluation`).
  Each is placed at the training step of the checkpoint that played (`games_step`).

Run metadata (`RunData.info`): a ``run_info.json`` (or ``meta.json``, ``environment.json``) in the
run directory, when the training spine writes one, else whatever config.yaml records; see
`read_run_info`.

Held-out metric names follow the metrics rows (``eval/<name>``): ``esl``, ``top1``, ``blunder_rate``
(offline), ``puzzle_first_move_accuracy``, ``puzzle_solve_rate`` (puzzles), ... as the evaluations'
`held_out` entries in `eval.registry` name them (`eval.registry.held_out_metrics`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from chessgrpo.eval.registry import held_out_metrics, recognise_summary, step_file_pattern
from chessgrpo.files import read_text
from chessgrpo.train.metrics import EVENTS_FILE, METRICS_FILE, read_metrics

logger = logging.getLogger(__name__)

"""Health events of the training loop (skips, rollbacks, early stops, divergence), one JSON object a line."""
TRAIN_KEYS = ("loss/total", "loss/train", "reward/mean")
"""A metrics row holding any of these is a training row (the rest are evaluation-only rows)."""

_CHECKPOINT_STEP = re.compile(r"^step_(\d+)$")
_FILE_STEP = re.compile(r"step_?(\d+)")
INFO_FILES = ("run_info.json", "meta.json", "environment.json")
"""Run metadata files looked for in a run directory (the first that exists and is a JSON object is read)."""


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One held-out metric at one evaluation: value with its interval (low/high NaN when none)."""

    value: float
    low: float = math.nan
    high: float = math.nan
    n: int = 0

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


@dataclasses.dataclass
class EvalPoint:
    """The held-out evaluation of a run at one step."""

    step: int
    metrics: dict[str, HeldOut]
    """Held-out metric name (`eval.registry.held_out_metrics`) -> value and interval."""
    records: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """Evaluation name ("offline", "puzzles", ...) -> per-item records from eval/step_NNNNNN_*.json (empty when absent)."""


@dataclasses.dataclass
class StandaloneEval:
    """An `eval offline|puzzles ... output=FILE` result kept in the run's eval/ folder."""

    path: Path
    kind: str
    player: dict[str, HeldOut]
    baselines: dict[str, dict[str, HeldOut]]


@dataclasses.dataclass(frozen=True)
class EloValue:
    """An Elo estimate as `eval games` writes it: value, interval, games, and "lower"/"upper" for a one-sided bound."""

    value: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0
    bound: str | None = None

    def text(self, signed: bool = True) -> str:
        if self.value is None:
            return f"n/a (n={self.n})"
        sign = "+" if signed else ""
        if self.bound == "lower":
            return f">= {self.value:{sign}.0f} (every game won)"
        if self.bound == "upper":
            return f"<= {self.value:{sign}.0f} (every game lost)"
        if self.low is None or self.high is None:
            return f"{self.value:{sign}.0f}"
        return f"{self.value:{sign}.0f} [{self.low:{sign}.0f}, {self.high:{sign}.0f}]"


@dataclasses.dataclass(frozen=True)
class AnchorResult:
    """The games against one anchor."""

    anchor: str
    settings: str
    rating: float | None
    rating_source: str
    wins: int
    draws: int
    losses: int
    score: HeldOut
    """Points per game with its Wilson interval (n = games)."""
    elo: EloValue | None
    """Elo difference player - anchor implied by the score."""
    pentanomial: tuple[int, ...] = ()
    terminations: dict[str, int] = dataclasses.field(default_factory=dict)
    mean_plies: float | None = None


@dataclasses.dataclass
class GamesEvaluation:
    """One `chessgrpo eval games` summary (JSON) found in the run directory."""

    path: Path
    step: int | None
    """Training step of the checkpoint that played; None when it cannot be told (see `games_step`)."""
    step_source: str
    """How the step was found (a JSON "step" field, the checkpoint path, init_checkpoint, the file name) or why not."""
    checkpoint: str
    player: str
    anchors: list[AnchorResult]
    elo: EloValue | None
    """Maximum-likelihood Elo over the rated anchors (None: no rated anchor)."""
    games_played: int = 0
    seconds: float | None = None
    games_per_minute: float | None = None
    calibration: str = ""
    sprt: dict[str, Any] | None = None
    pgn: Path | None = None
    """The games' PGN file when it exists on this machine (the summary's "pgn" field, else <file>.pgn beside it)."""


@dataclasses.dataclass
class RunData:
    """Everything `diagnose` and `report` read from one run directory."""

    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    evals: list[EvalPoint]
    standalone: list[StandaloneEval] = dataclasses.field(default_factory=list)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The training loop's health events (events.jsonl): skipped updates, rollbacks, early stops, divergence."""
    label: str | None = None
    """Display name (reports comparing runs of the same name set it); None = the directory name."""
    games: list[GamesEvaluation] = dataclasses.field(default_factory=list)
    """Game evaluations (`eval games` summaries), by step (unknown steps first, then by file time)."""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Run metadata written by the training spine (run_info.json), empty when none; see `read_run_info`."""
    info_path: Path | None = None

    @property
    def name(self) -> str:
        return self.label or self.path.name

    @property
    def kind(self) -> str:
        """ "grpo", "pretrain" or "unknown", from the metrics (or the config when no rows yet)."""
        keys = set().union(*self.rows) if self.rows else set()
        if "reward/mean" in keys or "loss/policy" in keys or "grpo" in self.config:
            return "grpo"
        if "loss/train" in keys or "objective" in self.config:
            return "pretrain"
        return "unknown"

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if any(key in row for key in TRAIN_KEYS)]

    def has(self, key: str) -> bool:
        return any(key in row for row in self.rows)

    def series(self, key: str, rows: list[dict[str, Any]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of `key` over the rows that hold it (float arrays; NaN kept)."""
        rows = self.rows if rows is None else rows
        pairs = [(row["step"], row[key]) for row in rows if key in row and isinstance(row[key], (int, float))]
        if not pairs:
            return np.zeros(0), np.zeros(0)
        steps, values = zip(*pairs)
        return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)

    def setting(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key (``grpo.kl_schedule``), or `default` when absent."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory (finished or still running). Raises FileNotFoundError when it holds no run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {str(path)!r} does not exist")
    config_path, metrics_path = path / "config.yaml", path / METRICS_FILE
    if not config_path.is_file() and not metrics_path.is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a run directory: it has neither config.yaml nor {METRICS_FILE}")
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            loaded = yaml.safe_load(read_text(config_path))
        except yaml.YAMLError as error:
            raise ValueError(f"{config_path} is not valid YAML: {error}") from None
        config = loaded if isinstance(loaded, dict) else {}
    rows = read_metrics(metrics_path)
    evals, standalone = _read_evaluations(path / "eval", rows)
    events = [event for event in read_metrics_like(path / EVENTS_FILE) if isinstance(event.get("event"), str)]
    info, info_path = read_run_info(path)
    run = RunData(
        path=path,
        config=config,
        rows=rows,
        evals=evals,
        standalone=standalone,
        events=events,
        info=info,
        info_path=info_path,
    )
    run.games = read_games(run)
    return run


def read_run_info(run_dir: Path) -> tuple[dict[str, Any], Path | None]:
    """The run's metadata file (first of `INFO_FILES` that is a JSON object) and its path; ({}, None) when none.

    Keys the report reads when present: ``git_commit`` (or ``git: {commit, dirty}``), ``git_dirty``,
    ``versions`` ({package: version}), ``python``, ``hardware`` ({cpu_count, cpu_model, gpu, ...}),
    ``hostname``, ``started`` (Unix time or ISO text), ``command``.
    """
    for name in INFO_FILES:
        candidate = run_dir / name
        if candidate.is_file():
            payload = _read_json(candidate)
            if payload is not None:
                return payload, candidate
    return {}, None


def is_games_summary(payload: dict[str, Any]) -> bool:
    """Whether a JSON object is an `eval games` summary (a list of per-anchor rows with W/D/L and a score)."""
    anchors = payload.get("anchors")
    return (
        isinstance(anchors, list)
        and bool(anchors)
        and all(isinstance(row, dict) and {"anchor", "wins", "draws", "losses", "score"} <= set(row) for row in anchors)
    )


def _elo_value(entry: Any) -> EloValue | None:
    if not isinstance(entry, dict):
        return None

    def number(key: str) -> float | None:
        value = entry.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    bound = entry.get("bound") if entry.get("bound") in ("lower", "upper") else None
    return EloValue(number("value"), number("low"), number("high"), int(entry.get("n") or 0), bound)


def _resolve_checkpoint_dir(path: Path) -> Path | None:
    """The checkpoint a path names (a checkpoint, or a run directory's newest intact one), without loading a model."""
    from chessgrpo.files import resolve_model_directory

    try:
        found = resolve_model_directory(
            path, lambda d: (d / "model.safetensors").is_file() and (d / "model_config.json").is_file()
        )
    except Exception:  # a corrupt checkpoint: not the one that played
        return None
    return Path(found).resolve() if found is not None else None


def games_step(run: RunData, payload: dict[str, Any], path: Path) -> tuple[int | None, str]:
    """The training step a games summary belongs to, and how it was found.

    In order: an integer "step" field; the checkpoint being the run's ``init_checkpoint`` (step 0,
    the policy before training); the checkpoint path ``<this run>/checkpoints/step_NNNNNN``; a
    ``step_NNNNNN`` or ``stepNNN`` in the file name. Else None (drawn only as the latest evaluation).
    """
    if isinstance(payload.get("step"), int) and not isinstance(payload.get("step"), bool):
        return payload["step"], "the summary's step field"
    checkpoint = payload.get("checkpoint")
    if isinstance(checkpoint, str) and checkpoint:
        played = Path(checkpoint)
        init = run.setting("init_checkpoint")
        if isinstance(init, str) and init and played.exists():
            resolved = _resolve_checkpoint_dir(Path(init))
            if resolved is not None and resolved == played.resolve():
                return 0, f"the checkpoint is the run's init_checkpoint ({init})"
        match = _CHECKPOINT_STEP.match(played.name)
        if match and played.parent.name == "checkpoints" and played.parent.parent.name == run.path.name:
            return int(match.group(1)), f"checkpoint {played.parent.parent.name}/checkpoints/{played.name}"
    match = _FILE_STEP.search(path.stem)
    if match:
        return int(match.group(1)), f"the file name {path.name}"
    return None, "unknown: no step field, the checkpoint is not this run's step_NNNNNN or its init_checkpoint"


def read_games(run: RunData) -> list[GamesEvaluation]:
    """The run's game evaluations: `eval games` summaries under eval/ (any depth) and games*.json beside config.yaml."""
    candidates = sorted((run.path / "eval").rglob("*.json")) if (run.path / "eval").is_dir() else []
    candidates += sorted(run.path.glob("games*.json"))
    found: list[tuple[float, GamesEvaluation]] = []
    step_file = step_file_pattern()
    for path in candidates:
        if step_file.match(path.name):
            continue
        payload = _read_json(path)
        if payload is None or not is_games_summary(payload):
            continue
        rows = []
        for row in payload["anchors"]:
            score = _held_out(row.get("score")) or HeldOut(math.nan)
            rating = row.get("rating")
            rows.append(
                AnchorResult(
                    anchor=str(row["anchor"]),
                    settings=str(row.get("settings") or ""),
                    rating=float(rating) if isinstance(rating, (int, float)) else None,
                    rating_source=str(row.get("rating_source") or ""),
                    wins=int(row["wins"]),
                    draws=int(row["draws"]),
                    losses=int(row["losses"]),
                    score=HeldOut(
                        score.value,
                        score.low,
                        score.high,
                        score.n or int(row["wins"]) + int(row["draws"]) + int(row["losses"]),
                    ),
                    elo=_elo_value(row.get("elo_difference")),
                    pentanomial=tuple(int(c) for c in row.get("pentanomial") or ()),
                    terminations={str(k): int(v) for k, v in (row.get("terminations") or {}).items()},
                    mean_plies=row.get("mean_plies") if isinstance(row.get("mean_plies"), (int, float)) else None,
                )
            )
        step, source = games_step(run, payload, path)

        def number(key: str) -> float | None:
            value = payload.get(key)  # noqa: B023 (used within this iteration)
            return float(value) if isinstance(value, (int, float)) else None

        evaluation = GamesEvaluation(
            path=path,
            step=step,
            step_source=source,
            checkpoint=str(payload.get("checkpoint") or ""),
            player=str(payload.get("player") or payload.get("checkpoint") or ""),
            anchors=rows,
            elo=_elo_value(payload.get("elo")),
            games_played=int(payload.get("games_played") or sum(r.wins + r.draws + r.losses for r in rows)),
            seconds=number("seconds"),
            games_per_minute=number("games_per_minute"),
            calibration=str(payload.get("calibration") or ""),
            sprt=payload.get("sprt") if isinstance(payload.get("sprt"), dict) else None,
            pgn=_games_pgn(run, payload, path),
        )
        found.append((path.stat().st_mtime, evaluation))
    found.sort(key=lambda item: (item[1].step is not None, item[1].step or 0, item[0]))
    return [evaluation for _, evaluation in found]


def resolve_run_path(run: RunData, text: str) -> Path | None:
    """An existing path a run's config or evaluation wrote (`init_checkpoint`, a PGN): as written when absolute;
    else relative to the working directory, then to each folder above the run directory (a config written
    from the repository root, read from anywhere). None when it exists nowhere."""
    path = Path(text)
    if path.is_absolute():
        return path if path.exists() else None
    for base in (Path.cwd(), *run.path.resolve().parents):
        if (base / path).exists():
            return (base / path).resolve()
    return None


def _games_pgn(run: RunData, payload: dict[str, Any], path: Path) -> Path | None:
    named = payload.get("pgn")
    found = resolve_run_path(run, named) if isinstance(named, str) and named else None
    beside = path.with_suffix(".pgn")
    return found if found is not None and found.is_file() else beside if beside.is_file() else None


def effective_model_config(run: RunData) -> tuple[dict[str, Any], Path] | None:
    """The action policy's shape as saved with its weights, and the file it came from; None when there is none.

    The run's own newest checkpoint holds the model it trained; before the first one, its ``init_checkpoint``
    (whose shape a policy run takes, ignoring its ``model`` section). Language models (a transformers
    config.json beside the weights) have no policy config and give None.
    """
    from chessgrpo.errors import ChessGRPOError
    from chessgrpo.models.checkpoint_kind import POLICY, identify_checkpoint

    candidates = [run.path]
    init = run.setting("init_checkpoint")
    if isinstance(init, str) and init:
        start = resolve_run_path(run, init)
        if start is not None:
            candidates.append(start)
    for candidate in candidates:
        try:
            found = identify_checkpoint(candidate)
        except (OSError, ChessGRPOError):  # no checkpoint there (yet), or a corrupt one: try the next source
            continue
        if found.kind != POLICY:
            return None
        payload = _read_json(found.directory / "model_config.json")
        if payload is not None:
            return payload, found.directory / "model_config.json"
    return None


def read_metrics_like(path: Path) -> list[dict[str, Any]]:
    """The complete JSON rows of a JSONL file that has a "step" in every row (a torn line is skipped)."""
    return read_metrics(path)


def _held_out(entry: Any) -> HeldOut | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("value"), (int, float)):
        return None

    def number(key: str) -> float:
        value = entry.get(key)
        return float(value) if isinstance(value, (int, float)) else math.nan

    return HeldOut(float(entry["value"]), number("low"), number("high"), int(entry.get("n") or 0))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(read_text(path))
    except (OSError, ValueError) as error:  # a file being written right now, or not ours
        logger.warning("skipping %s: %s", path, error)
        return None
    return payload if isinstance(payload, dict) else None


def _read_evaluations(directory: Path, rows: list[dict[str, Any]]) -> tuple[list[EvalPoint], list[StandaloneEval]]:
    points: dict[int, EvalPoint] = {}
    held_out = held_out_metrics()
    # 1. eval rows of metrics.jsonl: eval/<name>, eval/<name>_low, eval/<name>_high (GRPO's held-out evaluation;
    #    pretraining's eval/top1 on the dataset's test split has no interval and stays a plain metric)
    for row in rows:
        found = {}
        for name in held_out:
            key = f"eval/{name}"
            if isinstance(row.get(key), (int, float)) and key + "_low" in row:
                found[name] = HeldOut(
                    float(row[key]), float(row.get(key + "_low", math.nan)), float(row.get(key + "_high", math.nan))
                )
        if found:
            points.setdefault(row["step"], EvalPoint(row["step"], {})).metrics.update(found)
    standalone: list[StandaloneEval] = []
    if not directory.is_dir():
        return sorted(points.values(), key=lambda p: p.step), standalone
    # 2. eval/*.json: per-step files carry records (and fill in n), others are standalone evaluations
    step_file = step_file_pattern()
    for path in sorted(directory.glob("*.json")):
        payload = _read_json(path)
        if payload is None:
            continue
        match = step_file.match(path.name)
        evaluation = recognise_summary(payload)
        if evaluation is None:
            continue
        kind = evaluation.name

        def metrics_of(summary: dict[str, Any]) -> dict[str, HeldOut]:
            return {
                metric.name: held
                for metric in evaluation.held_out  # noqa: B023 (used within this iteration)
                if (held := _held_out(summary.get(metric.summary_field))) is not None
            }

        player = metrics_of(payload)
        if match is None:
            baselines = {
                baseline: metrics_of(values)
                for baseline, values in (payload.get("baselines") or {}).items()
                if isinstance(values, dict)
            }
            standalone.append(StandaloneEval(path, kind, player, baselines))
            continue
        step = int(match.group(1))
        point = points.setdefault(step, EvalPoint(step, {}))
        for name, held in player.items():
            point.metrics[name] = held  # the file has n as well; same value and interval as the row
        records = (payload.get("records") or {}).get("player")
        if isinstance(records, list) and records:
            point.records[kind] = records
    return sorted(points.values(), key=lambda p: p.step), standalone
