"""Argument helpers shared by the command modules: config files and overrides, integer flags, the
search flags of `eval offline|puzzles|epd|games`, resuming a run, progress bars, and running an evaluation
of the registry with its result file (`run_registered`)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any, TextIO, TypeVar

from chessgrpo.errors import InputError

logger = logging.getLogger(__name__)
T = TypeVar("T")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` plus positional ``key=value`` overrides, as every configurable command takes."""
    parser.add_argument(
        "--config", type=Path, default=None, help="YAML config file (defaults apply where it is silent)"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides applied after the file, e.g. engine.nodes=5000",
    )


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """`--search-nodes` and `--search-algorithm`: the evaluated policy's search (`eval offline|puzzles|games`)."""
    parser.add_argument(
        "--search-nodes",
        type=non_negative_int,
        help="search budget per move with the value head; 0 = policy argmax (default: config search_nodes)",
    )
    parser.add_argument(
        "--search-algorithm", choices=("puct", "alphabeta"), help="search algorithm (default: config search_algorithm)"
    )


def _int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`, else one clear error."""
    wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def resolve_run_config(
    args: argparse.Namespace, config_cls: type[T], resumable_keys: frozenset[str], command: str
) -> tuple[T, bool]:
    """A training run's config and whether it resumes: from --config + overrides, or RUN_DIR/config.yaml.

    A fresh run refuses a run directory that already has a checkpoint. A resumed run may only
    change `resumable_keys` (dotted), `stop_at` applies to one invocation only, and the run
    directory is wherever RUN_DIR is now. `config_cls` needs `run` (RunConfig), `steps` and `stop_at`.
    """
    from chessgrpo.config import ConfigError, load_config, to_dict
    from chessgrpo.train.checkpoint import latest_checkpoint

    if args.resume is None:
        config: Any = load_config(config_cls, args.config, args.overrides)
        run_dir = config.run.directory
        existing = latest_checkpoint(run_dir)
        if existing is not None:
            raise InputError(
                f"run directory {str(run_dir)!r} already has a checkpoint ({existing.name}); continue it with "
                f"`chessgrpo {command} --resume {run_dir}` or start a new run with run.name=<new name>"
            )
        if (run_dir / "metrics.jsonl").exists():
            logger.warning("%s has metrics but no checkpoint (an earlier run died early): starting it afresh", run_dir)
        return config, False

    if args.config is not None:
        raise ConfigError("--resume uses RUN_DIR/config.yaml; do not pass --config with it")
    run_dir = args.resume
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise FileNotFoundError(
            f"cannot resume {str(run_dir)!r}: it has no config.yaml (is it a `{command}` run directory?)"
        )
    saved = load_config(config_cls, saved_path)
    _warn_on_keys_added_since(saved_path, saved)
    saved = dataclasses.replace(saved, stop_at=None)  # a stop point applies to one invocation only
    config = load_config(config_cls, saved_path, ["stop_at=null", *args.overrides])
    before, after = _flatten(to_dict(saved)), _flatten(to_dict(config))
    changed = sorted(key for key in after if after[key] != before[key] and key not in resumable_keys)
    if changed:
        raise ConfigError(
            f"cannot change {', '.join(changed)} when resuming (it changes the training math); "
            f"resumable keys: {', '.join(sorted(resumable_keys))}. Start a new run to change the others."
        )
    config = dataclasses.replace(
        config, run=dataclasses.replace(config.run, out_dir=str(run_dir.parent), name=run_dir.name)
    )
    if latest_checkpoint(run_dir) is None:
        raise FileNotFoundError(f"cannot resume {str(run_dir)!r}: no checkpoint under {str(run_dir / 'checkpoints')!r}")
    if config.steps != saved.steps:
        logger.warning(
            "steps changed from %d to %d: the schedule now ends at step %d", saved.steps, config.steps, config.steps
        )
    return config, True


def _warn_on_keys_added_since(saved_path: Path, saved: Any) -> None:
    """Name the config keys a run's config.yaml predates: they resume with today's defaults.

    A key added to the code after the run started (e.g. `reshuffle_moves`) silently takes its
    default, which may not be how the run was trained so far.
    """
    import yaml

    from chessgrpo.config import to_dict

    written = _flatten(yaml.safe_load(saved_path.read_text()) or {})
    resolved = _flatten(to_dict(saved))
    missing = [f"{key}={value!r}" for key, value in resolved.items() if key not in written]
    if missing:
        logger.warning(
            "%s predates config keys that now resume with their defaults: %s", saved_path, ", ".join(missing)
        )


class _LineWriter:
    """A file for tqdm off a terminal: each refresh becomes one whole line instead of a carriage return."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int | None, description: str, unit: str, initial: int = 0, **options: Any) -> Any:
    """A tqdm bar on stderr for long work: live on a terminal; in a log file, one line every 30 s."""
    from tqdm import tqdm

    if sys.stderr.isatty():
        return tqdm(
            total=total, initial=initial, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True, **options
        )

    class _LogBar(tqdm):
        def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
            super().set_postfix(
                ordered_dict, refresh=False, **kwargs
            )  # shown at the next 30 s line, not one line per step

    return _LogBar(
        total=total,
        initial=initial,
        desc=description,
        unit=unit,
        file=_LineWriter(sys.stderr),
        ncols=100,
        mininterval=30.0,
        **options,
    )


def run_registered(name: str, config: Any, subject: Any, context: Any = None) -> Any:
    """Run the evaluation registered as `name` (`eval.registry.run_evaluation`: config, `eval.running.Subject`,
    `EvalContext`) and write its result file at the config's ``output`` when set (`eval.registry.write_result`,
    the one writer); every `eval NAME` command runs its evaluation through here. Returns its `EvalOutput`."""
    from chessgrpo.eval.registry import run_evaluation, write_result

    output = run_evaluation(name, config, subject, context)
    path = getattr(output.config, "output", None)
    if path:
        write_result(name, output, path=path)
    return output
