"""`chessgrpo diagnose RUN_DIR [--json]`: why is this run not learning?

    chessgrpo diagnose runs/quickstart/grpo
    chessgrpo diagnose runs/quickstart/grpo --json

Reads RUN_DIR (config.yaml, metrics.jsonl, eval/*.json), also while the run is still going, and
prints one block per finding, critical first: what is wrong, the evidence (numbers and steps) and
what to change. `--json` prints ``{"findings": [{"id", "severity", "message", "evidence",
"advice"}]}``. The exit code is 0 whatever is found (2 when RUN_DIR is not a run). The checks
and their thresholds: `chessgrpo.track.diagnose` and docs/diagnose.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    diagnose = commands.add_parser(
        "diagnose", help="find why a run is not learning (ratio, loss budget, KL, entropy, signal, ...)"
    )
    diagnose.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a training run directory (finished or still running)"
    )
    diagnose.add_argument("--json", action="store_true", help='print {"findings": [...]} as JSON instead of text')
    diagnose.set_defaults(handler=run_diagnose)


def run_diagnose(args: argparse.Namespace) -> int:
    from chessgrpo.track.diagnose import diagnose, format_findings
    from chessgrpo.track.run_data import load_run

    run = load_run(args.run_dir)
    findings = diagnose(run)
    if args.json:
        print(json.dumps({"findings": [f.to_json() for f in findings]}, indent=1))
    else:
        steps = [row["step"] for row in run.rows]
        where = f"{args.run_dir} ({run.kind}, {len(run.train_rows)} training rows"
        where += f", steps {steps[0]}-{steps[-1]})" if steps else ")"
        print(format_findings(findings, where))
    return 0
