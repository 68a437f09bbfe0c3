"""Issue 66's comparison tools: the held-out KQvK set any checkpoint is graded on, the continued-SFT control arm and
the equal-time stop.

eval/lm.py (``endgame_positions``), data/fresh_endgames.py (the stream, the held-out set, the labelled examples),
tasks/kinds/sft.py (``fresh_endgames``, ``fresh_target``), tasks/sft.py (`any_of_loss`), tasks/kinds/rookworld.py
(``task.shuffle_rewards``), train/loop.py (``time_limit_minutes``), and the shipped configs of the two
arms. Real KQvK tables, real files from the data command, a tiny real LM taught here, the real CLI.
"""

from __future__ import annotations

import json

import chess
import pytest
import torch

from chessgrpo.board.endgames import symmetric_epds
from chessgrpo.cli import main
from chessgrpo.config import ConfigError, load_config
from chessgrpo.data.fresh_endgames import (
    fresh_endgame_starts,
    fresh_truths,
    held_out_endgame_fens,
    labelled_fresh_examples,
)
from chessgrpo.data.rookworld import read_rookworld
from chessgrpo.data.rookworld_format import parse_policy_completion
from chessgrpo.data.rookworld_grading import is_dtz_optimal
from chessgrpo.data.rookworld_truths import tablebase_truth
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.models.lm import load_lm
from chessgrpo.stats import wilson_interval
from chessgrpo.tasks.kinds.rookworld import RookWorldTrainConfig
from chessgrpo.tasks.kinds.sft import SFTTrainConfig
from chessgrpo.tasks.sft import any_of_loss, sft_loss
from chessgrpo.train.kind import StepGroups
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import SYZYGY_DIR, taught_kqk_move_first

HELD_OUT = 30


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def kqk(tmp_path_factory):
    root = tmp_path_factory.mktemp("control_arm")
    data, taught = taught_kqk_move_first(root)
    return root, data, taught


def _grpo_config(root, data, taught, name: str, *overrides: str) -> RookWorldTrainConfig:
    """The shipped GRPO arm, shrunk: the tiny data and LM, a few groups, `HELD_OUT` held-out positions."""
    return load_config(
        RookWorldTrainConfig,
        "configs/rookworld_grpo_kqk_binary.yaml",
        [
            f"data={data}",
            f"init_checkpoint={taught}",
            f"run.out_dir={root / 'runs'}",
            f"run.name={name}",
            f"rewards.policy.syzygy_path={SYZYGY_DIR}",
            "task.prompts_per_step=2",
            "task.group_size=4",
            "task.max_resample_rounds=1",
            "grpo.minibatch_size=8",
            f"eval.endgame_positions={HELD_OUT}",
            f"eval.batch_size={HELD_OUT}",
            "eval.resamples=20",
            "time_limit_minutes=null",
            "steps=1",
            "checkpoint_every=0",
            *overrides,
        ],
    )


def _control_config(root, data, taught, name: str, *overrides: str) -> SFTTrainConfig:
    """The shipped control arm, shrunk the same way."""
    return load_config(
        SFTTrainConfig,
        "configs/rookworld_sft_kqk_control.yaml",
        [
            f"data={data}",
            f"model.path={taught}",
            f"run.out_dir={root / 'runs'}",
            f"run.name={name}",
            f"syzygy_path={SYZYGY_DIR}",
            f"endgame_positions={HELD_OUT}",
            "batch_size=8",
            "eval_every=0",
            "checkpoint_every=0",
            "time_limit_minutes=null",
            "steps=3",
            *overrides,
        ],
    )


def test_eval_lm_grades_any_checkpoint_on_the_held_out_set_of_a_grpo_run(kqk, capsys):
    root, data, taught = kqk
    with Trainer(_grpo_config(root, data, taught, "grpo", "eval_at_start=true", "eval_every=1")) as trainer:
        trainer.train()
    step_files = sorted((root / "runs" / "grpo" / "eval").glob("step_*_lm.json"))
    start = json.loads(step_files[0].read_text())
    assert start["step"] == 0 and start["config"]["endgame_positions"] == HELD_OUT  # the file names its set

    # The same set from the command line, for the run's starting checkpoint: the same prompts and greedy answers.
    output = root / "start.json"
    grade = ["rewards.policy.truth=tablebase", f"rewards.policy.syzygy_path={SYZYGY_DIR}", "resamples=20"]
    command = ["eval", "lm", "--checkpoint", str(taught), "--data", str(data), *grade, "max_new_tokens=8"]
    held_out = [f"endgame_positions={HELD_OUT}", "endgame_material=KQvK", "stop_after_move=true"]
    assert main([*command, *held_out, "--environment-prompts", "0", f"output={output}"]) == 0
    mine = json.loads(output.read_text())["records"]["policy"]
    assert [r["prompt"] for r in mine] == [r["prompt"] for r in start["records"]["policy"]]
    assert [r["completion"] for r in mine] == [r["completion"] for r in start["records"]["policy"]]
    # Won positions, none of the data's nor an image of one.
    data_images = set().union(
        *(symmetric_epds(chess.Board(e.fen)) for s in ("train", "test") for e in read_rookworld(data, s, task="policy"))
    )
    tablebase = Tablebase(SYZYGY_DIR)
    boards = [chess.Board(r["prompt"][3:]) for r in mine]
    assert len({b.epd() for b in boards}) == HELD_OUT and not {b.epd() for b in boards} & data_images
    assert all(tablebase.is_won(b) for b in boards)
    # Paired against the run's last step file.
    capsys.readouterr()
    assert main(["eval", "lm", "--compare", str(output), str(step_files[-1])]) == 0
    assert "p_best_accuracy" in capsys.readouterr().out

    # One clear error for a set it cannot build.
    assert main([*command, "endgame_positions=30"]) == 2
    assert "endgame_material" in capsys.readouterr().err
    engine_truth = [c for c in command if not c.startswith("rewards.policy.truth")]
    assert main([*engine_truth, *held_out]) == 2
    assert "rewards.policy.truth=tablebase" in capsys.readouterr().err


