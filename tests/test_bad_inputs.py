"""Errors that name their input: every reader says which file (and line or row) and what is wrong,
in one line, echoes untrusted text cut to a readable length, and leaves nothing half-written.

Real files in tmp_path: scrambled and truncated Parquet shards, files with bytes that are not
UTF-8, broken YAML, a truncated safetensors file, a corrupt evaluation-cache row (searched again
by real Stockfish at 50 nodes), a truncated gzip PGN import.

Cross-cutting: the readers of every command's inputs, through their APIs and the `chessgrpo` CLI
(cli.py's one-line errors): board (FENs, FEN files, openings), config.py, data (schema, rookworld,
pgn_import), engine/cache.py, eval (positions, puzzles), models (policy, lm), train (checkpoint,
dataset), tasks/kinds configs, errors.py.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import sqlite3
from pathlib import Path

import chess
import chess.pgn
import pyarrow as pa
import pytest
import torch

from chessgrpo.board import encode_fen, move_to_action, parse_board, random_playout_positions, read_fen_file
from chessgrpo.board.openings import read_openings
from chessgrpo.config import ConfigError, EngineEvalConfig, load_config
from chessgrpo.data import schema
from chessgrpo.data.rookworld import ROOKWORLD_SCHEMA, read_rookworld, read_rookworld_text
from chessgrpo.engine import EnginePool
from chessgrpo.engine.cache import EvaluationCache, is_search_value
from chessgrpo.errors import CheckpointError, one_line, quote
from chessgrpo.eval.positions import load_eval_positions
from chessgrpo.eval.puzzles import read_puzzles
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, save_policy
from chessgrpo.tasks.kinds import config_class
from chessgrpo.train.checkpoint import TRAINER_STATE_FILE, load_trainer_state
from chessgrpo.train.dataset import load_split

NOT_UTF8 = b"\xff\xfe not text \x80\n"
START = chess.STARTING_FEN


def assert_one_line(stderr: str, *fragments: str) -> None:
    """The error is one short line at the end of stderr (after any progress bars), with every
    fragment, and there is no traceback."""
    lines = [line for line in stderr.strip().splitlines() if line.startswith("chessgrpo:")]
    assert len(lines) == 1 and stderr.strip().endswith(lines[0]), stderr
    assert "Traceback" not in stderr and len(lines[0]) < 400, stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, stderr)


def position_rows(count: int) -> list[dict]:
    """Consistent labelled rows (a legal best move) of distinct random positions."""
    rows = []
    for board in random_playout_positions(count, seed=3, max_plies=40):
        move = sorted(board.legal_moves, key=chess.Move.uci)[0]
        rows.append(
            {
                "fen": board.fen(),
                "source": "random_playout",
                "best_move": move.uci(),
                "best_action": move_to_action(move),
                "moves": [move.uci()],
                "win_probs": [0.5],
                "value": 0.5,
                "legal_moves": None,
                "legal_win_probs": None,
                "nodes": 50,
            }
        )
    return rows


def scramble(path: Path, count: int = 256) -> None:
    """Overwrite `count` bytes in the middle of `path` with seeded noise (its data pages)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    rng = random.Random(0)
    data[middle - count // 2 : middle + count // 2] = bytes(rng.randrange(256) for _ in range(count))
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------------------
# Echoed input


def test_quote_and_one_line():
    assert quote("e2e4") == "'e2e4'"
    long = quote("x" * 10_000)
    assert len(long) < 130 and "(10000 characters)" in long
    assert "\n" not in quote("a\nb" * 100)
    assert one_line(ValueError("first\nsecond\n")) == "first second"
    assert len(one_line("y" * 5000)) < 340


def test_a_10000_character_bad_fen_is_echoed_short(cli, tmp_path):
    junk = "rnbqkbnr/" * 1111 + "x"
    for call in (parse_board, encode_fen):
        with pytest.raises(ValueError) as caught:
            call(junk)
        assert len(str(caught.value)) < 300 and "10000 characters" in str(caught.value)
    code, _, stderr = cli.main("engine", "eval", "--fen", junk, f"run.out_dir={tmp_path}")
    assert code == 2
    assert_one_line(stderr, "malformed FEN", "10000 characters")
    assert not (tmp_path / "engine_eval").exists()  # nothing written before the input was read


# ------------------------------------------------------------------------------------------------
# Parquet


@pytest.fixture()
def scrambled_dataset(tmp_path) -> tuple[Path, Path]:
    """A dataset directory whose only test shard (written by the project's writer) is scrambled."""
    directory = tmp_path / "data"
    rows = position_rows(300)
    schema.write_shard(rows, directory / "train" / "shard-00000.parquet")
    shard = schema.write_shard(rows, directory / "test" / "shard-00000.parquet")
    assert len(schema.read_positions(directory, "test")) == 300
    scramble(shard)
    return directory, shard


def test_scrambled_parquet_shard_names_the_file(cli, scrambled_dataset, tmp_path):
    directory, shard = scrambled_dataset
    for read in (
        lambda: schema.read_positions(directory, "test"),
        lambda: schema.read_positions(shard, columns=["fen"]),
        lambda: load_split(directory, "test"),
        lambda: load_eval_positions(directory),
        lambda: load_eval_positions(shard),
    ):
        with pytest.raises(ValueError) as caught:
            read()
        message = str(caught.value)
        assert str(shard) in message and "\n" not in message and len(message) < 500, message
    code, _, stderr = cli.main(
        "eval",
        "offline",
        "--policy",
        "random",
        "--positions",
        str(shard),
        "engine.processes=1",
        "engine.cache=false",
        "baselines=false",
        f"output={tmp_path / 'result.json'}",
    )
    assert code == 2
    assert_one_line(stderr, str(shard), "not a readable Parquet file")
    assert not (tmp_path / "result.json").exists()


def test_truncated_parquet_shard_and_rookworld_shard_name_the_file(tmp_path):
    shard = schema.write_shard(position_rows(50), tmp_path / "train" / "shard-00000.parquet")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ValueError, match="shard-00000.parquet.*not a readable Parquet file"):
        schema.read_positions(tmp_path, "train")

    rookworld = tmp_path / "rookworld"
    rows = [
        {
            "task": "policy",
            "prompt": f"P: {board.fen()} ",
            "completion": "M: e2e4 B: e2e4",
            "fen": board.fen(),
            "source": "random_playout",
            "moves": ["e2e4"],
            "pawns": [0.1],
            "defect": False,
            "nodes": 50,
        }
        for board in random_playout_positions(300, seed=5)
    ]
    path = schema.write_parquet(
        pa.Table.from_pylist(rows, schema=ROOKWORLD_SCHEMA), rookworld / "test" / "shard-00000.parquet"
    )
    assert len(read_rookworld(rookworld, "test")) == 300
    scramble(path)
    with pytest.raises(ValueError, match="RookWorld shard .*shard-00000.parquet"):
        read_rookworld(rookworld, "test")


