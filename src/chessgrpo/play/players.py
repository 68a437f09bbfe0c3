"""Players: anything that picks one move per position, batched.

The evaluations (`offline`, `puzzles`) only see the `Player` protocol, so a trained policy and
its baselines are measured by the same code:

- `RandomPlayer`: a uniformly random legal move (seeded, reproducible). The floor.
- `StockfishPlayer`: Stockfish's best move at a tiny node budget (`DEFAULT_BASELINE_NODES`).
  Clearly weaker than the labels (searched at thousands of nodes) but far above random, so a
  model's numbers can be placed between two fixed anchors.
- `PolicyPlayer`: an action-policy model from `chessgrpo.models.policy` (argmax over legal
  moves at temperature 0), or, given `SearchSettings` with a node budget, the move its search
  (`chessgrpo.search`, which needs the policy's value head) finds. Torch is imported only when
  one is built.

`search_settings` turns the ``search_*`` config keys of `eval offline|puzzles|games` into the
`SearchSettings` those players take (None for a budget of 0: the policy's argmax).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import chess

from chessgrpo.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool
    from chessgrpo.search import Searcher, SearchSettings

DEFAULT_BASELINE_NODES = 50
"""Node budget of the Stockfish baseline.

Stockfish 15.1 completes about depth 2 (40-100 nodes) before it first checks a node limit, so
every budget up to ~50 is the same player: the weakest Stockfish there is. Measured against
2000-node labels (268 self-play positions; 500 dev puzzles), it sits far above random and
clearly below the labels, which is where a baseline is informative:

