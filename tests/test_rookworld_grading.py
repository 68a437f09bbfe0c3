"""The P: reward's graded `best` and `top5` credits (data/rookworld_grading.py): win-probability regret
against the engine's best move.

Pure tests of `regret_credit` and the config checks, then real Stockfish (one process, low node
budget, a per-module cache) on real upstream RookWorld P: lines from data/rookworld_samples.txt.
"""

from __future__ import annotations

import chess
import pytest

from chessgrpo.data.rookworld_format import PolicyAnswer, format_policy_completion, parse_policy_line, policy_prompt
from chessgrpo.data.rookworld_grading import (
    POLICY_COMPONENTS,
    PolicyRewardConfig,
    RookWorldRewardConfig,
    regret_credit,
    score_completions,
    score_policy,
)
from chessgrpo.data.rookworld_truths import PolicyTruth, policy_truths, unlisted_move_values
from chessgrpo.engine import EnginePool
from helpers import data_file

NODES = 2000


# ------------------------------------------------------------------------------------------------
# The credit function and the config (no engine)


@pytest.mark.parametrize(
    ("regret", "credit"),
    [(-0.3, 1.0), (0.0, 1.0), (0.02, 1.0), (0.065, 0.75), (0.11, 0.5), (0.155, 0.25), (0.2, 0.0), (0.9, 0.0)],
)
def test_regret_credit_is_full_within_tolerance_then_linear_to_zero(regret, credit):
    # tolerance 0.02, zero at 0.2: credit = (0.2 - regret) / 0.18 in between, e.g. 0.11 -> 0.09 / 0.18 = 0.5.
    assert regret_credit(regret, tolerance=0.02, zero_at=0.2) == pytest.approx(credit)


def test_regret_credit_with_no_tolerance_and_its_bad_arguments():
    assert regret_credit(0.0, tolerance=0.0, zero_at=0.5) == 1.0
    assert regret_credit(0.1, tolerance=0.0, zero_at=0.5) == pytest.approx(0.8)
    for tolerance, zero_at in ((0.2, 0.2), (0.3, 0.2), (-0.01, 0.2)):
        with pytest.raises(ValueError, match="tolerance"):
            regret_credit(0.1, tolerance=tolerance, zero_at=zero_at)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"best_mode": "fuzzy"}, "best_mode"),
        ({"top5_mode": "top3"}, "top5_mode"),
        ({"regret_tolerance": -0.01}, "regret_tolerance"),
        ({"regret_tolerance": float("nan")}, "regret_tolerance"),
        ({"regret_zero_credit": 0.02}, "regret_zero_credit"),
        ({"regret_zero_credit": 1.5}, "regret_zero_credit"),
    ],
)
def test_bad_graded_config_values_raise_naming_the_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        PolicyRewardConfig(**overrides)


def test_defaults_are_graded_and_the_engine_answer_is_still_the_maximum():
    config = PolicyRewardConfig()
    assert (config.best_mode, config.top5_mode) == ("graded", "graded")
    assert config.credit(config.regret_tolerance) == 1.0 and config.credit(config.regret_zero_credit) == 0.0
    truth = PolicyTruth(
        fen=chess.STARTING_FEN,
        moves=("e2e4", "d2d4"),
        pawns=(0.3, 0.25),
        legal=frozenset({"e2e4", "d2d4", "a2a3"}),
        wins=(0.55, 0.54),
    )
    reward = score_policy(truth.answer(), truth, config)
    assert reward.total == pytest.approx(config.maximum) and set(POLICY_COMPONENTS) <= set(reward.components)


def test_graded_modes_need_win_probabilities_and_values_of_unlisted_moves():
    truth = PolicyTruth(
        fen=chess.STARTING_FEN, moves=("e2e4",), pawns=(0.3,), legal=frozenset({"e2e4", "a2a3"}), wins=(0.55,)
    )
    config = PolicyRewardConfig()
    with pytest.raises(ValueError, match="a2a3"):  # a legal B with no value: never a silent 0
        score_policy(PolicyAnswer(("e2e4",), (0.3,), "a2a3"), truth, config)
    without_wins = PolicyTruth(fen=truth.fen, moves=truth.moves, pawns=truth.pawns, legal=truth.legal)
    with pytest.raises(ValueError, match="win probabilities"):
        score_policy(PolicyAnswer(("e2e4",), (0.3,), "e2e4"), without_wins, config)
    exact = PolicyRewardConfig(best_mode="exact", top5_mode="exact")
    assert score_policy(PolicyAnswer(("e2e4",), (0.3,), "a2a3"), without_wins, exact).components["best"] == 0.0


# ------------------------------------------------------------------------------------------------
# Real upstream lines, real Stockfish


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with EnginePool(
        processes=1, nodes=NODES, cache_path=tmp_path_factory.mktemp("cache") / "evals.sqlite"
    ) as engine_pool:
        yield engine_pool


@pytest.fixture(scope="module")
def config() -> RookWorldRewardConfig:
    return RookWorldRewardConfig(policy=PolicyRewardConfig(nodes=NODES))


@pytest.fixture(scope="module")
def upstream() -> list[tuple[str, PolicyAnswer]]:
    lines = data_file("rookworld_samples.txt").read_text().splitlines()
    return [parse_policy_line(line) for line in lines if line.startswith("P:")]