# ------------------------------------------------------------------------------------------------
# Text files: bytes that are not UTF-8, malformed lines


def test_engine_eval_file_that_is_not_utf8_names_the_file(cli, tmp_path):
    fens = tmp_path / "positions.fen"
    fens.write_bytes(START.encode() + b"\n" + NOT_UTF8)
    code, _, stderr = cli.main("engine", "eval", "--file", str(fens), f"run.out_dir={tmp_path / 'runs'}")
    assert code == 2
    assert_one_line(stderr, f"{fens}:2:", "not a UTF-8 text file", "byte 0xff")
    assert not (tmp_path / "runs").exists()  # no config.yaml, no half a evaluations.jsonl


def test_readers_name_the_file_of_bytes_that_are_not_utf8(tmp_path):
    readers = {
        "openings.epd": read_openings,
        "openings.pgn": read_openings,
        "positions.fen": lambda path: list(read_fen_file(path)),
        "eval.epd": load_eval_positions,
        "eval.pgn": load_eval_positions,
        "puzzles.csv": read_puzzles,
        "rookworld.txt": read_rookworld_text,
    }
    for name, read in readers.items():
        path = tmp_path / name
        header = b"PuzzleId,FEN,Moves,Rating\n" if name.endswith(".csv") else b"# first line\n"
        path.write_bytes(header + NOT_UTF8)
        with pytest.raises(ValueError) as caught:
            read(path)
        assert f"{path}:2: not a UTF-8 text file (byte 0xff at byte offset {len(header)})" in str(caught.value), name


def test_a_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "positions.fen"
    path.write_text(f"{START}\n# comment\n{'8/' * 3000} w - - 0 1\n")
    with pytest.raises(ValueError) as caught:
        list(read_fen_file(path))
    message = str(caught.value)
    assert message.startswith(f"{path}:3: malformed FEN") and len(message) < 300
    with pytest.raises(ValueError, match=r"positions.fen:3: malformed FEN"):
        read_openings(path)


