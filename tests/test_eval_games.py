"""Real games: Stockfish and a random mover, a tiny policy across worker processes, adjudication, the CLI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time

import chess
import chess.pgn
import pytest
import torch

from chessgrpo.board import move_to_action
from chessgrpo.board.openings import Opening
from chessgrpo.eval.compare import compare_files
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.play.anchor_checks import check_anchor, probe_engine
from chessgrpo.play.anchors import anchor_rating, parse_anchor, parse_anchors, parse_ratings, skill_level_elo
from chessgrpo.play.game_runner import run_games
from chessgrpo.play.games import (
    Adjudicator,
    GameResult,
    GameSettings,
    GameTask,
    checkpoint_name,
    make_tasks,
    pgn_termination,
    play_game,
)
from chessgrpo.play.movers import EngineMover, PolicyMover, RandomMover
from helpers import SYZYGY_DIR, data_file

OPENINGS = [
    Opening(fen="rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", moves=("e2e4",), source="test:1"),
    Opening(fen="rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1", moves=("d2d4",), source="test:2"),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path_factory.mktemp("tiny") / "ckpt")


@pytest.fixture(scope="module")
def value_checkpoint(tmp_path_factory):
    """An untrained policy with a value head: what a search needs."""
    torch.manual_seed(0)
    model = ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True))
    return save_policy(model, tmp_path_factory.mktemp("value") / "ckpt")


@pytest.fixture(scope="module")
def engine_info():
    return probe_engine()


def settings_for(checkpoint, **changes) -> GameSettings:
    base = dict(
        checkpoint=str(checkpoint),
        player_name="tiny",
        engine_name="Stockfish 15.1",
        syzygy_path=str(SYZYGY_DIR),
        max_plies=120,
    )
    base.update(changes)
    return GameSettings(**base)


def task(anchor_text: str, opening: Opening, game: int = 0, pair: int = 0, seed: int = 1) -> GameTask:
    anchor = parse_anchor(anchor_text, nodes=20)
    return GameTask(0, anchor, anchor.describe("Stockfish 15.1"), pair, game, opening, seed)


def parse_pgns(text: str) -> list[chess.pgn.Game]:
    handle, games = io.StringIO(text), []
    while (game := chess.pgn.read_game(handle)) is not None:
        assert not game.errors, game.errors
        games.append(game)
    return games


# --------------------------------------------------------------------------------------------
# Anchors


def test_anchor_names_limits_and_ratings(engine_info, checkpoint):
    assert engine_info.name == "Stockfish 15.1" and engine_info.elo_min is not None
    skill, elo, nodes, rnd = parse_anchors("sf-skill:0,sf-elo:1500,sf-nodes:10,random", nodes=300)
    assert skill.describe(engine_info.name) == "Stockfish 15.1; Threads=1; Hash=16; Skill Level=0; nodes=300"
    assert (
        elo.describe(engine_info.name)
        == "Stockfish 15.1; Threads=1; Hash=16; UCI_LimitStrength=true; UCI_Elo=1500; nodes=300"
    )
    assert nodes.describe(engine_info.name) == "Stockfish 15.1; Threads=1; Hash=16; nodes=10"
    assert parse_anchor("sf-skill:3", depth=5).describe() == "Stockfish; Threads=1; Hash=16; Skill Level=3; depth=5"
    assert parse_anchor(str(checkpoint)).kind == "checkpoint"
    # Ratings and where they come from.
    assert anchor_rating(elo, engine_info.name).value == 1500
    assert anchor_rating(skill, engine_info.name).value == pytest.approx(1346.6, abs=0.1)
    assert skill_level_elo(5) == pytest.approx(1346.6 + 143.4 * 5**0.806)
    assert anchor_rating(parse_anchor("sf-skill:20"), engine_info.name).value is None
    assert anchor_rating(skill, "Stockfish 16").value is None  # another calibration: unrated unless given
    assert "convention" in anchor_rating(rnd, random_rating=-200).source
    assert anchor_rating(nodes, overrides=parse_ratings(["sf-nodes:10=1800"])).value == 1800
    for bad, message in [
        ("sf-skill:21", "Skill Level must be 0..20"),
        ("sf-nodes:0", "node count must be >= 1"),
        ("sf-bogus:3", "unknown anchor"),
        ("no/such/dir", "not a checkpoint"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_anchor(bad)
    with pytest.raises(ValueError, match="listed twice"):
        parse_anchors("random,random")
    with pytest.raises(ValueError, match="expected ANCHOR=RATING"):
        parse_ratings(["sf-nodes:10"])


def test_uci_elo_range_is_read_from_the_engine(engine_info):
    low = parse_anchor(f"sf-elo:{engine_info.elo_min - 30}")
    with pytest.raises(ValueError, match=rf"accepts UCI_Elo {engine_info.elo_min}\.\.{engine_info.elo_max} only"):
        check_anchor(low, engine_info)
    check_anchor(parse_anchor(f"sf-elo:{engine_info.elo_min}"), engine_info)


# --------------------------------------------------------------------------------------------
# Games


def test_stockfish_beats_the_random_mover_and_pgns_parse_back(checkpoint):
    settings = settings_for(checkpoint, max_plies=300)
    adjudicator = Adjudicator(settings)
    engine = EngineMover(parse_anchor("sf-nodes:20"))
    results = []
    try:
        for pair, opening in enumerate(OPENINGS):
            for game in (0, 1):
                # The "player" seat holds the random mover, the anchor seat Stockfish at 20 nodes.
                results.append(
                    play_game(task("sf-nodes:20", opening, game, pair), RandomMover(), engine, adjudicator, settings)
                )
    finally:
        engine.close()
        adjudicator.close()
    stockfish_points = sum(1.0 - r.player_points for r in results)
    assert stockfish_points >= 3.5, [(r.result, r.termination) for r in results]
    games = parse_pgns("".join(r.pgn + "\n" for r in results))
    assert len(games) == 4
    for result, game in zip(results, games):
        headers = game.headers
        # Standard Termination values; the specific reason in TerminationDetails.
        assert headers["Result"] == result.result and headers["TerminationDetails"] == result.termination
        assert headers["Termination"] == (
            "adjudication" if result.termination in ("tablebase", "move cap") else "normal"
        )
        assert headers["Round"] == str(result.pair + 1)
        assert headers["Anchor"] == "sf-nodes:20"
        assert headers["AnchorSettings"] == "Stockfish 15.1; Threads=1; Hash=16; nodes=20"
        assert headers["SetUp"] == "1" and headers["FEN"] == OPENINGS[result.pair].fen
        assert headers["OpeningMoves"] == " ".join(OPENINGS[result.pair].moves)
        assert (headers["White"] == "tiny") == (result.game == 0)
        player_colour, anchor_colour = ("White", "Black") if result.game == 0 else ("Black", "White")
        assert headers[f"{player_colour}Source"] == str(checkpoint)
        assert f"{anchor_colour}Source" not in headers  # an engine: its AnchorSettings say what it is
        assert headers["PlayerSettings"].startswith(f"policy {checkpoint}; argmax")
        # Replaying the moves reaches the recorded end.
        board = game.end().board()
        assert len(list(game.mainline_moves())) == result.plies == int(headers["PlyCount"])
        if result.termination == "checkmate":
            assert board.is_checkmate()


@pytest.mark.slow
def test_the_policy_against_the_random_mover_on_two_workers_is_reproducible(checkpoint):
    settings = settings_for(checkpoint, max_plies=40)
    anchors = [parse_anchor("random")]
    tasks = make_tasks(anchors, ["uniform random legal mover"], OPENINGS, pairs=2, seed=3)
    seen = []
    parallel, stopped = run_games(settings, tasks, workers=2, on_result=lambda r: seen.append(r) or False)
    assert not stopped and len(parallel) == len(seen) == 4
    assert [(r.pair, r.game) for r in parallel] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in parallel:
        assert r.termination in {
            "move cap",
            "checkmate",
            "stalemate",
            "threefold repetition",
            "insufficient material",
            "tablebase",
        }
        assert r.plies <= 40
    # Argmax policy + seeded random mover: the same games in one process.
    serial, _ = run_games(settings, tasks, workers=1)
    assert [(r.result, r.plies, r.pgn.split("\n\n", 1)[1]) for r in serial] == [
        (r.result, r.plies, r.pgn.split("\n\n", 1)[1]) for r in parallel
    ]
    assert len(parse_pgns("".join(r.pgn + "\n" for r in parallel))) == 4


def test_early_stop_discards_later_games(checkpoint):
    settings = settings_for(checkpoint, max_plies=6)
    tasks = make_tasks([parse_anchor("random")], ["random"], OPENINGS, pairs=3)
    results, stopped = run_games(settings, tasks, workers=1, on_result=lambda r: r.pair == 1 and r.game == 1)
    assert stopped and [(r.pair, r.game) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]


# --------------------------------------------------------------------------------------------
# Adjudication


def test_tablebase_adjudication_on_small_positions(checkpoint):
    data_file("syzygy")
    adjudicator = Adjudicator(settings_for(checkpoint))
    try:
        assert adjudicator.check(chess.Board("8/8/8/4k3/8/8/8/3QK3 w - - 0 1"), 0) == ("1-0", "tablebase")
        assert adjudicator.check(chess.Board("8/8/8/4k3/8/8/8/3QK3 b - - 0 1"), 0) == ("1-0", "tablebase")
        assert adjudicator.check(chess.Board("3qk3/8/8/8/8/8/8/4K3 w - - 0 1"), 0) == ("0-1", "tablebase")
        assert adjudicator.check(chess.Board("7k/8/7K/7P/8/8/8/8 w - - 0 1"), 0) == (
            "1/2-1/2",
            "tablebase",
        )  # KPvK, rook pawn
        # A win that cannot be converted before the 50-move rule is a draw.
        assert adjudicator.check(chess.Board("8/8/8/4k3/8/8/8/3QK3 w - - 95 80"), 0) == ("1/2-1/2", "tablebase")
        # The rules come first: KBvK is insufficient material, a mate is a mate.
        assert adjudicator.check(chess.Board("8/8/8/4k3/8/8/8/2B1K3 w - - 0 1"), 0) == (
            "1/2-1/2",
            "insufficient material",
        )
        assert adjudicator.check(chess.Board("7k/6Q1/6K1/8/8/8/8/8 b - - 0 1"), 0) == ("1-0", "checkmate")
        # Five pieces: no tablebase verdict, the game goes on.
        assert adjudicator.check(chess.Board("8/8/8/4k3/8/8/3PP3/3QK3 w - - 0 1"), 0) is None
    finally:
        adjudicator.close()


def test_a_game_ends_by_tablebase_after_a_capture(checkpoint):
    # Five pieces (KQR v Kr), no castling rights: Stockfish (White) wins the rook or mates; once
    # four pieces are left the tablebase ends the game.
    opening = Opening(fen="r3k3/8/8/8/8/8/8/Q3K2R w - - 0 1", source="hand")
    settings = settings_for(checkpoint)
    adjudicator = Adjudicator(settings)
    engine = EngineMover(parse_anchor("sf-nodes:50"))
    try:
        result = play_game(task("sf-nodes:50", opening, game=1), RandomMover(), engine, adjudicator, settings)
    finally:
        engine.close()
        adjudicator.close()
    assert result.termination in {"tablebase", "checkmate"}, result.pgn
    assert result.result == "1-0"  # Stockfish has White (game 1: the player seat is Black)


def test_move_cap_and_threefold_rules(checkpoint):
    settings = settings_for(checkpoint, max_plies=10)
    adjudicator = Adjudicator(settings)
    try:
        result = play_game(task("random", OPENINGS[0]), RandomMover(), RandomMover(), adjudicator, settings)
        assert (result.result, result.termination, result.plies) == ("1/2-1/2", "move cap", 10)
        board = chess.Board()
        for move in ["g1f3", "g8f6", "f3g1", "f6g8"] * 2:
            board.push_uci(move)
        assert adjudicator.check(board, 8) == ("1/2-1/2", "threefold repetition")
    finally:
        adjudicator.close()


def test_resignation_when_the_engine_eval_stays_beyond_the_threshold(checkpoint):
    settings = settings_for(checkpoint, syzygy_path=None, resign_cp=300, resign_plies=2, resign_nodes=200)
    adjudicator = Adjudicator(settings)
    try:
        board = chess.Board("rnb1kbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1")  # Black has no queen
        assert adjudicator.check(board, 0) is None  # one ply beyond the threshold
        board.push_uci("g1f3")
        assert adjudicator.check(board, 1) == ("1-0", "resignation (engine eval)")
        adjudicator.new_game()
        assert adjudicator.check(chess.Board(), 0) is None
    finally:
        adjudicator.close()


def test_policy_avoids_threefold_repetition_only_when_winning():
    # White (queen up) has repeated twice; d1d2 now would make the position stand a third time.
    torch.manual_seed(1)
    model = ActionPolicy(PolicyConfig.from_size("tiny"))
    with torch.no_grad():
        model.head.action_bias[move_to_action("d1d2")] = 100.0  # the policy's favourite move
    board = chess.Board("7k/8/8/8/8/8/8/K2Q4 w - - 0 1")
    for move in ["d1d2", "h8g8", "d2d1", "g8h8"] * 2:
        board.push_uci(move)
    mover = PolicyMover(model)
    mover.new_game(None, 0)
    assert mover.repetition_moves(board) == ([chess.Move.from_uci("d1d2")], [])
    assert mover.move(board) != chess.Move.from_uci("d1d2")
    # One cycle shorter: d2d1 repeats nothing itself, but lets Black play g8h8 into a third occurrence.
    allowing = chess.Board("7k/8/8/8/8/8/8/K2Q4 w - - 0 1")
    for move in ["d1d2", "h8g8", "d2d1", "g8h8", "d1d2", "h8g8"]:
        allowing.push_uci(move)
    with torch.no_grad():
        model.head.action_bias[move_to_action("d2d1")] = 200.0
    assert mover.repetition_moves(allowing) == ([], [chess.Move.from_uci("d2d1")])
    assert mover.move(allowing) != chess.Move.from_uci("d2d1")
    assert PolicyMover(model, avoid_repetition=False).move(allowing) == chess.Move.from_uci("d2d1")
    with torch.no_grad():
        model.head.action_bias[move_to_action("d2d1")] = 0.0
    assert PolicyMover(model, avoid_repetition=False).move(board) == chess.Move.from_uci("d1d2")
    # Not winning on material (a rook's worth short of 3 pawns is fine: equal material): it repeats.
    even = chess.Board("7k/7q/8/8/8/8/8/K2Q4 w - - 0 1")
    assert PolicyMover(model).move(even) == chess.Move.from_uci("d1d2")
    # Sampling at a temperature stays legal and is seeded per game.
    sampler = PolicyMover(model, temperature=1.0)
    sampler.new_game(None, 5)
    first = [sampler.move(chess.Board()) for _ in range(5)]
    sampler.new_game(None, 5)
    assert first == [sampler.move(chess.Board()) for _ in range(5)]


def test_policy_mover_with_search_mates_in_one_and_plays_legal_moves(value_checkpoint):
    from chessgrpo.models.policy import load_policy
    from chessgrpo.play.players import search_settings

    mover = PolicyMover.from_checkpoint(value_checkpoint, search=search_settings(200, syzygy_path=str(SYZYGY_DIR)))
    try:
        mover.new_game(None, 0)
        # Untrained network: the rules score Ra8# exactly, so the search finds it.
        assert mover.move(chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")) == chess.Move.from_uci("a1a8")
        assert mover.last_probability is None and mover.last_search is not None and mover.last_search.exact
        board = chess.Board(OPENINGS[0].fen)
        assert board.is_legal(mover.move(board)) and mover.last_search.nodes == 200
    finally:
        mover.close()
    # A search plays deterministically: sampling with it is refused, not silently ignored.
    with pytest.raises(ValueError, match="search plays deterministically"):
        PolicyMover(load_policy(value_checkpoint), temperature=0.5, search=search_settings(8))


# --------------------------------------------------------------------------------------------
# The command


def test_eval_games_command_json_and_pgn(cli, tmp_path, checkpoint):
    openings = tmp_path / "openings.epd"
    openings.write_text("\n".join(o.fen for o in OPENINGS) + "\n")
    pgn = tmp_path / "games.pgn"
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "random,sf-nodes:1",
        "--games",
        "2",
        "--openings",
        str(openings),
        "--workers",
        "1",
        "--pgn",
        str(pgn),
        "--json",
        "max_plies=60",
        f"engine.syzygy_path={SYZYGY_DIR}",
        "anchor_ratings=[sf-nodes:1=1000]",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout)
    assert [row["anchor"] for row in summary["anchors"]] == ["random", "sf-nodes:1"]
    for row in summary["anchors"]:
        assert row["wins"] + row["draws"] + row["losses"] == 2
        assert set(row["score"]) == {"value", "low", "high", "n"} and row["score"]["n"] == 2
        assert sum(row["pentanomial"]) == 1
    assert summary["anchors"][1]["rating"] == 1000
    assert set(summary["elo"]) >= {"value", "low", "high"}
    assert "CCRL" in summary["calibration"]
    games = parse_pgns(pgn.read_text())
    assert len(games) == summary["games_played"] == 4
    assert {g.headers["Anchor"] for g in games} == {"random", "sf-nodes:1"}
    for game in games:  # the player is named by its checkpoint directory, not by a path; the path has its own tag
        player_white = game.headers["White"] == "ckpt"
        assert game.headers["Black" if player_white else "White"] in ("random", "sf-nodes:1")
        assert game.headers["WhiteSource" if player_white else "BlackSource"] == str(checkpoint.resolve())
        assert game.headers["Termination"] in ("normal", "adjudication") and game.headers["TerminationDetails"]
    # One record per colour-swapped pair: `eval compare` pairs two players' games by anchor, pair and opening.
    records = summary["records"]["player"]
    assert len(records) == 2 and {r["pair_id"].split("|")[0] for r in records} == {"random", "sf-nodes:1"}
    row_scores = {row["anchor"]: (row["wins"] + row["draws"] / 2) / 2 for row in summary["anchors"]}
    assert {r["pair_id"].split("|")[0]: r["pair_score"] for r in records} == row_scores
    (tmp_path / "a.json").write_text(json.dumps(summary))
    comparison = compare_files(tmp_path / "a.json", tmp_path / "a.json")
    assert comparison.kind == "games" and comparison.n == 2
    assert {m.metric: m.difference.value for m in comparison.metrics} == {
        "score": 0.0,
        "win_rate": 0.0,
        "stalemate_rate": 0.0,
    }


@pytest.mark.slow
def test_eval_games_command_rejects_bad_input_clearly(cli, tmp_path, checkpoint):
    odd = cli.run("eval", "games", "--checkpoint", str(checkpoint), "--games", "3", cwd=tmp_path)
    assert odd.returncode == 2 and "even" in odd.stderr and "colour-swapped pairs" in odd.stderr
    unknown = cli.run("eval", "games", "--checkpoint", str(checkpoint), "no_such_key=1", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown config key no_such_key" in unknown.stderr
    weak = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "sf-elo:1000",
        "--games",
        "2",
        "--openings",
        str(tmp_path / "missing.epd"),
        cwd=tmp_path,
    )
    assert weak.returncode == 2 and "accepts UCI_Elo" in weak.stderr
    sprt = cli.run("eval", "games", "--checkpoint", str(checkpoint), "--sprt", "0,10", cwd=tmp_path)
    assert sprt.returncode == 2 and "--opponent" in sprt.stderr


def test_eval_games_command_with_a_search_budget_records_it(cli, tmp_path, value_checkpoint):
    openings = tmp_path / "openings.epd"
    openings.write_text(OPENINGS[0].fen + "\n")
    pgn = tmp_path / "games.pgn"
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(value_checkpoint),
        "--anchors",
        "random",
        "--games",
        "2",
        "--search-nodes",
        "16",
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
    assert summary["games_played"] == 2
    assert summary["search"]["nodes"] == 16 and summary["search"]["algorithm"] == "puct"
    assert summary["search"]["syzygy_path"] == str(SYZYGY_DIR)
    assert "puct search, 16 nodes/move, c_puct 1.5, batch 16" in summary["player"]
    games = parse_pgns(pgn.read_text())
    assert len(games) == 2
    for game in games:
        assert game.headers["PlayerSettings"] == summary["player"]
        assert "ckpt (puct 16 nodes)" in (game.headers["White"], game.headers["Black"])
        assert str(value_checkpoint.resolve()) in (game.headers.get("WhiteSource"), game.headers.get("BlackSource"))


def test_eval_games_search_without_a_value_head_fails_before_any_game(cli, tmp_path, checkpoint):
    pgn = tmp_path / "games.pgn"
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "random",
        "--games",
        "2",
        "--search-nodes",
        "8",
        "--openings",
        str(tmp_path / "unused.epd"),
        "--workers",
        "2",
        "--pgn",
        str(pgn),
        cwd=tmp_path,
    )
    assert completed.returncode == 2 and completed.stdout == ""
    [line] = completed.stderr.strip().splitlines()
    assert line.startswith(f"chessgrpo: checkpoint {checkpoint}: search needs a policy with a value head"), line
    assert not pgn.exists()
    sampled = cli.run(
        "eval", "games", "--checkpoint", str(checkpoint), "--search-nodes", "8", "--temperature", "1", cwd=tmp_path
    )
    assert sampled.returncode == 2 and "search plays deterministically" in sampled.stderr


def test_sprt_between_two_checkpoints_stops_when_decided(cli, tmp_path, checkpoint):
    # The same weights on both sides: every colour-swapped pair scores exactly 1, far from elo0 = 200.
    pgn = tmp_path / "sprt.pgn"
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--sprt",
        "200,400",
        "--opponent",
        str(checkpoint),
        "--games",
        "40",
        "--workers",
        "1",
        "--pgn",
        str(pgn),
        "--json",
        "max_plies=16",
        "engine.cache=false",
        f"engine.syzygy_path={SYZYGY_DIR}",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout)
    assert summary["sprt"]["decision"] == "H0" and summary["stopped_early"]
    assert summary["games_played"] < 40 and summary["games_played"] % 2 == 0
    assert summary["sprt"]["pentanomial"] == [0, 0, summary["games_played"] // 2, 0, 0]
    assert summary["sprt"]["llr"] <= summary["sprt"]["lower"]
    games = parse_pgns(pgn.read_text())
    assert len(games) == summary["games_played"]
    for game in games:  # the same run on both seats: named apart, both paths kept
        assert {game.headers["White"], game.headers["Black"]} == {"ckpt", "ckpt (anchor)"}
        assert game.headers["WhiteSource"] == game.headers["BlackSource"] == str(checkpoint.resolve())


def test_pgn_termination_values_are_standard():
    standard = {
        "abandoned",
        "adjudication",
        "death",
        "emergency",
        "normal",
        "rules infraction",
        "time forfeit",
        "unterminated",
    }
    rules = [
        "checkmate",
        "stalemate",
        "insufficient material",
        "threefold repetition",
        "fifty-move rule",
        "seventy-five-move rule",
        "fivefold repetition",
    ]
    assert {reason: pgn_termination(reason) for reason in rules} == dict.fromkeys(rules, "normal")
    for reason in ("tablebase", "move cap", "resignation (engine eval)"):
        assert pgn_termination(reason) == "adjudication"
    assert pgn_termination("illegal move") == "rules infraction" and pgn_termination("time forfeit") == "time forfeit"
    assert {pgn_termination(reason) for reason in [*rules, "tablebase", "move cap"]} <= standard


def test_checkpoint_names_come_from_the_run_not_the_path(tmp_path, checkpoint):
    import shutil

    import yaml

    run = tmp_path / "some" / "deep" / "dir_name"
    step = run / "checkpoints" / "step_000800"
    shutil.copytree(checkpoint, step)
    (run / "config.yaml").write_text(yaml.safe_dump({"run": {"name": "grpo-tiny", "out_dir": str(tmp_path)}}))
    assert checkpoint_name(str(step)) == "grpo-tiny step 800"
    assert checkpoint_name(str(run)) == "grpo-tiny"
    other = tmp_path / "no_config_run"
    shutil.copytree(checkpoint, other / "checkpoints" / "step_000010")
    assert checkpoint_name(str(other / "checkpoints" / "step_000010")) == "no_config_run step 10"
    assert checkpoint_name(str(checkpoint)) == "ckpt"  # a checkpoint outside any run: its directory
    # A checkpoint anchor plays under its run's name in the PGN, its directory in a Source tag; the
    # tablebase ending is a standard "adjudication" with the reason kept beside it.
    anchor = parse_anchor(str(step))
    board = chess.Board("8/8/8/4k3/8/8/8/3QK3 w - - 0 1")
    game_task = GameTask(0, anchor, "checkpoint", 0, 1, Opening(fen=board.fen(), source="hand"), 1)
    settings = settings_for(checkpoint, player_name=checkpoint_name(str(checkpoint)))
    adjudicator = Adjudicator(settings)
    try:
        result = play_game(game_task, RandomMover(), RandomMover(), adjudicator, settings)
    finally:
        adjudicator.close()
    [game] = parse_pgns(result.pgn)
    headers = game.headers
    assert (headers["White"], headers["Black"]) == ("grpo-tiny step 800", "ckpt")
    assert headers["WhiteSource"] == str(step.resolve()) and headers["BlackSource"] == str(checkpoint)
    assert (headers["Termination"], headers["TerminationDetails"], headers["Result"]) == (
        "adjudication",
        "tablebase",
        "1-0",
    )
    assert headers["Anchor"] == str(step)


def test_configs_games_yaml_matches_the_defaults():
    from pathlib import Path

    from chessgrpo.config import load_config, to_dict
    from chessgrpo.play.match import GamesConfig

    path = Path(__file__).resolve().parents[1] / "configs" / "games.yaml"
    assert to_dict(load_config(GamesConfig, path)) == to_dict(GamesConfig())


def test_position_counts_agree_with_python_chess_repetition():
    import random

    from chessgrpo.board.repetitions import position_counts, position_key

    rng = random.Random(0)
    board = chess.Board("4k3/8/8/8/8/8/8/R3K2R w KQ - 0 1")  # few moves: repetitions are common
    for _ in range(120):
        if board.is_game_over():
            break
        board.push(rng.choice(list(board.legal_moves)))
        counts = position_counts(board)
        assert (counts[position_key(board)] >= 3) == board.is_repetition(3)
        assert (counts[position_key(board)] >= 2) == board.is_repetition(2)


def test_an_anchor_engine_killed_mid_game_is_replaced_and_keeps_playing(caplog):
    import os
    import signal

    from chessgrpo.engine import RetryPolicy

    engine = EngineMover(parse_anchor("sf-nodes:50"), retry=RetryPolicy(retries_per_position=2, backoff_s=0.01))
    board = chess.Board()
    try:
        first = engine.move(board)
        os.kill(engine._engine.transport.get_pid(), signal.SIGKILL)  # the process behind python-chess's client
        again = engine.move(board)
    finally:
        engine.close()
    assert board.is_legal(first) and board.is_legal(again)
    assert "replacing it" in caplog.text  # the dead process was noticed and replaced


def _children(pid: int) -> list[int]:
    listed = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in listed]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_workers_leave_when_eval_games_is_killed(cli, tmp_path, value_checkpoint):
    """kill -9 of `eval games` runs no cleanup in the parent: its workers must notice and exit
    rather than play every queued game (found when a long ladder run was stopped with SIGTERM)."""
    openings = tmp_path / "openings.epd"
    openings.write_text(OPENINGS[0].fen + "\n")
    parent = cli.start(
        "eval",
        "games",
        "--checkpoint",
        str(value_checkpoint),
        "--anchors",
        "random",
        "--games",
        "400",
        "--search-nodes",
        "16",
        "--openings",
        str(openings),
        "--workers",
        "2",
        "--pgn",
        str(tmp_path / "g.pgn"),
        "max_plies=200",
        f"engine.syzygy_path={SYZYGY_DIR}",
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 2:  # the spawned workers (and a resource tracker)
            time.sleep(0.5)
            workers = _children(parent.pid)  # the two workers (and multiprocessing's resource tracker)
        assert len(workers) >= 2, "the game workers did not start"
        time.sleep(3)  # they are playing
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 60  # a worker checks its parent before every move
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.5)
        left = {p: open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:120] for p in workers if _alive(p)}
        assert not left, f"processes of eval games kept running after it was killed: {left}"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _children(parent.pid):
            os.kill(pid, 9)


# --------------------------------------------------------------------------------------------
# The journal: an interrupted run resumes


def _result_for(task: GameTask, points: str = "1-0") -> GameResult:
    return GameResult(
        task.anchor_index,
        task.anchor.text,
        task.pair,
        task.game,
        task.player_white,
        points,
        "checkmate",
        40,
        1.5,
        f'[Event "{task.pair}/{task.game}"]\n\n1-0\n',
        task.opening.fen,
    )


def test_journal_keys_follow_settings_weights_and_openings(tmp_path, checkpoint, value_checkpoint):
    from chessgrpo.play.game_journal import GameJournal, remaining

    anchors = [parse_anchor("random"), parse_anchor(str(value_checkpoint))]
    tasks = make_tasks(anchors, ["random", "checkpoint"], OPENINGS, pairs=2)
    path = tmp_path / "games.pgn.journal.jsonl"
    journal = GameJournal(path, settings_for(checkpoint), tasks)
    for task in tasks[:3]:
        journal.append(_result_for(task))
    journal.close()
    with open(path, "a") as handle:  # a crash while writing leaves half a line
        handle.write('{"key": "abc", "result": {"anchor_ind')
    again = GameJournal(path, settings_for(checkpoint), tasks)
    loaded = again.load()
    assert [(r.anchor_index, r.pair, r.game) for r in loaded] == [(t.anchor_index, t.pair, t.game) for t in tasks[:3]]
    assert loaded == [_result_for(t) for t in tasks[:3]]
    assert remaining(tasks, loaded) == tasks[3:]
    # More games later: the shared pairs are kept.
    more = make_tasks(anchors, ["random", "checkpoint"], OPENINGS, pairs=4)
    assert len(GameJournal(path, settings_for(checkpoint), more).load()) == 3
    # Anything that decides a game changes its key: the player's settings, its weights, the openings.
    assert GameJournal(path, settings_for(checkpoint, max_plies=121), tasks).load() == []
    assert GameJournal(path, settings_for(value_checkpoint), tasks).load() == []
    other_openings = make_tasks(anchors, ["random", "checkpoint"], OPENINGS[::-1], pairs=2)
    assert GameJournal(path, settings_for(checkpoint), other_openings).load() == []
    retrained = tmp_path / "retrained"
    torch.manual_seed(1)
    save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), retrained)
    retrained_tasks = make_tasks([parse_anchor("random")], ["random"], OPENINGS, pairs=2)
    first = GameJournal(tmp_path / "r.jsonl", settings_for(retrained), retrained_tasks)
    first.append(_result_for(retrained_tasks[0]))
    first.close()
    torch.manual_seed(2)
    save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), retrained)  # same path, new weights
    assert GameJournal(tmp_path / "r.jsonl", settings_for(retrained), retrained_tasks).load() == []


@pytest.mark.slow
def test_eval_games_killed_then_rerun_plays_only_the_missing_games(cli, tmp_path, value_checkpoint):
    openings = tmp_path / "openings.epd"
    openings.write_text("\n".join(o.fen for o in OPENINGS) + "\n")
    pgn = tmp_path / "g.pgn"
    journal = tmp_path / "g.pgn.journal.jsonl"
    common = [
        "eval",
        "games",
        "--checkpoint",
        str(value_checkpoint),
        "--anchors",
        "random",
        "--search-nodes",
        "16",
        "--openings",
        str(openings),
        "--workers",
        "1",
        "--pgn",
        str(pgn),
        "max_plies=60",
        f"engine.syzygy_path={SYZYGY_DIR}",
    ]
    first = cli.start(*common, "--games", "400", cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not journal.exists() or journal.read_text().count("\n") < 3):
            time.sleep(0.2)
        first.kill()
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    assert not pgn.exists(), "a killed run writes no PGN: only its journal holds its games"
    journaled = [json.loads(line)["result"] for line in journal.read_text().splitlines() if line.strip()]
    assert len(journaled) >= 3
    done = min(len(journaled), 8)
    rerun = cli.run(*common, "--games", "8", "--json", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming: {done} of 8 games already played" in rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["games_played"] == 8 and summary["games_resumed"] == done
    games = pgn.read_text()
    assert len(parse_pgns(games)) == 8
    for result in journaled[:done]:  # the resumed games are in the PGN as they were played
        assert result["pgn"] in games
    assert not journal.exists(), "a finished run removes its journal"
    fresh = cli.run(*common, "--games", "2", "--json", "resume=false", cwd=tmp_path)
    assert fresh.returncode == 0 and json.loads(fresh.stdout)["games_resumed"] == 0
