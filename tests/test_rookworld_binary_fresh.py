"""Issue 66, items 2-3: the binary ``dtz_optimal`` reward, DAPO dynamic sampling and fresh KQvK prompts for the chess LM.

tasks/lm_rewards.py (``dtz_optimal``) and data/rookworld_grading.py (`is_dtz_optimal`, the one definition),
board/endgames.py (`EndgameStarts.exclude`), tasks/kinds/rookworld.py (``task.fresh_endgames``,
``task.dynamic_sampling``, ``eval.endgame_positions``), tasks/lm_rollout.py (`select_groups`). Real KQvK tables, real
files from the data command, a tiny real LM taught here.
"""

from __future__ import annotations

import json

import chess
import pytest
import torch

from chessgrpo.board.endgames import EndgameStarts, endgame_positions, symmetric_epds
from chessgrpo.config import ConfigError, load_config
from chessgrpo.data.rookworld import read_rookworld
from chessgrpo.data.rookworld_format import parse_policy_completion
from chessgrpo.data.rookworld_grading import (
    PolicyRewardConfig,
    RookWorldRewardConfig,
    score_policy,
)
from chessgrpo.data.rookworld_truths import tablebase_truth
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.tasks.kinds.rookworld import RookWorldTrainConfig
from chessgrpo.tasks.lm_rewards import ROOKWORLD_REWARDS
from chessgrpo.tasks.lm_rollout import RookWorldTaskConfig
from chessgrpo.track.diagnose import diagnose_run
from chessgrpo.train.kind import StepGroups
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import SYZYGY_DIR, taught_kqk_move_first

FEN = "8/8/6K1/8/3k4/8/8/7Q w - - 0 1"  # KQvK, won for White
TABLES = RookWorldRewardConfig(policy=PolicyRewardConfig(truth="tablebase", syzygy_path=str(SYZYGY_DIR)))
# The engine truth is the default: the binary reward grades by the tables whatever the truth says.
ENGINE_TRUTH = RookWorldRewardConfig(policy=PolicyRewardConfig(syzygy_path=str(SYZYGY_DIR)))


def low_rank_reward(prompts, completions, **kwargs):
    """A TRL-style reward with spread in some groups of a barely taught model and none in others: 1 when the answer
    ends on ranks 1-4 (the tiny LM rarely finds a DTZ-optimal move, so ``dtz_optimal`` alone seldom has spread)."""
    return [float(completion.strip()[-1:] in "1234") for completion in completions]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def tablebase():
    return Tablebase(SYZYGY_DIR)


def test_the_binary_reward_pays_one_for_a_dtz_optimal_move_and_zero_for_anything_else(tablebase):
    truth = tablebase_truth(tablebase, chess.Board(FEN))
    exact = truth.exact
    assert exact is not None
    optimal = sorted(truth.optimal)
    best = exact[optimal[0]]
    slower = next(m for m, v in exact.items() if v.score == best.score and m not in truth.optimal)  # a slower win
    drawing = [m for m, v in exact.items() if v.score == 0.5]  # e.g. a queen left en prise
    completions = [f" B: {optimal[0]}", f" B: {slower}", " B: a1a8", "hello", f" B: {optimal[-1]} M: {slower} E: 1.0"]
    completions += [f" B: {m}" for m in drawing[:1]]
    prompts = ["P: " + FEN] * len(completions)
    record = ROOKWORLD_REWARDS.record("dtz_optimal")
    assert record.needs_of() == {"tablebase"}
    for config in (TABLES, ENGINE_TRUTH):
        rewards = record.function(None, prompts, completions, config)
        assert [r.total for r in rewards] == [1.0, 0.0, 0.0, 0.0, 1.0] + [0.0] * len(drawing[:1])  # type: ignore[union-attr]
        assert rewards[3].malformed is not None and rewards[1].malformed is None  # type: ignore[union-attr]
    # A: rows are not its to grade; a mixed step still gets one value per P: row.
    a_prompt = "A: " + FEN + "+h1h2+"
    assert record.function(None, [a_prompt, prompts[0]], ["x", completions[0]], TABLES)[0] is None

    # One definition: the binary reward is 1 exactly where the evaluation's best credit is 1 (graded or exact mode).
    for move in sorted(truth.legal):
        binary = record.function(None, [prompts[0]], [f" B: {move}"], TABLES)[0].total  # type: ignore[union-attr]
        answer = parse_policy_completion(f" B: {move}")
        for mode in ("graded", "exact"):
            policy = PolicyRewardConfig(truth="tablebase", syzygy_path=str(SYZYGY_DIR), best_mode=mode)
            graded = score_policy(answer, truth, policy)
            assert (graded.components["best"] == 1.0) == (binary == 1.0) == (graded.components["best_exact"] == 1.0)

    # Selectable through the registry like any reward: task.rewards: {dtz_optimal: 1.0}.
    config = RookWorldTrainConfig(init_checkpoint=None, task=RookWorldTaskConfig(rewards={"dtz_optimal": 1.0}))
    assert [item.name for item in config.weighted_rewards()] == ["dtz_optimal"]


