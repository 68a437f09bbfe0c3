"""GRPO of the action policy with one-move groups (tasks/move_group.py, tasks/kinds/move_group.py):
rewards, invariants, resume, learning.

Real Stockfish at small node limits, real tiny models, real files.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import chess
import pytest
import torch
from safetensors.torch import load_file

from chessgrpo.board import move_to_action
from chessgrpo.config import EngineConfig, RunConfig
from chessgrpo.engine import EnginePool
from chessgrpo.eval.puzzles import read_puzzles
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, log_probs, save_policy
from chessgrpo.rl import GRPOConfig, InvariantViolation
from chessgrpo.tasks.kinds.move_group import MoveGroupEvalConfig, MoveGroupTrainConfig
from chessgrpo.tasks.move_group import (
    MoveGroupConfig,
    MoveGroups,
    StartPositions,
    sample_groups,
    score_groups,
    to_rollout_batch,
)
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import NO_LABELLED_LOSSES, data_file


def _groups_for(board: chess.Board, moves: list[str]) -> MoveGroups:
    """A one-position group holding exactly `moves` (to value hand-picked moves)."""
    model = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    tokens, legal = model.inputs([board])
    actions = torch.tensor([[move_to_action(m) for m in moves]])
    zeros = torch.zeros(actions.shape)
    return MoveGroups([board], tokens, legal, actions, zeros, torch.zeros(1), torch.zeros(1))


def test_rewards_are_from_the_movers_point_of_view_for_black():
    # 1. e4 d5 2. Qg4??: Black to move wins the queen with Bxg4; Bf5?? instead loses the bishop to Qxf5.
    board = chess.Board()
    for uci in ("e2e4", "d7d5", "d1g4"):
        board.push_uci(uci)
    back_rank = chess.Board("r5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 0 1")  # Black mates with Ra1#
    with EnginePool(processes=1, nodes=2000) as pool:
        queen = score_groups(pool, _groups_for(board.copy(stack=False), ["c8g4", "c8f5"]), nodes=2000)
        mate = score_groups(pool, _groups_for(back_rank, ["a8a1", "a8a7"]), nodes=2000)
    assert queen.values[0, 0] > 0.9 and queen.values[0, 1] < 0.2  # (the wrong point of view would flip both)
    assert queen.regret[0, 0] == 0.0 and queen.regret[0, 1] < -0.7  # Bxg4 is (at least as good as) the best move
    assert mate.values[0, 0] == 1.0  # a mating move is worth exactly 1 to the mover, no search needed
    assert mate.best_values is not None and mate.best_values[0] == 1.0


def test_duplicate_moves_in_a_group_are_evaluated_once():
    board = chess.Board()
    with EnginePool(processes=1, nodes=200) as pool:
        scored = score_groups(
            pool, _groups_for(board, ["e2e4", "e2e4", "d2d4", "e2e4"]), nodes=200, best_move_values=False
        )
        searches = pool.stats.searches
    assert scored.evaluations == 2 and searches == 2
    assert scored.values[0, 0] == scored.values[0, 1] == scored.values[0, 3]


def test_sampling_records_consistent_log_probs_and_batch_shapes():
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    boards = StartPositions.from_source("random:6", seed=1).draw(4, seed=0, step=0)
    groups = sample_groups(
        model, boards, 5, temperature=1.3, generator=torch.Generator().manual_seed(0), reference=model
    )
    tokens, legal = model.inputs(boards)
    with torch.no_grad():
        expected = log_probs(model(tokens), legal, 1.3).gather(1, groups.actions)
    assert torch.equal(groups.behaviour_logp, expected)
    assert legal.gather(1, groups.actions).all()
    assert torch.allclose(groups.exact_kl, torch.zeros(4), atol=1e-6)  # the policy is its own reference
    assert (groups.entropy <= groups.ln_legal + 1e-5).all()
    batch = to_rollout_batch(groups, torch.rand(4, 5))
    batch.validate()
    assert batch.num_rows == 20 and batch.group_ids.tolist() == [i for i in range(4) for _ in range(5)]


def test_start_positions_are_fresh_each_step_and_reproducible():
    positions = StartPositions.from_source("random:200", seed=0)
    first = [b.fen() for b in positions.draw(16, seed=0, step=0)]
    assert first == [b.fen() for b in positions.draw(16, seed=0, step=0)]
    assert first != [b.fen() for b in positions.draw(16, seed=0, step=1)]
    assert first != [b.fen() for b in positions.draw(16, seed=0, step=0, rank=1)]
    assert len(set(first)) == 16  # without replacement


def _config(tmp_path: Path, name: str, **overrides) -> MoveGroupTrainConfig:
    base = MoveGroupTrainConfig(
        run=RunConfig(name=name, out_dir=str(tmp_path), seed=0),
        init_checkpoint=None,
        positions="random:64",
        task=MoveGroupConfig(group_size=4, positions_per_step=4, reward_nodes=50),
        grpo=GRPOConfig(num_iterations=2, minibatch_size=8, kl_coef=0.05),
        engine=EngineConfig(nodes=None, processes=1, cache=False),
        eval=MoveGroupEvalConfig(positions=None, puzzles=None),
        steps=4,
        lr=1e-3,
        warmup_steps=0,
        checkpoint_every=0,
        threads=1,
    )
    return dataclasses.replace(base, **overrides)


def test_invariant_check_fires_on_an_injected_temperature_mismatch(tmp_path):
    config = _config(tmp_path, "mismatch", debug_learn_temperature=1.3)
    with Trainer(config) as trainer, pytest.raises(InvariantViolation, match="temperature"):
        trainer.train_step()
    with Trainer(_config(tmp_path, "consistent")) as trainer:
        metrics = trainer.train_step()
    assert metrics["ratio/first_max_abs_dev"] < 1e-4 and metrics["kl/exact"] == pytest.approx(0.0, abs=1e-6)


def test_resume_continues_bitwise_identically(tmp_path):
    with Trainer(_config(tmp_path, "straight")) as trainer:
        assert trainer.train().finished
    with Trainer(_config(tmp_path, "resumed", stop_at=2)) as trainer:
        assert not trainer.train().finished and trainer.step == 2
    with Trainer(_config(tmp_path, "resumed"), resume=True) as trainer:
        assert trainer.step == 2 and trainer.train().finished
    straight = load_file(str(tmp_path / "straight" / "checkpoints" / "latest" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "resumed" / "checkpoints" / "latest" / "model.safetensors"))
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    rows = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["reward/mean"] for r in rows] == [
        r["reward/mean"] for r in read_metrics(tmp_path / "straight" / "metrics.jsonl")
    ]


def _mate_in_one_positions(path: Path, count: int) -> list[tuple[chess.Board, chess.Move]]:
    """Last solver positions of Lichess mate puzzles: the solver's final move mates."""
    found = []
    for puzzle in read_puzzles(data_file("lichess_puzzles_dev.csv")).puzzles:
        if "mate" not in puzzle.themes:
            continue
        board = puzzle.board.copy()
        for move in puzzle.solution[:-1]:
            board.push(move)
        found.append((board.copy(stack=False), puzzle.solution[-1]))
        if len(found) == count:
            break
    path.write_text("".join(board.fen() + "\n" for board, _ in found))
    return found


