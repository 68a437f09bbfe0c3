"""The LM lifecycle end to end on a tiny model: data -> SFT -> GRPO on text -> eval, through the CLI too.

Real Stockfish at small node limits; models of one or two layers; a few steps each.

Cross-cutting (end to end): data/rookworld.py, tasks/kinds/sft.py, tasks/kinds/rookworld.py,
train/loop.py, eval/lm.py, models (lm, chess_tokenizer, prompt_bos) and the CLI.
"""

from __future__ import annotations

import json

import pytest
import torch

from chessgrpo.cli import main
from chessgrpo.config import ConfigError, load_config
from chessgrpo.data.rookworld import RookWorldDataConfig, run_rookworld_data
from chessgrpo.data.rookworld_format import parse_policy_completion
from chessgrpo.models.chess_tokenizer import ChessTokenizer
from chessgrpo.models.lm import load_lm
from chessgrpo.tasks.kinds.rookworld import PAIRED_FILE, RookWorldTrainConfig
from chessgrpo.tasks.kinds.sft import SFTKind, SFTTrainConfig
from chessgrpo.train.kind import RunContext
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics

NODES = 300


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A 60-position dataset and a 6-step SFT run of a one-layer model."""
    root = tmp_path_factory.mktemp("rookworld_lab")
    data = RookWorldDataConfig(out=str(root / "data"), positions=60, nodes=NODES, seed=1, test_fraction=0.2)
    data.engine.processes = 1
    data.engine.cache_path = str(root / "cache.sqlite")
    run_rookworld_data(data)
    sft = load_config(
        SFTTrainConfig,
        "configs/rookworld_sft_tiny.yaml",
        [
            f"data={root / 'data'}",
            f"run.out_dir={root / 'runs'}",
            "run.name=sft",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "steps=6",
            "batch_size=32",
            "eval_every=0",
            "eval_examples=16",
            "eval_prompts=3",
            "max_new_tokens=16",
            "log_every=2",
            "checkpoint_every=0",
            "first_tasks_steps=0",  # both tasks from the start
            # The chess tokenizer starts at ln(4763) nats: six warmed-up steps at 2e-3 on batches of 8 moved too little to
            # beat batch-to-batch noise, so: no warmup, lr 1e-2, batches of 32.
            "warmup_steps=0",
            "lr=1.0e-2",
        ],
    )
    with Trainer(sft) as trainer:
        result = trainer.train()
    return root, result


def _grpo_config(root, name: str, *overrides: str) -> RookWorldTrainConfig:
    return load_config(
        RookWorldTrainConfig,
        "configs/rookworld_grpo_tiny.yaml",
        [
            f"data={root / 'data'}",
            f"init_checkpoint={root / 'runs' / 'sft'}",
            f"run.out_dir={root / 'runs'}",
            f"run.name={name}",
            "task.prompts_per_step=3",
            "task.group_size=2",
            "task.max_new_tokens=20",
            "grpo.minibatch_size=3",
            f"rewards.policy.nodes={NODES}",
            "engine.processes=1",
            f"engine.cache_path={root / 'cache.sqlite'}",
            "eval.policy_prompts=3",
            "eval.environment_prompts=2",
            "eval_every=0",
            "eval.resamples=50",
            "steps=4",
            "checkpoint_every=1",
            "grpo.entropy_coef=0.01",  # the 6-step SFT model writes no well-formed answer: the entropy term moves the weights
            *overrides,
        ],
    )


def test_sft_trains_on_completions_checkpoints_and_loads_for_rl(lab):
    root, result = lab
    rows = read_metrics(root / "runs" / "sft" / "metrics.jsonl")
    assert rows[-1]["step"] == 6 and "eval/loss" in rows[-1] and "eval/policy_format_rate" in rows[-1]
    # Board reading: legal B: moves and how many distinct ones (a board-blind model writes a few everywhere).
    assert 0.0 <= rows[-1]["eval/policy_best_legal_rate"] <= 1.0 and rows[-1]["eval/policy_distinct_best_moves"] >= 0
    assert rows[0]["loss/train"] > rows[-1]["loss/train"]  # six steps at lr 1e-2 already lower the loss
    lm = load_lm(root / "runs" / "sft")
    assert isinstance(lm.tokenizer, ChessTokenizer) and result.checkpoint.name == "step_000006" and result.finished
    assert result.best_checkpoint is not None  # eval/loss picks checkpoints/best


def test_sft_lists_each_policy_answer_in_fresh_seeded_orders(lab):
    root, _ = lab
    config = load_config(
        SFTTrainConfig,
        "configs/rookworld_sft_tiny.yaml",
        [
            f"data={root / 'data'}",
            f"run.out_dir={root / 'runs'}",
            "run.name=reshuffle",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "move_order=shuffle",
        ],
    )
    context = RunContext(config.run.directory, torch.device("cpu"), config.run.seed)
    kind = SFTKind(config, context)
    index = next(i for i, task in enumerate(kind.train_data.tasks) if task == "policy")
    decode = kind.lm.tokenizer.decode
    original = parse_policy_completion(decode(kind.train_data.completions[index][:-1]))
    seen = set()
    for step in range(8):
        ids = kind._completion(index, step)
        assert (
            ids == kind._completion(index, step) and ids[-1] == kind.lm.tokenizer.eos_token_id
        )  # seeded by (step, index)
        answer = parse_policy_completion(decode(ids[:-1]))
        assert sorted(zip(answer.moves, answer.evals)) == sorted(zip(original.moves, original.evals))  # pairs kept
        assert answer.best == original.best and len(ids) == len(kind.train_data.completions[index])
        seen.add(answer.moves)
    assert len(seen) > 1  # the order changes between draws
    config.move_order = "as_written"
    assert SFTKind(config, context)._completion(index, 0) == kind.train_data.completions[index]
    config.move_order = "sorted"
    answer = parse_policy_completion(decode(SFTKind(config, context)._completion(index, 3)[:-1]))
    assert list(answer.moves) == sorted(original.moves) and answer.best == original.best
    assert sorted(zip(answer.moves, answer.evals)) == sorted(zip(original.moves, original.evals))
    config.move_order = "best_first"
    answer = parse_policy_completion(decode(SFTKind(config, context)._completion(index, 3)[:-1]))
    assert list(answer.evals) == sorted(original.evals, reverse=True)
    assert sorted(zip(answer.moves, answer.evals)) == sorted(zip(original.moves, original.evals))


def test_the_held_out_answers_are_scored_in_the_fixed_move_order_the_train_ones_are_taught(lab):
    """With move_order sorted (every shipped LM config) the held-out P: answers are re-encoded like the train ones, so
    the held-out loss scores text in the order the model is taught to write (issue 64, item 4)."""
    root, _ = lab
    config = load_config(
        SFTTrainConfig,
        "configs/rookworld_sft_tiny.yaml",
        [
            f"data={root / 'data'}",
            f"run.out_dir={root / 'runs'}",
            "run.name=sorted_eval",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "move_order=sorted",
        ],
    )
    kind = SFTKind(config, RunContext(config.run.directory, torch.device("cpu"), config.run.seed))
    decode = kind.lm.tokenizer.decode
    held_out = [i for i, task in enumerate(kind.test_data.tasks) if task == "policy"]
    answers = [parse_policy_completion(decode(kind.test_data.completions[i][:-1])) for i in held_out]
    assert held_out and all(list(a.moves) == sorted(a.moves) for a in answers)
    assert len(held_out) >= 5  # the data's written orders are shuffled: before the fix these were scored as written


def test_sft_move_order_is_checked_and_the_old_key_still_reads():
    assert SFTTrainConfig(reshuffle_moves=False).move_order == "as_written"
    with pytest.raises(ConfigError, match="reshuffle_moves and move_order"):
        SFTTrainConfig(reshuffle_moves=True, move_order="sorted")  # an old config's key would silently win
    with pytest.raises(ConfigError, match="move_order"):
        SFTTrainConfig(move_order="random")
    with pytest.raises(ConfigError, match="prompt_loss_weight"):
        SFTTrainConfig(prompt_loss_weight=-0.5)


def _sft_config(root, name: str, *overrides: str) -> SFTTrainConfig:
    """Dropout on (the step consumes torch's RNG) and 37-example batches (epochs end mid-batch)."""
    return load_config(
        SFTTrainConfig,
        "configs/rookworld_sft_tiny.yaml",
        [
            f"data={root / 'data'}",
            f"run.out_dir={root / 'runs'}",
            f"run.name={name}",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.dropout=0.1",
            "steps=8",
            "batch_size=37",
            "warmup_steps=2",
            "eval_every=3",
            "eval_examples=16",
            "eval_prompts=2",
            "max_new_tokens=8",
            "log_every=1",
            "checkpoint_every=0",
            "first_tasks_steps=0",
            *overrides,
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "curriculum", [(), ("first_tasks=[environment]", "first_tasks_steps=6")], ids=["plain", "first_stage"]
)
def test_sft_resumed_run_equals_a_straight_run_bitwise(lab, curriculum):
    root, _ = lab
    straight_name, resumed_name = f"sft_straight{len(curriculum)}", f"sft_resumed{len(curriculum)}"
    with Trainer(_sft_config(root, straight_name, *curriculum)) as trainer:
        assert trainer.train().finished
    with Trainer(_sft_config(root, resumed_name, "stop_at=4", *curriculum)) as trainer:
        result = trainer.train()
    assert result.step == 4 and not result.finished and result.stop_reason == "stop_at=4"
    with Trainer(_sft_config(root, resumed_name, *curriculum), resume=True) as trainer:
        # The data position came back with the checkpoint (a first stage's: mid-stage, past an epoch of its tasks).
        assert trainer.step == 4 and (trainer.kind.first_epoch if curriculum else trainer.kind.epoch) >= 1
        assert trainer.train().finished
    straight = load_lm(root / "runs" / straight_name).model.state_dict()
    resumed = load_lm(root / "runs" / resumed_name).model.state_dict()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    rows = {name: read_metrics(root / "runs" / name / "metrics.jsonl") for name in (straight_name, resumed_name)}
    losses = {
        name: [(r["step"], r.get("loss/train"), r.get("eval/loss")) for r in found] for name, found in rows.items()
    }
    assert losses[straight_name] == losses[resumed_name] and [r["step"] for r in rows[straight_name]] == list(
        range(1, 9)
    )


def test_sft_first_stage_draws_only_its_tasks_then_every_task(lab):
    root, _ = lab
    config = _sft_config(root, "first_stage", "first_tasks=[environment]", "first_tasks_steps=3", "batch_size=16")
    kind = SFTKind(config, RunContext(config.run.directory, torch.device("cpu"), config.run.seed))
    tasks = kind.train_data.tasks
    for step in range(3):
        assert {tasks[i] for i in kind._next_batch(step)} == {"environment"}
    later = [tasks[i] for step in range(3, 9) for i in kind._next_batch(step)]
    assert set(later) == {"policy", "environment"}
    with pytest.raises(ConfigError, match="first_tasks must be a non-empty subset of tasks"):
        SFTTrainConfig(tasks=("policy",), first_tasks=("environment",), first_tasks_steps=10)
    with pytest.raises(ConfigError, match="first_tasks is null"):
        SFTTrainConfig(first_tasks_steps=10)


@pytest.mark.parametrize(
    ("architecture", "final_norm"),
    [
        ("gpt2", {"transformer.ln_f.weight", "transformer.ln_f.bias"}),
        ("llama", {"model.norm.weight"}),
    ],
)
def test_sft_freezes_embeddings_and_first_blocks(lab, architecture, final_norm):
    """freeze_layers=1 trains only the final norm of the one-block model (the head is tied to the frozen embeddings)."""
    root, _ = lab
    name = f"sft_frozen_{architecture}"
    arch = f"model.architecture={architecture}"
    with Trainer(_sft_config(root, name, "freeze_layers=1", "steps=1", "model.dropout=0.0", arch)) as trainer:
        assert trainer.kind.head_parameters() == []
        assert trainer.train().finished
    start = load_lm(root / "runs" / name / "checkpoints" / "step_000000").model.state_dict()
    trained = load_lm(root / "runs" / name).model.state_dict()
    assert {k for k in start if not torch.equal(start[k], trained[k])} == final_norm
    with pytest.raises(ConfigError, match="freeze_layers=2"):
        Trainer(_sft_config(root, name + "2", "freeze_layers=2", arch))
    with pytest.raises(ConfigError, match="head_lr"):
        Trainer(_sft_config(root, name + "_head_lr", "head_lr=1e-3", arch))


def test_sft_cli_trains_resumes_and_refuses_another_kind(lab, tmp_path, capsys):
    root, _ = lab
    args = [
        "sft",
        "--config",
        "configs/rookworld_sft_tiny.yaml",
        f"data={root / 'data'}",
        f"run.out_dir={tmp_path / 'runs'}",
        "run.name=cli_sft",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.n_head=2",
        "steps=2",
        "batch_size=4",
        "eval_examples=4",
        "eval_prompts=1",
        "max_new_tokens=4",
        "log_every=1",
        "stop_at=1",
    ]
    assert main(args) == 0
    assert "chessgrpo train --resume" in capsys.readouterr().out
    assert main(["sft", "--resume", str(tmp_path / "runs" / "cli_sft")]) == 0
    printed = capsys.readouterr().out
    assert "step 2/2" in printed and "parameters" in printed and "loss" in printed
    assert load_lm(tmp_path / "runs" / "cli_sft").model is not None
    assert main(["sft", "--config", "configs/rookworld_grpo_tiny.yaml"]) == 2  # not kind: sft


def test_grpo_on_text_logs_the_core_and_task_metrics_and_resumes_exactly(lab):
    root, _ = lab
    with Trainer(_grpo_config(root, "straight")) as trainer:
        result = trainer.train()
    assert result.finished and result.step == 4 and result.stop_reason is None
    paired = json.loads((root / "runs" / "straight" / "eval" / PAIRED_FILE).read_text())
    assert (
        paired["a"] == "step_000000_lm.json"
        and paired["b"] == "step_000004_lm.json"
        and "p_reward" in paired["differences"]
    )
    assert result.best_checkpoint is not None  # eval/p_reward picks checkpoints/best
    rows = read_metrics(root / "runs" / "straight" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    step = rows[1]
    for key in (
        "loss/policy",
        "kl/value",
        "kl/coef",
        "ratio/first_max_abs_dev",
        "entropy/mean",
        "entropy/rollout",
        "reward/mean",
        "adv/std",
        "grad_norm",
        "lr",
        "rollout/completion_tokens",
        "rollout/malformed_rate",
        "reward/policy_total",
        "reward/policy_best",
        "reward/policy_format",
        "reward/environment_fen_exact",
        "perf/cache_hit_rate",
    ):
        assert key in step, key
    assert all(r["entropy/mean"] == r["entropy/rollout"] for r in rows[1:])  # what the entropy early stop reads
    assert all(r["ratio/first_max_abs_dev"] < 1e-4 for r in rows[1:]) and all(r["kl/min"] >= 0 for r in rows[1:])
    assert "eval/p_format_rate" in rows[0] and "eval/a_format_rate" in rows[-1] and "eval/p_reward" in rows[-1]

    # 2 steps, stop, resume, 2 more steps == 4 straight steps, bitwise (weights and every logged number).
    with Trainer(_grpo_config(root, "resumed", "stop_at=2")) as trainer:
        stopped = trainer.train()
    assert stopped.step == 2 and not stopped.finished and stopped.stop_reason == "stop_at=2"
    assert not (
        root / "runs" / "resumed" / "eval" / PAIRED_FILE
    ).exists()  # only a run that reached its last step compares
    with Trainer(_grpo_config(root, "resumed"), resume=True) as trainer:
        assert trainer.step == 2
        assert trainer.train().finished
    straight = load_lm(root / "runs" / "straight").model.state_dict()
    resumed = load_lm(root / "runs" / "resumed").model.state_dict()
    start = load_lm(root / "runs" / "sft").model.state_dict()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert any(not torch.equal(straight[k], start[k]) for k in straight)  # the weights did move
    resumed_rows = read_metrics(root / "runs" / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in resumed_rows] == [0, 1, 2, 3, 4]

    def numbers(row):
        return {k: v for k, v in row.items() if not k.startswith("perf/") and k != "time"}

    assert [numbers(r) for r in rows] == [numbers(r) for r in resumed_rows]
    assert (
        json.loads((root / "runs" / "resumed" / "eval" / PAIRED_FILE).read_text())["differences"]
        == paired["differences"]
    )


def test_grpo_on_text_freezes_embeddings_and_first_blocks(lab):
    """freeze_layers=1 trains only the final norm of the lab's one-block model (the shipped config's Llama; the
    head is tied to the frozen embeddings)."""
    root, _ = lab
    no_eval = ("eval.policy_prompts=0", "eval.environment_prompts=0", "steps=1", "checkpoint_every=0")
    with Trainer(_grpo_config(root, "frozen", "freeze_layers=1", *no_eval)) as trainer:
        assert not trainer.kind.evaluates and trainer.kind.head_parameters() == []
        assert trainer.train().finished
    start = load_lm(root / "runs" / "sft").model.state_dict()
    trained = load_lm(root / "runs" / "frozen").model.state_dict()
    changed = {k for k in start if not torch.equal(start[k], trained[k])}
    assert changed == {"model.norm.weight"}
    with pytest.raises(ConfigError, match="freeze_layers=2"):
        Trainer(_grpo_config(root, "frozen2", "freeze_layers=2", *no_eval))
    with pytest.raises(ConfigError, match="head_lr"):
        Trainer(_grpo_config(root, "head_lr", "head_lr=1e-3", *no_eval))


def test_cli_runs_data_sft_train_and_eval_lm(lab, tmp_path, capsys):
    root, _ = lab
    cache = f"engine.cache_path={root / 'cache.sqlite'}"
    assert (
        main(
            [
                "data",
                "rookworld",
                "--out",
                str(tmp_path / "d"),
                "--positions",
                "12",
                "--nodes",
                str(NODES),
                "engine.processes=1",
                cache,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train",
                "--config",
                "configs/rookworld_grpo_tiny.yaml",
                f"data={root / 'data'}",
                f"init_checkpoint={root / 'runs' / 'sft'}",
                f"run.out_dir={tmp_path / 'runs'}",
                "run.name=cli",
                "task.prompts_per_step=2",
                "task.group_size=2",
                "task.max_new_tokens=12",
                f"rewards.policy.nodes={NODES}",
                "engine.processes=1",
                cache,
                "eval.policy_prompts=2",
                "eval.environment_prompts=1",
                "eval.resamples=20",
                "steps=1",
            ]
        )
        == 0
    )
    output = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "lm",
                "--checkpoint",
                str(tmp_path / "runs" / "cli"),
                "--data",
                str(root / "data"),
                "--policy-prompts",
                "2",
                "--environment-prompts",
                "2",
                f"rewards.policy.nodes={NODES}",
                "engine.processes=1",
                cache,
                "max_new_tokens=12",
                "resamples=20",
                f"output={output}",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "p_format_rate" in printed and "a_exact_state_accuracy" in printed
    assert set(json.loads(output.read_text())["records"]) == {"policy", "environment", "puzzles"}
    assert main(["eval", "lm", "--compare", str(output), str(output)]) == 0
    assert "p_reward" in capsys.readouterr().out
    assert main(["train", "--config", "configs/rookworld_grpo_tiny.yaml", "task.bogus=1"]) == 2  # every key is checked


def test_eval_lm_prompt_bos_decodes_from_bos_prefixed_prompts(lab, tmp_path):
    """`eval lm --prompt-bos` (a model trained as upstream RookWorld-LM, BOS before every sample) generates
    from [BOS, prompt...] (`with_prompt_bos`, whose ids tests/test_lm_memory.py checks), records the setting,
    and a bad value is a config error."""
    from chessgrpo.data.rookworld import read_rookworld
    from chessgrpo.models.lm_generation import generate_texts
    from chessgrpo.models.prompt_bos import with_prompt_bos

    root, _ = lab
    prompts = [e.prompt for e in read_rookworld(root / "data", "test") if e.task == "environment"][:3]
    outputs = {}
    for name, extra in (("plain", []), ("bos", ["--prompt-bos"])):
        outputs[name] = tmp_path / f"{name}.json"
        assert (
            main(
                [
                    "eval",
                    "lm",
                    "--checkpoint",
                    str(root / "runs" / "sft"),
                    "--data",
                    str(root / "data"),
                    "--policy-prompts",
                    "0",
                    "--environment-prompts",
                    "3",
                    *extra,
                    "max_new_tokens=8",
                    "resamples=20",
                    f"output={outputs[name]}",
                ]
            )
            == 0
        )
    records = {name: json.loads(path.read_text()) for name, path in outputs.items()}
    assert records["bos"]["config"]["prompt_bos"] is True and records["plain"]["config"]["prompt_bos"] is False
    lm = load_lm(root / "runs" / "sft")
    expected = {
        name: generate_texts(with_prompt_bos(lm, enabled), prompts, max_new_tokens=8, batch_size=64)
        for name, enabled in (("plain", False), ("bos", True))
    }
    for name in expected:
        assert [r["completion"] for r in records[name]["records"]["environment"]] == expected[name]
    assert main(["eval", "lm", "--checkpoint", str(root / "runs" / "sft"), "--prompt-bos", "prompt_bos=maybe"]) == 2


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


def test_paired_comparison_of_the_chess_uses_prompts_well_formed_in_both():
    """`compare_lm_results`' ``*_well_formed`` differences pair only the prompts answered well-formed
    before and after, so answers that merely became well-formed (a format gain) do not count as chess."""
    from chessgrpo.eval.lm import compare_lm_results

    def record(prompt, malformed, best, total):
        return {"prompt": prompt, "malformed": malformed, "best": best, "total": total, "top5_hit": best, "legal": 1.0}

    before = [
        record("p0", None, 0.0, 0.2),
        record("p1", None, 1.0, 1.0),
        record("p2", "missing B:", 0.0, -1.0),
        record("p3", None, 0.0, 0.3),
    ]
    after = [
        record("p0", None, 1.0, 1.2),
        record("p1", None, 1.0, 1.0),
        record("p2", None, 1.0, 1.4),
        record("p3", "missing B:", 0.0, -1.0),
    ]
    diffs = compare_lm_results({"records": {"policy": before}}, {"records": {"policy": after}}, resamples=200)
    assert diffs["p_best_accuracy"].n == 4 and diffs["p_best_accuracy"].value == pytest.approx(0.5)  # 0.25 -> 0.75
    well_formed = diffs["p_best_accuracy_well_formed"]
    assert well_formed.n == 2 and well_formed.value == pytest.approx(0.5)  # p0 and p1 only
    assert diffs["p_reward_well_formed"].value == pytest.approx(0.5)  # (1.2 - 0.2 + 0) / 2


def test_sft_board_reading_check_knows_legal_from_illegal():
    from chessgrpo.tasks.kinds.sft import _is_legal

    start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    assert _is_legal(start, "e2e4") and _is_legal(start, "g1f3")
    assert not _is_legal(start, "e2e5") and not _is_legal(start, "e7e5") and not _is_legal("not a fen", "e2e4")
