"""Search (PUCT and policy-pruned alpha-beta) on positions with a known answer, and the value head.

The networks are small and untrained (or given a deliberately bad prior), so every assertion is
about what the search itself must find: exact terminal and tablebase values backed up the tree.
"""

from __future__ import annotations

import threading

import chess
import pytest
import torch

from chessgrpo.board import move_to_action
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, save_policy
from chessgrpo.search import (
    AlphaBetaConfig,
    AlphaBetaSearch,
    NetworkEvaluator,
    PuctConfig,
    PuctSearch,
    Searcher,
    SearchLimits,
    SearchSettings,
    centipawns_to_value,
    rule_value,
    value_to_centipawns,
)
from helpers import data_file

BACK_RANK_MATE = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # Ra8# (a1a8)
BLACK_MATES_IN_TWO = "K7/P4r2/1k6/8/2R3p1/8/7P/8 b - - 12 59"  # Lichess 43Q3U: Rf8+ (f7f8), then mate
POISONED_QUEEN = "4r1k1/5ppp/8/8/8/8/3q2PP/3R3K w - - 0 1"  # Rxd2?? Re1#: the queen must not be taken


def _policy(seed: int = 0, **overrides) -> ActionPolicy:
    torch.manual_seed(seed)
    config = dict(n_layers=1, d_model=32, n_heads=2, value_head=True)
    config.update(overrides)
    return ActionPolicy(PolicyConfig(**config)).eval()


def _prefer(policy: ActionPolicy, uci: str, bonus: float = 6.0) -> ActionPolicy:
    """Give one move a large prior: a network that 'likes' the wrong move."""
    with torch.no_grad():
        policy.head.action_bias[move_to_action(chess.Move.from_uci(uci))] += bonus
    return policy


def _puct(policy: ActionPolicy, **config) -> PuctSearch:
    return PuctSearch(NetworkEvaluator(policy), PuctConfig(**config))


# -- leaf values -------------------------------------------------------------------------------


def test_rule_values_from_the_side_to_move():
    mated = chess.Board("R5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 1 1")
    assert rule_value(mated, list(mated.legal_moves)) == 0.0
    stalemate = chess.Board("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1")
    assert rule_value(stalemate, list(stalemate.legal_moves)) == 0.5
    bare_kings = chess.Board("8/8/4k3/8/8/3K4/8/8 w - - 0 1")
    assert rule_value(bare_kings, list(bare_kings.legal_moves)) == 0.5
    fifty = chess.Board("8/8/4k3/8/8/3K4/8/R7 w - - 100 80")
    assert rule_value(fifty, list(fifty.legal_moves)) == 0.5
    repeated = chess.Board()
    for uci in ("g1f3", "g8f6", "f3g1", "f6g8"):
        repeated.push_uci(uci)
    assert rule_value(repeated, list(repeated.legal_moves)) == 0.5  # the start position stands again
    assert rule_value(chess.Board(), list(chess.Board().legal_moves)) is None


def test_tablebase_values_for_either_side():
    evaluator = NetworkEvaluator(_policy(), tablebase=Tablebase(str(data_file("syzygy"))))
    white_wins = chess.Board("8/8/8/4k3/8/8/8/4KQ2 w - - 0 1")
    black_to_move_loses = chess.Board("8/8/8/4k3/8/8/8/4KQ2 b - - 0 1")
    black_wins = chess.Board("4kq2/8/8/8/4K3/8/8/8 b - - 0 1")
    values = [e.value for e in evaluator.evaluate([white_wins, black_to_move_loses, black_wins])]
    assert values == [1.0, 0.0, 1.0]
    assert evaluator.network_positions == 0  # exact positions never reach the network


def test_tablebase_root_plays_the_perfect_move():
    searcher = Searcher(_policy(), SearchSettings(nodes=64, syzygy_path=str(data_file("syzygy"))))
    board = chess.Board("k7/8/1K6/8/8/8/8/7Q w - - 0 1")  # KQvK: Qh8# at once (Qa1+ lets the king out)
    result = searcher.search(board)
    board.push(result.move)
    assert board.is_checkmate() and result.exact and result.value == 1.0 and result.nodes == 0
    searcher.close()


