"""Offline move-quality metrics on held-out positions: top-1 agreement, expected-score loss, blunders.

Definitions (all from the side to move's point of view, values in [0, 1]):

- The **value of a move** m in position P is ``1 - win_probability(P after m)`` from
  `EnginePool.evaluate`: the opponent is to move after m, so its expected score is flipped.
  Terminal positions are exact without a search (a mating move is worth 1.0, a stalemating
  move 0.5).
- ``v_best`` is the value of the position's label (Stockfish's best move), valued the *same*
  way: the position after the move, the same pool and the same search limit. ``v_chosen`` is
  the value of the player's move.
- **Expected-score loss** ``ESL = max(v_best, v_chosen) - v_chosen``. It is >= 0 by
  construction, 0 for the label's own move, and a move the engine happens to value above its
  own label (search noise between two node-limited searches) counts as 0, never as a gain.
  This is the quantity Lichess's accuracy is built on (win-percentage loss per move); lower is
  better.
- **top1**: the chosen move equals the label. **blunder**: ESL > `BLUNDER_THRESHOLD` (0.2).

Every after-move position of a batch (label and chosen move for each position) goes to the pool
in one `evaluate` call, so duplicates (chosen == best) are searched once and the pool's cache
serves repeated evaluations (the label values are shared by every player evaluated on the same
positions). Per-position `MoveRecord`s are kept so two players can later be compared with
`stats.paired_bootstrap_difference` on the same positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import chess
import numpy as np

from chessgrpo.board import move_to_action
from chessgrpo.board.move_facts import en_prise_actions
from chessgrpo.eval.positions import LabelledPosition
from chessgrpo.play.players import Player
from chessgrpo.stats import Interval, bootstrap_interval

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool

BLUNDER_THRESHOLD = 0.2
"""A move losing more than this much expected score is a blunder (Lichess uses similar cuts)."""


@dataclasses.dataclass(frozen=True)
class MoveRecord:
    """One position's outcome: the player's move against the label, both valued after the move."""

    fen: str
    chosen: str
    """The player's move (UCI)."""
    best: str
    """The label's best move (UCI)."""
    v_best: float
    """Value of the label's move for the side to move: 1 - win probability after it."""
    v_chosen: float
    """Value of the chosen move for the side to move."""
    esl: float
    """max(v_best, v_chosen) - v_chosen."""
    top1: bool
    blunder: bool
    chosen_check: bool = False
    """The chosen move gives check (a policy that checks far more often than its labels wastes moves)."""
    best_check: bool = False
    """The label's move gives check."""
    chosen_en_prise: bool = False
    """The chosen move leaves the moved piece en prise (`board.move_facts.en_prise_actions`): the
    tiny policy's commonest blunder before the en-prise fact."""
    best_en_prise: bool = False
    """The label's move leaves the moved piece en prise (a sacrifice, or the estimate's miss)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OfflineResult:
    """A player's offline metrics with 95% (by default) bootstrap intervals over positions."""

    player: str
    top1: Interval
    esl: Interval
    blunder_rate: Interval
    records: tuple[MoveRecord, ...]

    def to_json(self, records: bool = False) -> dict:
        out = {
            "player": self.player,
            "top1": self.top1.to_json(),
            "esl": self.esl.to_json(),
            "blunder_rate": self.blunder_rate.to_json(),
        }
        if records:
            out["records"] = [record.to_json() for record in self.records]
        return out


def move_values(
    pool: EnginePool, boards: Sequence[chess.Board], moves: Sequence[chess.Move], *, nodes: int | None = None
) -> list[float]:
    """The value of each (board, move) for the side to move: 1 - win probability after the move.

    All positions go to the pool in one call (duplicates searched once, cache used). A move
    that is illegal in its board raises `ValueError`.
    """
    if len(boards) != len(moves):
        raise ValueError(f"need one move per board, got {len(moves)} moves for {len(boards)} boards")
    after = []
    for board, move in zip(boards, moves):
        if not board.is_legal(move):
            raise ValueError(f"illegal move {move.uci()} in {board.fen()!r}")
        position = board.copy(stack=False)
        position.push(move)
        after.append(position)
    evaluations = pool.evaluate(after, nodes=nodes) if after else []
    return [1.0 - evaluation.win_probability for evaluation in evaluations]


def score_moves(
    pool: EnginePool,
    positions: Sequence[LabelledPosition],
    chosen: Sequence[chess.Move],
    *,
    nodes: int | None = None,
) -> list[MoveRecord]:
    """A `MoveRecord` per position for the chosen moves (see the module docstring)."""
    if len(positions) != len(chosen):
        raise ValueError(f"need one chosen move per position, got {len(chosen)} for {len(positions)}")
    boards = [position.board for position in positions]
    values = move_values(pool, boards + boards, [p.best_move for p in positions] + list(chosen), nodes=nodes)
    best_values, chosen_values = values[: len(positions)], values[len(positions) :]
    records = []
    for position, move, v_best, v_chosen in zip(positions, chosen, best_values, chosen_values):
        esl = max(v_best, v_chosen) - v_chosen
        en_prise = set(en_prise_actions(position.board))
        records.append(
            MoveRecord(
                fen=position.fen,
                chosen=move.uci(),
                best=position.best_move.uci(),
                v_best=v_best,
                v_chosen=v_chosen,
                esl=esl,
                top1=move == position.best_move,
                blunder=esl > BLUNDER_THRESHOLD,
                chosen_check=position.board.gives_check(move),
                best_check=position.board.gives_check(position.best_move),
                chosen_en_prise=move_to_action(move) in en_prise,
                best_en_prise=move_to_action(position.best_move) in en_prise,
            )
        )
    return records


def summarize(
    player: str, records: Sequence[MoveRecord], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> OfflineResult:
    """Aggregate records into bootstrap intervals of top1, mean ESL and blunder rate."""

    def interval(values: list[float]) -> Interval:
        return bootstrap_interval(
            np.asarray(values, dtype=np.float64), confidence=confidence, resamples=resamples, seed=seed
        )

    return OfflineResult(
        player=player,
        top1=interval([float(r.top1) for r in records]),
        esl=interval([r.esl for r in records]),
        blunder_rate=interval([float(r.blunder) for r in records]),
        records=tuple(records),
    )


def evaluate_offline(
    player: Player,
    positions: Sequence[LabelledPosition],
    pool: EnginePool,
    *,
    nodes: int | None = None,
    batch_size: int = 256,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> OfflineResult:
    """Let `player` move in every position and measure its moves against the labels.

    Positions are processed in batches of `batch_size`: one `choose_moves` call and one pool call
    per batch. `progress(n)` is called as n more positions are done.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    records: list[MoveRecord] = []
    for start in range(0, len(positions), batch_size):
        batch = list(positions[start : start + batch_size])
        chosen = player.choose_moves([position.board.copy(stack=False) for position in batch])
        if len(chosen) != len(batch):
            raise RuntimeError(f"player {player.name!r} returned {len(chosen)} moves for {len(batch)} positions")
        records.extend(score_moves(pool, batch, chosen, nodes=nodes))
        if progress:
            progress(len(batch))
    return summarize(player.name, records, confidence=confidence, resamples=resamples, seed=seed)
