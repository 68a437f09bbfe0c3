"""Start-position sources and their weighted mixture (data/start_positions.py), policy-game positions."""

from __future__ import annotations

import chess
import numpy as np
import pytest

from chessgrpo.config import ConfigError, from_dict
from chessgrpo.data.start_positions import PositionSource, StartPositionMixture, StartPositions
from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.tasks.kinds.move_group import MoveGroupTrainConfig
from chessgrpo.tasks.policy_games import parse_policy_games, policy_game_positions


def _mixture(weights: list[float]) -> StartPositionMixture:
    sources = [StartPositions.from_source(f"random:{50 + i}", seed=i) for i in range(len(weights))]
    return StartPositionMixture(sources, weights, [f"s{i}" for i in range(len(weights))])


def test_mixture_draws_each_source_in_proportion_to_its_weight():
    mixture = _mixture([3.0, 1.0, 0.0])
    fens_by_source = [{b.fen() for b in source.boards} for source in mixture.sources]
    counts = np.zeros(3)
    for step in range(200):
        boards = mixture.draw(32, seed=0, step=step)
        assert len(boards) == 32 and all(isinstance(b, chess.Board) for b in boards)
        for board, source in zip(boards, mixture.last_sources):
            assert board.fen() in fens_by_source[source]  # each slot holds a position of the source it picked
            counts[source] += 1
    shares = counts / counts.sum()
    # 6400 draws: the binomial standard error of a 0.75 share is 0.0054; 0.03 is > 5 of them.
    assert shares[0] == pytest.approx(0.75, abs=0.03) and shares[1] == pytest.approx(0.25, abs=0.03)
    assert counts[2] == 0  # a zero weight is never drawn
    assert mixture.source_fractions()["s2"] == 0.0


def test_mixture_draws_are_reproducible_per_step_and_rank():
    mixture = _mixture([1.0, 1.0])
    first = [b.fen() for b in mixture.draw(16, seed=3, step=7, rank=0)]
    assert [b.fen() for b in mixture.draw(16, seed=3, step=7, rank=0)] == first  # a resumed run sees the same
    assert [b.fen() for b in mixture.draw(16, seed=3, step=8, rank=0)] != first
    assert [b.fen() for b in mixture.draw(16, seed=3, step=7, rank=1)] != first  # ranks never share a draw


def test_mixture_config_is_checked():
    with pytest.raises(ValueError, match="weight"):
        PositionSource("random:5", weight=-1.0)
    with pytest.raises(ValueError, match="positive total weight"):
        _mixture([0.0, 0.0])
    with pytest.raises(ConfigError, match="exclusive"):
        from_dict(MoveGroupTrainConfig, {"positions": "data/tiny", "position_mixture": [{"positions": "random:5"}]})
    config = from_dict(
        MoveGroupTrainConfig, {"positions": None, "position_mixture": [{"positions": "random:5", "weight": 2}]}
    )
    assert config.position_mixture[0].weight == 2.0 and config.position_mixture[0].label == "random_5"
    with pytest.raises(ValueError, match="policy_games:N"):
        parse_policy_games("policy_games:x")


def test_pgn_source_can_skip_one_players_moves(tmp_path):
    pgn = tmp_path / "games.pgn"
    pgn.write_text('[White "policy"]\n[Black "random"]\n[Result "*"]\n\n1. e4 e5 2. Nf3 Nc6 *\n')
    everyone = StartPositions.from_source(str(pgn))
    policy_only = StartPositions.from_source(str(pgn), skip_mover="random")
    assert len(everyone) == 4
    assert len(policy_only) == 2 and all(b.turn == chess.WHITE for b in policy_only.boards)
    with pytest.raises(ValueError, match="skip_mover needs a .pgn"):
        StartPositions.from_source("random:5", skip_mover="random")


