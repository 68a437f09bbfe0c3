"""`chessgrpo train`: run any kind of training through the one training spine (`train.loop.Trainer`).

    chessgrpo train --config configs/grpo_tiny.yaml [key=value ...]
    chessgrpo train --resume runs/grpo_tiny [steps=400 ...]

The config's top-level `kind` picks the plug-in (`tasks.kinds.KINDS`): pretrain, sft, move_group,
trajectory, mixture or rookworld. `chessgrpo pretrain` and `chessgrpo sft` are the same command with the
kind preset. A fresh run refuses a run directory that already has checkpoints; `--resume`
continues from the newest intact checkpoint with RUN_DIR/config.yaml, changing only the keys marked
resumable on the config's fields. This module is the one place that handles SIGINT and SIGTERM
(finish the step, checkpoint, exit 130 / 143), the progress bar and the end-of-run summary.
"""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path
from typing import Any

from chessgrpo.commands.common import add_config_arguments, progress_bar, resolve_run_config
from chessgrpo.config import ConfigError, read_yaml_file, resumable_keys
from chessgrpo.tasks.kinds import KINDS

logger = logging.getLogger(__name__)

_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


def add_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help=f"train any kind of run: {', '.join(KINDS)}")
    _add_arguments(train, default_kind=None)
    pretrain = commands.add_parser(
        "pretrain", help="alias of `train` with kind: pretrain (supervised pretraining of the action policy)"
    )
    _add_arguments(pretrain, default_kind="pretrain")
    sft = commands.add_parser(
        "sft", help="alias of `train` with kind: sft (supervised fine-tuning of a chess language model)"
    )
    _add_arguments(sft, default_kind="sft")


def _add_arguments(parser: argparse.ArgumentParser, default_kind: str | None) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--resume", type=Path, metavar="RUN_DIR", help="continue RUN_DIR from its newest intact checkpoint"
    )
    parser.set_defaults(handler=run_train, default_kind=default_kind)


def run_kind(args: argparse.Namespace) -> str:
    """The run's kind: RUN_DIR/config.yaml on --resume, else a kind= override, the --config file, the alias."""
    source = args.resume / "config.yaml" if args.resume is not None else args.config
    kind = None
    if source is not None and Path(source).is_file():
        kind = read_yaml_file(source).get("kind")  # a ConfigError naming the file, line and column
    for text in args.overrides:
        if text.startswith("kind="):
            kind = text.split("=", 1)[1]
    default = args.default_kind
    if kind is None:
        kind = default or "move_group"
    if default is not None and kind != default:
        raise ConfigError(
            f"`chessgrpo {default}` runs kind: {default}, but the config says kind: {kind}; use `chessgrpo train`"
        )
    return kind


def run_train(args: argparse.Namespace) -> int:
    """Train with a progress bar on stderr; print the summary; 130/143 after SIGINT/SIGTERM."""
    from chessgrpo.tasks.kinds import config_class
    from chessgrpo.train.loop import Trainer

    kind = run_kind(args)
    config_cls = config_class(kind)
    overrides = list(args.overrides)
    if args.resume is None and not any(text.startswith("kind=") for text in overrides):
        overrides.insert(0, f"kind={kind}")
    args.overrides = overrides
    config, resume = resolve_run_config(args, config_cls, resumable_keys(config_cls), "train")
    received: list[int] = []
    with Trainer(config, resume=resume) as trainer:  # takes the run's lock; raises before anything is written

        def on_signal(signum: int, frame: object) -> None:
            received.append(signum)
            trainer.request_stop(f"stopped by {signal.Signals(signum).name}")
            signal.signal(signum, previous[signum])  # a second signal of the same kind aborts at once
            logger.warning("%s: finishing the current step and saving a checkpoint", signal.Signals(signum).name)

        previous = {signum: signal.signal(signum, on_signal) for signum in _EXIT_CODES}
        kind_plugin = trainer.kind
        main = trainer.parallel.is_main  # in a torchrun job rank 0 shows progress and the summary
        try:
            with progress_bar(trainer.end_step, config.run.name, "step", initial=trainer.step, disable=not main) as bar:
                postfix: dict[str, str] = {}
                evals: list[str] = []

                def progress(step: int, row: dict | None) -> None:
                    bar.update(step - bar.n)
                    if row is None:
                        return
                    postfix.update(kind_plugin.progress_postfix(row))
                    line = kind_plugin.eval_line(step, row)
                    if line is not None:
                        evals.append(line)
                        bar.write(line)
                    bar.set_postfix(postfix)

                result = trainer.train(progress)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

        if not main:
            return _EXIT_CODES[received[0]] if received else 0
        _print_summary(trainer, config, result, kind, evals)
    if received:
        return _EXIT_CODES[received[0]]
    return 0


def _print_summary(trainer: Any, config: Any, result: Any, kind: str, evals: list[str]) -> None:
    """The end-of-run summary (rank 0): where the run stands, the kind's lines, the held-out curve, what to do next."""
    run_dir = config.run.directory
    if trainer.parallel.enabled:
        print(f"data-parallel: {trainer.parallel.world_size} processes ({trainer.parallel.backend})")
    print(f"run {run_dir} ({kind}): step {result.step}/{config.steps}")
    for line in trainer.kind.summary():
        print(line)
    if len(evals) >= 2:
        print("held-out curve:")
        for line in evals:
            print("  " + line)
    if result.stop_reason:
        print(f"stopped: {result.stop_reason}")
    print(f"checkpoint: {result.checkpoint}")
    if result.best_checkpoint is not None:
        print(f"best checkpoint ({config.best_metric()[0]}): {result.best_checkpoint}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}")
    if not result.finished:
        print(f"continue with: chessgrpo train --resume {run_dir}")
