"""Where metric rows go besides ``metrics.jsonl``: TensorBoard and Weights & Biases.

`TrackingConfig` is the ``tracking:`` section of the training configs. ``RUN_DIR/metrics.jsonl``
is always written (diagnose, report and resume read it); TensorBoard and W&B receive the same
rows under the same metric names (``loss/total``, ``eval/esl``, ...) at the same steps, plus the
resolved config once at the start:

- ``tensorboard``: `torch.utils.tensorboard.SummaryWriter` in ``RUN_DIR/tensorboard`` (or
  `tensorboard_dir`); the config as a text summary named ``config`` (YAML). Rows are written as
  they come (live, like the JSONL). A resumed run purges the events after the resumed step, and a
  divergence rollback purges the events after the checkpoint it returns to (TensorBoard's
  ``purge_step``), as `MetricsWriter` does with the JSONL rows.
- ``wandb``: ``wandb.init(mode=wandb_mode, config=<resolved config>)``; offline by default, so it
  needs no account and no network (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later). The
  run's W&B id is kept in ``RUN_DIR/wandb_run_id``, so ``--resume`` continues the same W&B run (a
  fresh run in the same directory takes a new id). Offline, each invocation writes its own
  ``offline-run-<time>-<id>`` folder of that one run; ``wandb sync`` takes a run's folders in
  order of start time. W&B shows a run's rows up to its last checkpoint (`WandbSink`): its history
  cannot be rewound, so rows that a rollback or a resume may still replace are held back.

Both packages are optional (``pip install 'chessgrpo[tracking]'``). A listed backend whose package
is missing is a `BackendUnavailable` error when the config is built, before any work is done.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import secrets
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    """Any of jsonl, tensorboard, wandb. RUN_DIR/metrics.jsonl is written whether or not jsonl is listed. The JSONL
    and TensorBoard are live; W&B shows the rows up to the run's last checkpoint (a row reaches it when the next
    checkpoint is written), so that its history always equals metrics.jsonl, rollbacks and crash-resumes included."""
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
    """A destination of metric rows besides the JSONL file.

    Besides the rows it is told two things, in `MetricsWriter`'s order: `commit` (a checkpoint of that step is
    written: the rows up to it are final) and `rewind` (a divergence rollback went back to that step's checkpoint:
    the rows after it are abandoned and will be logged again).
    """

    name = "sink"

    def log_config(self, config: Mapping[str, Any]) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def log(self, step: int, metrics: Mapping[str, float], wall_time: float) -> None:  # pragma: no cover
        raise NotImplementedError

    def commit(self, step: int) -> None:
        """A checkpoint of `step` is written: no rollback or resume goes back before it. Nothing by default."""

    def rewind(self, step: int) -> None:
        """The run rolled back to `step`'s checkpoint: drop what was received after `step`. Nothing by default."""

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError


class TensorBoardSink(Sink):
    """Scalars under the metric names, the resolved config as the text summary ``config``.

    Rows are written (and flushed) as they come. Events after a step that a resume or a rollback returns to are
    purged the way TensorBoard provides: a new event file whose ``purge_step`` tells readers to drop the events at
    that step and later from the files before it.
    """

    name = "tensorboard"

    def __init__(self, log_dir: Path, *, resume_step: int | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise BackendUnavailable(f"{_missing('tensorboard', 'tensorboard')} ({error})") from None
        log_dir.mkdir(parents=True, exist_ok=True)
        self._summary_writer = SummaryWriter
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

    def rewind(self, step: int) -> None:
        """Purge the events after `step` (the abandoned steps of a rollback), as a resume from `step` does."""
        self._writer.close()
        self._writer = self._summary_writer(log_dir=str(self.log_dir), purge_step=step + 1)

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
    """A W&B run (offline by default) with the resolved config and the rows up to the run's last checkpoint.

    W&B's history only grows: a row at a step it already has is dropped or merged into the old one, never replaces
    it. A divergence rollback and a crash-resume both re-log the steps after their checkpoint, so a row logged after
    the last checkpoint is not final. The sink therefore holds rows back and sends each step once, as one row (the
    rows metrics.jsonl has at that step, merged in order: a rollback's row joins its checkpoint's step):

    - `commit` (a checkpoint of step k is written) sends the held rows before k; the row at k stays held, because a
      rollback to that checkpoint adds its ``health/rollback`` row at step k;
    - `rewind` (a rollback to step k's checkpoint) drops the held rows after k;
    - `close` sends the held rows up to the last checkpoint and drops the ones after it, which a resume re-runs;
    - a resume from step k first asks W&B which step it has last (offline: the earlier ``offline-run-*`` files of
      the run, read record by record; online: the resumed run's `starting_step`) and queues metrics.jsonl's rows
      after it up to k. That also restores the rows W&B itself lost when the process was killed: W&B's service
      writes its offline file in 32 KiB blocks and drops the unwritten tail when its parent dies.

    So W&B shows a run's rows up to its last checkpoint, always the ones metrics.jsonl has (which stays live). W&B
    stamps a row's ``_timestamp`` when the row is sent, at the checkpoint after it.
    """

    name = "wandb"

    def __init__(
        self,
        config: TrackingConfig,
        run_dir: Path,
        run_name: str,
        run_config: Mapping[str, Any] | None,
        *,
        resume_step: int | None = None,
        kept_rows: Sequence[Mapping[str, Any]] = (),
    ):
        """`resume_step`: the step of the checkpoint a resumed run starts from (None: a fresh run); `kept_rows`: the
        rows metrics.jsonl keeps at a resume (``step <= resume_step``), the ones W&B may lack."""
        try:
            import wandb
        except ImportError as error:
            raise BackendUnavailable(f"{_missing('wandb', 'wandb')} ({error})") from None
        directory = Path(config.wandb_dir) if config.wandb_dir else run_dir
        directory.mkdir(parents=True, exist_ok=True)
        resume = resume_step is not None
        # W&B's own ids are 8 lowercase alphanumerics.
        self.run_id = wandb_run_id(run_dir, lambda: secrets.token_hex(4), resume=resume)
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
        self._held: list[tuple[int, dict[str, float]]] = []  # rows not sent yet, in the order they were logged
        self._sent = -1  # the last step W&B has
        self._committed: int | None = None  # the step of the last checkpoint: rows up to it are final
        if resume_step is not None:
            self._catch_up(resume_step, kept_rows)

    def _catch_up(self, resume_step: int, kept_rows: Sequence[Mapping[str, Any]]) -> None:
        """Queue the rows up to the resumed checkpoint that W&B does not have (held back, or lost in a crash)."""
        self._committed = resume_step
        if self._run.disabled:
            self._sent = resume_step
            return
        last = self._run.starting_step - 1  # online: the server's last step (W&B resumes at the step after it)
        if self._run.offline:
            settings = self._run.settings
            try:
                last = max(
                    last, _last_offline_step(Path(settings.wandb_dir), self.run_id, exclude=Path(settings.sync_file))
                )
            except (OSError, ValueError) as error:  # unreadable: assume it has every row, as before this was read
                logger.warning(
                    "could not read the earlier W&B files of run %s (%s); not re-sending rows up to step %d",
                    self.run_id,
                    error,
                    resume_step,
                )
                last = resume_step
        if last > resume_step:
            logger.warning(
                "W&B run %s already has rows up to step %d, after the resumed checkpoint (step %d); W&B keeps those "
                "and drops the resumed run's rows at those steps",
                self.run_id,
                last,
                resume_step,
            )
        self._sent = last
        self._held = [(row["step"], _values(row)) for row in kept_rows if last < row["step"] <= resume_step]

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log(self, step: int, metrics: Mapping[str, float], wall_time: float) -> None:
        self._held.append((step, dict(metrics)))  # sent when a checkpoint makes it final (`commit`, `close`)

    def commit(self, step: int) -> None:
        """Send the held rows before `step` (its checkpoint is written; the row at `step` can still grow)."""
        self._committed = step
        self._send(lambda row_step: row_step < step)

    def rewind(self, step: int) -> None:
        """Drop the held rows after `step`: the rollback re-runs those steps."""
        if step < self._sent:
            logger.warning(
                "W&B run %s already has rows up to step %d, after the rollback's step %d; they stay",
                self.run_id,
                self._sent,
                step,
            )
        self._held = [(row_step, values) for row_step, values in self._held if row_step <= step]
        self._committed = step  # the rollback's target is a checkpoint

    def close(self) -> None:
        """Send the rows up to the last checkpoint, drop the later ones (a resume re-runs them), finish the run."""
        committed = self._committed
        try:
            if committed is not None:
                self._send(lambda row_step: row_step <= committed)
            if self._held:
                logger.info(
                    "W&B run %s leaves out %d row(s) after the last checkpoint (step %s)",
                    self.run_id,
                    len(self._held),
                    committed,
                )
                self._held = []
        finally:
            self._run.finish()

    def _send(self, ready: Callable[[int], bool]) -> None:
        """Send the held rows whose step is `ready`, one W&B row per step (the rows of a step merged in order)."""
        rows: dict[int, dict[str, float]] = {}
        held = []
        for step, values in self._held:
            if ready(step):
                rows.setdefault(step, {}).update(values)
            else:
                held.append((step, values))
        self._held = held
        for step, values in rows.items():  # in step order: the held rows' steps never go back
            if step <= self._sent:  # W&B would drop it (or merge it into the row it has): say so instead
                logger.warning(
                    "W&B run %s already has step %d; its row from metrics.jsonl is not sent", self.run_id, step
                )
                continue
            self._run.log(values, step=step, commit=True)
            self._sent = step


def _values(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics.jsonl row's metrics: without ``step`` and ``time`` (what the sinks receive)."""
    return {key: value for key, value in row.items() if key not in ("step", "time")}


def _last_offline_step(wandb_dir: Path, run_id: str, *, exclude: Path) -> int:
    """The last history step in the offline files of W&B run `run_id` under `wandb_dir` (its ``offline-run-*``
    folders) other than `exclude` (the file this invocation writes); -1 when they hold no row."""
    from wandb.proto import wandb_internal_pb2

    last = -1
    for path in wandb_dir.glob(f"offline-run-*/run-{run_id}.wandb"):
        if path == exclude:
            continue
        for data in _wandb_file_records(path):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated protobuf: no stubs
            try:
                record.ParseFromString(data)
            except Exception:  # a damaged record: the file is read up to it
                break
            if record.WhichOneof("record_type") == "history":
                # W&B's service writes the key as nested_key ["_step"]; older writers as key "_step".
                steps = [
                    item.value_json
                    for item in record.history.item
                    if (item.key or "/".join(item.nested_key)) == "_step"
                ]
                if steps:
                    last = max(last, int(steps[0]))
    return last


_WANDB_FILE_MAGIC = b":W&B"
_BLOCK = 32768  # W&B's run file is a LevelDB log: 32 KiB blocks of chunks, after a 7-byte header
_CHUNK_HEADER = struct.Struct("<IHB")  # checksum, length, kind (1 full, 2 first, 3 middle, 4 last)


def _wandb_file_records(path: Path) -> Iterator[bytes]:
    """The serialized records of a W&B run file (``run-<id>.wandb``), up to the first torn or damaged chunk (the file
    of a killed process ends wherever W&B's service stopped writing)."""
    data = path.read_bytes()
    if data[:4] != _WANDB_FILE_MAGIC:
        raise ValueError(f"{path} is not a W&B run file")
    position, pending = 7, b""
    while position + _CHUNK_HEADER.size <= len(data):
        room = _BLOCK - position % _BLOCK
        if room < _CHUNK_HEADER.size:  # a block's tail too short for a chunk header is padding
            position += room
            continue
        _checksum, length, kind = _CHUNK_HEADER.unpack_from(data, position)
        start = position + _CHUNK_HEADER.size
        if kind not in (1, 2, 3, 4) or length > room - _CHUNK_HEADER.size or start + length > len(data):
            return
        chunk, position = data[start : start + length], start + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        else:
            yield pending + chunk
            pending = b""


def open_sinks(
    config: TrackingConfig | None,
    run_dir: Path,
    *,
    resume_step: int | None,
    run_config: Mapping[str, Any] | None,
    kept_rows: Sequence[Mapping[str, Any]] = (),
) -> list[Sink]:
    """The non-JSONL sinks `config` lists, each given the resolved config; [] for None or jsonl only. A resumed
    run (`resume_step`) passes the metrics.jsonl rows it keeps (`kept_rows`), which W&B may still lack."""
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
                sinks.append(
                    WandbSink(config, run_dir, run_dir.name, run_config, resume_step=resume_step, kept_rows=kept_rows)
                )
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    if sinks:
        logger.info("tracking metrics to %s", ", ".join(["metrics.jsonl", *(s.name for s in sinks)]))
    return sinks


TRACKING_KEYS = frozenset(f"tracking.{field.name}" for field in dataclasses.fields(TrackingConfig))
"""Dotted config keys a resumed run may change: where metrics go does not touch the training math."""