# ------------------------------------------------------------------------------------------------
# Configs


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("lr=.inf", "lr"),
        ("lr=nan", "lr"),
        ("lr=.nan", "lr"),
        ("lr=-1e-3", "lr"),
        ("lr=0", "lr"),
        ("head_lr=-.inf", "head_lr"),
        ("grpo.epsilon=.nan", "grpo.epsilon"),
        ("grpo.kl_coef=1e999", "grpo.kl_coef"),
        ("task.temperature=.inf", "task.temperature"),
        ("engine.timeout_s=0", "engine.timeout_s"),
        ("engine.processes=-1", "engine.processes"),
        ("max_start_positions=0", "max_start_positions"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_config_errors(override, key):
    with pytest.raises(ConfigError, match=rf"config key {key}\b") as caught:
        load_config(config_class("move_group"), overrides=[override])
    assert "\n" not in str(caught.value)


def test_every_float_of_every_config_rejects_inf():
    """The finiteness check is in the central coercion, so it covers sections no test lists."""
    with pytest.raises(ConfigError, match=r"config key rewards\.policy\.eval_scale: expected a finite number"):
        load_config(config_class("rookworld"), overrides=["rewards.policy.eval_scale=.inf"])
    with pytest.raises(ConfigError, match=r"config key task\.shaping"):
        load_config(config_class("trajectory"), overrides=["task.shaping=-1"])
    with pytest.raises(ConfigError, match=r"config key engine\.depth must be >= 1"):
        load_config(EngineEvalConfig, overrides=["engine.depth=0"])


def test_cli_rejects_an_infinite_learning_rate(cli, tmp_path):
    code, _, stderr = cli.main("train", "kind=move_group", "lr=.inf", f"run.out_dir={tmp_path}")
    assert code == 2
    assert_one_line(stderr, "config key lr", "finite")
    assert not any(tmp_path.iterdir())


def test_yaml_syntax_error_names_file_and_line(cli, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("kind: move_group\nlr: 1e-3\nsteps: [1, 2\ntask:\n  group_size: 4\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config_class("move_group"), path)
    message = str(caught.value)
    assert str(path) in message and "line 4" in message and "\n" not in message, message
    code, _, stderr = cli.main("train", "--config", str(path))
    assert code == 2
    assert_one_line(stderr, str(path), "not valid YAML", "line 4")

    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"kind: move_group\n" + NOT_UTF8)
    with pytest.raises(ConfigError, match=rf"{binary}:2: not a UTF-8 text file"):
        load_config(config_class("move_group"), binary)


# ------------------------------------------------------------------------------------------------
# Checkpoints


def test_truncated_or_corrupt_checkpoint_files_name_the_file(tmp_path):
    save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path / "policy")
    weights, config = tmp_path / "policy" / "model.safetensors", tmp_path / "policy" / "model_config.json"
    assert not [p for p in (tmp_path / "policy").iterdir() if ".tmp" in p.name]  # atomic writes leave no debris
    intact = weights.read_bytes()
    weights.write_bytes(intact[: len(intact) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file \(truncated"):
        load_policy(tmp_path / "policy")
    weights.write_bytes(intact)
    for content in (NOT_UTF8, b"[1, 2]", b'{"d_model": 64, "n_heads": 0}'):
        config.write_bytes(content)
        with pytest.raises(ValueError) as caught:
            load_policy(tmp_path / "policy")
        assert f"{config} is not a valid policy config" in str(caught.value) and "\n" not in str(caught.value)

    state = tmp_path / "step" / TRAINER_STATE_FILE
    state.parent.mkdir()
    torch.save({"step": 3, "tensor": torch.zeros(1000)}, state)
    state.write_bytes(state.read_bytes()[:500])
    with pytest.raises(CheckpointError) as caught:
        load_trainer_state(state.parent)
    assert str(state) in str(caught.value) and "\n" not in str(caught.value)


def test_truncated_lm_weights_name_the_file(tmp_path):
    from chessgrpo.models.lm import LM_WEIGHTS_FILE, LMModelConfig, build_lm, load_lm, save_lm

    save_lm(build_lm(LMModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=64), seed=0), tmp_path / "lm")
    weights = tmp_path / "lm" / LM_WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match=rf"{weights} is not a readable safetensors file \(truncated"):
        load_lm(tmp_path / "lm")


def test_a_checkpoint_of_the_other_kind_is_named_with_the_commands_that_take_it(tmp_path, cli):
    """An LM checkpoint given where an action policy is needed (and the reverse) is one line saying what it is and
    where it goes, not "not a valid policy config" (issue 54)."""
    from chessgrpo.models.lm import LMModelConfig, build_lm, load_lm, save_lm
    from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, save_policy

    save_lm(build_lm(LMModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=64), seed=0), tmp_path / "lm")
    save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path / "policy")
    with pytest.raises(ValueError, match=r"is a chess language model checkpoint .* taken by `train` \(sft, rookworld"):
        load_policy(tmp_path / "lm")
    with pytest.raises(ValueError, match=r"is an action-policy checkpoint, and this needs a chess language model"):
        load_lm(tmp_path / "policy")
    result = cli.run("eval", "puzzles", "--checkpoint", str(tmp_path / "lm"), "--max-puzzles", "2", timeout=120)
    assert result.returncode != 0 and "is a chess language model checkpoint" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "PolicyConfig" not in result.stderr


