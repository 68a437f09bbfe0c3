"""The move-first P: answer layout (issue 66): ``B: <move>`` first, M:/E: after it or not at all.

data/rookworld_format.py (layouts, the one parser, `move_complete`, `MoveStop`), data/rookworld.py and
data/rookworld_endgames.py (``layout=move_first``), data/rookworld_grading.py (a move-only answer is graded, not
malformed), tasks/lm_rollout.py + tasks/kinds/rookworld.py (``task.stop_after_move``), eval/lm.py and
play/lm_player.py (the same parser, the same stop). Real KQvK tables, real files, real tiny models trained here.
"""

from __future__ import annotations

import json

import chess
import pytest
import torch

from chessgrpo.config import ConfigError, load_config
from chessgrpo.data.rookworld import dataset_policy_layout, read_rookworld
from chessgrpo.data.rookworld_format import (
    MOVE_FIRST_LAYOUT,
    ROOKWORLD_LAYOUT,
    Malformed,
    MoveStop,
    PolicyAnswer,
    format_policy_completion,
    format_policy_line,
    move_complete,
    parse_policy_completion,
    parse_policy_line,
    split_policy_line,
)
from chessgrpo.data.rookworld_grading import PolicyRewardConfig, RookWorldRewardConfig, score_completions
from chessgrpo.data.rookworld_truths import tablebase_truth
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.models.chess_tokenizer import ChessTokenizer
from chessgrpo.models.lm import (
    LMModelConfig,
    build_lm,
    completion_log_probs,
    left_pad,
    load_lm,
    prepare_for_rl,
    right_pad,
    save_lm,
)
from chessgrpo.models.lm_tokenizers import CharTokenizer
from chessgrpo.tasks.kinds.rookworld import RookWorldTrainConfig
from chessgrpo.tasks.kinds.sft import SFTKind, SFTTrainConfig
from chessgrpo.tasks.lm_rollout import sample_completion_groups
from chessgrpo.train.loop import Trainer
from chessgrpo.train.metrics import read_metrics
from helpers import SYZYGY_DIR

FEN = "8/8/6K1/8/3k4/8/8/7Q w - - 0 1"  # KQvK, won for White (as tests/test_rookworld_endgames.py)
ANSWER = PolicyAnswer(("h1d1", "h1h4", "g6f5"), (97.0, 95.0, 90.0), "h1d1")
TABLES = RookWorldRewardConfig(policy=PolicyRewardConfig(truth="tablebase", syzygy_path=str(SYZYGY_DIR)))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


def test_both_layouts_format_and_parse_back_through_the_one_parser():
    rookworld = format_policy_line(FEN, ANSWER)
    move_first = PolicyAnswer(ANSWER.moves, ANSWER.evals, ANSWER.best, MOVE_FIRST_LAYOUT)
    move_only = PolicyAnswer((), (), "h1d1", MOVE_FIRST_LAYOUT)
    assert format_policy_line(FEN, move_first) == f"P: {FEN} B: h1d1 M: h1d1 h1h4 g6f5 E: 97.0 95.0 90.0"
    assert format_policy_completion(FEN, move_only) == " B: h1d1"
    for answer in (ANSWER, move_first, move_only):
        line = format_policy_line(FEN, answer)
        assert parse_policy_line(line) == (FEN, answer)  # the layout comes back too
        prompt, completion = split_policy_line(line)
        assert prompt == "P: " + FEN and parse_policy_completion(completion) == answer
    assert rookworld.index("M:") < rookworld.index("B:") and ANSWER.layout == ROOKWORLD_LAYOUT
    assert not move_only.listed and move_first.listed
    # Whitespace-tolerant, content-strict, as the rookworld layout.
    assert parse_policy_completion("\n B:e7e8q \n") == PolicyAnswer((), (), "e7e8q", MOVE_FIRST_LAYOUT)
    for text, reason in {
        " B: e2e4 M: e2e4": "both M: and E:",
        " B: e2e4 E: 0.3": "both M: and E:",
        " B: e2e4 E: 0.3 M: e2e4": "both M: and E:",
        " B: e2e4 d2d4": "not one UCI move",
        " B:": "not one UCI move",
        " B: e2e4 M: e2e4 E: x": "not a number",
    }.items():
        parsed = parse_policy_completion(text)
        assert isinstance(parsed, Malformed) and reason in parsed.reason, (text, parsed)
    with pytest.raises(ValueError, match="1-5 moves"):
        format_policy_line(FEN, PolicyAnswer((), (), "h1d1"))  # the rookworld layout always lists M:/E:


def test_a_move_is_complete_at_its_token_or_its_delimiter_and_never_in_the_rookworld_layout():
    assert move_complete(" B: e2e4", "e2e4")  # a word-level tokenizer's move token
    assert not move_complete(" B: e7e8", "8")  # a character tokenizer: "q" may follow
    assert move_complete(" B: e7e8 ", " ") and move_complete(" B: e7e8q", "q") and move_complete(" B: e2e4\n", "\n")
    assert not move_complete(" B: ", "B: ") and not move_complete("M: e2e4 E: 0.3 B: e2e4", "e2e4")
    for tokenizer, expected in ((ChessTokenizer(), [" ", "B: ", "e7e8q"]), (CharTokenizer(), list(" B: e7e8q"))):
        stop = MoveStop(tokenizer.decode)
        text = " B: e7e8q M: e7e8q E: 99.0"
        ids = tokenizer.encode(text)
        rookworld = tokenizer.encode("M: e7e8q E: 99.0 B: e7e8q")[: len(ids)]
        ends = [stop([a, b], [True, True]) for a, b in zip(ids, rookworld)]
        first = next(i for i, (row, _) in enumerate(ends) if row)
        assert [tokenizer.decode([t]) for t in ids[: first + 1]] == expected  # nothing after the move
        assert not any(other for _, other in ends)  # a rookworld answer runs to its end


@pytest.fixture(scope="module")
def tablebase():
    with Tablebase(str(SYZYGY_DIR)) as tables:
        yield tables


def test_graders_grade_a_move_only_answer_and_read_listed_fields_as_the_rookworld_layout(tablebase):
    truth = tablebase_truth(tablebase, chess.Board(FEN))
    optimal, slower = sorted(truth.optimal)[0], "g6g5"
    texts = [f" B: {optimal}", f" B: {slower}", " B: h1g3", " B: h1", format_policy_completion(FEN, truth.answer(0))]
    listed = PolicyAnswer(*dataclass_fields(truth.answer(0)), layout=MOVE_FIRST_LAYOUT)
    texts.append(format_policy_completion(FEN, listed))
    rewards = score_completions(None, ["P: " + FEN] * len(texts), texts, TABLES)
    best, slow, illegal, broken, full_rookworld, full_move_first = rewards
    assert best.malformed is None and best.components["format"] == 1.0 and best.components["legal"] == 1.0
    assert best.components["best"] == 1.0 and best.components["top5"] == 0.0 and best.components["eval"] == 0.0
    assert best.total == pytest.approx(0.2 + 0.2 + 1.0)  # format + legal (B) + best; nothing listed to grade
    assert 0.0 < slow.components["best"] < 1.0 and slow.total < best.total
    assert illegal.malformed is None and illegal.components["legal"] == 0.0 and illegal.components["best"] == 0.0
    assert broken.malformed is not None and broken.total == -1.0
    assert full_move_first.components == full_rookworld.components and full_move_first.total == full_rookworld.total


def dataclass_fields(answer: PolicyAnswer) -> tuple:
    return answer.moves, answer.evals, answer.best


@pytest.fixture(scope="module")
def move_first_data(tmp_path_factory, tablebase):
    """Two KQvK datasets from the real command, same seed: the rookworld layout and layout=move_first."""
    from chessgrpo.cli import main

    root = tmp_path_factory.mktemp("move_first")
    common = [
        "--positions",
        "6",
        "endgames=[KQvK]",
        "held_out=2",
        "multipv=2",
        "workers=1",
        f"syzygy_path={SYZYGY_DIR}",
    ]
    for name, extra in (("rookworld", []), ("move_first", ["layout=move_first"])):
        assert main(["data", "rookworld", "--out", str(root / name), *common, *extra]) == 0
    return root


def test_the_data_command_writes_move_first_lines_with_the_same_content_and_records_the_layout(move_first_data):
    root = move_first_data
    assert dataset_policy_layout(root / "rookworld") == ROOKWORLD_LAYOUT
    assert dataset_policy_layout(root / "move_first") == MOVE_FIRST_LAYOUT
    assert json.loads((root / "move_first" / "manifest.json").read_text())["policy_layout"] == MOVE_FIRST_LAYOUT
    for split in ("train", "test"):
        old, new = read_rookworld(root / "rookworld", split), read_rookworld(root / "move_first", split)
        assert [e.task for e in old] == [e.task for e in new] and [e.fen for e in old] == [e.fen for e in new]
        for a, b in zip(old, new):
            if a.task == "environment":
                assert a.line == b.line  # A: lines unchanged
                continue
            assert b.completion.startswith(" B: ") and (root / "move_first" / f"{split}.txt").read_text().count(b.line)
            assert parse_policy_completion(b.completion) == PolicyAnswer(
                *dataclass_fields(parse_policy_completion(a.completion)), layout=MOVE_FIRST_LAYOUT
            )