def test_policy_game_positions_are_the_policys_turns_and_reproducible():
    policy = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    boards = policy_game_positions(policy, 4, seed=1, max_plies=40)
    again = policy_game_positions(policy, 4, seed=1, max_plies=40)
    assert [b.fen() for b in boards] == [b.fen() for b in again]
    assert (
        4 * 4 <= len(boards) <= 4 * 20
    )  # the policy's moves only (colours alternate by game), after 4-8 opening plies
    assert {b.turn for b in boards} == {chess.WHITE, chess.BLACK}
    assert all(not b.is_game_over() for b in boards)


def test_min_best_margin_keeps_only_moves_from_labelled_data(tmp_path):
    """Positions where the labelled best move beats the second best by the margin ("only moves")
    are kept; a single labelled move says nothing about a margin and is dropped."""
    from chessgrpo.board import move_to_action
    from chessgrpo.board.sources import random_playout_positions
    from chessgrpo.data.schema import write_shard

    rows, margins = [], [0.5, 0.05, 0.3, None]
    for board, margin in zip(random_playout_positions(4, seed=5, max_plies=30), margins):
        first, second = sorted(board.legal_moves, key=chess.Move.uci)[:2]
        moves, wins = ([first.uci()], [0.6]) if margin is None else ([first.uci(), second.uci()], [0.6, 0.6 - margin])
        rows.append(
            {
                "fen": board.fen(),
                "source": "test",
                "best_move": first.uci(),
                "best_action": move_to_action(first),
                "moves": moves,
                "win_probs": wins,
                "value": 0.6,
                "legal_moves": None,
                "legal_win_probs": None,
                "nodes": 50,
            }
        )
    shard = write_shard(rows, tmp_path / "labelled.parquet")
    kept = StartPositions.from_source(str(shard), min_best_margin=0.2)
    assert [b.fen() for b in kept.boards] == [rows[0]["fen"], rows[2]["fen"]]
    assert len(StartPositions.from_source(str(shard))) == 4
    with pytest.raises(ValueError, match="no position passes"):
        StartPositions.from_source(str(shard), min_best_margin=0.9)
    with pytest.raises(ValueError, match="min_best_margin"):
        PositionSource(str(shard), min_best_margin=0.0)
    with pytest.raises(ValueError, match="labelled dataset"):
        StartPositions.from_source("random:5", min_best_margin=0.2)


def test_best_move_check_keeps_positions_by_whether_the_label_checks(tmp_path):
    """Labelled best moves that give check (true) or not (false); the mixture item passes it through."""
    from chessgrpo.board import move_to_action
    from chessgrpo.data.schema import write_shard

    # White to move in both: Ra8+ checks the king on g8; in the second the label is the quiet Kf1.
    fens_and_labels = [
        ("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1", "a1a8"),
        ("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1", "g1f1"),
        ("r5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 0 1", "a8a1"),
    ]
    rows = []
    for index, (fen, label) in enumerate(fens_and_labels):
        board, move = chess.Board(fen), chess.Move.from_uci(label)
        rows.append(
            {
                "fen": fen if index != 1 else fen.replace(" 0 1", " 1 1"),
                "source": "test",
                "best_move": label,
                "best_action": move_to_action(move),
                "moves": [label],
                "win_probs": [0.9],
                "value": 0.9,
                "legal_moves": None,
                "legal_win_probs": None,
                "nodes": 50,
            }
        )
        assert board.gives_check(move) == (label != "g1f1")
    shard = write_shard(rows, tmp_path / "labelled.parquet")
    checking = StartPositions.from_source(str(shard), best_move_check=True)
    quiet = StartPositions.from_source(str(shard), best_move_check=False)
    assert [b.fen() for b in checking.boards] == [rows[0]["fen"], rows[2]["fen"]]
    assert [b.fen() for b in quiet.boards] == [rows[1]["fen"]]
    mixture = StartPositionMixture.from_config([PositionSource(str(shard), name="checks", best_move_check=True)])
    assert len(mixture) == 2
    with pytest.raises(ValueError, match="labelled dataset"):
        StartPositions.from_source("random:5", best_move_check=True)
