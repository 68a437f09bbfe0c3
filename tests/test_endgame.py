"""Endgame curriculum: start positions, the tablebase tablebase, the perfect defender, rewards, evaluation.

Real Syzygy tables from data/syzygy (KQvK, KRvK: a few hundred probes per test).

Cross-cutting: board/endgames.py (start positions), engine/tablebase.py and
engine/tablebase_values.py (the tablebase values and the perfect defender), tasks/endgame_rewards.py
(rewards), eval/endgame.py (evaluation).
"""

from __future__ import annotations

import chess
import chess.syzygy
import pytest

from chessgrpo.board.endgames import EndgameStarts, Material, endgame_positions, symmetric_epds
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.engine.tablebase_values import TablebaseState, game_over
from chessgrpo.eval.endgame import evaluate_endgame, random_picker, tablebase_picker
from chessgrpo.tasks.endgame_rewards import best_step_reward, step_reward
from helpers import SYZYGY_DIR


@pytest.fixture(scope="module")
def tablebase():
    if not SYZYGY_DIR.is_dir():
        pytest.fail(f"Syzygy tables missing at {SYZYGY_DIR}: the repository ships them in data/syzygy")
    with Tablebase(str(SYZYGY_DIR)) as tablebase:
        yield tablebase


def _starts(material: str, tablebase: Tablebase, *, colours: str = "white") -> EndgameStarts:
    return EndgameStarts(material, tablebase.is_won, tables=tablebase.names, plies=tablebase.probe_dtz, colours=colours)


@pytest.fixture(scope="module")
def raw_tables():
    with chess.syzygy.open_tablebase(str(SYZYGY_DIR)) as tables:
        yield tables


def test_material_signatures_parse_and_reject_nonsense():
    kqk = Material.parse("KQvK")
    assert kqk.strong == (chess.KING, chess.QUEEN) and kqk.weak == (chess.KING,) and kqk.pieces == 3
    assert Material.parse("KBNvK").strong == (chess.KING, chess.BISHOP, chess.KNIGHT)
    for bad in ("KQK", "QvK", "KQvKK", "KXvK", "", "KQvK\nquit"):
        with pytest.raises(ValueError, match="endgame material"):
            Material.parse(bad)


@pytest.mark.parametrize("material", ["KQvK", "KRvK", "KBBvK", "KBNvK"])
def test_start_positions_are_legal_won_non_terminal_and_reproducible(tablebase, raw_tables, material):
    boards = endgame_positions(material, 40, seed=3, colours="both", accept=tablebase.is_won, distinct=True)
    expected = Material.parse(material)
    colours = set()
    for board in boards:
        assert board.is_valid() and not board.is_game_over() and any(board.generate_legal_moves())
        assert raw_tables.probe_wdl(board) == 2, board.fen()  # won for the side to move (independent probe)
        strong = sorted(p.piece_type for p in board.piece_map().values() if p.color == board.turn)
        weak = sorted(p.piece_type for p in board.piece_map().values() if p.color != board.turn)
        assert strong == sorted(expected.strong) and weak == sorted(expected.weak)
        assert board.halfmove_clock == 0 and not board.castling_rights
        colours.add(board.turn)
    assert colours == {chess.WHITE, chess.BLACK}
    assert len({b.epd() for b in boards}) == 40
    again = endgame_positions(material, 40, seed=3, colours="both", accept=tablebase.is_won, distinct=True)
    assert [b.fen() for b in again] == [b.fen() for b in boards]
    if material == "KBBvK":  # same-coloured bishops are drawn: the predicate must have rejected them
        for board in boards:
            bishops = board.pieces(chess.BISHOP, board.turn)
            assert len({(chess.square_file(s) + chess.square_rank(s)) % 2 for s in bishops}) == 2


def test_training_draws_never_contain_held_out_positions(tablebase):
    starts = _starts("KQvK", tablebase, colours="white")
    held_boards = starts.hold_out(200, seed=0)
    held = {b.epd() for b in held_boards}
    images = set().union(
        *(symmetric_epds(b) for b in held_boards)
    )  # rotations and mirrors: the same position to the game
    assert len(images) > 4 * len(held)
    for step in range(5):
        drawn = starts.draw(400, seed=0, step=step)
        assert not held & {b.epd() for b in drawn}
        assert not images & {b.epd() for b in drawn}  # 11% of such draws were images of held-out starts before
        assert all(b.turn == chess.WHITE for b in drawn)
    assert [b.fen() for b in starts.draw(8, seed=0, step=1)] == [b.fen() for b in starts.draw(8, seed=0, step=1)]
    assert [b.fen() for b in starts.draw(8, seed=0, step=1)] != [b.fen() for b in starts.draw(8, seed=0, step=2)]


