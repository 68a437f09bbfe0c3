"""Issue 66's second lever: P: prompts that list the position's legal moves (``policy_prompt: legal_moves``).

data/rookworld_format.py (`policy_prompt`, `policy_prompt_fen`, `split_policy_line`), the data command's
``policy_prompt`` key and manifest, SFT giving the style to the model it saves (models/lm.py), and every reader of
a P: prompt: the graders, GRPO's fresh prompts, `eval lm` and the LM player. Real KQvK tables, real files from the
data command, a tiny real LM taught here, the real CLI.
"""

from __future__ import annotations

import json
import shutil

import chess
import pytest

from chessgrpo.cli import main
from chessgrpo.config import ConfigError, load_config
from chessgrpo.data.rookworld import dataset_policy_prompt, read_rookworld
from chessgrpo.data.rookworld_format import (
    PolicyAnswer,
    format_policy_line,
    parse_policy_line,
    policy_prompt,
    policy_prompt_fen,
    split_policy_line,
)
from chessgrpo.data.rookworld_grading import RookWorldRewardConfig, score_completions
from chessgrpo.errors import InputError
from chessgrpo.models.lm import LM_MARKER_FILE, load_lm
from chessgrpo.play.lm_player import LMPlayer
from chessgrpo.tasks.kinds.rookworld import RookWorldTrainConfig
from chessgrpo.tasks.kinds.sft import SFTTrainConfig
from chessgrpo.train.kind import StepGroups
from chessgrpo.train.loop import Trainer
from helpers import SYZYGY_DIR, taught_kqk_move_first

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

FEN = "8/8/6K1/8/3k4/8/8/7Q w - - 40 35"


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    root = tmp_path_factory.mktemp("legal_moves")
    data, model = taught_kqk_move_first(root, teach_steps=150, policy_prompt="legal_moves")
    return root, data, model


def _sorted_legal(fen: str) -> list[str]:
    return sorted(move.uci() for move in chess.Board(fen).legal_moves)


def test_a_legal_moves_prompt_lists_every_legal_move_and_reads_back_to_its_fen(tmp_path):
    prompt = policy_prompt(FEN, "legal_moves")
    assert prompt == f"P: {FEN}+{' '.join(_sorted_legal(FEN))}+"
    assert policy_prompt(FEN) == f"P: {FEN}" and policy_prompt_fen(prompt) == FEN == policy_prompt_fen(f"P: {FEN}")
    line = format_policy_line(FEN, PolicyAnswer((), (), "g6f5", layout="move_first"), "legal_moves")
    assert split_policy_line(line) == (prompt, " B: g6f5")
    assert parse_policy_line(line) == (FEN, PolicyAnswer((), (), "g6f5", layout="move_first"))
    # The graders read the FEN of either style: the same answer gets the same reward from the tables.
    config = RookWorldRewardConfig()
    config.policy.truth, config.policy.syzygy_path = "tablebase", SYZYGY_DIR
    answers = [" B: g6f5", " B: h1h8", " B: e2e4", " M: x"]
    fen_rewards = score_completions(None, [policy_prompt(FEN)] * 4, answers, config)
    listed_rewards = score_completions(None, [prompt] * 4, answers, config)
    assert [r.total for r in fen_rewards] == [r.total for r in listed_rewards]
    assert [r.malformed is None for r in listed_rewards] == [True, True, True, False]
    # One clear error for a style that does not exist, or a layout that cannot carry the list.
    with pytest.raises(InputError, match="policy_prompt"):
        policy_prompt(FEN, "moves")
    with pytest.raises(ValueError, match="move_first"):
        format_policy_line(FEN, PolicyAnswer(("g6f5",), (86.0,), "g6f5"), "legal_moves")


def test_the_data_command_writes_the_list_and_records_the_style(taught, tmp_path, capsys):
    _, data, _ = taught
    assert dataset_policy_prompt(data) == "legal_moves"
    assert json.loads((data / "manifest.json").read_text())["policy_prompt"] == "legal_moves"
    examples = [e for split in ("train", "test") for e in read_rookworld(data, split, task="policy")]
    assert examples
    for example in examples:
        assert example.prompt == policy_prompt(example.fen, "legal_moves")
        assert example.completion.startswith(" B: ")
    capsys.readouterr()
    bad = ["data", "rookworld", "--out", str(tmp_path / "bad"), "--positions", "2", "endgames=[KQvK]"]
    assert main([*bad, "policy_prompt=legal_moves", f"syzygy_path={SYZYGY_DIR}"]) == 2
    assert "policy_prompt" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_sft_saves_the_style_it_was_taught_and_old_models_read_as_fen(taught, tmp_path):
    root, data, _ = taught
    config = load_config(
        SFTTrainConfig,
        "configs/rookworld_sft_kqk_legal_moves.yaml",
        [
            f"data={data}",
            f"run.out_dir={tmp_path}",
            "run.name=sft",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "first_tasks_steps=1",
            "steps=2",
            "batch_size=4",
            "eval_every=0",
            "checkpoint_every=0",
            "threads=1",
        ],
    )
    with Trainer(config) as trainer:
        trainer.train()
    saved = tmp_path / "sft" / "checkpoints" / "latest"
    assert json.loads((saved / LM_MARKER_FILE).read_text())["policy_prompt"] == "legal_moves"
    assert load_lm(tmp_path / "sft").policy_prompt == "legal_moves"
    # A model saved before the key existed was taught FEN prompts.
    old = shutil.copytree(saved, tmp_path / "old")
    (old / "manifest.json").unlink()  # the checkpoint's size record: this copy is edited by hand
    marker = json.loads((old / LM_MARKER_FILE).read_text())
    del marker["policy_prompt"]
    (old / LM_MARKER_FILE).write_text(json.dumps(marker))
    assert load_lm(old).policy_prompt == "fen"
    marker["policy_prompt"] = "pictures"
    (old / LM_MARKER_FILE).write_text(json.dumps(marker))
    with pytest.raises(InputError, match="policy_prompt"):
        load_lm(old)


