"""The chess LM as a player (play/lm_player.py, uci/lm.py, models/checkpoint_kind.py) and the commands that play it:
`eval endgame`, `eval games` and `uci` with an LM checkpoint.

Every model is real and tiny, made here: an untrained one (its greedy answers are ill-formed, so every move is
the random fallback) and one taught in a few seconds to answer three positions with fixed P: lines (a legal B:,
an illegal B: that a re-sample fixes 4 times in 9, an illegal B: that nothing fixes), so each way a move is made
is exercised through the LM's own text.
"""

from __future__ import annotations

import io
import json
import sys

import chess
import chess.engine
import chess.pgn
import pytest
import torch

from chessgrpo.data.rookworld_format import PolicyAnswer, format_policy_completion, policy_prompt
from chessgrpo.files import write_manifest
from chessgrpo.models.checkpoint_kind import LM, POLICY, identify_checkpoint, require_policy
from chessgrpo.models.lm import LMModelConfig, build_lm, completion_log_probs, left_pad, right_pad, save_lm
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.play.lm_player import LMMover, LMPlayer, LMPlayerConfig, LMPlayerStats, run_prompt_bos
from chessgrpo.uci.lm import LM_OPTIONS, LMUciEngine
from helpers import SYZYGY_DIR

STARTUP_TIMEOUT_S = 60.0  # torch import on a busy 2-core machine

START = chess.STARTING_FEN
AFTER_E4 = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
BACK_RANK = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"
TAUGHT = {
    # position: [(B:, how many lines)]; every line lists the same M: and E:, so only B: differs.
    START: [("e2e4", 5)],  # legal: played greedily
    AFTER_E4: [("e7e4", 5), ("e7e5", 4)],  # greedy e7e4 is illegal (three squares); a sample gives e7e5 4 times in 9
    BACK_RANK: [("h1h8", 5)],  # illegal (no piece on h1), whatever is sampled: the fallback plays
}
MOVES = {START: ("e2e4", "d2d4"), AFTER_E4: ("e7e5", "d7d5"), BACK_RANK: ("a1a8", "g1f1")}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def untrained_lm(tmp_path_factory):
    """A fresh 1-layer LM with the chess tokenizer: its greedy answers do not parse."""
    lm = build_lm(LMModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=256), seed=0)
    return save_lm(lm, tmp_path_factory.mktemp("untrained") / "lm")


@pytest.fixture(scope="module")
def taught_lm(tmp_path_factory):
    """A 1-layer LM trained (~2-4 s) on the P: lines of `TAUGHT`, the way SFT trains: completion tokens only,
    through the one log-prob function."""
    lm = build_lm(LMModelConfig(n_layer=1, n_embd=64, n_head=2, n_positions=256), seed=0)
    tokenizer = lm.tokenizer
    prompts, completions = [], []
    for fen, answers in TAUGHT.items():
        evals = (1000.0, 0.0) if fen == BACK_RANK else (0.3, 0.2)
        for best, count in answers:
            completion = format_policy_completion(fen, PolicyAnswer(MOVES[fen], evals, best))
            prompts += [tokenizer.encode(policy_prompt(fen))] * count
            completions += [tokenizer.encode(completion) + [tokenizer.eos_token_id]] * count
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.eos_token_id)
    completion_ids, completion_mask = right_pad(completions, tokenizer.eos_token_id)
    optimizer = torch.optim.Adam(lm.model.parameters(), lr=1e-2)
    lm.model.eval()  # no dropout configured; eval mode keeps it that way
    for _ in range(80):
        logp, _ = completion_log_probs(
            lm.model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0
        )
        loss = -logp.sum() / completion_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.8  # the 5:4 split of one token keeps it above 0: ln 9 - 5/9 ln 5 - 4/9 ln 4 per such line
    return save_lm(lm, tmp_path_factory.mktemp("taught") / "lm")


# --------------------------------------------------------------------------------------------
# The player


