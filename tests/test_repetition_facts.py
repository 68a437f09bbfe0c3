"""Repetition in the policy's view (`board.repetitions`, the `repetition` and `threefold` move facts): exact against
python-chess, read from the game's move stack wherever a policy plays (rollouts, `predict_moves`, the games'
player, `chessgrpo uci`), absent from a FEN alone, and what lets a policy that would cycle avoid the draw."""

from __future__ import annotations

import io
import random

import chess
import pytest
import torch

from chessgrpo.board import ACTIONS, move_to_action
from chessgrpo.board.move_facts import move_fact_array, move_facts
from chessgrpo.board.repetitions import (
    ALLOWS_THREEFOLD,
    REPETITION,
    THREEFOLD,
    position_key,
    record,
    repetition_facts,
)
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy, save_policy
from chessgrpo.play.movers import PolicyMover
from chessgrpo.tasks.trajectory import TrajectoryConfig, play_trajectories
from chessgrpo.uci.engine import UciEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

# Knights on both sides (not a dead draw), kings that shuffle h1-g1 and h8-g8: the cycle's fourth move
# brings the start back, its eighth makes the third occurrence.
START = "n6k/8/8/8/8/8/8/N6K w - - 0 1"
CYCLE = ["h1g1", "h8g8", "g1h1", "g8h8"]


def expected_bits(board: chess.Board, move: chess.Move, *, allows: bool = False) -> int:
    """python-chess's own answer: what the position after `move` counts in the game, and with `allows` whether a
    reply then makes a threefold repetition (every reply tried)."""
    board.push(move)
    try:
        bits = (REPETITION if board.is_repetition(2) else 0) | (THREEFOLD if board.is_repetition(3) else 0)
        if allows:
            for reply in list(board.legal_moves):
                board.push(reply)
                closes = board.is_repetition(3)
                board.pop()
                if closes:
                    return bits | ALLOWS_THREEFOLD
        return bits
    finally:
        board.pop()


def test_repetition_facts_agree_with_python_chess_and_kept_counts():
    """Over random games of few pieces (many repetitions), every legal move's bits equal python-chess's
    `is_repetition` after the move, whether the counts come from the move stack or are kept move by move."""
    rng = random.Random(0)
    checked = repeats = threefolds = allowed = 0
    for fen in (
        "n6k/8/8/8/8/8/8/N6K w - - 0 1",
        "4k3/8/8/8/8/8/4P3/R3K2R w KQ - 0 1",
        "8/8/4k3/8/8/3Q4/8/4K3 w - - 0 1",
    ):
        for _game in range(6):
            board = chess.Board(fen)
            counts = {position_key(board): 1}
            for _ in range(40):
                facts = dict(repetition_facts(board, allows=True))
                assert facts == dict(repetition_facts(board, counts, allows=True))
                without = dict(repetition_facts(board, counts))
                for move in board.legal_moves:
                    bits = expected_bits(board, move, allows=True)
                    action = move_to_action(move)
                    assert facts.get(action, 0) == bits, (board.fen(), move.uci())
                    assert without.get(action, 0) == bits & ~ALLOWS_THREEFOLD
                    checked += 1
                    repeats += bool(bits & REPETITION)
                    threefolds += bool(bits & THREEFOLD)
                    allowed += bool(bits & ALLOWS_THREEFOLD)
                moves = list(board.legal_moves)
                if not moves or board.is_insufficient_material():
                    break
                # Prefer quiet moves, and often take the own last move back, so that positions come back.
                quiet = [m for m in moves if not board.is_zeroing(m)] or moves
                move = rng.choice(quiet)
                if len(board.move_stack) >= 2 and rng.random() < 0.6:
                    last = board.move_stack[-2]
                    back = chess.Move(last.to_square, last.from_square)
                    move = back if board.is_legal(back) else move
                zeroing = board.is_zeroing(move)
                board.push(move)
                counts = record(counts, board, zeroing)
    assert repeats > 100 and threefolds > 20 and allowed > 20, (checked, repeats, threefolds, allowed)


