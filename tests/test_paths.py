"""Data defaults found from any current directory (`chessgrpo.paths`): the resolver, the eval commands and the doctor."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from chessgrpo import paths
from chessgrpo.paths import DATA_ENV, DataNotFoundError, find_data_path, resolve_data_path, resolve_optional
from helpers import DATA_DIR, REPO_ROOT, SYZYGY_DIR, data_file

PUZZLES_DEFAULT = paths.PUZZLES_DEFAULT


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A current directory far from the checkout, without $CHESSGRPO_DATA."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv(DATA_ENV, raising=False)
    return cwd


# --------------------------------------------------------------------------------------------
# The resolver


def test_repo_root_is_the_checkout():
    assert paths.repo_root() == REPO_ROOT
    assert paths.data_suffix("data/syzygy") == Path("syzygy")
    assert paths.data_suffix("data/a/b.csv") == Path("a/b.csv")
    assert paths.data_suffix("data") == Path(".")
    assert paths.data_suffix("configs/games.yaml") is None and paths.data_suffix("../data/x") is None


def test_the_defaults_are_shipped_in_the_repository(elsewhere):
    """Every data default resolves inside the checkout with nothing beside it, and the doctor says so."""
    for default in (paths.SYZYGY_DEFAULT, paths.PUZZLES_DEFAULT, paths.ROOKWORLD_SAMPLES_DEFAULT):
        assert resolve_data_path(default) == REPO_ROOT / default
        assert paths.data_origin(default) == "shipped with the repository"
    assert len(list((REPO_ROOT / paths.SYZYGY_DEFAULT).glob("*.rtbw"))) == 35
    assert len((REPO_ROOT / paths.PUZZLES_DEFAULT).read_text().splitlines()) == 501  # the header and 500 puzzles
    assert paths.data_origin("data/nope") == "not found"


def test_nothing_names_a_directory_beside_the_checkout():
    """The repository stands alone: no tracked source, config, script, test, Makefile or CI file points at a
    sibling "shared" directory, which a user who clones the repository never has."""
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "src", "configs", "scripts", "tests", "bench", "Makefile", ".ci"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # Spelled in parts so that this file does not match itself: the path, and the same path built with pathlib.
    siblings = ("../" + "shared", '"shared" / ' + '"data"')
    offenders = [name for name in tracked if any(s in (REPO_ROOT / name).read_text(errors="replace") for s in siblings)]
    assert tracked and offenders == []


def test_absolute_and_existing_relative_paths_are_used_as_given(elsewhere, tmp_path, monkeypatch):
    absolute = tmp_path / "mine.csv"
    absolute.write_text("x")
    assert resolve_data_path(absolute) == absolute
    with pytest.raises(DataNotFoundError, match="not found"):
        resolve_data_path(tmp_path / "missing.csv")  # an absolute path is never looked for elsewhere
    # A user's own relative path keeps its meaning over the checkout's file of the same name.
    (elsewhere / "configs").mkdir()
    (elsewhere / "configs" / "games.yaml").write_text("mine")
    assert resolve_data_path("configs/games.yaml") == Path("configs/games.yaml")


def test_chessgrpo_data_comes_first_then_the_current_directory_then_the_checkout(elsewhere, tmp_path, monkeypatch):
    # Not here, no $CHESSGRPO_DATA: the checkout (a tracked file stands in for data/tiny).
    assert resolve_data_path("configs/games.yaml") == REPO_ROOT / "configs" / "games.yaml"
    assert resolve_data_path("data/syzygy") == REPO_ROOT / "data" / "syzygy"
    # $CHESSGRPO_DATA stands for data/ and comes first, even over the current directory and the shipped set
    # (larger tables placed there replace the shipped ones): data/X is X there, any other relative path P is P there.
    data = tmp_path / "copy"
    (data / "syzygy").mkdir(parents=True)
    (data / "configs").mkdir()
    (data / "configs" / "games.yaml").write_text("copy")
    (elsewhere / "configs").mkdir()
    (elsewhere / "configs" / "games.yaml").write_text("mine")
    monkeypatch.setenv(DATA_ENV, str(data))
    assert resolve_data_path("data/syzygy") == data / "syzygy"
    assert paths.data_origin("data/syzygy") == f"from ${DATA_ENV}"
    assert resolve_data_path("data") == data
    assert resolve_data_path("configs/games.yaml") == data / "configs" / "games.yaml"
    assert resolve_data_path("pyproject.toml") == REPO_ROOT / "pyproject.toml"  # not in the copy: the checkout
    assert resolve_data_path(paths.PUZZLES_DEFAULT) == REPO_ROOT / paths.PUZZLES_DEFAULT  # nor this: the shipped file
    # Several Syzygy directories, null, and a lenient lookup that leaves an unknown path alone.
    assert (
        resolve_optional(f"data/syzygy{os.pathsep}pyproject.toml")
        == f"{data / 'syzygy'}{os.pathsep}{REPO_ROOT / 'pyproject.toml'}"
    )
    assert resolve_optional(None) is None
    assert resolve_optional("data/nope", required=False) == "data/nope"
    assert find_data_path("data/nope") is None


def test_a_path_found_nowhere_names_every_place_and_the_variable(elsewhere, tmp_path, monkeypatch):
    with pytest.raises(DataNotFoundError) as unset:
        resolve_data_path("data/nope.csv", "puzzle file")
    message = str(unset.value)
    assert isinstance(unset.value, FileNotFoundError)
    assert message.startswith("puzzle file 'data/nope.csv' not found; looked at ")
    assert f"{elsewhere / 'data' / 'nope.csv'} (the current directory)" in message
    assert f"${DATA_ENV}/nope.csv (${DATA_ENV} is not set)" in message
    assert f"{REPO_ROOT / 'data' / 'nope.csv'} (the repository root)" in message
    assert f"Set {DATA_ENV} to the directory that holds nope.csv" in message
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "copy"))
    with pytest.raises(DataNotFoundError, match=rf"{tmp_path / 'copy' / 'nope.csv'} \(\${DATA_ENV}\)"):
        resolve_data_path("data/nope.csv")
    monkeypatch.setattr(paths, "repo_root", lambda: None)  # an installed copy, not a checkout
    with pytest.raises(DataNotFoundError, match="the repository root \\(not running from a checkout\\)"):
        resolve_data_path("data/tiny", "dataset")


def test_doctor_reports_missing_data_honestly(elsewhere, monkeypatch):
    from chessgrpo.commands.doctor import data_rows

    monkeypatch.setattr(paths, "repo_root", lambda: None)
    rows = dict(data_rows())
    assert set(rows) == {"puzzles", "rookworld samples", "data/tiny"}
    for value in rows.values():
        assert value.startswith("MISSING (optional; needed by ") and DATA_ENV in value and "looked at" in value
    monkeypatch.setenv(DATA_ENV, str(DATA_DIR))
    rows = dict(data_rows())
    assert rows["puzzles"] == f"found: {data_file('lichess_puzzles_dev.csv')} (from ${DATA_ENV})"
    assert rows["rookworld samples"] == f"found: {data_file('rookworld_samples.txt')} (from ${DATA_ENV})"


# --------------------------------------------------------------------------------------------
# The commands, run from a temporary directory


def data_env(data: Path | None) -> dict[str, str]:
    """This environment with $CHESSGRPO_DATA set to `data`, or unset when `data` is None."""
    env = {key: value for key, value in os.environ.items() if key != DATA_ENV}
    if data is not None:
        env[DATA_ENV] = str(data)
    return env


def test_eval_puzzles_defaults_work_from_another_directory(cli, tmp_path):
    csv_path = data_file("lichess_puzzles_dev.csv")
    result = cli.run(
        "eval",
        "puzzles",
        "--policy",
        "random",
        "--max-puzzles",
        "20",
        "--json",
        "baselines=false",
        cwd=tmp_path,
        env=data_env(None),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["puzzles"]["n"] == 20 and Path(report["puzzles"]["source"]).resolve() == csv_path.resolve()


def test_eval_puzzles_reads_a_copy_under_chessgrpo_data(cli, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    lines = data_file("lichess_puzzles_dev.csv").read_text().splitlines(keepends=True)
    (copy / "lichess_puzzles_dev.csv").write_text("".join(lines[:31]))  # the header and 30 puzzles
    cwd = tmp_path / "work"
    cwd.mkdir()
    result = cli.run(
        "eval",
        "puzzles",
        "--policy",
        "random",
        "--max-puzzles",
        "500",
        "--json",
        "baselines=false",
        cwd=cwd,
        env=data_env(copy),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["puzzles"] == {"source": str(copy / "lichess_puzzles_dev.csv"), "n": 30, "skipped": 0}


def test_a_missing_input_is_one_error_naming_where_it_looked(cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli.run(
        "eval",
        "puzzles",
        "--policy",
        "random",
        "--puzzles",
        "data/nope.csv",
        "baselines=false",
        cwd=tmp_path,
        env=data_env(empty),
    )
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("chessgrpo: puzzle file 'data/nope.csv' not found; looked at "), line
    assert (
        f"{empty / 'nope.csv'} (${DATA_ENV})" in line
        and "(the repository root)" in line
        and "Traceback" not in result.stderr
    )


def test_eval_offline_finds_its_positions_under_chessgrpo_data(cli, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "positions.fen").write_text("r5k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1\nk7/8/8/3q4/8/8/8/K2R4 w - - 0 1\n")
    cwd = tmp_path / "work"
    cwd.mkdir()
    result = cli.run(
        "eval",
        "offline",
        "--policy",
        "random",
        "--json",
        "positions=data/positions.fen",
        "nodes=100",
        "engine.processes=1",
        "engine.cache=false",
        "baselines=false",
        cwd=cwd,
        env=data_env(data),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["positions"] == {"source": str(data / "positions.fen"), "n": 2}


def test_eval_games_finds_openings_and_tables_from_another_directory(cli, tmp_path):
    import torch

    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

    torch.manual_seed(0)
    checkpoint = save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path / "ckpt")
    data = tmp_path / "data"
    data.mkdir()
    (data / "openings.epd").write_text("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1\n")
    (data / "syzygy").symlink_to(SYZYGY_DIR, target_is_directory=True)
    cwd = tmp_path / "work"
    cwd.mkdir()
    args = (
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "random",
        "--games",
        "2",
        "--workers",
        "1",
        "--pgn",
        str(tmp_path / "games.pgn"),
        "--json",
        "max_plies=20",
    )
    result = cli.run(*args, "--openings", "data/openings.epd", cwd=cwd, env=data_env(data))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["games_played"] == 2 and summary["openings"] == f"1 openings from {data / 'openings.epd'}"
    # The default Syzygy directory was found under $CHESSGRPO_DATA: tables adjudicate.
    saved = cli.run(
        *args, "--openings", str(data / "openings.epd"), f"output={tmp_path / 'out.json'}", cwd=cwd, env=data_env(data)
    )
    assert saved.returncode == 0, saved.stderr
    assert json.loads((tmp_path / "out.json").read_text())["config"]["engine"]["syzygy_path"] == str(data / "syzygy")
    # Tables found nowhere: one error naming where they were looked for, and how to play without them.
    shutil.rmtree(data)
    data.mkdir()
    (data / "openings.epd").write_text("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1\n")
    missing = cli.run(
        *args, "--openings", "data/openings.epd", "engine.syzygy_path=data/no_tables", cwd=cwd, env=data_env(data)
    )
    assert missing.returncode == 2
    [line] = missing.stderr.strip().splitlines()
    assert "Syzygy directory (engine.syzygy_path) 'data/no_tables' not found" in line
    assert f"{data / 'no_tables'} (${DATA_ENV})" in line and "engine.syzygy_path=null" in line


def test_readers_find_relative_defaults_from_any_directory(elsewhere, monkeypatch):
    """The readers every command shares (Syzygy tables, puzzles, RookWorld text data) resolve a
    relative default the same way, so training and `eval endgame`/`uci` work from anywhere too."""
    from chessgrpo.engine.tablebase import Tablebase
    from chessgrpo.eval.puzzles import read_puzzles

    monkeypatch.setenv(DATA_ENV, str(DATA_DIR))
    with Tablebase("data/syzygy") as tables:
        assert "KQvK" in tables.names
    assert len(read_puzzles(PUZZLES_DEFAULT, max_puzzles=5).puzzles) == 5
    monkeypatch.delenv(DATA_ENV)
    missing = "data/not-here.csv"
    with pytest.raises(FileNotFoundError, match="not-here.csv"):
        read_puzzles(missing)


def test_train_from_another_directory_finds_every_source_of_the_mixture(cli, tmp_path):
    """`chessgrpo train --config <checkout>/configs/grpo_tiny.yaml` from a directory outside the checkout: the
    mixture's dataset source and value positions (data/tiny, under $CHESSGRPO_DATA here) and a source named
    relative to the checkout (tests/data/epd_suite.epd) resolve like every other data path, and the step runs."""
    import torch

    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy

    data = tmp_path / "data"
    done = cli.run(
        "data",
        "generate",
        "--config",
        str(REPO_ROOT / "configs" / "data_tiny.yaml"),
        f"out={data / 'tiny'}",
        "positions=48",
        "nodes=50",
        "engine.processes=1",
        "engine.cache=false",
        "test_fraction=0.25",
        cwd=tmp_path,
        env=data_env(None),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    torch.manual_seed(0)
    checkpoint = save_policy(
        ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True)), tmp_path / "init"
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    mixture = "[{name: engine_games, positions: data/tiny, weight: 0.5}, {name: suite, positions: tests/data/epd_suite.epd, weight: 0.5}]"
    done = cli.run(
        "train",
        "--config",
        str(REPO_ROOT / "configs" / "grpo_tiny.yaml"),
        f"init_checkpoint={checkpoint}",
        f"run.out_dir={tmp_path / 'runs'}",
        "steps=1",
        f"position_mixture={mixture}",
        "task.positions_per_step=4",
        "task.group_size=2",
        "task.reward_nodes=50",
        "engine.processes=1",
        "engine.cache=false",
        "eval_every=0",
        "eval.positions=null",
        "eval.puzzles=null",
        "grpo.minibatch_size=8",
        "value_batch_size=8",
        cwd=cwd,
        env=data_env(data),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    config = (tmp_path / "runs" / "grpo_tiny" / "config.yaml").read_text()
    assert (
        "data/tiny" in config
        and (tmp_path / "runs" / "grpo_tiny" / "checkpoints" / "latest" / "model.safetensors").is_file()
    )
