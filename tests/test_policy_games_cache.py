"""The starting policy's games (`tasks.policy_games`) are cached by weights and settings, so a run from the same start
does not replay them: real games of a real (tiny, untrained) policy against the random mover, real files."""

from __future__ import annotations

import logging

import torch

from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.tasks.policy_games import cached_policy_game_positions, policy_game_positions


def tiny_policy(seed: int) -> ActionPolicy:
    torch.manual_seed(seed)
    return ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2)).eval()


def test_games_are_played_once_then_read_back_and_any_change_misses(tmp_path, caplog):
    policy = tiny_policy(0)
    boards, source = cached_policy_game_positions(policy, 2, tmp_path, seed=5, max_plies=30)
    assert source == "played" and boards
    [cached] = list(tmp_path.glob("policy_games_*.fens"))
    again, source = cached_policy_game_positions(policy, 2, tmp_path, seed=5, max_plies=30)
    assert source == f"cache {cached}"
    assert [b.fen() for b in again] == [b.fen() for b in boards] == [b.fen() for b in policy_game_positions(policy, 2, seed=5, max_plies=30)]
    # Another seed, game count, setting or set of weights is another key: played, and cached beside the first.
    for other, games, settings in ((policy, 2, {"seed": 6, "max_plies": 30}), (policy, 3, {"seed": 5, "max_plies": 30}),
                                   (policy, 2, {"seed": 5, "max_plies": 40}), (tiny_policy(1), 2, {"seed": 5, "max_plies": 30})):  # fmt: skip
        assert cached_policy_game_positions(other, games, tmp_path, **settings)[1] == "played"
    assert len(list(tmp_path.glob("policy_games_*.fens"))) == 5
    # A damaged file is named in a warning and the games are played again (and the file rewritten).
    cached.write_text("not a fen\n")
    with caplog.at_level(logging.WARNING):
        replayed, source = cached_policy_game_positions(policy, 2, tmp_path, seed=5, max_plies=30)
    assert source == "played" and str(cached) in caplog.text and "unreadable" in caplog.text
    assert [b.fen() for b in replayed] == [b.fen() for b in boards] and cached_policy_game_positions(policy, 2, tmp_path, seed=5, max_plies=30)[1].startswith("cache")
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary left behind


def test_without_a_cache_directory_the_games_are_played(tmp_path):
    boards, source = cached_policy_game_positions(tiny_policy(0), 1, None, seed=5, max_plies=20)
    assert source == "played" and boards and not list(tmp_path.iterdir())