def test_perfect_defender_picks_the_longest_loss(tablebase, raw_tables):
    # Black's king has several moves; every one loses, at different distances. Compare with a
    # brute-force probe of each reply (python-chess directly).
    checked = 0
    for board in endgame_positions("KRvK", 30, seed=11, accept=tablebase.is_won):
        board.push(tablebase.tablebase_move(board))  # the strong side plays well; now Black defends
        if game_over(board):
            continue
        lengths = {}
        for move in board.legal_moves:
            board.push(move)
            if board.is_insufficient_material() or board.is_stalemate():
                lengths[move] = 1000  # a draw beats any loss
            else:
                assert raw_tables.probe_wdl(board) == 2
                lengths[move] = raw_tables.probe_dtz(board)  # plies to mate for White, to move
            board.pop()
        if len(set(lengths.values())) < 2:
            continue
        chosen = tablebase.tablebase_move(board)
        assert lengths[chosen] == max(lengths.values()), (board.fen(), chosen, lengths)
        checked += 1
    assert checked >= 5


def test_the_cached_perfect_move_is_the_first_best_move_at_every_clock(tablebase):
    """`tablebase_move` answers from its cache the second time, and the answer is `best_moves`' first, also when the
    halfmove clock changes it: at 99 every quiet move of the defender draws by the fifty-move rule."""
    changed = 0
    for board in endgame_positions("KQvK", 30, seed=11, accept=tablebase.is_won):
        board.push(tablebase.tablebase_move(board))  # now the defender moves
        if board.is_game_over():
            continue
        late = board.copy()
        late.halfmove_clock = 99
        for position in (board, late, board, late):
            assert tablebase.tablebase_move(position) == tablebase.best_moves(position)[0], position.fen()
        changed += tablebase.tablebase_move(board) != tablebase.tablebase_move(late)
    assert changed >= 2  # 3 of these 30 positions


def test_perfect_defender_takes_a_hanging_queen(tablebase):
    board = chess.Board("8/8/8/8/8/2k5/2Q5/6K1 b - - 0 1")  # Qc2 is next to Black's king and unprotected
    assert tablebase.tablebase_move(board) == chess.Move.from_uci("c3c2")
    assert tablebase.best_moves(board) == [chess.Move.from_uci("c3c2")]


def test_states_and_step_rewards_follow_the_documented_formula(tablebase):
    mate_in_one = chess.Board("7k/8/6K1/8/8/8/8/5Q2 w - - 0 1")
    white, black = tablebase.state(mate_in_one, chess.WHITE), tablebase.state(mate_in_one, chess.BLACK)
    assert (white.score, white.plies, white.progress) == (1.0, 1, -0.5)
    assert (black.score, black.plies, black.progress) == (0.0, 1, 0.5)
    mated = mate_in_one.copy()
    mated.push_uci("f1f8")
    after = tablebase.state(mated, chess.WHITE)
    assert after.delivered_mate and after.score == 1.0 and after.plies == 0
    assert step_reward(white, after, shaping=0.1) == pytest.approx(
        1.0 + 0.1 * 0.5
    )  # mate = 1, plus the last half move of progress
    assert tablebase.state(mated, chess.BLACK).mated
    stalemate = mate_in_one.copy()
    stalemate.push_uci("f1f7")  # Qf7?? stalemate
    drawn = tablebase.state(stalemate, chess.WHITE)
    assert drawn.terminal == "stalemate" and step_reward(white, drawn, shaping=0.1) == pytest.approx(-1.0)
    # Progress: 9 -> 7 plies is one own move of progress; 9 -> 11 is a regression of one.
    win9, win7, win11 = (TablebaseState(score=1.0, plies=p) for p in (9, 7, 11))
    assert step_reward(win9, win7, shaping=0.2) == pytest.approx(0.2)
    assert step_reward(win9, win11, shaping=0.2) == pytest.approx(-0.2)
    assert step_reward(win9, win9, shaping=0.2) == 0.0
    # The losing side: a longer loss is progress, a blunder by the winner that draws is +1.
    lose5, lose7, draw = TablebaseState(0.0, 5), TablebaseState(0.0, 7), TablebaseState(0.5, 0)
    assert step_reward(lose5, lose7, shaping=0.2) == pytest.approx(0.2)
    assert step_reward(lose5, draw, shaping=0.2) == pytest.approx(1.0)
    # Regret form: the best a ply can earn against perfect defence.
    assert best_step_reward(white, shaping=0.2) == pytest.approx(1.0 + 0.1)  # mate in one on the board
    assert best_step_reward(win9, shaping=0.2) == pytest.approx(0.2) and best_step_reward(
        lose5, shaping=0.2
    ) == pytest.approx(-0.2)
    assert best_step_reward(draw, shaping=0.2) == 0.0


def test_reverse_curriculum_draws_only_near_mate_positions(tablebase):
    starts = _starts("KQvK", tablebase)
    near = starts.draw(32, seed=0, step=0, max_plies=3)
    assert all(tablebase.is_won(b) and tablebase.probe_dtz(b) <= 3 for b in near)
    assert max(tablebase.probe_dtz(b) for b in starts.draw(32, seed=0, step=0)) > 3


