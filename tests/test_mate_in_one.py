"""GRPO with the shaped reward teaches mate in one: a short real run whose held-out mate rate rises.

Back-rank positions (Black's king behind its three pawns, a White rook with a free file to the
eighth rank, a knight, pawns and the king placed at random) all have a mate in one. A tiny policy
trained from scratch with `kind: move_group` on 300 of them, rewarded by real Stockfish through
`tasks.rewards.shaped_value`, must mate in most of 200 others it never saw.

Cross-cutting (a learning test, end to end): tasks/kinds/move_group.py, tasks/rewards.py and
train/loop.py together.
"""

from __future__ import annotations

import random

import chess
import pytest
import torch

from chessgrpo.config import from_dict
from chessgrpo.files import step_checkpoints
from chessgrpo.models.policy import load_policy
from chessgrpo.stats import wilson_interval
from chessgrpo.tasks.kinds.move_group import MoveGroupTrainConfig
from chessgrpo.train.loop import Trainer
from helpers import SYZYGY_DIR


def _has_mate_in_one(board: chess.Board) -> bool:
    for move in board.legal_moves:
        board.push(move)
        mate = board.is_checkmate()
        board.pop()
        if mate:
            return True
    return False


def back_rank_positions(count: int, seed: int, exclude: set[str] = frozenset()) -> list[chess.Board]:
    rng = random.Random(seed)
    boards: list[chess.Board] = []
    seen = set(exclude)
    while len(boards) < count:
        board = chess.Board(None)
        king_file = rng.randint(1, 6)
        board.set_piece_at(chess.square(king_file, 7), chess.Piece(chess.KING, chess.BLACK))
        for file in (king_file - 1, king_file, king_file + 1):
            board.set_piece_at(chess.square(file, 6), chess.Piece(chess.PAWN, chess.BLACK))
        for piece in (chess.KING, chess.ROOK, chess.KNIGHT, chess.PAWN, chess.PAWN):
            low = 8 if piece == chess.PAWN else 0
            board.set_piece_at(
                rng.choice([s for s in range(low, 48) if board.piece_at(s) is None]), chess.Piece(piece, chess.WHITE)
            )
        board.turn = chess.WHITE
        if board.is_valid() and not board.is_check() and board.epd() not in seen and _has_mate_in_one(board):
            seen.add(board.epd())
            boards.append(board)
    return boards


def _mate_rate(checkpoint, boards: list[chess.Board]) -> tuple[int, list[bool]]:
    policy = load_policy(checkpoint)
    mated = []
    for board, move in zip(boards, policy.predict_moves(boards, temperature=0.0)):
        after = board.copy(stack=False)
        after.push(move)
        mated.append(after.is_checkmate())
    return sum(mated), mated


@pytest.mark.slow
def test_a_short_grpo_run_raises_the_held_out_mate_in_one_rate(tmp_path):
    torch.manual_seed(0)
    train = back_rank_positions(300, seed=0)
    held_out = back_rank_positions(200, seed=1, exclude={b.epd() for b in train})
    (tmp_path / "train.fen").write_text("".join(b.fen() + "\n" for b in train))
    config = from_dict(
        MoveGroupTrainConfig,
        {
            "run": {"name": "mate", "out_dir": str(tmp_path), "seed": 0},
            "init_checkpoint": None,  # a fresh tiny policy: it knows nothing about mates
            "positions": str(tmp_path / "train.fen"),
            "task": {
                "group_size": 8,
                "positions_per_step": 32,
                "temperature": 1.0,
                "reward": "shaped",
                "reward_nodes": 50,
                "best_move_values": False,
            },
            "grpo": {"kl_coef": 0.0, "num_iterations": 1, "minibatch_size": 256},
            "engine": {"processes": 1, "cache": False, "syzygy_path": str(SYZYGY_DIR)},
            "eval": {"positions": None, "puzzles": None},
            "steps": 40,
            "lr": 3.0e-3,
            "warmup_steps": 0,
            "checkpoint_every": 0,
            "log_every": 10,
        },
    )
    with Trainer(config) as trainer:
        trainer.train()
    first, last = step_checkpoints(tmp_path / "mate")[0][1], tmp_path / "mate"
    before, before_mated = _mate_rate(first, held_out)
    after, after_mated = _mate_rate(last, held_out)
    # The fresh policy mates by chance (about 1 legal move in 25); after 40 steps most held-out positions are mated.
    assert wilson_interval(after, len(held_out)).low > wilson_interval(before, len(held_out)).high
    assert after >= 0.6 * len(held_out)
    gained = sum(a and not b for a, b in zip(after_mated, before_mated))
    lost = sum(b and not a for a, b in zip(after_mated, before_mated))
    assert gained - lost >= 0.5 * len(held_out)  # paired: the same positions, mostly newly mated
