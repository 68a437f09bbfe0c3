"""The LM lifecycle end to end on a tiny model: data -> SFT -> GRPO on text -> eval, through the CLI too.

Real Stockfish at small node limits; models of one or two layers; a few steps each.
"""

from __future__ import annotations

import json

import pytest
import torch

from chessgrpo.cli import main
from chessgrpo.config import load_config
from chessgrpo.data.rookworld import RookWorldDataConfig, run_rookworld_data
from chessgrpo.models.lm import CharTokenizer, load_lm
from chessgrpo.tasks.rookworld import parse_policy_completion
from chessgrpo.track.metrics import read_metrics
from chessgrpo.train.rookworld import RookWorldTrainConfig, RookWorldTrainer
from chessgrpo.train.sft import SFTConfig, SFTTrainer

NODES = 300


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A 60-position dataset and a 6-step SFT run of a one-layer model."""
    root = tmp_path_factory.mktemp("rookworld_lab")
    data = RookWorldDataConfig(out=str(root / "data"), positions=60, nodes=NODES, seed=1, test_fraction=0.2)
    data.engine.processes = 1
    data.engine.cache_path = str(root / "cache.sqlite")
    run_rookworld_data(data)
    sft = load_config(SFTConfig, "configs/rookworld_sft_tiny.yaml", [
        f"data={root / 'data'}", f"run.out_dir={root / 'runs'}", "run.name=sft", "model.n_layer=1", "model.n_embd=32",
        "model.n_head=2", "steps=6", "batch_size=8", "eval_every=0", "eval_examples=16", "eval_prompts=3",
        "max_new_tokens=16", "log_every=2", "checkpoint_every=0",
    ])  # fmt: skip
    result = SFTTrainer(sft).train()
    return root, result


def _grpo_config(root, name: str, *overrides: str) -> RookWorldTrainConfig:
    return load_config(RookWorldTrainConfig, "configs/rookworld_grpo_tiny.yaml", [
        f"data={root / 'data'}", f"init_checkpoint={root / 'runs' / 'sft'}", f"run.out_dir={root / 'runs'}", f"run.name={name}",
        "task.prompts_per_step=3", "task.group_size=2", "task.max_new_tokens=20", "grpo.minibatch_size=3",
        f"rewards.policy.nodes={NODES}", "engine.processes=1", f"engine.cache_path={root / 'cache.sqlite'}",
        "eval.policy_prompts=3", "eval.environment_prompts=2", "eval.every=0", "eval.resamples=50", "steps=3", "checkpoint_every=1",
        *overrides,
    ])  # fmt: skip


def test_sft_trains_on_completions_checkpoints_and_loads_for_rl(lab):
    root, result = lab
    rows = read_metrics(root / "runs" / "sft" / "metrics.jsonl")
    assert rows[-1]["step"] == 6 and "eval/loss" in rows[-1] and "eval/policy_format_rate" in rows[-1]
    assert rows[0]["loss/train"] > rows[-1]["loss/train"]  # six steps at lr 2e-3 already lower the loss
    lm = load_lm(root / "runs" / "sft")
    assert isinstance(lm.tokenizer, CharTokenizer) and result.checkpoint.name == "step_000006"


def test_sft_lists_each_policy_answer_in_fresh_seeded_orders(lab):
    root, _ = lab
    config = load_config(SFTConfig, "configs/rookworld_sft_tiny.yaml", [
        f"data={root / 'data'}", f"run.out_dir={root / 'runs'}", "run.name=reshuffle", "model.n_layer=1", "model.n_embd=32",
        "model.n_head=2",
    ])  # fmt: skip
    trainer = SFTTrainer(config)
    index = next(i for i, task in enumerate(trainer.train_data.tasks) if task == "policy")
    decode = trainer.lm.tokenizer.decode
    original = parse_policy_completion(decode(trainer.train_data.completions[index][:-1]))
    seen = set()
    for step in range(8):
        trainer.step = step
        ids = trainer._completion(index)
        assert ids == trainer._completion(index) and ids[-1] == trainer.lm.tokenizer.eos_token_id  # seeded by (step, index)
        answer = parse_policy_completion(decode(ids[:-1]))
        assert sorted(zip(answer.moves, answer.evals)) == sorted(zip(original.moves, original.evals))  # pairs kept
        assert answer.best == original.best and len(ids) == len(trainer.train_data.completions[index])
        seen.add(answer.moves)
    assert len(seen) > 1  # the order changes between draws
    config.reshuffle_moves = False
    assert SFTTrainer(config)._completion(index) == trainer.train_data.completions[index]


def test_grpo_on_text_logs_the_core_and_task_metrics_and_resumes_exactly(lab):
    root, _ = lab
    with RookWorldTrainer(_grpo_config(root, "straight")) as trainer:
        result = trainer.train()
    assert result.finished and result.paired is not None and "p_reward" in result.paired["differences"]
    rows = read_metrics(root / "runs" / "straight" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    step = rows[1]
    for key in ("loss/policy", "kl/value", "kl/coef", "ratio/first_max_abs_dev", "entropy/mean", "reward/mean", "adv/std",
                "rollout/completion_tokens", "rollout/malformed_rate", "reward/policy_total", "reward/policy_best",
                "reward/policy_format", "reward/environment_fen_exact", "perf/cache_hit_rate"):  # fmt: skip
        assert key in step, key
    assert all(r["ratio/first_max_abs_dev"] < 1e-4 for r in rows[1:]) and all(r["kl/min"] >= 0 for r in rows[1:])
    assert "eval/p_format_rate" in rows[0] and "eval/a_format_rate" in rows[-1]

    with RookWorldTrainer(_grpo_config(root, "resumed", "stop_at=2")) as trainer:
        assert trainer.train().step == 2
    resumed_config = _grpo_config(root, "resumed")
    with RookWorldTrainer(resumed_config, resume=True) as trainer:
        assert trainer.step == 2
        trainer.train()
    straight = load_lm(root / "runs" / "straight").model.state_dict()
    resumed = load_lm(root / "runs" / "resumed").model.state_dict()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_cli_runs_data_sft_train_and_eval_lm(lab, tmp_path, capsys):
    root, _ = lab
    cache = f"engine.cache_path={root / 'cache.sqlite'}"
    assert main(["data", "rookworld", "--out", str(tmp_path / "d"), "--positions", "12", "--nodes", str(NODES),
                 "engine.processes=1", cache]) == 0  # fmt: skip
    assert main(["train", "--config", "configs/rookworld_grpo_tiny.yaml", f"data={root / 'data'}",
                 f"init_checkpoint={root / 'runs' / 'sft'}", f"run.out_dir={tmp_path / 'runs'}", "run.name=cli",
                 "task.prompts_per_step=2", "task.group_size=2", "task.max_new_tokens=12", f"rewards.policy.nodes={NODES}",
                 "engine.processes=1", cache, "eval.policy_prompts=2", "eval.environment_prompts=1", "eval.resamples=20",
                 "steps=1"]) == 0  # fmt: skip
    output = tmp_path / "eval.json"
    assert main(["eval", "lm", "--checkpoint", str(tmp_path / "runs" / "cli"), "--data", str(root / "data"),
                 "--policy-prompts", "2", "--environment-prompts", "2", f"rewards.policy.nodes={NODES}", "engine.processes=1",
                 cache, "max_new_tokens=12", "resamples=20", f"output={output}"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "p_format_rate" in printed and "a_exact_state_accuracy" in printed
    assert set(json.loads(output.read_text())["records"]) == {"policy", "environment", "puzzles"}
    assert main(["eval", "lm", "--compare", str(output), str(output)]) == 0
    assert "p_reward" in capsys.readouterr().out
    assert main(["train", "--config", "configs/rookworld_grpo_tiny.yaml", "task.bogus=1"]) == 2  # every key is checked


def test_policy_metrics_separate_the_chess_from_the_format():
    """Best-move accuracy over all answers counts a malformed one as a miss; among well-formed ones it does not."""
    from chessgrpo.eval.lm import policy_metrics

    def row(malformed, best):
        return {"malformed": malformed, "best": best, "top5_hit": best, "legal": 1.0, "top5": 0.2, "total": best}

    rows = [row(None, 1.0), row(None, 0.0), row("M: lists a move twice", 0.0), row("missing E:, B:", 0.0)]
    metrics = policy_metrics(rows, confidence=0.95, resamples=100, seed=0)
    assert metrics["p_format_rate"].value == 0.5 and metrics["p_best_accuracy"].value == 0.25
    assert metrics["p_best_accuracy_well_formed"].value == 0.5 and metrics["p_best_accuracy_well_formed"].n == 2
    assert metrics["p_eval_error"].n == 0  # no answer had an eval error to average
