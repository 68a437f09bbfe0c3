"""Chess960 for a network that knows only standard chess: parsing Chess960 positions and moves
(castling written king takes rook, ``e1h1``), and the mapping through which the policy
(`policy_logits`) and the search (`Chess960Evaluator`) see a Chess960 board.

The network's board encoding and action space are standard chess, so

- it sees a *standard view* of the board (`standard_view`): the same pieces, keeping only the
  castling rights standard chess can express (king on e1/e8, rooks on the a/h files);
- each legal move gets an action (`move_actions`): a normal move its own; a castling whose king
  and rook stand on their standard squares the standard king move (``e1h1`` -> ``e1g1``, how the
  network learned castling, so such positions score exactly as in standard chess); any other
  castling the king's move to its castling square when no other legal move has that action,
  else the king-onto-rook move.

This is an approximation for positions the network never saw, but every legal Chess960 move can
be searched and played and castling is never confused with a king move. ``docs/uci.md`` has the
user's view.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import chess
import numpy as np
import torch

from chessgrpo.board import move_to_action
from chessgrpo.board.actions import ACTION_INDEX
from chessgrpo.board.validation import parse_move
from chessgrpo.models.policy import ActionPolicy
from chessgrpo.search.evaluator import NetworkEvaluator

FEN960_CHARACTERS = frozenset("pnbrqkPNBRQK" + string.digits + "abcdefghABCDEFGH/- w")


def parse_board_960(fen: str) -> chess.Board:
    """A validated Chess960 board from a Shredder-FEN or X-FEN (as `parse_board` for standard chess)."""
    if not fen or len(fen) > 100 or set(fen) - FEN960_CHARACTERS:
        raise ValueError(f"malformed FEN {fen[:100]!r}: contains characters or length a FEN cannot have")
    if len(fen.split()) not in (4, 6):
        raise ValueError(f"malformed FEN {fen[:100]!r}: expected 6 space-separated fields")
    try:
        board = chess.Board(" ".join(fen.split()), chess960=True)
    except ValueError as error:
        raise ValueError(f"malformed FEN {fen[:100]!r}: {error}") from None
    if board.status() != chess.STATUS_VALID:
        raise ValueError(f"invalid Chess960 position {fen[:100]!r}")
    return board


def parse_move_960(board: chess.Board, text: str) -> chess.Move:
    """A legal move of a Chess960 board from UCI text (castling as king takes rook)."""
    if not 4 <= len(text) <= 5 or not text.isalnum():
        raise ValueError(f"malformed UCI move {text[:20]!r}")
    try:
        return board.parse_uci(text)
    except ValueError:
        raise ValueError(f"illegal move {text[:20]!r} in position {board.fen(shredder=True)!r}") from None


def parse_uci_move(board: chess.Board, text: str) -> chess.Move:
    """A legal move of `board` from UCI text: `parse_move_960` for a Chess960 board, else `parse_move`."""
    return parse_move_960(board, text) if board.chess960 else parse_move(board, text)


def standard_view(board: chess.Board) -> chess.Board:
    """The board as the network sees it: `board` itself for standard chess; for Chess960 a
    standard board with the same pieces, keeping only the castling rights standard chess can
    express (king on e1/e8, rook on a/h), without the move stack."""
    if not board.chess960:
        return board
    view = board.copy(stack=False)
    view.chess960 = False
    view.castling_rights = view.clean_castling_rights()
    return view


def move_actions(board: chess.Board, moves: Sequence[chess.Move]) -> list[int]:
    """The action index of each of `moves` (legal in `board`), distinct for distinct moves.

    Standard chess: `move_to_action`. Chess960 (castling = king takes own rook): a castling with
    the king and rook on their standard squares is the standard king move (``e1h1`` -> ``e1g1``,
    what the network learned castling as); any other castling is the king's move to its castling
    square (g- or c-file) when that move is in the action table and no other legal move has that
    action, else the king-onto-rook move (a queen-like move along the rank, never another legal
    move's action). A castling that can take neither (impossible in practice) gets no action: -1.
    """
    if not board.chess960:
        return [move_to_action(move) for move in moves]
    actions = [-1] * len(moves)
    used: set[int] = set()
    castlings = []
    for index, move in enumerate(moves):
        if board.is_castling(move):
            castlings.append(index)
        else:
            actions[index] = move_to_action(move)
            used.add(actions[index])
    for index in castlings:
        move = moves[index]
        standard = board.uci(move, chess960=False)
        king, rook = move.from_square, move.to_square
        rank = chess.square_rank(king)
        destination = chess.square(6 if chess.square_file(rook) > chess.square_file(king) else 2, rank)
        candidates = [standard] if standard != move.uci() else []
        if destination != king:
            candidates.append(chess.square_name(king) + chess.square_name(destination))
        candidates.append(chess.square_name(king) + chess.square_name(rook))
        for text in candidates:
            action = ACTION_INDEX.get(text)
            if action is not None and action not in used:
                actions[index] = action
                used.add(action)
                break
    return actions


def policy_logits(
    policy: ActionPolicy, board: chess.Board, moves: Sequence[chess.Move]
) -> tuple[np.ndarray, list[int]]:
    """The policy's raw logits (float64) of `moves` in `board` and their actions (one forward pass).
    A move without an action (`move_actions` -1) gets the lowest logit."""
    actions = move_actions(board, moves)
    with torch.no_grad():
        tokens, _ = policy.inputs([standard_view(board)])
        logits = policy(tokens).float()[0].cpu().numpy().astype(np.float64)
    values = np.array([logits[a] if a >= 0 else -np.inf for a in actions])
    if not np.isfinite(values).all():
        finite = values[np.isfinite(values)]
        values[~np.isfinite(values)] = (finite.min() if finite.size else 0.0) - 10.0
    return values, actions


def softmax(values: np.ndarray) -> np.ndarray:
    """exp(values) normalised to sum to 1 (shifted by the maximum, so it cannot overflow)."""
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()


class Chess960Evaluator(NetworkEvaluator):
    """`NetworkEvaluator` that also evaluates Chess960 boards (`standard_view`, `move_actions`);
    a batch of standard boards goes through `NetworkEvaluator` unchanged.

    For `chessgrpo.search.Searcher`'s ``evaluator_class``.
    """

    def _network(
        self,
        boards: Sequence[chess.Board],
        legal: Sequence[list[chess.Move]],
        facts: Sequence[list[tuple[int, int]]] | None = None,
        fens: Sequence[str] | None = None,
    ) -> list[tuple[np.ndarray, float]]:
        """`NetworkEvaluator._network` over the standard views, with the priors of `move_actions`
        (the network reads the standard view's move facts and FEN, so `facts` and `fens` of a Chess960
        board are not used)."""
        if not any(board.chess960 for board in boards):
            return super()._network(boards, legal, facts, fens)
        with torch.no_grad():
            tokens, _ = self.policy.inputs([standard_view(board) for board in boards])
            logits, value_logits = self.policy(tokens, with_value=True)
            logits = logits.float().cpu().numpy().astype(np.float64)
            values = torch.sigmoid(value_logits.float()).cpu().numpy()
        self.network_positions += len(boards)
        self.network_calls += 1
        out = []
        for row, (board, moves) in enumerate(zip(boards, legal)):
            actions = move_actions(board, moves)
            row_logits = np.array([logits[row, a] if a >= 0 else logits[row].min() - 10.0 for a in actions])
            out.append((softmax(row_logits / self.prior_temperature), float(values[row])))
        return out
