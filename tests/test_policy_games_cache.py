"""The starting policy's games (`tasks.policy_games`) are cached by weights and settings, so a run from the same start
does not replay them: real games of a real (tiny, untrained) policy against the random mover, real files."""

from __future__ import annotations

import logging

import torch

from chessgrpo.config import load_config
from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.tasks.kinds.move_group import MoveGroupTrainConfig
from chessgrpo.tasks.policy_games import (
    cached_policy_game_positions,
    policy_game_positions,
)
from chessgrpo.train.loop import Trainer


def tiny_policy(seed: int) -> ActionPolicy:
    torch.manual_seed(seed)
    return ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2)).eval()


def test_games_are_played_once_then_read_back_and_any_change_misses(tmp_path, caplog):
    policy = tiny_policy(0)
    boards, source = cached_policy_game_positions(policy, 2, tmp_path, seed=5, max_plies=12)
    assert source == "played" and boards
    [cached] = list(tmp_path.glob("policy_games_*.fens"))
    again, source = cached_policy_game_positions(policy, 2, tmp_path, seed=5, max_plies=12)
    assert source == f"cache {cached}"
    assert (
        [b.fen() for b in again]
        == [b.fen() for b in boards]
        == [b.fen() for b in policy_game_positions(policy, 2, seed=5, max_plies=12)]
    )
    # Another seed, game count, setting or set of weights is another key: played, and cached beside the first.
    for other, games, settings in (
        (policy, 2, {"seed": 6, "max_plies": 12}),
        (policy, 3, {"seed": 5, "max_plies": 12}),
        (policy, 2, {"seed": 5, "max_plies": 16}),
        (tiny_policy(1), 2, {"seed": 5, "max_plies": 12}),
    ):
        assert cached_policy_game_positions(other, games, tmp_path, **settings)[1] == "played"
    assert len(list(tmp_path.glob("policy_games_*.fens"))) == 5
    # A damaged file is named in a warning and the games are played again (and the file rewritten).
    cached.write_text("not a fen\n")
    with caplog.at_level(logging.WARNING):
        replayed, source = cached_policy_game_positions(policy, 2, tmp_path, seed=5, max_plies=12)
    assert source == "played" and str(cached) in caplog.text and "unreadable" in caplog.text
    assert [b.fen() for b in replayed] == [b.fen() for b in boards] and cached_policy_game_positions(
        policy, 2, tmp_path, seed=5, max_plies=12
    )[1].startswith("cache")
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary left behind


def test_a_cache_file_that_does_not_read_back_whole_is_replayed(tmp_path, caplog):
    policy = tiny_policy(0)
    boards, _ = cached_policy_game_positions(policy, 1, tmp_path, seed=5, max_plies=12)
    [cached] = list(tmp_path.glob("policy_games_*.fens"))
    header, *fens = cached.read_text().splitlines()
    assert len(fens) == len(boards) > 1 and header.endswith(f" {len(boards)}")
    for damaged in (
        "",
        "\n".join([header, *fens[:-1]]) + "\n",
        "\n".join([header, *fens[:-1], "8/8/8/8 w"]) + "\n",
        "\n".join(fens) + "\n",
    ):  # empty, a line lost, a bad FEN, no header
        cached.write_text(damaged)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            replayed, source = cached_policy_game_positions(policy, 1, tmp_path, seed=5, max_plies=12)
        assert source == "played" and str(cached) in caplog.text, damaged
        assert [b.fen() for b in replayed] == [b.fen() for b in boards]


def test_a_second_run_from_the_same_start_reads_the_starting_policys_games_from_the_cache(tmp_path, caplog):
    """Through the kind: `policy_games:N` positions are cached beside the engine cache (engine.cache_path's folder)."""
    cache = tmp_path / "cache"
    overrides = [
        "init_checkpoint=null",
        "positions=policy_games:2",
        "position_mixture=[]",
        "task.group_size=2",
        "task.positions_per_step=2",
        "engine.processes=1",
        f"engine.cache_path={cache / 'evaluations.sqlite'}",
        "eval.positions=null",
        "eval.puzzles=null",
        "steps=1",
        "threads=1",
        f"run.out_dir={tmp_path}",
        "model.n_layers=1",
        "model.d_model=32",
        "model.n_heads=2",
    ]

    def start(name: str) -> tuple[list[str], list[str]]:
        caplog.clear()
        with (
            caplog.at_level(logging.INFO, logger="chessgrpo"),
            Trainer(load_config(MoveGroupTrainConfig, None, [*overrides, f"run.name={name}"])) as trainer,
        ):
            positions = trainer.kind.start_positions
        return [message for message in caplog.messages if message.startswith("policy games:")], [
            b.fen() for b in positions.boards
        ]

    (first,), boards = start("a")
    assert first.startswith("policy games: playing 2 games of the starting policy")
    [cached] = list(cache.glob("policy_games_*.fens"))
    (second,), again = start("b")
    assert second.startswith(f"policy games: loaded {len(boards)} positions from cache") and str(cached) in second
    assert again == boards


def test_without_a_cache_directory_the_games_are_played(tmp_path):
    boards, source = cached_policy_game_positions(tiny_policy(0), 1, None, seed=5, max_plies=20)
    assert source == "played" and boards and not list(tmp_path.iterdir())