@pytest.mark.slow
def test_grpo_learns_to_mate_in_one(tmp_path):
    positions = _mate_in_one_positions(tmp_path / "mates.fen", 16)
    config = _config(
        tmp_path,
        "mates",
        positions=str(tmp_path / "mates.fen"),
        steps=30,
        lr=3e-3,
        task=MoveGroupConfig(group_size=16, positions_per_step=8, reward_nodes=50, best_move_values=False),
        grpo=GRPOConfig(num_iterations=2, minibatch_size=64),
    )

    def mate_probability(model: ActionPolicy) -> float:
        tokens, legal = model.inputs([board for board, _ in positions])
        with torch.no_grad():
            probs = log_probs(model(tokens), legal).exp()
        mates = torch.tensor([move_to_action(move) for _, move in positions])
        return float(probs.gather(1, mates.unsqueeze(1)).mean())

    with Trainer(config) as trainer:
        before = mate_probability(trainer.kind.model)
        trainer.train()
        after = mate_probability(trainer.kind.model)
    rows = read_metrics(tmp_path / "mates" / "metrics.jsonl")
    first, last = rows[:8], rows[-8:]
    mean = lambda rs, key: sum(r[key] for r in rs) / len(rs)
    assert after > 3 * before, (before, after)
    assert mean(last, "reward/mean") > mean(first, "reward/mean") + 0.05
    for row in rows:
        assert row["ratio/first_max_abs_dev"] < 1e-4 and row["entropy/mean"] <= row["entropy/ln_legal"] + 1e-4
        assert math.isfinite(row["grad_norm"]) and row["kl/value"] >= 0


