"""Rollout throughput: one-move groups against multi-ply trajectories, with the phase split of a step.

    .venv/bin/python bench/rollout_throughput.py --init runs/quickstart/pretrain
    .venv/bin/python bench/rollout_throughput.py --init runs/quickstart/pretrain --settings trajectory,matched \\
        --baseline-src /path/to/older/checkout/src      # the same settings on older code, alternated

Settings (each a real `chessgrpo train` step loop, built in a fresh process, engine cache off):

- ``one_move``: configs/grpo_tiny.yaml's shape (B=32 positions x G=8 moves, 2000 reward nodes, 2 epochs of
  2 minibatches), start positions from the init's dataset (``--positions``) instead of the policy-game mixture
  (whose start-up games cost ~20 s and nothing per step); the value and bc anchors' positions from it too;
- ``trajectory``: configs/trajectory_stockfish_tiny.yaml (B=8 x G=8 games, T=4 own plies against Stockfish at
  100 nodes, engine rewards at 2000 nodes, process supervision, 2 epochs of 2 minibatches);
- ``trajectory_overlap``: ``trajectory`` with ``task.overlap_rewards: true`` (rewards searched while the rollout plays);
- ``matched``: the predecessor's setting (issue 25): B=8, G=8, T=8, the tiny 2 x 64 policy, temperature 1, one
  full-batch update per step, no reference forward (kl_coef 0), opponent and rewards at 200 nodes (Stockfish
  15.1's median node count at depth 4 on data/tiny positions: the predecessor searched to depth 4).
- ``matched_protocol``: ``matched`` with the predecessor's engine protocol too: no ``ucinewgame`` before each
  search (``engine.clear_hash: false``). python-chess's ``analyse``/``play`` with ``game=None``, as the
  predecessor calls them, send ``ucinewgame`` only before an engine's first search, so its searches keep
  their hash and history tables. Searches then depend on what the process searched before: not reproducible.

Each setting runs `--warmup` steps, then `--steps` timed steps; settings alternate within each of `--repeats`
rounds (so a slow spell of the machine hits all of them), and the table gives medians over all timed steps
of all rounds. Per step: samples (own plies) per second, the wall-clock split (the policy's part of the
rollout, waiting for the opponent, waiting for rewards, learning), and CPU seconds per sample of this
process (Python, torch, the pool's threads) and of the engine processes (from /proc). Ratios are of medians
measured in the same run. `--json FILE` writes every step.
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

ROOT = Path(__file__).resolve().parent.parent

MATCHED = [
    "eval.offline_positions=null",
    "task.positions_per_step=8",
    "task.group_size=8",
    "task.horizon=8",
    "task.temperature=1.0",
    "task.opponent_nodes=200",
    "task.reward_nodes=200",
    "grpo.kl_coef=0.0",
    "grpo.num_iterations=1",
    "grpo.minibatch_size=64",
]
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "one_move": ("configs/grpo_tiny.yaml", ["position_mixture=[]", "eval.positions=null", "eval.puzzles=null"]),
    "trajectory": ("configs/trajectory_stockfish_tiny.yaml", ["eval.offline_positions=null"]),
    "trajectory_overlap": (
        "configs/trajectory_stockfish_tiny.yaml",
        ["eval.offline_positions=null", "task.overlap_rewards=true"],
    ),
    "matched": ("configs/trajectory_stockfish_tiny.yaml", MATCHED),
    "matched_protocol": ("configs/trajectory_stockfish_tiny.yaml", [*MATCHED, "engine.clear_hash=false"]),
}
COMMON = ["engine.cache=false", "eval_at_start=false", "eval_every=0", "checkpoint_every=100000", "log_every=1"]


def _engine_cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the engine processes (seconds), from /proc (0 where unreadable)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            pass
    return total


class ModelComputeClock:
    """CPU seconds of this process spent inside the policy's forwards and the backward passes.

    The rest of a step's main-process CPU is the host's work around the network (encoding, move facts,
    FENs, legal lists, reward bookkeeping, the learner's Python): what a GPU does not take off the CPU.
    Installed by wrapping `ActionPolicy.forward` and `torch.autograd.backward` in this bench process only.
    """

    def __init__(self) -> None:
        import torch

        from chessgrpo.models.policy import ActionPolicy

        self.seconds = 0.0
        self._depth = 0
        forward, backward = ActionPolicy.forward, torch.autograd.backward

        def timed(function):
            def call(*args, **kwargs):
                if self._depth:  # nested (a forward inside a backward's hook): counted once, by the outer call
                    return function(*args, **kwargs)
                self._depth += 1
                started = time.process_time()
                try:
                    return function(*args, **kwargs)
                finally:
                    self.seconds += time.process_time() - started
                    self._depth -= 1

            return call

        ActionPolicy.forward = timed(forward)  # type: ignore[method-assign]
        torch.autograd.backward = timed(backward)


def worker(setting: str, init: str, positions: str, steps: int, warmup: int, extra: list[str]) -> list[dict]:
    """Run one setting in this process; one dict per timed step."""
    import chessgrpo
    from chessgrpo.config import load_config
    from chessgrpo.tasks.kinds import config_class
    from chessgrpo.train.loop import Trainer

    config_path, overrides = SETTINGS[setting]
    checkout = Path(chessgrpo.__file__).resolve().parents[2]  # the configs of the code under test
    with tempfile.TemporaryDirectory() as out:
        kind = "move_group" if setting == "one_move" else "trajectory"
        # one_move's value and bc anchors read labelled positions too: the same dataset (the config's data/tiny by default)
        anchors = [f"value_positions={positions}"] if kind == "move_group" else []
        options = [
            f"kind={kind}",
            f"init_checkpoint={init}",
            f"positions={positions}",
            *anchors,
            f"run.out_dir={out}",
            "run.name=bench",
            f"steps={warmup + steps}",
            *COMMON,
            *overrides,
            *extra,
        ]
        config = load_config(config_class(kind), checkout / config_path, options)
        rows = []
        clock = ModelComputeClock()
        with Trainer(config) as trainer:
            pool = trainer.kind.pool
            for step in range(warmup + steps):
                wall, cpu, compute = time.perf_counter(), time.process_time(), clock.seconds
                engine = _engine_cpu_seconds(pool.pids) if pool is not None else 0.0
                metrics = trainer.train_step()
                wall, cpu, compute = time.perf_counter() - wall, time.process_time() - cpu, clock.seconds - compute
                engine = (_engine_cpu_seconds(pool.pids) if pool is not None else 0.0) - engine
                if step < warmup:
                    continue
                samples = metrics.get(
                    "rollout/plies",
                    metrics.get("rollout/samples", float(config.task.positions_per_step * config.task.group_size)),
                )
                rows.append(
                    {
                        "setting": setting,
                        "step": step,
                        "wall_s": wall,
                        "samples": samples,
                        "main_cpu_s": cpu,
                        "model_cpu_s": compute,
                        "host_cpu_s": cpu - compute,
                        "engine_cpu_s": engine,
                        **{k: v for k, v in metrics.items() if k.startswith("perf/")},
                    }
                )
        return rows


def run_setting(
    setting: str, args: argparse.Namespace, src: Path, env_extra: dict[str, str] | None = None
) -> list[dict]:
    """`worker` in a fresh Python process importing chessgrpo from `src` (this checkout or --baseline-src),
    with `env_extra` added to its environment (a --compare-env variant)."""
    command = [
        sys.executable,
        __file__,
        "--worker",
        setting,
        "--init",
        args.init,
        "--positions",
        args.positions,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        *(f"--set={o}" for o in args.set),
    ]
    # src first; what was on PYTHONPATH (e.g. packages installed to a --target directory) stays after it.
    env = {
        **os.environ,
        **(env_extra or {}),
        "PYTHONPATH": os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p),
    }
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{setting} ({src}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(rows: list[dict], key: str, per_sample: bool = False) -> float:
    values = [row[key] / row["samples"] if per_sample else row[key] for row in rows if key in row]
    return statistics.median(values) if values else float("nan")


def cpu_ratio(rows: list[dict], baseline: list[dict], key: str, resamples: int = 2000) -> tuple[float, float, float]:
    """Median per-sample `key` of `rows` over that of `baseline`, with a percentile bootstrap 95% interval
    (steps resampled within each code)."""
    import random

    ours = [row[key] / row["samples"] for row in rows if key in row]
    theirs = [row[key] / row["samples"] for row in baseline if key in row]
    if not ours or not theirs:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(ours, k=len(ours))) / statistics.median(rng.choices(theirs, k=len(theirs)))
        for _ in range(resamples)
    )
    return (
        statistics.median(ours) / statistics.median(theirs),
        ratios[int(0.025 * resamples)],
        ratios[int(0.975 * resamples) - 1],
    )


def table(results: dict[str, list[dict]]) -> str:
    """Markdown: one line per (setting, code)."""
    head = (
        "| setting | samples/s | step s | policy s | opponent wait s | reward wait s | learn s | "
        "engine wait ms/sample | other ms/sample | main CPU ms/sample | of it model ms/sample | of it host ms/sample | "
        "engine CPU ms/sample |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, rows in results.items():
        per_s = statistics.median(row["samples"] / row["wall_s"] for row in rows)
        wait = statistics.median(
            (row.get("perf/opponent_s", 0.0) + row.get("perf/reward_s", 0.0)) / row["samples"] for row in rows
        )
        other = statistics.median(
            (row["wall_s"] - row.get("perf/opponent_s", 0.0) - row.get("perf/reward_s", 0.0)) / row["samples"]
            for row in rows
        )
        lines.append(
            f"| {name} | {per_s:.0f} | {_median(rows, 'wall_s'):.3f} | {_median(rows, 'perf/policy_s'):.3f} | "
            f"{_median(rows, 'perf/opponent_s'):.3f} | {_median(rows, 'perf/reward_s'):.3f} | {_median(rows, 'perf/learn_s'):.3f} | "
            f"{1000 * wait:.2f} | {1000 * other:.2f} | {1000 * _median(rows, 'main_cpu_s', True):.2f} | "
            f"{1000 * _median(rows, 'model_cpu_s', True):.2f} | {1000 * _median(rows, 'host_cpu_s', True):.2f} | "
            f"{1000 * _median(rows, 'engine_cpu_s', True):.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--init", default="runs/quickstart/pretrain", help="the starting policy (run or checkpoint dir)"
    )
    parser.add_argument("--positions", default="data/tiny", help="start positions (dataset dir: its train split)")
    parser.add_argument("--settings", default="one_move,trajectory", help=f"comma-separated, of {list(SETTINGS)}")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per setting and round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (allocations, engine start)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the settings alternate within each")
    parser.add_argument(
        "--baseline-src", type=Path, help="also run every setting on the chessgrpo in this src/ directory"
    )
    parser.add_argument(
        "--set", action="append", default=[], help="an extra config override for every setting (key=value)"
    )
    parser.add_argument(
        "--compare-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also run every setting of this code with KEY=VALUE in its environment, alternated "
        "(e.g. OMP_WAIT_POLICY=ACTIVE: OpenMP threads that spin; repeat for several variants)",
    )
    parser.add_argument("--json", type=Path, help="write every timed step here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.init, args.positions, args.steps, args.warmup, args.set)))
        return 0
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    codes: dict[str, tuple[Path, dict[str, str]]] = {"": (ROOT / "src", {})}
    if args.baseline_src:
        codes[" (baseline)"] = (args.baseline_src.resolve(), {})
    for assignment in args.compare_env:
        key, _, value = assignment.partition("=")
        if not key or not _:
            parser.error(f"--compare-env takes KEY=VALUE, got {assignment!r}")
        codes[f" ({assignment})"] = (ROOT / "src", {key: value})
    results: dict[str, list[dict]] = {}
    for round_ in range(args.repeats):
        for setting in settings:
            for suffix, (src, env_extra) in codes.items():
                started = time.perf_counter()
                rows = run_setting(setting, args, src, env_extra)
                results.setdefault(setting + suffix, []).extend(rows)
                print(
                    f"round {round_ + 1}/{args.repeats} {setting}{suffix}: {time.perf_counter() - started:.0f} s",
                    file=sys.stderr,
                )
    print(table(results))
    medians = {
        name: statistics.median(row["samples"] / row["wall_s"] for row in rows) for name, rows in results.items()
    }
    for suffix in codes:
        if "one_move" + suffix in medians and "trajectory" + suffix in medians:
            print(
                f"\ntrajectory / one-move samples/s{suffix}: {medians['trajectory' + suffix] / medians['one_move' + suffix]:.2f}"
            )
    for setting in settings:
        for suffix in codes:
            if not suffix:
                continue
            other = setting + suffix
            print(f"{setting}: this code / {other} samples/s: {medians[setting] / medians[other]:.2f}")
            for key in ("main_cpu_s", "host_cpu_s", "model_cpu_s"):
                ratio, low, high = cpu_ratio(results[setting], results[other], key)
                print(
                    f"{setting}: this code / {other} {key.removesuffix('_s').replace('_', ' ')} per sample: "
                    f"{ratio:.2f} [{low:.2f}, {high:.2f}]"
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