# -- PUCT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_puct_finds_a_mate_in_one_the_prior_dislikes(seed):
    policy = _prefer(_policy(seed), "a1a2")  # the network 'likes' a quiet rook move
    result = _puct(policy).search(chess.Board(BACK_RANK_MATE), SearchLimits(nodes=200))
    assert result.move.uci() == "a1a8"
    assert result.value > 0.95 and result.exact


def test_puct_finds_a_mate_in_two_for_black():
    result = _puct(_policy()).search(chess.Board(BLACK_MATES_IN_TWO), SearchLimits(nodes=1500))
    assert result.move.uci() == "f7f8"
    assert result.value > 0.9  # from Black's side: the side to move wins


def test_puct_does_not_take_a_poisoned_queen():
    policy = _prefer(_policy(), "d1d2")  # the network 'likes' Rxd2, which loses to Re1#
    board = chess.Board(POISONED_QUEEN)
    assert policy.predict_moves([board])[0].uci() == "d1d2"  # without search it takes the queen
    result = _puct(policy).search(board, SearchLimits(nodes=800))
    assert result.move.uci() != "d1d2"
    taken = next(m for m in result.root_moves if m.move.uci() == "d1d2")
    assert taken.value < 0.1  # the search saw Re1# under it


def test_puct_is_deterministic_and_restores_the_board():
    policy = _policy()
    board = chess.Board()
    board.push_uci("e2e4")
    before = board.fen(), len(board.move_stack)
    first = _puct(policy).search(board, SearchLimits(nodes=120))
    second = _puct(policy).search(board, SearchLimits(nodes=120))
    assert [(m.move, m.visits) for m in first.root_moves] == [(m.move, m.visits) for m in second.root_moves]
    assert first.nodes == 120 and sum(m.visits for m in first.root_moves) == 120
    assert (board.fen(), len(board.move_stack)) == before


def test_puct_batch_size_one_and_sixteen_agree_on_a_forced_mate():
    policy = _policy()
    for batch_size in (1, 16):
        result = _puct(policy, batch_size=batch_size).search(chess.Board(BACK_RANK_MATE), SearchLimits(nodes=150))
        assert result.move.uci() == "a1a8"


def test_puct_sees_repetition_in_the_game_history():
    board = chess.Board("7k/8/8/8/8/8/8/K3R3 w - - 0 1")
    for uci in ("e1e2", "h8g8", "e2e1", "g8h8"):
        board.push_uci(uci)
    result = _puct(_policy()).search(board, SearchLimits(nodes=300))
    repeat = next(m for m in result.root_moves if m.move.uci() == "e1e2")
    board.push_uci("e1e2")
    assert board.is_repetition(2)
    assert repeat.visits == 0 or abs(repeat.value - 0.5) < 1e-6  # a repeated position is a draw, exactly


def test_search_limits_reject_nonsense():
    with pytest.raises(ValueError, match="nodes"):
        SearchLimits(nodes=0)
    with pytest.raises(ValueError, match="seconds"):
        SearchLimits(seconds=0)
    with pytest.raises(ValueError, match="no legal move"):
        _puct(_policy()).search(chess.Board("R5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 1 1"))


def test_a_policy_without_value_head_cannot_search():
    with pytest.raises(ValueError, match="value head"):
        NetworkEvaluator(_policy(value_head=False))


def test_time_limit_stops_the_search():
    result = _puct(_policy()).search(chess.Board(), SearchLimits(nodes=10**6, seconds=0.2))
    assert 0 < result.nodes < 10**6 and result.seconds < 2.0


# -- alpha-beta ------------------------------------------------------------------------------------