def test_excluded_positions_and_their_images_are_never_held_out_nor_drawn(tablebase):
    starts = EndgameStarts("KQvK", tablebase.is_won, tables=tablebase.names)
    before = [b.epd() for b in starts.draw(20, seed=3, step=1)]
    # Without exclude a draw is what it was (only the held-out images are excluded).
    assert before == [b.epd() for b in endgame_positions("KQvK", 20, seed=[3, 1, 0], accept=tablebase.is_won)]
    sft = starts.draw(200, seed=9, step=0)
    starts.exclude(sft)
    held = starts.hold_out(300, seed=0)
    sft_images = set().union(*(symmetric_epds(b) for b in sft))
    assert not {b.epd() for b in held} & sft_images
    for step in range(5):
        for board in starts.draw(60, seed=0, step=step):
            assert board.epd() not in starts.held_out and board.epd() not in sft_images


@pytest.fixture(scope="module")
def kqk_data(tmp_path_factory):
    """A KQvK dataset of the real command (move-first layout) and a one-layer LM taught its P: lines."""
    root = tmp_path_factory.mktemp("binary_fresh")
    _, taught = taught_kqk_move_first(root)
    return root, taught


def _config(root, sft, name: str, *overrides: str) -> RookWorldTrainConfig:
    return load_config(
        RookWorldTrainConfig,
        "configs/rookworld_grpo_endgames.yaml",
        [
            f"data={root / 'data'}",
            f"init_checkpoint={sft}",
            f"run.out_dir={root / 'runs'}",
            f"run.name={name}",
            f"rewards.policy.syzygy_path={SYZYGY_DIR}",
            "task.rewards={dtz_optimal: 1.0}",
            "task.stop_after_move=true",
            "task.policy_fraction=1.0",
            "task.fresh_endgames=KQvK",
            "task.dynamic_sampling=true",
            "task.max_resample_rounds=3",
            "task.prompts_per_step=4",
            "task.group_size=4",
            "task.max_new_tokens=12",
            "grpo.minibatch_size=16",
            "eval.endgame_positions=2000",
            "eval.environment_prompts=0",
            "eval.batch_size=500",
            "eval.resamples=20",
            "eval_every=0",
            "eval_at_start=false",
            "steps=2",
            "checkpoint_every=0",
            "threads=1",
            *overrides,
        ],
    )


def test_fresh_prompts_are_won_never_in_the_data_and_disjoint_from_the_held_out_set(kqk_data, tablebase):
    root, sft = kqk_data
    with Trainer(_config(root, sft, "fresh")) as trainer:
        kind = trainer.kind
        assert kind.endgames is not None and len(kind.eval_policy_fens) == 2000
        held = {b.epd() for fen in kind.eval_policy_fens for b in [chess.Board(fen)]}
        held_images = set().union(*(symmetric_epds(chess.Board(fen)) for fen in kind.eval_policy_fens))
        data = [e for split in ("train", "test") for e in read_rookworld(root / "data", split, task="policy")]
        data_images = set().union(*(symmetric_epds(chess.Board(e.fen)) for e in data))
        assert len(held) == 2000 and not held & data_images
        assert all(tablebase.is_won(chess.Board(fen)) for fen in kind.eval_policy_fens)
        for step in range(6):
            for resample_round in (0, 1):
                prompts = kind.draw_prompts(step, 8, resample_round)
                assert all(p.startswith("P: ") for p in prompts)  # policy_fraction 1.0: no A: prompt
                for prompt in prompts:
                    board = chess.Board(prompt[3:])
                    assert tablebase.is_won(board) and board.epd() not in held_images | data_images
        assert kind.draw_prompts(1, 8) != kind.draw_prompts(1, 8, 1) and kind.draw_prompts(2, 8) == kind.draw_prompts(
            2, 8
        )


