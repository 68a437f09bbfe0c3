"""Endgames with a perfect oracle: tablebase values, the perfect defender, start positions, evaluation.

The oracle is a Syzygy tablebase (`engine.Tablebase`, 3-4 pieces in ../shared/data/syzygy). Every
value here is exact and from a stated point of view (``pov``, the colour whose value it is):

- `TablebaseOracle.state(board, pov)` -> `TablebaseState`: the game-theoretic score for `pov`
  (1 win, 0.5 draw, 0 loss; the 50-move rule counts, so a cursed win is a draw) and the distance
  to the end in plies (|DTZ|; in the pawnless endgames of the curriculum the only zeroing move
  the strong side can make is mate, so DTZ is the distance to mate). Positions where the game is
  over are scored by the rules, not probed: mate, stalemate, insufficient material (a captured
  queen), the 50-move rule and threefold repetition (which needs the game's move stack).
- `TablebaseOracle.best_moves(board)`: the moves that are best for the side to move by
  (score, then progress): the shortest win, else a draw, else the longest loss. The first of them
  in UCI order is `tablebase_move`, used both as the **perfect defender** (the weak side picks the
  loss that takes longest, or a draw if any move draws) and as the **tablebase baseline** (the
  strong side mates by the DTZ-optimal path: the physical limit).

Reward of one own ply (the mover's move and the opponent's reply), from the mover's point of view,
with s the score and d the distance in plies before (P_t) and after (P_t+1) the ply:

    r_t = 2 (s_t+1 - s_t)                     -1 for giving away a win (win -> draw), -2 for win -> loss
        + 1 [the mover delivered mate]        "mate = 1"
        - 1 [the mover was mated]
        + shaping * (prog_t+1 - prog_t)       only when the score did not change
    prog = -d / 2 when winning (fewer own moves to mate is better), +d / 2 when losing (a longer
           loss is better), 0 in a draw; a mated position has d = 0.

For the strong side of KQvK against the perfect defender this is: +1 + shaping * d_t / 2 for the
mating move, -1 for a move that lets the win slip (stalemate, a hung queen), and otherwise
shaping * (d_t - d_t+1) / 2: +shaping for a DTZ-optimal move (the perfect defender lengthens by
one ply, the optimal move shortens by one more), 0 for a waiting move, negative for a regression.
The progress term is a potential difference (Ng et al. 1999), so it sums to
shaping * (d_0 - d_end) / 2 over a trajectory and cannot change which policies are optimal.

Regret form (`best_step_reward`): r_t - r*_t, with r*_t the largest reward any move of P_t earns
against the perfect defender (1 + shaping / 2 when mate in one is on the board, else shaping).
A DTZ-optimal move scores 0, a waiting move -shaping, a regression less, giving the win away
-1 - shaping. After the first ply the rows of a trajectory group stand in different positions;
their raw rewards are on different scales (a mate in one pays 1.1, a quiet optimal move 0.2),
so a group baseline over raw rewards would compare unlike things. Regret puts every ply on the
same scale: the tablebase acts as an exact per-position baseline.

Evaluation (`evaluate_endgame`): a player (the policy at argmax, a random mover, the tablebase)
plays the strong side of each held-out start position for up to `max_moves` own moves against
the perfect defender. Mate rate with a Wilson interval, the rate of DTZ-optimal moves, mean moves
to mate against the tablebase optimum ((DTZ + 1) / 2 own moves from the start), and how often the
win was given away.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Callable, Sequence

import chess
import chess.syzygy
import torch

from chessgrpo.board.endgames import COLOURS, Material, endgame_positions
from chessgrpo.engine.tablebase import Tablebase, split_paths
from chessgrpo.eval.stats import Interval, wilson_interval

logger = logging.getLogger(__name__)

MATE_REWARD = 1.0
"""Reward for delivering mate ("mate = 1"); being mated costs the same."""

_CACHE_LIMIT = 2_000_000
"""Cached probes kept before the cache is cleared (a KQvK table has ~0.5M positions per side to move)."""


def game_over(board: chess.Board) -> str | None:
    """Why the game is over at `board` (using its move stack for repetitions), or None.

    "checkmate" (the side to move is mated), "stalemate", "insufficient_material",
    "fifty_moves" (claimable: halfmove clock >= 100), "threefold_repetition" (claimable).
    """
    if board.is_checkmate():
        return "checkmate"
    if board.is_stalemate():
        return "stalemate"
    if board.is_insufficient_material():
        return "insufficient_material"
    if board.halfmove_clock >= 100:
        return "fifty_moves"
    if board.halfmove_clock >= 4 and board.is_repetition(3):
        return "threefold_repetition"
    return None


@dataclasses.dataclass(frozen=True)
class TablebaseState:
    """A position's exact value for one colour (`pov`)."""

    score: float
    """1 win, 0.5 draw (including cursed wins and blessed losses), 0 loss, for pov."""
    plies: int
    """Plies to the end (|DTZ|; 0 at a finished game, 0 in a draw)."""
    terminal: str | None = None
    """`game_over` reason, or None."""
    mated: bool = False
    """The game ended in mate of pov (True) ... """
    delivered_mate: bool = False
    """... or pov delivered mate (True)."""

    @property
    def progress(self) -> float:
        """-plies / 2 when winning, +plies / 2 when losing, 0 in a draw (in own moves; see the module docstring)."""
        if self.score == 1.0:
            return -self.plies / 2.0
        if self.score == 0.0:
            return self.plies / 2.0
        return 0.0


