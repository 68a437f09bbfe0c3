"""CPU scaling of the training spine: 1 process vs N torchrun processes, same machine, same run.

For each kind measured (one-move GRPO on the quickstart's positions, supervised pretraining of the
tiny policy) the same experiment runs on 1 process and on N processes (torchrun, gloo), alternated
`--repeats` times so drift of the machine hits both. The figure is each run's median of
``perf/samples_per_s`` over its steps after `--skip` warm-up steps (global samples per second: every
rank's samples over the step time); the table gives the median over repeats and the ratio N/1.

    .venv/bin/python bench/data_parallel.py --nproc 2 --repeats 3

On one machine the 1-process run gets every core (torch threads and engine processes = cores), and
each of the N ranks gets cores / N of them, so the comparison is at equal hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from chessgrpo.engine.pool import available_cores  # noqa: E402

KINDS = {
    "move_group": [
        "train",
        "--config",
        "configs/grpo_tiny.yaml",
        "init_checkpoint=null",
        "positions=data/tiny",
        "position_mixture=[]",
        "eval.positions=null",
        "eval.puzzles=null",
        "eval_at_start=false",
        "eval_every=0",
        "task.best_move_values=false",
        "engine.cache=false",
        "checkpoint_every=0",
        "task.positions_per_step=32",
        "task.group_size=8",
        "value_loss_weight=0",
        "value_positions=null",
        "bc_loss_weight=0",
    ],
    "pretrain": [
        "pretrain",
        "--config",
        "configs/pretrain_tiny.yaml",
        "eval_every=0",
        "checkpoint_every=0",
        "batch_size=256",
    ],
}


def one_run(kind: str, nproc: int, steps: int, skip: int, out: Path, name: str) -> float:
    cores = available_cores()
    args = [*KINDS[kind], f"run.out_dir={out}", f"run.name={name}", f"steps={steps}", "log_every=1"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // nproc))}
    if nproc == 1:
        command = [sys.executable, "-m", "chessgrpo", *args, f"threads={cores}"]
        if kind == "move_group":
            command.append(f"engine.processes={cores}")
    else:  # threads=0 and engine.processes=0: each rank takes cores / LOCAL_WORLD_SIZE
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "chessgrpo",
            *args,
            "threads=0",
        ]
        if kind == "move_group":
            command.append("engine.processes=0")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kind} on {nproc} process(es) failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    values = [r["perf/samples_per_s"] for r in rows if "perf/samples_per_s" in r and r["step"] > skip]
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps left out of each run's median")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    args = parser.parse_args()
    print(
        f"{available_cores()} cores; {args.repeats} alternated repeats of {args.steps} steps (first {args.skip} skipped)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for kind in args.kinds:
            results: dict[int, list[float]] = {1: [], args.nproc: []}
            for repeat in range(args.repeats):
                for nproc in (1, args.nproc):
                    tick = time.perf_counter()
                    value = one_run(kind, nproc, args.steps, args.skip, out, f"{kind}_{nproc}_{repeat}")
                    results[nproc].append(value)
                    print(
                        f"  {kind} nproc={nproc} repeat {repeat}: {value:.1f} samples/s ({time.perf_counter() - tick:.0f} s wall)"
                    )
            one, many = statistics.median(results[1]), statistics.median(results[args.nproc])
            ratios = [b / a for a, b in zip(results[1], results[args.nproc])]
            print(
                f"{kind}: 1 process {one:.1f} samples/s, {args.nproc} processes {many:.1f} samples/s, "
                f"ratio {many / one:.2f} (per-repeat ratios {', '.join(f'{r:.2f}' for r in ratios)})"
            )


if __name__ == "__main__":
    main()
