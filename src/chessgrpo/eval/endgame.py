"""Endgame evaluation against the tablebase-perfect defender, and the move pickers it plays.

`evaluate_endgame`: a player (the policy at argmax, a random mover, the tablebase) plays the strong
side of each held-out start position (`board.endgames.EndgameStarts.hold_out`) for up to
`max_moves` own moves against the perfect defender (`engine.tablebase.Tablebase.tablebase_move`:
the weak side picks the loss that takes longest, or a draw if any move draws). Reported: the mate
rate with a Wilson interval, the rate of DTZ-optimal moves, mean moves to mate against the
tablebase optimum ((DTZ + 1) / 2 own moves from the start), and how often the win was given away.

The pickers (`MovePicker`): `policy_picker` (the policy at argmax or sampled), `random_picker` (the
floor) and `tablebase_picker` (the DTZ-optimal move: the physical limit); a chess LM plays through
`play.lm_player.LMPlayer.picker` (its greedy B:, re-samples, random fallback).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import chess
import torch

from chessgrpo.config import ConfigError
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.engine.tablebase_values import game_over
from chessgrpo.errors import InputError
from chessgrpo.paths import SYZYGY_DEFAULT
from chessgrpo.play.lm_player import LMPlayerConfig
from chessgrpo.stats import Interval, wilson_interval


@dataclasses.dataclass
class EndgameEvalConfig:
    """`chessgrpo eval endgame` settings (flags override them)."""

    material: str = "KQvK"
    """Material signature, strong side first."""
    positions: int = 200
    """Held-out start positions (the trainer's ``eval.positions``)."""
    seed: int = 0
    """Seed of the held-out set (the trainer's ``run.seed``); also seeds the random mover."""
    colours: str = "white"
    """The strong side's colour (the trainer's ``endgame_colours``)."""
    max_moves: int = 50
    """Own moves allowed to mate."""
    syzygy_path: str = SYZYGY_DEFAULT
    """Syzygy tables."""
    baselines: bool = False
    """Also play the random mover and the tablebase (the floor and the physical limit)."""
    device: str = "cpu"
    threads: int = 0
    """torch CPU threads for the player's forwards (0 = torch's default). A tiny chess LM decodes one
    batch per move: on a busy 2-core machine 1 thread was ~6x faster than the default."""
    output: str | None = None
    """Write the result and per-position records as JSON here (input of `eval compare`)."""
    lm: LMPlayerConfig = dataclasses.field(default_factory=LMPlayerConfig)
    """How a chess LM checkpoint plays (`play.lm_player`: re-samples, fallback, answer length, BOS)."""

    def __post_init__(self) -> None:
        if self.positions < 1 or self.max_moves < 1:
            raise ConfigError("config keys positions and max_moves must be >= 1")
        if self.threads < 0:
            raise ConfigError(f"config key threads must be >= 0 (0 = torch's default), got {self.threads}")


MovePicker = Callable[[list[chess.Board]], list[chess.Move]]
"""Chooses one move for each board (all with the strong side to move)."""


def policy_picker(model, *, temperature: float = 0.0, generator: torch.Generator | None = None) -> MovePicker:
    """The policy at argmax (temperature 0) or sampled, batched over boards."""

    def pick(boards: list[chess.Board]) -> list[chess.Move]:
        return model.predict_moves(boards, temperature=temperature, generator=generator)

    return pick


def checkpoint_picker(path: Path, config: EndgameEvalConfig) -> tuple[MovePicker, Any]:
    """(picker, the `LMPlayer` or None) of an action-policy or chess LM checkpoint (`models.checkpoint_kind`);
    ``lm.*`` settings given with an action policy are an error naming the path."""
    from chessgrpo.models.checkpoint_kind import LM, identify_checkpoint
    from chessgrpo.play.lm_player import LMPlayer

    if identify_checkpoint(path).kind == LM:
        lm_player = LMPlayer.from_path(path, device=config.device, config=config.lm)
        return lm_player.picker(), lm_player
    if config.lm != LMPlayerConfig():
        raise InputError(
            f"the lm.* settings are for a chess LM checkpoint, but {str(path)!r} is an action policy; drop them"
        )
    from chessgrpo.models.policy import load_policy

    return policy_picker(load_policy(path, device=config.device).eval()), None


def random_picker(seed: int) -> MovePicker:
    """A uniformly random legal move (seeded): the floor."""
    rng = random.Random(seed)

    def pick(boards: list[chess.Board]) -> list[chess.Move]:
        return [rng.choice(sorted(board.legal_moves, key=chess.Move.uci)) for board in boards]

    return pick


def tablebase_picker(tablebase: Tablebase) -> MovePicker:
    """The DTZ-optimal move: the physical limit."""
    return lambda boards: [tablebase.tablebase_move(board) for board in boards]


@dataclasses.dataclass
class EndgameEvalResult:
    """How a player fared from held-out start positions against the perfect defender."""

    mate_rate: Interval
    """Fraction of start positions mated within max_moves own moves (Wilson 95%)."""
    dtz_optimal_rate: Interval
    """Fraction of the player's moves that were DTZ-optimal (Wilson over moves; moves within a game are correlated)."""
    win_lost_rate: Interval
    """Fraction of games where the win was given away (a draw by stalemate, material, 50 moves or repetition)."""
    moves_to_mate: float
    """Mean own moves to mate over the mated games (NaN when none)."""
    optimal_moves_to_mate: float
    """Mean tablebase-optimal own moves to mate over the same games."""
    optimal_moves_all: float
    """Mean tablebase-optimal own moves to mate over all start positions."""
    results: list[str]
    """Per start position: "mate", "draw:<reason>" or "unfinished"."""
    max_moves: int
    piece_moves: dict[str, int] = dataclasses.field(default_factory=dict)
    """The player's moves by the moving piece ("K", "Q", "R", "B", "N"): a piece type whose moves vanish as a
    class (the king-only optimum of GRPO from a random network) shows here."""

    @property
    def piece_shares(self) -> dict[str, float]:
        """Share of the player's moves made by each piece type present in `piece_moves`."""
        total = sum(self.piece_moves.values())
        return {piece: count / total for piece, count in self.piece_moves.items()} if total else {}

    @property
    def outcome_rates(self) -> dict[str, float]:
        """Share of the games per result ("mate", "unfinished", "mated", "draw:<reason>"), over all games."""
        n = len(self.results)
        return {result: self.results.count(result) / n for result in sorted(set(self.results))} if n else {}

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out: dict[str, float] = {}
        for name in ("mate_rate", "dtz_optimal_rate", "win_lost_rate"):
            interval = getattr(self, name)
            out.update(
                {
                    f"{prefix}{name}": interval.value,
                    f"{prefix}{name}_low": interval.low,
                    f"{prefix}{name}_high": interval.high,
                }
            )
        # Means over the mated games: undefined (left out, not NaN, which `diagnose` reads as a numeric fault) until one mates.
        for name in ("moves_to_mate", "optimal_moves_to_mate", "optimal_moves_all"):
            if not math.isnan(getattr(self, name)):
                out[f"{prefix}{name}"] = getattr(self, name)
        out[f"{prefix}positions"] = float(self.mate_rate.n)
        for piece, share in self.piece_shares.items():
            out[f"{prefix}piece_share/{piece}"] = share
        for result, rate in self.outcome_rates.items():
            if result.startswith(
                "draw:"
            ):  # why wins were given away: repetition, stalemate, insufficient material, ...
                out[f"{prefix}{result.replace(':', '_')}_rate"] = rate
        return out

    def to_json(self) -> dict:
        return {
            "mate_rate": self.mate_rate.to_json(),
            "dtz_optimal_rate": self.dtz_optimal_rate.to_json(),
            "win_lost_rate": self.win_lost_rate.to_json(),
            "moves_to_mate": _finite_or_none(self.moves_to_mate),
            "optimal_moves_to_mate": _finite_or_none(self.optimal_moves_to_mate),
            "optimal_moves_all": _finite_or_none(self.optimal_moves_all),
            "max_moves": self.max_moves,
            "results": self.results,
            "piece_moves": self.piece_moves,
        }


def _finite_or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def evaluate_endgame(
    pick: MovePicker,
    starts: Sequence[chess.Board],
    tablebase: Tablebase,
    *,
    max_moves: int = 50,
    exact_optimality: bool = False,
) -> EndgameEvalResult:
    """Play the strong side of every start position against the perfect defender, all games in lockstep.

    A game ends at mate (success), at a draw by the rules (stalemate, insufficient material after
    the queen or rook is taken, 50-move rule, threefold repetition: the win was given away), or
    after `max_moves` own moves without mate.

    A move counts as DTZ-optimal when it mates, or when the position after it and the perfect
    defender's reply is still won and its DTZ is at least 2 plies shorter than before (the
    defender lengthens by one ply at best, the optimal move shortens by one more). This needs no
    probes beyond the defender's. `exact_optimality=True` instead checks membership in
    `tablebase.best_moves` (all moves probed with the weak side to move: ~30x the cost); on 200 KQvK
    and KRvK games the two agree (tests/test_endgame.py).
    """
    boards = [board.copy() for board in starts]
    for board in boards:
        if not tablebase.is_won(board):
            raise ValueError(f"evaluation start {board.fen()!r} is not a win for the side to move")
    optimal = [(tablebase.probe_dtz(board) + 1) // 2 for board in boards]
    results: list[str | None] = [None] * len(boards)
    own_moves = [0] * len(boards)
    optimal_moves = 0
    scored_moves = 0
    piece_moves: dict[str, int] = {}
    for _ in range(max_moves):
        active = [i for i, result in enumerate(results) if result is None]
        if not active:
            break
        moves = pick([boards[i] for i in active])
        for i, move in zip(active, moves):
            board = boards[i]
            if not board.is_legal(move):
                raise ValueError(f"player chose illegal move {move.uci()} in {board.fen()!r}")
            scored_moves += 1
            piece = chess.piece_symbol(board.piece_type_at(move.from_square) or chess.KING).upper()
            piece_moves[piece] = piece_moves.get(piece, 0) + 1
            before = tablebase.probe_dtz(board)
            if exact_optimality:
                optimal_moves += move in tablebase.best_moves(board)
            board.push(move)
            own_moves[i] += 1
            reason = game_over(board)
            if reason == "checkmate":
                results[i] = "mate"
                optimal_moves += not exact_optimality
                continue
            if reason is not None:
                results[i] = f"draw:{reason}"
                continue
            board.push(tablebase.tablebase_move(board))
            reason = game_over(board)
            if reason is not None:  # the defender cannot mate in these endgames; anything else is a draw
                results[i] = "mated" if reason == "checkmate" else f"draw:{reason}"
            elif not exact_optimality and tablebase.probe_wdl(board) == 2 and before - tablebase.probe_dtz(board) >= 2:
                optimal_moves += 1
    final = [result or "unfinished" for result in results]
    mated = [i for i, result in enumerate(final) if result == "mate"]
    lost = sum(result.startswith("draw:") or result == "mated" for result in final)
    n = len(final)
    nan = float("nan")
    return EndgameEvalResult(
        mate_rate=wilson_interval(len(mated), n),
        dtz_optimal_rate=wilson_interval(optimal_moves, scored_moves),
        win_lost_rate=wilson_interval(lost, n),
        moves_to_mate=sum(own_moves[i] for i in mated) / len(mated) if mated else nan,
        optimal_moves_to_mate=sum(optimal[i] for i in mated) / len(mated) if mated else nan,
        optimal_moves_all=sum(optimal) / n if n else nan,
        results=final,
        max_moves=max_moves,
        piece_moves=dict(sorted(piece_moves.items(), key=lambda item: "KQRBNP".index(item[0]))),
    )
