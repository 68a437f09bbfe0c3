"""The Stockfish pool against the real engine: values, point of view, faults, injection, cache."""

from __future__ import annotations

import os
import signal
import stat
import sys
import textwrap
import threading
import time
from pathlib import Path

import chess
import chess.engine
import pytest

from chessgrpo.board import random_playout_positions
from chessgrpo.engine import EngineError, EngineNotFoundError, EnginePool, RetryPolicy, find_stockfish
from chessgrpo.engine.pool import BACKGROUND

WHITE_MATES_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8#
BLACK_MATES_IN_ONE = "r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1"  # Ra1#
WHITE_IS_MATED = "6k1/5ppp/8/8/8/8/5PPP/r5K1 w - - 0 1"
BLACK_IS_STALEMATED = "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"
BARE_KINGS = "8/8/8/4k3/8/8/8/4K3 w - - 0 1"
BLACK_QUEEN_UP_BLACK_TO_MOVE = "6k1/8/8/3q4/8/8/8/6K1 b - - 0 1"
BLACK_QUEEN_UP_WHITE_TO_MOVE = "6k1/8/8/3q4/8/8/8/6K1 w - - 0 1"
ITALIAN = "r1bqk1nr/pppp1ppp/2n5/2b1p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"


@pytest.fixture(scope="module")
def pool():
    with EnginePool(processes=2, nodes=2000) as engine_pool:
        yield engine_pool


@pytest.fixture(scope="module")
def positions() -> list[str]:
    return [board.fen() for board in random_playout_positions(24, seed=7, max_plies=50)]


def test_mate_in_one_for_white_and_black(pool):
    white, black = pool.evaluate([WHITE_MATES_IN_ONE, BLACK_MATES_IN_ONE])
    assert (white.mate, white.best_move, white.win_probability) == (1, "a1a8", 1.0)
    assert (black.mate, black.best_move, black.win_probability) == (1, "a8a1", 1.0)


def test_terminal_positions_are_scored_without_the_engine(pool):
    searches_before = pool.stats.searches
    mated, stalemate, kings = pool.evaluate([WHITE_IS_MATED, BLACK_IS_STALEMATED, BARE_KINGS])
    assert (mated.terminal, mated.win_probability, mated.mate, mated.best_move) == ("checkmate", 0.0, 0, None)
    assert (stalemate.terminal, stalemate.win_probability) == ("stalemate", 0.5)
    assert (kings.terminal, kings.win_probability) == ("insufficient_material", 0.5)
    assert pool.stats.searches == searches_before


def test_fifty_move_rule_is_a_draw(pool):
    [evaluation] = pool.evaluate(["6k1/8/8/3q4/8/8/8/6K1 b - - 100 80"])
    assert (evaluation.terminal, evaluation.win_probability) == ("fifty_moves", 0.5)


def test_point_of_view_is_the_side_to_move(pool):
    black_to_move, white_to_move = pool.evaluate([BLACK_QUEEN_UP_BLACK_TO_MOVE, BLACK_QUEEN_UP_WHITE_TO_MOVE])
    assert black_to_move.win_probability > 0.95
    assert white_to_move.win_probability < 0.05
    assert (black_to_move.cp or 0) > 500 or (black_to_move.mate or 0) > 0
    assert (white_to_move.cp or 0) < -500 or (white_to_move.mate or 0) < 0


def test_win_probability_is_python_chess_wdl_model_for_this_engine(pool):
    assert pool.wdl_model == "sf15.1"  # Debian's Stockfish 15.1
    board = chess.Board(ITALIAN)
    [evaluation] = pool.evaluate([board])
    assert evaluation.cp is not None
    wdl = chess.engine.Cp(evaluation.cp).wdl(model="sf15.1", ply=board.ply())
    assert evaluation.win_probability == pytest.approx(wdl.expectation())
    assert evaluation.wdl == (wdl.wins, wdl.draws, wdl.losses)


def test_analyse_black_lists_best_moves_first_from_blacks_view(pool):
    analysis = pool.analyse(BLACK_MATES_IN_ONE, multipv=4)
    assert len(analysis.lines) == 4
    assert analysis.best.move == "a8a1" and analysis.best.mate == 1
    values = [line.win_probability for line in analysis.lines]
    assert values == sorted(values, reverse=True)
    # Every other move keeps a big edge for Black (a rook up): values are Black's, not White's.
    assert all(value > 0.9 for value in values)


def test_analyse_terminal_position_has_no_lines(pool):
    assert pool.analyse(WHITE_IS_MATED, multipv=3).lines == ()


