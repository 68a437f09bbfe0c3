"""`chessgrpo sft`: supervised fine-tuning of a chess LM on RookWorld text (loss on completions only).

    chessgrpo sft --config configs/rookworld_sft_tiny.yaml [key=value ...]
    chessgrpo sft --resume runs/rookworld_sft [steps=2000 ...]

Data comes from `chessgrpo data rookworld --out DIR`. A fresh run refuses a run directory that
already has checkpoints; `--resume` continues from the latest one, changing only
`chessgrpo.train.sft.RESUMABLE_KEYS`. Ctrl-C finishes the step, checkpoints and exits with 130.
The result loads with `chessgrpo.models.lm.load_lm(RUN_DIR)` and is the `init_checkpoint` of a
`kind: rookworld` GRPO run.
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
    sft = commands.add_parser("sft", help="supervised fine-tuning of a chess language model on RookWorld P:/A: text")
    add_config_arguments(sft)
    sft.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue RUN_DIR from its latest checkpoint")
    sft.set_defaults(handler=run_sft)


def run_sft(args: argparse.Namespace) -> int:
    from chessgrpo.train.sft import RESUMABLE_KEYS, SFTConfig, SFTTrainer

    config, resume = resolve_run_config(args, SFTConfig, RESUMABLE_KEYS, "sft")
    trainer = SFTTrainer(config, resume=resume)  # loads data and model; raises before anything is written
    run_dir = config.run.directory
    save_config(config, run_dir / "config.yaml")
    interrupted = False

    def on_interrupt(signum, frame):
        nonlocal interrupted
        interrupted = True
        trainer.request_stop()
        signal.signal(signal.SIGINT, previous)
        logger.warning("interrupt: finishing the current step and saving a checkpoint (Ctrl-C again to abort)")

    previous = signal.signal(signal.SIGINT, on_interrupt)
    end = config.steps if config.stop_at is None else min(config.steps, config.stop_at)
    try:
        with progress_bar(end, config.run.name, "step", initial=trainer.step) as bar:
            postfix: dict[str, str] = {}

            def progress(step: int, row: dict | None) -> None:
                bar.update(step - bar.n)
                if row is None:
                    return
                if "loss/train" in row:
                    postfix["loss"] = f"{row['loss/train']:.3f}"
                if "eval/format_rate" in row:
                    postfix["well_formed"] = f"{row['eval/format_rate']:.3f}"
                    bar.write(_eval_line(step, row))
                bar.set_postfix(postfix)

            result = trainer.train(progress)
    finally:
        signal.signal(signal.SIGINT, previous)

    print(f"run {run_dir}: step {result.step}/{config.steps}, {trainer.lm.num_parameters() / 1e6:.2f}M parameters")
    if result.eval_metrics:
        print("held-out: " + _eval_line(result.step, result.eval_metrics))
    print(f"checkpoint: {result.checkpoint}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}")
    if not result.finished:
        print(f"stopped early; continue with: chessgrpo sft --resume {run_dir}")
    return 130 if interrupted else 0


def _eval_line(step: int, row: dict) -> str:
    parts = [f"step {step}:"]
    if "eval/loss" in row:
        parts.append(f"loss {row['eval/loss']:.4f}")
    for task in ("policy", "environment"):
        key = f"eval/{task}_format_rate"
        if key in row:
            parts.append(f"{task} well-formed {row[key]:.3f} [{row[key + '_low']:.3f}, {row[key + '_high']:.3f}]")
    if "eval/policy_best_label_accuracy" in row:
        parts.append(f"best-move = label {row['eval/policy_best_label_accuracy']:.3f}")
    if "eval/environment_exact_rate" in row:
        parts.append(f"A: exact {row['eval/environment_exact_rate']:.3f}")
    return ", ".join(parts)
