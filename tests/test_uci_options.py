"""The UCI options bots and GUIs set (uci/options.py, play/search_control.py): ``Move Overhead``, ``Threads``, ``Hash``, with
lichess-bot's default engine options, driven through python-chess's engine client against a real checkpoint; and the
deadline that never starts a search step it cannot finish. The chess LM's engine (uci/lm.py) takes the same options
and keeps its clock too."""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable

import chess
import chess.engine
import pytest
import torch

from chessgrpo.engine import find_stockfish
from chessgrpo.engine.pool import available_cores
from chessgrpo.models.lm import LMModelConfig, build_lm, save_lm
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.play.search_control import (
    MOVE_OVERHEAD_MS,
    GoLimits,
    SearchControl,
    clock_seconds,
    hash_nodes,
    movetime_seconds,
    parse_go,
)
from chessgrpo.uci.engine import UciEngine
from chessgrpo.uci.lm import LM_OPTIONS
from helpers import SYZYGY_DIR

STARTUP_TIMEOUT_S = 60.0
LICHESS_BOT_DEFAULTS = {"Move Overhead": 100, "Threads": 4, "Hash": 512, "SyzygyPath": "./syzygy/", "UCI_ShowWDL": True}
"""lichess-bot's `engine.uci_options` as its config.yml.default has them (checked against lichess-bot-devs/lichess-bot
at bedd1d9, 2026-08); its `engine.ponder: true` makes python-chess ponder too. ./syzygy/ does not exist here."""


@pytest.fixture(scope="module")
def value_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_policy(
        ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True)),
        tmp_path_factory.mktemp("uci_opts") / "ckpt",
    )


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """An untrained 1-layer chess LM: its greedy answers never parse, so without a clock each move takes 4 generations."""
    return save_lm(
        build_lm(LMModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=256), seed=0),
        tmp_path_factory.mktemp("uci_lm") / "lm",
    )


@pytest.fixture
def torch_threads():
    """In-process engines set torch's threads: give the test process its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def engine(checkpoint) -> chess.engine.SimpleEngine:
    return chess.engine.SimpleEngine.popen_uci(
        [sys.executable, "-m", "chessgrpo.cli", "uci", "--checkpoint", str(checkpoint)], timeout=STARTUP_TIMEOUT_S
    )


def play_clocked(
    engines: dict[chess.Color, chess.engine.SimpleEngine],
    plies: int,
    *,
    ponder: bool,
    clock: float = 30.0,
    increment: float = 0.3,
    opponent: Callable[[chess.Board], chess.Move] | None = None,
) -> tuple[chess.Board, float]:
    """Play up to `plies` under a `clock` + `increment` clock (s) the test keeps itself (each side of `engines` loses the
    wall time its `play` took, then gains the increment); fails when a move takes longer than its side has, or than its
    budget (Move Overhead 100). `opponent`, when given, plays the side `engines` lacks, off the clock. Returns the board
    and the lowest clock seen. `game` stays the same object, so python-chess sends ``ponderhit`` when a ponder move is
    played.

    The game ends by the rules alone (`chess.Board.is_game_over`: mate, stalemate, insufficient material, fivefold
    repetition, 75 moves): nobody claims a draw, as neither engine asks for one, so two engines that shuffle their
    pieces play on. (Stopping at a *claimable* threefold repetition, which python-chess counts one move early, ended a
    game of two identical random networks at ply 24.)"""
    board, clocks, game = chess.Board(), {chess.WHITE: clock, chess.BLACK: clock}, object()
    lowest = clock
    for _ in range(plies):
        side = board.turn
        if side not in engines:
            assert opponent is not None
            board.push(opponent(board))
        else:
            limit = chess.engine.Limit(
                white_clock=clocks[chess.WHITE],
                black_clock=clocks[chess.BLACK],
                white_inc=increment,
                black_inc=increment,
            )
            started = time.perf_counter()
            result = engines[side].play(board, limit, ponder=ponder, game=game)
            spent = time.perf_counter() - started
            assert spent < clocks[side], f"flagged at ply {board.ply()}: {spent:.2f} s with {clocks[side]:.2f} s left"
            # its budget (Move Overhead 100 kept back), plus this busy machine's latency
            assert spent <= clock_seconds(int(clocks[side] * 1000), int(increment * 1000), overhead_ms=100) + 0.5
            clocks[side] += increment - spent
            lowest = min(lowest, clocks[side])
            board.push(result.move)
        if board.is_game_over():
            break
    return board, lowest


def test_overhead_and_hash_set_the_budgets():
    assert (
        clock_seconds(30_000, 300, overhead_ms=1000)
        < clock_seconds(30_000, 300)
        < clock_seconds(30_000, 300, overhead_ms=0)
    )
    assert movetime_seconds(1000, 200) == pytest.approx(0.8) and movetime_seconds(1000) == pytest.approx(
        1 - MOVE_OVERHEAD_MS / 1000
    )
    assert hash_nodes(1) == 256 and hash_nodes(64) == 16384 and hash_nodes(10**6) == 100_000
    limits, _ = parse_go(["wtime", "1000", "btime", "1000"], chess.WHITE, 256, overhead_ms=900, max_nodes=300)
    assert limits.nodes == 300 and limits.seconds == pytest.approx(0.1 / 30)  # what the overhead leaves, over 30 moves


def steps_until_stopped(control: SearchControl, step_s: float) -> tuple[int, float]:
    """A search loop as `search.puct` runs one: ask, then take a step of `step_s` (a real sleep); the steps taken and
    when the loop ended, in seconds after the control's start."""
    steps = 0
    while not control.should_stop(steps + 1):
        time.sleep(step_s)
        steps += 1
    return steps, time.perf_counter() - control.started


