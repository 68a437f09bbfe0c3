"""`chessgrpo pretrain`: supervised pretraining of the action policy (bc or distill).

    chessgrpo pretrain --config configs/pretrain_tiny.yaml [key=value ...]
    chessgrpo pretrain --resume runs/pretrain_tiny [steps=2000 ...]

A fresh run refuses a run directory that already has checkpoints (resume it or pick another
run.name). A resumed run reads RUN_DIR/config.yaml; overrides may only change keys that leave the
training math alone (`chessgrpo.train.pretrain.RESUMABLE_KEYS`), and `stop_at` is cleared unless
given again. Ctrl-C finishes the current step, saves a checkpoint and exits with status 130.
"""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from chessgrpo.commands.common import (
    add_config_arguments,
    progress_bar,
    resolve_run_config,
)
from chessgrpo.config import save_config

logger = logging.getLogger(__name__)


def add_parser(commands: argparse._SubParsersAction) -> None:
    pretrain = commands.add_parser(
        "pretrain", help="supervised pretraining of the action policy (behaviour cloning or value-aware distillation)"
    )
    add_config_arguments(pretrain)
    pretrain.add_argument(
        "--resume", type=Path, metavar="RUN_DIR", help="continue RUN_DIR from its latest checkpoint (uses RUN_DIR/config.yaml)"
    )
    pretrain.set_defaults(handler=run_pretrain)


def resolve_config(args: argparse.Namespace):
    """The run's config: from --config + overrides, or from RUN_DIR/config.yaml on --resume."""
    from chessgrpo.train.pretrain import RESUMABLE_KEYS, PretrainConfig

    return resolve_run_config(args, PretrainConfig, RESUMABLE_KEYS, "pretrain")


def run_pretrain(args: argparse.Namespace) -> int:
    """Train, render a progress bar on stderr, print a summary; 130 when stopped by Ctrl-C."""
    from chessgrpo.train.pretrain import Pretrainer

    config, resume = resolve_config(args)
    trainer = Pretrainer(config, resume=resume)  # loads data; raises before anything is written
    run_dir = config.run.directory
    save_config(config, run_dir / "config.yaml")

    interrupted = False

    def on_interrupt(signum, frame):
        nonlocal interrupted
        interrupted = True
        trainer.request_stop()
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C aborts at once
        logger.warning("interrupt: finishing the current step and saving a checkpoint (Ctrl-C again to abort)")

    previous = signal.signal(signal.SIGINT, on_interrupt)
    end = config.steps if config.stop_at is None else min(config.steps, config.stop_at)
    try:
        with progress_bar(end, config.run.name, "step", initial=trainer.step) as bar:

            def progress(step: int, row: dict | None) -> None:
                bar.update(step - bar.n)
                if row is not None and "loss/train" in row:
                    bar.set_postfix(
                        loss=f"{row['loss/train']:.3f}", top1=f"{row['train/top1']:.3f}", sps=f"{row['perf/samples_per_s']:.0f}"
                    )

            result = trainer.train(progress)
    finally:
        signal.signal(signal.SIGINT, previous)

    print(f"run {run_dir}: step {result.step}/{config.steps} ({config.objective}, model {config.model.describe()}), "
          f"{result.samples_per_s:.0f} samples/s")
    if result.eval_metrics:
        e = result.eval_metrics
        print(
            f"held-out ({len(trainer.test_data)} positions): top-1 {100 * e['eval/top1']:.1f}%, top-5 {100 * e['eval/top5']:.1f}%, "
            f"loss {e['eval/loss']:.4f}, best-move nll {e['eval/nll']:.4f} (perplexity {e['eval/perplexity']:.2f})"
        )
    elif trainer.test_data is None:
        print("held-out: the dataset has no test split")
    print(f"checkpoint: {result.checkpoint}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}")
    if not result.finished:
        print(f"stopped early; continue with: chessgrpo pretrain --resume {run_dir}")
    return 130 if interrupted else 0
