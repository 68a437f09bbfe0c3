"""Serial against pipelined GRPO steps (`grpo.pipeline`): step rate and reward statistics, alternated in one process.

    .venv/bin/python bench/grpo_pipeline.py --init runs/quickstart/pretrain
    .venv/bin/python bench/grpo_pipeline.py --settings one_move_1x1 --blocks 10 --block-steps 4 --json out.json

Settings (each a real `chessgrpo train` step loop; engine cache off, no evaluation):

- ``one_move_1x1``: configs/grpo_tiny.yaml's shape (B=32 x G=8, 2000 reward nodes, 2 epochs of 2 minibatches, value
  loss on data/tiny), start positions from ``--positions`` instead of the policy-game mixture, with one torch thread
  and one engine process: on 2 cores, each side its own core;
- ``one_move``: the same as shipped (threads: 0, engine.processes: 0 = one per core);
- ``trajectory_1x1``: configs/trajectory_stockfish_tiny.yaml (B=8 x G=8 games, T=4 plies against Stockfish at 100
  nodes, engine rewards at 2000 nodes), one torch thread and one engine process;
- ``trajectory``: the same as shipped.

For each setting one process builds two trainers from the same config and seed, serial (``grpo.pipeline: false``)
and pipelined (``true``), runs `--warmup` steps of each, then `--blocks` rounds, each a block of `--block-steps`
steps of the serial trainer and then of the pipelined one (ABAB...). A pipelined block's time includes waiting
for the rollout it started at its last step, so each block does exactly `--block-steps` rollouts and updates and
nothing runs in the background while the other trainer is timed. Per setting and mode: the median step time
over blocks (a bootstrap 95% interval, resampling blocks), the step rate, the phase split, and the mean training
reward over the timed steps (a bootstrap interval over steps): both modes play the same positions from the same
seed, so the rewards must agree within their noise. ``pipelined / serial`` is the ratio of the median step rates,
with a bootstrap interval. `--json FILE` writes every block and step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ONE_MOVE = ("configs/grpo_tiny.yaml", "move_group", ["position_mixture=[]", "eval.positions=null", "eval.puzzles=null"])
TRAJECTORY = ("configs/trajectory_stockfish_tiny.yaml", "trajectory", ["eval.offline_positions=null"])
ONE_BY_ONE = ["threads=1", "engine.processes=1"]
SETTINGS: dict[str, tuple[str, str, list[str]]] = {
    "one_move_1x1": (ONE_MOVE[0], ONE_MOVE[1], [*ONE_MOVE[2], *ONE_BY_ONE]),
    "one_move": ONE_MOVE,
    "trajectory_1x1": (TRAJECTORY[0], TRAJECTORY[1], [*TRAJECTORY[2], *ONE_BY_ONE]),
    "trajectory": TRAJECTORY,
}
COMMON = [
    "engine.cache=false",
    "eval_at_start=false",
    "eval_every=0",
    "checkpoint_every=100000",
    "log_every=1",
    "steps=100000",
]
MODES = ("serial", "pipelined")


def worker(setting: str, args: argparse.Namespace) -> dict:
    """Both trainers of one setting in this process, alternated; every block and step."""
    from chessgrpo.config import load_config
    from chessgrpo.tasks.kinds import config_class
    from chessgrpo.train.loop import Trainer

    config_path, kind, overrides = SETTINGS[setting]
    out: dict = {"setting": setting, "blocks": {mode: [] for mode in MODES}, "steps": {mode: [] for mode in MODES}}
    with tempfile.TemporaryDirectory() as directory:
        trainers = {}
        try:
            for mode in MODES:
                options = [
                    f"init_checkpoint={args.init}",
                    f"positions={args.positions}",
                    f"run.out_dir={directory}",
                    f"run.name={mode}",
                    *COMMON,
                    *overrides,
                    f"grpo.pipeline={str(mode == 'pipelined').lower()}",
                    *args.set,
                ]
                trainers[mode] = Trainer(load_config(config_class(kind), ROOT / config_path, options))
            for trainer in trainers.values():
                for _ in range(args.warmup):
                    trainer.train_step()
            for _ in range(args.blocks):
                for mode, trainer in trainers.items():
                    tick = time.perf_counter()
                    rows = [trainer.train_step() for _ in range(args.block_steps)]
                    trainer.kind.wait_for_rollout()  # the rollout its last step started belongs to this block's work
                    wall = time.perf_counter() - tick
                    samples = sum(row.get("rollout/plies", row.get("learn/rows", 0.0)) for row in rows)
                    out["blocks"][mode].append({"wall_s": wall, "steps": len(rows), "samples": samples})
                    out["steps"][mode].extend(
                        {k: v for k, v in row.items() if k.startswith(("perf/", "reward/", "ratio/"))} for row in rows
                    )
        finally:
            for trainer in trainers.values():
                trainer.close()
    return out


def bootstrap(values: list[float], statistic, resamples: int, rng: random.Random) -> tuple[float, float]:
    """A percentile bootstrap 95% interval of `statistic` over `values`."""
    draws = sorted(statistic([rng.choice(values) for _ in values]) for _ in range(resamples))
    return draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]


def summarise(result: dict, resamples: int, seed: int) -> tuple[list[str], dict]:
    """Markdown rows (one per mode) and the pipelined / serial ratio of one setting."""
    rng = random.Random(seed)
    lines, rates = [], {}
    for mode in MODES:
        blocks, steps = result["blocks"][mode], result["steps"][mode]
        step_s = [b["wall_s"] / b["steps"] for b in blocks]
        rate = [b["samples"] / b["wall_s"] for b in blocks]
        rates[mode] = rate
        low, high = bootstrap(step_s, statistics.median, resamples, rng)
        rewards = [s["reward/mean"] for s in steps if "reward/mean" in s]
        r_low, r_high = bootstrap(rewards, statistics.fmean, resamples, rng)

        def phase(key: str, steps: list[dict] = steps) -> float:
            return statistics.median(s.get(key, 0.0) for s in steps)

        lines.append(
            f"| {result['setting']} | {mode} | {statistics.median(step_s):.3f} [{low:.3f}, {high:.3f}] | {statistics.median(rate):.0f} | "
            f"{phase('perf/sample_s'):.3f} | {phase('perf/reward_s'):.3f} | {phase('perf/learn_s'):.3f} | {phase('perf/rollout_wait_s'):.3f} | "
            f"{statistics.fmean(rewards):.4f} [{r_low:.4f}, {r_high:.4f}] |"
        )
    ratio = statistics.median(rates["pipelined"]) / statistics.median(rates["serial"])
    draws = sorted(
        statistics.median([rng.choice(rates["pipelined"]) for _ in rates["pipelined"]])
        / statistics.median([rng.choice(rates["serial"]) for _ in rates["serial"]])
        for _ in range(resamples)
    )
    return lines, {"ratio": ratio, "low": draws[int(0.025 * resamples)], "high": draws[int(0.975 * resamples) - 1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--init", default="runs/quickstart/pretrain", help="the starting policy (run or checkpoint dir)"
    )
    parser.add_argument("--positions", default="data/tiny", help="start positions (dataset dir: its train split)")
    parser.add_argument(
        "--settings",
        default="one_move_1x1,trajectory_1x1,one_move,trajectory",
        help=f"comma-separated, of {list(SETTINGS)}",
    )
    parser.add_argument(
        "--blocks", type=int, default=8, help="rounds; each times a block of each mode (serial, then pipelined)"
    )
    parser.add_argument("--block-steps", type=int, default=3, help="steps per block")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each mode first")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument(
        "--set", action="append", default=[], help="an extra config override for every setting (key=value)"
    )
    parser.add_argument("--json", type=Path, help="write every block and step here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return 0
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    head = (
        "| setting | mode | step s, median [95%] | samples/s | sample s | reward s | learn s | rollout wait s | "
        "training reward, mean [95%] |"
    )
    lines, ratios, results = [head, "|" + "---|" * (head.count("|") - 1)], [], {}
    for setting in settings:
        started = time.perf_counter()
        command = [
            sys.executable,
            __file__,
            "--worker",
            setting,
            "--init",
            args.init,
            "--positions",
            args.positions,
            "--blocks",
            str(args.blocks),
            "--block-steps",
            str(args.block_steps),
            "--warmup",
            str(args.warmup),
            *(f"--set={o}" for o in args.set),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p),
        }
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{setting} failed:\n{done.stderr[-3000:]}")
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])
        rows, ratio = summarise(results[setting], args.resamples, seed=len(ratios))
        lines += rows
        ratios.append(
            f"{setting}: pipelined / serial step rate {ratio['ratio']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
        )
        print(f"{setting}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print("\n".join(lines) + "\n\n" + "\n".join(ratios))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
