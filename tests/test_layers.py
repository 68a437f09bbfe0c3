"""The layer contracts of docs/architecture.md, checked by import-linter over every module (lazy imports too).

The contracts live in pyproject.toml (``[tool.importlinter]``). The real package must keep them, and
a copy of the package with one planted upward import (or one planted cycle) must break them, so a
contract that silently checked nothing would fail here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import chessgrpo

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(chessgrpo.__file__).resolve().parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(package_parent: Path) -> subprocess.CompletedProcess:
    """lint-imports with the repository's contracts over the `chessgrpo` package found in `package_parent`."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(REPO / "pyproject.toml")],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _planted_copy(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package whose `module` (a path under chessgrpo/) ends with `line`."""
    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "chessgrpo", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "chessgrpo" / module
    target.write_text(target.read_text() + f"\n\ndef _planted() -> None:\n    {line}\n")
    return copy


def test_the_package_keeps_its_layers_and_has_no_cycles() -> None:
    result = _lint(PACKAGE.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        # rl/ may import nothing of chessgrpo but the base modules; a lazy import counts.
        (
            "rl/loss.py",
            "from chessgrpo.tasks.kinds import kind_class  # noqa",
            "chessgrpo.rl is not allowed to import chessgrpo.tasks",
        ),
        # eval/ sits below the spine.
        (
            "eval/compare.py",
            "import chessgrpo.train.loop  # noqa",
            "chessgrpo.eval is not allowed to import chessgrpo.train",
        ),
        # the match driver sits below the evaluations, which run games through it.
        (
            "play/elo.py",
            "import chessgrpo.eval.registry  # noqa",
            "chessgrpo.play is not allowed to import chessgrpo.eval",
        ),
        # the evaluations and the UCI engine are independent siblings.
        (
            "uci/scores.py",
            "import chessgrpo.eval.registry  # noqa",
            "chessgrpo.uci is not allowed to import chessgrpo.eval",
        ),
        # board/ and rl/ are independent siblings.
        (
            "board/actions.py",
            "import chessgrpo.rl.loss  # noqa",
            "chessgrpo.board is not allowed to import chessgrpo.rl",
        ),
        # a cycle inside one package: the spine's loop already imports checkpoint.
        ("train/checkpoint.py", "import chessgrpo.train.loop  # noqa", "No cycles are allowed in chessgrpo.train"),
    ],
)
def test_a_planted_violation_breaks_the_contracts(tmp_path: Path, module: str, line: str, expected: str) -> None:
    result = _lint(_planted_copy(tmp_path, module, line))
    assert result.returncode != 0
    assert expected in result.stdout, result.stdout
