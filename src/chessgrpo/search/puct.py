"""Policy-guided Monte Carlo tree search (PUCT), as in AlphaZero and Lc0.

Each simulation walks from the root, at every node taking the child that maximises

    Q(s, a) + c_puct * P(s, a) * sqrt(N(s)) / (1 + N(s, a))

where P is the network's prior, N visit counts and Q the mean value (in [-1, 1], from the point
of view of the player choosing at s). An unvisited child's Q is its parent's value minus
`fpu_reduction` (Lc0's "first play urgency"). At the first unexpanded node the walk stops: the
network (or an exact rule / tablebase, `search.evaluator`) gives that node's priors and value,
and the value is backed up the path, negated at every ply.

Leaves are evaluated in batches of up to `batch_size`: a walk adds a *virtual loss* to the edges
it takes, so the next walks of the batch spread to other leaves; two walks that reach the same
leaf in one batch ("collisions") evaluate it once. Exact nodes (mate, draws, tablebase) are
never expanded and cost no network call.

The move played is the most visited root child (ties: higher Q, then higher prior), so the
search is deterministic for a given network, position and budget. `nodes` counts simulations
(Lc0's "nodes"), each of which ends at one leaf; the root's own evaluation is not counted.

A caller may restrict the root (``root_moves``), stop the search early (``should_stop``, asked
before every simulation) and follow it (``report``); see `search.base`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import chess
import numpy as np

from chessgrpo.search.base import (
    REPORT_INTERVAL_S,
    Progress,
    Report,
    RootMove,
    SearchLimits,
    SearchResult,
    StopCheck,
    decided_result,
    decided_root,
    mate_in_one_result,
    root_candidates,
    tablebase_result,
)
from chessgrpo.search.evaluator import LeafEvaluation, NetworkEvaluator

__all__ = [  # the shared types and root helpers stay importable from here, where they used to live
    "PuctConfig",
    "PuctSearch",
    "RootMove",
    "SearchLimits",
    "SearchResult",
    "decided_result",
    "mate_in_one_result",
    "search_many",
    "tablebase_result",
]


@dataclasses.dataclass(frozen=True)
class PuctConfig:
    """PUCT's constants (defaults close to AlphaZero's and Lc0's for a small network)."""

    c_puct: float = 1.5
    """Exploration weight of the prior term."""
    fpu_reduction: float = 0.3
    """An unvisited child's Q is the parent's Q minus this (in [-1, 1] units)."""
    batch_size: int = 16
    """Leaves evaluated per network call (virtual loss spreads them)."""

    def __post_init__(self) -> None:
        if self.c_puct <= 0:
            raise ValueError(f"c_puct must be > 0, got {self.c_puct}")
        if self.batch_size < 1:
            raise ValueError(f"search batch_size must be >= 1, got {self.batch_size}")


class _Node:
    """A searched position: its moves, priors and per-edge statistics (Q from the chooser's view)."""

    __slots__ = ("moves", "priors", "children", "edge_visits", "edge_value", "visits", "value", "exact")

    def __init__(self, evaluation: LeafEvaluation):
        self.moves = evaluation.moves
        self.priors = evaluation.priors
        count = len(evaluation.moves)
        self.children: list[_Node | None] = [None] * count
        self.edge_visits = np.zeros(count)
        self.edge_value = np.zeros(count)  # sums of values in [-1, 1] for the player to move here
        self.visits = 1
        self.value = 2.0 * evaluation.value - 1.0  # this node's own estimate, side to move, [-1, 1]
        self.exact = evaluation.exact

    def restrict(self, moves: Sequence[chess.Move]) -> None:
        """Keep only the edges of `moves` (a fresh node's, before any visit), priors renormalised
        (uniform if they sum to zero)."""
        wanted = set(moves)
        keep = [i for i, move in enumerate(self.moves) if move in wanted]
        priors = np.asarray(self.priors, dtype=np.float64)[keep]
        total = priors.sum()
        self.moves = [self.moves[i] for i in keep]
        self.priors = priors / total if total > 0 else np.full(len(keep), 1.0 / len(keep))
        self.children = [None] * len(keep)
        self.edge_visits = np.zeros(len(keep))
        self.edge_value = np.zeros(len(keep))

    def select(self, c_puct: float, fpu_reduction: float) -> int:
        visited = self.edge_visits > 0
        q = np.where(visited, self.edge_value / np.maximum(self.edge_visits, 1), self.value - fpu_reduction)
        u = c_puct * self.priors * math.sqrt(self.visits) / (1.0 + self.edge_visits)
        return int(np.argmax(q + u))


