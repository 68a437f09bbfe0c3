"""Engines other than Stockfish: a Debian engine as an `eval games` opponent (20 real games), the
``uci:`` anchor grammar and engines files, `doctor` telling Stockfish from other engines, and a
deliberately misbehaving fake UCI engine (tests/fake_engine.py): each fault is one clear error
naming the engine and what went wrong, within its timeout.

The Debian engine is Ethereal (`ethereal-chess`): it obeys depth limits and answers in
milliseconds (Glaurung 2.2 and Toga II overshoot or ignore node limits, Fairy-Max speaks xboard
only). The set-up installs it with apt-get when it is missing and we are root; otherwise the
tests that need it are skipped, saying so.

Cross-cutting: engine/uci.py and engine/pool.py, play/anchors.py, play/anchor_checks.py and
play/movers.py, and the `eval games` and `doctor` commands.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import chess
import chess.pgn
import pytest
import torch

from chessgrpo.engine import EngineError, EngineNotFoundError, EnginePool, RetryPolicy
from chessgrpo.engine.uci import EngineUnsupported, UciProcess, parse_option
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.play.anchor_checks import prepare_anchors, probe_anchor
from chessgrpo.play.anchors import anchor_rating, load_engines, parse_anchor, parse_anchors
from chessgrpo.play.movers import EngineMover
from helpers import SYZYGY_DIR

FAKE_ENGINE = Path(__file__).resolve().parent / "fake_engine.py"
DEBIAN_PACKAGE = "ethereal-chess"
DEBIAN_ENGINE_NAME = "Ethereal 12.00"
GAMES_DIRS = "/usr/games:/usr/local/games"
OPENINGS = [  # ten balanced short openings (after 1-2 plies), cycled by pair
    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/2P5/8/PP1PPPPP/RNBQKBNR b KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/8/5N2/PPPPPPPP/RNBQKB1R b KQkq - 1 1",
    "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
    "rnbqkbnr/pp1ppppp/8/2p5/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
    "rnbqkbnr/ppp1pppp/8/3p4/3P4/8/PPP1PPPP/RNBQKBNR w KQkq - 0 2",
    "rnbqkb1r/pppppppp/5n2/8/3P4/8/PPP1PPPP/RNBQKBNR w KQkq - 1 2",
    "rnbqkbnr/pppp1ppp/4p3/8/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
    "rnbqkbnr/pp1ppppp/2p5/8/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
]
START = chess.STARTING_FEN
MIDDLEGAME = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"


# --------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def debian_engine() -> Path:
    """/usr/games/ethereal-chess, installed with apt-get when missing and we are root; else skip."""
    found = shutil.which(DEBIAN_PACKAGE, path=GAMES_DIRS) or shutil.which(DEBIAN_PACKAGE)
    if found is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        install = ["apt-get", "install", "-y", "--no-install-recommends", DEBIAN_PACKAGE]
        for commands in ([install], [["apt-get", "update"], install]):  # stale package lists: update once
            try:
                for command in commands:
                    subprocess.run(
                        command,
                        capture_output=True,
                        timeout=300,
                        check=True,
                        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                    )
                break
            except (OSError, subprocess.SubprocessError):
                continue
        found = shutil.which(DEBIAN_PACKAGE, path=GAMES_DIRS)
    if found is None:
        pytest.skip(
            f"the non-Stockfish UCI engine {DEBIAN_PACKAGE!r} is not installed and could not be installed "
            f"(needs root and apt-get): run `sudo apt-get install {DEBIAN_PACKAGE}` to run these tests"
        )
    return Path(found)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_policy(ActionPolicy(PolicyConfig.from_size("tiny")), tmp_path_factory.mktemp("tiny") / "ckpt")


def fake_engine(directory: Path, mode: str, *flags: str) -> Path:
    """An executable that runs tests/fake_engine.py in `mode` (a binary path, as engines are given)."""
    script = directory / f"fake-{mode}{'-'.join(('',) + tuple(f.strip('-') for f in flags))}"
    arguments = " ".join(shlex.quote(a) for a in ("--mode", mode, *flags))
    script.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_ENGINE))} {arguments} "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


TIMEOUT_S = 3.0  # a Python fake engine starts in ~0.3 s; generous on a loaded machine
FAST_RETRY = RetryPolicy(retries_per_position=1, startup_attempts=2, backoff_s=0.01, max_backoff_s=0.05)


def parse_pgns(text: str) -> list[chess.pgn.Game]:
    handle, games = io.StringIO(text), []
    while (game := chess.pgn.read_game(handle)) is not None:
        assert not game.errors, game.errors
        games.append(game)
    return games


# --------------------------------------------------------------------------------------------
# A Debian engine as an opponent


@pytest.mark.slow
def test_twenty_games_against_a_debian_engine_from_an_engines_file(cli, tmp_path, checkpoint, debian_engine):
    engines = tmp_path / "engines.yaml"
    engines.write_text(
        f"engines:\n"
        f"  - name: ethereal-d3\n"
        f"    command: {DEBIAN_PACKAGE}\n"
        f"    options: {{Hash: 8}}\n"
        f"    limit: {{depth: 3}}\n"
        f"    elo: 2000\n"
    )
    openings = tmp_path / "openings.epd"
    openings.write_text("\n".join(OPENINGS) + "\n")
    pgn, output = tmp_path / "games.pgn", tmp_path / "summary.json"
    started = time.monotonic()
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--engines",
        str(engines),
        "--anchors",
        "ethereal-d3",
        "--games",
        "20",
        "--openings",
        str(openings),
        "--workers",
        "1",
        "--pgn",
        str(pgn),
        "--json",
        "max_plies=200",
        f"engine.syzygy_path={SYZYGY_DIR}",
        f"output={output}",
        cwd=tmp_path,
        timeout=600,
    )
    seconds = time.monotonic() - started
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout)
    [row] = summary["anchors"]
    print(
        f"\n20 games, tiny untrained policy vs {row['engine']} (depth 3) in {seconds:.0f} s: "
        f"W {row['wins']} D {row['draws']} L {row['losses']}, score {row['score']['value']:.3f} "
        f"[{row['score']['low']:.3f}, {row['score']['high']:.3f}], terminations {row['terminations']}, "
        f"Elo {summary['elo']['value']}"
    )
    assert row["anchor"] == "ethereal-d3" and row["engine"] == DEBIAN_ENGINE_NAME
    assert row["wins"] + row["draws"] + row["losses"] == summary["games_played"] == 20
    assert sum(row["pentanomial"]) == 10
    assert row["rating"] == 2000 and "engines file" in row["rating_source"]
    assert row["settings"] == f"{DEBIAN_ENGINE_NAME}; {debian_engine}; Threads=1; Hash=8; depth=3"
    assert summary["elo"] is not None and summary["elo"]["n"] == 20
    assert row["score"]["value"] < 0.5  # an untrained policy against a real engine
    games = parse_pgns(pgn.read_text())
    assert len(games) == 20
    for game in games:
        assert "ethereal-d3" in (game.headers["White"], game.headers["Black"])
        assert game.headers["Anchor"] == "ethereal-d3" and game.headers["AnchorSettings"] == row["settings"]
        assert game.headers["Result"] in ("1-0", "0-1", "1/2-1/2")
    assert json.loads(output.read_text())["config"]["engines"] == str(engines)


def test_inline_uci_anchor_is_named_by_its_engine_and_keeps_its_settings(cli, tmp_path, checkpoint, debian_engine):
    openings = tmp_path / "openings.epd"
    openings.write_text(OPENINGS[0] + "\n")
    pgn = tmp_path / "games.pgn"
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        f"random,uci:{DEBIAN_PACKAGE}:depth=1:option.Hash=4:elo=1900",
        "--games",
        "2",
        "--openings",
        str(openings),
        "--workers",
        "1",
        "--pgn",
        str(pgn),
        "--json",
        "max_plies=120",
        f"engine.syzygy_path={SYZYGY_DIR}",
        "anchor_ratings=[random=0]",
        cwd=tmp_path,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout)
    engine_row = summary["anchors"][1]
    assert engine_row["anchor"] == DEBIAN_ENGINE_NAME and engine_row["rating"] == 1900
    assert engine_row["settings"] == f"{DEBIAN_ENGINE_NAME}; {debian_engine}; Threads=1; Hash=4; depth=1"
    names = {name for game in parse_pgns(pgn.read_text()) for name in (game.headers["White"], game.headers["Black"])}
    assert DEBIAN_ENGINE_NAME in names and "random" in names


def test_the_pool_runs_a_non_stockfish_engine_without_crashing_it(debian_engine):
    # Ethereal 12 aborts on Hash 1 (below its minimum 2): the pool clamps Hash to the engine's range.
    with EnginePool(path=debian_engine, processes=1, hash_mb=1, depth=3, timeout_s=10, retry=FAST_RETRY) as pool:
        assert pool.engine_name == DEBIAN_ENGINE_NAME and not pool.is_stockfish
        [opening, mate] = pool.evaluate([MIDDLEGAME, "r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1"])
        assert opening.cp is not None and chess.Board(MIDDLEGAME).is_legal(chess.Move.from_uci(opening.best_move))
        assert mate.mate == 1 and mate.best_move == "a8a1"
        assert pool.stats.engine_failures == 0


@pytest.mark.slow
def test_doctor_says_when_engine_path_is_not_stockfish(cli, debian_engine, tmp_path):
    result = cli.run("doctor", f"engine.path={debian_engine}", "engine.syzygy_path=null", timeout=600)
    assert result.returncode == 1
    assert f"{DEBIAN_ENGINE_NAME} ({debian_engine})" in result.stdout
    assert f"NOT STOCKFISH: engine.path runs {DEBIAN_ENGINE_NAME}" in result.stdout
    assert "need Stockfish's MultiPV and node limits" in result.stdout and "uci:" in result.stdout
    assert "all required components found" not in result.stdout
    # The fake engine, which has no MultiPV: said too.
    fake = fake_engine(tmp_path, "ok", "--no-multipv")
    result = cli.run("doctor", f"engine.path={fake}", "engine.syzygy_path=null", timeout=600)
    assert result.returncode == 1 and "FakeEngine 1.0" in result.stdout and "MultiPV NO" in result.stdout
    assert "NOT STOCKFISH" in result.stdout
    # Stockfish itself passes, with its checks listed.
    result = cli.run("doctor", "engine.syzygy_path=null", timeout=600)
    assert (
        result.returncode == 0
        and "Stockfish 15.1" in result.stdout
        and "MultiPV yes; go nodes 1000: stopped" in result.stdout
    )


@pytest.mark.slow
def test_stockfish_anchors_and_the_opening_suite_refuse_another_engine_up_front(
    cli, tmp_path, checkpoint, debian_engine
):
    skill = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "sf-skill:0",
        "--games",
        "2",
        "--openings",
        str(tmp_path / "unused.epd"),
        f"engine.path={debian_engine}",
        cwd=tmp_path,
        timeout=600,
    )
    assert skill.returncode == 2
    assert f"anchor 'sf-skill:0' plays Stockfish, but engine.path is {DEBIAN_ENGINE_NAME}" in skill.stderr
    suite = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "random",
        "--games",
        "2",
        f"engine.path={debian_engine}",
        cwd=tmp_path,
        timeout=600,
    )
    assert suite.returncode == 2 and "not Stockfish: the generated opening suite" in suite.stderr
    assert "--openings FILE" in suite.stderr
    # The example: an engine name that is not defined anywhere says what is accepted.
    unknown = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        "fairymax",
        "--games",
        "2",
        cwd=tmp_path,
        timeout=600,
    )
    assert unknown.returncode == 2 and "unknown anchor 'fairymax'" in unknown.stderr and "uci:PATH" in unknown.stderr


# --------------------------------------------------------------------------------------------
# The anchor grammar and engines files


def test_uci_anchor_grammar(tmp_path):
    fake = fake_engine(tmp_path, "ok")
    spec = parse_anchor(f"uci:{fake}", nodes=700)
    assert spec.kind == "uci" and spec.is_engine and not spec.is_stockfish
    assert spec.engine.command == (str(fake),) and spec.engine.nodes == 700 and spec.text == f"uci:{fake}"
    assert parse_anchor(f"uci:{fake}", depth=5).engine.depth == 5  # --anchor-depth is the default limit too
    full = parse_anchor(f"uci:{fake}:movetime=50:option.Skill=3:option.Hash=8:name=fake:elo=1234.5")
    assert (
        full.text == "fake"
        and full.given == f"uci:{fake}:movetime=50:option.Skill=3:option.Hash=8:name=fake:elo=1234.5"
    )
    assert full.engine.movetime_ms == 50 and full.engine.nodes is None and full.limit() == chess.engine.Limit(time=0.05)
    assert full.engine.options == (("Skill", "3"), ("Hash", "8"))
    assert anchor_rating(full).value == 1234.5 and "the anchor" in anchor_rating(full).source
    assert anchor_rating(parse_anchor(f"uci:{fake}")).value is None
    assert anchor_rating(full, overrides={"fake": 1000.0}).value == 1000.0
    for bad, message in [
        (f"uci:{fake}:nodes=10:depth=3", "give one limit"),
        (f"uci:{fake}:nodes=0", "must be a positive integer"),
        (f"uci:{fake}:depth=x", "must be a positive integer"),
        (f"uci:{fake}:ponder=1", "is not KEY=VALUE"),
        (f"uci:{fake}:option.MultiPV=3", "set by the game runner"),
        (f"uci:{fake}:name=random", "not usable"),
        (f"uci:{fake}:elo=strong", "elo must be a number"),
        ("uci:", "no engine path"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_anchor(bad)
    with pytest.raises(EngineNotFoundError, match="not found on PATH or in /usr/games"):
        parse_anchor("uci:no-such-chess-engine")
    with pytest.raises(EngineNotFoundError, match="does not exist or is not executable"):
        parse_anchor(f"uci:{tmp_path / 'missing'}:depth=2")
    with pytest.raises(ValueError, match="listed twice"):
        parse_anchors(f"uci:{fake}:name=a,uci:{fake}:name=a")


def test_engines_file_entries_and_errors(tmp_path):
    fake = fake_engine(tmp_path, "ok")
    good = tmp_path / "engines.yaml"
    good.write_text(
        "engines:\n"
        f"  - name: fake fast\n    command: ./{fake.name}\n    args: [--name, Fast Fake]\n    limit: {{nodes: 50}}\n"
        f"  - name: fake slow\n    command: [{fake}]\n    options: {{Skill: 2, Hash: 4}}\n    limit: {{movetime: 20}}\n"
        "    elo: 1500\n    timeout_s: 7\n"
        f"  - name: fake default\n    command: {fake}\n"
    )
    engines = load_engines(good, nodes=300, timeout_s=9, retry=FAST_RETRY)
    assert list(engines) == ["fake fast", "fake slow", "fake default"]
    fast, slow, default = engines.values()
    assert fast.command == (str(fake), "--name", "Fast Fake") and fast.nodes == 50 and fast.timeout_s == 9
    assert (
        slow.options == (("Skill", "2"), ("Hash", "4"))
        and slow.movetime_ms == 20
        and slow.elo == 1500
        and slow.timeout_s == 7
    )
    assert default.nodes == 300 and default.retry == FAST_RETRY
    specs = parse_anchors("fake fast,fake slow", engines=engines)
    assert [s.text for s in specs] == ["fake fast", "fake slow"]
    prepared = prepare_anchors(specs)
    assert [s.engine.id_name for s in prepared] == ["Fast Fake", "FakeEngine 1.0"]
    assert dict(prepared[1].engine.applied) == {"Threads": "1", "Hash": "4", "Skill": "2"}
    assert anchor_rating(prepared[1]).value == 1500
    for text, message in [
        ("engines: []\n", "non-empty list"),
        ("- name: x\n", "one key, engines"),
        (f"engines:\n  - name: a\n    command: {fake}\n    colour: white\n", "unknown key 'colour'"),
        (f"engines:\n  - command: {fake}\n", "name is required"),
        (f"engines:\n  - name: a\n    command: {fake}\n  - name: a\n    command: {fake}\n", "used twice"),
        (f"engines:\n  - name: a\n    command: {fake}\n    limit: {{nodes: 5, depth: 2}}\n", "give one limit"),
        (f"engines:\n  - name: a\n    command: {fake}\n    limit: {{time: 5}}\n", "unknown limit 'time'"),
        (f"engines:\n  - name: sf-x\n    command: {fake}\n", "not usable"),
        ("engines: [\n", "not valid YAML"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_engines(bad)
    bad.write_text("engines:\n  - name: a\n    command: ./nothing-here\n")
    with pytest.raises(EngineNotFoundError, match="engine 'a'.*does not exist"):
        load_engines(bad)
    # Two unnamed anchors of the same engine get their limits added to the id name.
    twins = prepare_anchors(parse_anchors(f"uci:{fake}:nodes=10,uci:{fake}:depth=2"))
    assert [s.text for s in twins] == ["FakeEngine 1.0 nodes=10", "FakeEngine 1.0 depth=2"]


def test_handshake_reads_options_and_sets_only_what_the_engine_has():
    option = parse_option("option name Clear Hash type button")
    assert option.name == "Clear Hash" and option.type == "button"
    option = parse_option("option name SyzygyPath type string default <empty>")
    assert option.default == "<empty>" and option.value_text("/x y") == "/x y"
    option = parse_option("option name Style type combo default Normal var Solid var Normal var Risky Play")
    assert option.vars == ("Solid", "Normal", "Risky Play") and option.value_text("risky play") == "Risky Play"
    spin = parse_option("option name Hash type spin default 16 min 2 max 65536")
    assert (spin.min, spin.max, spin.clamp(1), spin.clamp(10**6)) == (2, 65536, 2, 65536)
    with pytest.raises(ValueError, match="must be in 2..65536"):
        spin.value_text(1)
    with pytest.raises(ValueError, match="spans lines"):
        spin.value_text("16\nquit")
    assert parse_option("option name Broken") is None


# --------------------------------------------------------------------------------------------
# The misbehaving fake engine: the pool


def fake_pool(path: Path, **kwargs) -> EnginePool:
    settings = dict(processes=1, nodes=100, timeout_s=TIMEOUT_S, retry=FAST_RETRY, cache_path=None)
    settings.update(kwargs)
    return EnginePool(path=path, **settings)


@pytest.mark.parametrize(
    "mode, says",
    [
        ("garbage-bestmove", "answered `bestmove xyzzy`, which is not a UCI move"),
        ("illegal-bestmove", "answered `bestmove e2e5`, an illegal move in this position"),
        ("none-bestmove", "answered `bestmove (none)` in a position with legal moves"),
        ("null-bestmove", "answered `bestmove 0000` in a position with legal moves"),
        ("no-score", "sent no usable `info ... score` line"),
        ("exit", "exited (code 3)"),
        ("hang", "did not answer in time"),
    ],
)
def test_pool_reports_each_fault_of_a_misbehaving_engine_clearly(tmp_path, mode, says):
    fen = MIDDLEGAME
    with fake_pool(fake_engine(tmp_path, mode)) as pool:
        started = time.monotonic()
        with pytest.raises(EngineError) as raised:
            pool.evaluate([fen])
        elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "FakeEngine 1.0" in message and fen.rsplit(" ", 2)[0] in message and "failed 2 times" in message
    assert says in message, message
    # Two attempts, each within its deadline (a hang costs TIMEOUT_S each), plus restarts.
    assert elapsed < 2 * TIMEOUT_S + 15, elapsed
    assert pool.stats.failures == 1 and pool.stats.retries == 1


def test_pool_without_uciok_is_one_error_after_its_start_up_attempts(tmp_path):
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        fake_pool(fake_engine(tmp_path, "no-uciok"), timeout_s=1.0)
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "could not be started in 2 attempts" in message and "did not answer `uci` with `uciok` within 1 s" in message
    assert "is it a UCI engine?" in message
    assert elapsed < 2 * 1.0 + 10, elapsed


def test_a_hung_engine_stops_the_batch_after_one_position_not_after_every_one(tmp_path):
    # The engine never completed a search: once one position has used its retries, the searches
    # still queued fail at once with that error instead of each waiting out its own timeouts.
    fens = [board.fen() for board in _positions(8)]
    with fake_pool(fake_engine(tmp_path, "hang"), timeout_s=1.0) as pool:
        started = time.monotonic()
        with pytest.raises(EngineError, match="did not answer in time"):
            pool.evaluate(fens)
        elapsed = time.monotonic() - started
    assert elapsed < 2 * 1.0 + 10, elapsed  # not 8 positions x 2 attempts x 1 s
    assert pool.stats.engine_failures == 2


def test_an_ignored_node_limit_is_one_unretried_error(tmp_path):
    with fake_pool(fake_engine(tmp_path, "ignore-nodes"), timeout_s=30) as pool:
        started = time.monotonic()
        with pytest.raises(EngineUnsupported) as raised:
            pool.evaluate([MIDDLEGAME, START])
        elapsed = time.monotonic() - started
    assert "ignores the node limit: asked for `go nodes 100`" in str(raised.value) and "FakeEngine 1.0" in str(
        raised.value
    )
    assert elapsed < 10 and pool.stats.retries == 0


def test_multipv_needs_an_engine_with_multipv(tmp_path):
    with fake_pool(fake_engine(tmp_path, "ok", "--no-multipv")) as pool:
        assert pool.evaluate([MIDDLEGAME])[0].best_move is not None  # single-line searches work
        with pytest.raises(EngineUnsupported, match="has no MultiPV option.*need Stockfish"):
            pool.analyse(MIDDLEGAME, multipv=3)
        assert pool.stats.engine_failures == 0
    with fake_pool(fake_engine(tmp_path, "no-pv")) as pool:  # info lines without pv are fine
        evaluation = pool.evaluate([MIDDLEGAME])[0]
        assert evaluation.cp == 12 and evaluation.pv == () and evaluation.best_move is not None


def test_uci_process_sets_only_advertised_options(tmp_path):
    engine = UciProcess(fake_engine(tmp_path, "ok"), threads=8, hash_mb=1000, options={"skill": 3})
    try:
        assert engine.name == "FakeEngine 1.0" and not engine.is_stockfish
        assert engine.settings == {"Threads": "4", "Hash": "64", "Skill": "3"}  # clamped; the engine's spelling
    finally:
        engine.quit()
    with pytest.raises(
        EngineUnsupported, match=r"has no UCI option 'Contempt' \(it has: Hash, MultiPV, Skill, Threads\)"
    ):
        UciProcess(fake_engine(tmp_path, "ok"), options={"Contempt": 5})


def _positions(count: int) -> list[chess.Board]:
    from chessgrpo.board import random_playout_positions

    return random_playout_positions(count, seed=7)


# --------------------------------------------------------------------------------------------
# The misbehaving fake engine: an anchor in games


def fake_anchor(directory: Path, mode: str, *settings: str, after: int | None = None):
    flags = ("--after", str(after)) if after else ()
    path = fake_engine(directory, mode, *flags)
    return parse_anchor(":".join([f"uci:{path}", *settings]), nodes=50, timeout_s=TIMEOUT_S, retry=FAST_RETRY)


@pytest.mark.parametrize(
    "mode, says",
    [
        ("garbage-bestmove", "invalid uci: 'xyzzy'"),
        ("illegal-bestmove", "illegal uci: 'e2e5'"),
        ("none-bestmove", "answered `bestmove (none)` in a position with legal moves"),
        ("null-bestmove", "answered `bestmove 0000` in a position with legal moves"),
        ("exit", "engine process died unexpectedly (exit code: 3)"),
        ("hang", "no `bestmove` within 3 s"),
    ],
)
def test_anchor_reports_each_fault_of_a_misbehaving_engine_clearly(tmp_path, mode, says):
    mover = EngineMover(fake_anchor(tmp_path, mode))
    board = chess.Board(MIDDLEGAME)
    started = time.monotonic()
    try:
        with pytest.raises(EngineError) as raised:
            mover.move(board)
    finally:
        mover.close()
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "FakeEngine 1.0" in message and MIDDLEGAME in message and "failed 2 times" in message
    assert says in message, message
    assert elapsed < 2 * TIMEOUT_S + 15, elapsed


def test_anchor_without_uciok_and_with_an_unknown_option_fail_clearly(tmp_path):
    mover = EngineMover(fake_anchor(tmp_path, "no-uciok"))
    started = time.monotonic()
    with pytest.raises(EngineError, match="cannot start anchor .* in 2 attempts: no `uciok` within 3 s"):
        mover.move(chess.Board())
    assert time.monotonic() - started < 2 * TIMEOUT_S + 10
    mover = EngineMover(fake_anchor(tmp_path, "ok", "option.Contempt=5"))
    with pytest.raises(EngineUnsupported, match="has no UCI option 'Contempt'"):
        mover.move(chess.Board())


def test_anchor_needs_no_score_and_recovers_from_a_fault_mid_game(tmp_path, caplog):
    quiet = EngineMover(fake_anchor(tmp_path, "no-score"))
    try:
        board = chess.Board()
        for _ in range(4):
            board.push(quiet.move(board))  # anchors play moves: scores are not needed
    finally:
        quiet.close()
    # Dies on its second search: replaced, and the fresh process answers.
    flaky = EngineMover(fake_anchor(tmp_path, "exit", after=2))
    try:
        board = chess.Board()
        board.push(flaky.move(board))
        board.push(flaky.move(board))
    finally:
        flaky.close()
    assert "replacing it" in caplog.text and "FakeEngine 1.0" in caplog.text


@pytest.mark.parametrize(
    "mode, setting, error, says",
    [
        ("no-uciok", "", EngineError, "did not answer `uci` with `uciok` within 3 s"),
        ("ignore-nodes", "", EngineUnsupported, "ignores the node limit"),
        ("garbage-bestmove", "", EngineError, "answered `bestmove xyzzy` to the start position"),
        ("hang", "", EngineError, "did not answer in time"),
        ("ok", "option.Skill=99", EngineUnsupported, "option 'Skill' must be in 0..20, got 99"),
    ],
)
def test_each_anchor_engine_is_checked_once_before_any_game(tmp_path, mode, setting, error, says):
    spec = fake_anchor(tmp_path, mode, *([setting] if setting else []))
    started = time.monotonic()
    with pytest.raises(error) as raised:
        probe_anchor(spec)
    assert says in str(raised.value) and f"anchor {spec.text!r}" in str(raised.value)
    assert time.monotonic() - started < TIMEOUT_S + 10


def test_eval_games_with_a_broken_engine_is_one_line_before_any_game(cli, tmp_path, checkpoint):
    pgn = tmp_path / "games.pgn"
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--anchors",
        f"random,uci:{fake_engine(tmp_path, 'garbage-bestmove')}",
        "--games",
        "2",
        "--openings",
        str(tmp_path / "unused.epd"),
        "--pgn",
        str(pgn),
        "engine.timeout_s=5",
        cwd=tmp_path,
        timeout=600,
    )
    assert completed.returncode == 1 and completed.stdout == ""
    [line] = completed.stderr.strip().splitlines()
    assert "FakeEngine 1.0" in line and "bestmove xyzzy" in line and "before any game" in line
    assert not pgn.exists()


def test_the_table_says_what_an_engine_anchor_ran_and_warns_when_it_ignored_its_limit(
    cli, tmp_path, checkpoint, debian_engine
):
    """Ethereal 12 answers `go nodes 200` after depth 1 and a handful of nodes: the match says so (the
    row's `ran`, a WARNING line) instead of reporting a result against "Ethereal 12.00" as if at 200 nodes."""
    from chessgrpo.commands.games import format_summary

    openings = tmp_path / "openings.epd"
    openings.write_text(OPENINGS[0] + "\n")
    completed = cli.run(
        "eval",
        "games",
        "--checkpoint",
        str(checkpoint),
        "--games",
        "2",
        "--openings",
        str(openings),
        "--workers",
        "1",
        "--anchors",
        f"sf-nodes:50,uci:{DEBIAN_PACKAGE}:nodes=200,uci:{DEBIAN_PACKAGE}:depth=2",
        "--json",
        "max_plies=40",
        f"engine.syzygy_path={SYZYGY_DIR}",
        "--pgn",
        str(tmp_path / "games.pgn"),
        cwd=tmp_path,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout)
    stockfish, by_nodes, by_depth = (row["ran"] for row in summary["anchors"])
    assert [row["anchor"] for row in summary["anchors"]] == [
        "sf-nodes:50",
        f"{DEBIAN_ENGINE_NAME} nodes=200",
        f"{DEBIAN_ENGINE_NAME} depth=2",
    ]
    assert stockfish["kept"] is True and stockfish["asked"] == "nodes=50" and 25 <= stockfish["nodes_median"] <= 400
    assert by_nodes["kept"] is False and by_nodes["depth_median"] == 1 and by_nodes["nodes_median"] < 50
    assert by_nodes["line"].startswith(f"{DEBIAN_ENGINE_NAME} nodes=200 (asked nodes=200; ran depth 1, ~")
    assert "limit ignored: stopped far below it" in by_nodes["line"] and by_nodes["warning"].startswith("WARNING: ")
    assert by_depth["kept"] is True and by_depth["depth_median"] == 2 and by_depth["warning"] is None
    assert by_nodes["moves"] > 0 and by_nodes["nodes_reported"] == 1.0
    text = format_summary(summary)
    assert text.count("WARNING:") == 1 and "LIMIT IGNORED" in text
    assert f"ran: {DEBIAN_ENGINE_NAME} depth=2 (asked depth=2; ran depth 2" in text