def step_reward(before: TablebaseState, after: TablebaseState, shaping: float) -> float:
    """The reward of one own ply from `before` to `after` (both for the mover; module docstring)."""
    reward = 2.0 * (after.score - before.score)
    if after.delivered_mate:
        reward += MATE_REWARD
    if after.mated:
        reward -= MATE_REWARD
    if after.score == before.score:
        reward += shaping * (after.progress - before.progress)
    return reward


def best_step_reward(before: TablebaseState, shaping: float) -> float:
    """The largest `step_reward` a ply from `before` can earn when the opponent plays perfectly.

    Winning: mate in one is worth 1 + shaping / 2; otherwise the best is shaping (DTZ 2 plies
    shorter after the perfect reply). Losing: -shaping (the perfect opponent shortens the loss by
    one own move whatever is played). Drawn: 0. `step_reward - best_step_reward` is the move's
    exact regret (0 for a DTZ-optimal move, < 0 otherwise); see `TrajectoryConfig.regret`.
    """
    if before.terminal is not None:
        raise ValueError("no ply is played from a finished game")
    if before.score == 1.0:
        return MATE_REWARD + shaping * 0.5 if before.plies == 1 else shaping
    if before.score == 0.0:
        return -shaping
    return 0.0


class TablebaseOracle:
    """Exact values, best moves and the perfect defender from Syzygy tables, with probe caches.

    Probing costs depend on which side to move a table stores: for KQvK a DTZ probe with the strong
    side to move takes ~180 us, with the weak side to move ~900 us (python-chess then searches one
    ply), a WDL probe ~45 us (KRvK: 460 us, 1.9 ms, 90 us). So moves are judged by WDL first and
    DTZ is probed only for the moves that tie on the best score, and every probe is cached
    (positions keyed by pieces, side to move and en-passant square; a cache is cleared when it
    exceeds `_CACHE_LIMIT` entries). The rollouts of `tasks.trajectory` only ever need DTZ with
    the strong side to move.
    """

    def __init__(self, paths: str | Sequence[str]):
        self.tablebase = Tablebase(paths)  # validates the directories, knows the table names and coverage
        # A second handle for WDL-only probes: engine.Tablebase.probe always probes DTZ as well.
        self._syzygy = chess.syzygy.Tablebase()
        for directory in split_paths(paths):
            self._syzygy.add_directory(str(directory))
        self._wdl: dict[tuple, int] = {}
        self._dtz: dict[tuple, int] = {}
        self.probes = 0
        """Probes that went to the tables (cache misses, WDL and DTZ)."""
        self.lookups = 0
        """All probe requests (hits and misses)."""

    def close(self) -> None:
        self.tablebase.close()
        self._syzygy.close()

    def __enter__(self) -> TablebaseOracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def covers(self, board: chess.Board) -> bool:
        return self.tablebase.covers(board)

    @staticmethod
    def _key(board: chess.Board) -> tuple:
        return (board.occupied_co[0], board.occupied_co[1], board.pawns, board.knights, board.bishops, board.rooks,
                board.queens, board.kings, board.turn, board.ep_square)  # fmt: skip

    def _check(self, board: chess.Board) -> None:
        if not self.covers(board):
            raise KeyError(f"no tablebase covers {board.fen()!r} (tables up to {self.tablebase.max_pieces} pieces)")

    def probe_wdl(self, board: chess.Board) -> int:
        """WDL for the side to move (2 win, 1 cursed win, 0 draw, -1 blessed loss, -2 loss); KeyError when not covered."""
        return self._probe(self._wdl, self._syzygy.probe_wdl, board)

    def probe_dtz(self, board: chess.Board) -> int:
        """DTZ for the side to move (python-chess sign and rounding); KeyError when not covered."""
        return self._probe(self._dtz, self._syzygy.probe_dtz, board)

    def _probe(self, cache: dict, probe: Callable[[chess.Board], int], board: chess.Board) -> int:
        """`probe(board)` through `cache` (cleared when full); counts lookups and real probes."""
        self.lookups += 1
        key = self._key(board)
        value = cache.get(key)
        if value is None:
            self._check(board)
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            value = cache[key] = probe(board)
            self.probes += 1
        return value

    def is_won(self, board: chess.Board) -> bool:
        """The side to move wins (WDL == 2, i.e. also under the 50-move rule)."""
        return self.covers(board) and self.probe_wdl(board) == 2

    def state(
        self, board: chess.Board, pov: chess.Color, *, terminal: str | None = None, checked: bool = False,
        distance: bool = True,
    ) -> TablebaseState:  # fmt: skip
        """The exact value of `board` for `pov`.

        `checked=True` says the caller already knows whether the game is over (`terminal`, None
        when not); otherwise `game_over(board)` decides, using the board's move stack.
        `distance=False` skips the DTZ probe (plies is then 0).
        """
        if not checked:
            terminal = game_over(board)
        if terminal == "checkmate":
            mated = board.turn == pov
            return TablebaseState(score=0.0 if mated else 1.0, plies=0, terminal=terminal, mated=mated, delivered_mate=not mated)
        if terminal is not None:
            return TablebaseState(score=0.5, plies=0, terminal=terminal)
        wdl = self.probe_wdl(board)
        if board.turn != pov:
            wdl = -wdl
        score = 1.0 if wdl == 2 else 0.0 if wdl == -2 else 0.5
        plies = abs(self.probe_dtz(board)) if distance and score != 0.5 else 0
        return TablebaseState(score=score, plies=plies)

    def best_moves(self, board: chess.Board) -> list[chess.Move]:
        """The legal moves best for the side to move by (score, progress), in UCI order.

        The shortest win, else any draw, else the longest loss. Positions after a move are judged
        by the rules first (mate, stalemate, insufficient material, 50 moves) and by the tables
        otherwise; a repetition can only be claimed on the move after, so no move stack is needed.
        """
        mover = board.turn
        scored: list[tuple[chess.Move, TablebaseState, chess.Board]] = []
        for move in sorted(board.legal_moves, key=chess.Move.uci):
            after = board.copy(stack=False)
            after.push(move)
            state = self.state(after, mover, terminal=_terminal_after_move(after), checked=True, distance=False)
            scored.append((move, state, after))
        if not scored:
            return []
        top = max(state.score for _, state, _ in scored)
        candidates = [(move, state, after) for move, state, after in scored if state.score == top]
        if top == 0.5 or len(candidates) == 1:
            return [move for move, _, _ in candidates]
        progress = [
            state.progress if state.terminal else self.state(after, mover, checked=True).progress
            for _, state, after in candidates
        ]
        best = max(progress)
        return [move for (move, _, _), value in zip(candidates, progress) if value == best]

    def tablebase_move(self, board: chess.Board) -> chess.Move:
        """The perfect move for the side to move (the first of `best_moves` in UCI order)."""
        moves = self.best_moves(board)
        if not moves:
            raise ValueError(f"no legal move in {board.fen()!r}")
        return moves[0]


