"""The dataset schema, shard I/O and the output-directory bookkeeping (no engine needed)."""

from __future__ import annotations

import json

import pytest

from chessgrpo.board import random_playout_positions
from chessgrpo.data import schema
from chessgrpo.data.labelling import DatasetWriter, prepare_output

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
BLACK_MATES = "r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1"


def make_row(fen: str, source: str = "engine_game", legal: bool = False) -> dict:
    row = {
        "fen": fen,
        "source": source,
        "best_move": "e2e4",
        "best_action": 317,
        "moves": ["e2e4", "d2d4"],
        "win_probs": [0.55, 0.5],
        "value": 0.55,
        "legal_moves": None,
        "legal_win_probs": None,
        "nodes": 200,
    }
    if legal:
        row["legal_moves"], row["legal_win_probs"] = ["e2e4", "d2d4", "g1f3"], [0.55, 0.5, 0.52]
    return row


def fens(count: int) -> list[str]:
    """Distinct real positions (seeded random playouts)."""
    return [board.fen() for board in random_playout_positions(count, seed=11, max_plies=40)]


def test_round_trip_with_and_without_legal_values(tmp_path):
    rows = [make_row(START), make_row(BLACK_MATES, source="pgn", legal=True)]
    path = schema.write_shard(rows, tmp_path / "train" / "shard-00000.parquet")
    assert path.is_file() and not list(tmp_path.rglob("*.tmp"))
    table = schema.read_positions(tmp_path, split="train")
    assert table.schema == schema.POSITION_SCHEMA
    back = table.to_pylist()
    assert back[0]["legal_moves"] is None and back[0]["legal_win_probs"] is None
    assert back[1]["legal_moves"] == ["e2e4", "d2d4", "g1f3"]
    for original, read in zip(rows, back):
        assert read["fen"] == original["fen"] and read["moves"] == original["moves"]
        assert read["win_probs"] == pytest.approx(original["win_probs"], abs=1e-6)
    assert schema.read_positions(path, columns=["fen"]).column_names == ["fen"]


def test_corrupt_shard_is_an_error_naming_it(tmp_path):
    schema.write_shard([make_row(START)], tmp_path / "train" / "shard-00000.parquet")
    bad = tmp_path / "train" / "shard-00001.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match="shard-00001.parquet"):
        schema.read_positions(tmp_path)
    (tmp_path / "test").mkdir()
    schema.write_shard([make_row(BLACK_MATES)], tmp_path / "test" / "shard-00001.parquet")
    with pytest.raises(ValueError, match="shard-00001.parquet"):
        DatasetWriter(tmp_path, test_fraction=0.05)  # resuming a damaged dataset stops, naming the file


def test_split_is_a_pure_function_of_the_position():
    assert schema.split_of(START) == schema.split_of(START.replace(" 0 1", " 7 40"))
    many = fens(400)
    test_share = sum(schema.split_of(fen, 0.25) == "test" for fen in many) / len(many)
    assert 0.15 < test_share < 0.35
    assert all(schema.split_of(fen, 0.0) == "train" for fen in many)


def test_writer_splits_counts_and_recovers_from_a_killed_run(tmp_path):
    rows = [make_row(fen, source="random_playout" if i % 3 == 0 else "engine_game") for i, fen in enumerate(fens(90))]
    writer = DatasetWriter(tmp_path, test_fraction=0.3)
    assert writer.write_shard(rows[:45]) == 0 and writer.write_shard(rows[45:]) == 1
    for split in schema.SPLITS:
        table = schema.read_positions(tmp_path, split=split)
        assert all(schema.split_of(fen, 0.3) == split for fen in table.column("fen").to_pylist())
    # What a killed run can leave: a temporary file and an index with only one split written.
    (tmp_path / "train" / "shard-00002.parquet.tmp").write_bytes(b"partial")
    schema.write_shard(rows[:5], tmp_path / "test" / "shard-00002.parquet")
    resumed = DatasetWriter(tmp_path, test_fraction=0.3)
    assert not list(tmp_path.rglob("*.tmp")) and not (tmp_path / "test" / "shard-00002.parquet").exists()
    assert resumed.rows == 90 and resumed.next_shard == 2
    assert all(not resumed.is_new(fen) for fen in fens(90))
    summary = resumed.count_summary()
    assert summary["sources"] == {"engine_game": 60, "random_playout": 30}
    assert sum(summary["splits"].values()) == 90 and summary["shards"] == 2


