"""`eval games` under real clocks: the time-control grammar, the clock arithmetic, a real match against
Stockfish on a tiny clock (time losses counted, TimeControl and %clk in the PGN), and forced losses on
time (a deliberately slow player), including the draw when the opponent cannot mate."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import time

import chess
import chess.pgn
import pytest
import torch

from chessgrpo.board.openings import Opening
from chessgrpo.commands.games import format_summary
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.play.anchors import anchor_rating, parse_anchor
from chessgrpo.play.game_clock import (
    GameClock,
    TimeControl,
    parse_time_control,
    time_forfeit,
)
from chessgrpo.play.games import Adjudicator, GameSettings, GameTask, play_game
from chessgrpo.play.match import GamesConfig, play_match, summarise
from chessgrpo.play.movers import EngineMover, RandomMover
from helpers import SYZYGY_DIR

OPENING = Opening(fen="rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", moves=("e2e4",), source="test:1")
QUEENS_VS_KING = Opening(fen="4k3/8/8/8/8/8/8/QQQ1K3 w - - 0 1", source="test:queens")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path_factory.mktemp("tiny") / "ckpt")


class SlowMover(RandomMover):
    """A random mover that thinks for `delay` seconds per move (ignoring its clock): it must flag."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def move(self, board, clock=None):
        time.sleep(self.delay)
        return super().move(board, clock)


def test_time_control_grammar_good_and_bad():
    assert parse_time_control("40/10+0.1") == TimeControl(seconds=10, increment=0.1, moves=40)
    assert parse_time_control("30+0.3") == TimeControl(seconds=30, increment=0.3)
    assert parse_time_control(" 60 ") == TimeControl(seconds=60)
    assert parse_time_control("0.5+.05") == TimeControl(seconds=0.5, increment=0.05)
    assert [parse_time_control(t).text for t in ("40/10+0.1", "30+0.3", "60", "40/60")] == [
        "40/10+0.1",
        "30+0.3",
        "60",
        "40/60",
    ]
    for bad in ("", "abc", "40/", "/10", "10+", "40/10+0.1+2", "-5", "10s", "0", "0/10", "1:30"):
        with pytest.raises(ValueError, match=r"^tc '.*'"):
            parse_time_control(bad)
    with pytest.raises(ValueError, match=r"anchor_tc '40/x' is not a time control: expected MOVES/SECONDS\+INC"):
        parse_time_control("40/x", "anchor_tc")


def test_clock_spends_adds_increments_refills_each_period_and_flags():
    clock = GameClock(parse_time_control("2/1+0.5"), parse_time_control("3"))
    view = clock.view(chess.WHITE)
    assert (view.white, view.black, view.white_increment, view.black_increment, view.moves_to_go) == (1, 3, 0.5, 0, 2)
    assert not clock.spend(chess.WHITE, 0.25) and clock.left[chess.WHITE] == pytest.approx(1.25)
    assert clock.view(chess.WHITE).moves_to_go == 1 and clock.view(chess.BLACK).moves_to_go == 0
    assert not clock.spend(chess.WHITE, 0.25) and clock.left[chess.WHITE] == pytest.approx(
        2.5
    )  # + increment + next period
    assert clock.view(chess.WHITE).moves_to_go == 2
    assert not clock.spend(chess.BLACK, 2.9) and clock.spend(
        chess.BLACK, 0.2
    )  # below zero: flagged, no increment saves it
    assert time_forfeit(chess.Board(), chess.WHITE) == "0-1" and time_forfeit(chess.Board(), chess.BLACK) == "1-0"
    assert time_forfeit(chess.Board(QUEENS_VS_KING.fen), chess.WHITE) == "1/2-1/2"  # Black cannot mate: a draw
    assert time_forfeit(chess.Board(QUEENS_VS_KING.fen), chess.BLACK) == "1-0"


def test_a_slow_player_loses_on_time_and_draws_when_the_opponent_cannot_mate(checkpoint):
    settings = GameSettings(
        checkpoint=str(checkpoint),
        player_name="slow",
        syzygy_path=str(SYZYGY_DIR),
        max_plies=60,
        tc="0.1+0",
        anchor_tc="10+0.1",
    )
    anchor = dataclasses.replace(parse_anchor("sf-nodes:20"), clock="10+0.1")
    engine, adjudicator = EngineMover(anchor), Adjudicator(settings)
    results = []
    try:
        for game, opening in ((0, OPENING), (1, OPENING), (0, QUEENS_VS_KING)):
            task = GameTask(0, anchor, anchor.describe("Stockfish 15.1"), 0, game, opening, 7)
            results.append(play_game(task, SlowMover(0.15), engine, adjudicator, settings))
    finally:
        engine.close()
        adjudicator.close()
    lost_white, lost_black, drawn = results
    assert (lost_white.result, lost_black.result, drawn.result) == ("0-1", "1-0", "1/2-1/2")
    assert all(r.termination == "time forfeit" and r.flagged == "player" for r in results)
    assert lost_white.plies == 1  # Black (the opening's mover) is Stockfish; the slow White flags on its first move
    assert lost_black.plies == 0 and lost_black.anchor_search == {"depth": [], "nodes": [], "seconds": []}
    assert len(lost_white.anchor_search["nodes"]) == 1  # the anchor's one move, with what it searched
    game = chess.pgn.read_game(io.StringIO(lost_white.pgn))
    assert game.headers["Termination"] == "time forfeit" and game.headers["TerminationDetails"] == "time forfeit"
    assert game.headers["WhiteTimeControl"] == "0.1" and game.headers["BlackTimeControl"] == "10+0.1"
    assert game.headers["AnchorSettings"].endswith(
        "Hash=16; tc=10+0.1; nodes=20"
    )  # a limit given for it stays beside the clock
    first = next(iter(game.mainline()))
    assert (
        first.clock() is not None and 9.5 < first.clock() <= 10.1
    )  # Stockfish's clock after its move, increment added
    summary = summarise(results, [anchor], [anchor.describe()], [anchor_rating(anchor)])
    assert summary["time_losses"] == {"player": 3, "anchor": 0} and summary["anchors"][0]["time_losses"]["player"] == 3
    ran = summary["anchors"][0]["ran"]
    assert ran["asked"] == "tc=10+0.1, nodes=20" and ran["moves"] == 1 and ran["kept"] is True


