"""Policy-pruned alpha-beta: a few plies of negamax over the network's most likely moves.

The comparison point for PUCT (`search.puct`): at every node only the `width` moves with the
highest prior are searched (in prior order, which is also the move ordering); leaves take the
value head's estimate, exact positions their rule or tablebase value (`search.evaluator`). An
exact win found `ply` plies down scores ``1 - 0.001 * ply`` so shorter mates are preferred.

Iterative deepening (depth 1, 2, ...) runs until the node budget or the time limit would be
exceeded mid-iteration; the last completed depth gives the move. Each interior node evaluates
all its searched children in one batched network call; network evaluations are cached by
position within one search. `nodes` counts positions evaluated by the network.

A caller may restrict the root (``root_moves``), stop the search early (``should_stop``, asked
before every network call) and follow it (``report``, after every completed iteration); see
`search.base`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import chess

from chessgrpo.search.base import (
    REPORT_INTERVAL_S,
    Progress,
    Report,
    RootMove,
    SearchLimits,
    SearchResult,
    StopCheck,
    decided_root,
    root_candidates,
)
from chessgrpo.search.evaluator import LeafEvaluation, NetworkEvaluator

MATE_PLY_DISCOUNT = 0.001


@dataclasses.dataclass(frozen=True)
class AlphaBetaConfig:
    """Shape of the policy-pruned tree."""

    width: int = 4
    """Moves searched per node (the highest priors)."""
    root_width: int = 0
    """Moves searched at the root (0 = every legal move: a mate the prior ranks low is still seen)."""
    max_depth: int = 8
    """Deepest iteration (plies)."""

    def __post_init__(self) -> None:
        if min(self.width, self.max_depth) < 1 or self.root_width < 0:
            raise ValueError(f"alpha-beta width, root_width and max_depth must be >= 1, got {self}")


class _OutOfBudget(Exception):
    pass


class AlphaBetaSearch:
    """Policy-pruned negamax with alpha-beta and iterative deepening (module docstring)."""

    _should_stop: StopCheck | None = None

    def __init__(self, evaluator: NetworkEvaluator, config: AlphaBetaConfig | None = None):
        self.evaluator = evaluator
        self.config = config or AlphaBetaConfig()

    def search(
        self,
        board: chess.Board,
        limits: SearchLimits | None = None,
        *,
        root_moves: Sequence[chess.Move] | None = None,
        should_stop: StopCheck | None = None,
        report: Report | None = None,
        report_interval: float = REPORT_INTERVAL_S,
    ) -> SearchResult:
        """Search `board` (its move stack is used for repetitions and restored).

        `root_moves`, `should_stop`, `report` and `report_interval` are the hooks of `search.base`:
        play one of `root_moves`; stop when ``should_stop(nodes)`` (asked before every network
        call) says so; `report` the search so far after an iteration, every `report_interval` s.

        Raises:
            ValueError: the side to move has no legal move, or `root_moves` is empty or not legal.
        """
        limits = limits or SearchLimits()
        started = time.perf_counter()
        board = board.copy()
        allowed = root_candidates(board, root_moves)
        known = decided_root(self.evaluator, board, allowed, started)
        if known is not None:
            return known
        self._cache: dict[object, LeafEvaluation] = {}
        self._positions_before = self.evaluator.network_positions
        self._budget = limits.nodes
        self._deadline = None if limits.seconds is None else started + limits.seconds
        self._should_stop = should_stop
        root = self.evaluator.evaluate([board], exact=False)[0]
        searched = set(allowed)
        order = [i for i in sorted(range(len(root.moves)), key=lambda i: -root.priors[i]) if root.moves[i] in searched]
        moves = [root.moves[i] for i in order][: self.config.root_width or None]
        # Depth 0: the prior's choice, so a budget too small for depth 1 still answers.
        scores = {move: (2.0 * root.value - 1.0, [move]) for move in moves}
        best_move, depth = moves[0], 0
        seldepth = 1
        progress = Progress(report, report_interval, started)
        if len(allowed) > 1:
            for depth_limit in range(1, self.config.max_depth + 1):
                try:
                    iteration = self._root_iteration(board, moves, depth_limit)
                except _OutOfBudget:
                    break
                scores, depth = iteration, depth_limit
                best_move = max(moves, key=lambda m: (scores[m][0], -moves.index(m)))
                seldepth = depth_limit
                moves = sorted(moves, key=lambda m: -scores[m][0])  # best first: better cut-offs next time
                progress(lambda: self._result(root, scores, best_move, depth, seldepth, started))  # noqa: B023 (called now or never)
        return self._result(root, scores, best_move, depth, seldepth, started)

    def _result(
        self,
        root: LeafEvaluation,
        scores: dict[chess.Move, tuple[float, list[chess.Move]]],
        best_move: chess.Move,
        depth: int,
        seldepth: int,
        started: float,
    ) -> SearchResult:
        """The result of the last completed iteration: `best_move` first, then by score."""
        ranked = sorted(scores, key=lambda m: (m != best_move, -scores[m][0]))
        priors = dict(zip(root.moves, root.priors))
        root_moves = [
            RootMove(
                move=m, visits=0, value=(min(1.0, scores[m][0]) + 1.0) / 2.0, prior=float(priors[m]), pv=scores[m][1]
            )
            for m in ranked
        ]
        used = self.evaluator.network_positions - self._positions_before
        return SearchResult(
            move=best_move,
            value=root_moves[0].value,
            root_moves=root_moves,
            nodes=used,
            network_positions=used,
            seconds=time.perf_counter() - started,
            depth=depth,
            seldepth=seldepth,
            exact=abs(scores[best_move][0]) > 1.0 - MATE_PLY_DISCOUNT * self.config.max_depth - 1e-9,
        )

    def _root_iteration(
        self, board: chess.Board, moves: list[chess.Move], depth: int
    ) -> dict[chess.Move, tuple[float, list[chess.Move]]]:
        self._prefetch(board, moves)
        alpha, scores = -2.0, {}
        for move in moves:
            board.push(move)
            try:
                score, line = self._negamax(board, depth - 1, -2.0, -alpha, 1)
            finally:
                board.pop()
            scores[move] = (-score, [move, *line])
            alpha = max(alpha, -score)
        return scores

    def _negamax(
        self, board: chess.Board, depth: int, alpha: float, beta: float, ply: int
    ) -> tuple[float, list[chess.Move]]:
        """Score in [-1, 1] for the side to move at `board`, and the line that reaches it."""
        evaluation = self._evaluate(board)
        if evaluation.exact:
            value = 2.0 * evaluation.value - 1.0
            return value * (1.0 - MATE_PLY_DISCOUNT * ply) if value else 0.0, []
        if depth == 0:
            return 2.0 * evaluation.value - 1.0, []
        order = sorted(range(len(evaluation.moves)), key=lambda i: -evaluation.priors[i])[: self.config.width]
        moves = [evaluation.moves[i] for i in order]
        self._prefetch(board, moves)
        best, best_line = -2.0, []
        for move in moves:
            board.push(move)
            try:
                score, line = self._negamax(board, depth - 1, -beta, -alpha, ply + 1)
            finally:
                board.pop()
            score = -score
            if score > best:
                best, best_line = score, [move, *line]
            alpha = max(alpha, score)
            if alpha >= beta:
                break
        return best, best_line

    def _evaluate(self, board: chess.Board) -> LeafEvaluation:
        legal = list(board.legal_moves)
        value = self.evaluator.exact_value(board, legal)
        if value is not None:
            return LeafEvaluation(legal, [], value, exact=True)  # type: ignore[arg-type]
        key = board._transposition_key()
        if key not in self._cache:
            self._spend(1)
            self._cache[key] = self.evaluator.evaluate([board], exact=False)[0]
        return self._cache[key]

    def _prefetch(self, board: chess.Board, moves: list[chess.Move]) -> None:
        """Evaluate the children of `board` through `moves` in one network call (the uncached, inexact ones)."""
        children: list[chess.Board] = []
        for move in moves:
            board.push(move)
            legal = list(board.legal_moves)
            if board._transposition_key() not in self._cache and self.evaluator.exact_value(board, legal) is None:
                children.append(board.copy(stack=False))
            board.pop()
        if children:
            self._spend(len(children))
            for child, evaluation in zip(children, self.evaluator.evaluate(children, exact=False)):
                self._cache[child._transposition_key()] = evaluation

    def _spend(self, count: int) -> None:
        """Raise `_OutOfBudget` unless `count` more network evaluations fit the limits and the caller's `should_stop`."""
        used = self.evaluator.network_positions - self._positions_before
        if used + count > self._budget or (self._deadline is not None and time.perf_counter() > self._deadline):
            raise _OutOfBudget
        if self._should_stop is not None and self._should_stop(used + count):
            raise _OutOfBudget