def test_the_deadline_never_starts_a_step_it_cannot_finish():
    """A step (a PUCT batch of a larger network on a CPU) can take longer than a bullet increment: the search must stop
    before a step that would end past the deadline, not at the first question after it."""
    control = SearchControl(GoLimits(nodes=10**6, seconds=0.35))
    steps, ended = steps_until_stopped(control, 0.1)
    assert 1 <= steps <= 3 and ended < 0.35 + 0.03  # asking only "is the deadline past?" ends at ~0.4 s
    assert control.step_seconds >= 0.1
    # The next search starts with that guess: a step longer than its whole budget is never begun.
    seeded = SearchControl(GoLimits(nodes=10**6, seconds=0.08), step_seconds=control.next_step_seed())
    assert steps_until_stopped(seeded, 0.1)[0] == 0
    # A guess that no step could check fades (a faster device since must not stop every search for ever).
    assert seeded.next_step_seed() < control.next_step_seed()
    # While pondering, a step longer than the go's own budget waits for ponderhit or stop instead: a missed ponder
    # would otherwise spend that step on the engine's clock.
    pondering = SearchControl(GoLimits(nodes=10**6, seconds=0.05), ponder=True, step_seconds=0.1)
    started = time.perf_counter()
    taken: list[int] = []  # the search thread's steps
    thread = threading.Thread(target=lambda: taken.append(steps_until_stopped(pondering, 0.1)[0]))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # no step while pondering, yet no answer either
    pondering.stop()
    thread.join(2)
    assert taken == [0] and time.perf_counter() - started < 0.3 + 0.1  # stop answered with nothing in flight


@pytest.mark.slow
def test_lichess_bot_options_configure_and_a_30_plus_03_game_never_flags(value_checkpoint):
    """python-chess refuses an option the engine does not offer: the issue's options and lichess-bot's defaults must
    all be offered (a missing ./syzygy/ is refused by the engine with an info string, not by python-chess). Then a game
    under a 30 s + 0.3 s clock, pondering as lichess-bot does: no move ever exceeds the clock."""
    client = engine(value_checkpoint)
    try:
        for name in ("Move Overhead", "Threads", "Hash", "SyzygyPath", "UCI_ShowWDL", "Ponder"):
            assert name in client.options
        client.configure({"Threads": 2, "Hash": 64, "Move Overhead": 100})
        client.configure(LICHESS_BOT_DEFAULTS)
        client.configure({"SyzygyPath": str(SYZYGY_DIR)})
        client.ping()  # options take effect (tables opened, threads measured) before the clock runs, as at a bot's start
        board, lowest = play_clocked({chess.WHITE: client, chess.BLACK: client}, 6, ponder=True)
        assert board.ply() >= 6 or board.is_game_over(claim_draw=True)
        assert lowest > 20  # ~1 s a move of 30 s, and the increment back
    finally:
        client.quit()