@pytest.mark.slow
def test_train_command_runs_evaluates_and_writes_a_run_directory(cli, tmp_path):
    checkpoint = tmp_path / "init"
    torch.manual_seed(0)
    save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), checkpoint)
    (tmp_path / "eval.fen").write_text(
        "".join(b.fen() + "\n" for b in StartPositions.from_source("random:20", seed=5).boards)
    )
    command = [
        "train",
        "--config",
        "configs/grpo_tiny.yaml",
        f"init_checkpoint={checkpoint}",
        "positions=random:50",
        "steps=2",
        f"run.out_dir={tmp_path}",
        "run.name=cli",
        "task.positions_per_step=4",
        "task.group_size=4",
        "task.reward_nodes=50",
        "engine.processes=1",
        "engine.cache=false",
        f"eval.positions={tmp_path / 'eval.fen'}",
        "eval.max_positions=20",
        "eval.nodes=100",
        "eval.max_puzzles=20",
        "eval_every=0",
        "grpo.minibatch_size=8",
        "start_win_prob_range=null",
        "position_mixture=[]",
        *NO_LABELLED_LOSSES,
    ]
    done = cli.run(*command, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "cli"
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "latest" / "model.safetensors").is_file()
    for name in (
        "step_000000_offline.json",
        "step_000002_offline.json",
        "step_000000_puzzles.json",
        "step_000002_puzzles.json",
    ):
        assert (run / "eval" / name).is_file(), name
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[0]["step"] == 0 and "eval/esl_low" in rows[0] and "eval/puzzle_first_move_accuracy" in rows[0]
    assert "held-out curve" in done.stdout and "eval compare" in done.stdout
    again = cli.run(*command, cwd=Path(__file__).parent.parent)
    assert again.returncode == 2 and "already has a checkpoint" in again.stderr
    bad = cli.run(*command[:-1], "grpo.advantage_estimator=ppo", timeout=60, cwd=Path(__file__).parent.parent)
    assert bad.returncode == 2 and "advantage_estimator" in bad.stderr


def _value_head_state(run_dir: Path) -> dict[str, torch.Tensor]:
    weights = load_file(str(run_dir / "checkpoints" / "latest" / "model.safetensors"))
    return {k: v for k, v in weights.items() if k.startswith("value_head.")}


