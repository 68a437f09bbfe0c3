"""Syzygy probing with the shared 3-4 piece tables."""

from __future__ import annotations

import chess
import pytest

from chessgrpo.engine import Tablebase
from chessgrpo.engine.tablebase import table_names
from helpers import SYZYGY_DIR, data_file


@pytest.fixture(scope="module")
def tablebase():
    data_file("syzygy")
    with Tablebase(SYZYGY_DIR) as tb:
        yield tb


def test_tables_found(tablebase):
    assert tablebase.max_pieces == 4
    assert {"KQvK", "KRvK", "KBNvK", "KPvK"} <= set(tablebase.names)
    assert table_names(SYZYGY_DIR) == tablebase.names


def test_kqk_is_won_for_the_side_with_the_queen(tablebase):
    white_to_move = tablebase.probe("8/8/8/4k3/8/8/8/3QK3 w - - 0 1")
    black_to_move = tablebase.probe("8/8/8/4k3/8/8/8/3QK3 b - - 0 1")
    assert (white_to_move.wdl, white_to_move.win_probability) == (2, 1.0)
    assert (black_to_move.wdl, black_to_move.win_probability) == (-2, 0.0)
    assert white_to_move.dtz > 0 and black_to_move.dtz < 0


def test_draws(tablebase):
    # King in front of its own rook pawn against the defending king in the corner: a draw.
    assert tablebase.probe("7k/8/7K/7P/8/8/8/8 w - - 0 1").wdl == 0
    assert tablebase.probe("8/8/8/4k3/8/8/8/2B1K3 w - - 0 1").win_probability == 0.5  # KBvK


def test_uncovered_positions_raise_keyerror(tablebase):
    with pytest.raises(KeyError):
        tablebase.probe("8/8/8/4k3/8/8/8/RQ2K2R w - - 0 1")  # 5 pieces
    with pytest.raises(KeyError):
        tablebase.probe("4k3/8/8/8/8/8/8/R3K3 w Q - 0 1")  # castling rights
    with pytest.raises(ValueError):
        tablebase.probe("8/8/8/4k3/8/8/8/3QK3 w - - 0 1\nquit")


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tablebase(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no Syzygy tables"):
        Tablebase(tmp_path)


def test_cached_probes_agree_with_probe_and_count_only_table_reads():
    board = chess.Board("8/8/8/4k3/8/8/8/3QK3 b - - 0 1")
    with Tablebase(SYZYGY_DIR) as tablebase:
        fresh = tablebase.probe(board)
        assert (tablebase.probes, tablebase.lookups) == (0, 0)  # `probe` reads the tables afresh, uncounted
        assert (tablebase.probe_wdl(board), tablebase.probe_dtz(board)) == (fresh.wdl, fresh.dtz)
        assert (tablebase.probe_wdl(board), tablebase.probe_dtz(board)) == (fresh.wdl, fresh.dtz)
        assert (tablebase.probes, tablebase.lookups) == (2, 4)
        assert not tablebase.is_won(board) and tablebase.state(board, chess.WHITE).score == 1.0
        with pytest.raises(KeyError):
            tablebase.probe_wdl(chess.Board())
