"""Endgame evaluation against the tablebase-perfect defender, and the move pickers it plays.

`evaluate_endgame`: a player (the policy at argmax, a random mover, the tablebase) plays the strong
side of each held-out start position (`board.endgames.EndgameStarts.hold_out`) for up to
`max_moves` own moves against the perfect defender (`engine.tablebase.Tablebase.tablebase_move`:
the weak side picks the loss that takes longest, or a draw if any move draws). Reported: the mate
rate with a Wilson interval, the rate of DTZ-optimal moves, mean moves to mate against the
tablebase optimum ((DTZ + 1) / 2 own moves from the start), and how often the win was given away.

`run_endgame` is the registry's runner (`eval.registry`): the evaluated player (a checkpoint, a baseline by name, or
a training run's policy in memory) and the baselines of `EndgameEvalConfig` on the same held-out starts, as
`EndgameRun` (the result file's payload, the metrics a training run logs).

The pickers (`MovePicker`): `policy_picker` (the policy at argmax or sampled), `random_picker` (the
floor) and `tablebase_picker` (the DTZ-optimal move: the physical limit); a chess LM plays through
`play.lm_player.LMPlayer.picker` (its greedy B:, re-samples, random fallback).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import chess
import torch

from chessgrpo.config import ConfigError
from chessgrpo.engine.tablebase import Tablebase
from chessgrpo.engine.tablebase_values import game_over
from chessgrpo.errors import InputError
from chessgrpo.eval.running import EvalContext, Subject
from chessgrpo.paths import SYZYGY_DEFAULT
from chessgrpo.play.lm_player import LMPlayerConfig
from chessgrpo.stats import Interval, wilson_interval

ENDGAME_BASELINES = ("random", "tablebase")
"""The baseline players of an endgame evaluation: the floor and the physical limit."""


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
    """Also play the baselines of `baseline_players` (the random mover and the tablebase: the floor and the physical
    limit)."""
    baseline_players: list[str] = dataclasses.field(default_factory=lambda: list(ENDGAME_BASELINES))
    """Which baselines `baselines` plays: random, tablebase (a training run plays only the random mover, at step 0)."""
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
        unknown = [name for name in self.baseline_players if name not in ENDGAME_BASELINES]
        if unknown:
            raise ConfigError(f"config key baseline_players: {unknown} are not among {list(ENDGAME_BASELINES)}")


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


def _baseline_picker(name: str, seed: int, tablebase: Tablebase) -> MovePicker:
    return random_picker(seed) if name == "random" else tablebase_picker(tablebase)


@dataclasses.dataclass
class EndgameRun:
    """One endgame evaluation: the evaluated player's result and each baseline's, on the same starts."""

    config: EndgameEvalConfig
    player: str
    """The evaluated player's label (its key in `results`)."""
    results: dict[str, EndgameEvalResult]
    """The player's result first, then each baseline's by name."""
    starts: list[chess.Board]
    seconds: float
    lm_player: Any = None
    """The `LMPlayer` a chess LM checkpoint played through (its move statistics), else None."""

    @property
    def main(self) -> EndgameEvalResult:
        return self.results[self.player]

    def records(self) -> list[dict[str, Any]]:
        """One record per start position (what `eval compare` pairs by FEN): its FEN, mate 0/1 and outcome."""
        return [
            {"fen": board.fen(), "mate": float(outcome == "mate"), "result": outcome}
            for board, outcome in zip(self.starts, self.main.results)
        ]

    def to_json(self) -> dict[str, Any]:
        """The result file's payload: every player's result (``results``), the player's records, and the keys a
        training run's step file has always had: ``positions``, ``policy`` (the player's result), ``starts`` and
        ``random`` (the random mover's, when it played)."""
        results = {label: result.to_json() for label, result in self.results.items()}
        payload: dict[str, Any] = {
            "kind": "endgame",
            "player": self.player,
            "material": self.config.material,
            "seconds": self.seconds,
            "results": results,
            "records": {"player": self.records()},
            "positions": f"endgame:{self.config.material}",
            "policy": results[self.player],
            "starts": [board.fen() for board in self.starts],
        }
        if "random" in results and self.player != "random":
            payload["random"] = results["random"]
        if self.lm_player is not None:  # how the LM's moves were made, beside its result and at the top
            payload["lm_player"] = results[self.player]["lm_player"] = self.lm_player.stats.to_json()
        return payload

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The player's metrics (``eval/mate_rate``, ...) and each baseline's (``eval/random_mate_rate``, ...)."""
        metrics = self.main.metrics(prefix)
        for label, result in self.results.items():
            if label != self.player:
                metrics.update(result.metrics(f"{prefix}{label}_"))
        return metrics


def run_endgame(config: EndgameEvalConfig, subject: Subject, context: EvalContext) -> EndgameRun:
    """The registry's runner of ``endgame``: the subject (a policy or chess LM checkpoint, a baseline by name, or a
    policy in memory at argmax) and, with `config.baselines`, the other `baseline_players` play the strong side of
    the held-out starts against the perfect defender (`evaluate_endgame`).

    The starts are ``context.items["endgame"]`` when given (a training run's held-out set), else the held-out set of
    `config` (material, positions, seed, colours: the trainer's with the same settings) drawn once and kept there;
    the tables are ``context.tablebase`` when given, else opened from `config.syzygy_path`."""
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    tick = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tablebase = context.tablebase
        if tablebase is None:
            tablebase = stack.enter_context(Tablebase(config.syzygy_path))
        starts = context.items.get("endgame")
        if starts is None:
            from chessgrpo.board.endgames import EndgameStarts

            starts = EndgameStarts(
                config.material, tablebase.is_won, tables=tablebase.names, colours=config.colours
            ).hold_out(config.positions, seed=config.seed)
            context.items["endgame"] = starts
        lm_player = None
        name = subject.label
        if subject.checkpoint is not None:
            pick, lm_player = checkpoint_picker(subject.checkpoint, config)
        elif subject.model is not None:
            pick = policy_picker(subject.model)
        else:
            if subject.policy not in ENDGAME_BASELINES:
                raise InputError(f"endgame players are {list(ENDGAME_BASELINES)}, not {subject.policy!r}")
            pick = _baseline_picker(subject.policy, config.seed, tablebase)
        players = {name: pick}
        if config.baselines:
            players.update(
                {
                    other: _baseline_picker(other, config.seed, tablebase)
                    for other in config.baseline_players
                    if other != subject.policy
                }
            )
        results = {
            label: evaluate_endgame(picker, starts, tablebase, max_moves=config.max_moves)
            for label, picker in players.items()
        }
    return EndgameRun(config, name, results, list(starts), time.perf_counter() - tick, lm_player)
