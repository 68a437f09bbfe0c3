"""`chessgrpo summary RUN_DIR`: did the run get stronger, by how much, and what to run next, in one screen.

    chessgrpo summary runs/quickstart/grpo    # what `make run` prints last

It prints the HTML report's verdict (`track.report_verdict`) as text, from the evaluations already written
under RUN_DIR/eval/: games against the run's start and every other anchor, the in-run held-out evaluations
(first against last, paired), the training trend, puzzles through a search, the value head, what was not
measured. Nothing is played or searched again, so it takes a second.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    summary = commands.add_parser(
        "summary", help="one screen: did the run get stronger (games, puzzles, value, with intervals) and what next"
    )
    summary.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a training run directory with evaluations under eval/"
    )
    summary.set_defaults(handler=run_summary)


LM_COMMAND = (
    "chessgrpo data rookworld --out data/rw40k --positions 40000 --nodes 200 && "
    "chessgrpo sft --config configs/rookworld_sft_tiny.yaml data=data/rw40k threads=2"
)
"""The chess LM's SFT as docs/results.md measured it (greedy well-formed P: ~0.96 in ~20 min on 2 idle cores), its data
made first (not shipped; a dataset already complete is skipped)."""


def next_steps(run_dir: Path) -> list[tuple[str, str]]:
    """The commands a newcomer runs after this one: play or analyse with the network, a stronger model, the chess LM.
    Each runs as printed on a fresh clone (the LM's data first: it is not shipped)."""
    return [
        ("play or analyse with it (a UCI engine):", f"chessgrpo uci --checkpoint {run_dir}"),
        ("a stronger model (~45 min of training on 2 cores):", "make recipe    (docs/training.md#recipes-make-recipe)"),
        ("the chess language model (~25-35 min):", LM_COMMAND),
        ("why a run is (not) learning:", f"chessgrpo diagnose {run_dir}"),
    ]


def environment_hint() -> str | None:
    """A line saying how to reach `chessgrpo` when it is not on PATH (the project's .venv not activated), else None."""
    import shutil
    import sys

    if shutil.which("chessgrpo") is not None:
        return None
    venv = Path(sys.prefix)
    try:
        venv = venv.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"(`chessgrpo` is not on PATH: run `source {venv}/bin/activate` first, or call {venv}/bin/chessgrpo)"


def run_summary(args: argparse.Namespace) -> int:
    from chessgrpo.track.report_verdict import run_verdict, verdict_text
    from chessgrpo.track.run_data import load_run

    if not args.run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {str(args.run_dir)!r}")
    run = load_run(args.run_dir)
    print(verdict_text(run, run_verdict(run), next_steps(args.run_dir)))
    hint = environment_hint()
    if hint is not None:
        print(hint)
    return 0