def _terminal_after_move(board: chess.Board) -> str | None:
    """`game_over` without the repetition check (see `TablebaseOracle.best_moves`)."""
    if board.is_checkmate():
        return "checkmate"
    if board.is_stalemate():
        return "stalemate"
    if board.is_insufficient_material():
        return "insufficient_material"
    if board.halfmove_clock >= 100:
        return "fifty_moves"
    return None


# ------------------------------------------------------------------------------------------------
# Start positions


class EndgameStarts:
    """Won start positions of one material signature: a held-out set and fresh per-step draws.

    Training draws never contain a held-out position: "fresh held-out" is exact, not probable.
    """

    def __init__(self, material: str, oracle: TablebaseOracle, *, colours: str = "white"):
        self.material = Material.parse(material)
        if colours not in COLOURS:
            raise ValueError(f"endgame colours must be one of {list(COLOURS)}, got {colours!r}")
        name = self.material.name
        if name not in oracle.tablebase.names:
            raise ValueError(f"no Syzygy table {name} among {', '.join(oracle.tablebase.names)}")
        self.oracle = oracle
        self.colours = colours
        self.held_out: set[str] = set()

    @property
    def source(self) -> str:
        return f"endgame:{self.material.name}"

    def hold_out(self, count: int, *, seed: int) -> list[chess.Board]:
        """`count` distinct won positions, excluded from every later `draw`."""
        boards = endgame_positions(
            self.material, count, seed=[seed, 1_000_000_007 % (1 << 30)], colours=self.colours,
            accept=self.oracle.is_won, distinct=True,
        )  # fmt: skip
        self.held_out.update(board.epd() for board in boards)
        return boards

    def draw(self, count: int, *, seed: int, step: int, rank: int = 0, max_plies: int | None = None) -> list[chess.Board]:
        """`count` won positions for (seed, step, rank): reproducible, uniform, never held out.

        `max_plies` keeps only positions whose DTZ is at most that many plies (a reverse
        curriculum: near-mate positions first); uniform among those.
        """
        if max_plies is None:
            accept = self.oracle.is_won
        else:
            def accept(board: chess.Board) -> bool:
                return self.oracle.is_won(board) and self.oracle.probe_dtz(board) <= max_plies

        return endgame_positions(
            self.material, count, seed=[seed, step, rank], colours=self.colours, accept=accept, exclude=self.held_out,
        )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Evaluation against the perfect defender