def test_value_loss_trains_the_value_head_toward_the_engine_values(tmp_path):
    from chessgrpo.config import ConfigError
    from chessgrpo.models.policy import ModelConfig

    start = tmp_path / "start"
    torch.manual_seed(0)
    save_policy(ActionPolicy(dataclasses.replace(PolicyConfig.from_size("tiny"), value_head=True)), start)
    common = dict(init_checkpoint=str(start), positions="random:64", steps=6, checkpoint_every=6)
    with Trainer(_config(tmp_path, "without", **common)) as trainer:
        trainer.train()
    with Trainer(_config(tmp_path, "with", value_loss_weight=1.0, **common)) as trainer:
        trainer.train()
    initial = {k: v for k, v in load_file(str(start / "model.safetensors")).items() if k.startswith("value_head.")}
    without, with_loss = _value_head_state(tmp_path / "without"), _value_head_state(tmp_path / "with")
    assert initial and all(torch.equal(initial[k], without[k]) for k in initial)  # frozen without the loss
    assert any(not torch.equal(initial[k], with_loss[k]) for k in initial)
    aux = [row["loss/aux"] for row in read_metrics(tmp_path / "with" / "metrics.jsonl") if "loss/aux" in row]
    assert len(aux) == 6 and all(0 < a < 5 for a in aux)  # logged every step
    assert not any("loss/aux" in row for row in read_metrics(tmp_path / "without" / "metrics.jsonl"))

    # The term itself: minimising it moves the value head's predictions onto the targets.
    from chessgrpo.tasks.move_group import make_forward

    model = load_policy(start).eval()
    boards = [
        chess.Board(),
        chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"),
        chess.Board("6k1/8/8/3q4/8/8/8/6K1 w - - 0 1"),
    ]
    groups = sample_groups(model, boards, 4, temperature=1.0, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0.55, 1.0, 0.0])
    batch = to_rollout_batch(groups, torch.zeros(3, 4))
    forward = make_forward(model, groups, temperature=1.0, value_targets=targets, value_loss_weight=1.0)
    optimizer = torch.optim.Adam(model.value_head.parameters(), lr=1e-2)
    first = float(forward(batch).aux_row_loss.detach().mean())
    for _ in range(60):
        optimizer.zero_grad()
        forward(batch).aux_row_loss.mean().backward()
        optimizer.step()
    with torch.no_grad():
        _, value_logits = model(groups.tokens, with_value=True)
    assert float(forward(batch).aux_row_loss.detach().mean()) < 0.5 * first
    assert torch.allclose(torch.sigmoid(value_logits), targets, atol=0.1)
    with pytest.raises(ConfigError, match="value head"):
        Trainer(_config(tmp_path, "headless", value_loss_weight=1.0, model=ModelConfig(value_head=False)))


def _labelled_dataset(directory: Path, count: int) -> str:
    """`count` random-playout positions labelled by real Stockfish (100 nodes), all in the train split."""
    from chessgrpo.board import random_playout_positions
    from chessgrpo.data.schema import write_shard

    boards = random_playout_positions(count, seed=11, max_plies=40)
    with EnginePool(processes=1, nodes=100, cache_path=None) as pool:
        analyses = pool.analyse_many(boards, multipv=1)
    rows = [
        dict(
            fen=b.fen(),
            source="random_playout",
            best_move=a.lines[0].move,
            best_action=move_to_action(a.lines[0].move),
            moves=[a.lines[0].move],
            win_probs=[a.lines[0].win_probability],
            value=a.lines[0].win_probability,
            legal_moves=None,
            legal_win_probs=None,
            nodes=100,
        )
        for b, a in zip(boards, analyses)
    ]
    write_shard(rows, directory / "train" / "shard-00000.parquet")
    return str(directory)


def test_value_positions_add_labelled_positions_to_the_value_loss(tmp_path):
    from chessgrpo.config import ConfigError
    from chessgrpo.train.dataset import load_split

    labelled = _labelled_dataset(tmp_path / "labelled", 24)
    start = tmp_path / "start"
    torch.manual_seed(0)
    save_policy(ActionPolicy(dataclasses.replace(PolicyConfig.from_size("tiny"), value_head=True)), start)
    common = dict(init_checkpoint=str(start), positions="random:64", steps=2, checkpoint_every=2, value_loss_weight=1.0)
    with Trainer(_config(tmp_path, "own", **common)) as trainer:
        trainer.train()
    with Trainer(_config(tmp_path, "data", value_positions=labelled, value_batch_size=16, **common)) as trainer:
        assert len(trainer.kind.value_data) == len(load_split(labelled, "train"))
        tokens, targets = trainer.kind._value_batches(0)()
        assert tokens.shape == (16, trainer.kind.model.input_length) and ((targets >= 0) & (targets <= 1)).all()
        trainer.train()
    own = [row["loss/aux"] for row in read_metrics(tmp_path / "own" / "metrics.jsonl")]
    data = [row["loss/aux"] for row in read_metrics(tmp_path / "data" / "metrics.jsonl")]
    assert own[0] != data[0] and all(d > 0 for d in data)  # the labelled term is in the loss
    with pytest.raises(ConfigError, match="value_loss_weight"):
        _config(tmp_path, "weightless", value_positions=labelled)