def test_best_move(pool):
    assert pool.best_move(WHITE_MATES_IN_ONE) == "a1a8"
    assert pool.best_move(WHITE_IS_MATED) is None


def test_same_position_same_result_whatever_was_searched_before(positions):
    # One process: every search follows different earlier searches, in the two orders.
    with EnginePool(processes=1, nodes=3000) as single:
        forward = single.evaluate(positions)
        backward = single.evaluate(positions[::-1])[::-1]
    # Two processes: each position may land on either process.
    with EnginePool(processes=2, nodes=3000) as double:
        spread = double.evaluate(positions[5:] + positions[:5])
        spread = spread[-5:] + spread[:-5]
    assert forward == backward == spread


def test_identical_requests_in_a_batch_are_searched_once(pool):
    before = pool.stats.searches
    a, b, c, d = pool.evaluate([ITALIAN, BLACK_QUEEN_UP_BLACK_TO_MOVE, ITALIAN, chess.Board(ITALIAN)])
    assert pool.stats.searches - before == 2
    assert a == c == d


def test_halfmove_clock_only_matters_near_the_fifty_move_rule(pool):
    early = pool.evaluate(["6k1/8/8/3q4/8/8/8/6K1 b - - 3 60", "6k1/8/8/3q4/8/8/8/6K1 b - - 40 90"])
    assert early[0].cp == early[1].cp and early[0].best_move == early[1].best_move
    before = pool.stats.searches
    pool.evaluate(["6k1/8/8/3q4/8/8/8/6K1 b - - 3 60", "6k1/8/8/3q4/8/8/8/6K1 b - - 90 90"])
    assert pool.stats.searches - before == 2  # clock 90 is a different request


@pytest.mark.parametrize(
    "bad",
    [
        "8/8/8/8/8/8/8/K6k w - - 0 1\nquit",
        "8/8/8/8/8/8/8/K6k w - - 0 1\ngo infinite",
        "startpos moves e2e4",
        "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1; quit",
        "8/8/8/8/8/8/8/8 w - - 0 1",  # no kings
        "not a fen",
    ],
)
def test_injection_and_malformed_input_is_rejected_and_the_pool_keeps_working(pool, bad):
    with pytest.raises(ValueError) as raised:
        pool.evaluate([ITALIAN, bad])
    assert repr(bad)[1:20] in str(raised.value)
    assert pool.best_move(WHITE_MATES_IN_ONE) == "a1a8"