MovePicker = Callable[[list[chess.Board]], list[chess.Move]]
"""Chooses one move for each board (all with the strong side to move)."""


def policy_picker(model, *, temperature: float = 0.0, generator: torch.Generator | None = None) -> MovePicker:
    """The policy at argmax (temperature 0) or sampled, batched over boards."""

    def pick(boards: list[chess.Board]) -> list[chess.Move]:
        return model.predict_moves(boards, temperature=temperature, generator=generator)

    return pick


def random_picker(seed: int) -> MovePicker:
    """A uniformly random legal move (seeded): the floor."""
    rng = random.Random(seed)

    def pick(boards: list[chess.Board]) -> list[chess.Move]:
        return [rng.choice(sorted(board.legal_moves, key=chess.Move.uci)) for board in boards]

    return pick


def tablebase_picker(oracle: TablebaseOracle) -> MovePicker:
    """The DTZ-optimal move: the physical limit."""
    return lambda boards: [oracle.tablebase_move(board) for board in boards]


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

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out: dict[str, float] = {}
        for name in ("mate_rate", "dtz_optimal_rate", "win_lost_rate"):
            interval = getattr(self, name)
            out.update({f"{prefix}{name}": interval.value, f"{prefix}{name}_low": interval.low, f"{prefix}{name}_high": interval.high})
        out[f"{prefix}moves_to_mate"] = self.moves_to_mate
        out[f"{prefix}optimal_moves_to_mate"] = self.optimal_moves_to_mate
        out[f"{prefix}optimal_moves_all"] = self.optimal_moves_all
        out[f"{prefix}positions"] = float(self.mate_rate.n)
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
        }


def _finite_or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def evaluate_endgame(
    pick: MovePicker,
    starts: Sequence[chess.Board],
    oracle: TablebaseOracle,
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
    `oracle.best_moves` (all moves probed with the weak side to move: ~30x the cost); on 200 KQvK
    and KRvK games the two agree (tests/test_endgame.py).
    """
    boards = [board.copy() for board in starts]
    for board in boards:
        if not oracle.is_won(board):
            raise ValueError(f"evaluation start {board.fen()!r} is not a win for the side to move")
    optimal = [(oracle.probe_dtz(board) + 1) // 2 for board in boards]
    results: list[str | None] = [None] * len(boards)
    own_moves = [0] * len(boards)
    optimal_moves = 0
    scored_moves = 0
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
            before = oracle.probe_dtz(board)
            if exact_optimality:
                optimal_moves += move in oracle.best_moves(board)
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
            board.push(oracle.tablebase_move(board))
            reason = game_over(board)
            if reason is not None:  # the defender cannot mate in these endgames; anything else is a draw
                results[i] = "mated" if reason == "checkmate" else f"draw:{reason}"
            elif not exact_optimality and oracle.probe_wdl(board) == 2 and before - oracle.probe_dtz(board) >= 2:
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
    )
