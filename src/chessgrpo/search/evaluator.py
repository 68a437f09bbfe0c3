"""Leaf evaluation for search: exact values where the rules or the tablebases decide, the network elsewhere.

Values here are the **side to move's** expected score in [0, 1] (1 win, 0.5 draw, 0 loss), the
same scale as the engine labels and the value head (`models.policy.ValueHead`).

- Exact by the rules (`rule_value`): checkmate (0 for the side to move), stalemate, insufficient
  material, the fifty-move rule and repetition (a position that already stood once on the path
  or in the game counts as a draw, as in every game-tree search: repeating cannot be better
  than the draw the opponent could claim).
- Exact by a mate in one: a position whose side to move has a checkmating move is won (value 1).
  Only checking moves are tried, so it costs little; it spares the search from having to find
  a mate the prior ranks low (PUCT never visits a move with a tiny prior at small budgets).
- Exact by Syzygy (`NetworkEvaluator` with an `engine.tablebase.Tablebase`): positions with at most
  `tablebase_pieces` pieces and no castling rights take their WDL value; a cursed win or
  blessed loss is a draw (the fifty-move rule).
- The network: one batched forward gives each position's priors over its legal moves
  (``softmax(logits / prior_temperature)``, legal mask applied through `models.policy.log_probs`)
  and its value (`sigmoid` of the value head).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import chess
import numpy as np
import torch

from chessgrpo.board import move_to_action
from chessgrpo.board.move_facts import has_mate, move_facts
from chessgrpo.engine.evaluation import DRAW
from chessgrpo.models.policy import ActionPolicy, log_probs

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine.tablebase import Tablebase

TABLEBASE_VALUES = {2: 1.0, 1: DRAW, 0: DRAW, -1: DRAW, -2: 0.0}
"""Syzygy WDL -> expected score under the fifty-move rule (cursed wins and blessed losses draw)."""


def mating_move(board: chess.Board, legal: Sequence[chess.Move]) -> chess.Move | None:
    """A legal move that checkmates at once (the first in `legal`), else None."""
    for move in legal:
        if board.gives_check(move):
            board.push(move)
            mate = board.is_checkmate()
            board.pop()
            if mate:
                return move
    return None


def rule_value(board: chess.Board, legal: Sequence[chess.Move]) -> float | None:
    """The side to move's exact value when the rules end (or, for repetition, settle) the game; else None.

    `legal` is the position's legal moves (the caller lists them anyway). A twofold repetition
    counts as a draw (see the module docstring).
    """
    if not legal:
        return 0.0 if board.is_check() else DRAW
    if board.is_insufficient_material() or board.halfmove_clock >= 100 or board.is_repetition(2):
        return DRAW
    return None


@dataclasses.dataclass
class LeafEvaluation:
    """A position as search sees it: its legal moves, their priors and its value for the side to move."""

    moves: list[chess.Move]
    priors: np.ndarray
    """float64 [len(moves)], summing to 1 (empty for a terminal position)."""
    value: float
    """Side to move's expected score in [0, 1]."""
    exact: bool
    """The value is decided by the rules or the tablebases (the subtree is not searched)."""


