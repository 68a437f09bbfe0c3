"""What running an evaluation takes and gives back: the same for a command, a training run and a sweep.

An evaluation's runner (`eval.registry.Evaluation.runner`) is ``runner(config, subject, context) -> EvalOutput``:

- `config`: the evaluation's own config dataclass (`Evaluation.config`: `EvalConfig`, `EndgameEvalConfig`, ...);
- `Subject`: who is evaluated: a checkpoint (or run directory), a baseline by name, or a model in memory (a
  training run's policy at this step);
- `EvalContext`: what the caller lends: a running engine pool, an open tablebase, the held-out items (a
  training run loads them once and passes the same dict every time; a re-measure lends the unseen ones),
  a progress bar;
- `EvalOutput`: the config it ran with, ``to_json()`` (the result file's payload: the summary and, under
  ``records``, the per-item records) and ``metrics(prefix)`` (the flat ``eval/`` metrics a training run logs).

The one writer of result files is `eval.registry.write_result`. This module imports nothing heavy: a reader
of results never imports torch through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

Progress = Callable[[int, str], contextlib.AbstractContextManager[Any]]
"""(items, description) -> a progress bar context with update(n) (and set_postfix(**values)), e.g. the CLI's tqdm bar."""


class _Silent:
    """A progress bar that shows nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextlib.contextmanager
def no_progress(items: int, description: str) -> Iterator[_Silent]:
    """The default `Progress`: no bar (a training run logs its own lines)."""
    yield _Silent()


@dataclasses.dataclass(frozen=True)
class Subject:
    """Who is evaluated: exactly one of a checkpoint (policy or run directory), a baseline policy by name, or a
    model in memory (a training run's policy or chess LM, evaluated as it is)."""

    checkpoint: Path | None = None
    policy: str | None = None
    model: Any = None
    name: str | None = None
    """The name results carry (a model's; a checkpoint is named by its path, a baseline by its name)."""

    def __post_init__(self) -> None:
        given = [self.checkpoint is not None, self.policy is not None, self.model is not None]
        if sum(given) != 1:
            raise ValueError("a Subject is exactly one of checkpoint, policy or model")

    @property
    def label(self) -> str:
        """How results name it: `name` if given, else the checkpoint's path, the baseline's name or "policy"."""
        if self.name is not None:
            return self.name
        if self.checkpoint is not None:
            return str(self.checkpoint)
        return self.policy if self.policy is not None else "policy"


@dataclasses.dataclass
class EvalContext:
    """What the caller lends an evaluation (every field optional: a command passes only its progress bar)."""

    pool: Any = None
    """A running Stockfish `EnginePool` to use (a training run's); None: the evaluation starts its own when it
    needs one, and stops it."""
    tablebase: Any = None
    """An open Syzygy `Tablebase` to use (an endgame run's); None: the evaluation opens its own."""
    items: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Held-out items by evaluation name: lent by the caller (an endgame run's held-out starts, a re-measure's
    unseen positions), or stored here by the evaluation when it loads them from its config, so a caller that
    passes the same dict every time (a training run) loads and labels them once."""
    progress: Progress = no_progress
    notify: Callable[[str], None] = logger.info
    """One-line notes for the user (a resumed match)."""


class EvalOutput(Protocol):
    """What running an evaluation returns."""

    config: Any
    """The config it ran with (paths resolved): recorded in its result file."""

    def to_json(self) -> dict[str, Any]:
        """The result file's payload: the summary, and the per-item records under ``records`` (``{"player": [...]}``
        for the evaluations `eval compare` pairs)."""
        ...

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The flat metrics a training run logs (``eval/<name>`` with ``_low``/``_high``)."""
        ...


def interval_metrics(intervals: dict[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """``{prefix}{name}`` with ``_low``/``_high`` of each `stats.Interval` in `intervals` (name -> interval)."""
    metrics: dict[str, float] = {}
    for name, interval in intervals.items():
        key = f"{prefix}{name}"
        metrics.update({key: interval.value, f"{key}_low": interval.low, f"{key}_high": interval.high})
    return metrics


def policy_player(
    subject: Subject,
    *,
    device: str = "cpu",
    temperature: float = 0.0,
    batch_size: int = 256,
    seed: int | None = None,
    search: Any = None,
) -> Any:
    """The action policy of a checkpoint or model subject as a `play.players.PolicyPlayer` (a baseline subject's
    player is the evaluation's own: `eval.standalone.players`). A checkpoint's player names itself by its path."""
    from chessgrpo.play.players import PolicyPlayer

    if subject.checkpoint is not None:
        return PolicyPlayer.from_checkpoint(
            subject.checkpoint, device=device, temperature=temperature, batch_size=batch_size, seed=seed, search=search
        )
    if subject.model is None:
        raise ValueError(f"baseline {subject.policy!r} is not a policy checkpoint or model")
    return PolicyPlayer(
        subject.model, temperature=temperature, batch_size=batch_size, seed=seed, name=subject.label, search=search
    )
