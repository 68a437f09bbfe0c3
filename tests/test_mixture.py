"""Task mixtures (`kind: mixture`): joined rollouts, the weights' draws, config checks, real runs.

Real tiny policies, real Syzygy tables and real Stockfish (50-node rewards) throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from chessgrpo.board.endgames import endgame_positions
from chessgrpo.config import ConfigError, from_dict, load_config
from chessgrpo.data.start_positions import StartPositions
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.rl import GRPOConfig, compute_advantages
from chessgrpo.rl.combine import concat_forwards, concat_rollouts
from chessgrpo.tasks import move_group, trajectory, trajectory_learner, trajectory_rewards
from chessgrpo.tasks.kinds.mixture import MixtureTrainConfig, draw_task_groups, task_step_groups
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import SYZYGY_DIR

REPO = Path(__file__).resolve().parents[1]


def _mixture(tmp_path: Path, name: str, tasks: list[dict], **top) -> MixtureTrainConfig:
    """A mixture config as a config file would give it (fresh tiny policy, no evaluation unless asked)."""
    data = {
        "kind": "mixture",
        "run": {"name": name, "out_dir": str(tmp_path), "seed": 0},
        "init_checkpoint": None,
        "model": {"size": "tiny"},
        "groups_per_step": 4,
        "tasks": tasks,
        "grpo": {"num_iterations": 2, "minibatch_size": 8, "kl_coef": 0.05},
        "engine": {"processes": 1, "cache": False, "syzygy_path": str(SYZYGY_DIR)},
        "steps": 2,
        "lr": 1e-3,
        "warmup_steps": 0,
        "checkpoint_every": 0,
        "eval_every": 0,
        "eval_at_start": False,
        "threads": 1,
    }
    data.update(top)
    return from_dict(MixtureTrainConfig, data)


ONE_MOVE = {
    "name": "one_move",
    "kind": "move_group",
    "weight": 0.5,
    "config": {
        "positions": "random:64",
        "task": {"group_size": 4, "reward_nodes": 50, "best_move_values": False},
        "eval": {"positions": None, "puzzles": None},
    },
}
ENDGAME = {
    "name": "kqk",
    "kind": "trajectory",
    "weight": 0.5,
    "config": {
        "positions": "endgame:KQvK",
        "task": {"group_size": 4, "horizon": 3, "opponent": "tablebase"},
        "eval": {"positions": 20, "baselines": False},
    },
}


# -- joining rollouts ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_rollouts():
    """A one-move rollout (L = 1) and a trajectory rollout (L = 3) of the same tiny policy, advantages filled."""
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    boards = StartPositions.from_source("random:6", seed=1).draw(3, seed=0, step=0)
    groups = move_group.sample_groups(model, boards, 4, temperature=1.0, generator=torch.Generator().manual_seed(0))
    one_move = move_group.to_rollout_batch(groups, torch.arange(12, dtype=torch.float32).reshape(3, 4) / 12)
    grpo = GRPOConfig()
    one_move.advantages = compute_advantages(one_move, grpo)
    with Tablebase(str(SYZYGY_DIR)) as oracle:
        starts = endgame_positions("KRvK", 2, seed=2, accept=oracle.is_won)
        config = trajectory.TrajectoryConfig(group_size=3, positions_per_step=2, horizon=3)
        games = trajectory.play_trajectories(
            model,
            starts,
            config,
            opponent=trajectory.TablebaseOpponent(oracle),
            generator=torch.Generator().manual_seed(1),
        )
        rewards = trajectory_rewards.tablebase_step_rewards(games, oracle, shaping=0.1)
    trajectories = trajectory_learner.to_rollout_batch(games, rewards, "process")
    trajectories.advantages = compute_advantages(trajectories, grpo)
    forwards = [
        move_group.make_forward(model, groups, temperature=1.0),
        trajectory_learner.make_forward(model, games, temperature=1.0),
    ]
    return [one_move, trajectories], forwards


def test_joined_rollout_keeps_each_rows_advantages_and_groups(two_rollouts):
    parts, _ = two_rollouts
    joined = concat_rollouts(parts)
    one_move, games = parts
    assert joined.num_rows == one_move.num_rows + games.num_rows and joined.actions.shape[1] == 3
    # One-move rows: their advantage on the first step, padding masked out.
    assert torch.equal(joined.mask[:12, 0], torch.ones(12, dtype=torch.bool)) and not joined.mask[:12, 1:].any()
    assert torch.equal(joined.advantages[:12, 0], one_move.advantages) and (joined.advantages[:12, 1:] == 0).all()
    assert torch.equal(
        joined.advantages[12:], torch.where(games.mask, games.advantages, torch.zeros_like(games.advantages))
    )
    # Per-row reward totals; groups of the two parts never share an id.
    assert torch.allclose(
        joined.rewards[12:], torch.where(games.mask, games.rewards, torch.zeros_like(games.rewards)).sum(1)
    )
    assert not set(joined.group_ids[:12].tolist()) & set(joined.group_ids[12:].tolist())
    assert len(set(joined.group_ids[:12].tolist())) == 3
    with pytest.raises(ValueError, match="no advantages"):
        concat_rollouts([parts[0], _without_advantages(parts[1])])


def _without_advantages(batch):
    copy = batch.select(torch.arange(batch.num_rows))
    copy.advantages = None
    return copy


def test_joined_forward_gives_each_parts_log_probs_in_the_minibatchs_order(two_rollouts):
    parts, forwards = two_rollouts
    joined = concat_rollouts(parts)
    forward = concat_forwards(parts, forwards)
    rows = torch.tensor([14, 3, 0, 17, 12, 7])  # mixed, out of order
    out = forward(joined.select(rows))
    assert out.logp.shape == (6, 3) and out.logp.requires_grad
    # The same log-probs the rollouts recorded (the weights that sampled them): the ratio-1 invariant holds.
    mask = joined.mask[rows]
    assert torch.allclose(out.logp[mask], joined.behaviour_logp[rows][mask], atol=1e-5)
    assert (out.logp[~mask] == 0).all() and out.entropy is not None
    own = forwards[1](parts[1].select(torch.tensor([2, 5])))
    assert torch.allclose(out.logp[[0, 3]], own.logp, atol=1e-6)


# -- the weights ---------------------------------------------------------------------------------


def test_each_group_draws_its_task_from_the_weights():
    weights = [0.6, 0.3, 0.1, 0.0]
    draws = torch.cat([draw_task_groups(weights, 32, seed=0, step=step) for step in range(500)])
    fractions = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert torch.allclose(fractions[:3], torch.tensor(weights[:3]), atol=0.02), fractions
    assert fractions[3] == 0  # a weight of 0 is never drawn
    assert torch.equal(draw_task_groups(weights, 32, seed=0, step=7), draw_task_groups(weights, 32, seed=0, step=7))
    assert not torch.equal(draw_task_groups(weights, 32, seed=0, step=7), draw_task_groups(weights, 32, seed=0, step=8))
    assert torch.equal(draw_task_groups([2, 1], 16, seed=3, step=1), draw_task_groups([0.5, 0.25], 16, seed=3, step=1))


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_share_a_steps_groups_without_changing_them(world_size):
    tasks = draw_task_groups([0.5, 0.5], 8, seed=0, step=3)
    for task in (0, 1):
        alone = task_step_groups(tasks, task, range(8))
        assert list(alone.seeds) == (tasks == task).nonzero().flatten().tolist() and alone.count == len(alone.seeds)
        shares = [
            task_step_groups(tasks, task, range(r * 8 // world_size, (r + 1) * 8 // world_size))
            for r in range(world_size)
        ]
        assert sorted(i for share in shares for i in share.mine) == list(alone.mine)
        assert sorted(s for share in shares for s in share.seeds) == list(alone.seeds)
        assert all(share.count == alone.count for share in shares)


# -- the config ----------------------------------------------------------------------------------


def test_config_checks_name_the_bad_key(tmp_path):
    with pytest.raises(ConfigError, match=r"tasks\[0\]\.config\.lr: set it on the mixture"):
        _mixture(tmp_path, "x", [{**ONE_MOVE, "config": {**ONE_MOVE["config"], "lr": 0.1}}])
    with pytest.raises(ConfigError, match="positions_per_step"):
        _mixture(tmp_path, "x", [{**ENDGAME, "config": {**ENDGAME["config"], "task": {"positions_per_step": 4}}}])
    with pytest.raises(ConfigError, match=r"tasks\[0\]\.config\.task\.horizn"):
        _mixture(tmp_path, "x", [{**ENDGAME, "config": {**ENDGAME["config"], "task": {"horizn": 4}}}])
    with pytest.raises(ConfigError, match="kind must be one of"):
        _mixture(tmp_path, "x", [{**ONE_MOVE, "kind": "pretrain"}])
    with pytest.raises(ConfigError, match="names must differ"):
        _mixture(tmp_path, "x", [ONE_MOVE, {**ENDGAME, "name": "one_move"}])
    with pytest.raises(ConfigError, match="weights sum to 0"):
        _mixture(tmp_path, "x", [{**ONE_MOVE, "weight": 0}])
    with pytest.raises(ConfigError, match="batch_std"):
        _mixture(tmp_path, "x", [ONE_MOVE], grpo={"advantage_estimator": "batch_std"})
    evaluating = {
        **ENDGAME,
        "name": "games",
        "config": {"positions": "random:20", "eval": {"offline_positions": "random:10"}},
    }
    with pytest.raises(ConfigError, match="both evaluate held-out positions"):
        _mixture(
            tmp_path,
            "x",
            [{**ONE_MOVE, "config": {**ONE_MOVE["config"], "eval": {"positions": "random:10"}}}, evaluating],
        )
    config = _mixture(tmp_path, "x", [ONE_MOVE, ENDGAME])
    one_move, endgame = config.task_configs()
    assert one_move.lr == endgame.lr == 1e-3 and one_move.grpo == config.grpo and endgame.engine == config.engine
    assert config.best_metric() == ("eval/mate_rate", "max")  # the endgame task's held-out mate rate


def test_overrides_reach_a_task_by_name(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({"kind": "mixture", "tasks": [ONE_MOVE, ENDGAME]}))
    config = load_config(MixtureTrainConfig, path, ["tasks.kqk.weight=2", "tasks.kqk.config.task.horizon=5"])
    assert config.tasks[1].weight == 2.0 and config.task_configs()[1].task.horizon == 5
    with pytest.raises(ConfigError, match="no item named 'krk'"):
        load_config(MixtureTrainConfig, path, ["tasks.krk.weight=2"])
    with pytest.raises(ConfigError, match="tasks is empty"):
        load_config(MixtureTrainConfig, None, []).task_configs()


# -- runs ----------------------------------------------------------------------------------------


def test_a_mixture_of_one_task_is_that_task(tmp_path):
    """Weight 1 on one task: the same groups, rewards and updates as that kind run on its own."""
    from chessgrpo.tasks.kinds.trajectory import TrajectoryTrainConfig

    mixture = _mixture(
        tmp_path,
        "mixture",
        [
            {
                **ENDGAME,
                "weight": 1.0,
                "config": {**ENDGAME["config"], "task": {**ENDGAME["config"]["task"], "supervision": "outcome"}},
            }
        ],
    )
    alone = from_dict(TrajectoryTrainConfig, _alone(mixture))
    with Trainer(mixture) as trainer:
        trainer.train()
    with Trainer(alone) as trainer:
        trainer.train()
    rows = read_metrics(tmp_path / "mixture" / "metrics.jsonl")
    rows_alone = read_metrics(tmp_path / "alone" / "metrics.jsonl")
    for row, row_alone in zip(rows, rows_alone):
        assert row["reward/mean"] == row_alone["reward/mean"]
        assert row["rollout/kqk/mate_rate"] == row_alone["rollout/mate_rate"]
        assert row["loss/total"] == pytest.approx(row_alone["loss/total"], abs=1e-6)
        assert row["grad_norm"] == pytest.approx(row_alone["grad_norm"], rel=1e-5)
    assert rows[-1]["eval/mate_rate"] == rows_alone[-1]["eval/mate_rate"]


def _plain(config):
    from chessgrpo.config import to_dict

    return to_dict(config)


def _alone(mixture: MixtureTrainConfig) -> dict:
    """The single task of `mixture` as its own kind's config (positions_per_step = groups_per_step)."""
    plain = _plain(mixture)
    task = plain["tasks"][0]
    data = {key: plain[key] for key in mixture.shared_keys()}
    data.update(task["config"])
    data["task"] = {**task["config"].get("task", {}), "positions_per_step": mixture.groups_per_step}
    data["kind"] = task["kind"]
    data["run"] = {**plain["run"], "name": "alone"}
    return data