@pytest.mark.slow
def test_evaluation_baselines_tablebase_mates_optimally_and_random_does_not(tablebase):
    starts = _starts("KQvK", tablebase).hold_out(30, seed=5)
    perfect = evaluate_endgame(tablebase_picker(tablebase), starts, tablebase, max_moves=50)
    assert perfect.mate_rate.value == 1.0 and perfect.dtz_optimal_rate.value == 1.0
    assert perfect.moves_to_mate == pytest.approx(perfect.optimal_moves_to_mate)
    assert perfect.optimal_moves_all == pytest.approx(perfect.optimal_moves_to_mate)
    random = evaluate_endgame(random_picker(0), starts, tablebase, max_moves=50)
    assert random.mate_rate.value < 0.3 and random.win_lost_rate.value > 0.5
    assert 0.0 < random.dtz_optimal_rate.value < 0.5
    assert perfect.mate_rate.low > random.mate_rate.high  # Wilson intervals separate


def test_a_king_only_player_is_seen_and_diagnosed_as_the_king_only_optimum(tablebase, tmp_path):
    """The failure of GRPO from a random network: the policy moves only its king (a king cannot mate). A real
    king-only player through the real evaluation, its metrics in a run directory, `diagnose` on that run."""
    import random as random_module

    from chessgrpo.track.diagnose import diagnose
    from chessgrpo.track.run_data import load_run
    from chessgrpo.train.metrics import MetricsWriter

    rng = random_module.Random(0)

    def king_only(boards):
        return [
            rng.choice(
                [m for m in board.legal_moves if board.piece_type_at(m.from_square) == chess.KING]
                or list(board.legal_moves)
            )
            for board in boards
        ]

    starts = _starts("KQvK", tablebase).hold_out(20, seed=5)
    start = evaluate_endgame(random_picker(0), starts, tablebase, max_moves=20)
    stuck = evaluate_endgame(king_only, starts, tablebase, max_moves=20)
    assert set(start.piece_shares) == {"K", "Q"} and start.piece_shares["Q"] > 0.3
    assert stuck.piece_shares.get("Q", 0.0) < 0.05 and stuck.mate_rate.value == 0.0
    assert stuck.metrics()["eval/piece_share/K"] > 0.95
    assert sum(v for k, v in stuck.metrics().items() if k.startswith("eval/draw_")) == pytest.approx(
        stuck.win_lost_rate.value
    )
    with MetricsWriter(tmp_path / "run" / "metrics.jsonl") as writer:
        writer.log(0, start.metrics())
        writer.log(50, stuck.metrics())
    findings = {f.id: f for f in diagnose(load_run(tmp_path / "run"))}
    vanished = findings["endgame.piece_vanished"]
    assert vanished.severity == "warning" and vanished.evidence["vanished"] == ["Q"]
    assert "king" in vanished.message and "regret" in vanished.advice
    if stuck.win_lost_rate.value >= 0.1:
        assert "endgame.win_given_away" in findings
    # No mate means no mean length of mates: left out of the metrics, not a NaN that diagnose calls a numeric fault.
    assert "eval/moves_to_mate" not in stuck.metrics() and "values.non_finite" not in findings


def test_a_converting_player_has_no_endgame_warning(tablebase, tmp_path):
    from chessgrpo.track.diagnose import diagnose
    from chessgrpo.track.run_data import load_run
    from chessgrpo.train.metrics import MetricsWriter

    starts = _starts("KQvK", tablebase).hold_out(20, seed=5)
    perfect = evaluate_endgame(tablebase_picker(tablebase), starts, tablebase, max_moves=20)
    with MetricsWriter(tmp_path / "run" / "metrics.jsonl") as writer:
        writer.log(0, perfect.metrics())
        writer.log(50, perfect.metrics())
    assert not {f.id for f in diagnose(load_run(tmp_path / "run"))} & {
        "endgame.piece_vanished",
        "endgame.win_given_away",
    }


def test_cheap_dtz_optimality_agrees_with_the_exact_check(tablebase):
    """The criterion used in evaluation (mate, or DTZ 2 plies shorter after the perfect reply) = best_moves."""
    for material in ("KQvK", "KRvK"):
        for board in endgame_positions(material, 6, seed=21, accept=tablebase.is_won):
            best = set(tablebase.best_moves(board))
            before = tablebase.probe_dtz(board)
            for move in board.legal_moves:
                after = board.copy()
                after.push(move)
                reason = game_over(after)
                if reason is None:
                    after.push(tablebase.tablebase_move(after))
                    cheap = (
                        game_over(after) is None
                        and tablebase.probe_wdl(after) == 2
                        and before - tablebase.probe_dtz(after) >= 2
                    )
                else:
                    cheap = reason == "checkmate"
                assert cheap == (move in best), (material, board.fen(), move.uci())
