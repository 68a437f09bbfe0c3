"""The chess LM's registered rewards (tasks/lm_rewards.py): the default ones grade as the evaluation's
`score_completions` does, a user's TRL-style function is a weighted reward of the same registry, and a real
tiny LM run logs each by name.

Real Stockfish at a small node limit, the shipped RookWorld samples, a tiny fresh LM.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from chessgrpo.config import ConfigError, load_config
from chessgrpo.data.rookworld_format import split_environment_line, split_policy_line
from chessgrpo.data.rookworld_grading import PolicyRewardConfig, RookWorldRewardConfig, score_completions
from chessgrpo.engine import EnginePool
from chessgrpo.tasks.kinds.rookworld import RookWorldKind, RookWorldTrainConfig
from chessgrpo.tasks.lm_rewards import ROOKWORLD_REWARDS
from chessgrpo.tasks.lm_rollout import RookWorldTaskConfig
from chessgrpo.tasks.reward_registry import RegisteredReward, combine
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from conftest import ROOKWORLD_NODES as NODES
from helpers import data_file

USER_MODULE = '''
def short_answers(prompts, completions, **kwargs):
    """TRL's reward-function signature: 1 for a completion of at most 40 characters, else 0."""
    return [1.0 if len(completion) <= 40 else 0.0 for completion in completions]


def no_keywords(text):
    return [0.0]
'''
SPEC = "lm_user_rewards:short_answers"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "lm_user_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("lm_user_rewards", None)
    yield importlib.import_module("lm_user_rewards")
    sys.modules.pop("lm_user_rewards", None)


@pytest.fixture(scope="module")
def rows():
    """Mixed P: and A: prompts with completions graded differently: upstream's answers, malformed ones, an A: answer
    of another prompt."""
    lines = [
        line
        for line in data_file("rookworld_samples.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    policy = [split_policy_line(line) for line in lines if line.startswith("P:")][:4]
    environment = [split_environment_line(line) for line in lines if line.startswith("A:")][:3]
    prompts = [p for p, _ in policy] + [p for p, _ in environment] + [policy[0][0], environment[0][0]]
    completions = [c for _, c in policy] + [c for _, c in environment] + ["M: e2e4 B:", environment[1][1]]
    return prompts, completions


def _combined(pool, prompts, completions, config, weights) -> list[float]:
    """What `RookWorldKind.rollout` trains each row on: the weighted sum of the rewards that grade it."""
    items = ROOKWORLD_REWARDS.weighted(weights)
    graded = {item.name: item.reward.function(pool, prompts, completions, config) for item in items}
    return [
        combine([(item.weight, graded[item.name][row].total) for item in items if graded[item.name][row] is not None])
        for row in range(len(prompts))
    ]


def test_the_default_rewards_grade_each_prompt_by_its_task_as_the_evaluation_does(rows):
    prompts, completions = rows
    config = RookWorldRewardConfig(policy=PolicyRewardConfig(nodes=NODES))
    with EnginePool(processes=1, nodes=NODES) as pool:
        expected = [r.total for r in score_completions(pool, prompts, completions, config)]
        got = _combined(pool, prompts, completions, config, RookWorldTaskConfig().weights)
    assert got == expected  # bit for bit: `kind: rookworld` trains on what it trained on before
    assert len(set(expected)) > 3 and -1.0 in expected  # graded differently, malformed ones at the penalty


def test_a_user_trl_function_is_a_weighted_lm_reward(rows, user_module):
    prompts, completions = rows
    config = RookWorldRewardConfig(policy=PolicyRewardConfig(nodes=NODES))
    record = ROOKWORLD_REWARDS.record(SPEC)
    assert isinstance(record, RegisteredReward) and record.user and record.needs_of() == frozenset()
    short = user_module.short_answers(prompts, completions)
    with EnginePool(processes=1, nodes=NODES) as pool:
        base = [r.total for r in score_completions(pool, prompts, completions, config)]
        got = _combined(pool, prompts, completions, config, {"policy": 1.0, "environment": 1.0, SPEC: 0.5})
    assert got == pytest.approx([b + 0.5 * s for b, s in zip(base, short)], abs=1e-12) and 0 < sum(short) < len(short)
    with pytest.raises(
        ValueError, match=r"task.rewards 'lm_user_rewards:no_keywords': it must take \(prompts, completions"
    ):
        ROOKWORLD_REWARDS.record("lm_user_rewards:no_keywords", "task.rewards")


def test_a_tiny_lm_run_logs_each_reward_and_trains_on_their_weighted_sum(rookworld_data, user_module, tmp_path):
    root = rookworld_data
    config = load_config(
        RookWorldTrainConfig,
        "configs/rookworld_grpo_tiny.yaml",
        [
            f"data={root / 'data'}",
            "init_checkpoint=null",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "task.prompts_per_step=4",
            "task.group_size=2",
            "task.max_new_tokens=12",
            "task.temperature=1.0",
            "grpo.minibatch_size=4",
            f"rewards.policy.nodes={NODES}",
            "engine.processes=1",
            "engine.cache=false",
            "eval.policy_prompts=0",
            "eval.environment_prompts=0",
            "eval_every=0",
            "eval_at_start=false",
            "checkpoint_every=0",
            "steps=1",
            f"task.rewards={{policy: 1.0, environment: 1.0, '{SPEC}': 0.5}}",
            f"run.out_dir={tmp_path}",
            "run.name=lm",
        ],
    )
    with Trainer(config) as trainer:
        assert (
            isinstance(trainer.kind, RookWorldKind) and trainer.kind.pool is not None
        )  # the P: reward's record needs it
        trainer.train()
    [row] = read_metrics(tmp_path / "lm" / "metrics.jsonl")
    for name in ("policy", "environment", SPEC):
        assert f"reward/{name}" in row and f"reward/{name}_std" in row
    # 8 rows: 6 P: (policy_fraction 0.8 of 4 prompts, rounded: 3 prompts x 2) and 2 A:; the user's function grades all.
    expected = (6 * row["reward/policy"] + 2 * row["reward/environment"]) / 8 + 0.5 * row[f"reward/{SPEC}"]
    assert row["reward/mean"] == pytest.approx(expected, abs=1e-6)
    assert row["reward/policy_total"] == pytest.approx(row["reward/policy"])  # the per-task metrics as before


def test_lm_reward_errors_name_the_key(rookworld_data):
    base = [f"data={rookworld_data / 'data'}", "init_checkpoint=null"]
    with pytest.raises(
        ConfigError,
        match=r"task.rewards: unknown chess-LM reward 'legal'; known: \['policy', 'environment', 'dtz_optimal'\]",
    ):
        load_config(
            RookWorldTrainConfig, "configs/rookworld_grpo_tiny.yaml", [*base, "task.rewards={policy: 1.0, legal: 1.0}"]
        )
    with pytest.raises(ConfigError, match=r"task.rewards 'nowhere_z:f': module 'nowhere_z' does not import"):
        load_config(
            RookWorldTrainConfig, "configs/rookworld_grpo_tiny.yaml", [*base, "task.rewards={'nowhere_z:f': 1.0}"]
        )
    with pytest.raises(ConfigError, match="config key task.rewards.policy: expected a finite number"):
        load_config(RookWorldTrainConfig, "configs/rookworld_grpo_tiny.yaml", [*base, "task.rewards={policy: .inf}"])
