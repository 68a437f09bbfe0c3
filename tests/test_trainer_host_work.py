"""The trainer's host work per sample (issue 53): each cut is checked against the plain code it replaced.

`bench/rollout_throughput.py` measures the main process's CPU per sample, split into the network's
forwards and backward passes and the host's work around them; the functions here are the host's.
The references below are the implementations before the cuts, kept verbatim as what the fast paths must equal.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import chess
import torch

from chessgrpo.models.policy import ActionPolicy, PolicyConfig
from chessgrpo.tasks.move_group import (
    StartPositions,
    move_value_positions,
    sample_groups,
)
from helpers import random_playout_positions


def move_value_positions_reference(
    boards: Sequence[chess.Board], moves: Sequence[Sequence[chess.Move]]
) -> tuple[list[chess.Board], list[list[int]]]:
    """Before the cut: every (board, move) pushed and written as FEN, repeats included."""
    distinct: dict[str, int] = {}
    after_boards: list[chess.Board] = []
    indices: list[list[int]] = []
    for board, row in zip(boards, moves):
        row_indices = []
        for move in row:
            after = board.copy(stack=False)
            after.push(move)
            key = after.fen()
            if key not in distinct:
                distinct[key] = len(after_boards)
                after_boards.append(after)
            row_indices.append(distinct[key])
        indices.append(row_indices)
    return after_boards, indices


def test_move_value_positions_equal_the_reference_with_repeats_and_transpositions():
    rng = random.Random(3)
    boards = [board for board in random_playout_positions(340, seed=1) if any(board.legal_moves)]
    boards += [chess.Board(), chess.Board()]  # the same position twice: one set of searches
    moves = []
    for board in boards:
        legal = list(board.legal_moves)
        moves.append([rng.choice(legal) for _ in range(9)])  # with replacement, as a group samples
    moves[-2][:2] = moves[-1][:2] = [chess.Move.from_uci("g1f3"), chess.Move.from_uci("g1f3")]

    after, indices, fens = move_value_positions(boards, moves)
    reference_after, reference_indices = move_value_positions_reference(boards, moves)
    assert indices == reference_indices
    assert fens == [board.fen() for board in reference_after] == [board.fen() for board in after]
    assert [board.move_stack for board in after] == [
        board.move_stack for board in reference_after
    ]  # the same history (one move)
    assert len(after) < sum(len(row) for row in moves)  # repeats were merged


def test_transposed_positions_from_two_boards_are_one_search():
    e3 = chess.Board()
    e3.push_uci("e2e3")
    e3.push_uci("e7e6")
    via_e4 = chess.Board("rnbqkbnr/pppp1ppp/4p3/8/8/4P3/PPPP1PPP/RNBQKBNR w KQkq - 0 2")
    after, indices, fens = move_value_positions(
        [e3, via_e4], [[chess.Move.from_uci("g1f3")], [chess.Move.from_uci("g1f3")]]
    )
    assert len(after) == 1 and indices == [[0], [0]] and fens == [after[0].fen()]


def test_sampling_reads_each_position_once_and_encodes_as_before():
    torch.manual_seed(0)
    model = ActionPolicy(dataclasses.replace(PolicyConfig.from_size("tiny"), move_facts=True)).eval()
    boards = StartPositions.from_source("random:12", seed=4).draw(8, seed=0, step=0)
    groups = sample_groups(model, boards, 4, temperature=1.0, generator=torch.Generator().manual_seed(0))
    tokens, legal = model.inputs(boards)  # the reference: every FEN computed inside
    assert groups.fens == [board.fen() for board in boards]
    assert torch.equal(groups.tokens, tokens) and torch.equal(groups.legal, legal)