def test_a_fen_has_no_history_and_old_policies_do_not_read_it():
    board = chess.Board(START)
    for uci in CYCLE:
        board.push_uci(uci)
    repeat = move_to_action("h1g1")
    assert dict(move_facts(board, extra=("repetition", "threefold")))[repeat] == REPETITION
    assert repeat not in dict(move_facts(chess.Board(board.fen()), extra=("repetition", "threefold")))
    assert repeat not in dict(move_facts(board))  # a policy without the facts never sees them
    wide = move_fact_array([board], extra=("repetition",))
    assert wide.dtype.name == "uint16" and wide[0, repeat] == REPETITION
    assert move_fact_array([board]).dtype.name == "uint8"
    with pytest.raises(ValueError, match="repetition is a move fact"):
        PolicyConfig(repetition=True)


def cycling_policy(aware: bool) -> ActionPolicy:
    """A tiny policy that plays the kings' cycle (a large bias on its four moves); with `aware`, it also reads the
    repetition facts and a threefold costs it far more than the cycle's bias."""
    torch.manual_seed(0)
    policy = ActionPolicy(
        PolicyConfig(
            n_layers=1,
            d_model=32,
            n_heads=2,
            move_facts=True,
            repetition=aware,
            threefold=aware,
            allows_threefold=aware,
        )
    )
    with torch.no_grad():
        for uci in CYCLE:
            policy.head.action_bias[move_to_action(uci)] = 30.0
        if aware:
            assert policy.move_facts is not None
            names = policy.config.fact_names
            policy.move_facts.weights.bias[names.index("threefold")] = -100.0
    return policy.eval()


def board_before_threefold() -> chess.Board:
    """The cycle played once and then three more moves: Kg8-h8 now makes the third occurrence of the start."""
    board = chess.Board(START)
    for uci in CYCLE + CYCLE[:3]:
        board.push_uci(uci)
    assert expected_bits(board, chess.Move.from_uci("g8h8")) == REPETITION | THREEFOLD
    return board


def test_the_policy_and_the_games_player_see_the_game_history():
    """The same FEN with and without its history: only the history changes the aware policy's move, in
    `predict_moves` (the endgame evaluation's player) and in `PolicyMover` (`eval games`), and a saved and
    reloaded policy keeps reading it."""
    board = board_before_threefold()
    fresh = chess.Board(board.fen())
    aware, blind = cycling_policy(True), cycling_policy(False)
    assert blind.predict_moves([board])[0].uci() == "g8h8"
    assert aware.predict_moves([fresh])[0].uci() == "g8h8"
    assert aware.predict_moves([board])[0].uci() != "g8h8"
    assert PolicyMover(blind, avoid_repetition=False).move(board.copy()).uci() == "g8h8"
    assert PolicyMover(aware, avoid_repetition=False).move(board.copy()).uci() != "g8h8"


def test_uci_passes_the_game_history_to_the_policy(tmp_path):
    board = board_before_threefold()
    moves = " ".join(move.uci() for move in board.move_stack)
    best = {}
    for aware in (True, False):
        checkpoint = save_policy(cycling_policy(aware), tmp_path / f"aware_{aware}")
        assert load_policy(checkpoint).config.threefold == aware
        output = io.StringIO()
        engine = UciEngine(checkpoint, input=io.StringIO(f"position fen {START} moves {moves}\ngo\n"), output=output)
        assert engine.run() == 0
        best[aware] = [line.split()[1] for line in output.getvalue().splitlines() if line.startswith("bestmove")]
    assert best[False] == ["g8h8"] and best[True] != ["g8h8"] and len(best[True]) == 1


def replay(rows_actions: list[list[int]], start: chess.Board) -> list[chess.Board]:
    """The boards (with their move stacks) before each of a self-play game's half-moves, from its two rows."""
    white, black = rows_actions
    board, boards = start.copy(), []
    for t in range(max(len(white), len(black))):
        for row in (white, black):
            if t < len(row):
                boards.append(board.copy())
                board.push(chess.Move.from_uci(ACTIONS[row[t]]))
    return boards


