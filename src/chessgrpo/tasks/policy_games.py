"""Start positions from the policy's own games: the states it actually meets when it plays.

Held-out move quality is measured on engine-game positions, but a policy plays (and fails to
convert) in the positions its own moves lead to: against a weak opponent, positions where it is
far ahead. `policy_game_positions` plays the policy (argmax, avoiding threefold repetition when
ahead, exactly as `chessgrpo eval games` plays it) against a uniformly random mover from seeded
random openings and returns every position where the policy is to move. A move-group source
``policy_games:N`` (N games) trains on them; the games are played by the frozen starting policy
(the reference), so a resumed run rebuilds exactly the same positions.

The openings are random plies from the initial position, seeded separately from the balanced
suite of `chessgrpo eval games` (which checks each opening with Stockfish): training positions
and evaluation games do not share openings beyond chance transpositions in the first few plies.
"""

from __future__ import annotations

import random
from typing import Any

import chess

from chessgrpo.eval.movers import PolicyMover, RandomMover

SOURCE_PREFIX = "policy_games:"


def parse_policy_games(source: str) -> int:
    """N from ``policy_games:N`` (ValueError naming the source otherwise)."""
    count = source[len(SOURCE_PREFIX) :]
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"start positions {source!r}: expected policy_games:N with N >= 1 games")
    return int(count)


def random_opening(rng: random.Random, min_plies: int, max_plies: int) -> chess.Board:
    """A few uniformly random legal plies from the initial position (retried if the game ends)."""
    while True:
        board = chess.Board()
        for _ in range(rng.randint(min_plies, max_plies)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        if not board.is_game_over():
            return board


def policy_game_positions(
    policy: Any,
    games: int,
    *,
    seed: int = 0,
    opening_plies: tuple[int, int] = (4, 8),
    max_plies: int = 300,
    progress: Any = None,
) -> list[chess.Board]:
    """Positions with the policy to move from `games` games of `policy` (an `ActionPolicy`) against a random mover.

    Colours alternate game by game. A game ends at checkmate, stalemate, insufficient material,
    a claimable threefold or fifty-move draw, or after `max_plies` plies. `progress`, when given,
    is called with the number of games finished.
    """
    rng = random.Random(seed)
    player = PolicyMover(policy, temperature=0.0, avoid_repetition=True)
    opponent = RandomMover()
    positions: list[chess.Board] = []
    for game in range(games):
        board = random_opening(rng, *opening_plies)
        policy_colour = chess.WHITE if game % 2 == 0 else chess.BLACK
        player.new_game(game, seed)
        opponent.new_game(game, rng.getrandbits(32))
        for _ in range(max_plies):
            if board.is_game_over(claim_draw=True):
                break
            if board.turn == policy_colour:
                positions.append(board.copy(stack=False))
                board.push(player.move(board))
            else:
                board.push(opponent.move(board))
        if progress is not None:
            progress(game + 1)
    return positions