def test_an_untrained_lm_falls_back_to_legal_moves_reproducibly_and_counts_why(untrained_lm):
    boards = [
        chess.Board(START),
        chess.Board(AFTER_E4),
        chess.Board(BACK_RANK),
        chess.Board("8/8/8/4k3/8/8/4K3/4Q3 w - - 0 1"),
    ]
    player = LMPlayer.from_path(untrained_lm, config=LMPlayerConfig(retries=1, seed=7))
    moves = player.choose(boards)
    assert all(board.is_legal(move) for board, move in zip(boards, moves))
    assert player.last_outcomes == ["fallback"] * 4 and player.last_answers == [None] * 4
    stats = player.stats
    assert stats.moves == 4 and stats.ill_formed + stats.illegal == 4 and stats.fallback == 4 and stats.resampled == 0
    assert player.rates() == {
        "ill_formed": stats.ill_formed / 4,
        "illegal": stats.illegal / 4,
        "resampled": 0.0,
        "fallback": 1.0,
    }
    assert player.stats_line().startswith("LM moves 4: ill-formed ") and player.stats_line().endswith("fallback 100.0%")
    # The same seed plays the same moves; the counters add up over calls.
    again = LMPlayer.from_path(untrained_lm, config=LMPlayerConfig(retries=1, seed=7))
    assert again.choose(boards) == moves
    player.choose(boards[:1])
    assert player.stats.moves == 5 and player.stats.fallback == 5
    # Reseeding restarts the streams: the mover of a game does this with the game's seed.
    mover = LMMover(again)
    mover.new_game("game", 7)
    assert [mover.move(board) for board in boards] == moves
    assert mover.game_stats()["moves"] == 4 and mover.game_stats()["fallback"] == 4


def test_a_taught_lm_plays_its_legal_answer_fixes_an_illegal_one_by_resampling_and_else_falls_back(taught_lm):
    boards = [chess.Board(START), chess.Board(AFTER_E4), chess.Board(BACK_RANK)]
    # Enough re-samples that a 4-in-9 answer turns up (a fixed seed: the same draws every run).
    player = LMPlayer.from_path(taught_lm, config=LMPlayerConfig(retries=12))
    moves = player.choose(boards)
    assert moves[0] == chess.Move.from_uci("e2e4") and moves[1] == chess.Move.from_uci("e7e5")
    assert boards[2].is_legal(moves[2]) and moves[2].uci() != "h1h8"
    assert player.last_outcomes == ["greedy", "resampled", "fallback"]
    assert (
        player.last_answers[0] == PolicyAnswer(("e2e4", "d2d4"), (0.3, 0.2), "e2e4") and player.last_answers[2] is None
    )
    assert player.stats == LMPlayerStats(moves=3, ill_formed=0, illegal=2, resampled=1, fallback=1)
    assert player.rates() == pytest.approx({"ill_formed": 0.0, "illegal": 2 / 3, "resampled": 1 / 3, "fallback": 1 / 3})
    # Without re-samples the illegal greedy answer goes straight to the fallback.
    strict = LMPlayer.from_path(taught_lm, config=LMPlayerConfig(retries=0))
    assert strict.choose(boards[1:2])[0] != chess.Move.from_uci("e7e4") and strict.last_outcomes == ["fallback"]
    # Allowed moves (UCI searchmoves) bound the answer: e2e4 is not among them, so the only allowed move is played.
    only = [chess.Move.from_uci("d2d4")]
    assert player.choose(boards[:1], [only]) == only and player.last_outcomes == ["fallback"]
    with pytest.raises(ValueError, match="no legal"):
        player.choose([chess.Board("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1")])  # stalemate: nothing to play


def test_a_clock_cuts_the_re_samples_and_a_move_it_leaves_no_time_for_is_random_and_counted(taught_lm):
    """`choose`'s should_stop (a UCI go's deadline) is asked before each generation: True before the greedy answer
    plays a random move unasked ("no_time"), True after it ends the re-samples ("fallback"), and the sum of the
    failed greedy answers still adds up."""
    boards = [chess.Board(START), chess.Board(AFTER_E4)]
    player = LMPlayer.from_path(taught_lm, config=LMPlayerConfig(retries=12))
    moves = player.choose(boards, should_stop=lambda: True)
    assert all(board.is_legal(move) for board, move in zip(boards, moves)) and player.last_stopped
    assert player.last_outcomes == ["no_time", "no_time"] and player.last_answers == [None, None]
    assert player.stats == LMPlayerStats(moves=2, no_time=2)
    assert player.stats_line().endswith("fallback 0.0%, no time for an answer 100.0%")
    questions = []  # the greedy answers are asked for, then the clock runs out before the first re-sample
    moves = player.choose(boards, should_stop=lambda: questions.append(1) or len(questions) > 1)
    assert len(questions) == 2 and player.last_stopped
    assert moves[0] == chess.Move.from_uci("e2e4") and player.last_outcomes == ["greedy", "fallback"]
    assert player.stats == LMPlayerStats(moves=4, illegal=1, fallback=1, no_time=2)
    # A clock that never stops changes nothing: the illegal greedy answer is re-sampled as without one.
    moves = player.choose(boards[1:], should_stop=lambda: False)
    assert not player.last_stopped and moves == [chess.Move.from_uci("e7e5")] and player.last_outcomes == ["resampled"]
    assert (
        LMPlayerStats().line() == "LM moves 0: ill-formed 0.0%, illegal 0.0%, fixed by re-sampling 0.0%, fallback 0.0%"
    )


