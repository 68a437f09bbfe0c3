"""scripts/endgame_curves.py reports the last evaluation beside the best, and says where the best was chosen (issue 64:
a best-of-many figure on the same held-out starts is not the result)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO_ROOT


def test_the_curves_report_the_last_evaluation_beside_the_best(tmp_path: Path) -> None:
    run = tmp_path / "eg_run"
    run.mkdir()
    rates = {50: 0.40, 100: 0.915, 150: 0.83, 200: 0.805}
    rows = []
    for step in range(1, 201):
        row = {"step": step, "time": float(step), "rollout/plies": 1000.0, "perf/step_s": 3.0}
        if step in rates:
            rate = rates[step]
            row |= {
                "eval/mate_rate": rate,
                "eval/mate_rate_low": rate - 0.05,
                "eval/mate_rate_high": rate + 0.04,
                "eval/dtz_optimal_rate": 0.5,
                "eval/draw_threefold_repetition_rate": 1 - rate,
            }
        rows.append(json.dumps(row))
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "endgame_curves.py"), str(run), "--every", "50"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| eg_run | 200 | 200k | 10.0 | - | 0.805 [0.755, 0.845] |" in out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("eg_run: last (step 200) 0.805 [0.755, 0.845]")
    assert "mean of the last 3 evaluations 0.850" in summary
    assert "best of 4 (step 100) 0.915, chosen on these same held-out starts" in summary
