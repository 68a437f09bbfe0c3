"""`chessgrpo report RUN_DIR [RUN_DIR ...] [--out FILE] [--static] [--no-png]`: an HTML report with plots and findings.

    chessgrpo report runs/quickstart/grpo                 -> runs/quickstart/grpo/report.html
    chessgrpo report runs/a runs/b --out runs/a_vs_b.html -> compares two runs on shared axes (config differences too)
    chessgrpo report runs/sweep_tiny                      -> a sweep: history and importances, default vs best trial
    chessgrpo report runs/quickstart/grpo --static        -> figures as embedded PNGs instead of plotly charts

The HTML is self-contained: interactive plotly charts with plotly.js embedded once (no network
needed to view it), or, with --static, CHESSGRPO_REPORT_STATIC=1 or without plotly installed,
the figures as embedded PNGs. The PNGs are also written beside it (RUN_DIR/report/, or NAME/
beside --out NAME.html; --no-png skips them for the interactive report). Works on finished runs,
runs still in progress and pretraining runs (figures of metrics a run does not log are left out;
panels whose series are all constant are listed, not drawn). Shows game evaluations found in
RUN_DIR/eval/ (`chessgrpo eval games ... output=RUN_DIR/eval/games_step_N.json`). The report opens
with its verdict: did the run get stronger than its start (games, Elo with its interval), against
which opponents, with links to the games' PGN. Prints each run's verdict headline, a one-line
summary of each run's diagnosis and the report's path. docs/report.md describes it all.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report", help="HTML report of one or more runs: plots with intervals, evaluations, games, findings"
    )
    report.add_argument(
        "run_dirs",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="run directories (several: drawn on shared axes and compared) or a sweep's study directory",
    )
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="HTML file to write (default: RUN_DIR/report.html; for several runs "
        "compare_<names>.html beside the first)",
    )
    report.add_argument(
        "--static",
        action="store_true",
        help="figures as embedded PNGs (matplotlib) instead of interactive plotly charts",
    )
    report.add_argument("--no-png", action="store_true", help="do not write the PNG files beside an interactive report")
    report.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    from chessgrpo.track.report import build_report

    result = build_report(args.run_dirs, args.out, interactive=False if args.static else None, pngs=not args.no_png)
    for name, verdict in result.verdicts.items():
        print(f"{name}: {verdict.headline}")
    for name, findings in result.findings.items():
        counts = {s: sum(f.severity == s for f in findings) for s in ("critical", "warning", "info")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
        print(f"{name}: {summary} (details: chessgrpo diagnose)")
    kind = "interactive (plotly)" if result.interactive else "static (embedded PNGs)"
    print(f"{len(result.figures)} figures, {kind}; PNGs: {result.pngs[0].parent if result.pngs else 'none written'}")
    if result.dropped:
        print("constant, not drawn: " + "; ".join(d.describe() for d in result.dropped))
    print(f"report: {result.html}")
    return 0