class PuctSearch:
    """PUCT over a `NetworkEvaluator` (module docstring). One instance can search many positions."""

    def __init__(self, evaluator: NetworkEvaluator, config: PuctConfig | None = None):
        self.evaluator = evaluator
        self.config = config or PuctConfig()

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
        """Search `board` (with its move stack, for repetitions; it is restored) and return the result.

        `root_moves`, `should_stop`, `report` and `report_interval` are the hooks of `search.base`:
        play one of `root_moves`; stop when ``should_stop(nodes)`` (asked before every
        simulation) says so; `report` the search so far after a batch, every `report_interval` s.

        Raises:
            ValueError: the side to move has no legal move, or `root_moves` is empty or not legal.
        """
        limits = limits or SearchLimits()
        started = time.perf_counter()
        positions_before = self.evaluator.network_positions
        board = board.copy()
        moves = root_candidates(board, root_moves)
        known = decided_root(self.evaluator, board, moves, started)
        if known is not None:
            return known
        root = _Node(self.evaluator.evaluate([board], exact=False)[0])  # searched whatever rules say of it
        if len(moves) < len(root.moves):
            root.restrict(moves)
        if len(root.moves) == 1:  # a forced move needs no search
            return self._result(root, 0, started, positions_before, 0)
        deadline = None if limits.seconds is None else started + limits.seconds
        progress = Progress(report, report_interval, started)
        config = self.config
        nodes = seldepth = 0
        stopped = False
        while not stopped and nodes < limits.nodes and (deadline is None or time.perf_counter() < deadline):
            batch = min(config.batch_size, limits.nodes - nodes)
            walks: list[list[tuple[_Node, int]]] = []
            leaves: list[chess.Board] = []
            claimed: set[tuple[int, int]] = set()
            for _ in range(batch):
                # Asked per simulation, not per batch, so a node limit moved mid-search (UCI
                # ponderhit) is met exactly; the walks taken so far are still evaluated below.
                if should_stop is not None and should_stop(nodes + 1):
                    stopped = True
                    break
                path, leaf_board, exact_value = self._walk(root, board)
                nodes += 1
                seldepth = max(seldepth, len(path))
                parent, edge = path[-1]
                if exact_value is not None:
                    self._backup(path, exact_value)
                elif (id(parent), edge) in claimed:  # a collision: undo the virtual loss, count the node
                    self._backup(path, None)
                else:
                    claimed.add((id(parent), edge))
                    walks.append(path)
                    leaves.append(leaf_board)
            if leaves:
                for path, evaluation in zip(walks, self.evaluator.evaluate(leaves)):
                    parent, edge = path[-1]
                    child = _Node(evaluation)
                    parent.children[edge] = child
                    self._backup(path, child.value)
            progress(lambda: self._result(root, nodes, started, positions_before, seldepth))  # noqa: B023 (called now or never)
        return self._result(root, nodes, started, positions_before, seldepth)

    def _walk(self, root: _Node, board: chess.Board) -> tuple[list[tuple[_Node, int]], chess.Board, float | None]:
        """Descend with virtual loss to an unexpanded edge or an exact node.

        Returns the path of (node, edge), the leaf's board (a copy with its stack) and, for an
        exact node already in the tree, its value (side to move at the leaf, [-1, 1]).
        """
        config = self.config
        node, path = root, []
        pushed = 0
        try:
            while True:
                edge = node.select(config.c_puct, config.fpu_reduction)
                node.edge_visits[edge] += 1  # virtual loss: a visit that lost, until backed up
                node.edge_value[edge] -= 1.0
                node.visits += 1
                path.append((node, edge))
                board.push(node.moves[edge])
                pushed += 1
                child = node.children[edge]
                if child is None:
                    return path, board.copy(), None
                if child.exact:
                    return path, board, child.value
                node = child
        finally:
            for _ in range(pushed):
                board.pop()

    @staticmethod
    def _backup(path: list[tuple[_Node, int]], value: float | None) -> None:
        """Replace each edge's virtual loss by `value` (the leaf's side to move, [-1, 1]), negated
        each ply going up; `value` None removes the virtual visit altogether (a collision)."""
        for node, edge in reversed(path):
            if value is None:
                node.edge_visits[edge] -= 1
                node.edge_value[edge] += 1.0
                node.visits -= 1
                continue
            value = -value  # the chooser at `node` is the other side from the node below
            node.edge_value[edge] += 1.0 + value

    def _result(self, root: _Node, nodes: int, started: float, positions_before: int, seldepth: int) -> SearchResult:
        order = sorted(
            range(len(root.moves)),
            key=lambda i: (-root.edge_visits[i], -self._edge_q(root, i), -root.priors[i], root.moves[i].uci()),
        )
        root_moves = [
            RootMove(
                move=root.moves[i],
                visits=int(root.edge_visits[i]),
                value=(self._edge_q(root, i) + 1.0) / 2.0,
                prior=float(root.priors[i]),
                pv=[root.moves[i], *self._principal_variation(root.children[i])],
            )
            for i in order
        ]
        best = order[0]
        child = root.children[best]
        return SearchResult(
            move=root.moves[best],
            value=root_moves[0].value,
            root_moves=root_moves,
            nodes=nodes,
            network_positions=self.evaluator.network_positions - positions_before,
            seconds=time.perf_counter() - started,
            depth=len(root_moves[0].pv),
            seldepth=seldepth,
            exact=child is not None and child.exact,
        )

    @staticmethod
    def _edge_q(node: _Node, edge: int) -> float:
        visits = node.edge_visits[edge]
        if visits == 0:
            return node.value
        return float(node.edge_value[edge] / visits)

    @staticmethod
    def _principal_variation(node: _Node | None, limit: int = 32) -> list[chess.Move]:
        line: list[chess.Move] = []
        while node is not None and len(node.moves) and node.edge_visits.sum() > 0 and len(line) < limit:
            edge = int(np.argmax(node.edge_visits))
            line.append(node.moves[edge])
            node = node.children[edge]
        return line


def search_many(search: PuctSearch, boards: Sequence[chess.Board], limits: SearchLimits) -> list[SearchResult]:
    """One search per board, in order (each board keeps its own tree)."""
    return [search.search(board, limits) for board in boards]