@pytest.fixture(scope="module")
def graded_lines(pool, upstream, config):
    """(FEN, upstream answer, truth, mover's win probability of every legal move) for each real line."""
    truths = policy_truths(pool, [fen for fen, _ in upstream], nodes=NODES)
    rows = []
    for (fen, answer), truth in zip(upstream, truths):
        pairs = [(fen, move) for move in sorted(truth.legal) if move not in truth.moves]
        wins = dict(zip(truth.moves, truth.wins))
        wins.update({move: value.win for (_, move), value in unlisted_move_values(pool, pairs, nodes=NODES).items()})
        rows.append((fen, answer, truth, wins))
    return rows


def _with_best(answer: PolicyAnswer, best: str) -> PolicyAnswer:
    return PolicyAnswer(answer.moves, answer.evals, best)


def test_upstream_answers_outrank_losing_moves_and_equal_alternatives_tie(pool, config, graded_lines):
    pc = config.policy
    checked = ties = 0
    for fen, answer, truth, wins in graded_lines:
        regret = {move: truth.best_win - win for move, win in wins.items()}
        losing = sorted(m for m in truth.legal if regret[m] >= pc.regret_zero_credit)
        if regret[answer.best] > pc.regret_tolerance or not losing:
            continue  # upstream's B is not right here (its Black defect), or no move loses: nothing to order
        equal = sorted(m for m in truth.legal if m != answer.best and regret[m] <= pc.regret_tolerance)
        variants = [answer, _with_best(answer, losing[0])]
        if equal:
            variants.append(_with_best(answer, equal[0]))
        texts = [format_policy_completion(fen, v) for v in variants] + ["M: e2e4 E: B: e7e5", "garbage"]
        rewards = score_completions(pool, [policy_prompt(fen)] * len(texts), texts, config)
        true, lost = rewards[0], rewards[1]
        malformed = rewards[-1]
        assert true.components["best"] == 1.0 and lost.components["best"] == 0.0, fen
        assert true.total > lost.total > malformed.total == pc.malformed_penalty == rewards[-2].total, fen
        assert true.total - lost.total == pytest.approx(pc.best_weight), fen  # only B differs
        if equal:  # an equally good B earns exactly what upstream's does: no more coin flip between good moves
            assert rewards[2].total == pytest.approx(true.total), fen
            ties += 1
        checked += 1
    assert checked >= 5 and ties >= 2, (checked, ties)


def test_graded_best_separates_right_from_wrong_where_exact_match_cannot(pool, config, graded_lines):
    """The bug this fixes: the engine's best move differs from most upstream labels, so under the
    exact mode a right and a wrong upstream B both score best = 0."""
    exact = RookWorldRewardConfig(policy=PolicyRewardConfig(nodes=NODES, best_mode="exact", top5_mode="exact"))
    found = False
    for fen, answer, truth, wins in graded_lines:
        regret = {move: truth.best_win - win for move, win in wins.items()}
        losing = sorted(m for m in truth.legal if regret[m] >= config.policy.regret_zero_credit)
        if answer.best == truth.best or regret[answer.best] > config.policy.regret_tolerance or not losing:
            continue
        texts = [format_policy_completion(fen, _with_best(answer, b)) for b in (answer.best, losing[0])]
        right, wrong = score_completions(pool, [policy_prompt(fen)] * 2, texts, exact)
        assert right.components["best"] == wrong.components["best"] == 0.0 == right.components["best_exact"]
        right, wrong = score_completions(pool, [policy_prompt(fen)] * 2, texts, config)
        assert right.components["best"] == 1.0 > wrong.components["best"] == 0.0
        assert right.components["best_exact"] == 0.0 and "best_regret" in right.components
        found = True
    assert found


def test_illegal_best_scores_no_best_credit(pool, config, graded_lines):
    fen, answer, truth, _ = graded_lines[0]
    illegal = next(a + b for a in chess.SQUARE_NAMES for b in chess.SQUARE_NAMES if a != b and a + b not in truth.legal)
    [reward] = score_completions(
        pool, [policy_prompt(fen)], [format_policy_completion(fen, _with_best(answer, illegal))], config
    )
    assert reward.components["best"] == 0.0 and "best_regret" not in reward.components and reward.malformed is None


def test_graded_top5_credits_each_listed_move_by_its_regret(pool, config, graded_lines):
    pc = config.policy
    for fen, answer, truth, wins in graded_lines:
        credit = {move: pc.credit(truth.best_win - win) for move, win in wins.items()}
        attainable = sum(credit[m] for m in truth.moves)
        [reward] = score_completions(pool, [policy_prompt(fen)], [format_policy_completion(fen, answer)], config)
        listed = [m for m in dict.fromkeys(answer.moves) if m in truth.legal]
        assert reward.components["top5"] == pytest.approx(min(1.0, sum(credit[m] for m in listed) / attainable)), fen
        # One move, however good, is not a full list when the engine has several good moves.
        [alone] = score_completions(
            pool,
            [policy_prompt(fen)],
            [format_policy_completion(fen, PolicyAnswer((truth.best,), (0.0,), truth.best))],
            config,
        )
        assert alone.components["top5"] == pytest.approx(1.0 / attainable), fen
    engine = [
        score_completions(pool, [policy_prompt(t.fen)], [format_policy_completion(t.fen, t.answer())], config)[0]
        for _, _, t, _ in graded_lines
    ]
    assert all(r.total == pytest.approx(pc.maximum) for r in engine)
