"""Where metric rows go besides ``metrics.jsonl``: TensorBoard and Weights & Biases.

`TrackingConfig` is the ``tracking:`` section of the training configs. ``RUN_DIR/metrics.jsonl``
is always written (diagnose, report and resume read it); TensorBoard and W&B receive the same
rows under the same metric names (``loss/total``, ``eval/esl``, ...) at the same steps, plus the
resolved config once at the start:

- ``tensorboard``: `torch.utils.tensorboard.SummaryWriter` in ``RUN_DIR/tensorboard`` (or
  `tensorboard_dir`); the config as a text summary named ``config`` (YAML). A resumed run purges
  the events after the resumed step, as `MetricsWriter` does with the JSONL rows.
- ``wandb``: ``wandb.init(mode=wandb_mode, config=<resolved config>)``; offline by default, so it
  needs no account and no network (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later). The
  run's W&B id is kept in ``RUN_DIR/wandb_run_id``, so ``--resume`` continues the same W&B run (a
  fresh run in the same directory takes a new id). Offline, each invocation writes its own
  ``offline-run-<time>-<id>`` folder of that one run; ``wandb sync`` takes a run's folders in
  order of start time.

Both packages are optional (``pip install 'chessgrpo[tracking]'``). A listed backend whose package
is missing is a `BackendUnavailable` error when the config is built, before any work is done.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from chessgrpo.config import ConfigError

logger = logging.getLogger(__name__)

BACKENDS = ("jsonl", "tensorboard", "wandb")
PIP_EXTRA = "pip install 'chessgrpo[tracking]'"
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


class BackendUnavailable(ConfigError):
    """A tracking backend is listed but its Python package is not installed."""


@dataclasses.dataclass
class TrackingConfig:
    """Metric tracking: metrics.jsonl always, TensorBoard and W&B when listed (same metric names)."""

    RESUMABLE = True  # a resumed run may change any of these keys (`config.resumable_keys`)

    backends: list[str] = dataclasses.field(default_factory=lambda: ["jsonl"])
    """Any of jsonl, tensorboard, wandb. RUN_DIR/metrics.jsonl is written whether or not jsonl is listed."""
    tensorboard_dir: str | None = None
    """TensorBoard log directory; null = RUN_DIR/tensorboard."""
    wandb_project: str = "chessgrpo"
    """W&B project name."""
    wandb_entity: str | None = None
    """W&B entity (user or team); null = the account's default (unused offline)."""
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    """offline (default: no network, no account; `wandb sync` later), online, or disabled."""
    wandb_dir: str | None = None
    """Where W&B writes its files (it adds a wandb/ folder); null = RUN_DIR."""
    wandb_tags: list[str] = dataclasses.field(default_factory=list)
    """Tags for the W&B run."""

    def __post_init__(self) -> None:
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown:
            raise ConfigError(f"tracking.backends: unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError(f"tracking.backends lists a backend twice: {self.backends}")
        for backend in self.backends:
            package = _PACKAGES.get(backend)
            if package is not None and importlib.util.find_spec(package) is None:
                raise BackendUnavailable(_missing(backend, package))


def _missing(backend: str, package: str) -> str:
    return (
        f"tracking backend {backend!r} needs the {package!r} package, which is not installed: "
        f"{PIP_EXTRA} (or pip install {package}), or remove {backend!r} from tracking.backends"
    )


class Sink:
    """A destination of metric rows besides the JSONL file."""

    name = "sink"

    def log_config(self, config: Mapping[str, Any]) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def log(self, step: int, metrics: Mapping[str, float], wall_time: float) -> None:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError


class TensorBoardSink(Sink):
    """Scalars under the metric names, the resolved config as the text summary ``config``."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, *, resume_step: int | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise BackendUnavailable(f"{_missing('tensorboard', 'tensorboard')} ({error})") from None
        log_dir.mkdir(parents=True, exist_ok=True)
        # purge_step drops events at steps > resume_step left by the interrupted invocation.
        purge = resume_step + 1 if resume_step is not None else None
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)
        self.log_dir = log_dir

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = yaml.safe_dump(dict(config), sort_keys=False)
        # TensorBoard renders text summaries as Markdown: indent 4 spaces to keep it a code block.
        self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), global_step=0)

    def log(self, step: int, metrics: Mapping[str, float], wall_time: float) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step, walltime=wall_time)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


WANDB_ID_FILE = "wandb_run_id"
"""RUN_DIR/wandb_run_id: the W&B run id, written at the first start, read back by every ``--resume``."""


def wandb_run_id(run_dir: Path, generate: Callable[[], str], *, resume: bool) -> str:
    """The run's W&B id. A resumed run reuses the one its directory holds (a new one if it has none, e.g. W&B
    was added at the resume); a fresh run always takes a new one, written there atomically: a fresh run
    replaces metrics.jsonl, so it must not append to the W&B history of the run it replaces."""
    path = run_dir / WANDB_ID_FILE
    existing = ""
    if resume:
        try:
            existing = path.read_text().strip()
        except FileNotFoundError:
            pass
    if existing:
        return existing
    run_id = generate()
    run_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(run_id + "\n")
    temporary.replace(path)
    return run_id


class WandbSink(Sink):
    """A W&B run (offline by default) with the resolved config and the rows at their steps."""

    name = "wandb"

    def __init__(self, config: TrackingConfig, run_dir: Path, run_name: str, run_config: Mapping[str, Any] | None, *, resume: bool = False):
        try:
            import wandb
        except ImportError as error:
            raise BackendUnavailable(f"{_missing('wandb', 'wandb')} ({error})") from None
        directory = Path(config.wandb_dir) if config.wandb_dir else run_dir
        directory.mkdir(parents=True, exist_ok=True)
        self.run_id = wandb_run_id(run_dir, lambda: secrets.token_hex(4), resume=resume)  # W&B's own ids are 8 lowercase alphanumerics
        self._run = wandb.init(
            id=self.run_id,
            resume="allow",  # a resumed training run continues its W&B run: one run, one history
            project=config.wandb_project,
            entity=config.wandb_entity,
            mode=config.wandb_mode,
            dir=str(directory),
            name=run_name,
            tags=list(config.wandb_tags) or None,
            config=dict(run_config) if run_config is not None else None,
        )
        self.directory = directory

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log(self, step: int, metrics: Mapping[str, float], wall_time: float) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def open_sinks(
    config: TrackingConfig | None,
    run_dir: Path,
    *,
    resume_step: int | None,
    run_config: Mapping[str, Any] | None,
) -> list[Sink]:
    """The non-JSONL sinks `config` lists, each given the resolved config; [] for None or jsonl only."""
    if config is None:
        return []
    sinks: list[Sink] = []
    try:
        for backend in config.backends:
            if backend == "tensorboard":
                log_dir = Path(config.tensorboard_dir) if config.tensorboard_dir else run_dir / "tensorboard"
                sinks.append(TensorBoardSink(log_dir, resume_step=resume_step))
                if run_config is not None:
                    sinks[-1].log_config(run_config)
            elif backend == "wandb":
                sinks.append(WandbSink(config, run_dir, run_dir.name, run_config, resume=resume_step is not None))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    if sinks:
        logger.info("tracking metrics to %s", ", ".join(["metrics.jsonl", *(s.name for s in sinks)]))
    return sinks


TRACKING_KEYS = frozenset(f"tracking.{field.name}" for field in dataclasses.fields(TrackingConfig))
"""Dotted config keys a resumed run may change: where metrics go does not touch the training math."""