@pytest.mark.slow
def test_eval_games_on_a_clock_against_stockfish_reports_time_losses_and_pgn_tags(cli, tmp_path, checkpoint):
    openings = tmp_path / "openings.epd"
    openings.write_text(OPENING.fen + "\n")
    pgn = tmp_path / "games.pgn"
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "sf-skill:0",
        "--games",
        "2",
        "--tc",
        "40/1+0.02",
        "--openings",
        str(openings),
        "--workers",
        "1",
        "--pgn",
        str(pgn),
        "--json",
        "max_plies=60",
        f"engine.syzygy_path={SYZYGY_DIR}",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout)
    assert summary["tc"] == "40/1+0.02" and "1 game at a time" in summary["clock_note"]
    assert set(summary["time_losses"]) == {"player", "anchor"}
    row = summary["anchors"][0]
    assert row["time_losses"]["player"] + row["time_losses"]["anchor"] == row["terminations"].get("time forfeit", 0)
    assert row["settings"].endswith("Skill Level=0; tc=40/1+0.02")  # the anchor node limit gave way to the clock
    assert row["ran"]["asked"] == "tc=40/1+0.02" and row["ran"]["kept"] is None and row["ran"]["moves"] > 0
    handle, games = io.StringIO(pgn.read_text()), []
    while (game := chess.pgn.read_game(handle)) is not None:
        games.append(game)
    assert len(games) == 2
    for game in games:
        assert game.headers["TimeControl"] == "40/1+0.02"
        clocks = [node.clock() for node in game.mainline()]
        assert clocks and all(c is not None and 0 <= c <= 1.02 * 2 for c in clocks)
    text = format_summary(summary)
    assert "time control 40/1+0.02: time losses: policy" in text and "time losses P/A" in text
    assert "ran: sf-skill:0 (asked tc=40/1+0.02; ran depth" in text


def test_clock_settings_are_checked_before_any_game(tmp_path, checkpoint):
    for changes, says in (
        ({"tc": "40/ten"}, r"tc '40/ten' is not a time control: expected MOVES/SECONDS\+INC"),
        ({"anchor_tc": "5+0.1"}, r"anchor_tc '5\+0.1' needs tc"),
        ({"tc": "5+0.1", "anchor_tc": "5+"}, r"anchor_tc '5\+' is not a time control"),
        ({"tc": "5+0.1", "workers": 64}, "64 game workers on .* CPU cores would share cores between running clocks"),
    ):
        config = GamesConfig(anchors=["random"], games=2, pgn=str(tmp_path / "g.pgn"), **changes)
        with pytest.raises(ValueError, match=says):
            play_match(config, checkpoint, progress=lambda total: contextlib.nullcontext())
        assert not (tmp_path / "g.pgn").exists()


def test_a_searching_policy_budgets_its_move_from_the_clock_like_chessgrpo_uci(tmp_path):
    """With a huge node budget the clock decides: `uci_go.clock_seconds` of 0.5 s with 30 moves to go is ~15 ms."""
    from chessgrpo.play.game_clock import ClockView
    from chessgrpo.play.movers import PolicyMover
    from chessgrpo.play.search_control import clock_seconds
    from chessgrpo.search import SearchSettings

    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True))
    mover = PolicyMover(model, search=SearchSettings(nodes=50_000, batch_size=4))
    board = chess.Board(OPENING.fen)
    budget = clock_seconds(500, 0, 30)
    started = time.perf_counter()
    move = mover.move(board, clock=ClockView(white=10, black=0.5, white_increment=0, black_increment=0, moves_to_go=30))
    elapsed = time.perf_counter() - started
    assert board.is_legal(move) and budget < 0.02
    assert mover.last_search.nodes < 50_000 and elapsed < 0.5  # stopped by the clock, far below its node budget


def test_the_verdict_on_a_limit_beside_a_clock():
    """Beside a clock, stopping below a node limit is the clock's doing (no warning); searching beyond it is not."""
    from chessgrpo.play.anchor_runs import MoveSearch, anchor_run

    shallow = [MoveSearch(1, 5, 0.001)] * 9
    deep = [MoveSearch(12, 80_000, 0.2)] * 9
    assert anchor_run("sf", ("nodes", 2000), "nodes=2000", shallow)["kept"] is False
    clocked = anchor_run("sf", ("nodes", 2000), "tc=0.05+0, nodes=2000", shallow, clocked=True)
    assert (
        clocked["kept"] is None
        and clocked["warning"] is None
        and clocked["line"].endswith("1 ms/move: the clock came first)")
    )
    beyond = anchor_run("Ethereal", ("nodes", 200), "tc=40/2+0.05, nodes=200", deep, clocked=True)
    assert beyond["kept"] is False and "searched far beyond it" in beyond["warning"]
    assert (
        anchor_run("sf", ("clock", None), "tc=60", deep, clocked=True)["line"]
        == "sf (asked tc=60; ran depth 12, ~80000 nodes/move, 200 ms/move)"
    )
    assert (
        anchor_run("x", ("nodes", 100), "nodes=100", [MoveSearch(3, None, 0.01)] * 3)["verdict"]
        == "did not report nodes"
    )
