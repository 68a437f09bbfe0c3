"""The supervised warm start of the endgame curriculum: `data endgame`, `pretrain` on it, `eval endgame`.

The dataset itself is data/endgame.py's (move values, the held-out set, symmetric images, its config);
the last test runs the warm start end to end through the CLI (`data endgame`, `pretrain`,
`eval endgame` and `eval compare`).

Real Syzygy tables, real processes (the CLI), real Parquet files; a few hundred probes per test.
"""

from __future__ import annotations

import json

import chess
import pytest

from chessgrpo.board.endgames import EndgameStarts, symmetric_epds
from chessgrpo.config import ConfigError
from chessgrpo.data import schema
from chessgrpo.data.endgame import PLY_STEP, EndgameDataConfig, generate_endgame_dataset, move_values
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.eval.compare import compare_files
from helpers import SYZYGY_DIR


@pytest.fixture(scope="module")
def tablebase():
    with Tablebase(str(SYZYGY_DIR)) as tablebase:
        yield tablebase


def test_move_values_rank_mate_first_and_score_stalemating_moves_as_draws(tablebase):
    # White: Kb6, Qc1; Black: Ka8. Qc8# mates; Qc7 stalemates (a7, b8 covered, no check); Qh1 keeps the win.
    board = chess.Board("k7/8/1K6/8/8/8/8/2Q5 w - - 0 1")
    values = dict(move_values(tablebase, board))
    ranked = [uci for uci, _ in move_values(tablebase, board)]
    assert ranked[0] == "c1c8" and values["c1c8"] == 1.0  # mate: 0 plies left
    assert values["c1c7"] == 0.5  # stalemate gives the win away
    assert 0.5 < values["c1h1"] < 1.0 and values["c1h1"] == pytest.approx(
        1.0 - PLY_STEP * tablebase.state(_after(board, "c1h1"), chess.WHITE).plies
    )
    assert len(values) == board.legal_moves.count()


def _after(board: chess.Board, uci: str) -> chess.Board:
    after = board.copy()
    after.push_uci(uci)
    return after


def test_dataset_excludes_the_held_out_set_and_labels_dtz_optimal_moves_best(tmp_path, tablebase):
    config = EndgameDataConfig(
        out=str(tmp_path / "kqk"),
        material="KQvK",
        positions=120,
        processes=1,
        held_out=200,
        held_out_seed=0,
        syzygy_path=str(SYZYGY_DIR),
    )
    summary = generate_endgame_dataset(config)
    assert summary.positions == 120 and sum(summary.splits.values()) == 120
    rows = schema.read_positions(tmp_path / "kqk").to_pylist()
    held_out = {b.epd() for b in EndgameStarts("KQvK", tablebase.is_won, tables=tablebase.names).hold_out(200, seed=0)}
    assert not held_out & {chess.Board(row["fen"]).epd() for row in rows}
    for row in rows[:30]:
        board = chess.Board(row["fen"])
        assert tablebase.is_won(board) and row["best_move"] == row["moves"][0]
        assert row["win_probs"] == sorted(row["win_probs"], reverse=True)
        best = {move.uci() for move in tablebase.best_moves(board)}
        top = {uci for uci, value in zip(row["moves"], row["win_probs"]) if value == row["win_probs"][0]}
        assert top == best  # the top-valued moves are exactly the tablebase's DTZ-optimal moves
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        generate_endgame_dataset(config)  # never overwrites


def test_symmetric_images_carry_exact_labels_and_never_touch_the_held_out_set(tmp_path, tablebase):
    config = EndgameDataConfig(
        out=str(tmp_path / "krk"),
        material="KRvK",
        positions=40,
        processes=1,
        held_out=200,
        held_out_seed=0,
        syzygy_path=str(SYZYGY_DIR),
        symmetries=True,
        test_fraction=0.3,
    )
    summary = generate_endgame_dataset(config)
    assert summary.drawn == 40 and 40 * 4 < summary.positions <= 40 * 8  # most classes have 8 distinct images
    by_split = {split: schema.read_positions(tmp_path / "krk", split).to_pylist() for split in schema.SPLITS}
    rows = [row for split_rows in by_split.values() for row in split_rows]
    epds = [chess.Board(row["fen"]).epd() for row in rows]
    assert len(set(epds)) == len(epds) == summary.positions
    held_out = set()
    for board in EndgameStarts("KRvK", tablebase.is_won, tables=tablebase.names).hold_out(200, seed=0):
        held_out |= symmetric_epds(board)
    assert not held_out & set(epds)  # no image of an evaluation position either
    split_of = {
        epd: split
        for split, split_rows in by_split.items()
        for epd in (chess.Board(r["fen"]).epd() for r in split_rows)
    }
    for row in rows[:: max(1, len(rows) // 12)]:
        board = chess.Board(row["fen"])
        assert {split_of[epd] for epd in symmetric_epds(board)} == {split_of[board.epd()]}  # a class stays in one split
        probed = move_values(tablebase, board)  # the mapped labels are what the tables say about the image
        assert row["legal_moves"] == [uci for uci, _ in probed]
        assert row["legal_win_probs"] == pytest.approx([value for _, value in probed], abs=1e-6)


def test_bad_endgame_config_is_one_clear_error():
    with pytest.raises(ConfigError, match="material"):
        EndgameDataConfig(out="x", material="KXvK")


@pytest.mark.slow
def test_cli_data_pretrain_and_eval_endgame_with_paired_compare(cli, tmp_path):
    data = tmp_path / "kqk"
    result = cli.run(
        "data",
        "endgame",
        "--out",
        str(data),
        "--material",
        "KQvK",
        "--positions",
        "300",
        f"syzygy_path={SYZYGY_DIR}",
        "processes=2",
    )
    assert result.returncode == 0, result.stderr
    assert "DTZ-optimal moves per position" in result.stdout
    bad = cli.run(
        "data", "endgame", "--out", str(tmp_path / "bad"), "--material", "KQQQQvK", f"syzygy_path={SYZYGY_DIR}"
    )
    assert bad.returncode != 0 and "KQQQQvK" in bad.stderr and "Traceback" not in bad.stderr
    result = cli.run(
        "pretrain",
        "--config",
        "configs/endgame_kqk_pretrain.yaml",
        f"data={data}",
        f"run.out_dir={tmp_path}",
        "run.name=warm",
        "steps=30",
        "eval_every=0",
        "checkpoint_every=0",
        "log_every=10",
    )
    assert result.returncode == 0, result.stderr
    # stderr is a pipe here, as under nohup: the progress bar writes whole lines, no carriage returns
    assert "\r" not in result.stderr and "30/30" in result.stderr.splitlines()[-1], result.stderr[-500:]
    outputs = []
    for player in (["--policy", "random"], ["--checkpoint", str(tmp_path / "warm")]):
        output = tmp_path / f"{player[1].replace('/', '_')}.json"
        result = cli.run(
            "eval",
            "endgame",
            *player,
            "--positions",
            "20",
            "--max-moves",
            "10",
            f"syzygy_path={SYZYGY_DIR}",
            f"output={output}",
        )
        assert result.returncode == 0, result.stderr
        assert "mate rate" in result.stdout
        payload = json.loads(output.read_text())
        assert len(payload["records"]["player"]) == 20
        outputs.append(output)
    comparison = compare_files(*outputs)
    assert comparison.kind == "endgame" and comparison.n == 20 and comparison.metrics[0].metric == "mate_rate"