def test_dynamic_sampling_keeps_groups_with_spread_reproducibly_and_a_short_run_logs_it(kqk_data):
    root, sft = kqk_data
    rollouts = []
    spread = f"task.rewards={{{__name__}:low_rank_reward: 1.0}}"
    for name in ("dyn_a", "dyn_b"):
        with Trainer(_config(root, sft, name, spread)) as trainer:
            rollout = trainer.kind.rollout(0, StepGroups(4, range(4), range(4)))
            rollouts.append(rollout)
    first, second = rollouts
    rewards = first.batch.rewards.view(-1, 4)
    metrics = first.metrics
    assert metrics["rollout/groups_kept"] == rewards.shape[0] == 4  # every kept group has spread
    assert bool((rewards.max(1).values > rewards.min(1).values).all())
    # Some drawn groups had none: they were dropped and more drawn (in rounds beyond the first).
    drawn = metrics["rollout/groups_drawn"]
    assert drawn > 4 and metrics["rollout/resample_rounds"] >= 1
    assert metrics["rollout/frac_reward_zero_std"] == (drawn - 4) / drawn
    # The policy's rate over every group drawn, not only the kept ones (the dropped flat groups are all 0 or all 1).
    assert 0 <= metrics["rollout/reward_mean_drawn"] <= 1
    assert metrics["rollout/reward_mean_drawn"] != pytest.approx(float(first.batch.rewards.mean()))
    assert torch.equal(first.batch.rewards, second.batch.rewards) and torch.equal(
        first.batch.actions, second.batch.actions
    )
    assert {k: v for k, v in first.metrics.items() if not k.startswith("perf/")} == {
        k: v for k, v in second.metrics.items() if not k.startswith("perf/")
    }

    # A short run with all of it: binary reward, fresh prompts, dynamic sampling, the 2,000-position evaluation.
    with Trainer(_config(root, sft, "run", "eval_every=2", "eval.endgame_positions=40")) as trainer:
        trainer.train()
    rows = read_metrics(root / "runs" / "run" / "metrics.jsonl")
    steps = [r for r in rows if "rollout/groups_drawn" in r]
    assert len(steps) == 2
    for row in steps:
        for key in (
            "rollout/frac_reward_zero_std",
            "rollout/groups_kept",
            "rollout/resample_rounds",
            "reward/dtz_optimal",
        ):
            assert key in row
    records = json.loads((root / "runs" / "run" / "eval" / "step_000002_lm.json").read_text())["records"]["policy"]
    assert len(records) == 40 and all(chess.Board(r["prompt"][3:]).is_valid() for r in records)
    # diagnose judges the signal by the groups dynamic sampling could fill (here: none, the tiny LM never finds a
    # DTZ-optimal move on fresh positions), not by the share of flat groups drawn (which it drops and redraws).
    (finding,) = [f for f in diagnose_run(root / "runs" / "run") if f.id == "signal.zero_reward_variance"]
    assert (
        finding.severity == "critical" and "dynamic sampling filled only 0% of the step's 4 groups" in finding.message
    )
    assert finding.evidence["median_groups_kept"] == 0


def test_bad_settings_name_their_key(kqk_data):
    root, sft = kqk_data
    with pytest.raises(ConfigError, match="eval.endgame_positions"):
        _config(root, sft, "bad", "task.fresh_endgames=null")
    with pytest.raises(ConfigError, match="task.fresh_endgames"):
        Trainer(_config(root, sft, "bad2", "task.fresh_endgames=QvK", "eval.endgame_positions=0"))
