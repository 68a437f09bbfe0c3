"""The `chessgrpo` command, run as a real process."""

from __future__ import annotations

import json
import os

import yaml

from helpers import SYZYGY_DIR


def test_doctor_reports_versions_and_tables(cli):
    result = cli.run("doctor", f"engine.syzygy_path={SYZYGY_DIR}")
    assert result.returncode == 0, result.stderr
    for expected in ("python", "torch", "python-chess", "Stockfish 15.1", "35 WDL tables up to 4 pieces"):
        assert expected in result.stdout


def test_doctor_reports_the_shipped_data_from_another_directory(cli, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "CHESSGRPO_DATA"}
    result = cli.run("doctor", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    rows = {
        line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in result.stdout.splitlines() if "  " in line
    }
    # The default data/syzygy, found in the checkout, and said to be the shipped set.
    assert rows["syzygy"].startswith("35 WDL tables up to 4 pieces in ") and rows["syzygy"].endswith(
        "(shipped with the repository)"
    )
    assert rows["puzzles"].startswith("found: ") and rows["puzzles"].endswith(
        "lichess_puzzles_dev.csv (shipped with the repository)"
    )
    assert rows["rookworld samples"].startswith("found: ")
    assert rows["data/tiny"].startswith(("found: ", "MISSING (optional; "))  # made by `chessgrpo data generate`
    assert "all required components found" in result.stdout


def test_version_names_chessgrpo_torch_and_python_chess(cli):
    from importlib.metadata import version

    result = cli.run("--version")
    assert result.returncode == 0 and result.stderr == ""
    [line] = result.stdout.splitlines()
    assert line.startswith(
        f"chessgrpo {version('chessgrpo')} (torch {version('torch')}, python-chess {version('chess')}, Python "
    )


def test_doctor_fails_clearly_without_stockfish(cli, tmp_path):
    result = cli.run("doctor", f"engine.path={tmp_path / 'missing'}")
    assert result.returncode == 1
    assert "MISSING" in result.stdout and "apt-get install stockfish" in result.stdout


def test_engine_eval_json_and_run_directory(cli, tmp_path):
    result = cli.run(
        "engine",
        "eval",
        "--json",
        "--fen",
        "r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1",
        "--fen",
        "6k1/5ppp/8/8/8/8/5PPP/r5K1 w - - 0 1",
        f"run.out_dir={tmp_path}",
        "run.name=smoke",
        "engine.nodes=1000",
        "engine.cache=false",
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["best_move"], r["win_probability"]) for r in rows] == [("a8a1", 1.0), (None, 0.0)]
    saved = yaml.safe_load((tmp_path / "smoke" / "config.yaml").read_text())
    assert saved["engine"]["nodes"] == 1000 and saved["engine"]["cache"] is False
    assert len((tmp_path / "smoke" / "evaluations.jsonl").read_text().splitlines()) == 2


def test_engine_eval_random_positions_with_cache(cli, tmp_path):
    args = [
        "engine",
        "eval",
        f"run.out_dir={tmp_path}",
        "random_positions=12",
        "engine.nodes=500",
        f"engine.cache_path={tmp_path / 'cache.sqlite'}",
    ]
    first, second = cli.run(*args), cli.run(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "12 positions (12 searched, 0 from cache" in first.stdout
    assert "12 positions (0 searched, 12 from cache, hit rate 100%)" in second.stdout


def test_bad_inputs_give_one_clear_error(cli, tmp_path):
    unknown = cli.run("engine", "eval", "engine.nodez=5", f"run.out_dir={tmp_path}")
    assert unknown.returncode == 2 and "unknown config key engine.nodez" in unknown.stderr
    assert "did you mean 'nodes'?" in unknown.stderr  # the closest valid key
    assert "Traceback" not in unknown.stderr
    injected = cli.run("engine", "eval", "--fen", "8/8/8/8/8/8/8/K6k w - - 0 1\nquit", f"run.out_dir={tmp_path}")
    assert injected.returncode == 2 and "malformed FEN" in injected.stderr and "Traceback" not in injected.stderr
    missing = cli.run(
        "engine", "eval", "engine.path=/nonexistent/stockfish", f"run.out_dir={tmp_path}", "random_positions=1"
    )
    assert missing.returncode != 0 and "apt-get install stockfish" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_resume_names_config_keys_the_run_predates(cli, tmp_path):
    """A key added after a run started resumes with today's default; the warning says which and what."""
    from chessgrpo.config import save_config
    from chessgrpo.tasks.kinds.sft import SFTTrainConfig

    run_dir = tmp_path / "old_sft"
    run_dir.mkdir()
    save_config(SFTTrainConfig(), run_dir / "config.yaml")
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    del written["move_order"]  # as written before the key existed
    (run_dir / "config.yaml").write_text(yaml.safe_dump(written))
    result = cli.run("sft", "--resume", str(run_dir))
    assert result.returncode != 0 and "no checkpoint" in result.stderr  # refused, after the warning
    assert "predates config keys" in result.stderr and "move_order=" in result.stderr and "shuffle" in result.stderr