def test_alphabeta_finds_the_mate_and_avoids_the_poisoned_queen():
    evaluator = NetworkEvaluator(_prefer(_policy(), "a1a2"))
    search = AlphaBetaSearch(evaluator, AlphaBetaConfig(width=4))
    assert search.search(chess.Board(BACK_RANK_MATE), SearchLimits(nodes=300)).move.uci() == "a1a8"
    evaluator = NetworkEvaluator(_prefer(_policy(), "d1d2"))
    wide = AlphaBetaSearch(evaluator, AlphaBetaConfig(width=40))  # every Black reply, so Re1# is seen
    result = wide.search(chess.Board(POISONED_QUEEN), SearchLimits(nodes=2000))
    assert result.move.uci() != "d1d2" and result.depth >= 2


# -- the value head --------------------------------------------------------------------------------


def test_value_head_is_the_side_to_moves_view():
    """The head predicts White's score; Black to move gets its complement, exactly."""
    policy = _policy(seed=3)
    with torch.no_grad():  # a head that says "White is winning" whatever the position
        last = policy.value_head.mlp[-1]
        last.weight.zero_()
        last.bias.fill_(4.0)
    white = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
    black = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 2 3")
    tokens, _ = policy.inputs([white, black])
    with torch.no_grad():
        values = torch.sigmoid(policy(tokens, with_value=True)[1])
    assert float(values[0]) == pytest.approx(torch.sigmoid(torch.tensor(4.0)).item(), rel=1e-5)
    assert float(values[1]) == pytest.approx(1.0 - float(values[0]), rel=1e-4)
    evaluator = NetworkEvaluator(policy)
    assert [round(e.value, 4) for e in evaluator.evaluate([white, black])] == [round(float(v), 4) for v in values]


def test_adding_a_value_head_keeps_the_seeded_policy_and_old_checkpoints_load(tmp_path):
    with_head, without = _policy(seed=5), _policy(seed=5, value_head=False)
    tokens, _ = with_head.inputs([chess.Board()])
    assert torch.equal(with_head(tokens), without(tokens))
    save_policy(without, tmp_path / "old")
    assert load_policy(tmp_path / "old").value_head is None
    save_policy(with_head, tmp_path / "new")
    loaded = load_policy(tmp_path / "new")
    assert torch.equal(loaded(tokens, with_value=True)[1], with_head(tokens, with_value=True)[1])


def test_centipawns_of_a_value_on_lc0s_scale():
    """Lc0's convention, cp = 111.714640912 tan(1.5620688421 (2v - 1)): checked at points computed by hand."""
    assert value_to_centipawns(0.5) == 0
    assert value_to_centipawns(0.75) == -value_to_centipawns(0.25) > 0
    # Q = 0.2: 111.714640912 * tan(0.31241376842) = 36.07; Q = 0.468: 100.3 (+1 pawn ~ an expected score of 0.734)
    assert value_to_centipawns(0.6) == 36 and value_to_centipawns(0.734) == 100
    assert value_to_centipawns(1.0) == 2000 and value_to_centipawns(0.0) == -2000  # clipped
    for centipawns in (-900, -100, 0, 37, 300):  # the inverse, which the policy-only estimate uses
        assert value_to_centipawns(centipawns_to_value(centipawns)) == centipawns


# -- the hooks: should_stop, root_moves, report ---------------------------------------------------


def _algorithms(policy: ActionPolicy) -> list[PuctSearch | AlphaBetaSearch]:
    return [_puct(policy), AlphaBetaSearch(NetworkEvaluator(policy), AlphaBetaConfig(width=4))]


def _summary(result) -> list[tuple]:
    return [(m.move, m.visits, m.value, m.prior, m.pv) for m in result.root_moves] + [
        (result.nodes, result.depth, result.seldepth, result.exact)
    ]


def test_hooks_that_change_nothing_change_nothing():
    """Every legal move as root_moves, a should_stop that never stops and a report: the same search, bit for bit."""
    policy = _policy()
    board = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
    for search in _algorithms(policy):
        plain = search.search(board, SearchLimits(nodes=100))
        reports = []
        hooked = search.search(
            board,
            SearchLimits(nodes=100),
            root_moves=list(board.legal_moves),
            should_stop=lambda nodes: False,
            report=reports.append,
            report_interval=0.0,
        )
        assert _summary(hooked) == _summary(plain)
        assert reports and all(r.move in board.legal_moves for r in reports)


