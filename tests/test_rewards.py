"""The shaped move reward (tasks/rewards.py) on positions with a known answer, real Stockfish and Syzygy."""

from __future__ import annotations

import chess
import pytest
import torch

from chessgrpo.board import move_to_action
from chessgrpo.engine import EnginePool, Evaluation, Tablebase
from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.tasks.move_group import MoveGroups, score_groups
from chessgrpo.tasks.rewards import DRAW, WIN_FLOOR, forced_win_value, probe_tablebase, shaped_value, undecided_value
from helpers import SYZYGY_DIR


def _group(board: chess.Board, moves: list[str]) -> MoveGroups:
    """A one-position group holding exactly `moves`."""
    model = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    tokens, legal = model.inputs([board])
    actions = torch.tensor([[move_to_action(m) for m in moves]])
    return MoveGroups([board], tokens, legal, actions, torch.zeros(actions.shape), torch.zeros(1), torch.zeros(1))


@pytest.fixture(scope="module")
def pool():
    with EnginePool(processes=1, nodes=5000) as engines:
        yield engines


@pytest.fixture(scope="module")
def tablebase():
    with Tablebase(SYZYGY_DIR) as tables:
        yield tables


def test_mate_in_one_beats_winning_a_queen(pool):
    # White to move: Ra8# mates; Bxh5 wins Black's queen (and the game, but not at once).
    board = chess.Board("6k1/5ppp/8/7q/8/5B2/5PPP/R5K1 w - - 0 1")
    scored = score_groups(pool, _group(board, ["a1a8", "f3h5", "g1f1"]), nodes=5000, best_move_values=False)
    mate, queen, quiet = scored.shaped[0].tolist()
    assert mate == 1.0
    assert mate > queen > quiet
    # The saturating win probability cannot tell the mate from the queen win: this is why `shaped` exists.
    assert scored.values[0, 1] > 0.99


def test_stalemating_a_won_position_scores_as_a_draw(pool, tablebase):
    # KQ v K: Qa7# mates, Qc7 stalemates, Qd5 keeps the win.
    board = chess.Board("k7/3Q4/1K6/8/8/8/8/8 w - - 0 1")
    for tables in (None, tablebase):
        scored = score_groups(
            pool, _group(board, ["d7a7", "d7c7", "d7d5"]), nodes=5000, best_move_values=False, tablebase=tables
        )
        mate, stalemate, keeps_win = scored.shaped[0].tolist()
        assert mate == 1.0
        assert stalemate == DRAW
        assert WIN_FLOOR < keeps_win < 1.0  # a forced win (engine mate score or tablebase win), below the mate itself


def test_tablebase_wins_are_ordered_by_dtz(tablebase):
    # Every legal move of a KQ v K position: winning moves rank by the opponent's distance to zeroing,
    # a hung queen (tablebase draw) scores 0.5.
    board = chess.Board("8/8/8/4k3/8/8/3Q4/3K4 w - - 0 1")
    draw_evaluation = Evaluation(fen="", win_probability=0.5, wdl=(0, 1000, 0), cp=0)  # unused where the tables cover
    scored = []
    for move in board.legal_moves:
        after = board.copy(stack=False)
        after.push(move)
        probe = tablebase.probe(after)
        scored.append((probe.wdl, abs(probe.dtz), shaped_value(draw_evaluation, probe_tablebase(after, tablebase))))
    wins = sorted((dtz, value) for wdl, dtz, value in scored if wdl == -2)
    draws = [value for wdl, _, value in scored if wdl == 0]
    assert len(wins) > 5 and draws  # Qd4+?? Kxd4 and the like hang the queen
    assert all(value == DRAW for value in draws)
    for (short, value_short), (long, value_long) in zip(wins, wins[1:]):
        assert value_short >= value_long
        if long > short:
            assert value_short > value_long
    assert all(WIN_FLOOR < value < 1.0 for _, value in wins)


def test_engine_mate_scores_and_material_keep_an_order():
    # From the side to move after the move (the opponent): mate -1 = we mate next move.
    def after(**fields) -> float:
        evaluation = Evaluation(fen="", win_probability=fields.pop("wp"), wdl=(0, 0, 1000), **fields)
        return shaped_value(evaluation)

    mate_in_1, mate_in_5 = after(wp=0.0, mate=-1), after(wp=0.0, mate=-5)
    two_queens, one_queen, equal = after(wp=0.0, cp=-1800), after(wp=0.0, cp=-900), after(wp=0.5, cp=0)
    mated_in_3 = after(wp=1.0, mate=3)
    assert 1.0 > mate_in_1 > mate_in_5 > WIN_FLOOR > two_queens > one_queen > equal > mated_in_3
    assert equal == pytest.approx(0.5)
    assert forced_win_value(0) == 1.0 and mated_in_3 == pytest.approx(1.0 - forced_win_value(5))
    # Undecided values stay strictly inside (0.1, 0.9) and increase with both inputs.
    assert (
        0.1
        < undecided_value(0.0, -3000)
        < undecided_value(0.0, 0)
        < undecided_value(1.0, 0)
        < undecided_value(1.0, 3000)
        < WIN_FLOOR
    )
