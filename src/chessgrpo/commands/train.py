"""`chessgrpo train`: GRPO of the action policy on one-move groups with engine rewards.

    chessgrpo train --config configs/grpo_tiny.yaml [key=value ...]
    chessgrpo train --resume runs/grpo_tiny [steps=400 ...]

The config's top-level `kind` picks the trainer (`TRAINERS`): `move_group` (one-move groups,
the default). Each trainer module exposes `CONFIG_CLASS`, `TRAINER_CLASS` and `RESUMABLE_KEYS`.

The run starts from `init_checkpoint` (a checkpoint or a pretraining run directory), which is also
the frozen KL reference, or from scratch when it is null. A fresh run refuses a run directory that
already has checkpoints; `--resume` continues from the latest checkpoint with RUN_DIR/config.yaml,
changing only `chessgrpo.train.grpo.RESUMABLE_KEYS`. Ctrl-C finishes the step, checkpoints and
exits with 130. The progress bar shows the step, mean reward, the rollout's ESL, the latest
held-out ESL and samples/s.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
from pathlib import Path
from types import ModuleType

import yaml

from chessgrpo.commands.common import (
    add_config_arguments,
    progress_bar,
    resolve_run_config,
)
from chessgrpo.config import save_config

logger = logging.getLogger(__name__)

TRAINERS: dict[str, str] = {"move_group": "chessgrpo.train.grpo", "trajectory": "chessgrpo.train.trajectory", "rookworld": "chessgrpo.train.rookworld"}
"""Config `kind` -> the module with CONFIG_CLASS, TRAINER_CLASS and RESUMABLE_KEYS."""


def trainer_module(args: argparse.Namespace) -> ModuleType:
    """The trainer module for the run's `kind` (from RUN_DIR/config.yaml, --config, then overrides)."""
    from chessgrpo.config import ConfigError

    source = args.resume / "config.yaml" if args.resume is not None else args.config
    kind = "move_group"
    if source is not None and Path(source).is_file():
        try:
            data = yaml.safe_load(Path(source).read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {str(source)!r} is not valid YAML: {error}") from None
        if isinstance(data, dict):
            kind = data.get("kind", kind)
    for text in args.overrides:
        if text.startswith("kind="):
            kind = text.split("=", 1)[1]
    if kind not in TRAINERS:
        raise ConfigError(f"config key kind: unknown trainer {kind!r}; choose one of {sorted(TRAINERS)}")
    return importlib.import_module(TRAINERS[kind])


def add_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="GRPO of the action policy (one-move groups, Stockfish rewards)")
    add_config_arguments(train)
    train.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue RUN_DIR from its latest checkpoint")
    train.set_defaults(handler=run_train)


def _interval(row: dict, key: str) -> str:
    return f"{row[key]:.3f} [{row[key + '_low']:.3f}, {row[key + '_high']:.3f}]"


def run_train(args: argparse.Namespace) -> int:
    module = trainer_module(args)
    config, resume = resolve_run_config(args, module.CONFIG_CLASS, module.RESUMABLE_KEYS, "train")
    run_dir = config.run.directory
    interrupted = False
    with module.TRAINER_CLASS(config, resume=resume) as trainer:
        save_config(config, run_dir / "config.yaml")

        def on_interrupt(signum, frame):
            nonlocal interrupted
            interrupted = True
            trainer.request_stop()
            signal.signal(signal.SIGINT, previous)
            logger.warning("interrupt: finishing the current step and saving a checkpoint (Ctrl-C again to abort)")

        previous = signal.signal(signal.SIGINT, on_interrupt)
        end = config.steps if config.stop_at is None else min(config.steps, config.stop_at)
        evals: list[tuple[int, dict]] = []
        try:
            with progress_bar(end, config.run.name, "step", initial=trainer.step) as bar:
                postfix: dict[str, str] = {}

                def progress(step: int, row: dict | None) -> None:
                    bar.update(step - bar.n)
                    if row is None:
                        return
                    if "reward/win_prob" in row:
                        postfix["reward"] = f"{row['reward/win_prob']:.3f}"
                        if "reward/esl" in row:
                            postfix["esl"] = f"{row['reward/esl']:.3f}"
                        postfix["sps"] = f"{row['perf/samples_per_s']:.0f}"
                    for key, label in (("rollout/mate_rate", "mate"), ("reward/mean", "reward_mean")):
                        if key in row and "reward/win_prob" not in row:
                            postfix[label] = f"{row[key]:.3f}"
                    if "eval/mate_rate" in row:
                        postfix["heldout_mate"] = f"{row['eval/mate_rate']:.3f}"
                        bar.write(f"step {step}: held-out mate rate {row['eval/mate_rate']:.3f}")
                    if "eval/esl" in row:
                        postfix["heldout_esl"] = f"{row['eval/esl']:.3f}"
                        evals.append((step, row))
                        bar.write(_eval_line(step, row))
                    bar.set_postfix(postfix)

                result = trainer.train(progress)
        finally:
            signal.signal(signal.SIGINT, previous)

    print(f"run {run_dir}: step {result.step}/{config.steps}")
    if len(evals) >= 2:
        print("held-out curve (step: ESL [95% CI], top-1, puzzle first move):")
        for step, row in evals:
            print("  " + _eval_line(step, row))
        print(f"paired before/after: chessgrpo eval compare {run_dir}/eval/step_{evals[0][0]:06d}_offline.json "
              f"{run_dir}/eval/step_{evals[-1][0]:06d}_offline.json")
    print(f"checkpoint: {result.checkpoint}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}")
    if not result.finished:
        print(f"stopped early; continue with: chessgrpo train --resume {run_dir}")
    return 130 if interrupted else 0


def _eval_line(step: int, row: dict) -> str:
    parts = [f"step {step}:"]
    if "eval/esl" in row:
        parts.append(f"ESL {_interval(row, 'eval/esl')}, top-1 {_interval(row, 'eval/top1')}")
    if "eval/puzzle_first_move_accuracy" in row:
        parts.append(f"puzzles {_interval(row, 'eval/puzzle_first_move_accuracy')}")
    return " ".join(parts)
