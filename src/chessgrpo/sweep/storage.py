"""The Optuna storage of a sweep: opening it (with a heartbeat), quieting Optuna's own logging,
and a storage URL without its password for messages. Shared by `sweep.study` and `sweep.summary`.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from chessgrpo.config import ConfigError

HEARTBEAT_S = 60
GRACE_S = 180
"""A RUNNING trial without a heartbeat for this long belonged to a dead process: it is marked FAILED."""


def quiet_optuna() -> None:
    """Optuna's own INFO lines and its per-failure traceback warnings off: the sweep reports each trial itself."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    class _NoTrialFailures(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("Trial ")

    failures = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(f, _NoTrialFailures) for f in failures.filters):
        failures.addFilter(_NoTrialFailures())


def open_storage(url: str) -> Any:
    """An Optuna RDB storage with a heartbeat (trials of a killed process become FAILED, not RUNNING forever).

    SQLite: the file's directory is created, and writers wait up to 60 s for the lock (parallel workers).
    """
    import optuna

    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 60}}
    try:
        with warnings.catch_warnings():  # the heartbeat is marked experimental; it is what makes a killed trial FAILED
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
            )
    except Exception as error:  # sqlalchemy: a bad URL, a missing driver, a server that cannot be reached
        raise ConfigError(
            f"storage {redacted(url)!r} cannot be opened: {type(error).__name__}: {str(error).splitlines()[0]}"
        ) from None


def redacted(url: str) -> str:
    """The URL without a password (error messages and summaries)."""
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, credentials = head.partition("://")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}"