def test_one_move_and_endgame_groups_train_together(tmp_path):
    config = _mixture(tmp_path, "both", [ONE_MOVE, ENDGAME], groups_per_step=8, steps=3)
    with Trainer(config) as trainer:
        trainer.train()
    rows = read_metrics(tmp_path / "both" / "metrics.jsonl")
    assert len(rows) == 3
    for row in rows:
        assert row["ratio/first_max_abs_dev"] < 1e-4  # the joined forward recomputes the sampling log-probs
        assert row["rollout/task/one_move"] + row["rollout/task/kqk"] == pytest.approx(1.0)
        assert row["learn/rows"] > 0 and row["perf/samples_per_s"] > 0
    both = [r for r in rows if 0 < r["rollout/task/one_move"] < 1]
    assert both, "no step drew both tasks"
    assert all("reward/one_move/win_prob" in r and "rollout/kqk/mate_rate" in r for r in both)
    assert "eval/mate_rate" in rows[-1]  # the endgame task's held-out evaluation of the shared policy
    assert (tmp_path / "both" / "checkpoints" / "latest").exists()


def test_each_endgame_material_is_evaluated_on_its_own_held_out_starts(tmp_path):
    """A network carried to new material keeps being measured on what it knew: every material's held-out mate rate
    under its own name, its own files; the first material also unprefixed (progress bar, best checkpoint)."""
    krk = {**ENDGAME, "name": "krk", "config": {**ENDGAME["config"], "positions": "endgame:KRvK"}}
    kqk_again = {**ENDGAME, "name": "kqk_again"}  # the same material twice: evaluated once
    config = _mixture(tmp_path, "materials", [ENDGAME, krk, kqk_again], steps=1, eval_at_start=True, eval_every=1)
    with Trainer(config) as trainer:
        trainer.train()
    rows = [row for row in read_metrics(tmp_path / "materials" / "metrics.jsonl") if "eval/mate_rate" in row]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        assert row["eval/positions"] == row["eval/KQvK/positions"] == row["eval/KRvK/positions"] == 20
        assert row["eval/mate_rate"] == row["eval/KQvK/mate_rate"] and 0 <= row["eval/KRvK/mate_rate"] <= 1
    for material in ("KQvK", "KRvK"):
        saved = json.loads((tmp_path / "materials" / "eval" / material / "step_000001_endgame.json").read_text())
        assert saved["positions"] == f"endgame:{material}" and len(saved["starts"]) == 20