def test_output_directory_checks(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        prepare_output(str(a_file), {"command": "generate"})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        prepare_output(str(tmp_path / "other"), {"command": "generate"})
    directory, manifest = prepare_output(str(tmp_path / "new"), {"command": "generate", "nodes": 200})
    assert directory.is_dir() and manifest == {}
    schema.write_manifest(directory, {"command": "generate", "identity": {"command": "generate", "nodes": 200}})
    assert prepare_output(str(directory), {"command": "generate", "nodes": 200})[1]["command"] == "generate"
    with pytest.raises(ValueError, match="nodes: 200 there, 300 now"):
        prepare_output(str(directory), {"command": "generate", "nodes": 300})
    with pytest.raises(ValueError, match="data generate"):
        prepare_output(str(directory), {"command": "import-pgn"})
    assert json.loads((directory / "manifest.json").read_text())["schema_version"] == schema.SCHEMA_VERSION


OLD_SCHEMA_NAMES = (
    "fen",
    "source",
    "best_move",
    "best_action",
    "moves",
    "win_probs",
    "value",
    "legal_moves",
    "legal_win_probs",
    "nodes",
)


def write_old_style_shard(rows: list[dict], path) -> None:
    """A shard as written before the game columns existed: only the first ten columns."""
    import pyarrow as pa

    old_schema = pa.schema([schema.POSITION_SCHEMA.field(name) for name in OLD_SCHEMA_NAMES])
    schema.write_parquet(
        pa.Table.from_pylist([{k: row[k] for k in OLD_SCHEMA_NAMES} for row in rows], schema=old_schema), path
    )


def test_an_old_shard_without_the_game_columns_reads_with_them_null(tmp_path):
    """Backward compatibility: a dataset written before the game columns reads everywhere (all columns,
    named columns, old and new shards side by side), the game columns coming back null."""
    assert set(schema.OPTIONAL_COLUMNS) == set(schema.POSITION_SCHEMA.names) - set(OLD_SCHEMA_NAMES)
    old_rows = [make_row(fen) for fen in fens(3)]
    write_old_style_shard(old_rows, tmp_path / "train" / "shard-00000.parquet")
    import pyarrow.parquet as pq

    assert pq.read_schema(tmp_path / "train" / "shard-00000.parquet").names == list(OLD_SCHEMA_NAMES)
    table = schema.read_positions(tmp_path, "train")  # columns=None: every schema column
    assert table.schema == schema.POSITION_SCHEMA and table.num_rows == 3
    for row, original in zip(table.to_pylist(), old_rows):
        assert all(row[name] is None for name in schema.GAME_COLUMNS)
        assert row["fen"] == original["fen"] and row["moves"] == original["moves"]
    named = schema.read_positions(tmp_path, "train", ["fen", "human_move", "mover_rating"])
    assert named.column_names == ["fen", "human_move", "mover_rating"] and named.column("human_move").null_count == 3
    assert schema.read_positions(tmp_path / "train" / "shard-00000.parquet", columns=["fen"]).num_rows == 3
    # A new shard beside the old one (a dataset extended after the columns were added).
    new_row = make_row(START) | {"human_move": "e2e4", "mover_rating": 1500, "ply": 0, "mover_clock": 60.5}
    schema.write_shard([new_row], tmp_path / "train" / "shard-00001.parquet")
    both = schema.read_positions(tmp_path, "train").to_pylist()
    assert [r["human_move"] for r in both] == [None, None, None, "e2e4"] and both[3]["mover_clock"] == 60.5
    assert both[3]["opponent_rating"] is None and both[3]["pgn_eval_cp"] is None  # keys not given are null
    # The writer resumes such a dataset (it reads fen and source only).
    (tmp_path / "test").mkdir()
    write_old_style_shard([], tmp_path / "test" / "shard-00000.parquet")
    schema.write_shard([], tmp_path / "test" / "shard-00001.parquet")
    assert DatasetWriter(tmp_path, test_fraction=0.05).rows == 4
    # A core column missing is still an error naming the shard; an unknown column name is an error.
    import pyarrow as pa

    schema.write_parquet(pa.table({"fen": [START]}), tmp_path / "bad" / "train" / "shard-00000.parquet")
    with pytest.raises(ValueError, match=r"shard-00000.parquet.*lacks columns \['source'"):
        schema.read_positions(tmp_path / "bad")
    with pytest.raises(ValueError, match="unknown dataset columns"):
        schema.read_positions(tmp_path, "train", ["fen", "human_moves"])


def test_a_relative_dataset_directory_is_found_from_any_current_directory(tmp_path, monkeypatch):
    """`value_positions: mydata` (or data/tiny in the shipped configs) resolves like every other data path
    (`chessgrpo.paths`): from another current directory it is found under $CHESSGRPO_DATA or the checkout."""
    from chessgrpo.train.dataset import has_split, load_split

    schema.write_shard([make_row(START)] * 3, tmp_path / "shared" / "mydata" / "train" / "shard-00000.parquet")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("CHESSGRPO_DATA", str(tmp_path / "shared"))
    assert has_split("mydata", "train") and len(load_split("mydata", "train")) == 3
    with pytest.raises(
        FileNotFoundError, match=r"dataset directory 'nodata' does not exist \(looked at .*CHESSGRPO_DATA"
    ):
        load_split("nodata", "train")
