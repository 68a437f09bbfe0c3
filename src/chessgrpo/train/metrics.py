"""A small JSONL metrics writer: one JSON object per logged step, flushed on every write.

Each line of ``RUN_DIR/metrics.jsonl`` looks like::

    {"step": 100, "time": 1718000000.0, "loss/train": 2.31, "train/top1": 0.21, "lr": 0.001}

``step`` is the number of optimizer steps completed, ``time`` is Unix time in seconds, and every
other key is ``<group>/<metric>`` (docs/architecture.md, "Run directory and metrics", lists the groups) or a top-level scalar like
``lr``. Non-finite values are written as JSON's ``NaN`` / ``Infinity`` extensions (Python's `json`
and pandas read them back) so a diverged run shows up as such instead of disappearing.

Resuming: ``MetricsWriter(path, resume_step=k)`` keeps the rows with ``step <= k`` (the ones that
belong to the checkpoint being resumed), drops later rows and a torn last line, and appends from
there, so a resumed run never has duplicate or orphaned steps.

Other backends: ``MetricsWriter(path, tracking=TrackingConfig(backends=[...]), run_config=...)``
also sends every row, under the same names and steps, to TensorBoard and/or W&B, and logs the
resolved config to each (see `chessgrpo.train.backends`). The JSONL file is written either way.
The writer's owner says when rows become final: `commit` after each checkpoint, `rewind` after a
rollback; W&B, whose history cannot be rewound, receives the rows up to the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import numbers
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chessgrpo.files import read_text

if TYPE_CHECKING:
    from chessgrpo.train.backends import Sink, TrackingConfig

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
"""The run's events (rollbacks, early stops, resumes), one JSON object a line."""


def _scalar(key: str, value: Any) -> float | int:
    """A plain Python number from a float/int/0-d tensor/numpy scalar; anything else is an error."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"metric {key!r} must be a real number, got {type(value).__name__}: {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete rows of a metrics file, in file order (a torn last line is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    lines = read_text(path).splitlines()  # names the file on bytes that are not UTF-8
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            # The last line of a run that is still writing is routinely incomplete; elsewhere it is damage.
            log = logger.debug if number == len(lines) else logger.warning
            log("%s:%d is not a complete JSON row (torn write?); skipped", path, number)
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


class MetricsWriter:
    """Append metric rows to a JSONL file; use as a context manager or call `close`.

    Args:
        path: the metrics file (parent directories are created).
        resume_step: None starts a new file (an existing one is replaced); an integer keeps the
            rows with ``step <= resume_step`` and appends after them.
        tracking: other backends (TensorBoard, W&B) that receive the same rows; None = JSONL only.
            Their files go under the metrics file's directory (the run directory) by default.
        run_config: the resolved config (plain data) logged once to each other backend.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        resume_step: int | None = None,
        tracking: TrackingConfig | None = None,
        run_config: Mapping[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[dict[str, Any]] = []
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [row for row in read_metrics(self.path) if row["step"] <= resume_step]
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
            os.replace(tmp, self.path)  # atomic: a crash here leaves the old file, not half of it
        self._handle = self.path.open("a")
        self._last_step = resume_step if resume_step is not None else -1
        self._sinks: list[Sink] = []
        if tracking is not None:
            from chessgrpo.train.backends import open_sinks

            try:
                # The kept rows: a backend may lack some (W&B holds rows back until a checkpoint; a crash loses them).
                self._sinks = open_sinks(
                    tracking, self.path.parent, resume_step=resume_step, run_config=run_config, kept_rows=kept
                )
            except BaseException:
                self._handle.close()
                raise

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write one row ``{"step", "time", **metrics}`` and flush; returns the row."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        if step < self._last_step:
            raise ValueError(f"metrics step went backwards: {step} after {self._last_step}")
        row: dict[str, Any] = {"step": step, "time": time.time()}
        for key, value in metrics.items():
            if key in row:
                raise ValueError(f"metric name {key!r} is reserved")
            row[key] = _scalar(key, value)
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()
        self._last_step = step
        if self._sinks:
            values = {k: v for k, v in row.items() if k not in ("step", "time")}
            for sink in self._sinks:
                sink.log(step, values, row["time"])
        return row

    def commit(self, step: int) -> None:
        """A checkpoint of `step` is written: the rows up to it are final (W&B receives them; see `backends.WandbSink`)."""
        for sink in self._sinks:
            sink.commit(step)

    def rewind(self, step: int) -> None:
        """Drop the rows after `step` (a run rolled back to that step's checkpoint) and append from there."""
        self._handle.close()
        kept = [row for row in read_metrics(self.path) if row["step"] <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
        os.replace(tmp, self.path)
        self._handle = self.path.open("a")
        self._last_step = min(self._last_step, step)
        for sink in self._sinks:
            sink.rewind(step)

    def close(self) -> None:
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception as error:  # a backend failing to close must not lose the JSONL file
                logger.warning("closing the %s tracking backend failed: %s", sink.name, error)
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
