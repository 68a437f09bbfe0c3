"""The learning curves of endgame GRPO runs as one Markdown table: held-out mate rate and DTZ-optimal rate against
steps, own plies and minutes of training (docs/results.md, "Endgames from a random network").

    .venv/bin/python scripts/endgame_curves.py runs/eg_kqk_scratch runs/eg_kqk_scratch_seed1 [--every 100]

Own plies are the rollouts' own plies summed over the steps (`rollout/plies`); minutes are the steps' summed wall
time (`perf/step_s`: rollout, rewards and learning; evaluations excluded), so a run that shared its machine reads slower
than it would alone.

Under the table, per run: the last evaluation, the mean of the last three, and the best. Report the last (or the mean
of the last few): the best is the maximum of many evaluations on the same held-out starts, and `checkpoints/best` is
chosen on those same starts, so both read high (issue 64).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from chessgrpo.train.metrics import read_metrics


def curve_rows(run_dir: Path, every: int) -> list[str]:
    """One Markdown row per held-out evaluation of `run_dir` whose step is a multiple of `every` (and the last)."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    plies = minutes = 0.0
    limit = None
    evaluations: list[tuple[int, float, float, float | None, dict]] = []
    for row in rows:
        plies += row.get("rollout/plies", 0.0)
        minutes += row.get("perf/step_s", 0.0) / 60
        limit = row.get("rollout/curriculum_max_dtz", limit)
        if "eval/mate_rate" in row:
            evaluations.append((int(row["step"]), plies, minutes, limit, row))
    if not evaluations:
        raise SystemExit(f"{run_dir}: no held-out endgame evaluation in metrics.jsonl")
    out = []
    for i, (step, own, mins, dtz, row) in enumerate(evaluations):
        if step % every and i != len(evaluations) - 1:
            continue
        mate = f"{row['eval/mate_rate']:.3f} [{row['eval/mate_rate_low']:.3f}, {row['eval/mate_rate_high']:.3f}]"
        repetition = row.get("eval/draw_threefold_repetition_rate", 0.0)
        limit_text = "-" if dtz is None or (isinstance(dtz, float) and math.isnan(dtz)) else f"{int(dtz)}"
        out.append(
            f"| {run_dir.name} | {step} | {own / 1e3:.0f}k | {mins:.1f} | {limit_text} | {mate} | "
            f"{row['eval/dtz_optimal_rate']:.3f} | {repetition:.3f} |"
        )
    return out


def last_and_best(run_dir: Path, last_few: int = 3) -> str:
    """One line: the last held-out mate rate, the mean of the last `last_few`, and the best (with its step)."""
    evaluations = [
        (int(row["step"]), row) for row in read_metrics(run_dir / "metrics.jsonl") if "eval/mate_rate" in row
    ]
    if not evaluations:
        raise SystemExit(f"{run_dir}: no held-out endgame evaluation in metrics.jsonl")
    step, last = evaluations[-1]
    tail = [row["eval/mate_rate"] for _, row in evaluations[-last_few:]]
    best_step, best = max(evaluations, key=lambda item: item[1]["eval/mate_rate"])
    return (
        f"{run_dir.name}: last (step {step}) {last['eval/mate_rate']:.3f} [{last['eval/mate_rate_low']:.3f}, "
        f"{last['eval/mate_rate_high']:.3f}]; mean of the last {len(tail)} evaluations {sum(tail) / len(tail):.3f}; "
        f"best of {len(evaluations)} (step {best_step}) {best['eval/mate_rate']:.3f}, chosen on these same held-out starts"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with metrics.jsonl)")
    parser.add_argument(
        "--every", type=int, default=100, help="show evaluations at multiples of this step (default 100)"
    )
    args = parser.parse_args()
    print(
        "| run | step | own plies | minutes | DTZ limit | held-out mate rate [95%] | DTZ-optimal | drawn by repetition |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        print("\n".join(curve_rows(run, max(args.every, 1))))
    print()
    for run in args.runs:
        print(last_and_best(run))


if __name__ == "__main__":
    main()
