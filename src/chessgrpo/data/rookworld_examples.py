"""One RookWorld example (a P: or A: line with its position and truth) and how each is built.

Shared by the two generators, `data.rookworld` (engine-analysed playouts) and `data.rookworld_endgames`
(Syzygy truths); `data.rookworld` re-exports these names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import chess

from chessgrpo.data.rookworld_format import (
    FEN_PROMPT,
    HISTORY_MOVES,
    MOVE_FIRST_LAYOUT,
    ROOKWORLD_LAYOUT,
    EnvironmentQuery,
    environment_prompt,
    environment_step,
    format_environment_completion,
    format_policy_completion,
    policy_prompt,
)
from chessgrpo.data.rookworld_truths import PolicyTruth


@dataclasses.dataclass(frozen=True)
class RookWorldExample:
    """One line of a RookWorld dataset."""

    task: str
    prompt: str
    completion: str
    fen: str
    source: str = "random_playout"
    moves: tuple[str, ...] = ()
    pawns: tuple[float, ...] = ()
    defect: bool = False
    nodes: int = 0

    @property
    def line(self) -> str:
        return self.prompt + self.completion

    def row(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "moves": list(self.moves), "pawns": list(self.pawns)}


def illegal_move(board: chess.Board, rng: random.Random) -> str:
    """A syntactically valid UCI move that is not legal here (from a square of a piece of the mover)."""
    legal = {m.uci() for m in board.legal_moves}
    own = [sq for sq in chess.SQUARES if board.color_at(sq) == board.turn]
    for _ in range(1000):
        move = chess.square_name(rng.choice(own)) + chess.square_name(rng.randrange(64))
        if move not in legal and move[:2] != move[2:]:
            return move
    raise RuntimeError(f"no illegal move found for {board.fen()!r}")  # pragma: no cover


def environment_example(board: chess.Board, move: str, source: str = "random_playout") -> RookWorldExample:
    """The A: example of playing `move` (UCI, legal or not) in `board`, history from its move stack."""
    history = tuple([m.uci() for m in board.move_stack][-(HISTORY_MOVES - 1) :] + [move])
    query = EnvironmentQuery(fen=board.fen(), move=move, history=history)
    answer = environment_step(query.fen, move)
    return RookWorldExample(
        "environment", environment_prompt(query), format_environment_completion(answer), query.fen, source
    )


def policy_example(
    truth: PolicyTruth,
    seed: int,
    nodes: int,
    source: str = "random_playout",
    *,
    layout: str = ROOKWORLD_LAYOUT,
    move_only: bool = False,
    prompt: str = FEN_PROMPT,
) -> RookWorldExample:
    """The P: example of an engine analysis (M shuffled with a per-position seed), written in `layout`
    (`data.rookworld_format.POLICY_LAYOUTS`); `move_only` (move_first only): B: alone, no M:/E: after it;
    `prompt`: the prompt's style (`data.rookworld_format.POLICY_PROMPTS`)."""
    answer = dataclasses.replace(truth.answer(seed=hash_seed(seed, truth.fen)), layout=layout)
    if move_only:
        if layout != MOVE_FIRST_LAYOUT:
            raise ValueError(f"move_only needs the {MOVE_FIRST_LAYOUT} layout, got {layout!r}")
        answer = dataclasses.replace(answer, moves=(), evals=())
    return RookWorldExample(
        "policy",
        policy_prompt(truth.fen, prompt),
        format_policy_completion(truth.fen, answer, prompt),
        truth.fen,
        source,
        moves=truth.moves,
        pawns=truth.pawns,
        nodes=nodes,
    )


def hash_seed(seed: int, text: str) -> int:
    """A stable 64-bit seed from (seed, text) (Python's hash() of a str changes between processes)."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{text}".encode()).digest()[:8], "big")


def environment_move(
    board: chess.Board, truth: PolicyTruth, *, seed: int, illegal_fraction: float, engine_move_fraction: float
) -> str:
    """The move of a position's A: example, seeded by (seed, FEN): an illegal move with probability
    `illegal_fraction`, else the truth's best move with probability `engine_move_fraction`, else a uniformly
    random legal move."""
    rng = random.Random(hash_seed(seed + 1, truth.fen))
    draw = rng.random()
    if draw < illegal_fraction:
        return illegal_move(board, rng)
    if draw < illegal_fraction + (1 - illegal_fraction) * engine_move_fraction:
        return truth.best
    return rng.choice(sorted(truth.legal))