@pytest.mark.parametrize("aware", [True, False])
def test_rollouts_read_the_history_and_the_aware_policy_avoids_the_draw(aware):
    """Self-play rollouts of the cycling policy: without the facts every game ends in a threefold repetition;
    with them none does. Every own ply's stored input equals the policy's input for the game's board with its
    move stack (the rollout merges positions by FEN and repetition facts, never by FEN alone)."""
    policy = cycling_policy(aware)
    config = TrajectoryConfig(group_size=2, positions_per_step=1, horizon=6, temperature=0.05, opponent="self")
    start = chess.Board(START)
    games = play_trajectories(policy, [start], config, opponent=None, generator=torch.Generator().manual_seed(0))
    outcomes = games.outcomes()
    if aware:
        assert not any(outcome == "draw:threefold_repetition" for outcome in outcomes), outcomes
    else:
        assert all(outcome == "draw:threefold_repetition" for outcome in outcomes), outcomes
    lengths = games.lengths.tolist()
    for game in range(config.group_size):
        rows = [games.actions[2 * game + k, : lengths[2 * game + k]].tolist() for k in (0, 1)]
        boards = replay(rows, start)
        plies = [(2 * game + k, t) for t in range(max(map(len, rows))) for k in (0, 1) if t < len(rows[k])]
        for board, (row, t) in zip(boards, plies):
            stored = games.tokens[games.position[row, t]]
            assert torch.equal(stored, policy.inputs([board])[0][0]), (row, t, board.fen())
    if aware:  # the history reached the input: the repeating moves were flagged
        facts = games.tokens[:, 77:]
        assert bool(((facts & THREEFOLD) > 0).any()) and bool(((facts & REPETITION) > 0).any())


def test_diagnose_names_the_missing_history_when_repetitions_give_the_win_away(tmp_path):
    """A real evaluation of a player that takes its last move back against the perfect defender: the games end in
    threefold repetitions, and `diagnose` tells a run whose policy does not read the history to give it the facts
    (and does not say so to a run whose policy reads them)."""
    import yaml

    from chessgrpo.board.endgames import EndgameStarts
    from chessgrpo.engine.tablebase import Tablebase
    from chessgrpo.eval.endgame import evaluate_endgame
    from chessgrpo.track.diagnose import diagnose
    from chessgrpo.track.run_data import load_run
    from chessgrpo.train.metrics import MetricsWriter
    from helpers import SYZYGY_DIR

    def shuffler(boards: list[chess.Board]) -> list[chess.Move]:
        moves = []
        for board in boards:
            legal = sorted(board.legal_moves, key=chess.Move.uci)
            back = (
                chess.Move(board.move_stack[-2].to_square, board.move_stack[-2].from_square)
                if len(board.move_stack) >= 2
                else None
            )
            moves.append(back if back in legal else legal[0])
        return moves

    with Tablebase(str(SYZYGY_DIR)) as tablebase:
        starts = EndgameStarts("KQvK", tablebase.is_won, tables=tablebase.names, colours="white").hold_out(10, seed=3)
        result = evaluate_endgame(shuffler, starts, tablebase, max_moves=20)
    assert result.metrics()["eval/draw_threefold_repetition_rate"] >= 0.5
    advice = {}
    for reads in (False, True):
        run = tmp_path / f"reads_{reads}"
        run.mkdir()
        model = {"size": "tiny", "move_facts": True, "repetition": reads, "threefold": reads}
        (run / "config.yaml").write_text(yaml.safe_dump({"kind": "trajectory", "model": model}))
        with MetricsWriter(run / "metrics.jsonl") as writer:
            writer.log(0, result.metrics())
        findings = {f.id: f for f in diagnose(load_run(run))}
        assert "repetition" in findings["endgame.win_given_away"].message
        advice[reads] = findings["endgame.win_given_away"].advice
    assert "model.repetition" in advice[False] and "model.repetition" not in advice[True]
