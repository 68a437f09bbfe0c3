"""Search with the action policy and its value head: PUCT (`search.puct`) and, for comparison, a
policy-pruned alpha-beta (`search.alphabeta`), over one leaf evaluator (`search.evaluator`) that
scores mate, draws and 3-4-piece tablebase positions exactly.

`Searcher` is what players use (`chessgrpo uci`, `eval games`, `eval puzzles`, `eval offline`): a
policy, an algorithm and its limits; `Searcher.search(board)` gives a `SearchResult`. Its hooks
(`search.base`) restrict the root moves, stop a search early and report on a running one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import chess

from chessgrpo.models.policy import ActionPolicy
from chessgrpo.search.alphabeta import AlphaBetaConfig, AlphaBetaSearch
from chessgrpo.search.base import REPORT_INTERVAL_S, Report, RootMove, SearchLimits, SearchResult, StopCheck
from chessgrpo.search.evaluator import LeafEvaluation, NetworkEvaluator, rule_value
from chessgrpo.search.puct import PuctConfig, PuctSearch

ALGORITHMS = ("puct", "alphabeta")


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """How a player searches: the algorithm, its node budget and constants (`nodes` 0 = no search)."""

    nodes: int = 0
    """Search budget per move: PUCT simulations, or alpha-beta network evaluations (0 = play the policy's top move)."""
    algorithm: str = "puct"
    """puct (policy-guided MCTS, as AlphaZero/Lc0) or alphabeta (policy-pruned negamax)."""
    c_puct: float = 1.5
    """PUCT exploration weight."""
    batch_size: int = 16
    """Leaves per network call (PUCT)."""
    prior_temperature: float = 1.0
    """Softmax temperature of the priors."""
    width: int = 4
    """Alpha-beta: moves searched per node."""
    syzygy_path: str | None = None
    """Syzygy directory: 3-4-piece positions are scored (and, at the root, played) exactly; None = off."""

    def __post_init__(self) -> None:
        if self.nodes < 0:
            raise ValueError(f"search nodes must be >= 0, got {self.nodes}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown search algorithm {self.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")

    @property
    def enabled(self) -> bool:
        return self.nodes > 0

    def describe(self) -> str:
        """Every setting that changes the searched move (for PGN headers and JSON summaries)."""
        if not self.enabled:
            return "no search (policy argmax)"
        shape = (
            f"c_puct {self.c_puct:g}, batch {self.batch_size}" if self.algorithm == "puct" else f"width {self.width}"
        )
        tables = f"syzygy {self.syzygy_path}" if self.syzygy_path else "no syzygy"
        return f"{self.algorithm} search, {self.nodes} nodes/move, {shape}, prior temperature {self.prior_temperature:g}, {tables}"


class Searcher:
    """A policy with a value head plus a search algorithm (`SearchSettings`).

    `evaluator_class` builds the leaf evaluator: `NetworkEvaluator`, or a subclass that presents
    boards to the network differently (`chessgrpo.uci.chess960.Chess960Evaluator`).
    """

    def __init__(
        self,
        policy: ActionPolicy,
        settings: SearchSettings,
        *,
        evaluator_class: type[NetworkEvaluator] = NetworkEvaluator,
    ):
        tablebase = None
        if settings.syzygy_path:
            from chessgrpo.engine.tablebase import Tablebase

            tablebase = Tablebase(settings.syzygy_path)
        self.settings = settings
        self.evaluator = evaluator_class(policy, prior_temperature=settings.prior_temperature, tablebase=tablebase)
        if settings.algorithm == "puct":
            self.algorithm: PuctSearch | AlphaBetaSearch = PuctSearch(
                self.evaluator, PuctConfig(c_puct=settings.c_puct, batch_size=settings.batch_size)
            )
        else:
            self.algorithm = AlphaBetaSearch(self.evaluator, AlphaBetaConfig(width=settings.width))

    def search(
        self,
        board: chess.Board,
        *,
        nodes: int | None = None,
        seconds: float | None = None,
        root_moves: Sequence[chess.Move] | None = None,
        should_stop: StopCheck | None = None,
        report: Report | None = None,
        report_interval: float = REPORT_INTERVAL_S,
    ) -> SearchResult:
        """Search `board` with the settings' budget (or `nodes`), stopping early after `seconds`.

        The hooks (`search.base`): play one of `root_moves` (None = any legal move); stop early
        when ``should_stop(nodes)`` is true; `report` the search so far every `report_interval` s.
        """
        limits = SearchLimits(nodes=nodes or max(1, self.settings.nodes), seconds=seconds)
        return self.algorithm.search(
            board,
            limits,
            root_moves=root_moves,
            should_stop=should_stop,
            report=report,
            report_interval=report_interval,
        )

    def close(self) -> None:
        if self.evaluator.tablebase is not None:
            self.evaluator.tablebase.close()


LC0_CP_SCALE = 111.714640912
LC0_Q_SCALE = 1.5620688421
"""Lc0's ``centipawn`` score convention: cp = 111.714640912 tan(1.5620688421 Q), Q = W - L = 2v - 1."""
MAX_ESTIMATE_CP = 2000
"""Estimates stay within +-2000 cp (a tablebase win is reported as exactly that)."""


def value_to_centipawns(value: float) -> int:
    """A UCI ``score cp`` for an expected score v in [0, 1], on Lc0's centipawn scale.

    cp = 111.714640912 tan(1.5620688421 (2v - 1)), clipped to +-2000: the convention of Lc0, the
    widely used engine that, like this one, scores positions by a value network's expected score
    (its Q is W - L = 2v - 1). A checkable anchor: +100 cp is an expected score of 0.734, about
    where Stockfish's normalisation puts it (+100 cp = a 50% chance to win).
    """
    q = 2.0 * min(max(float(value), 0.0), 1.0) - 1.0
    centipawns = LC0_CP_SCALE * math.tan(LC0_Q_SCALE * q)
    return round(max(-MAX_ESTIMATE_CP, min(MAX_ESTIMATE_CP, centipawns)))


def centipawns_to_value(centipawns: float) -> float:
    """The inverse of `value_to_centipawns` (unclipped): v = (1 + atan(cp / 111.71) / 1.5621) / 2."""
    q = math.atan(centipawns / LC0_CP_SCALE) / LC0_Q_SCALE
    return min(max(0.5 * (1.0 + q), 0.0), 1.0)


__all__ = [
    "ALGORITHMS",
    "AlphaBetaConfig",
    "AlphaBetaSearch",
    "LeafEvaluation",
    "NetworkEvaluator",
    "PuctConfig",
    "PuctSearch",
    "REPORT_INTERVAL_S",
    "Report",
    "RootMove",
    "SearchLimits",
    "SearchResult",
    "SearchSettings",
    "Searcher",
    "StopCheck",
    "centipawns_to_value",
    "rule_value",
    "value_to_centipawns",
]