def test_should_stop_stops_early_with_a_legal_move():
    policy = _policy()
    board = chess.Board()
    asked: list[int] = []

    def stop_after_20(nodes: int) -> bool:
        asked.append(nodes)
        return nodes > 20

    result = _puct(policy).search(board, SearchLimits(nodes=10_000), should_stop=stop_after_20)
    assert result.move in board.legal_moves and result.nodes == 20  # asked before every simulation: stops exactly
    assert sum(m.visits for m in result.root_moves) == 20 and asked == sorted(asked) and asked[-1] == 21
    never = _puct(policy).search(board, SearchLimits(nodes=10_000), should_stop=lambda nodes: True)
    assert never.move in board.legal_moves and never.nodes == 0  # stopped at once: the prior's move
    result = AlphaBetaSearch(NetworkEvaluator(policy)).search(
        board, SearchLimits(nodes=10_000), should_stop=lambda nodes: nodes > 30
    )
    assert result.move in board.legal_moves and result.nodes <= 30
    # A stop flag set from another thread (UCI `stop`): the search ends long before its budget.
    stop = threading.Event()
    timer = threading.Timer(0.2, stop.set)
    timer.start()
    result = _puct(policy).search(board, SearchLimits(nodes=10**6), should_stop=lambda nodes: stop.is_set())
    timer.join()
    assert result.move in board.legal_moves and 0 < result.nodes < 10**6


def test_root_moves_restrict_the_root_and_its_shortcuts():
    policy = _prefer(_policy(), "a1a8")  # the network likes the mate: only the restriction keeps it out
    board = chess.Board(BACK_RANK_MATE)
    allowed = [chess.Move.from_uci("g1f1"), chess.Move.from_uci("h2h3")]
    for search in _algorithms(policy):
        result = search.search(board, SearchLimits(nodes=64), root_moves=allowed)
        assert result.move in allowed and not result.exact  # the mate-in-one shortcut was not taken
        assert {m.move for m in result.root_moves} == set(allowed) and result.nodes > 0
        mate = search.search(board, SearchLimits(nodes=64), root_moves=[chess.Move.from_uci("a1a8"), *allowed])
        assert mate.move.uci() == "a1a8" and mate.exact and mate.nodes == 0  # a mate among them: played at once
        forced = search.search(board, SearchLimits(nodes=64), root_moves=allowed[:1])
        assert (
            forced.move == allowed[0] and forced.network_positions <= 1
        )  # one move: not searched (the root may be evaluated)
        for bad in ([], [chess.Move.from_uci("a1a2"), chess.Move.from_uci("e2e4")]):
            with pytest.raises(ValueError, match="root_moves"):
                search.search(board, SearchLimits(nodes=64), root_moves=bad)
    searched = _puct(policy).search(board, SearchLimits(nodes=64), root_moves=allowed)
    assert searched.nodes == 64 and sum(m.prior for m in searched.root_moves) == pytest.approx(
        1.0
    )  # priors renormalised


def test_root_moves_restrict_the_tablebase_shortcut():
    searcher = Searcher(_policy(), SearchSettings(nodes=32, syzygy_path=str(data_file("syzygy"))))
    board = chess.Board("k7/8/1K6/8/8/8/8/7Q w - - 0 1")  # KQvK: the tables play Qh8#
    quiet = [chess.Move.from_uci("h1h2"), chess.Move.from_uci("h1g1")]
    result = searcher.search(board, root_moves=quiet)
    assert result.move in quiet and result.nodes > 0  # searched: the tables' move is not allowed
    result = searcher.search(board, root_moves=[chess.Move.from_uci("h1h8"), *quiet])
    assert result.move.uci() == "h1h8" and result.exact and result.nodes == 0
    searcher.close()
