"""`chessgrpo sweep`: hyperparameter search with Optuna over training runs of any kind (docs/sweep.md).

    chessgrpo sweep --config configs/sweep_tiny.yaml [run.out_dir=DIR] [sweep.budget.trials=4]
    chessgrpo sweep --summary runs/sweep_tiny [--remeasure]
    chessgrpo sweep --summary postgresql://host/db --study-name NAME

The first form runs (or, rerun, continues) the study: one line per finished trial (its parameters,
then its value with the interval, "pruned (...)" or "failed: reason"), then the summary. Overrides
``sweep.<key>=...`` set keys of the sweep file, every other ``key=value`` is applied to each trial's
run config after the sweep's own `overrides`. The second form prints the best trials with their
held-out metrics and intervals and the parameter importances, writes the best trial's config as
``<study_dir>/best_config.yaml`` (for `chessgrpo train --config`), and with ``--remeasure``
evaluates the best trial against the default one on positions and puzzles no trial saw.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chessgrpo.commands.common import add_config_arguments, progress_bar
from chessgrpo.config import ConfigError


def add_parser(commands: argparse._SubParsersAction) -> None:
    sweep = commands.add_parser(
        "sweep", help="hyperparameter search with Optuna over training runs (resumable, prunes on held-out metrics)"
    )
    add_config_arguments(sweep)
    sweep.add_argument(
        "--summary",
        metavar="STUDY",
        default=None,
        help="summarise a study (its directory, or an Optuna storage URL) instead of running one",
    )
    sweep.add_argument("--study-name", default=None, help="--summary: the study, when the storage holds several")
    sweep.add_argument("--top", type=int, default=5, help="--summary: best trials listed (default 5)")
    sweep.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="--summary: where best_config.yaml and remeasure/ go (default: the study directory)",
    )
    sweep.add_argument(
        "--remeasure",
        action="store_true",
        help="--summary: the best trial against the default trial on positions and puzzles no trial was evaluated on",
    )
    sweep.add_argument(
        "--remeasure-positions",
        default=None,
        metavar="SOURCE",
        help="positions for --remeasure (dataset dir, .parquet, .epd/.fen/.txt, .pgn); default: the trials' own "
        "source minus the positions they saw",
    )
    sweep.add_argument(
        "--remeasure-puzzles",
        default=None,
        metavar="CSV",
        help="Lichess puzzle CSV for --remeasure (default: the trials' own minus those they saw)",
    )
    sweep.add_argument(
        "--remeasure-trial",
        type=int,
        default=None,
        metavar="N",
        help="--remeasure: re-measure complete trial N against the default instead of the best (e.g. the runner-up when the default won)",
    )
    sweep.add_argument(
        "--remeasure-max",
        type=int,
        default=500,
        metavar="N",
        help="positions and puzzles re-measured, each (default 500)",
    )
    sweep.add_argument("--json", action="store_true", help="--summary: print the summary as JSON")
    sweep.set_defaults(handler=run_sweep_command)


def print_trial(trial: Any) -> None:
    """The line of a finished trial (module-level: the worker processes of a parallel sweep call it too)."""
    from chessgrpo.sweep.summary import trial_line

    print(trial_line(trial), flush=True)


@contextlib.contextmanager
def _trial_progress(name: str, initial: int, total: int) -> Iterator[Any]:
    with progress_bar(total, name, "step", initial=initial) as bar:

        def advance(step: int, row: dict | None) -> None:
            bar.update(step - bar.n)

        yield advance


def run_sweep_command(args: argparse.Namespace) -> int:
    if args.summary is not None:
        if args.config is not None or args.overrides:
            raise ConfigError(
                "--summary reads a finished or running study: do not pass --config or key=value overrides with it"
            )
        return _summary(args)
    if args.remeasure or args.remeasure_trial is not None:
        raise ConfigError("--remeasure and --remeasure-trial go with --summary STUDY")
    if args.config is None:
        raise ConfigError(
            "give a sweep file (chessgrpo sweep --config SWEEP.yaml) or a study to summarise (--summary STUDY)"
        )
    from chessgrpo.sweep.config import load_sweep
    from chessgrpo.sweep.storage import redacted
    from chessgrpo.sweep.study import run_sweep
    from chessgrpo.sweep.summary import load_study

    sweep = load_sweep(args.config, args.overrides)
    config = sweep.config
    objective = config.objective
    print(f"study {sweep.study_name} ({redacted(sweep.storage)}); trial runs under {sweep.study_dir}")
    print(
        f"objective: {objective.metric} {'at the last evaluation' if objective.measure == 'final' else 'change from step 0'}, "
        f"{objective.direction}; sampler {config.sampler.name}, pruner {config.pruner.name}; this invocation: "
        f"{config.budget.trials} trials{f', {config.parallel} at once' if config.parallel > 1 else ''}"
        f"{f', no new trial after {config.budget.timeout_s:g} s' if config.budget.timeout_s else ''}"
    )
    run = run_sweep(sweep, on_trial=print_trial, progress=_trial_progress if config.parallel == 1 else None)
    if run.stop_reason:
        print(f"stopped: {run.stop_reason}")
    study = load_study(sweep.storage, sweep.study_name)
    _print_summary(study, args.top, out=None)
    print(f"continue the study: chessgrpo sweep --config {shlex.join([str(args.config), *args.overrides])}")
    return run.exit_code


def _print_summary(study: Any, top: int, out: Path | None, remeasuring: bool = False) -> Any:
    from chessgrpo.sweep.summary import format_summary, summarize, write_best_config

    summary = summarize(study)
    for line in format_summary(summary, top):
        print(line)
    if summary.best is not None and (out or summary.study_dir):
        path = write_best_config(summary, out)
        print(f"best config: {path} (chessgrpo train --config {path})")
        target = summary.study_dir or out
        if summary.default is not None and summary.best is not summary.default and not remeasuring:
            print(
                f"the best value is optimistic (selected on the same positions); check it on unseen ones: "
                f"chessgrpo sweep --summary {target} --remeasure"
            )
        if summary.study_dir is not None:
            print(f"report: chessgrpo report {summary.study_dir}")
    return summary


def _summary(args: argparse.Namespace) -> int:
    from chessgrpo.eval.compare import format_comparison
    from chessgrpo.sweep.summary import load_study, remeasure, summarize, write_best_config

    if args.remeasure_trial is not None:
        args.remeasure = True
    study = load_study(args.summary, args.study_name)
    if args.json:
        summary = summarize(study)
        payload = summary.to_json()
        if summary.best is not None and (args.out or summary.study_dir):
            payload["best_config"] = str(write_best_config(summary, args.out))
        if args.remeasure:
            payload["remeasure"] = remeasure(
                summary,
                positions=args.remeasure_positions,
                puzzles=args.remeasure_puzzles,
                max_items=args.remeasure_max,
                out_dir=args.out,
                trial=args.remeasure_trial,
            ).to_json()
        print(json.dumps(payload, indent=1))
        return 0
    summary = _print_summary(study, args.top, args.out, remeasuring=args.remeasure)
    if not args.remeasure:
        return 0
    best, default = summary.best, summary.default
    if args.remeasure_trial is None and best is not None and default is not None and best.number == default.number:
        print(
            f"re-measure: the best trial is the default trial {default.number}; the search found nothing better on its own objective "
            f"(--remeasure-trial N re-measures another complete trial against it)"
        )
        return 0
    result = remeasure(
        summary,
        positions=args.remeasure_positions,
        puzzles=args.remeasure_puzzles,
        max_items=args.remeasure_max,
        out_dir=args.out,
        trial=args.remeasure_trial,
    )
    which = "best trial" if args.remeasure_trial is None else "trial"
    print(
        f"re-measured: {which} {result.best} (B) against the default trial {result.default} (A) on items no trial was evaluated on"
    )
    for note in result.notes:
        print(f"  {note}")
    for comparison in result.comparisons:
        print(format_comparison(comparison))
    print(f"results: {result.path}")
    return 0
