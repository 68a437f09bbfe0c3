"""`data generate` and the shared labelling, against the real Stockfish at tiny node limits."""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import time

import chess
import pytest

from chessgrpo.board import move_to_action
from chessgrpo.cli import main
from chessgrpo.config import load_config, to_dict
from chessgrpo.data import schema
from chessgrpo.data.generate import GenerateConfig, generate_dataset, sample_move
from chessgrpo.data.labelling import DataEngineConfig, LabelSettings, label_boards
from chessgrpo.engine import EnginePool
from chessgrpo.engine.evaluation import MoveEvaluation

BLACK_MATES_IN_ONE = "r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1"  # ...Ra1#
BLACK_WINS_THE_QUEEN = "3r2k1/5ppp/8/8/3Q4/8/5PPP/6K1 b - - 0 1"  # ...Rxd4, the queen is undefended
WHITE_MATES_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8#
NODES, MULTIPV = 200, 3


@pytest.fixture(scope="module")
def pool():
    with EnginePool(processes=2, nodes=NODES) as engine_pool:
        yield engine_pool


def tiny_config(out, **changes) -> GenerateConfig:
    settings = dict(
        out=str(out), positions=150, nodes=NODES, multipv=MULTIPV, seed=1, shard_size=60, concurrent_games=8
    )
    settings.update(changes)
    return GenerateConfig(**settings)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, pool):
    directory = tmp_path_factory.mktemp("generated")
    summary = generate_dataset(tiny_config(directory), pool=pool)
    return directory, summary, schema.read_positions(directory).to_pylist()


def test_generated_dataset_is_exact_unique_and_split_by_hash(dataset):
    directory, summary, rows = dataset
    assert len(rows) == 150 == summary.total == summary.added
    keys = [schema.position_key(row["fen"]) for row in rows]
    assert len(set(keys)) == len(keys)
    for split in schema.SPLITS:
        split_rows = schema.read_positions(directory, split=split).column("fen").to_pylist()
        assert all(schema.split_of(fen, 0.05) == split for fen in split_rows)
    sources = collections.Counter(row["source"] for row in rows)
    assert sources == {"engine_game": 120, "random_playout": 30}
    manifest = schema.read_manifest(directory)
    assert manifest["complete"] and manifest["positions"] == 150 and manifest["sources"] == dict(sources)
    assert manifest["engine"].startswith("Stockfish") and (manifest["nodes"], manifest["multipv"]) == (NODES, MULTIPV)
    assert sorted(p.name for p in (directory / "train").iterdir()) == [f"shard-0000{i}.parquet" for i in range(3)]
    assert (directory / "config.yaml").is_file()


def test_generated_labels_are_consistent_and_legal(dataset):
    _, _, rows = dataset
    for row in rows:
        board = chess.Board(row["fen"])
        assert not board.is_game_over()
        assert row["best_move"] == row["moves"][0] and row["best_action"] == move_to_action(row["best_move"])
        assert all(chess.Move.from_uci(move) in board.legal_moves for move in row["moves"])
        assert len(set(row["moves"])) == len(row["moves"]) == min(MULTIPV, board.legal_moves.count())
        probs = row["win_probs"]
        assert all(0.0 <= p <= 1.0 for p in probs) and row["value"] == probs[0]
        assert all(a >= b for a, b in zip(probs, probs[1:])), row
        assert row["nodes"] == NODES and row["legal_moves"] is None and row["legal_win_probs"] is None
    turns = collections.Counter(chess.Board(row["fen"]).turn for row in rows)
    assert turns[chess.WHITE] > 20 and turns[chess.BLACK] > 20


def test_engine_games_have_diverse_openings(dataset):
    _, _, rows = dataset
    games = [chess.Board(row["fen"]) for row in rows if row["source"] == "engine_game"]
    early = {board.board_fen() for board in games if 3 <= board.fullmove_number <= 5}
    assert len(early) >= 15  # random opening plies + sampled moves: games do not share one line
    # Games run on across shards (3 shards of 48 engine positions, 8 games): well past the opening.
    assert sum(board.fullmove_number >= 8 for board in games) >= 20


def test_converging_games_are_deduplicated(pool, tmp_path):
    # One random ply, greedy play, games of 3 plies: games that open alike repeat each other
    # (20 first moves, at most 40 distinct positions), yet the dataset holds exactly 30 distinct ones.
    config = tiny_config(
        tmp_path / "greedy",
        positions=30,
        shard_size=12,
        random_playout_fraction=0.0,
        opening_random_plies_min=1,
        opening_random_plies_max=1,
        sampling_temperature=0.0,
        max_game_plies=3,
    )
    summary = generate_dataset(config, pool=pool)
    fens = schema.read_positions(tmp_path / "greedy").column("fen").to_pylist()
    assert summary.total == len(fens) == 30 == len({schema.position_key(fen) for fen in fens})


def test_black_labels_are_the_best_move_for_black(pool, dataset):
    settings = LabelSettings(nodes=NODES, multipv=MULTIPV)
    boards = [chess.Board(fen) for fen in (BLACK_MATES_IN_ONE, BLACK_WINS_THE_QUEEN, WHITE_MATES_IN_ONE)]
    mate, queen, white = label_boards(pool, boards, "test", settings)
    assert (mate["best_move"], mate["value"]) == ("a8a1", 1.0)
    assert queen["best_move"] == "d8d4" and queen["value"] > 0.9
    assert (white["best_move"], white["value"]) == ("a1a8", 1.0)
    for row in (mate, queen, white):
        assert row["win_probs"][0] == max(row["win_probs"])
    assert min(queen["win_probs"]) < 0.1  # any other move loses: the queen mates on d8
    _, _, rows = dataset
    black_rows = [row for row in rows if " b " in row["fen"]]
    assert black_rows and all(row["win_probs"][0] >= max(row["win_probs"]) for row in black_rows)


