"""The README's library snippet runs as printed (issue 55: it once raised NameError), with the real Stockfish."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_python_snippets_run_and_print_what_their_comments_say(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "the README has no python snippet"
    script = tmp_path / "snippet.py"
    script.write_text("\n\n".join(blocks))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["1.0 1 a8a1", "77 17 a8a1"]  # the values the snippet's comments promise