def test_bc_term_anchors_the_policy_to_the_labelled_moves(tmp_path):
    """PPO-ptx: the bc term is the pretraining cross-entropy on labelled positions, added to the GRPO loss."""
    from chessgrpo.config import ConfigError
    from chessgrpo.tasks.move_group import labelled_loss

    labelled = _labelled_dataset(tmp_path / "labelled", 24)
    start = tmp_path / "start"
    torch.manual_seed(0)
    save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), start)
    common = dict(init_checkpoint=str(start), positions="random:64", steps=2, checkpoint_every=2)
    with Trainer(
        _config(tmp_path, "bc", bc_loss_weight=0.5, bc_positions=labelled, bc_batch_size=8, **common)
    ) as trainer:
        tokens, legal, best = trainer.kind._bc_batches(0)()
        assert tokens.shape == (8, trainer.kind.model.input_length) and legal.shape == (8, 1968)
        assert legal.gather(1, best.unsqueeze(1)).all()  # the labelled best move is legal
        a, b = trainer.kind._bc_batches(3)(), trainer.kind._bc_batches(3)()
        assert torch.equal(a[2], b[2])  # the draw is a function of (seed, step)
        trainer.train()
    aux = [row["loss/aux"] for row in read_metrics(tmp_path / "bc" / "metrics.jsonl")]
    # A fresh policy is near-uniform over ~30 legal moves: 0.5 x ln(30) ~ 1.7.
    assert len(aux) == 2 and all(1.0 < x < 2.5 for x in aux)

    # Minimising the term alone puts the policy's argmax on the labelled best moves.
    model = load_policy(start).eval()
    fixed = (tokens, legal, best)
    bc_term = labelled_loss(model, bc_batches=lambda: fixed, bc_loss_weight=1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = float(bc_term().detach())
    for _ in range(80):
        optimizer.zero_grad()
        bc_term().backward()
        optimizer.step()
    assert float(bc_term().detach()) < 0.3 * first
    with torch.no_grad():
        chosen = log_probs(model(tokens), legal).argmax(dim=1)
    assert torch.equal(chosen, best)

    with pytest.raises(ConfigError, match="bc_positions"):
        _config(tmp_path, "nothing", bc_loss_weight=0.5)
    with pytest.raises(ConfigError, match="bc_loss_weight"):
        _config(tmp_path, "weightless", bc_positions=labelled)


def test_a_reward_added_to_the_registry_trains(tmp_path, monkeypatch):
    """docs/architecture.md's worked example: one function plus one registry line add a move-group reward."""
    from chessgrpo.tasks import move_group

    def keeps_balance_reward(scored: move_group.GroupRewards) -> torch.Tensor:
        """1 for a move that keeps the game level (expected score within 0.1 of a draw), else 0."""
        return ((scored.values - 0.5).abs() < 0.1).float()

    monkeypatch.setitem(move_group.MOVE_GROUP_REWARDS, "keeps_balance", keeps_balance_reward)
    task = MoveGroupConfig(group_size=4, positions_per_step=4, reward_nodes=50, reward="keeps_balance")
    with Trainer(_config(tmp_path, "custom_reward", task=task, steps=1)) as trainer:
        metrics = trainer.train_step()
    # 16 rewards of 0 or 1: their mean is a multiple of 1/16 (an engine win probability's would not be).
    assert 0.0 <= metrics["reward/mean"] <= 1.0 and (metrics["reward/mean"] * 16).is_integer()
    monkeypatch.delitem(move_group.MOVE_GROUP_REWARDS, "keeps_balance")
    with pytest.raises(ValueError, match="reward must be one of .*win_prob"):
        MoveGroupConfig(reward="keeps_balance")