def test_prompt_bos_is_read_from_the_run_that_trained_the_lm(untrained_lm, tmp_path):
    def run_with(config_text: str) -> object:
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        step = run / "checkpoints" / "step_000010"
        step.mkdir(parents=True)
        for file in untrained_lm.iterdir():
            (step / file.name).write_bytes(file.read_bytes())
        write_manifest(step)
        (run / "config.yaml").write_text(config_text)
        return run

    sft = run_with("kind: sft\nprompt_bos: true\n")
    assert run_prompt_bos(sft) and run_prompt_bos(sft / "checkpoints" / "step_000010")
    assert (
        LMPlayer.from_path(sft).prompt_bos
        and not LMPlayer.from_path(sft, config=LMPlayerConfig(prompt_bos=False)).prompt_bos
    )
    assert run_prompt_bos(run_with("kind: rookworld\ntask: {prompt_bos: true}\n"))
    assert not run_prompt_bos(run_with("kind: rookworld\ntask: {prompt_bos: false}\n"))
    assert not run_prompt_bos(untrained_lm)  # a bare save_pretrained directory: no run, no BOS
    mixed = run_with(
        "kind: mixture\ntasks:\n- config: {task: {prompt_bos: true}}\n- config: {task: {prompt_bos: false}}\n"
    )
    with pytest.raises(ValueError, match="disagree on prompt_bos"):
        run_prompt_bos(mixed)
    # With BOS the prompt is one token longer: the player encodes what the run trained on.
    player = LMPlayer.from_path(sft)
    plain = LMPlayer.from_path(untrained_lm)
    prompt = policy_prompt(START)
    assert player.lm.tokenizer.encode(prompt) == [player.lm.tokenizer.bos_token_id, *plain.lm.tokenizer.encode(prompt)]
    assert identify_checkpoint(sft).kind == LM and identify_checkpoint(sft).directory.name == "step_000010"


def test_the_kind_of_a_checkpoint_is_identified_and_a_path_that_is_neither_named(untrained_lm, tmp_path):
    torch.manual_seed(0)
    policy = save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2)), tmp_path / "policy")
    assert identify_checkpoint(policy).kind == POLICY and identify_checkpoint(untrained_lm).kind == LM
    require_policy(policy, "search")
    with pytest.raises(ValueError, match="search needs an action-policy checkpoint, but .* is a chess language model"):
        require_policy(untrained_lm, "search")
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(FileNotFoundError) as error:
            identify_checkpoint(path)
        assert str(path) in str(error.value) and "neither an action-policy checkpoint" in str(error.value)
    with pytest.raises(ValueError, match="lm.retries"):
        LMPlayerConfig(retries=-1)


# --------------------------------------------------------------------------------------------
# The commands


def test_eval_endgame_plays_an_lm_and_writes_its_rates(cli, tmp_path, untrained_lm):
    output = tmp_path / "endgame.json"
    code, out, err = cli.main(
        "eval",
        "endgame",
        "--checkpoint",
        str(untrained_lm),
        "--positions",
        "4",
        "--max-moves",
        "5",
        f"syzygy_path={SYZYGY_DIR}",
        f"output={output}",
        "lm.retries=1",
        "lm.max_new_tokens=16",
    )
    assert code == 0, err
    written = json.loads(output.read_text())
    moves, rates = written["lm_player"]["counts"]["moves"], written["lm_player"]["rates"]
    assert 4 <= moves <= 20 and rates["fallback"] == 1.0  # 4 positions, up to 5 moves each
    assert f"  LM moves {moves}: ill-formed " in out and "fallback 100.0%" in out  # under the LM's row of the table
    assert rates["ill_formed"] + rates["illegal"] == 1.0
    assert written["results"][str(untrained_lm)]["lm_player"] == written["lm_player"]
    assert written["config"]["lm"]["retries"] == 1
    # lm.* settings with an action policy have no effect: refused.
    torch.manual_seed(0)
    policy = save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2)), tmp_path / "policy")
    code, _, err = cli.main(
        "eval", "endgame", "--checkpoint", str(policy), "--positions", "2", f"syzygy_path={SYZYGY_DIR}", "lm.retries=1"
    )
    assert code == 2 and "lm.* settings are for a chess LM checkpoint" in err


