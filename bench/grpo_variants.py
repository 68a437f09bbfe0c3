"""Compare GRPO variants on the same budget, seed, start positions and held-out positions.

    .venv/bin/python bench/grpo_variants.py --init runs/quickstart/pretrain --steps 200 \
        --variant grpo --variant dr_grpo:grpo.advantage_estimator=dr_grpo ...

Each variant is `name[:key=value,key=value...]` (overrides of configs/grpo_tiny.yaml). Every run
evaluates its start and its end on the same held-out positions and puzzles; the table shows the
paired difference end - start (`chessgrpo eval compare`), plus training-side numbers: the
rollout's ESL over the first and last 20% of steps, final entropy, exact KL to the reference,
samples/s and the split of step time between sampling, rewards and learning. Prints a Markdown
table; `--json FILE` writes everything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from chessgrpo.eval.compare import compare_files  # noqa: E402
from chessgrpo.train.metrics import read_metrics  # noqa: E402

DEFAULT_VARIANTS = [
    "grpo",
    "dr_grpo:grpo.advantage_estimator=dr_grpo",
    "rloo:grpo.advantage_estimator=rloo",
    "batch_std:grpo.advantage_estimator=batch_std",
    "grpo_T1.3:task.temperature=1.3",
]


def run_variant(name: str, overrides: list[str], args: argparse.Namespace) -> dict:
    run_dir = Path(args.out) / name
    if not (run_dir / "checkpoints" / "latest").exists():
        command = [
            str(ROOT / ".venv" / "bin" / "chessgrpo"),
            "train",
            "--config",
            args.config,
            f"init_checkpoint={args.init}",
            f"run.out_dir={args.out}",
            f"run.name={name}",
            f"steps={args.steps}",
            f"eval_every={args.steps}",
            f"run.seed={args.seed}",
            *args.common,
            *overrides,
        ]
        started = time.perf_counter()
        done = subprocess.run(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"variant {name} failed ({done.returncode}); run it by hand: {' '.join(command)}")
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    rows = [row for row in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in row]
    fifth = max(1, len(rows) // 5)
    mean = lambda rs, key: statistics.mean(r[key] for r in rs if key in r)  # noqa: E731
    offline = compare_files(
        run_dir / "eval" / "step_000000_offline.json", run_dir / "eval" / f"step_{args.steps:06d}_offline.json"
    )
    puzzles = compare_files(
        run_dir / "eval" / "step_000000_puzzles.json", run_dir / "eval" / f"step_{args.steps:06d}_puzzles.json"
    )
    return {
        "name": name,
        "overrides": overrides,
        "offline": offline.to_json(),
        "puzzles": puzzles.to_json(),
        "rollout_esl_first": mean(rows[:fifth], "reward/esl"),
        "rollout_esl_last": mean(rows[-fifth:], "reward/esl"),
        "entropy_last": mean(rows[-fifth:], "entropy/mean"),
        "kl_exact_last": mean(rows[-fifth:], "kl/exact"),
        "clip_frac": mean(rows, "ratio/clip_frac"),
        "frac_reward_zero_std": mean(rows, "rollout/frac_reward_zero_std"),
        "samples_per_s": statistics.median(r["perf/samples_per_s"] for r in rows),
        "phase_s": {
            phase: statistics.median(r[f"perf/{phase}_s"] for r in rows) for phase in ("sample", "reward", "learn")
        },
    }


def _cell(metric: dict) -> str:
    d = metric["difference"]
    return f"{d['value']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--init", required=True, help="pretrained checkpoint or run directory every variant starts from"
    )
    parser.add_argument("--config", default="configs/grpo_tiny.yaml")
    parser.add_argument(
        "--out", default="runs/bench_grpo", help="parent directory of the variants' runs (reused if present)"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--variant", action="append", help="name[:key=value,...]; repeat (default: estimators and temperature)"
    )
    parser.add_argument("--common", nargs="*", default=[], help="overrides applied to every variant")
    parser.add_argument("--json", type=Path, help="write all results here")
    args = parser.parse_args()

    results = []
    for spec in args.variant or DEFAULT_VARIANTS:
        name, _, rest = spec.partition(":")
        results.append(run_variant(name, [item for item in rest.split(",") if item], args))
    print(
        "| variant | held-out ESL end - start [95%] | top-1 end - start | puzzle first move end - start | rollout ESL first -> last | entropy | KL(ref) | samples/s | sample / reward / learn s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        phases = " / ".join(f"{r['phase_s'][p]:.2f}" for p in ("sample", "reward", "learn"))
        print(
            f"| {r['name']} | {_cell(r['offline']['metrics']['esl'])} | {_cell(r['offline']['metrics']['top1'])} | "
            f"{_cell(r['puzzles']['metrics']['first_move_accuracy'])} | {r['rollout_esl_first']:.3f} -> {r['rollout_esl_last']:.3f} | "
            f"{r['entropy_last']:.2f} | {r['kl_exact_last']:.3f} | {r['samples_per_s']:.0f} | {phases} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