class NetworkEvaluator:
    """Evaluates positions with an `ActionPolicy` that has a value head, batched (module docstring).

    `_network` is the one place boards meet the network; a subclass that encodes boards
    differently overrides it (`chessgrpo.uci.chess960.Chess960Evaluator` for Chess960).
    """

    def __init__(
        self,
        policy: ActionPolicy,
        *,
        prior_temperature: float = 1.0,
        tablebase: Tablebase | None = None,
        tablebase_pieces: int = 4,
    ):
        if policy.value_head is None:
            raise ValueError(
                "search needs a policy with a value head: this checkpoint has none "
                "(pretrain one with model.value_head: true, as configs/pretrain_tiny.yaml does)"
            )
        if prior_temperature <= 0:
            raise ValueError(f"prior_temperature must be > 0, got {prior_temperature}")
        self.policy = policy.eval()
        self.prior_temperature = float(prior_temperature)
        self.tablebase = tablebase
        self.tablebase_pieces = int(tablebase_pieces)
        self.network_positions = 0
        """Positions evaluated by the network so far (exact ones are not counted)."""
        self.network_calls = 0
        """Batched forward passes so far."""

    def exact_value(
        self, board: chess.Board, legal: Sequence[chess.Move], facts: Sequence[tuple[int, int]] | None = None
    ) -> float | None:
        """The rules' value, else 1 with a mate in one, else the tablebase's where it covers the
        position, else None. `facts` (the board's `move_facts`, when known) answer the mate in one."""
        value = rule_value(board, legal)
        return value if value is not None else self._value_beyond_rules(board, legal, facts)

    def _value_beyond_rules(
        self, board: chess.Board, legal: Sequence[chess.Move], facts: Sequence[tuple[int, int]] | None
    ) -> float | None:
        """`exact_value` for a position the rules leave open: a mate in one, else the tablebase."""
        if has_mate(facts) if facts is not None else mating_move(board, legal) is not None:
            return 1.0
        tablebase = self.tablebase
        if (
            tablebase is not None
            and chess.popcount(board.occupied) <= self.tablebase_pieces
            and tablebase.covers(board)
        ):
            return TABLEBASE_VALUES[tablebase.probe_wdl(board)]
        return None

    def evaluate(self, boards: Sequence[chess.Board], *, exact: bool = True) -> list[LeafEvaluation]:
        """One `LeafEvaluation` per board; the network sees only the positions no exact rule decides.

        With `exact` False (a search's root, which is searched whatever its value), only a position
        without legal moves is exact. Boards must carry their move stacks for repetition
        detection; they are not modified.
        """
        results: list[LeafEvaluation | None] = [None] * len(boards)
        pending: list[tuple[int, list[chess.Move], list[tuple[int, int]] | None, str | None]] = []
        with_facts = self.policy.config.move_facts
        for index, board in enumerate(boards):
            legal = list(board.legal_moves)  # listed once per leaf: priors, mask and rules all read it
            facts = fen = None
            if not legal:
                value = rule_value(board, legal)  # mate or stalemate: exact even at a root
            elif exact:
                # A policy that reads move facts needs them for the network anyway: computed once,
                # they also answer the mate-in-one test (the same pushes; ~1/3 of a leaf's cost).
                value = rule_value(board, legal)
                if value is None and with_facts:
                    fen = board.fen()  # ~0.1 ms: computed once for the facts and the network's input
                    facts = move_facts(board, fen, extra=self.policy.config.extra_facts)
                if value is None:
                    value = self._value_beyond_rules(board, legal, facts)
            else:
                value = None
            if value is not None:
                results[index] = LeafEvaluation(legal, np.zeros(0), value, exact=True)
            else:
                pending.append((index, legal, facts, fen))
        if pending:
            known = (
                [f for _, _, f, _ in pending] if with_facts and all(f is not None for _, _, f, _ in pending) else None
            )
            fens = [boards[i].fen() if fen is None else fen for i, _, _, fen in pending]
            evaluated = self._network(
                [boards[i] for i, _, _, _ in pending], [m for _, m, _, _ in pending], facts=known, fens=fens
            )
            for (index, legal, _, _), (priors, value) in zip(pending, evaluated):
                results[index] = LeafEvaluation(legal, priors, value, exact=False)
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _network(
        self,
        boards: Sequence[chess.Board],
        legal: Sequence[list[chess.Move]],
        facts: Sequence[list[tuple[int, int]]] | None = None,
        fens: Sequence[str] | None = None,
    ) -> list[tuple[np.ndarray, float]]:
        """Priors over `legal` (summing to 1) and value for each board, from one forward pass
        (counted in `network_positions` and `network_calls`); `facts` and `fens`: the boards' move
        facts and FENs, if known (a leaf's are computed once)."""
        actions = [[move_to_action(m) for m in moves] for moves in legal]
        tokens, masks = self.policy.inputs(boards, facts, fens, legal_actions=actions)
        logits, value_logits = self.policy(tokens, with_value=True)
        probs = log_probs(logits.float(), masks, self.prior_temperature).exp().cpu().numpy()
        values = torch.sigmoid(value_logits.float()).cpu().numpy()
        self.network_positions += len(boards)
        self.network_calls += 1
        out = []
        for row, indices in enumerate(actions):
            priors = probs[row, indices].astype(np.float64)
            out.append((priors / priors.sum(), float(values[row])))
        return out