def test_eval_games_plays_an_lm_against_random_and_reports_its_rates(cli, tmp_path, taught_lm):
    from chessgrpo.commands.games import format_summary

    openings = tmp_path / "openings.epd"
    openings.write_text(START + "\n")
    pgn = tmp_path / "games.pgn"
    code, out, err = cli.main(
        "eval",
        "games",
        "--checkpoint",
        str(taught_lm),
        "--anchors",
        "random",
        "--games",
        "2",
        "--openings",
        str(openings),
        "--workers",
        "1",
        "--pgn",
        str(pgn),
        "--json",
        "max_plies=16",
        f"engine.syzygy_path={SYZYGY_DIR}",
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["games_played"] == 2 and summary["player_kind"] == "chess LM"
    lm = summary["lm_player"]
    assert lm["counts"]["moves"] == summary["anchors"][0]["lm_player"]["counts"]["moves"] >= 8
    assert set(lm["rates"]) == {"ill_formed", "illegal", "resampled", "fallback"}
    counts = lm["counts"]
    assert counts["ill_formed"] + counts["illegal"] == counts["resampled"] + counts["fallback"]
    assert "chess LM" in summary["player"] and "re-samples" in summary["player"]
    handle, games = io.StringIO(pgn.read_text()), []
    while (game := chess.pgn.read_game(handle)) is not None:
        games.append(game)
    assert len(games) == 2
    as_white = next(game for game in games if game.headers["White"] == "lm")
    assert next(iter(as_white.mainline_moves())).uci() == "e2e4"  # the taught answer, played greedily
    assert all(game.headers["PlayerSettings"] == summary["player"] for game in games)
    text = format_summary(summary)
    assert lm["line"] in text and f"    {lm['line']}" in text  # under the table and under the anchor


def test_eval_games_refuses_action_policy_options_and_lm_anchors_clearly(cli, tmp_path, taught_lm):
    for flags, expected in (
        (("--search-nodes", "8"), "search_nodes (--search-nodes) needs an action-policy checkpoint"),
        (("--temperature", "1"), "temperature (--temperature) samples an action policy"),
    ):
        code, out, err = cli.main("eval", "games", "--checkpoint", str(taught_lm), "--anchors", "random", *flags)
        assert code == 2 and out == "" and expected in err and str(taught_lm) in err
    torch.manual_seed(0)
    policy = save_policy(ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2)), tmp_path / "policy")
    code, _, err = cli.main(
        "eval",
        "games",
        "--checkpoint",
        str(policy),
        "--anchors",
        str(taught_lm),
        "--games",
        "2",
        "--openings",
        str(tmp_path / "unused.epd"),
    )
    assert code == 2 and f"anchor {str(taught_lm)!r} is a chess language model" in err
    code, _, err = cli.main("eval", "games", "--checkpoint", str(tmp_path / "nothing"), "--anchors", "random")
    assert code == 2 and "no checkpoint at" in err and "neither an action-policy checkpoint" in err