def test_concurrent_calls_from_two_threads(pool, positions):
    expected = pool.evaluate(positions)
    results: dict[str, list] = {}

    def work(name: str, chunk: list[str]) -> None:
        results[name] = pool.evaluate(chunk)

    threads = [
        threading.Thread(target=work, args=("a", positions[:12])),
        threading.Thread(target=work, args=("b", positions[12:])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results["a"] + results["b"] == expected


def test_killed_engine_mid_batch_is_replaced_and_the_batch_is_right(positions):
    with EnginePool(processes=2, nodes=20_000) as reference:
        expected = reference.evaluate(positions * 1)
    with EnginePool(processes=2, nodes=20_000) as pool:
        victim = pool.pids[0]
        outcome: dict[str, object] = {}
        worker = threading.Thread(target=lambda: outcome.setdefault("result", pool.evaluate(positions)))
        worker.start()
        time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        worker.join(timeout=120)
        assert outcome["result"] == expected
        assert pool.stats.retries >= 1
        assert victim not in pool.pids


def test_hung_engine_times_out_and_is_replaced(positions):
    with EnginePool(processes=1, nodes=2000, timeout_s=1.0) as pool:
        expected = pool.evaluate(positions[:3])
        os.kill(pool.pids[0], signal.SIGSTOP)  # frozen, not dead: only the deadline notices
        try:
            [again] = pool.evaluate([positions[20]])
        finally:
            for pid in pool.pids:
                os.kill(pid, signal.SIGCONT)
        assert pool.stats.retries == 1
        assert pool.evaluate(positions[:3]) == expected
        assert again.best_move is not None


def _write_poisoned_engine(directory: Path, poison_fen: str) -> Path:
    """A real Stockfish behind a proxy that dies whenever it is asked to search `poison_fen`."""
    script = directory / "poisoned_stockfish"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import subprocess, sys, threading
            engine = subprocess.Popen([{str(find_stockfish())!r}], stdin=subprocess.PIPE, stdout=sys.stdout, bufsize=0)
            for line in sys.stdin:
                if line.startswith("position fen ") and {poison_fen!r} in line:
                    engine.kill()
                    sys.exit(3)
                engine.stdin.write(line.encode())
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_persistent_failure_raises_naming_the_position_and_is_never_cached(tmp_path, positions):
    poison = chess.Board(positions[3]).fen()
    engine = _write_poisoned_engine(tmp_path, poison.split(" ")[0])
    cache = tmp_path / "cache.sqlite"
    retry = RetryPolicy(retries_per_position=2, backoff_s=0.01)
    with EnginePool(path=engine, processes=1, nodes=1000, timeout_s=10, cache_path=cache, retry=retry) as pool:
        with pytest.raises(EngineError) as raised:
            pool.evaluate(positions[:5])
        message = str(raised.value)
        assert poison.split(" ")[0] in message and "failed 3 times" in message and str(engine) in message
        assert pool.stats.failures == 1 and pool.stats.retries == 2
        cached_count = len(pool.cache)
        assert cached_count == 4  # the four good positions, not the failure
        # The pool still works afterwards, and the failing position is still not cached.
        assert len(pool.evaluate(positions[:3])) == 3
        with pytest.raises(EngineError):
            pool.evaluate([poison])
        assert len(pool.cache) == cached_count


def _write_flaky_engine(directory: Path, dies_on_first_starts: int) -> Path:
    """A real Stockfish whose first `dies_on_first_starts` launches exit before answering `uci`
    (as an engine killed in its first milliseconds does); a counter file remembers launches."""
    counter = directory / "launches"
    counter.write_text("0")
    script = directory / "flaky_stockfish"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            n=$(cat {str(counter)!r}); n=$((n + 1)); echo $n > {str(counter)!r}
            if [ $n -le {dies_on_first_starts} ]; then exit 9; fi
            exec {str(find_stockfish())!r}
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_engines_dying_at_start_up_are_retried_with_backoff(tmp_path, positions):
    engine = _write_flaky_engine(tmp_path, dies_on_first_starts=3)
    with EnginePool(processes=1, nodes=1000) as reference:
        expected = reference.evaluate(positions[:4])
    retry = RetryPolicy(startup_attempts=5, backoff_s=0.01)
    with EnginePool(path=engine, processes=1, nodes=1000, retry=retry) as pool:  # one: the counter is not atomic
        assert pool.evaluate(positions[:4]) == expected
        assert pool.stats.engine_failures == 3
    assert (tmp_path / "launches").read_text().strip() == "4"  # 3 failed starts, then a good one


def test_an_engine_that_never_starts_is_one_error_naming_the_binary(tmp_path):
    engine = _write_flaky_engine(tmp_path, dies_on_first_starts=100)
    with pytest.raises(EngineError) as raised:
        EnginePool(path=engine, processes=1, retry=RetryPolicy(startup_attempts=3, backoff_s=0.01))
    assert str(engine) in str(raised.value) and "3 attempts" in str(raised.value)


def test_the_pool_wide_failure_budget_stops_a_fault_storm(tmp_path, positions):
    poison = chess.Board(positions[3]).fen()
    engine = _write_poisoned_engine(tmp_path, poison.split(" ")[0])
    retry = RetryPolicy(retries_per_position=10, max_failures=2, backoff_s=0.01)
    with EnginePool(path=engine, processes=1, nodes=500, timeout_s=10, retry=retry) as pool:
        with pytest.raises(EngineError) as raised:
            pool.evaluate([poison])
    assert "engine.max_failures=2" in str(raised.value) and poison.split(" ")[0] in str(raised.value)


def test_a_binary_deleted_mid_run_is_a_clear_error_once_an_engine_must_be_replaced(tmp_path, positions):
    binary = tmp_path / "stockfish-copy"
    binary.write_bytes(find_stockfish().read_bytes())
    binary.chmod(0o755)
    with EnginePool(path=binary, processes=1, nodes=500, retry=RetryPolicy(startup_attempts=2, backoff_s=0.01)) as pool:
        pool.evaluate(positions[:2])
        binary.unlink()
        pool.evaluate(positions[2:4])  # the running process still works
        os.kill(pool.pids[0], signal.SIGKILL)
        with pytest.raises(EngineError) as raised:
            pool.evaluate(positions[4:6])
    assert str(binary) in str(raised.value) and "could not be started" in str(raised.value)


def test_kills_every_few_hundred_milliseconds_leave_every_value_exact(positions):
    with EnginePool(processes=2, nodes=5000) as reference:
        expected = reference.evaluate(positions)
    retry = RetryPolicy(retries_per_position=10, backoff_s=0.01)
    with EnginePool(processes=2, nodes=5000, retry=retry) as pool:
        stop = threading.Event()

        def killer() -> None:
            import random

            rng = random.Random(0)
            while not stop.wait(rng.uniform(0.02, 0.1)):
                pids = pool.pids
                if pids:
                    try:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                    except ProcessLookupError:
                        pass

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            got = [pool.evaluate(positions) for _ in range(3)]
        finally:
            stop.set()
            thread.join()
        assert all(result == expected for result in got)
        assert pool.stats.engine_failures >= 3 and pool.stats.failures == 0


def test_missing_binary_is_one_clear_error(tmp_path):
    with pytest.raises(EngineNotFoundError) as raised:
        EnginePool(path=tmp_path / "no-such-stockfish", processes=1)
    assert "apt-get install stockfish" in str(raised.value)


def test_persistent_cache_hits_across_pools(tmp_path, positions):
    cache = tmp_path / "evaluations.sqlite"
    with EnginePool(processes=2, nodes=1500, cache_path=cache) as pool:
        first = pool.evaluate(positions)
        assert pool.stats.searches == len(positions) and pool.stats.cache_hit_rate == 0.0
        second = pool.evaluate(positions)
        assert pool.stats.searches == len(positions)  # no new search
        assert pool.stats.cache_hit_rate == pytest.approx(0.5)
    assert all(e.cached for e in second) and not any(e.cached for e in first)
    strip = lambda evaluations: [e.__class__(**{**e.__dict__, "cached": False}) for e in evaluations]  # noqa: E731
    assert strip(second) == first
    with EnginePool(processes=1, nodes=1500, cache_path=cache) as reopened:
        assert strip(reopened.evaluate(positions[:4])) == first[:4]
        assert reopened.stats.searches == 0
        reopened.evaluate(positions[:4], nodes=1600)  # another limit is another key
        assert reopened.stats.searches == 4


def test_cached_analysis_equals_fresh_analysis(tmp_path):
    cache = tmp_path / "analysis.sqlite"
    with EnginePool(processes=1, nodes=1500, cache_path=cache) as pool:
        fresh = pool.analyse(ITALIAN, multipv=3)
        again = pool.analyse(ITALIAN, multipv=3)
        other_width = pool.analyse(ITALIAN, multipv=2)
    assert again.cached and not fresh.cached
    assert again.lines == fresh.lines
    assert len(other_width.lines) == 2 and not other_width.cached


def test_multipv_lines_are_distinct_complete_and_ordered(pool):
    # Regression: mixing lines of different iteration blocks once listed the same move twice
    # and out of order in ~10% of positions stopped mid-iteration by the node limit.
    boards = random_playout_positions(150, seed=11, max_plies=80)
    for board, analysis in zip(boards, pool.analyse_many(boards, multipv=5)):
        moves = [line.move for line in analysis.lines]
        values = [line.win_probability for line in analysis.lines]
        assert len(moves) == len(set(moves)) == min(5, board.legal_moves.count()), board.fen()
        assert values == sorted(values, reverse=True), board.fen()
        assert all(chess.Move.from_uci(move) in board.legal_moves for move in moves)


def test_submit_returns_at_once_and_gives_what_evaluate_gives(pool, positions):
    pending = pool.submit(positions[:12], nodes=500)
    submitted = pending.result()
    assert [e.fen for e in submitted] == positions[:12]
    assert [(e.best_move, e.cp, e.mate) for e in submitted] == [
        (e.best_move, e.cp, e.mate) for e in pool.evaluate(positions[:12], nodes=500)
    ]
    with pytest.raises(RuntimeError, match="already"):
        pending.result()


def test_an_urgent_search_overtakes_queued_background_searches(positions):
    # One process: 20 background searches are queued first; the urgent one is taken next.
    with EnginePool(processes=1, nodes=20_000) as one:
        background = one.submit(positions[:20], priority=BACKGROUND)
        urgent = one.evaluate([ITALIAN], nodes=100)[0]
        assert urgent.best_move is not None
        assert not background.done()  # most background searches were still waiting behind it
        assert len(background.result()) == 20


def test_given_fens_cannot_carry_commands(pool):
    board = chess.Board(ITALIAN)
    with pytest.raises(ValueError, match="characters"):
        pool.submit([board], fens=[ITALIAN + "\nquit"])
    assert pool.evaluate([board], nodes=100)[0].best_move is not None  # the pool still works
