"""Engine values of a rollout's positions, searched while the rollout is still being played (`EngineValues`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import chess

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool


class EngineValues:
    """Engine values of a rollout's positions, searched while the rollout is still being played.

    `add` hands positions to the pool as soon as they are reached (`EnginePool.submit` at background
    priority, so an opponent's move, which the rollout waits for, is searched first); `values` waits
    for what is left. The searches are exactly those `tasks.trajectory_rewards.engine_step_rewards` would make after the
    rollout (the same positions at the same node limit, and the pool's results do not depend on
    order or timing), so the rewards are identical; the engine just works while the policy does.
    """

    def __init__(self, pool: EnginePool, nodes: int):
        self.pool, self.nodes = pool, nodes
        self._index: dict[str, int] = {}
        self._batches: list[Any] = []
        self._values: list[float] = []

    def add(self, boards: Sequence[chess.Board], keys: Sequence[str] | None = None) -> None:
        """Start valuing those of `boards` not seen before (unfinished positions only: finished ones are
        exact); `keys`: their FENs, when the caller has them."""
        fresh, fresh_keys = [], []
        for board, key in zip(boards, keys if keys is not None else (board.fen() for board in boards)):
            if key not in self._index:
                self._index[key] = len(self._index)
                fresh.append(board)  # the pool validates a copy
                fresh_keys.append(key)
        if fresh:
            from chessgrpo.engine.pool import BACKGROUND

            self._batches.append(self.pool.submit(fresh, nodes=self.nodes, priority=BACKGROUND, fens=fresh_keys))

    def value(self, key: str) -> float:
        """The engine's win probability for the side to move at the position with FEN `key` (added
        before); waits for the searches."""
        while self._batches:  # in submission order: the index counts positions in that order
            self._values.extend(e.win_probability for e in self._batches.pop(0).result())
        return self._values[self._index[key]]
