"""Rewards as registered records, combined with weights (tasks/reward_registry.py, `task.rewards`).

Real Stockfish at small node limits, real tiny models, real Syzygy tables; reward modules written by the tests.
"""

from __future__ import annotations

import chess
import pytest
import torch

from chessgrpo.config import ConfigError, load_config
from chessgrpo.engine import EnginePool
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.tasks.kinds.move_group import MoveGroupKind, MoveGroupTrainConfig
from chessgrpo.tasks.kinds.trajectory import TrajectoryTrainConfig
from chessgrpo.tasks.move_group import MOVE_GROUP_REWARDS, GroupRewards, MoveGroupConfig, sample_groups, score_groups
from chessgrpo.tasks.reward_registry import RegisteredReward, combine
from chessgrpo.tasks.trajectory_rewards import TRAJECTORY_REWARDS, RewardSources, StepRewards
from chessgrpo.tasks.user_rewards import load_reward_function, user_rewards
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import SYZYGY_DIR, TINY_MOVE_GROUP_RUN, importable_module, random_playout_positions

REWARD_MODULE = '''
import chess


def capture_bonus(board: chess.Board, move: chess.Move, win_probability: float) -> float:
    """The engine's value, plus 1 for a capture."""
    return win_probability + (1.0 if board.is_capture(move) else 0.0)
'''

MOVE_GROUP = [*TINY_MOVE_GROUP_RUN]


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    yield from importable_module(tmp_path, monkeypatch, "registry_rewards", REWARD_MODULE)


@pytest.fixture
def keeps_balance():
    """docs/architecture.md's worked example, registered here with one line and removed afterwards."""

    def keeps_balance_reward(scored: GroupRewards) -> torch.Tensor:
        """1 for a move that keeps the game level (expected score within 0.1 of a draw), else 0."""
        return ((scored.values - 0.5).abs() < 0.1).float()

    MOVE_GROUP_REWARDS.register("keeps_balance", keeps_balance_reward, needs={"pool"})
    yield keeps_balance_reward
    del MOVE_GROUP_REWARDS["keeps_balance"]


def _run(tmp_path, name: str, *overrides: str) -> list[dict]:
    config = load_config(
        MoveGroupTrainConfig, None, [*MOVE_GROUP, f"run.out_dir={tmp_path}", f"run.name={name}", *overrides]
    )
    with Trainer(config) as trainer:
        trainer.train()
    return read_metrics(tmp_path / name / "metrics.jsonl")


@pytest.fixture(scope="module")
def scored_groups():
    """Real groups of a tiny random policy over varied positions, valued by real Stockfish (best moves and the
    tables too): what every move-group reward reads."""
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig.from_size("tiny")).eval()
    boards = [*random_playout_positions(5, seed=3), chess.Board("8/8/8/8/2k5/8/8/KQ6 w - - 0 1")]  # and a KQvK ending
    groups = sample_groups(model, boards, 6, temperature=1.0, generator=torch.Generator().manual_seed(1))
    with EnginePool(processes=1, nodes=100) as pool, Tablebase(str(SYZYGY_DIR)) as tables:
        yield score_groups(pool, groups, nodes=100, best_move_values=True, tablebase=tables)


# ------------------------------------------------------------------------------------------------
# One reward of weight 1 is the old single reward, bit for bit


def test_one_reward_of_weight_one_is_the_old_single_reward_bit_for_bit(scored_groups, reward_module):
    """What `task.reward: NAME` trained on before the registry (the value tables of `GroupRewards`, the user's
    function through `user_rewards`) equals the combined reward of `task.rewards: {NAME: 1}` on the same groups."""
    scored = scored_groups
    old = {"win_prob": scored.values, "regret": scored.regret, "shaped": scored.shaped}
    for name, before in old.items():
        [item] = MoveGroupConfig(rewards={name: 1.0}).weighted_rewards()
        after = combine([(item.weight, item.reward.function(scored))])
        assert after.dtype == before.dtype and torch.equal(after, before), name
        assert torch.equal(after.view(torch.int32), before.view(torch.int32)), name  # the bits, -0.0 included
    spec = "registry_rewards:capture_bonus"
    assert scored.groups is not None
    before = user_rewards(load_reward_function(spec), scored.groups.boards, scored.groups.moves(), scored.values, spec)
    for config in (MoveGroupConfig(reward_fn=spec), MoveGroupConfig(rewards={spec: 1.0})):
        [item] = config.weighted_rewards()
        assert item.reward.user and item.name == spec
        assert torch.equal(
            combine([(item.weight, item.reward.function(scored))]).view(torch.int32), before.view(torch.int32)
        )