def test_the_control_arm_trains_on_the_grpo_stream_labelled_by_the_tables_never_held_out(kqk):
    root, data, taught = kqk
    tablebase = Tablebase(SYZYGY_DIR)
    starts = fresh_endgame_starts(str(data), "KQvK", tablebase)
    held = set().union(*(symmetric_epds(chess.Board(f)) for f in held_out_endgame_fens(starts, HELD_OUT, seed=0)))
    data_images = set().union(
        *(symmetric_epds(chess.Board(e.fen)) for s in ("train", "test") for e in read_rookworld(data, s, task="policy"))
    )
    with Trainer(_grpo_config(root, data, taught, "stream", "eval_at_start=false")) as grpo:
        for step in range(3):
            examples = labelled_fresh_examples(starts, tablebase, 8, data=str(data), seed=0, step=step)
            # The same positions the GRPO arm draws at that step (its first round), in the data's layout, with the
            # clocks of positions reached in play (as the data's train positions: placements alone were forgotten).
            assert [e.prompt for e in examples] == grpo.kind.draw_prompts(step, 8)
            assert any(not e.fen.endswith(" 0 1") for e in examples)
            placements = labelled_fresh_examples(starts, tablebase, 8, data=str(data), seed=0, step=step, clocks=False)
            assert [chess.Board(e.fen).epd() for e in placements] == [chess.Board(e.fen).epd() for e in examples]
            assert all(e.fen.endswith(" 0 1") for e in placements)
            for example in examples:
                board = chess.Board(example.fen)
                assert board.epd() not in held | data_images
                assert example.completion.lstrip().startswith("B: ")  # move-first, as the data writes it
                answer = parse_policy_completion(example.completion)
                assert is_dtz_optimal(answer, tablebase_truth(tablebase, board))

    before = {k: v.clone() for k, v in load_lm(taught).model.state_dict().items()}
    with Trainer(_control_config(root, data, taught, "control")) as trainer:
        result = trainer.train()
        assert result.step == 3 and result.finished
        after = trainer.kind.model.state_dict()
        assert any(not torch.equal(before[k], after[k].cpu()) for k in before)
        assert any("fresh won KQvK" in line for line in trainer.kind.summary())
    rows = [r for r in read_metrics(root / "runs" / "control" / "metrics.jsonl") if "loss/train" in r]
    assert rows and all(0 < r["loss/train"] < 20 for r in rows)


def test_time_limit_minutes_stops_both_arms_after_the_step_that_spends_it(kqk):
    root, data, taught = kqk
    with Trainer(_control_config(root, data, taught, "timed_sft", "time_limit_minutes=1e-6", "steps=50")) as trainer:
        result = trainer.train()
    assert result.step == 1 and not result.finished and result.stop_reason == "time_limit_minutes=1e-06"
    assert (root / "runs" / "timed_sft" / "checkpoints" / "step_000001").is_dir()
    config = _grpo_config(root, data, taught, "timed_grpo", "time_limit_minutes=1e-6", "steps=50", "eval_every=0")
    with Trainer(config) as trainer:
        result = trainer.train()
    assert result.step == 1 and result.stop_reason == "time_limit_minutes=1e-06"
    # Its last step is evaluated: the evaluation an equal-time comparison reports.
    assert (root / "runs" / "timed_grpo" / "eval" / "step_000001_lm.json").is_file()


def test_bad_control_settings_name_their_key(kqk):
    root, data, taught = kqk
    with pytest.raises(ConfigError, match="fresh_endgames"):
        _control_config(root, data, taught, "bad", "tasks=[policy, environment]")
    with pytest.raises(ConfigError, match="endgame_positions"):
        _control_config(root, data, taught, "bad", "fresh_endgames=null")
    with pytest.raises(ConfigError, match="time_limit_minutes"):
        _control_config(root, data, taught, "bad", "time_limit_minutes=0")
    with pytest.raises(ConfigError, match="fresh_endgames='QvK'"):
        Trainer(_control_config(root, data, taught, "bad", "fresh_endgames=QvK", "endgame_positions=0"))