def test_options_with_spaces_threads_and_unknown_options_in_process(value_checkpoint, torch_threads):
    output = io.StringIO()
    commands = [
        "setoption name Move Overhead value 250",
        "setoption name Threads value 1024",
        "setoption name Hash value 2",
        "setoption name No Such Option value 3",
        "setoption name Move Overhead value -1",
    ]
    uci = UciEngine(value_checkpoint, input=io.StringIO("\n".join(commands) + "\n"), output=output)
    assert uci.run() == 0
    lines = output.getvalue().splitlines()
    assert uci.move_overhead_ms == 250  # a name with a space; the refused -1 kept it
    assert any("Move Overhead must be an integer in [0, 5000]" in line and "keeping 250" in line for line in lines)
    assert 1 <= uci.threads <= available_cores() and torch.get_num_threads() == uci.threads
    assert any(f"Threads 1024: this process may use {available_cores()} CPUs" in line for line in lines)
    assert uci.max_nodes == hash_nodes(2) == 512
    assert "info string unknown option ignored: No Such Option" in lines  # today's behaviour for unknown options
    assert uci.step_seconds > 0  # measured at startup (and again for Threads): the first deadline knows a step's time


def test_hash_bounds_the_search_tree(value_checkpoint):
    client = engine(value_checkpoint)
    try:
        client.configure({"Hash": 1})  # 256 nodes of ~4 kB
        info = client.analyse(chess.Board(), chess.engine.Limit(nodes=5000))
        assert 0 < info["nodes"] <= hash_nodes(1)
        assert client.play(chess.Board(), chess.engine.Limit(nodes=5000)).move in chess.Board().legal_moves
        client.configure({"Hash": 64})
        info = client.analyse(chess.Board(), chess.engine.Limit(nodes=1000))
        assert info["nodes"] > hash_nodes(1)
    finally:
        client.quit()


@pytest.mark.slow
def test_a_whole_30_plus_03_game_with_pondering_never_flags(value_checkpoint):
    """Two engines with lichess-bot's options, White pondering (so ``ponderhit`` when Black plays the expected move, a
    ``stop`` otherwise), to the end of the game by the rules or 200 plies (~2 min): neither side ever flags."""
    engines = {chess.WHITE: engine(value_checkpoint), chess.BLACK: engine(value_checkpoint)}
    try:
        for client in engines.values():
            client.configure({**LICHESS_BOT_DEFAULTS, "SyzygyPath": str(SYZYGY_DIR)})
            client.ping()
        board, lowest = play_clocked(engines, 200, ponder=True)
        # Two random networks can mate early: the game is whole when the rules end it, else it ran all 200 plies.
        assert (board.is_game_over() or board.ply() == 200) and lowest > 0
    finally:
        for client in engines.values():
            client.quit()


@pytest.mark.slow
def test_the_chess_lm_takes_the_bots_options_and_plays_a_whole_10_plus_01_game_without_flagging(lm_checkpoint):
    """The issue's acceptance: python-chess's ``configure`` takes Threads, Hash and Move Overhead (and lichess-bot's
    other defaults) from ``chessgrpo uci`` with a chess LM, which then plays a whole 10 s + 0.1 s game against
    Stockfish at 100 nodes, pondering as lichess-bot does: it never flags and no move exceeds its budget. Untimed, the
    untrained LM's moves take 4 generations each (~0.5 s, more than the budget of most moves): the clock cuts them."""
    client = engine(lm_checkpoint)
    stockfish = chess.engine.SimpleEngine.popen_uci(str(find_stockfish()), timeout=STARTUP_TIMEOUT_S)
    try:
        assert set(client.options) == set(LM_OPTIONS)
        client.configure({"Threads": 1, "Hash": 16, "Move Overhead": 100})
        client.configure(LICHESS_BOT_DEFAULTS)
        client.ping()
        board, lowest = play_clocked(
            {chess.WHITE: client},
            400,
            ponder=True,
            clock=10.0,
            increment=0.1,
            opponent=lambda board: stockfish.play(board, chess.engine.Limit(nodes=100)).move,
        )
        assert board.is_game_over() and lowest > 0  # to the end (Stockfish mates the LM's mostly random moves)
    finally:
        client.quit()
        stockfish.quit()
