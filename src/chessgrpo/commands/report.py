"""`chessgrpo report RUN_DIR [RUN_DIR ...] [--out FILE]`: an HTML report with plots and findings.

    chessgrpo report runs/quickstart/grpo                 -> runs/quickstart/grpo/report.html
    chessgrpo report runs/a runs/b --out runs/a_vs_b.html -> compares two runs (config differences too)
    chessgrpo report runs/sweep_tiny                      -> a sweep: history and importances, default vs best trial

The HTML is self-contained (the figures are embedded PNGs); the same PNGs are written beside it
(RUN_DIR/report/, or NAME/ beside --out NAME.html). Works on finished runs, runs still in
progress and pretraining runs (figures of metrics a run does not log are left out). Prints the
report's path and a one-line summary of each run's diagnosis.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="HTML report of one or more runs: plots with intervals, evaluations, findings")
    report.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="run directories (several: compared) or a sweep's study directory")
    report.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="HTML file to write (default: RUN_DIR/report.html; for several runs "
                             "compare_<names>.html beside the first)")  # fmt: skip
    report.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    from chessgrpo.track.report import build_report

    result = build_report(args.run_dirs, args.out)
    for name, findings in result.findings.items():
        counts = {s: sum(f.severity == s for f in findings) for s in ("critical", "warning", "info")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
        print(f"{name}: {summary} (details: chessgrpo diagnose)")
    print(f"{len(result.pngs)} figures in {result.pngs[0].parent if result.pngs else '-'}")
    print(f"report: {result.html}")
    return 0