def test_move_only_data_and_bad_layout_settings(tmp_path, tablebase):
    from chessgrpo.data.rookworld import RookWorldDataConfig, run_rookworld_data

    config = RookWorldDataConfig(
        out=str(tmp_path / "only"),
        positions=4,
        endgames=["KQvK"],
        held_out=2,
        workers=1,
        syzygy_path=str(SYZYGY_DIR),
        layout=MOVE_FIRST_LAYOUT,
        move_only=True,
    )
    run_rookworld_data(config)
    truths = {}
    for example in read_rookworld(config.out, "train", task="policy"):
        answer = parse_policy_completion(example.completion)
        assert example.completion == f" B: {answer.best}" and not answer.listed
        truths[example.fen] = tablebase_truth(tablebase, chess.Board(example.fen))
        assert answer.best in truths[example.fen].optimal
    assert run_rookworld_data(config).already_complete
    for settings, key in (({"layout": "b_last"}, "layout"), ({"move_only": True}, "move_only")):
        with pytest.raises(ValueError, match=key):
            RookWorldDataConfig(out=str(tmp_path / "x"), **settings).validate()


# --------------------------------------------------------------------------------------------
# A tiny LM: SFT on move-first lines, then GRPO sampling that stops at the move, eval lm and the player


@pytest.fixture(scope="module")
def move_first_lm(move_first_data):
    """A one-layer LM taught (~3-6 s) the eight move-first P: lines of the data (M:/E: after the move), the way SFT trains:
    completion tokens only (EOS last), through the one log-prob function. It writes B: first, then M: and E:."""
    lm = build_lm(LMModelConfig(n_layer=1, n_embd=64, n_head=2, n_positions=256), seed=0)
    tokenizer = lm.tokenizer
    examples = [e for split in ("train", "test") for e in read_rookworld(move_first_data / "move_first", split)]
    policy = [e for e in examples if e.task == "policy"]
    prompts = [tokenizer.encode(e.prompt) for e in policy]
    completions = [tokenizer.encode(e.completion) + [tokenizer.eos_token_id] for e in policy]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.eos_token_id)
    completion_ids, completion_mask = right_pad(completions, tokenizer.eos_token_id)
    optimizer = torch.optim.Adam(lm.model.parameters(), lr=3e-3)
    lm.model.eval()  # no dropout configured; eval mode keeps it that way
    for _ in range(100):
        logp, _ = completion_log_probs(
            lm.model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0
        )
        loss = -logp.sum() / completion_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.3
    return save_lm(lm, move_first_data / "taught")


def _grpo(root, sft, name: str, *overrides: str) -> RookWorldTrainConfig:
    return load_config(
        RookWorldTrainConfig,
        "configs/rookworld_grpo_endgames.yaml",
        [
            f"data={root / 'move_first'}",
            f"init_checkpoint={sft}",
            f"run.out_dir={root / 'runs'}",
            f"run.name={name}",
            f"rewards.policy.syzygy_path={SYZYGY_DIR}",
            "task.stop_after_move=true",
            "task.policy_fraction=1.0",
            "task.prompts_per_step=4",
            "task.group_size=4",
            "task.max_new_tokens=40",
            "grpo.minibatch_size=16",
            "eval.policy_prompts=2",
            "eval.environment_prompts=0",
            "eval.resamples=20",
            "eval_every=1",
            "steps=1",
            "checkpoint_every=0",
            "threads=1",
            *overrides,
        ],
    )


