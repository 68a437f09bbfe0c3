"""Shared fixtures: the one way tests run the `chessgrpo` command, and the small data sets several files use.

Everything is real: the command runs as a process (`cli.run`) or in-process through `chessgrpo.cli.main`
(`cli.main`, for tests that read its output cheaply); the data sets are labelled by real Stockfish at
small node limits. Plain helpers (paths of the shared data) stay in `helpers.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

ROOKWORLD_NODES = 300
"""Stockfish nodes of the tiny RookWorld data set's labels (and of the GRPO runs that read it)."""


class CLI:
    """The `chessgrpo` command: `run` runs a real process to its end, `start` starts one and returns it, `main`
    calls the entry point in this process."""

    def __init__(self, capsys: pytest.CaptureFixture[str]):
        self._capsys = capsys

    def run(
        self, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """`python -m chessgrpo.cli ARGS` in `cwd` (default: the current directory) with `env` (default: this one's)."""
        return subprocess.run(
            [sys.executable, "-m", "chessgrpo.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env if env is not None else dict(os.environ),
        )

    def start(
        self, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None, **popen
    ) -> subprocess.Popen:
        """`python -m chessgrpo.cli ARGS` started and not waited for, for tests that kill it or talk to it: stdout
        and stderr piped as text unless `popen` says otherwise (it also takes stdin=, start_new_session=, ...).
        The caller waits for the process or kills it."""
        options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
        return subprocess.Popen(
            [sys.executable, "-m", "chessgrpo.cli", *args],
            cwd=cwd,
            env=env if env is not None else dict(os.environ),
            **options,
        )

    def main(self, *args: str) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of `chessgrpo.cli.main(ARGS)` in this process."""
        from chessgrpo.cli import main

        self._capsys.readouterr()  # drop what the test printed before
        code = main(list(args))
        captured = self._capsys.readouterr()
        return code, captured.out, captured.err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> CLI:
    """The `chessgrpo` command (a process with `cli.run` or `cli.start`, in-process with `cli.main`)."""
    return CLI(capsys)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``), as the game
    workers and `chessgrpo uci` run: on a busy 2-core machine torch's threads only slow tiny models down."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def rookworld_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 40-position RookWorld data set (P: and A: lines, train and test splits) and its evaluation cache:
    ROOT/data and ROOT/cache.sqlite, with ROOT returned."""
    from chessgrpo.data.rookworld import RookWorldDataConfig, run_rookworld_data

    root = tmp_path_factory.mktemp("rookworld_data")
    config = RookWorldDataConfig(out=str(root / "data"), positions=40, nodes=ROOKWORLD_NODES, seed=3, test_fraction=0.2)
    config.engine.processes = 1
    config.engine.cache_path = str(root / "cache.sqlite")
    run_rookworld_data(config)
    return root


__all__ = ["CLI", "REPO_ROOT", "ROOKWORLD_NODES"]
