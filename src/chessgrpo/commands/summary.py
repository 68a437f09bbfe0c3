"""`chessgrpo summary RUN_DIR`: did the run get stronger, by how much, and what to run next, in one screen.

    chessgrpo summary runs/quickstart/grpo    # what `make run` prints last

It reads the evaluations already written under RUN_DIR/eval/ (`track.outcome`): games against the
run's start and other anchors, the in-run puzzle evaluations (first against last, paired), the value
head, puzzles through a search. Nothing is played or searched again, so it takes a second.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    summary = commands.add_parser("summary", help="one screen: did the run get stronger (games, puzzles, value, with intervals) and what next")
    summary.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a training run directory with evaluations under eval/")
    summary.set_defaults(handler=run_summary)


def next_steps(run_dir: Path) -> list[tuple[str, str]]:
    """The commands a newcomer runs after this one: play or analyse with the network, a stronger model, the chess LM."""
    return [
        ("play or analyse with it (a UCI engine):", f"chessgrpo uci --checkpoint {run_dir}"),
        ("a stronger model (~45 min of training on 2 cores):", "make recipe    (docs/training.md#recipes-make-recipe)"),
        ("the chess language model (~20 min):", "chessgrpo train --config configs/rookworld_sft_tiny.yaml"),
        ("why a run is (not) learning:", f"chessgrpo diagnose {run_dir}"),
    ]


def run_summary(args: argparse.Namespace) -> int:
    from chessgrpo.track.outcome import format_outcome, run_outcome

    outcome = run_outcome(args.run_dir)
    report = args.run_dir / "report.html"
    print(format_outcome(outcome, report=report if report.exists() else None, next_steps=next_steps(args.run_dir)))
    return 0