def test_all_legal_values(pool):
    [row] = label_boards(
        pool, [chess.Board(BLACK_MATES_IN_ONE)], "test", LabelSettings(NODES, MULTIPV, all_legal_values=True)
    )
    board = chess.Board(BLACK_MATES_IN_ONE)
    assert sorted(row["legal_moves"]) == sorted(move.uci() for move in board.legal_moves)
    values = dict(zip(row["legal_moves"], row["legal_win_probs"]))
    assert values["a8a1"] == 1.0  # the child is checkmate: scored exactly
    assert all(0.0 <= value <= 1.0 for value in values.values())
    assert max(values.values()) == row["value"]


def test_move_sampling_follows_the_temperature():
    lines = [
        MoveEvaluation("e2e4", 0.60, (0, 0, 0)),
        MoveEvaluation("d2d4", 0.58, (0, 0, 0)),
        MoveEvaluation("a2a3", 0.30, (0, 0, 0)),
    ]
    assert {sample_move(lines, 0.0, random.Random(seed)) for seed in range(20)} == {"e2e4"}
    picks = collections.Counter(sample_move(lines, 0.05, random.Random(seed)) for seed in range(400))
    assert picks["e2e4"] > picks["d2d4"] > 100 and picks["a2a3"] < 5
    assert [sample_move(lines, 0.05, random.Random(3)) for _ in range(5)] == [
        sample_move(lines, 0.05, random.Random(3)) for _ in range(5)
    ]


def test_engine_overrides_keep_labelling_defaults():
    config = load_config(GenerateConfig, None, ["engine.processes=2", "out=x"])
    assert isinstance(config.engine, DataEngineConfig)
    assert (config.engine.processes, config.engine.nodes, config.engine.cache) == (2, None, False)


def test_bad_arguments_give_one_clear_error(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [
        (["--out", str(tmp_path / "a"), "--positions", "0"], "positions=0"),
        (["--out", str(a_file)], "is a file"),
        (["--positions", "10"], "--out"),
        (["--out", str(tmp_path / "b"), "--nodes", "5", "nodes=6"], "given twice"),
        (["--out", str(tmp_path / "c"), "engine.nodes=999"], "engine.nodes"),
        (["--out", str(tmp_path / "d"), "--multipv", "0"], "multipv"),
    ]
    for args, message in cases:
        assert main(["data", "generate", *args]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_killed_run_resumes_without_duplicates_or_corrupt_shards(cli, tmp_path, pool):
    out = tmp_path / "resumed"
    args = [
        "data",
        "generate",
        "--out",
        str(out),
        "--positions",
        "200",
        "--nodes",
        str(NODES),
        "--multipv",
        str(MULTIPV),
        "--seed",
        "1",
        "shard_size=40",
        "concurrent_games=8",
        "engine.processes=2",
    ]
    # Own session, so the kill also takes the engines; we kill only what we started.
    process = cli.start(*args, start_new_session=True)
    first = out / "train" / "shard-00000.parquet"
    deadline = time.monotonic() + 60
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    stored = schema.read_positions(out, columns=["fen"]).num_rows  # every complete shard is readable
    assert 0 < stored < 200

    finish = cli.start(*args)
    stdout, stderr = finish.communicate(timeout=120)
    assert finish.returncode == 0, stderr
    fens = schema.read_positions(out).column("fen").to_pylist()
    assert len(fens) == 200 and len({schema.position_key(fen) for fen in fens}) == 200
    assert not list(out.rglob("*.tmp")) and schema.read_manifest(out)["complete"]

    mtimes = {path: path.stat().st_mtime_ns for path in out.rglob("*")}
    again = cli.start(*args)
    stdout, stderr = again.communicate(timeout=120)
    assert again.returncode == 0 and "nothing to do" in stdout, stderr
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == mtimes

    # Shards come from (seed, shard index) streams: the interrupted run equals an uninterrupted one.
    straight = generate_dataset(
        tiny_config(tmp_path / "straight", positions=200, seed=1, shard_size=40, concurrent_games=8), pool=pool
    )
    assert straight.total == 200
    assert sorted(schema.read_positions(tmp_path / "straight").column("fen").to_pylist()) == sorted(fens)


def test_shipped_tiny_config_loads_and_names_every_key():
    from helpers import REPO_ROOT

    path = REPO_ROOT / "configs" / "data_tiny.yaml"
    config = load_config(GenerateConfig, path)
    config.validate()
    text = path.read_text()
    assert all(f"\n{key}:" in text for key in to_dict(GenerateConfig()) if key != "engine")
    assert all(f"\n  {key}:" in text for key in to_dict(DataEngineConfig()))


def test_a_shard_changed_on_disk_is_named_by_the_rerun_and_by_readers(dataset, tmp_path, pool):
    """The manifest records each shard's SHA-256: a byte flipped anywhere (even in a column the
    resume does not read) stops the rerun and every reader with the file's name, and changes nothing."""
    source, _, _ = dataset
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    manifest = schema.read_manifest(copy)
    assert set(manifest["shard_sha256"]) == {p.relative_to(copy).as_posix() for p in schema.shard_paths(copy)}
    shard = copy / "test" / "shard-00001.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    before = {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()}
    with pytest.raises(ValueError, match=r"test/shard-00001\.parquet.*SHA-256"):
        generate_dataset(tiny_config(copy, positions=200), pool=pool)
    with pytest.raises(ValueError, match=r"test/shard-00001\.parquet.*SHA-256"):
        schema.read_positions(copy)
    assert {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()} == before