def _grpo_config(root, data, model, name: str) -> RookWorldTrainConfig:
    return load_config(
        RookWorldTrainConfig,
        "configs/rookworld_grpo_kqk_legal_moves.yaml",
        [
            f"data={data}",
            f"init_checkpoint={model}",
            f"run.out_dir={root / 'runs'}",
            f"run.name={name}",
            f"rewards.policy.syzygy_path={SYZYGY_DIR}",
            "task.prompts_per_step=4",
            "task.group_size=4",
            "task.max_resample_rounds=1",
            "grpo.minibatch_size=16",
            "eval.endgame_positions=10",
            "eval.batch_size=10",
            "eval.resamples=20",
            "time_limit_minutes=null",
            "steps=1",
            "checkpoint_every=0",
        ],
    )


def test_grpo_eval_lm_and_the_player_prompt_the_way_the_model_was_taught(taught, tmp_path, capsys):
    root, data, model = taught
    with Trainer(_grpo_config(root, data, model, "grpo")) as trainer:
        prompts = trainer.kind.draw_prompts(0, 4)
        assert all(p == policy_prompt(policy_prompt_fen(p), "legal_moves") for p in prompts)  # fresh, listed
        rollout = trainer.kind.rollout(0, StepGroups(4, range(4), range(4)))
        assert 0.0 <= rollout.metrics["reward/dtz_optimal"] <= 1.0  # graded by the tables through the list

    output = tmp_path / "eval.json"
    command = ["eval", "lm", "--checkpoint", str(model), "--data", str(data), "--environment-prompts", "0"]
    grade = ["rewards.policy.truth=tablebase", f"rewards.policy.syzygy_path={SYZYGY_DIR}", "resamples=20"]
    held_out = ["endgame_positions=10", "endgame_material=KQvK", "stop_after_move=true", "max_new_tokens=8"]
    assert main([*command, *grade, *held_out, f"output={output}"]) == 0
    records = json.loads(output.read_text())["records"]["policy"]
    assert len(records) == 10
    assert all(r["prompt"] == policy_prompt(policy_prompt_fen(r["prompt"]), "legal_moves") for r in records)
    # `eval lm --compare` pairs P: records by position, so a FEN-prompted model's file pairs with this one.
    as_fen = json.loads(output.read_text())
    for record in as_fen["records"]["policy"]:
        record["prompt"] = policy_prompt(policy_prompt_fen(record["prompt"]))
    (tmp_path / "as_fen.json").write_text(json.dumps(as_fen))
    capsys.readouterr()
    assert main(["eval", "lm", "--compare", str(tmp_path / "as_fen.json"), str(output)]) == 0
    assert "p_best_accuracy " in capsys.readouterr().out

    # The player asks the taught model its own kind of prompt: on the positions it learned, it answers them.
    train = read_rookworld(data, "train", task="policy")
    boards = [chess.Board(e.fen) for e in train]
    player = LMPlayer(load_lm(model))
    moves = player.choose(boards)
    taught_moves = [parse_policy_line(e.prompt + e.completion)[1].best for e in train]
    agree = sum(move.uci() == best for move, best in zip(moves, taught_moves))
    assert player.last_outcomes.count("greedy") >= len(boards) - 1 and agree >= len(boards) - 1


def test_grpo_refuses_data_prompted_otherwise_than_its_model(taught, tmp_path):
    root, _, model = taught
    fen_data = tmp_path / "fen"
    common = ["--positions", "4", "endgames=[KQvK]", "held_out=2", "multipv=2", "workers=1", "layout=move_first"]
    assert main(["data", "rookworld", "--out", str(fen_data), *common, f"syzygy_path={SYZYGY_DIR}"]) == 0
    with pytest.raises(ConfigError, match="policy_prompt"):
        Trainer(_grpo_config(root, fen_data, model, "mismatch"))