def test_several_rewards_combine_into_their_weighted_sum(scored_groups):
    scored = scored_groups
    items = MoveGroupConfig(rewards={"shaped": 1.0, "win_prob": 0.5, "regret": -2.0}).weighted_rewards()
    assert [(item.name, item.weight) for item in items] == [("shaped", 1.0), ("win_prob", 0.5), ("regret", -2.0)]
    combined = combine([(item.weight, item.reward.function(scored)) for item in items])
    assert torch.equal(combined, 1.0 * scored.shaped + 0.5 * scored.values + -2.0 * scored.regret)


def test_the_new_key_with_one_reward_trains_the_same_run_as_the_old_key(tmp_path):
    """`task.reward: shaped` (every shipped move-group config) and `task.rewards: {shaped: 1}`: the same metrics, bit for bit."""
    old = _run(tmp_path, "old", "task.reward=shaped")
    new = _run(tmp_path, "new", "task.rewards={shaped: 1.0}")
    assert len(old) == len(new) == 2
    for row_old, row_new in zip(old, new):
        for key, value in row_old.items():
            if key != "time" and not key.startswith("perf/"):
                assert row_new[key] == value, key
        assert row_new["reward/shaped"] == pytest.approx(row_new["reward/mean"], abs=1e-6)  # float32 and float64 means


# ------------------------------------------------------------------------------------------------
# Adding a reward, weighting several, a user's function


def test_a_reward_registered_in_the_test_trains_beside_another_with_weights(tmp_path, keeps_balance):
    """One function and one `register` line add a move-group reward; a run with two rewards and weights logs each
    by name, and the combined reward it trains on is their weighted sum."""
    assert isinstance(MOVE_GROUP_REWARDS["keeps_balance"], RegisteredReward)
    rows = _run(tmp_path, "two", "task.rewards={keeps_balance: 0.5, win_prob: 2.0}")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        for name in ("keeps_balance", "win_prob"):
            assert f"reward/{name}" in row and f"reward/{name}_std" in row
        assert (row["reward/keeps_balance"] * 16).is_integer()  # 16 rewards of 0 or 1
        assert row["reward/mean"] == pytest.approx(
            0.5 * row["reward/keeps_balance"] + 2.0 * row["reward/win_prob"], abs=1e-6
        )


def test_a_user_function_is_a_reward_of_the_same_registry_and_path(tmp_path, reward_module):
    """``module:function`` in `task.rewards` is wrapped into a `RegisteredReward` and weighted like a built-in:
    capture_bonus - win_prob leaves only the capture bonus."""
    spec = "registry_rewards:capture_bonus"
    record = MOVE_GROUP_REWARDS.record(spec)
    assert (
        isinstance(record, RegisteredReward) and record.user and record.name == spec and record.needs_of() == {"pool"}
    )
    rows = _run(tmp_path, "user", f"task.rewards={{'{spec}': 1.0, win_prob: -1.0}}")
    for row in rows:
        assert f"reward/{spec}" in row and "reward/win_prob" in row
        assert row["reward/mean"] == pytest.approx(row[f"reward/{spec}"] - row["reward/win_prob"], abs=1e-6)
        assert (row["reward/mean"] * 16) == pytest.approx(
            round(row["reward/mean"] * 16), abs=1e-4
        )  # captures: 0 or 1 each


def test_what_a_run_starts_comes_from_its_rewards_records(tmp_path):
    """The tables open for a reward whose record needs them (shaped), not for one that does not (win_prob), whatever
    its name; a trajectory reward registered with needs {"pool"} starts the pool."""

    def tablebase_free(scored: GroupRewards) -> torch.Tensor:
        return scored.values

    MOVE_GROUP_REWARDS.register("tables_please", tablebase_free, needs={"pool", "tablebase"})
    try:
        for rewards, opens in (
            ("{win_prob: 1.0}", False),
            ("{win_prob: 1.0, shaped: 0.0}", True),
            ("{tables_please: 1.0}", True),
        ):
            config = load_config(
                MoveGroupTrainConfig, None, [*MOVE_GROUP, f"run.out_dir={tmp_path}", f"task.rewards={rewards}"]
            )
            with Trainer(config) as trainer:
                assert isinstance(trainer.kind, MoveGroupKind)
                assert (trainer.kind.tablebase is not None) == opens, rewards
    finally:
        del MOVE_GROUP_REWARDS["tables_please"]

    def engine_free(trajectories, sources: RewardSources, task) -> StepRewards:
        return StepRewards(torch.zeros(trajectories.mask.shape))

    base = ["positions=random:8", "task.opponent=self", f"run.out_dir={tmp_path}"]
    TRAJECTORY_REWARDS.register("asks_for_the_pool", engine_free, needs={"pool"})
    try:
        asks = load_config(TrajectoryTrainConfig, None, [*base, "task.rewards={asks_for_the_pool: 1.0}"])
        assert asks.needs_pool and not asks.needs_tables
        engine = load_config(TrajectoryTrainConfig, None, [*base, "task.reward=engine"])
        assert engine.needs_pool and not engine.needs_tables and "engine_values" in engine.reward_needs
    finally:
        del TRAJECTORY_REWARDS["asks_for_the_pool"]


