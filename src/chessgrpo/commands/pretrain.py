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
import dataclasses
import logging
import signal
import sys
from pathlib import Path

from chessgrpo.commands.common import add_config_arguments
from chessgrpo.config import ConfigError, load_config, save_config, to_dict

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


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def resolve_config(args: argparse.Namespace):
    """The run's config: from --config + overrides, or from RUN_DIR/config.yaml on --resume."""
    from chessgrpo.train.checkpoint import latest_checkpoint
    from chessgrpo.train.pretrain import RESUMABLE_KEYS, PretrainConfig

    if args.resume is None:
        config = load_config(PretrainConfig, args.config, args.overrides)
        run_dir = config.run.directory
        existing = latest_checkpoint(run_dir)
        if existing is not None:
            raise ValueError(
                f"run directory {str(run_dir)!r} already has a checkpoint ({existing.name}); continue it with "
                f"`chessgrpo pretrain --resume {run_dir}` or start a new run with run.name=<new name>"
            )
        if (run_dir / "metrics.jsonl").exists():
            logger.warning("%s has metrics but no checkpoint (an earlier run died early): starting it afresh", run_dir)
        return config, False

    if args.config is not None:
        raise ConfigError("--resume uses RUN_DIR/config.yaml; do not pass --config with it")
    run_dir = args.resume
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise FileNotFoundError(f"cannot resume {str(run_dir)!r}: it has no config.yaml (is it a pretrain run directory?)")
    saved = load_config(PretrainConfig, saved_path)
    saved = dataclasses.replace(saved, stop_at=None)  # a stop point applies to one invocation only
    config = load_config(PretrainConfig, saved_path, ["stop_at=null", *args.overrides])
    before, after = _flatten(to_dict(saved)), _flatten(to_dict(config))
    changed = sorted(key for key in after if after[key] != before[key] and key not in RESUMABLE_KEYS)
    if changed:
        raise ConfigError(
            f"cannot change {', '.join(changed)} when resuming (it changes the training math); "
            f"resumable keys: {', '.join(sorted(RESUMABLE_KEYS))}. Start a new run to change the others."
        )
    # The run directory is where it is now, whatever out_dir/name said when it was created.
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, out_dir=str(run_dir.parent), name=run_dir.name))
    if latest_checkpoint(run_dir) is None:
        raise FileNotFoundError(f"cannot resume {str(run_dir)!r}: no checkpoint under {str(run_dir / 'checkpoints')!r}")
    if config.steps != saved.steps:
        logger.warning("steps changed from %d to %d: the cosine schedule now ends at step %d", saved.steps, config.steps, config.steps)
    return config, True


def run_pretrain(args: argparse.Namespace) -> int:
    """Train, render a progress bar on stderr, print a summary; 130 when stopped by Ctrl-C."""
    from tqdm import tqdm

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
        with tqdm(total=end, initial=trainer.step, desc=config.run.name, unit="step", file=sys.stderr, dynamic_ncols=True) as bar:

            def progress(step: int, row: dict | None) -> None:
                bar.update(step - bar.n)
                if row is not None and "loss/train" in row:
                    bar.set_postfix(
                        loss=f"{row['loss/train']:.3f}", top1=f"{row['train/top1']:.3f}", sps=f"{row['perf/samples_per_s']:.0f}"
                    )

            result = trainer.train(progress)
    finally:
        signal.signal(signal.SIGINT, previous)

    print(f"run {run_dir}: step {result.step}/{config.steps} ({config.objective}, model {config.model.size}), "
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
