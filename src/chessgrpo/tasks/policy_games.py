"""Start positions from the policy's own games: the states it actually meets when it plays.

Held-out move quality is measured on engine-game positions, but a policy plays (and fails to
convert) in the positions its own moves lead to: against a weak opponent, positions where it is
far ahead. `policy_game_positions` plays the policy (argmax, avoiding threefold repetition when
ahead, exactly as `chessgrpo eval games` plays it) against a uniformly random mover from seeded
random openings and returns every position where the policy is to move. A move-group source
``policy_games:N`` (N games) trains on them; the games are played by the frozen starting policy
(the reference), so a resumed run rebuilds exactly the same positions. They are cached on disk by
the policy's weights and the settings (`cached_policy_game_positions`, beside the engine cache), so
a run from the same start does not play them again.

The openings are random plies from the initial position, seeded separately from the balanced
suite of `chessgrpo eval games` (which checks each opening with Stockfish): training positions
and evaluation games do not share openings beyond chance transpositions in the first few plies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import chess

from chessgrpo.play.movers import PolicyMover, RandomMover

logger = logging.getLogger(__name__)

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


CACHE_VERSION = 1
"""Bumped when `policy_game_positions` would play different games for the same inputs."""


def policy_games_key(
    policy: Any, games: int, *, seed: int, opening_plies: tuple[int, int] = (4, 8), max_plies: int = 300
) -> str:
    """What decides the games: the policy's weights and config and every setting of `policy_game_positions` (sha256)."""
    digest = hashlib.sha256()
    settings = {
        "version": CACHE_VERSION,
        "games": games,
        "seed": seed,
        "opening_plies": list(opening_plies),
        "max_plies": max_plies,
        "config": repr(getattr(policy, "config", None)),
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for name, tensor in sorted(policy.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def cached_policy_game_positions(
    policy: Any, games: int, cache_dir: Path | None, *, seed: int, **settings: Any
) -> tuple[list[chess.Board], str]:
    """`policy_game_positions`, read from `cache_dir` when the same policy and settings played them before.

    Returns (positions, where they came from: "cache FILE" or "played"). The file (``policy_games_<key>.fens``)
    starts with a header naming its full key and position count, then one FEN a line; it is written
    atomically (a temporary file, then a rename). A file that does not read back whole (bad header, wrong
    count, a bad FEN) is named in a warning and the games are played again. `cache_dir` None plays them
    without a cache.
    """
    if cache_dir is None:
        logger.info("policy games: playing %d games of the starting policy (no cache)", games)
        return policy_game_positions(policy, games, seed=seed, **settings), "played"
    key = policy_games_key(policy, games, seed=seed, **settings)
    path = Path(cache_dir) / f"policy_games_{key[:24]}.fens"
    if path.exists():
        try:
            boards = _read_cache(path, key)
        except (OSError, ValueError) as error:
            logger.warning("policy games cache %s is unreadable (%s): playing the games again", path, error)
        else:
            logger.info("policy games: loaded %d positions from cache (key %s, %s)", len(boards), key[:24], path)
            return boards, f"cache {path}"
    logger.info("policy games: playing %d games of the starting policy (key %s, cached in %s)", games, key[:24], path)
    boards = policy_game_positions(policy, games, seed=seed, **settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    temporary.write_text(f"{_HEADER} {key} {len(boards)}\n" + "".join(board.fen() + "\n" for board in boards))
    temporary.replace(path)
    return boards, "played"


_HEADER = f"# chessgrpo policy games v{CACHE_VERSION}"
"""A cache file's first line: this, the full key and the number of FENs that follow."""


def _read_cache(path: Path, key: str) -> list[chess.Board]:
    """The boards of a cache file; ValueError naming what is wrong when it is not whole or not this key's."""
    text = path.read_text()
    if not text:
        raise ValueError("the file is empty")
    header, *lines = text.splitlines()
    fields = header.rsplit(" ", 2)
    if len(fields) != 3 or fields[0] != _HEADER or fields[1] != key or not fields[2].isdigit():
        raise ValueError(f"header {header[:80]!r} is not {_HEADER!r} with this key and a count")
    if len(lines) != int(fields[2]):
        raise ValueError(f"{len(lines)} positions, the header says {fields[2]}")
    return [chess.Board(line) for line in lines]
