"""The CLI's error boundary (errors.py, cli.py): the user's bad input is one line naming it and exit status 2;
anything else, a plain `ValueError` included, keeps its traceback and exits 1.

Real parts: the `chessgrpo` command as a process and in-process, a real one-step GRPO run (real Stockfish values)
whose user reward function fails the way an internal shape check would.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from chessgrpo.board import parse_board, parse_move
from chessgrpo.config import ConfigError
from chessgrpo.errors import ChessGRPOError, InputError

# A one-step move-group run from a fresh policy on random positions (as tests/test_user_rewards.py trains).
OVERRIDES = [
    "init_checkpoint=null",
    "positions=random:8",
    "task.group_size=4",
    "task.positions_per_step=2",
    "task.reward_nodes=50",
    "grpo.num_iterations=1",
    "grpo.minibatch_size=0",
    "engine.processes=1",
    "engine.cache=false",
    "eval.positions=null",
    "eval.puzzles=null",
    "steps=1",
    "warmup_steps=0",
    "checkpoint_every=0",
    "threads=1",
]

BROKEN_REWARD = '''
def shape_check(board, move, win_probability):
    """Fails as an internal invariant would: a plain ValueError, not the user's input being wrong."""
    raise ValueError("internal: rewards of shape [4] for a group of 3")
'''


def assert_one_line(stderr: str, *fragments: str) -> None:
    """One `chessgrpo:` line ends stderr, holds every fragment, and no traceback is printed."""
    lines = [line for line in stderr.strip().splitlines() if line.startswith("chessgrpo:")]
    assert len(lines) == 1 and stderr.strip().endswith(lines[0]) and "Traceback" not in stderr, stderr
    assert all(fragment in lines[0] for fragment in fragments), (fragments, stderr)


def test_the_error_classes_keep_except_valueerror_working():
    """`InputError` is a `ValueError`, so code (and tests) that caught validation errors as ValueError still do."""
    assert issubclass(InputError, ValueError) and issubclass(InputError, ChessGRPOError)
    assert issubclass(ConfigError, InputError)
    with pytest.raises(InputError, match="malformed FEN"):
        parse_board("not a fen")
    with pytest.raises(InputError, match="illegal move"):
        parse_move(parse_board("4k3/8/8/8/8/8/8/4K3 w - - 0 1"), "e1e3")


def test_an_internal_valueerror_reaches_the_user_with_its_traceback(cli, tmp_path):
    """A ValueError raised while training (here by a user reward function, standing in for a shape check in rl/)
    is not mistaken for bad input: Python's traceback, exit status 1, no one-line `chessgrpo:` message."""
    (tmp_path / "broken_rewards.py").write_text(textwrap.dedent(BROKEN_REWARD))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    result = cli.run(
        "train",
        "kind=move_group",
        *OVERRIDES,
        f"run.out_dir={tmp_path / 'runs'}",
        "task.reward_fn=broken_rewards:shape_check",
        env=env,
        timeout=300,
    )
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    assert "Traceback (most recent call last)" in result.stderr, result.stderr[-3000:]
    assert 'broken_rewards.py", line' in result.stderr  # the stack reaches the code that raised
    assert result.stderr.rstrip().endswith("ValueError: internal: rewards of shape [4] for a group of 3"), (
        result.stderr[-3000:]
    )
    assert not any(line.startswith("chessgrpo:") for line in result.stderr.splitlines()), result.stderr[-3000:]


def test_a_plain_valueerror_propagates_out_of_main(cli, tmp_path, monkeypatch):
    """In-process, `main` does not turn a plain ValueError into exit status 2: it leaves it to Python."""
    (tmp_path / "broken_rewards_inproc.py").write_text(textwrap.dedent(BROKEN_REWARD))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="internal: rewards of shape") as caught:
        cli.main(
            "train",
            "kind=move_group",
            *OVERRIDES,
            f"run.out_dir={tmp_path / 'runs'}",
            "task.reward_fn=broken_rewards_inproc:shape_check",
        )
    assert not isinstance(caught.value, InputError)


def test_bad_input_is_one_line_and_exit_status_2(cli, tmp_path):
    """A malformed FEN, an unknown config key, a missing file, a bad config value: one line naming the input, exit 2."""
    code, _, stderr = cli.main("engine", "eval", "--fen", "8/8/8/8/8/8/8/8 w - - 0 1", f"run.out_dir={tmp_path}")
    assert code == 2
    assert_one_line(stderr, "invalid position", "'8/8/8/8/8/8/8/8 w - - 0 1'")

    code, _, stderr = cli.main("train", "kind=move_group", "task.group_sise=4", f"run.out_dir={tmp_path}")
    assert code == 2
    assert_one_line(stderr, "config error", "unknown config key task.group_sise", "group_size")

    missing = tmp_path / "no_such_positions.fen"
    code, _, stderr = cli.main("engine", "eval", "--file", str(missing), f"run.out_dir={tmp_path}")
    assert code == 2
    assert_one_line(stderr, str(missing), "does not exist")

    code, _, stderr = cli.main("train", "kind=move_group", "task.group_size=0", f"run.out_dir={tmp_path}")
    assert code == 2  # a __post_init__ check's ValueError, made a ConfigError with its key by config.from_dict
    assert_one_line(stderr, "config key task.group_size")
    assert not any(tmp_path.iterdir())  # nothing written before the input was read


def test_a_bad_line_in_a_fen_file_names_file_and_line(cli, tmp_path):
    path = tmp_path / "positions.fen"
    path.write_text("4k3/8/8/8/8/8/8/4K3 w - - 0 1\nrnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNX w KQkq - 0 1\n")
    code, _, stderr = cli.main("engine", "eval", "--file", str(path), f"run.out_dir={tmp_path / 'runs'}")
    assert code == 2
    assert_one_line(stderr, f"{path}:2:", "malformed FEN")