# ------------------------------------------------------------------------------------------------
# The evaluation cache


def test_unreadable_cache_entries_are_dropped(tmp_path, caplog):
    cache = EvaluationCache(tmp_path / "cache.sqlite")
    good = {"best": "e2e4", "lines": [[30, None, ["e2e4", "e7e5"], 8, 50]]}
    cache.put_many({"good": good, "wrong_shape": {"best": 1}, "not_a_line": {"best": None, "lines": [[1, 2]]}})
    cache._connection.execute("INSERT INTO evaluations VALUES ('not_json', '{\"best\": \"e2')")
    cache._connection.commit()
    with caplog.at_level(logging.WARNING, logger="chessgrpo.engine.cache"):
        found = cache.get_many(["good", "wrong_shape", "not_a_line", "not_json", "absent"])
        cache.get_many(["good"])
    assert found == {"good": good}
    assert (cache.hits, cache.misses, cache.dropped, len(cache)) == (2, 4, 3, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(tmp_path / "cache.sqlite") in warnings[0]
    assert is_search_value(good) and not is_search_value({"best": "e2e4", "lines": [[True, None, [], 1, 1]]})
    cache.close()


def test_a_corrupt_cache_entry_is_searched_again(tmp_path):
    path = tmp_path / "evaluations.sqlite"
    boards = [chess.Board(), chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")]
    with EnginePool(processes=1, nodes=50, cache_path=path) as pool:
        fresh = pool.evaluate(boards)
        assert pool.stats.searches == 2
    with sqlite3.connect(path) as connection:
        keys = [key for (key,) in connection.execute("SELECT key FROM evaluations ORDER BY key")]
        assert len(keys) == 2
        connection.execute("UPDATE evaluations SET value = ? WHERE key = ?", ("{not json", keys[0]))
        connection.execute("UPDATE evaluations SET value = ? WHERE key = ?", (json.dumps({"best": "e2e4"}), keys[1]))
    with EnginePool(processes=1, nodes=50, cache_path=path) as pool:
        again = pool.evaluate(boards)
        assert pool.stats.searches == 2 and pool.stats.cache_hits == 0
    assert [e.best_move for e in again] == [e.best_move for e in fresh] and not any(e.cached for e in again)
    with sqlite3.connect(path) as connection:
        values = [json.loads(value) for (value,) in connection.execute("SELECT value FROM evaluations")]
    assert len(values) == 2 and all(is_search_value(value) for value in values)
    with EnginePool(processes=1, nodes=50, cache_path=path) as pool:
        assert all(e.cached for e in pool.evaluate(boards)) and pool.stats.searches == 0


# ------------------------------------------------------------------------------------------------
# Nothing half-written


def test_a_truncated_pgn_import_fails_naming_the_file_and_leaves_only_whole_shards(cli, tmp_path):
    rng = random.Random(1)
    games = []
    for index in range(40):
        game = chess.pgn.Game(headers={"Event": f"game {index}"})
        node, board = game, chess.Board()
        for _ in range(12):
            move = rng.choice(list(board.legal_moves))
            node, _ = node.add_main_variation(move), board.push(move)
        games.append(str(game))
    packed = gzip.compress(("\n\n".join(games) + "\n").encode(), mtime=0)
    pgn = tmp_path / "games.pgn.gz"
    pgn.write_bytes(packed[: int(len(packed) * 0.7)])
    out = tmp_path / "dataset"
    code, _, stderr = cli.main(
        "data",
        "import-pgn",
        str(pgn),
        "--out",
        str(out),
        "nodes=50",
        "multipv=1",
        "positions_per_game=1",
        "shard_size=3",
        "engine.processes=1",
    )
    assert code == 2
    assert_one_line(stderr, str(pgn), "truncated or corrupt")
    shards = schema.shard_paths(out)
    assert shards and not [p for p in out.rglob("*") if ".tmp" in p.name]
    manifest = schema.read_manifest(out)
    assert len(schema.read_positions(out)) == manifest["positions"] > 0  # every shard whole, the manifest agrees