def test_the_shipped_mixture_config_loads():
    config = load_config(MixtureTrainConfig, REPO / "configs" / "grpo_mixture_tiny.yaml")
    names = [task.name for task in config.tasks]
    assert names == ["one_move", "games"] and config.task_configs()[1].task.opponent == "reference"


def test_train_command_rejects_a_shared_key_in_a_task(cli, tmp_path):
    result = cli.run(
        "train",
        "--config",
        "configs/grpo_mixture_tiny.yaml",
        "tasks.games.config.steps=5",
        f"run.out_dir={tmp_path}",
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode != 0 and "tasks[1].config.steps: set it on the mixture" in result.stderr
    assert result.stderr.count("\n") <= 2  # one clear line, no traceback


@pytest.mark.slow
def test_resume_continues_bitwise_identically(tmp_path):
    from safetensors.torch import load_file

    tasks = [ONE_MOVE, ENDGAME]
    with Trainer(_mixture(tmp_path, "straight", tasks, steps=3)) as trainer:
        assert trainer.train().finished
    with Trainer(_mixture(tmp_path, "resumed", tasks, steps=3, stop_at=1)) as trainer:
        assert not trainer.train().finished and trainer.step == 1
    with Trainer(_mixture(tmp_path, "resumed", tasks, steps=3), resume=True) as trainer:
        assert trainer.step == 1 and trainer.train().finished
    straight, resumed = (
        load_file(str(tmp_path / name / "checkpoints" / "latest" / "model.safetensors"))
        for name in ("straight", "resumed")
    )
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
