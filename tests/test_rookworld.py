"""RookWorld text tasks: formats on the shared samples, parsers, verifiable rewards, data, TRL functions.

Real Stockfish at small node limits; the shared samples in data/rookworld_samples.txt.

Cross-cutting: data/rookworld_format.py (formats, parsers), data/rookworld_truths.py and
data/rookworld_grading.py (verifiable rewards), data/rookworld.py (data), tasks/rookworld_trl.py
(TRL functions).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import chess
import pyarrow.parquet as pq
import pytest

from chessgrpo.config import EngineConfig
from chessgrpo.data.rookworld import (
    RookWorldDataConfig,
    environment_example,
    policy_example,
    read_rookworld,
    read_rookworld_text,
    run_rookworld_data,
)
from chessgrpo.data.rookworld_format import (
    REWARD_ILLEGAL,
    REWARD_MATE,
    EnvironmentAnswer,
    Malformed,
    PolicyAnswer,
    environment_step,
    format_environment_completion,
    format_environment_line,
    format_policy_completion,
    format_policy_line,
    parse_environment_completion,
    parse_environment_line,
    parse_policy_completion,
    parse_policy_line,
    policy_prompt,
    split_environment_line,
    split_policy_line,
    upstream_best_defect,
)
from chessgrpo.data.rookworld_grading import PolicyRewardConfig, RookWorldRewardConfig, score_completions
from chessgrpo.data.rookworld_truths import policy_truths
from chessgrpo.engine import EngineError, EnginePool
from chessgrpo.tasks.rookworld_trl import RookWorldTRLRewards
from helpers import data_file

NODES = 500
BACK_RANK = "r5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 0 1"  # Black to move mates with Ra1#
QUEEN_TRAP = "rnbqkbnr/ppp1pppp/8/3p4/4P1Q1/8/PPPP1PPP/RNB1KBNR b KQkq - 1 2"  # 1. e4 d5 2. Qg4??: Black wins the queen with Bxg4


def _sample_lines() -> list[str]:
    text = data_file("rookworld_samples.txt").read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with EnginePool(
        processes=1, nodes=NODES, cache_path=tmp_path_factory.mktemp("cache") / "evals.sqlite"
    ) as engine_pool:
        yield engine_pool


def _config() -> RookWorldRewardConfig:
    return RookWorldRewardConfig(policy=PolicyRewardConfig(nodes=NODES))


# ------------------------------------------------------------------------------------------------
# Formats and parsers


def test_policy_lines_of_the_shared_samples_round_trip_exactly():
    lines = [line for line in _sample_lines() if line.startswith("P:")]
    assert len(lines) == 20
    for line in lines:
        fen, answer = parse_policy_line(line)
        assert format_policy_line(fen, answer) == line
        prompt, completion = split_policy_line(line)
        assert prompt == policy_prompt(fen) == "P: " + fen and prompt + completion == line
        assert completion == format_policy_completion(fen, answer)
        assert line.index("M:") == 92 and line.index("E:") == 92 + 33 and line.index("B:") == 92 + 33 + 43


def test_environment_lines_of_the_shared_samples_round_trip_and_match_python_chess():
    lines = [line for line in _sample_lines() if line.startswith("A:")]
    assert len(lines) == 14
    for line in lines:
        query, answer = parse_environment_line(line)
        assert format_environment_line(query, answer) == line
        prompt, completion = split_environment_line(line)
        assert prompt.endswith(
            f"+{query.move}+{' '.join(query.history)}+"
        ) and completion == format_environment_completion(answer)
        assert environment_step(query.fen, query.move) == answer
    mate = parse_environment_line(lines[-1])[1]
    assert mate.reward == REWARD_MATE and mate.terminated and not mate.truncated


def test_upstream_black_to_move_defect_is_detected_on_exactly_the_black_lines():
    for line in _sample_lines():
        if line.startswith("P:"):
            fen, answer = parse_policy_line(line)
            black = chess.Board(fen).turn == chess.BLACK
            assert upstream_best_defect(answer) == black, line


def test_parsers_are_tolerant_of_whitespace_and_strict_on_content():
    good = parse_policy_completion("\t M:e2e4   d2d4 E:0.3  -1.25\nB:  e2e4 \n")
    assert good == PolicyAnswer(moves=("e2e4", "d2d4"), evals=(0.3, -1.25), best="e2e4")
    malformed = {
        "": "missing",
        "M: e2e4 E: 0.3": "missing B:",
        "E: 0.3 M: e2e4 B: e2e4": "out of order",
        "M: E: B: e2e4": "0 moves",
        "M: a2a3 b2b3 c2c3 d2d3 e2e3 f2f3 E: 0 0 0 0 0 0 B: a2a3": "6 moves",
        "M: e2e9 E: 0.3 B: e2e4": "not a UCI move",
        "M: e2e4 d2d4 E: 0.3 B: e2e4": "1 values for 2 moves",
        "M: e2e4 E: nan B: e2e4": "not a number",
        "M: e2e4 E: 1e3 B: e2e4": "not a number",
        "M: e2e4 E: 1000.5 B: e2e4": "mate value",
        "M: e2e4 E: 0.3 B: e2e4 d2d4": "not one UCI move",
        "M: e2e4 E: 0.3 B: Nf3": "not one UCI move",
        "M: c5c5 E: 0.3 B: c5c5": "not a UCI move",  # a GRPO run learned to write this: well-formed garbage
        "M: e2e4 e2e4 E: 0.3 0.3 B: e2e4": "twice",
    }
    for text, reason in malformed.items():
        parsed = parse_policy_completion(text)
        assert isinstance(parsed, Malformed) and reason in parsed.reason, (text, parsed)
    assert isinstance(parse_policy_completion(None), Malformed)  # type: ignore[arg-type]

    fen = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    assert parse_environment_completion(f"  {fen} + 0.001 +0+ 0 ") == EnvironmentAnswer(fen, 0.001, False, False)
    for text, reason in {
        f"{fen}+0.001+0": "fields",
        f"{fen}+x+0+0": "not a number",
        f"{fen}+0.001+2+0": "terminated",
        f"{fen}+0.001+0+yes": "truncated",
        "8/8/8/8/8/8/8/8 w - - 0 1+0.001+0+0": "new FEN",  # no kings: not a position
        "rnbqkbnr/ppppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+0.001+0+0": "new FEN",
        "P: \n; quit+0.001+0+0": "new FEN",
    }.items():
        parsed = parse_environment_completion(text)
        assert isinstance(parsed, Malformed) and reason in parsed.reason, (text, parsed)


# ------------------------------------------------------------------------------------------------
# Rewards


def test_policy_reward_true_answer_is_maximal_wrong_best_lower_garbage_is_the_penalty(pool):
    config = _config()
    [truth] = policy_truths(pool, [QUEEN_TRAP], nodes=NODES)
    assert truth.best == "c8g4"  # Black to move: the best move for Black, not the worst of the list
    answer = truth.answer(seed=1)
    prompt = policy_prompt(QUEEN_TRAP)
    true_text = format_policy_completion(QUEEN_TRAP, answer)
    other = next(m for m in answer.moves if m != truth.best)
    wrong_best = format_policy_completion(QUEEN_TRAP, PolicyAnswer(answer.moves, answer.evals, other))
    flipped = format_policy_completion(
        QUEEN_TRAP, PolicyAnswer(answer.moves, tuple(-v for v in answer.evals), truth.best)
    )
    reordered = PolicyAnswer(answer.moves[::-1], answer.evals[::-1], truth.best)  # E stays matched to its move
    illegal = PolicyAnswer(("e2e4", *answer.moves[1:]), answer.evals, truth.best)
    texts = [
        true_text,
        wrong_best,
        flipped,
        format_policy_completion(QUEEN_TRAP, reordered),
        format_policy_completion(QUEEN_TRAP, illegal),
        "garbage",
        "   M: e2e4 E: B: e7e5",
    ]
    rewards = score_completions(pool, [prompt] * len(texts), texts, config)
    true, wrong, bad_evals, reordered_reward, with_illegal, garbage, half = rewards
    assert true.total == pytest.approx(config.policy.maximum) and true.components["eval_error"] == 0.0
    # Graded best (the default): another listed move may keep part of the credit (it gives up less than
    # regret_zero_credit of win probability), never all of it here; it is not the best move.
    assert wrong.total < true.total and wrong.components["best"] < 1.0 and wrong.components["best_exact"] == 0.0
    assert bad_evals.total < true.total and bad_evals.components["eval"] < 1.0
    assert reordered_reward.total == pytest.approx(true.total)
    assert with_illegal.components["legal"] == pytest.approx(0.8) and with_illegal.total < true.total
    assert garbage.total == config.policy.malformed_penalty == half.total and garbage.malformed
    # Deterministic: the same inputs give the same rewards (the engine is node-limited and cached).
    again = score_completions(pool, [prompt] * len(texts), texts, config)
    assert [r.total for r in again] == [r.total for r in rewards]


def test_unlisted_moves_are_valued_by_their_own_search(pool):
    [truth] = policy_truths(pool, [QUEEN_TRAP], nodes=NODES)
    legal_unlisted = next(m for m in sorted(truth.legal) if m not in truth.moves)
    hangs = PolicyAnswer((legal_unlisted,), (0.0,), legal_unlisted)
    [reward] = score_completions(
        pool, [policy_prompt(QUEEN_TRAP)], [format_policy_completion(QUEEN_TRAP, hangs)], _config()
    )
    assert "eval_error" in reward.components and reward.components["top5"] == 0.0


def test_black_to_move_labels_are_the_best_move_for_black(pool):
    [truth] = policy_truths(pool, [BACK_RANK], nodes=NODES)
    example = policy_example(truth, seed=0, nodes=NODES)
    fen, answer = parse_policy_line(example.line)
    assert fen == BACK_RANK and answer.best == "a8a1"
    assert answer.evals[answer.moves.index("a8a1")] == 1000.0 == max(answer.evals)
    assert not upstream_best_defect(answer)


def test_environment_reward_truth_partial_credit_and_penalty(tmp_path):
    config = RookWorldRewardConfig()
    # A: rewards are python-chess's: an engine that cannot start is never started.
    environment_reward = RookWorldTRLRewards(
        config, engine=EngineConfig(path=str(tmp_path / "no-engine"))
    ).environment_reward
    board = chess.Board(BACK_RANK)
    mate = environment_example(board, "a8a1")
    assert mate.completion.endswith("+1.0+1+0")
    illegal = environment_example(board, "a8h1")
    truth = environment_step(BACK_RANK, "a8h1")
    assert truth.reward == REWARD_ILLEGAL and truth.truncated and truth.fen == BACK_RANK
    assert illegal.completion == f"{BACK_RANK}+-1.0+0+1"
    wrong_clock = mate.completion.replace(" 1 2+", " 0 2+")
    texts = [mate.completion, wrong_clock, mate.completion.replace("+1.0+1+0", "+0.001+0+0"), "nonsense"]
    rewards = environment_reward([mate.prompt] * 4, texts)
    assert rewards[0] == pytest.approx(config.environment.maximum)
    # Partial credit: the exact FEN with wrong flags beats a FEN with one wrong field, and both beat garbage.
    assert rewards[3] < rewards[1] < rewards[2] < rewards[0]
    assert rewards[3] == config.environment.malformed_penalty


def test_trl_reward_functions_take_prompts_and_completions(pool):
    [truth] = policy_truths(pool, [QUEEN_TRAP], nodes=NODES)
    prompt = policy_prompt(QUEEN_TRAP)
    completion = format_policy_completion(QUEEN_TRAP, truth.answer())
    config = _config()
    env = environment_example(chess.Board(), "e2e4")
    with RookWorldTRLRewards(config, pool=pool) as rewards:
        policy_reward, rookworld_reward = rewards.policy_reward, rewards.rookworld_reward
        assert policy_reward([prompt, prompt], [completion, "x"], completion_ids=[[1], [2]]) == [
            pytest.approx(config.policy.maximum),
            config.policy.malformed_penalty,
        ]
        conversational = policy_reward(
            [[{"role": "user", "content": prompt}]], [[{"role": "assistant", "content": completion}]]
        )
        assert conversational == [pytest.approx(config.policy.maximum)]
        mixed = rookworld_reward([prompt, env.prompt], [completion, env.completion])
        assert mixed == [pytest.approx(config.policy.maximum), pytest.approx(config.environment.maximum)]
        with pytest.raises(ValueError, match="other task"):
            policy_reward([env.prompt], [env.completion])
        with pytest.raises(ValueError, match="neither"):
            rookworld_reward(["Q: what"], ["x"])
    # A given pool stays the caller's: still open after the block.
    assert score_completions(pool, [prompt], [completion], config)[0].total == pytest.approx(config.policy.maximum)


def test_trl_rewards_start_their_own_pool_on_a_policy_prompt_and_close_it(tmp_path):
    config = _config()
    engine = EngineConfig(processes=1, cache_path=str(tmp_path / "cache.sqlite"))
    prompt = policy_prompt(QUEEN_TRAP)
    with RookWorldTRLRewards(config, engine=engine) as rewards:
        [truth] = policy_truths(rewards.pool, [QUEEN_TRAP], nodes=NODES)
        started = rewards.pool
        assert rewards.policy_reward([prompt], [format_policy_completion(QUEEN_TRAP, truth.answer())]) == [
            pytest.approx(config.policy.maximum)
        ]
        assert rewards.pool is started  # one pool for every call
    with pytest.raises(EngineError, match="closed"):
        started.evaluate([chess.Board()], nodes=NODES)


# ------------------------------------------------------------------------------------------------
# Data


def test_generated_data_is_deterministic_split_by_position_and_labels_black_correctly(tmp_path):
    def generate(name: str):
        config = RookWorldDataConfig(out=str(tmp_path / name), positions=40, nodes=NODES, seed=3)
        config.engine.processes = 1
        config.engine.cache_path = str(tmp_path / "cache.sqlite")
        return run_rookworld_data(config)

    first, second = generate("a"), generate("b")
    for name in ("train.txt", "test.txt", "train/shard-00000.parquet"):
        if name.endswith(".txt"):
            assert (first.directory / name).read_text() == (second.directory / name).read_text()
    assert sum(c["policy"] for c in first.counts.values()) == 40 == sum(c["environment"] for c in first.counts.values())
    table = pq.read_table(first.directory / "train" / "shard-00000.parquet")
    assert {"task", "prompt", "completion", "fen", "moves", "pawns"} <= set(table.column_names)
    by_split = {split: read_rookworld(first.directory, split) for split in ("train", "test")}
    fens = {split: {e.fen for e in examples} for split, examples in by_split.items()}
    assert not fens["train"] & fens["test"]
    for examples in by_split.values():
        for example in examples:
            if example.task == "policy":
                _, answer = parse_policy_line(example.line)
                assert not upstream_best_defect(answer) and answer.best == example.moves[0]
                assert list(example.pawns) == sorted(example.pawns, reverse=True)
            else:
                query, answer = parse_environment_line(example.line)
                assert environment_step(query.fen, query.move) == answer
    assert generate("a").already_complete  # the same command again: nothing to do
    other = RookWorldDataConfig(out=str(tmp_path / "a"), positions=40, nodes=NODES, seed=4)
    with pytest.raises(ValueError, match="not empty"):
        run_rookworld_data(other)  # other settings: refused, nothing changed


def test_importing_upstream_text_flags_and_drops_the_defective_lines(tmp_path):
    path = data_file("rookworld_samples.txt")
    examples, defects, dropped = read_rookworld_text(path)
    assert defects == 11 == dropped
    assert sum(e.task == "policy" for e in examples) == 9 and sum(e.task == "environment" for e in examples) == 14
    kept, _, none_dropped = read_rookworld_text(path, keep_defective=True)
    assert none_dropped == 0 and sum(e.defect for e in kept) == 11
    bad = tmp_path / "bad.txt"
    bad.write_text("P: 8/8/8/8/8/8/8/8 w - - 0 1 M: e2e4 E: 0.1 B: e2e4\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        read_rookworld_text(bad)
    summary = run_rookworld_data(RookWorldDataConfig(out=str(tmp_path / "imported"), from_text=str(path)))
    assert summary.defects == 11 and summary.dropped == 11
    assert (
        len(read_rookworld(tmp_path / "imported", "train")) + len(read_rookworld(tmp_path / "imported", "test")) == 23
    )


@pytest.mark.slow
def test_a_killed_run_leaves_no_dataset_and_the_same_command_runs_again(tmp_path):
    """kill -9 mid-run: nothing at --out (the data is written to a hidden sibling and renamed last),
    and rerunning the same command makes the whole dataset; a shard changed afterwards is named."""
    out = tmp_path / "rw"
    args = [
        sys.executable,
        "-m",
        "chessgrpo.cli",
        "data",
        "rookworld",
        "--out",
        str(out),
        "--positions",
        "1500",
        "--nodes",
        "60",
        "engine.processes=1",
        f"engine.cache_path={tmp_path / 'cache.sqlite'}",
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(2.5)  # start-up, then some labelling (the whole run takes ~8 s on 2 idle cores)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not out.exists() or not any(out.iterdir())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid now names no process
    abandoned = tmp_path / f".rw.partial-{dead.pid}"
    abandoned.mkdir()  # what a run killed while writing leaves behind

    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    examples = read_rookworld(out, "train") + read_rookworld(out, "test")
    assert sum(e.task == "policy" for e in examples) == 1500
    assert not list(tmp_path.glob(".rw.partial-*")), "a killed run's partial directory is removed"

    shard = out / "train" / "shard-00000.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="shard-00000.parquet.*SHA-256"):
        read_rookworld(out, "train")
