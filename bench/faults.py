"""Fault injection into the real `chessgrpo` commands: a table of what survives and what does not.

Every case runs the real command line in a subprocess on tiny real data (real Stockfish, tiny
models, a few steps) and injects faults from the outside (`chessgrpo.testing.faults`):

  engine      Stockfish processes of a run found through /proc and killed in their first ~50 ms
              (start-up), every 0.1-0.3 / 0.3-1 / 1.5-3 s through a whole run (move groups,
              trajectories against Stockfish, GRPO on text, data generation, games), SIGSTOPped
              (a hung engine: `engine.timeout_s` must notice), killed or stopped while the run
              shuts down, and the binary deleted mid-run. The run must finish with weights bitwise
              equal to an undisturbed run with the same seed (or rows / games equal), or stop with
              one clear line; the binary case must then resume to the same weights.
  kill -9     the command itself killed at a random moment (and while writing a checkpoint or a
              shard), then `train --resume RUN_DIR` (training) or the same command again (data
              generate resumes, eval games re-runs): weights bitwise, metrics row for row, dataset
              rows row for row, games and their summary equal to an undisturbed run.
  corrupt     truncated and scrambled checkpoints (a resume must fall back to an intact one and
              still end bitwise equal), truncated and scrambled dataset shards before a re-run,
              a corrupt evaluation-cache entry (searched again, same values), a truncated cache.
  malformed   malformed inputs for the commands that read files or strings: bad FENs (one of
              10,000 characters), non-UTF-8 files, scrambled and truncated Parquet shards, bad
              FEN/EPD/PGN/CSV files, truncated checkpoints, unknown config keys, `lr=.inf`, ...
              Clean = exit code != 0, no traceback, one error line of <= 400 characters naming
              the input, and the input files (and run directory) unchanged.

Each case counts its trials as handled cleanly, crashed (a traceback, a hang, a run that stopped
when it should have survived, an unclear error) or wrong (data lost or wrong: weights, rows or
games that differ from the undisturbed run, a changed input file, a malformed input accepted).
Results: a Markdown table on stdout (`docs/reliability.md` has the last full run), `--out-json`.

Run:  .venv/bin/python bench/faults.py [--quick] [--seed 0] [--out-json FILE] [--only TEXT]
      [--work DIR] [--keep]
      --quick: a short subset (~2 minutes on 2 cores); the full matrix takes ~9-15 minutes.
      --only: run the cases whose "group: name" contains TEXT (repeatable).
Keep the machine otherwise quiet: faults are injected at wall-clock moments, and a loaded machine
slows every run (nothing is timed against a limit except hang detection).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import json
import logging
import os
import platform
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # runnable from a checkout without installing

from chessgrpo.testing.faults import CommandResult, EngineFaults, KillEnginesWhen, StartupKiller, run_command  # noqa: E402
from chessgrpo.testing.outcomes import (  # noqa: E402
    dataset_difference,
    digest_difference,
    error_problem,
    metrics_rows,
    rows_difference,
    tree_digest,
    warning_lines,
    weights_difference,
)

DATA = REPO / "data"  # shipped with the repository (data/README.md)
SYZYGY = DATA / "syzygy"
PUZZLES = DATA / "lichess_puzzles_dev.csv"
CLI = [sys.executable, "-m", "chessgrpo.cli"]
CONFIGS = REPO / "configs"

CLEAN, CRASHED, WRONG = "clean", "crashed", "wrong"
START_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
ITALIAN = "r1bqk1nr/pppp1ppp/2n5/2b1p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"
OPENINGS = [
    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1",
]


class Unjudgeable(Exception):
    """An undisturbed reference run failed: the cases that need it cannot be judged."""


# --------------------------------------------------------------------------------------------
# Tallies and cases


@dataclasses.dataclass
class Tally:
    """One row of the table."""

    group: str
    name: str
    tried: int = 0
    clean: int = 0
    crashed: int = 0
    wrong: int = 0
    faults: int = 0
    """Signals sent (kills, stops) across the trials, where the case injects them."""
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, category: str, note: str | None = None, faults: int = 0) -> None:
        self.tried += 1
        setattr(self, category, getattr(self, category) + 1)
        self.faults += faults
        if note:
            self.notes.append(note if category == CLEAN else f"{category}: {note}")

    @property
    def label(self) -> str:
        return f"{self.group}: {self.name}"


@dataclasses.dataclass(frozen=True)
class Case:
    group: str
    name: str
    run: Callable[[Bench, Tally, int], None]
    """Runs trial number `trial` and adds its outcome to the tally."""
    trials: tuple[int, int] = (1, 1)
    """(quick, full) trials; 0 in quick leaves the case out of --quick."""


CASES: list[Case] = []


def case(group: str, name: str, trials: tuple[int, int] = (1, 1)):
    def register(function):
        CASES.append(Case(group, name, function, trials))
        return function

    return register


# --------------------------------------------------------------------------------------------
# The bench: a work directory, seeded randomness, tiny runs of every command, references


class Bench:
    def __init__(self, work: Path, seed: int, quick: bool):
        self.work = work
        self.seed = seed
        self.quick = quick
        self.rng = random.Random(seed)
        self.runs = work / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self._references: dict[str, tuple[Path, float]] = {}
        self._counter = 0

    # -- commands --------------------------------------------------------------------------

    def cli(self, args: Sequence[str], *, cwd: Path | None = None, timeout_s: float = 300.0, **kwargs) -> CommandResult:
        return run_command([*CLI, *map(str, args)], cwd=cwd or self.work, timeout_s=timeout_s, **kwargs)

    def unique(self, stem: str) -> str:
        self._counter += 1
        return f"{stem}-{self._counter}"

    def train_args(self, kind: str, name: str, *extra: str) -> list[str]:
        """A tiny run of `kind` named `name` (a few seconds of training)."""
        common = [f"run.out_dir={self.runs}", f"run.name={name}", f"run.seed={self.seed}", "threads=1", "log_every=1"]
        syzygy = f"engine.syzygy_path={SYZYGY}"
        if kind == "move_group":  # engine rewards for 8 x 4 moves a step at 1000 nodes, 2 engines
            args = [
                "train",
                "--config",
                CONFIGS / "grpo_tiny.yaml",
                *common,
                "init_checkpoint=null",
                "positions=random:256",
                "position_mixture=[]",
                "eval.positions=null",
                "eval.puzzles=null",
                "task.positions_per_step=8",
                "task.group_size=4",
                "task.reward_nodes=1000",
                "task.best_move_values=false",
                "grpo.minibatch_size=16",
                "engine.processes=2",
                "engine.cache=false",
                syzygy,
                "warmup_steps=0",
                "lr=3e-3",
                "steps=40",
                "eval_every=0",
                "eval_at_start=false",
                "checkpoint_every=5",
            ]
        elif kind == "trajectory":  # games against Stockfish, engine rewards
            args = [
                "train",
                "--config",
                CONFIGS / "trajectory_stockfish_tiny.yaml",
                *common,
                "init_checkpoint=null",
                "positions=random:256",
                "task.positions_per_step=4",
                "task.group_size=4",
                "task.horizon=3",
                "task.opponent_nodes=50",
                "task.reward_nodes=300",
                "grpo.minibatch_size=8",
                "eval.offline_positions=null",
                "eval_at_start=false",
                "eval_every=0",
                "engine.processes=2",
                "engine.cache=false",
                syzygy,
                "warmup_steps=0",
                "steps=16",
                "checkpoint_every=4",
            ]
        elif kind == "endgame":  # trajectories against the tablebase defender (no Stockfish)
            args = [
                "train",
                "--config",
                CONFIGS / "endgame_kqk.yaml",
                *common,
                "init_checkpoint=null",
                "task.positions_per_step=4",
                "task.group_size=4",
                "task.horizon=4",
                "grpo.minibatch_size=8",
                "eval.positions=20",
                "eval.baselines=false",
                "eval_every=5",
                "eval_at_start=false",
                syzygy,
                "warmup_steps=0",
                "steps=15",
                "checkpoint_every=3",
            ]
        elif kind == "pretrain":
            args = [
                "pretrain",
                "--config",
                CONFIGS / "pretrain_tiny.yaml",
                *common,
                f"data={self.labelled_data()}",
                "batch_size=32",
                "steps=40",
                "warmup_steps=2",
                "eval_every=10",
                "checkpoint_every=5",
                "eval_batch_size=256",
                "model.dropout=0.1",
            ]
        elif kind == "sft":
            args = [
                "sft",
                "--config",
                CONFIGS / "rookworld_sft_tiny.yaml",
                *common,
                f"data={self.rookworld_data()}",
                "model.n_layer=1",
                "model.n_embd=32",
                "model.n_head=2",
                "model.dropout=0.1",
                "steps=16",
                "batch_size=8",
                "warmup_steps=2",
                "eval_every=8",
                "eval_examples=16",
                "eval_prompts=2",
                "max_new_tokens=8",
                "checkpoint_every=4",
            ]
        elif kind == "rookworld":  # GRPO on text: engine rewards for unlisted moves
            args = [
                "train",
                "--config",
                CONFIGS / "rookworld_grpo_tiny.yaml",
                *common,
                f"data={self.rookworld_data()}",
                f"init_checkpoint={self.reference('sft')[0]}",
                "task.prompts_per_step=3",
                "task.group_size=2",
                "task.max_new_tokens=20",
                "grpo.minibatch_size=3",
                "rewards.policy.nodes=50",
                "engine.processes=2",
                "engine.cache=false",
                syzygy,
                "eval.policy_prompts=3",
                "eval.environment_prompts=2",
                "eval_every=0",
                "eval_at_start=false",
                "eval.resamples=50",
                "steps=8",
                "checkpoint_every=2",
                "grpo.entropy_coef=0.01",
            ]
        else:
            raise ValueError(kind)
        return [*map(str, args), *extra]

    def generate_args(self, out: Path, *extra: str) -> list[str]:
        return [
            "data",
            "generate",
            "--out",
            str(out),
            "--positions",
            "800",
            "--nodes",
            "100",
            "--multipv",
            "3",
            "--seed",
            str(self.seed),
            "shard_size=100",
            "concurrent_games=16",
            "engine.processes=2",
            f"engine.syzygy_path={SYZYGY}",
            *extra,
        ]

    def games_args(self, pgn: Path, *extra: str) -> list[str]:
        openings = self.work / "openings.epd"
        openings.write_text("".join(fen + "\n" for fen in OPENINGS))
        return [
            "eval",
            "games",
            "--checkpoint",
            str(self.reference("move_group")[0]),
            "--anchors",
            "random,sf-nodes:30",
            "--games",
            "4",
            "--openings",
            str(openings),
            "--workers",
            "2",
            "--pgn",
            str(pgn),
            "--json",
            "max_plies=80",
            f"engine.syzygy_path={SYZYGY}",
            "engine.cache=false",
            "anchor_ratings=[sf-nodes:30=1000]",
            f"seed={self.seed}",
            *extra,
        ]

    # -- references (undisturbed runs, one per configuration, shared by the cases) ----------

    def reference(self, kind: str) -> tuple[Path, float]:
        """The undisturbed run of `kind` and how long it took (wall seconds, start-up included)."""
        marker = self.work / "references" / f"{kind}.json"
        if kind not in self._references and marker.exists():  # a kept --work directory: reuse it
            saved = json.loads(marker.read_text())
            self._references[kind] = (Path(saved["out"]), saved["seconds"])
        if kind not in self._references:
            if kind == "data":
                out = self.work / "data-ref"
                result = self.cli(self.generate_args(out))
            elif kind == "rookworld_data":
                out = self.work / "rookworld-data-ref"
                result = self.cli(
                    [
                        "data",
                        "rookworld",
                        "--out",
                        out,
                        "--positions",
                        "40",
                        "--nodes",
                        "50",
                        "--seed",
                        self.seed,
                        "engine.processes=2",
                        "engine.cache=false",
                        f"engine.syzygy_path={SYZYGY}",
                    ]
                )
            elif kind == "games":
                out = self.work / "games-ref.pgn"
                result = self.cli(self.games_args(out))
                (self.work / "games-ref.json").write_text(result.stdout)
            else:
                out = self.runs / f"{kind}-ref"
                result = self.cli(self.train_args(kind, out.name))
            progress(f"      reference {kind}: exit {result.returncode} in {result.seconds:.1f} s")
            if not result.ok:
                raise Unjudgeable(f"the undisturbed {kind} run failed: {result.tail()}")
            self._references[kind] = (out, result.seconds)
            marker.parent.mkdir(exist_ok=True)
            marker.write_text(json.dumps({"out": str(out), "seconds": result.seconds}))
        return self._references[kind]

    def labelled_data(self) -> Path:
        return self.reference("data")[0]

    def rookworld_data(self) -> Path:
        return self.reference("rookworld_data")[0]

    # -- judging ---------------------------------------------------------------------------

    def run_difference(self, kind: str, run_dir: Path) -> str | None:
        """None when `run_dir` ended bitwise equal to the reference of `kind`: weights, metrics."""
        reference = self.reference(kind)[0]
        try:
            problem = weights_difference(reference, run_dir)
        except (FileNotFoundError, ValueError) as error:
            return f"weights unreadable: {error}"
        if problem:
            return f"weights: {problem}"
        ignore = ("time", "perf/", "health/")
        return rows_difference(
            metrics_rows(reference / "metrics.jsonl", ignore),
            metrics_rows(run_dir / "metrics.jsonl", ignore),
            what="metrics row",
        )

    def judge_run(self, tally: Tally, kind: str, result: CommandResult, run_dir: Path, note: str = "") -> None:
        faults = len(result.faults)
        if result.injector_errors:
            note += f" (injector: {result.injector_errors[0]})"
        if not result.ok:
            tally.add(CRASHED, f"{_ended(result)}: {result.tail(1)}{note}", faults)
            return
        problem = self.run_difference(kind, run_dir)
        leftovers = f"; {result.leftovers} processes left behind" if result.leftovers else ""
        if problem:
            tally.add(WRONG, problem + note + leftovers, faults)
        else:
            tally.add(CLEAN, (note.strip() + leftovers) or None, faults)


def _ended(result: CommandResult) -> str:
    if result.timed_out:
        return f"hung ({result.seconds:.0f} s)"
    if result.returncode is not None and result.returncode < 0:
        return f"killed by {signal.Signals(-result.returncode).name}"
    return f"exit {result.returncode}"


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Engine faults


@case("engine", "start-up kills, pool in this process", trials=(2, 4))
def engine_startup_pool(bench: Bench, tally: Tally, trial: int) -> None:
    from chessgrpo.board import random_playout_positions
    from chessgrpo.engine import EngineError, EnginePool, RetryPolicy

    positions = [b.fen() for b in random_playout_positions(12, seed=bench.seed + trial, max_plies=40)]
    with EnginePool(processes=2, nodes=300) as pool:
        expected = pool.evaluate(positions)
    # Each of the two slots loses its first process (and the first replacement on odd trials).
    killer = StartupKiller(os.getpid(), limit=2 + 2 * (trial % 2), max_age_s=0.05)
    with killer:
        try:
            with EnginePool(processes=2, nodes=300, retry=RetryPolicy(backoff_s=0.02)) as pool:
                got = pool.evaluate(positions)
        except EngineError as error:
            tally.add(CRASHED, f"EngineError: {str(error)[:200]}", len(killer.faults))
            return
    faults = len(killer.faults)
    youngest_tick = max([f.age_s for f in killer.faults] + [0.01])  # ages are in 10 ms clock ticks
    note = f"{faults} killed in their first {youngest_tick * 1000:.0f} ms" + (
        f", {killer.missed} seen too late" if killer.missed else ""
    )
    if got != expected:
        tally.add(WRONG, "evaluations differ from an undisturbed pool", faults)
    elif faults == 0:
        tally.add(CLEAN, "no engine was caught young enough (nothing injected)")
    else:
        tally.add(CLEAN, note if trial == 0 else None, faults)


@case("engine", "start-up kills, GRPO run (move_group)", trials=(1, 2))
def engine_startup_run(bench: Bench, tally: Tally, trial: int) -> None:
    bench.reference("move_group")
    name = bench.unique("mg-startup")
    limit = 3 + trial
    result = bench.cli(bench.train_args("move_group", name), injectors=[lambda pid: StartupKiller(pid, limit=limit)])
    bench.judge_run(tally, "move_group", result, bench.runs / name)


def _kill_rate_case(
    kind: str,
    every: tuple[float, float],
    sig: int = signal.SIGKILL,
    extra: Sequence[str] = (),
    max_faults: int | None = None,
):
    def run(bench: Bench, tally: Tally, trial: int) -> None:
        bench.reference(kind)
        name = bench.unique(f"{kind}-{signal.Signals(sig).name.lower()}")
        seed = bench.rng.randrange(2**31)
        result = bench.cli(
            bench.train_args(kind, name, *extra),
            injectors=[lambda pid: EngineFaults(pid, every=every, sig=sig, seed=seed, max_faults=max_faults)],
        )
        bench.judge_run(tally, kind, result, bench.runs / name)

    return run


case("engine", "kills every 0.3-1 s, whole GRPO run (move_group)", trials=(1, 2))(
    _kill_rate_case("move_group", (0.3, 1.0))
)
case("engine", "kills every 0.1-0.3 s, whole GRPO run (move_group)", trials=(0, 1))(
    _kill_rate_case("move_group", (0.1, 0.3))
)
case("engine", "kills every 1.5-3 s, whole GRPO run (move_group)", trials=(0, 1))(
    _kill_rate_case("move_group", (1.5, 3.0))
)
case("engine", "kills every 0.3-1 s, trajectories vs Stockfish", trials=(0, 1))(
    _kill_rate_case("trajectory", (0.3, 1.0))
)
case("engine", "kills every 0.3-1 s, GRPO on text (rookworld)", trials=(0, 1))(_kill_rate_case("rookworld", (0.3, 1.0)))
# Each stop stalls a batch for timeout_s, so a few stops per run (more would only slow it down).
case("engine", "SIGSTOP (4 per run, every 1.5-3 s), timeout_s=2 (move_group)", trials=(1, 2))(
    _kill_rate_case("move_group", (1.5, 3.0), signal.SIGSTOP, ("engine.timeout_s=2",), max_faults=4)
)


@case("engine", "kills every 0.3-1 s, data generate", trials=(0, 1))
def engine_kills_generate(bench: Bench, tally: Tally, trial: int) -> None:
    reference = bench.reference("data")[0]
    out = bench.work / bench.unique("data-kills")
    seed = bench.rng.randrange(2**31)
    result = bench.cli(bench.generate_args(out), injectors=[lambda pid: EngineFaults(pid, every=(0.3, 1.0), seed=seed)])
    _judge_dataset(tally, result, reference, out)


def _judge_dataset(tally: Tally, result: CommandResult, reference: Path, out: Path, note: str = "") -> None:
    faults = len(result.faults)
    if not result.ok:
        tally.add(CRASHED, f"{_ended(result)}: {result.tail(1)}{note}", faults)
        return
    problem = dataset_difference(reference, out)
    if problem is None:
        left, right = (json.loads((d / "manifest.json").read_text()) for d in (reference, out))
        keys = ("positions", "splits", "counts", "complete")
        if any(left.get(k) != right.get(k) for k in keys):
            problem = "manifest differs: " + ", ".join(k for k in keys if left.get(k) != right.get(k))
    if list(out.rglob("*.tmp")):
        problem = problem or f"temporary files left: {[p.name for p in out.rglob('*.tmp')][:3]}"
    tally.add(WRONG if problem else CLEAN, (problem + note) if problem else (note.strip() or None), faults)


@case("engine", "kills every 0.3-1 s, eval games (anchors)", trials=(0, 1))
def engine_kills_games(bench: Bench, tally: Tally, trial: int) -> None:
    bench.reference("games")
    pgn = bench.work / f"{bench.unique('games-kills')}.pgn"
    seed = bench.rng.randrange(2**31)
    result = bench.cli(bench.games_args(pgn), injectors=[lambda pid: EngineFaults(pid, every=(0.3, 1.0), seed=seed)])
    _judge_games(bench, tally, result, pgn)


def _games_summary(text: str) -> dict:
    def strip(value):
        if isinstance(value, dict):
            return {
                k: strip(v)
                for k, v in value.items()
                if k not in ("pgn", "seconds", "time", "games_resumed") and not k.startswith("games_per_")
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(text))


def _judge_games(bench: Bench, tally: Tally, result: CommandResult, pgn: Path) -> None:
    faults = len(result.faults)
    if not result.ok:
        tally.add(CRASHED, f"{_ended(result)}: {result.tail(1)}", faults)
        return
    reference = bench.reference("games")[0]
    try:
        same_summary = _games_summary(result.stdout) == _games_summary((bench.work / "games-ref.json").read_text())
    except json.JSONDecodeError:
        same_summary = False
    if not same_summary:
        tally.add(WRONG, "the summary differs from an undisturbed run", faults)
    elif pgn.read_text() != reference.read_text():
        tally.add(WRONG, "the PGN differs from an undisturbed run", faults)
    else:
        tally.add(CLEAN, f"{result.leftovers} processes left behind" if result.leftovers else None, faults)


@case("engine", "kills while the run shuts down (move_group)", trials=(0, 1))
def engine_kills_shutdown(bench: Bench, tally: Tally, trial: int) -> None:
    bench.reference("move_group")
    name = bench.unique("mg-shutdown")
    last = bench.runs / name / "checkpoints" / "step_000040"
    result = bench.cli(
        bench.train_args("move_group", name), injectors=[lambda pid: KillEnginesWhen(pid, last.exists, window_s=3.0)]
    )
    bench.judge_run(tally, "move_group", result, bench.runs / name)


@case("engine", "SIGSTOP while the run shuts down (move_group)", trials=(0, 1))
def engine_stops_shutdown(bench: Bench, tally: Tally, trial: int) -> None:
    bench.reference("move_group")
    name = bench.unique("mg-shutdown-stop")
    last = bench.runs / name / "checkpoints" / "step_000040"
    result = bench.cli(
        bench.train_args("move_group", name, "engine.timeout_s=5"),
        injectors=[lambda pid: KillEnginesWhen(pid, last.exists, sig=signal.SIGSTOP, window_s=1.0)],
    )
    bench.judge_run(tally, "move_group", result, bench.runs / name, note=f" ({result.seconds:.0f} s)")


@case("engine", "binary deleted mid-run, then restored and --resume (move_group)", trials=(0, 1))
def engine_binary_deleted(bench: Bench, tally: Tally, trial: int) -> None:
    from chessgrpo.engine import find_stockfish

    bench.reference("move_group")
    binary = bench.work / "bin" / "stockfish-copy"
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(find_stockfish(), binary)
    name = bench.unique("mg-nobinary")
    metrics = bench.runs / name / "metrics.jsonl"

    def ten_steps() -> bool:
        return metrics.exists() and metrics.read_text().count("\n") >= 10

    args = bench.train_args("move_group", name, f"engine.path={binary}", "engine.startup_attempts=2")
    result = bench.cli(
        args, injectors=[lambda pid: KillEnginesWhen(pid, ten_steps, before=binary.unlink, window_s=1.0)]
    )
    faults = len(result.faults)
    if result.ok:
        tally.add(WRONG, "finished without its engine binary?", faults)
        return
    problem = error_problem(result, [str(binary)])
    shutil.copy2(find_stockfish(), binary)
    if problem:
        tally.add(CRASHED, f"the stop: {problem[1]}", faults)
        return
    resumed = bench.cli(["train", "--resume", bench.runs / name])
    if not resumed.ok:
        tally.add(CRASHED, f"--resume after restoring the binary: {resumed.tail(1)}", faults)
        return
    difference = bench.run_difference("move_group", bench.runs / name)
    tally.add(WRONG if difference else CLEAN, difference or f"stopped with: {result.tail(1)[:160]}", faults)


# --------------------------------------------------------------------------------------------
# kill -9 of the command, then --resume or the same command again


def _kill_once(bench: Bench, tally: Tally, args: list, reference_s: float, kill_when=None, while_what: str = ""):
    """Run `args` and kill -9 it: when `kill_when()` turns true (`while_what` names that moment),
    else at a random 40-95% of the undisturbed run's time. Returns (result, moment), or None after
    tallying a crash when the command failed on its own before the kill."""
    if kill_when is not None:
        first = bench.cli(args, kill_when=kill_when, kill_poll_s=0.001)
        moment = f"while {while_what}" if first.killed else f"never caught {while_what}"
    else:
        delay = bench.rng.uniform(0.4, 0.95) * reference_s
        first = bench.cli(args, kill_after_s=delay)
        moment = f"killed at {delay:.1f} s of ~{reference_s:.0f}"
    if not first.killed and not first.ok:
        tally.add(CRASHED, f"before the kill: {_ended(first)}: {first.tail(1)}")
        return None
    return first, moment


def _kill9_train_case(kind: str, at_checkpoint_write: bool = False):
    def run(bench: Bench, tally: Tally, trial: int) -> None:
        _, reference_s = bench.reference(kind)
        name = bench.unique(f"{kind}-kill9")
        run_dir = bench.runs / name
        args = bench.train_args(kind, name)
        kill_when = None
        if at_checkpoint_write:
            checkpoints = run_dir / "checkpoints"
            skip = bench.rng.randrange(1, 4)  # not the step-0 save: the 2nd-4th checkpoint write
            seen: set[str] = set()

            def writing() -> bool:
                try:
                    tmp = {e.name for e in os.scandir(checkpoints) if e.name.startswith(".tmp-step")}
                except FileNotFoundError:
                    return False
                seen.update(tmp)
                return bool(tmp) and len(seen) > skip

            kill_when = writing
        killed = _kill_once(bench, tally, args, reference_s, kill_when, "writing a checkpoint")
        if killed is None:
            return
        first, moment = killed
        # As a user would: --resume when the run directory has a config, else the same command;
        # a run killed before its first checkpoint was saved cannot resume: the same command again.
        how = "resumed"
        if (run_dir / "config.yaml").exists():
            second = bench.cli(["train", "--resume", run_dir])
            if second.returncode and "no checkpoint" in second.stderr:
                how = "--resume refused (no checkpoint yet), the same command re-ran"
                second = bench.cli(args)
        else:
            how = "no run directory yet, the same command re-ran"
            second = bench.cli(args)
        note = f" ({moment}; {how})"
        bench.judge_run(
            tally, kind, second, run_dir, note=note if trial == 0 or not second.ok or how.startswith("--") else ""
        )

    return run


case("kill -9", "train move_group, then --resume", trials=(1, 3))(_kill9_train_case("move_group"))
case("kill -9", "train move_group while writing a checkpoint, then --resume", trials=(0, 1))(
    _kill9_train_case("move_group", at_checkpoint_write=True)
)
case("kill -9", "train trajectory (vs Stockfish), then --resume", trials=(0, 2))(_kill9_train_case("trajectory"))
case("kill -9", "train trajectory (endgame, tablebase), then --resume", trials=(0, 2))(_kill9_train_case("endgame"))
case("kill -9", "train rookworld (GRPO on text), then --resume", trials=(0, 2))(_kill9_train_case("rookworld"))
case("kill -9", "pretrain, then --resume", trials=(1, 3))(_kill9_train_case("pretrain"))
case("kill -9", "pretrain while writing a checkpoint, then --resume", trials=(0, 1))(
    _kill9_train_case("pretrain", True)
)
case("kill -9", "sft, then --resume", trials=(0, 2))(_kill9_train_case("sft"))


def _kill9_generate(at_shard_write: bool):
    def run(bench: Bench, tally: Tally, trial: int) -> None:
        reference, reference_s = bench.reference("data")
        out = bench.work / bench.unique("data-kill9")
        args = bench.generate_args(out)
        shard_write = (lambda: out.exists() and any(out.rglob("*.tmp"))) if at_shard_write else None
        killed = _kill_once(bench, tally, args, reference_s, shard_write, "writing a shard")
        if killed is None:
            return
        first, moment = killed
        second = bench.cli(args)
        _judge_dataset(
            tally, second, reference, out, note=f" ({moment}; re-run)" if trial == 0 or not second.ok else ""
        )

    return run


case("kill -9", "data generate, then the same command", trials=(1, 3))(_kill9_generate(False))
case("kill -9", "data generate while writing a shard, then the same command", trials=(0, 1))(_kill9_generate(True))


@case("kill -9", "eval games, then the same command", trials=(0, 2))
def kill9_games(bench: Bench, tally: Tally, trial: int) -> None:
    _, reference_s = bench.reference("games")
    pgn = bench.work / f"{bench.unique('games-kill9')}.pgn"
    killed = _kill_once(bench, tally, bench.games_args(pgn), reference_s)
    if killed is None:
        return
    first, moment = killed
    orphans = f"; {first.leftovers} processes outlived the kill by 3 s" if first.leftovers else ""
    second = bench.cli(bench.games_args(pgn))
    _judge_games(bench, tally, second, pgn)
    if orphans:
        tally.notes.append(f"{moment}{orphans}")


@case("kill -9", "data rookworld, then the same command", trials=(0, 2))
def kill9_rookworld_data(bench: Bench, tally: Tally, trial: int) -> None:
    reference, reference_s = bench.reference("rookworld_data")
    out = bench.work / bench.unique("rookworld-data-kill9")
    args = [
        "data",
        "rookworld",
        "--out",
        out,
        "--positions",
        "40",
        "--nodes",
        "50",
        "--seed",
        bench.seed,
        "engine.processes=2",
        "engine.cache=false",
        f"engine.syzygy_path={SYZYGY}",
    ]

    # It writes everything at the end, into a hidden sibling renamed into place: killed once that
    # sibling (or the output) exists (while writing), or at a random moment on later trials.
    def writing() -> bool:
        return out.exists() or any(out.parent.glob(f".{out.name}.partial-*"))

    killed = _kill_once(bench, tally, args, reference_s, writing if trial == 0 else None, "writing its output")
    if killed is None:
        return
    first, moment = killed
    second = bench.cli(args)
    if not second.ok:
        tally.add(CRASHED, f"the re-run ({moment}): {second.tail(1)}")
        return
    problem = dataset_difference(reference, out)
    texts = sorted(p.name for p in reference.glob("*.txt"))
    if problem is None and any((reference / t).read_bytes() != (out / t).read_bytes() for t in texts):
        problem = "text files differ"
    tally.add(WRONG if problem else CLEAN, problem)


# --------------------------------------------------------------------------------------------
# Corrupt files that a run must survive (or refuse cleanly)


def _scramble(path: Path, seed: int) -> None:
    """Overwrite bytes in the middle third of `path` (size unchanged: only checksums or the
    format's own checks can notice)."""
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    start, end = len(data) // 3, max(len(data) // 3 + 1, 2 * len(data) // 3)
    for _ in range(max(8, (end - start) // 16)):
        data[rng.randrange(start, end)] = rng.randrange(256)
    path.write_bytes(bytes(data))


def _truncate(path: Path, fraction: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def _checkpoint_case(damage: Callable[[Path, int], None], what: str):
    def run(bench: Bench, tally: Tally, trial: int) -> None:
        bench.reference("move_group")
        name = bench.unique("mg-corrupt")
        run_dir = bench.runs / name
        first = bench.cli(bench.train_args("move_group", name, "stop_at=20"))
        if not first.ok:
            tally.add(CRASHED, f"the first half: {first.tail(1)}")
            return
        damage(run_dir / "checkpoints" / "step_000020", bench.seed)
        second = bench.cli(["train", "--resume", run_dir])
        bench.judge_run(tally, "move_group", second, run_dir, note=f" ({what})")

    return run


case("corrupt", "latest checkpoint's weights truncated, then --resume", trials=(1, 1))(
    _checkpoint_case(lambda d, s: _truncate(d / "model.safetensors"), "truncated model.safetensors")
)
case("corrupt", "latest checkpoint's weights scrambled (same size), then --resume", trials=(0, 1))(
    _checkpoint_case(lambda d, s: _scramble(d / "model.safetensors", s), "scrambled model.safetensors")
)
case("corrupt", "latest checkpoint's trainer state truncated, then --resume", trials=(0, 1))(
    _checkpoint_case(lambda d, s: _truncate(d / "trainer_state.pt"), "truncated trainer_state.pt")
)
case("corrupt", "latest checkpoint's manifest deleted, then --resume", trials=(0, 1))(
    _checkpoint_case(lambda d, s: (d / "manifest.json").unlink(), "no manifest.json")
)


def _shard_case(damage: Callable[[Path, int], None], what: str):
    def run(bench: Bench, tally: Tally, trial: int) -> None:
        reference = bench.reference("data")[0]
        out = bench.work / bench.unique("data-corrupt")
        shutil.copytree(reference, out)
        shard = sorted((out / "train").glob("*.parquet"))[1]
        damage(shard, bench.seed)
        before = tree_digest(out)
        result = bench.cli(bench.generate_args(out))
        if result.ok:
            # Repaired: the dataset must now equal an undisturbed one.
            _judge_dataset(tally, result, reference, out, note=f" ({what}; the re-run exited 0)")
            return
        problem = error_problem(result, [shard.name])
        changed = digest_difference(before, tree_digest(out))
        if changed:
            tally.add(WRONG, f"refused but changed the dataset: {changed}")
        elif problem:
            tally.add(problem[0], f"{what}: {problem[1]}")
        else:
            tally.add(CLEAN, f"{what}: refused: {result.tail(1)[:160]}")

    return run


case("corrupt", "dataset shard truncated, then data generate again", trials=(0, 1))(
    _shard_case(lambda p, s: _truncate(p), "truncated shard")
)
case("corrupt", "dataset shard scrambled, then data generate again", trials=(0, 1))(
    _shard_case(lambda p, s: _scramble(p, s), "scrambled shard")
)


def _cache_search(bench: Bench, cache: Path, cwd: Path) -> CommandResult:
    return bench.cli(
        [
            "engine",
            "eval",
            "--fen",
            ITALIAN,
            "--fen",
            START_FEN,
            "--json",
            "engine.nodes=300",
            "engine.processes=1",
            f"engine.cache_path={cache}",
            f"engine.syzygy_path={SYZYGY}",
        ],
        cwd=cwd,
    )


def _evaluations(text: str) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k != "cached"}
        for line in text.splitlines()
        if line.startswith("{")
    ]


@case("corrupt", "evaluation cache entry corrupt (searched again, same values)", trials=(1, 1))
def corrupt_cache_entry(bench: Bench, tally: Tally, trial: int) -> None:
    directory = bench.work / bench.unique("cache-entry")
    directory.mkdir()
    cache = directory / "evaluations.sqlite"
    first = _cache_search(bench, cache, directory)
    if not first.ok:
        tally.add(CRASHED, f"the first search: {first.tail(1)}")
        return
    with sqlite3.connect(cache) as connection:
        connection.execute("UPDATE evaluations SET value = substr(value, 1, 7)")  # truncated JSON
    second = _cache_search(bench, cache, directory)
    if not second.ok:
        tally.add(CRASHED, f"not searched again: {_ended(second)}: {second.tail(1)}")
    elif _evaluations(second.stdout) != _evaluations(first.stdout):
        tally.add(WRONG, "values differ from the first search")
    else:
        tally.add(CLEAN)


@case("corrupt", "evaluation cache file truncated", trials=(0, 1))
def corrupt_cache_file(bench: Bench, tally: Tally, trial: int) -> None:
    directory = bench.work / bench.unique("cache-file")
    directory.mkdir()
    cache = directory / "evaluations.sqlite"
    first = _cache_search(bench, cache, directory)
    if not first.ok:
        tally.add(CRASHED, f"the first search: {first.tail(1)}")
        return
    for suffix in ("-wal", "-shm"):
        Path(f"{cache}{suffix}").unlink(missing_ok=True)
    _truncate(cache, 0.3)
    before = tree_digest(cache)
    second = _cache_search(bench, cache, directory)
    if second.ok:
        ok = _evaluations(second.stdout) == _evaluations(first.stdout)
        tally.add(CLEAN if ok else WRONG, "rebuilt" if ok else "values differ")
        return
    problem = error_problem(second, [cache.name])
    if problem:
        tally.add(problem[0], problem[1])
    elif digest_difference(before, tree_digest(cache)):
        tally.add(WRONG, "refused but changed the cache file")
    else:
        tally.add(CLEAN, f"refused: {second.tail(1)[:160]}")


# --------------------------------------------------------------------------------------------
# Malformed inputs: one clear line naming the input, nothing changed


@dataclasses.dataclass
class Malformed:
    """A command on a malformed input. `setup(bench, directory)` writes the input into `directory`
    (the command's working directory) and returns (arguments, names, inputs): one of `names` must
    appear in the error line, and the files below `inputs` must be unchanged afterwards."""

    id: str
    description: str
    setup: Callable[[Bench, Path], tuple[list[str], list[str], list[Path]]]
    quick: bool = False
    stdin: str | None = None
    skip_ok: bool = False
    """Exit 0 with a warning that names the file is clean too (a bad row skipped, a Latin-1 file read)."""


def _bytes_file(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    path.write_bytes(data)
    return path


NON_UTF8 = b"\xff\xfe\x00garbage \xc3\x28 \xa0\xa1\n"
LONG_FEN = "8/" * 5000  # 10,000 characters


def _copy_shard(bench: Bench, directory: Path, name: str = "shard.parquet") -> Path:
    shard = sorted((bench.labelled_data() / "train").glob("*.parquet"))[0]
    return Path(shutil.copy2(shard, directory / name))


def _copy_run(bench: Bench, directory: Path) -> Path:
    source = bench.reference("move_group")[0]
    target = directory / "run"
    shutil.copytree(source, target, symlinks=True)
    (target / ".lock").unlink(missing_ok=True)
    return target


def _train_fresh(bench: Bench, directory: Path, *extra: str) -> list[str]:
    args = bench.train_args("move_group", "fresh", *extra)
    return [a if not a.startswith("run.out_dir=") else f"run.out_dir={directory / 'runs'}" for a in args]


def _puzzles(directory: Path, bad_fen: bool = False, header: str | None = None) -> Path:
    lines = PUZZLES.read_text().splitlines()[:6]
    if bad_fen:
        fields = lines[2].split(",")
        fields[1] = "not/a/fen w - - 0 1"
        lines[2] = ",".join(fields)
    if header is not None:
        lines[0] = header
    path = directory / "puzzles.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _gz_truncated(directory: Path) -> Path:
    game = '[Event "x"]\n[White "a"]\n[Black "b"]\n[Result "1-0"]\n[WhiteElo "2000"]\n[BlackElo "2000"]\n\n1. e4 e5 2. Qh5 Nc6 3. Bc4 Nf6 4. Qxf7# 1-0\n\n'
    data = gzip.compress((game * 200).encode())
    return _bytes_file(directory, "games.pgn.gz", data[: len(data) // 2])


def _engine_eval_file(content: bytes, name: str = "positions.fen"):
    def setup(bench: Bench, directory: Path):
        path = _bytes_file(directory, name, content)
        return ["engine", "eval", "--file", path], [path.name], [path]

    return setup


def _offline_on(make: Callable[[Bench, Path], Path]):
    def setup(bench: Bench, directory: Path):
        path = make(bench, directory)
        return ["eval", "offline", "--policy", "random", "--positions", path], [path.name], [path]

    return setup


def _damaged_shard(damage: Callable[[Path, int], None]):
    def make(bench: Bench, directory: Path) -> Path:
        path = _copy_shard(bench, directory)
        damage(path, bench.seed)
        return path

    return make


def _puzzles_on(make: Callable[[Path], Path]):
    def setup(bench: Bench, directory: Path):
        path = make(directory)
        return ["eval", "puzzles", "--policy", "random", "--puzzles", path], [path.name], [path]

    return setup


def _import_pgn(make: Callable[[Path], Path]):
    def setup(bench: Bench, directory: Path):
        path = make(directory)
        return (
            [
                "data",
                "import-pgn",
                path,
                "--out",
                directory / "out",
                "--nodes",
                "50",
                "engine.processes=1",
                f"engine.syzygy_path={SYZYGY}",
            ],
            [path.name],
            [path],
        )

    return setup


def _config_file(content: bytes):
    def setup(bench: Bench, directory: Path):
        path = _bytes_file(directory, "config.yaml", content)
        return ["train", "--config", path], [path.name], [path]

    return setup


def _fresh_train(override: str, names: list[str]):
    def setup(bench: Bench, directory: Path):
        return _train_fresh(bench, directory, override), names, [directory / "runs"]

    return setup


def _run_with(damage: Callable[[Path], None], command: Callable[[Path], list], names: Callable[[Path], list[str]]):
    def setup(bench: Bench, directory: Path):
        run = _copy_run(bench, directory)
        damage(run)
        return command(run), names(run), [run]

    return setup


def _games_openings(content: bytes):
    def setup(bench: Bench, directory: Path):
        path = _bytes_file(directory, "openings.epd", content)
        return (
            [
                "eval",
                "games",
                "--checkpoint",
                bench.reference("move_group")[0],
                "--anchors",
                "random",
                "--games",
                "2",
                "--workers",
                "1",
                "--openings",
                path,
                "--pgn",
                directory / "games.pgn",
                f"engine.syzygy_path={SYZYGY}",
            ],
            [path.name],
            [path, directory / "games.pgn"],
        )

    return setup


def _checkpoint_truncated(bench: Bench, directory: Path):
    run = _copy_run(bench, directory)
    checkpoint = (run / "checkpoints" / "latest").resolve()
    _truncate(checkpoint / "model.safetensors")
    positions = _bytes_file(directory, "p.epd", f"{ITALIAN}\n".encode())
    return ["eval", "offline", "--checkpoint", checkpoint, "--positions", positions], [checkpoint.name], [run]


def _cache_not_sqlite(bench: Bench, directory: Path):
    path = _bytes_file(directory, "cache.sqlite", NON_UTF8 * 100)
    return (
        [
            "engine",
            "eval",
            "--fen",
            ITALIAN,
            "engine.processes=1",
            "engine.nodes=100",
            f"engine.cache_path={path}",
            f"engine.syzygy_path={SYZYGY}",
        ],
        [path.name],
        [path],
    )


def _truncate_every_checkpoint(run: Path) -> None:
    for weights in (run / "checkpoints").glob("step_*/model.safetensors"):
        _truncate(weights)


def _rookworld_text(bench: Bench, directory: Path):
    path = _bytes_file(directory, "rookworld.txt", NON_UTF8 * 3)
    return ["data", "rookworld", "--from-text", path, "--out", directory / "out"], [path.name], [path]


def _compare_truncated(bench: Bench, directory: Path):
    path = _bytes_file(directory, "a.json", b'{"kind": "offline", "rec')
    return ["eval", "compare", path, path], [path.name], [path]


BAD_LETTER_FEN = START_FEN.replace("RNBQKBNR", "RNBQKBNX")
LR_NAMES = ["config key lr", "lr=", "'lr'", "lr:", "lr "]

MALFORMED: list[Malformed] = [
    Malformed(
        "fen-bad",
        "engine eval --fen with an impossible piece letter",
        quick=True,
        setup=lambda b, d: (["engine", "eval", "--fen", BAD_LETTER_FEN], ["RNBQKBNX"], []),
    ),
    Malformed(
        "fen-10k",
        "engine eval --fen of 10,000 characters",
        quick=True,
        setup=lambda b, d: (["engine", "eval", "--fen", LONG_FEN], [LONG_FEN[:20]], []),
    ),
    Malformed(
        "fen-injection",
        "engine eval --fen with a UCI command after a newline",
        setup=lambda b, d: (["engine", "eval", "--fen", START_FEN + "\nquit"], [START_FEN[:20]], []),
    ),
    Malformed(
        "fen-file-non-utf8", "engine eval --file that is not UTF-8", quick=True, setup=_engine_eval_file(NON_UTF8)
    ),
    Malformed(
        "fen-file-bad-line",
        "engine eval --file with a bad FEN on line 2",
        skip_ok=True,
        setup=_engine_eval_file(f"{START_FEN}\nnot a fen\n".encode()),
    ),
    Malformed(
        "fen-file-missing",
        "engine eval --file that does not exist",
        setup=lambda b, d: (["engine", "eval", "--file", d / "missing.fen"], ["missing.fen"], []),
    ),
    Malformed(
        "positions-parquet-scrambled",
        "eval offline --positions, a scrambled Parquet shard",
        quick=True,
        setup=_offline_on(_damaged_shard(lambda p, s: _scramble(p, s))),
    ),
    Malformed(
        "positions-parquet-truncated",
        "eval offline --positions, a truncated Parquet shard",
        setup=_offline_on(_damaged_shard(lambda p, s: _truncate(p))),
    ),
    Malformed(
        "positions-epd-bad",
        "eval offline --positions, an EPD file with a bad line",
        skip_ok=True,
        setup=_offline_on(lambda b, d: _bytes_file(d, "bad.epd", f"{START_FEN}\n8/8/8/8 w - -\n".encode())),
    ),
    Malformed(
        "positions-pgn-non-utf8",
        "eval offline --positions, a PGN that is not UTF-8",
        setup=_offline_on(lambda b, d: _bytes_file(d, "games.pgn", b'[Event "\xff\xfe"]\n\n1. e4 \xa0\xa1 *\n')),
    ),
    Malformed(
        "puzzles-non-utf8",
        "eval puzzles --puzzles, a CSV that is not UTF-8",
        setup=_puzzles_on(lambda d: _bytes_file(d, "puzzles.csv", NON_UTF8 * 3)),
    ),
    Malformed(
        "puzzles-bad-fen",
        "eval puzzles --puzzles, a row with a bad FEN",
        skip_ok=True,
        setup=_puzzles_on(lambda d: _puzzles(d, bad_fen=True)),
    ),
    Malformed(
        "puzzles-wrong-columns",
        "eval puzzles --puzzles, a CSV without the puzzle columns",
        setup=_puzzles_on(lambda d: _puzzles(d, header="a,b,c,d")),
    ),
    Malformed(
        "import-pgn-non-utf8",
        "data import-pgn, a PGN that is not UTF-8 (read as Latin-1 with a warning naming it)",
        skip_ok=True,
        setup=_import_pgn(lambda d: _bytes_file(d, "games.pgn", b'[Event "\xff"]\n\n1. e4 \xa0 *\n' * 3)),
    ),
    Malformed("import-pgn-truncated-gz", "data import-pgn, a truncated .pgn.gz", setup=_import_pgn(_gz_truncated)),
    Malformed("rookworld-text-non-utf8", "data rookworld --from-text, a file that is not UTF-8", setup=_rookworld_text),
    Malformed(
        "pretrain-shard-scrambled",
        "pretrain data= with a scrambled shard",
        setup=lambda b, d: _pretrain_on_damaged(b, d, _scramble),
    ),
    Malformed(
        "pretrain-shard-truncated",
        "pretrain data= with a truncated shard",
        quick=True,
        setup=lambda b, d: _pretrain_on_damaged(b, d, lambda p, s: _truncate(p)),
    ),
    Malformed(
        "config-unknown-key",
        "train with an unknown config key",
        quick=True,
        setup=_fresh_train("task.bogus_key=1", ["task.bogus_key"]),
    ),
    Malformed("config-lr-inf", "train lr=.inf", quick=True, setup=_fresh_train("lr=.inf", LR_NAMES)),
    Malformed("config-lr-nan", "train lr=.nan", setup=_fresh_train("lr=.nan", LR_NAMES)),
    Malformed(
        "config-long-value",
        "train run.name= of 10,000 characters",
        setup=_fresh_train("run.name=" + "x" * 10000, ["run.name"]),
    ),
    Malformed(
        "config-yaml-syntax",
        "train --config with a YAML syntax error",
        setup=_config_file(b"kind: move_group\nsteps: [1,\n"),
    ),
    Malformed(
        "config-non-utf8",
        "train --config that is not UTF-8",
        setup=_config_file(b"kind: move_group\nsteps: \xff\xfe\n"),
    ),
    Malformed("config-not-a-mapping", "train --config holding a list", setup=_config_file(b"- kind\n- steps\n")),
    Malformed(
        "resume-every-checkpoint-truncated",
        "train --resume, every checkpoint truncated",
        setup=_run_with(_truncate_every_checkpoint, lambda r: ["train", "--resume", r], lambda r: [str(r)]),
    ),
    Malformed(
        "resume-config-garbage",
        "train --resume, config.yaml replaced by binary garbage",
        setup=_run_with(
            lambda r: (r / "config.yaml").write_bytes(NON_UTF8 * 4),
            lambda r: ["train", "--resume", r],
            lambda r: ["config.yaml"],
        ),
    ),
    Malformed(
        "checkpoint-truncated",
        "eval offline --checkpoint, a truncated checkpoint",
        quick=True,
        setup=_checkpoint_truncated,
    ),
    Malformed("openings-non-utf8", "eval games --openings that is not UTF-8", setup=_games_openings(NON_UTF8)),
    Malformed(
        "openings-bad-fen", "eval games --openings with a bad FEN", skip_ok=True, setup=_games_openings(b"8/8/8 w\n")
    ),
    Malformed("compare-truncated-json", "eval compare, a truncated JSON result", setup=_compare_truncated),
    Malformed(
        "diagnose-garbage-metrics",
        "diagnose, metrics.jsonl replaced by binary garbage",
        setup=_run_with(
            lambda r: (r / "metrics.jsonl").write_bytes(NON_UTF8 * 10),
            lambda r: ["diagnose", r],
            lambda r: ["metrics.jsonl"],
        ),
    ),
    Malformed(
        "report-garbage-metrics",
        "report, metrics.jsonl replaced by binary garbage",
        setup=_run_with(
            lambda r: (r / "metrics.jsonl").write_bytes(NON_UTF8 * 10),
            lambda r: ["report", r, "--out", r.parent / "report.html"],
            lambda r: ["metrics.jsonl"],
        ),
    ),
    Malformed(
        "cache-not-sqlite", "engine eval, engine.cache_path is not an SQLite file", quick=True, setup=_cache_not_sqlite
    ),
]


def _pretrain_on_damaged(bench: Bench, directory: Path, damage: Callable[[Path, int], None]):
    data = directory / "data"
    shutil.copytree(bench.labelled_data(), data)
    shard = sorted((data / "train").glob("*.parquet"))[1]
    damage(shard, bench.seed)
    args = [*bench.train_args("pretrain", "fresh", "steps=2")]
    args = [
        f"run.out_dir={directory / 'runs'}"
        if a.startswith("run.out_dir=")
        else f"data={data}"
        if a.startswith("data=")
        else a
        for a in args
    ]
    return args, [shard.name], [data, directory / "runs"]


def _malformed_case(spec: Malformed):
    def run(bench: Bench, tally: Tally, trial: int) -> None:
        directory = bench.work / "malformed" / spec.id
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        args, names, inputs = spec.setup(bench, directory)
        before, everything = tree_digest(*inputs), tree_digest(directory)
        result = bench.cli(args, cwd=directory, timeout_s=120, stdin=spec.stdin)
        problem = error_problem(result, [str(n) for n in names], skip_ok=spec.skip_ok)
        changed = digest_difference(before, tree_digest(*inputs))
        # Outputs it began (a resumable dataset directory, a cache) are no corruption: noted only.
        wrote = digest_difference(everything, tree_digest(directory)) if not changed else None
        wrote = f"; wrote {wrote.replace(str(directory) + '/', '')}" if wrote else ""
        if changed:
            tally.add(
                WRONG,
                f"input changed: {changed.replace(str(directory) + '/', '')}" + (f"; {problem[1]}" if problem else ""),
            )
        elif problem:
            tally.add(problem[0], problem[1] + wrote)
        elif result.returncode == 0:
            warning = [line for line in warning_lines(result.stderr) if any(str(n) in line for n in names)][0]
            tally.add(CLEAN, f"skipped with a warning: {warning.split(': ', 1)[-1][:160]}{wrote}")
        else:
            tally.add(CLEAN, error_line(result) + wrote)

    return run


def error_line(result: CommandResult) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("chessgrpo")]
    return lines[-1][:160] if lines else ""


for _spec in MALFORMED:
    case("malformed", f"{_spec.id}: {_spec.description}", trials=(1 if _spec.quick else 0, 1))(_malformed_case(_spec))


@case("malformed", "uci: malformed commands on stdin (the engine must answer on)", trials=(0, 1))
def malformed_uci(bench: Bench, tally: Tally, trial: int) -> None:
    commands = (
        "uci\nposition fen not/a/fen w - - 0 1\nposition startpos moves e2e5\ngo nodes -3\n"
        + "x" * 10000
        + "\nisready\nquit\n"
    )
    result = bench.cli(
        ["uci", "--checkpoint", bench.reference("move_group")[0], "--search", "none"], stdin=commands, timeout_s=60
    )
    if result.timed_out or "Traceback" in result.stderr or (result.returncode or 0) < 0:
        tally.add(CRASHED, f"{_ended(result)}: {result.tail(1)}")
    elif "readyok" not in result.stdout:
        tally.add(CRASHED, f"stopped answering (exit {result.returncode}): {result.tail(1)}")
    elif any(len(line) > 1000 for line in result.stdout.splitlines()):
        tally.add(CRASHED, "echoed the 10,000-character line")
    else:
        tally.add(CLEAN)


# --------------------------------------------------------------------------------------------
# Running and reporting


def machine() -> dict:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from chessgrpo.engine import find_stockfish
        from chessgrpo.engine.uci import UciProcess

        engine = UciProcess(find_stockfish())
        engine_name = engine.name
        engine.quit()
    except Exception as error:  # noqa: BLE001 - reported, not fatal
        engine_name = f"unavailable ({error})"
    import torch

    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "engine": engine_name,
    }


def render(tallies: Sequence[Tally], work: Path | None = None) -> str:
    """The Markdown table (paths below `work` shortened to WORK/)."""
    header = "| group | case | tried | clean | crashed | wrong | faults | s | notes |\n|---|---|---:|---:|---:|---:|---:|---:|---|"
    lines = [header]
    for t in tallies:
        notes = "; ".join(dict.fromkeys(n for n in t.notes if n))
        notes = (notes.replace(f"{work}/", "WORK/") if work else notes)[:300].replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {t.group} | {t.name} | {t.tried} | {t.clean} | {t.crashed} | {t.wrong} | {t.faults} | {t.seconds:.0f} | {notes} |"
        )
    total = {k: sum(getattr(t, k) for t in tallies) for k in ("tried", "clean", "crashed", "wrong", "faults")}
    seconds = sum(t.seconds for t in tallies)
    lines.append(
        f"| **total** | {len(tallies)} cases | {total['tried']} | {total['clean']} | {total['crashed']} | {total['wrong']} | "
        f"{total['faults']} | {seconds:.0f} | |"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short subset (~2 minutes on 2 cores)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the runs, the kill moments and the injectors")
    parser.add_argument("--out-json", type=Path, help="also write the results (with the machine and date) here")
    parser.add_argument("--only", action="append", default=[], help="run the cases whose 'group: name' contains this")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one, removed unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)

    selected = [c for c in CASES if c.trials[0 if args.quick else 1] > 0]
    if args.only:
        selected = [c for c in CASES if any(text in f"{c.group}: {c.name}" for text in args.only)]
    if args.list:
        for c in selected:
            print(f"{c.group}: {c.name}  (trials: quick {c.trials[0]}, full {c.trials[1]})")
        return 0

    # The pools this process runs itself log every injected fault; the table says what matters.
    logging.getLogger("chessgrpo").setLevel(logging.ERROR)
    work = args.work or Path(tempfile.mkdtemp(prefix="chessgrpo-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    when = datetime.datetime.now(datetime.timezone.utc)
    bench = Bench(work.resolve(), args.seed, args.quick)
    info = machine()
    progress(
        f"fault injection: {len(selected)} cases, seed {args.seed}, {'quick' if args.quick else 'full'}; work {work}"
    )
    progress(f"machine: {info['cpu']}, {info['cores']} cores, load {info['load_average']}, {info['engine']}")
    tallies = []
    try:
        for index, spec in enumerate(selected, 1):
            tally = Tally(spec.group, spec.name)
            tallies.append(tally)
            trials = max(1, spec.trials[0 if args.quick else 1])
            progress(f"[{index}/{len(selected)}] {tally.label} ({trials} trial{'s' * (trials > 1)})")
            case_started = time.monotonic()
            for trial in range(trials):
                try:
                    spec.run(bench, tally, trial)
                except Unjudgeable as error:
                    tally.add(CRASHED, str(error))
                    break
                except Exception as error:  # noqa: BLE001 - a harness failure is reported as this case's crash
                    tally.add(CRASHED, f"harness: {type(error).__name__}: {error}")
                    traceback.print_exc()
            tally.seconds = time.monotonic() - case_started
            status = (
                f"clean {tally.clean}/{tally.tried}"
                + (f", crashed {tally.crashed}" if tally.crashed else "")
                + (f", WRONG {tally.wrong}" if tally.wrong else "")
            )
            detail = f"; {tally.notes[-1][:200]}" if tally.notes and (tally.crashed or tally.wrong) else ""
            progress(f"      {status}, {tally.faults} faults injected, {tally.seconds:.1f} s{detail}")
    except KeyboardInterrupt:
        progress("interrupted: the table covers the cases run so far")
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(
        f"Fault injection, {'quick' if args.quick else 'full'} run, seed {args.seed}: {when:%Y-%m-%d %H:%M} UTC, "
        f"{elapsed / 60:.1f} minutes; {info['cpu']}, {info['cores']} cores (load {info['load_average']}); {info['engine']}, "
        f"torch {info['torch']}, Python {info['python']}\n"
    )
    print(render(tallies, bench.work))
    if args.out_json:
        args.out_json.write_text(
            json.dumps(
                {
                    "date": when.isoformat(timespec="seconds"),
                    "seconds": round(elapsed, 1),
                    "seed": args.seed,
                    "quick": args.quick,
                    "machine": info,
                    "cases": [dataclasses.asdict(t) for t in tallies],
                    "totals": {
                        k: sum(getattr(t, k) for t in tallies) for k in ("tried", "clean", "crashed", "wrong", "faults")
                    },
                },
                indent=1,
            )
        )
    return 0 if all(t.clean == t.tried for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