def test_a_short_binary_grpo_run_raises_its_rollout_dtz_optimal_rate(kqk):
    """The shipped GRPO arm's objective learns: on the data's 6 train positions, 30 steps of 8 groups of 8 move-only
    answers take the sampled DTZ-optimal rate from ~0.17 to ~0.6 (seeded; ~25 s on one thread)."""
    root, data, taught = kqk
    config = _grpo_config(
        root,
        data,
        taught,
        "rise",
        "task.fresh_endgames=null",  # the train split's positions: a tiny LM learns them in seconds
        "task.dynamic_sampling=false",  # every sampled group counts in the rate
        "task.prompts_per_step=8",
        "task.group_size=8",
        "grpo.minibatch_size=64",
        "eval.endgame_positions=0",
        "eval.policy_prompts=0",
        "eval_every=0",
        "log_every=1",
        "lr=3e-3",
        "steps=30",
    )
    with Trainer(config) as trainer:
        trainer.train()
    rates = [r["reward/dtz_optimal"] for r in read_metrics(root / "runs" / "rise" / "metrics.jsonl")]
    assert len(rates) == 30
    first, last = wilson_interval(round(sum(rates[:5]) * 64), 320), wilson_interval(round(sum(rates[-5:]) * 64), 320)
    assert last.low > first.high and last.value - first.value > 0.2, (first, last)


def test_the_placebo_arm_learns_from_the_steps_rewards_shuffled_and_logs_the_true_ones(kqk):
    root, data, taught = kqk
    rollouts = {}
    for name, placebo in (("real", "false"), ("placebo", "true")):
        config = _grpo_config(
            root,
            data,
            taught,
            name,
            f"task.shuffle_rewards={placebo}",
            "task.prompts_per_step=4",
            "task.fresh_endgames=null",  # the train split: the tiny LM finds an optimal move there now and then
            "task.max_resample_rounds=4",
            "eval.endgame_positions=0",
        )
        with Trainer(config) as trainer:
            rollouts[name] = trainer.kind.rollout(0, StepGroups(4, range(4), range(4)))
    real, placebo = rollouts["real"], rollouts["placebo"]
    assert torch.equal(real.batch.actions, placebo.batch.actions)  # the same completions...
    assert torch.equal(real.batch.rewards.sort().values, placebo.batch.rewards.sort().values)  # ...the same rewards...
    assert not torch.equal(real.batch.rewards, placebo.batch.rewards)  # ...on other rows
    assert placebo.metrics["reward/dtz_optimal"] == real.metrics["reward/dtz_optimal"]  # logged: the true ones


def test_the_any_optimal_arm_raises_the_probability_of_a_dtz_optimal_first_move(kqk):
    """``fresh_target: any_optimal``: the loss is -log of the probability that the answer begins with any optimal move;
    a few steps at a high rate raise that probability on the positions it trained on."""
    root, data, taught = kqk
    lm = load_lm(taught)
    tokenizer = lm.tokenizer
    tablebase = Tablebase(SYZYGY_DIR)
    starts = fresh_endgame_starts(str(data), "KQvK", tablebase)
    held_out_endgame_fens(starts, HELD_OUT, seed=0)
    truths = fresh_truths(starts, tablebase, 8, seed=0, step=0)
    examples = labelled_fresh_examples(starts, tablebase, 8, data=str(data), seed=0, step=0)
    prompts = [tokenizer.encode(e.prompt) for e in examples]
    candidates = [[tokenizer.encode(f" B: {m}") for m in sorted(t.optimal)] for t in truths]
    for example, options, truth in zip(examples, candidates, truths):
        label = parse_policy_completion(example.completion).best  # type: ignore[union-attr]
        # A candidate is the head of the data's own completion for that move: the same tokens the model writes.
        assert tokenizer.encode(example.completion)[: len(options[0])] in options
        assert label in truth.optimal
    with torch.no_grad():
        single = any_of_loss(lm, prompts[:1], [candidates[0][:1]])
        nll, tokens = sft_loss(lm, prompts[:1], [candidates[0][0]])
        assert float(single) == pytest.approx(float(nll) * tokens, rel=1e-5)  # one candidate: its sequence NLL
        before = float(any_of_loss(lm, prompts, candidates))

    config = _control_config(
        root, data, taught, "any", "fresh_target=any_optimal", "lr=3e-3", "steps=1", "batch_size=8"
    )
    with Trainer(config) as trainer:
        trainer.train()
        with torch.no_grad():
            after = float(any_of_loss(trainer.kind.lm, prompts, candidates))
    assert after < before  # step 0's positions: the one step trained on exactly these
    rows = [r for r in read_metrics(root / "runs" / "any" / "metrics.jsonl") if "loss/train" in r]
    assert rows[0]["loss/train"] == pytest.approx(before, rel=1e-4) and rows[0]["train/optimal_moves"] >= 1
    with pytest.raises(ConfigError, match="fresh_target"):
        _control_config(
            root, data, taught, "bad", "fresh_target=any_optimal", "fresh_endgames=null", "endgame_positions=0"
        )