def test_a_trajectory_run_combines_the_tablebase_and_the_engine(tmp_path):
    """KQvK against the perfect defender with two rewards: each logged over the valid plies, their weighted sum trained on."""
    config = load_config(
        TrajectoryTrainConfig,
        "configs/endgame_kqk.yaml",
        [
            "init_checkpoint=null",
            "task.positions_per_step=2",
            "task.group_size=2",
            "task.horizon=3",
            "task.reward_nodes=50",
            "task.rewards={tablebase: 1.0, engine: 0.5}",
            "engine.processes=1",
            "engine.cache=false",
            "steps=1",
            "eval_every=0",
            "eval_at_start=false",
            "checkpoint_every=0",
            "grpo.minibatch_size=4",
            f"run.out_dir={tmp_path}",
            "run.name=both",
        ],
    )
    assert config.needs_pool and config.needs_tables
    with Trainer(config) as trainer:
        trainer.train()
    [row] = read_metrics(tmp_path / "both" / "metrics.jsonl")
    assert row["reward/step_mean"] == pytest.approx(row["reward/tablebase"] + 0.5 * row["reward/engine"], abs=1e-6)
    assert "rollout/dtz_optimal_rate" in row  # read from the tablebase reward's own plies


# ------------------------------------------------------------------------------------------------
# Clear errors


def test_errors_name_the_key_and_list_the_known_rewards(tmp_path, reward_module):
    def error(*overrides: str) -> str:
        with pytest.raises(ConfigError) as raised:
            load_config(MoveGroupTrainConfig, None, [*MOVE_GROUP, f"run.out_dir={tmp_path}", *overrides])
        return str(raised.value)

    unknown = error("task.rewards={win_prob: 1.0, balance: 1.0}")
    assert (
        "task.rewards" in unknown
        and "'balance'" in unknown
        and all(name in unknown for name in ("win_prob", "regret", "shaped"))
    )
    assert "config key task.rewards.win_prob: expected a finite number" in error("task.rewards={win_prob: .nan}")
    assert "config key task.rewards.win_prob: expected a number" in error("task.rewards={win_prob: heavy}")
    assert "config key task.rewards.win_prob: expected a finite number" in error("task.rewards.win_prob=inf")
    with pytest.raises(ValueError, match="the weight of 'win_prob' must be a finite number"):
        MoveGroupConfig(rewards={"win_prob": float("inf")})
    missing = error("task.rewards={win_prob: 1.0, 'no_such_module_y:reward': 0.5}")
    assert "task.rewards 'no_such_module_y:reward'" in missing and "does not import" in missing
    assert "has no attribute 'nothing'" in error("task.rewards={'registry_rewards:nothing': 1.0}")
    assert "every weight is 0" in error("task.rewards={win_prob: 0.0}")
    assert "is empty" in error("task.rewards={}")
    assert "reward_fn" in error("task.rewards={win_prob: 1.0}", "task.reward_fn=registry_rewards:capture_bonus")
    assert "does not name task.reward 'shaped'" in error("task.reward=shaped", "task.rewards={win_prob: 1.0}")
    assert "needs best_move_values" in error("task.rewards={regret: 1.0}", "task.best_move_values=false")
    # Trajectories: the known names, and no user functions there.
    with pytest.raises(ConfigError, match=r"unknown trajectory reward 'nope'; known: \['tablebase', 'engine'\]"):
        load_config(TrajectoryTrainConfig, None, ["task.rewards={nope: 1.0}"])
    with pytest.raises(ConfigError, match="trajectory rewards take no user functions"):
        load_config(TrajectoryTrainConfig, None, ["task.rewards={'registry_rewards:capture_bonus': 1.0}"])
    # Names that would collide with the combined reward's metrics (reward/mean, ...) or look like a user's function.
    for name in ("mean", "std", "mod:fn", "a/b"):
        with pytest.raises(ValueError, match="cannot name"):
            MOVE_GROUP_REWARDS.register(name, lambda scored: scored.values)
    with pytest.raises(ValueError, match="needs \\['tables'\\]: not among"):
        MOVE_GROUP_REWARDS.register("typo", lambda scored: scored.values, needs={"tables"})
    assert "typo" not in MOVE_GROUP_REWARDS