def test_grpo_sampling_stops_right_after_the_move_and_every_reader_parses_it(move_first_data, move_first_lm):
    from chessgrpo.eval.lm import evaluate_lm
    from chessgrpo.play.lm_player import LMPlayer

    root = move_first_data
    lm = load_lm(move_first_lm)
    prepare_for_rl(lm.model)
    tokenizer = lm.tokenizer
    prompts = [
        e.prompt for split in ("train", "test") for e in read_rookworld(root / "move_first", split, task="policy")
    ]
    sample = {"temperature": 1.0, "max_new_tokens": 40}
    stopped = sample_completion_groups(
        lm, prompts, 4, **sample, generator=torch.Generator().manual_seed(0), stop=MoveStop(tokenizer.decode)
    )
    well_formed = 0
    for row, text in enumerate(stopped.texts):
        answer = parse_policy_completion(text)
        tokens = stopped.generation.completion_tokens(row)
        if isinstance(answer, PolicyAnswer):
            # The completion the learner scores: the move's tokens and nothing else (no M:/E:, no EOS).
            assert not answer.listed and text.split() == ["B:", answer.best], text
            assert tokenizer.decode(tokens[-1:]).strip() == answer.best and tokens[-1] != tokenizer.eos_token_id
            well_formed += 1
        else:  # a sample that does not start with B: runs on, one whose first word after B: ended stops there
            assert not text.lstrip().startswith("B:") or move_complete(text, tokenizer.decode(tokens[-1:])), text
    assert well_formed >= 0.75 * len(stopped.texts), stopped.texts  # the taught model writes B: first
    unstopped = sample_completion_groups(lm, prompts, 4, **sample, generator=torch.Generator().manual_seed(0))
    assert unstopped.generation.lengths.float().mean() > stopped.generation.lengths.float().mean() + 3  # M:/E: follow

    fens = [p[3:] for p in prompts]
    result = evaluate_lm(lm, policy_fens=fens, rewards=TABLES, batch_size=4, stop_after_move=True, resamples=20)
    records = result.records["policy"]
    assert all(r["completion"].split() == ["B:", r["best_move"]] and r["malformed"] is None for r in records)
    full = evaluate_lm(lm, policy_fens=fens, rewards=TABLES, batch_size=4, resamples=20).records["policy"]
    assert [r["best_move"] for r in full] == [r["best_move"] for r in records]  # greedy: the same move either way

    player = LMPlayer(lm)
    moves = player.choose([chess.Board(fen) for fen in fens])
    answers = player.last_answers
    legal = [a for a, outcome in zip(answers, player.last_outcomes) if outcome == "greedy"]
    assert legal and all(a is not None and a.layout == MOVE_FIRST_LAYOUT and not a.listed for a in legal)
    assert all(chess.Board(fen).is_legal(move) for fen, move in zip(fens, moves))


def test_the_grpo_kind_stops_at_the_move_and_checks_the_data_layout(move_first_data, move_first_lm):
    root = move_first_data
    with Trainer(_grpo(root, move_first_lm, "grpo")) as trainer:
        trainer.train()
    rows = read_metrics(root / "runs" / "grpo" / "metrics.jsonl")
    step = next(r for r in rows if "rollout/completion_tokens" in r)
    # " ", "B: ", the move: the rows stop there (a whole answer, M:/E: and EOS, is 12 tokens or more)
    assert step["rollout/completion_tokens"] < 5.0 and step["reward/policy_malformed_rate"] <= 0.25
    records = json.loads((root / "runs" / "grpo" / "eval" / "step_000001_lm.json").read_text())["records"]["policy"]
    assert records and all(r["completion"].split() == ["B:", r["best_move"]] for r in records)
    with pytest.raises(ConfigError, match="stop_after_move"):
        Trainer(_grpo(root, move_first_lm, "wrong_layout", f"data={root / 'rookworld'}"))


def test_sft_reorders_the_auxiliary_moves_of_move_first_lines_and_keeps_the_layout(move_first_data, tmp_path):
    from chessgrpo.train.kind import RunContext

    overrides = [f"data={move_first_data / 'move_first'}", f"run.out_dir={tmp_path}", "model.n_layer=1"]
    for order in ("shuffle", "sorted"):
        config = load_config(SFTTrainConfig, "configs/rookworld_sft_endgames.yaml", [*overrides, f"move_order={order}"])
        kind = SFTKind(config, RunContext(config.run.directory, torch.device("cpu"), config.run.seed))
        decode = kind.lm.tokenizer.decode
        for index in [i for i, task in enumerate(kind.train_data.tasks) if task == "policy"]:
            written = parse_policy_completion(decode(kind.train_data.completions[index][:-1]))
            taught = parse_policy_completion(decode(kind._completion(index, 1)[:-1]))
            assert isinstance(taught, PolicyAnswer) and taught.layout == MOVE_FIRST_LAYOUT
            assert taught.best == written.best and sorted(taught.moves) == sorted(written.moves)
            assert order != "sorted" or list(taught.moves) == sorted(taught.moves)