| player         | top1  | ESL   | blunder rate | puzzle solve rate |
|----------------|-------|-------|--------------|-------------------|
| random         | 0.04  | 0.255 | 0.38         | 0.00              |
| stockfish@50   | 0.50  | 0.034 | 0.07         | 0.69              |
| stockfish@300  | 0.57  | 0.029 | 0.05         | 0.82              |
| stockfish@2000 | 0.98  | 0.001 | 0.00         | 0.94              |
"""


@runtime_checkable
class Player(Protocol):
    """Chooses one legal move for each of a batch of positions."""

    name: str

    def choose_moves(self, boards: Sequence[chess.Board]) -> list[chess.Move]:
        """One legal move per board, in order. Boards must have at least one legal move."""
        ...


def _require_moves(boards: Sequence[chess.Board]) -> None:
    for board in boards:
        if not any(board.generate_legal_moves()):
            raise ValueError(f"position {board.fen()!r} has no legal moves; a player cannot move there")


def search_settings(
    nodes: int, algorithm: str = "puct", c_puct: float = 1.5, batch_size: int = 16, syzygy_path: str | None = None
) -> SearchSettings | None:
    """The `SearchSettings` of the ``search_*`` config keys; None when `nodes` is 0 (no search).

    The values are checked here, with the config keys' names, even when the search is off, so a
    bad value never waits for the first search to fail. `chessgrpo.search` (and torch) is
    imported only for an actual budget.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise ValueError(f"search_nodes must be an integer >= 0 (0 = the policy's argmax, no search), got {nodes!r}")
    if not c_puct > 0:
        raise ValueError(f"search_c_puct must be > 0, got {c_puct!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"search_batch_size must be an integer >= 1, got {batch_size!r}")
    if nodes == 0:
        return None
    from chessgrpo.search import SearchSettings

    return SearchSettings(
        nodes=nodes, algorithm=algorithm, c_puct=float(c_puct), batch_size=batch_size, syzygy_path=syzygy_path
    )


def search_label(search: SearchSettings | None) -> str:
    """A short tag for player names, e.g. "puct 256 nodes"; "" without search."""
    return f"{search.algorithm} {search.nodes} nodes" if search is not None and search.enabled else ""


def describe_search(search: SearchSettings | None) -> str:
    """`SearchSettings.describe`, or "no search (policy argmax)" without one."""
    return search.describe() if search is not None else "no search (policy argmax)"


def build_searcher(policy: Any, search: SearchSettings | None, temperature: float = 0.0) -> Searcher | None:
    """The `Searcher` of `policy` for an enabled `search`, else None.

    Raises:
        ValueError: sampling was asked for (a search plays its most visited move, deterministically),
            or the policy has no value head (`search.NetworkEvaluator`).
        FileNotFoundError: the search's Syzygy directory is missing.
    """
    if search is None or not search.enabled:
        return None
    if temperature > 0:
        raise InputError(
            f"search plays deterministically (its most visited move): use temperature 0 with a search budget, "
            f"got temperature {temperature:g} with {search.nodes} search nodes"
        )
    from chessgrpo.search import NetworkEvaluator, Searcher

    NetworkEvaluator(policy)  # checks the value head before any table is opened: the more basic error first
    try:
        return Searcher(policy, search)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{error} (the search's tablebases: engine.syzygy_path; null searches without them)"
        ) from None


class RandomPlayer:
    """A uniformly random legal move; the same seed and boards give the same moves."""

    def __init__(self, seed: int = 0):
        self.name = "random"
        self._rng = random.Random(seed)

    def choose_moves(self, boards: Sequence[chess.Board]) -> list[chess.Move]:
        _require_moves(boards)
        # python-chess generates legal moves in a fixed order, so the choice is reproducible.
        return [self._rng.choice(list(board.legal_moves)) for board in boards]


class StockfishPlayer:
    """Stockfish's best move at a small node budget, searched by an `EnginePool` (and cached)."""

    def __init__(self, pool: EnginePool, nodes: int = DEFAULT_BASELINE_NODES):
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
        self.name = "stockfish"
        self.pool = pool
        self.nodes = nodes

    def choose_moves(self, boards: Sequence[chess.Board]) -> list[chess.Move]:
        _require_moves(boards)
        evaluations = self.pool.evaluate(list(boards), nodes=self.nodes)
        moves = []
        for board, evaluation in zip(boards, evaluations):
            if evaluation.best_move is None:
                raise RuntimeError(f"Stockfish returned no move for {board.fen()!r}")
            move = chess.Move.from_uci(evaluation.best_move)
            if not board.is_legal(move):
                raise RuntimeError(f"Stockfish returned illegal move {evaluation.best_move!r} for {board.fen()!r}")
            moves.append(move)
        return moves


class PolicyPlayer:
    """Moves from an action-policy model (`chessgrpo.models.policy.ActionPolicy`).

    Without search: `temperature` 0 takes the most likely legal move; above 0 it samples
    (reproducibly when `seed` is given). Boards are sent to the model in chunks of `batch_size`.

    With an enabled `search` (`SearchSettings`, see `search_settings`): one search per board, in
    order, and its move (deterministic; temperature must be 0, and the policy needs a value head).
    The name then carries the budget, e.g. "ckpt (puct 256 nodes)". `close` releases the
    search's tablebase.
    """

    def __init__(
        self,
        policy: Any,
        temperature: float = 0.0,
        batch_size: int = 256,
        seed: int | None = None,
        name: str = "policy",
        search: SearchSettings | None = None,
    ):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.searcher = build_searcher(policy, search, temperature)
        self.search = search if self.searcher is not None else None
        label = search_label(self.search)
        self.name = f"{name} ({label})" if label else name
        self.policy = policy
        self.temperature = float(temperature)
        self.batch_size = int(batch_size)
        self._generator = None
        if seed is not None and self.temperature > 0:
            import torch

            self._generator = torch.Generator().manual_seed(seed)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        temperature: float = 0.0,
        batch_size: int = 256,
        seed: int | None = None,
        search: SearchSettings | None = None,
    ) -> PolicyPlayer:
        """Load a checkpoint directory or a run directory (its latest checkpoint).

        A `ValueError` of the player (no value head for the search, ...) names the checkpoint.
        """
        from chessgrpo.models.policy import load_policy  # lazy: torch and the model only when needed

        policy = load_policy(path, device=device)
        try:
            return cls(policy, temperature=temperature, batch_size=batch_size, seed=seed, name=str(path), search=search)
        except ValueError as error:
            raise InputError(f"checkpoint {path}: {error}") from None

    def choose_moves(self, boards: Sequence[chess.Board]) -> list[chess.Move]:
        _require_moves(boards)
        if self.searcher is not None:
            return [self._searched_move(board) for board in boards]
        moves: list[chess.Move] = []
        for start in range(0, len(boards), self.batch_size):
            chunk = list(boards[start : start + self.batch_size])
            predicted = self.policy.predict_moves(chunk, temperature=self.temperature, generator=self._generator)
            if len(predicted) != len(chunk):
                raise RuntimeError(f"policy returned {len(predicted)} moves for {len(chunk)} positions")
            for board, move in zip(chunk, predicted):
                if not board.is_legal(move):
                    raise RuntimeError(f"policy chose illegal move {move.uci()} in {board.fen()!r}")
            moves.extend(predicted)
        return moves

    def _searched_move(self, board: chess.Board) -> chess.Move:
        """The search's move (it sees the board's move stack, if any, for repetitions)."""
        move = self.searcher.search(board).move  # type: ignore[union-attr]
        if not board.is_legal(move):
            raise RuntimeError(f"search chose illegal move {move.uci()} in {board.fen()!r}")
        return move

    def close(self) -> None:
        """Release the search's tablebase (a no-op without search)."""
        if self.searcher is not None:
            self.searcher.close()