@pytest.mark.slow
def test_uci_with_an_lm_plays_a_game_through_python_chess(taught_lm):
    command = [sys.executable, "-m", "chessgrpo.cli", "uci", "--checkpoint", str(taught_lm)]
    engine = chess.engine.SimpleEngine.popen_uci(command, timeout=STARTUP_TIMEOUT_S)
    try:
        assert engine.id["name"] == "chessgrpo lm (chess LM)" and set(engine.options) == set(LM_OPTIONS)
        board = chess.Board()
        # Time enough for its answer (it answers as soon as it has one); 0.1 s could leave none on a busy machine.
        first = engine.play(board, chess.engine.Limit(time=10), info=chess.engine.INFO_ALL)
        assert first.move == chess.Move.from_uci("e2e4")  # its greedy B:
        assert "score" not in first.info and first.info["pv"] == [first.move]  # no search, so no score
        assert first.info["string"].startswith(
            "greedy B: answer (its own E: 0.3 pawns, not a search score); LM moves 1:"
        )
        for _ in range(8):  # the rest of a short game: whatever the LM writes (or has no time to), the moves are legal
            board.push(engine.play(board, chess.engine.Limit(time=0.01)).move)
        assert board.is_valid() and len(board.move_stack) == 8
        last = engine.play(board, chess.engine.Limit(nodes=10), info=chess.engine.INFO_ALL)
        assert last.move in board.legal_moves and "LM moves 10:" in last.info["string"]
    finally:
        engine.quit()


def test_uci_with_an_lm_keeps_to_searchmoves_and_refuses_policy_options(cli, taught_lm):
    output = io.StringIO()
    script = [
        "uci",
        "setoption name Search value none",
        "position startpos",
        "go searchmoves d2d4",
        "position startpos",
        "go depth 5",
    ]
    engine = LMUciEngine(taught_lm, input=io.StringIO("\n".join(script) + "\n"), output=output)
    assert engine.run() == 0
    lines = output.getvalue().splitlines()
    offered = [line.removeprefix("option name ").split(" type ")[0] for line in lines if line.startswith("option ")]
    assert offered == list(LM_OPTIONS) and "uciok" in lines  # the bots' options, none of the action policy's own
    assert "info string unknown option ignored: Search" in lines
    assert [line.split()[1] for line in lines if line.startswith("bestmove")] == ["d2d4", "e2e4"]
    # e2e4, its answer, is not allowed: a re-sample or the fallback found d2d4.
    assert any(
        line.startswith("info string ") and "; LM moves 1: ill-formed 0.0%, illegal 100.0%" in line for line in lines
    )
    code, out, err = cli.main("uci", "--checkpoint", str(taught_lm), "--search", "none", "--nodes", "8")
    assert code == 2 and out == "" and "--search, --nodes: an action policy's option" in err and str(taught_lm) in err


def test_uci_with_an_lm_budgets_its_clock_and_takes_the_options_bots_send(untrained_lm):
    """The untrained LM's greedy answers never parse, so without a clock every move takes 1 + 3 generations. With
    100 ms on its clock (Move Overhead 100 leaves nothing) not even the greedy answer fits: a random move at once;
    with a minute it asks all its re-samples. Bots' options are taken; those without effect on the LM say so or are
    silent, as the action policy's Ponder."""
    output = io.StringIO()
    script = [
        "setoption name Threads value 1",
        "setoption name Hash value 16",
        "setoption name Move Overhead value 100",
        "setoption name SyzygyPath value ./syzygy/",
        "setoption name UCI_ShowWDL value true",
        "setoption name MultiPV value 3",
        "setoption name Ponder value true",
        "position startpos",
        "go wtime 100 btime 100 winc 100 binc 100",
        "position startpos moves e2e4",
        "go movetime 60000",
    ]
    engine = LMUciEngine(untrained_lm, input=io.StringIO("\n".join(script) + "\n"), output=output)
    assert engine.step_seconds > 0  # one answer, timed at startup: the first budget knows what a generation takes
    assert engine.run() == 0
    lines = output.getvalue().splitlines()
    assert engine.move_overhead_ms == 100 and engine.threads == 1 and engine.hash_mb == 16
    assert not [line for line in lines if "error" in line or "unknown option" in line]
    assert "info string SyzygyPath has no effect: the chess LM plays its own answers, without tables" in lines
    hows = [line for line in lines if line.startswith("info string ") and "LM moves" in line]
    assert hows[0].startswith("info string no time for an answer: random legal move; LM moves 1: ")
    assert hows[1].startswith("info string fallback: random legal move; LM moves 2: ")  # all re-samples, none cut
    assert engine.player.stats == LMPlayerStats(moves=2, ill_formed=1, fallback=1, no_time=1)
    times = [int(line.split()[4]) for line in lines if line.startswith("info depth 1 time ")]
    assert times[0] < 50 and len([line for line in lines if line.startswith("bestmove ")]) == 2
