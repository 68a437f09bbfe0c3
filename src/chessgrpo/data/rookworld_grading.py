"""Rewards of the RookWorld tasks: a completion graded against its truth.

Shared by GRPO (`tasks.lm_rewards`, whose registered records wrap these graders for `tasks.kinds.rookworld`;
the TRL adapters of `tasks.rookworld_trl`) and the evaluation (`eval.lm`), so "reward" means the same number in
training and evaluation. They sit in the data layer, below both, beside the truths they compare with: the P:
truth is the engine's (`data.rookworld_truths`), the A: truth python-chess's
(`data.rookworld_format.environment_step`).

**Rewards** (deterministic; engine calls go through the pool and its SQLite cache):

- policy task, components in [0, 1], total = sum of weight * component (`PolicyRewardConfig`):
  ``format`` (1 when it parses), ``legal`` (distinct legal moves of M / moves in M), ``best``
  (how good B is), ``top5`` (how good the moves of M are), ``eval`` (the mean over the moves of M of max(0, 1 - |E_m - v_m| / eval_scale), each E
  matched to its own move m, an illegal or repeated move scoring 0; both values clipped to +/-eval_clip pawns;
  v_m is the engine's multipv value of m, or for a move outside the engine's list, with
  ``eval_unlisted_moves``, the value of the position after m from a search of it). The engine's
  own answer scores the maximum (sum of weights, 2.0 by default); a malformed answer scores
  ``malformed_penalty`` (-1.0).

  ``best`` and ``top5`` are graded by **win-probability regret** by default (``best_mode`` /
  ``top5_mode`` = "graded"): a move's regret is the engine's best line's win probability minus
  the move's (expected score for the side to move from the pool's python-chess WDL model; a
  legal move outside the engine's list is valued by a search of the position after it), and its
  credit is `regret_credit`: 1 up to ``regret_tolerance`` (0.02), linear to 0 at
  ``regret_zero_credit`` (0.2). ``best`` = B's credit (an illegal B scores 0); ``top5`` = the
  summed credits of M's distinct legal moves over the summed credits of the engine's top k
  (capped at 1). Why: several moves are often equally good, and the engine's best move at a
  few thousand nodes is itself unstable, so exact match made a right and a wrong B score alike
  (docs/rookworld_reward.md). The "exact" modes restore B == engine best and |M ∩ top k| / k
  (k = min(5, legal moves)); ``best_exact`` and ``top5_overlap`` always report them.
- **tablebase truth** (``truth: tablebase``, 3-4-piece endgames, `data.rookworld_truths.tablebase_truths`):
  every legal move has an exact value, so nothing is searched and nothing is estimated. ``best``
  is 1 for a DTZ-optimal B (`PolicyTruth.optimal`), `exact_credit` for another legal one (a slower
  win earns between ``tablebase_draw_credit`` and ``tablebase_win_credit``, less the more plies it
  wastes; a draw ``tablebase_draw_credit``; a loss 0); ``best_mode: exact`` makes it binary (B is
  DTZ-optimal or not: the C1 recipe's exact-match reward). ``top5`` sums the exact credits of M's
  moves over those of the tablebase's top k; ``eval`` compares E with `tablebase_pawns` (clipped at 100 by
  default: the scale runs to 100).
- environment task (`EnvironmentRewardConfig`): ``format``, ``fen_exact`` (the whole new FEN),
  ``fen_fields`` (partial credit: the share of the six FEN fields that match), ``reward``,
  ``terminated``, ``truncated`` (each 1 when equal to the truth). Maximum 2.3 by default.
- **a move-first answer without M:/E:** (``B: <move>`` alone, `data.rookworld_format` layout ``move_first``) is
  well-formed: ``format`` 1, ``legal`` = B is legal, ``best`` as above, and ``top5``, ``eval`` and
  ``top5_overlap`` 0 (nothing listed to grade), so its total is at most format + legal + best weights (1.4 by
  default). A move-first answer that lists M:/E: after its move is graded exactly as the rookworld layout.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chessgrpo.data.rookworld_format import (
    MAX_LISTED_MOVES,
    EnvironmentAnswer,
    Malformed,
    PolicyAnswer,
    environment_step,
    parse_environment_completion,
    parse_environment_prompt,
    parse_policy_completion,
    policy_prompt_fen,
    task_of,
)
from chessgrpo.data.rookworld_truths import (
    TABLEBASE_WIN_PAWNS,
    ExactMoveValue,
    MoveValue,
    PolicyTruth,
    policy_truths,
    tablebase_pawns,
    tablebase_truths,
    unlisted_move_values,
)
from chessgrpo.errors import InputError
from chessgrpo.paths import SYZYGY_DEFAULT

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool
    from chessgrpo.engine.tablebase import Tablebase


REWARD_MODES = ("graded", "exact")
"""Values of `PolicyRewardConfig.best_mode` / `top5_mode`."""
TRUTHS = ("engine", "tablebase")
"""Values of `PolicyRewardConfig.truth`: who grades P: answers."""
ENGINE_EVAL_CLIP = 10.0
"""The default clip (pawns) of E: values against an engine's truth (`PolicyRewardConfig.eval_clip`)."""


def regret_credit(regret: float, *, tolerance: float, zero_at: float) -> float:
    """Credit in [0, 1] of a move that gives up `regret` win probability against the engine's best.

    1 up to `tolerance` (engine noise: moves that good are as right as the best one), falling
    linearly to 0 at `zero_at` and 0 beyond. A negative regret (a move valued above the best line by
    its own search) is full credit.
    """
    if not 0.0 <= tolerance < zero_at:
        raise ValueError(f"need 0 <= tolerance < zero_at, got tolerance={tolerance}, zero_at={zero_at}")
    if regret <= tolerance:
        return 1.0
    if regret >= zero_at:
        return 0.0
    return (zero_at - regret) / (zero_at - tolerance)


@dataclasses.dataclass
class PolicyRewardConfig:
    """Weights of the P: reward components (the `rewards.policy:` section); see the module docstring."""

    format_weight: float = 0.2
    """Weight of `format` (1 when the completion parses)."""
    legal_weight: float = 0.2
    """Weight of `legal`: distinct legal moves of M / moves in M."""
    best_weight: float = 1.0
    """Weight of `best`: how good B is (see `best_mode`)."""
    best_mode: str = "graded"
    """`best` credit: "graded" = `regret_credit` of B's win-probability regret; "exact" = 1 only when B is the engine's best move."""
    top5_weight: float = 0.4
    """Weight of `top5`: how good the moves of M are (see `top5_mode`)."""
    top5_mode: str = "graded"
    """`top5` credit: "graded" = summed `regret_credit` of M's distinct legal moves over that of the engine's top k (capped at 1); "exact" = |M ∩ top k| / k."""
    regret_tolerance: float = 0.02
    """Win-probability regret (0-1) up to which a move (B, or one of M) gets full graded credit."""
    regret_zero_credit: float = 0.2
    """Win-probability regret at which a move's graded credit reaches 0 (linear from `regret_tolerance`)."""
    eval_weight: float = 0.2
    """Weight of `eval`: mean over M of max(0, 1 - |E - engine value| / eval_scale) (illegal/repeated moves 0)."""
    eval_scale: float = 2.0
    """Pawns of evaluation error at which a move's `eval` credit reaches 0."""
    eval_clip: float | None = None
    """Both evaluations are clipped to +/- this many pawns before comparing. Default None: the truth's own scale,
    `ENGINE_EVAL_CLIP` (10) for the engine's pawns (mate = +/-1000) and `TABLEBASE_WIN_PAWNS` (100) for an exact
    tablebase truth, whose scale runs to 100 (a clip of 10 there gave any E: of 10 or more full credit)."""
    eval_unlisted_moves: bool = True
    """Value legal moves of M outside the engine's top list by searching the position after them
    (one search per distinct move, cached); false: such moves get no `eval` credit."""
    malformed_penalty: float = -1.0
    """Total reward of a completion that does not parse."""
    nodes: int = 20_000
    """Stockfish node limit of the truth's analysis and of the searches of unlisted moves; 20000 is the
    cheapest budget where the truth is stable at 2x and agrees with upstream labels (docs/rookworld_reward.md)."""
    multipv: int = 5
    """Engine lines the completion is compared with."""
    truth: str = "engine"
    """Who grades P: answers: "engine" (Stockfish multipv at `nodes`) | "tablebase" (the Syzygy tables at
    `syzygy_path`: every legal move's exact value; 3-4-piece positions without castling rights only)."""
    syzygy_path: str = SYZYGY_DEFAULT
    """Syzygy tables of ``truth: tablebase``."""
    tablebase_win_credit: float = 0.7
    """Tablebase truth, graded: a winning move that is not DTZ-optimal earns tablebase_draw_credit +
    (tablebase_win_credit - tablebase_draw_credit) * h / (h + e), e = the plies it adds, h =
    `tablebase_half_plies` (`exact_credit`): always below an optimal move (1) and above a draw."""
    tablebase_draw_credit: float = 0.1
    """Tablebase truth, graded: credit of a drawing move where a win exists (a losing or illegal move: 0)."""
    tablebase_half_plies: float = 10.0
    """Tablebase truth, graded: extra plies at which a slower win's credit is halfway from the win to the draw credit."""

    def __post_init__(self) -> None:
        for name in ("format_weight", "legal_weight", "best_weight", "top5_weight", "eval_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        for name in ("best_mode", "top5_mode"):
            if getattr(self, name) not in REWARD_MODES:
                raise ValueError(f"{name} must be one of {', '.join(REWARD_MODES)}, got {getattr(self, name)!r}")
        if not (math.isfinite(self.regret_tolerance) and 0.0 <= self.regret_tolerance < 1.0):
            raise ValueError(f"regret_tolerance must be in [0, 1), got {self.regret_tolerance}")
        if not (math.isfinite(self.regret_zero_credit) and self.regret_tolerance < self.regret_zero_credit <= 1.0):
            raise ValueError(f"regret_zero_credit must be in (regret_tolerance, 1], got {self.regret_zero_credit}")
        if self.eval_scale <= 0 or (self.eval_clip is not None and self.eval_clip <= 0):
            raise ValueError("eval_scale and eval_clip must be > 0")
        if not math.isfinite(self.malformed_penalty):
            raise ValueError("malformed_penalty must be finite")
        if self.nodes < 1 or not 1 <= self.multipv <= MAX_LISTED_MOVES:
            raise ValueError(f"need nodes >= 1 and multipv in 1..{MAX_LISTED_MOVES}")
        if self.truth not in TRUTHS:
            raise ValueError(f"truth must be one of {', '.join(TRUTHS)}, got {self.truth!r}")
        if not 0.0 <= self.tablebase_draw_credit < self.tablebase_win_credit < 1.0:
            raise ValueError(
                f"need 0 <= tablebase_draw_credit < tablebase_win_credit < 1, got "
                f"{self.tablebase_draw_credit} and {self.tablebase_win_credit}"
            )
        if not (math.isfinite(self.tablebase_half_plies) and self.tablebase_half_plies > 0):
            raise ValueError(f"tablebase_half_plies must be > 0, got {self.tablebase_half_plies}")

    @property
    def maximum(self) -> float:
        return self.format_weight + self.legal_weight + self.best_weight + self.top5_weight + self.eval_weight

    def credit(self, regret: float) -> float:
        """`regret_credit` with this config's tolerance and zero point."""
        return regret_credit(regret, tolerance=self.regret_tolerance, zero_at=self.regret_zero_credit)


@dataclasses.dataclass
class EnvironmentRewardConfig:
    """Weights of the A: reward components (the `rewards.environment:` section)."""

    format_weight: float = 0.2
    fen_exact_weight: float = 1.0
    """The whole new FEN equals the truth."""
    fen_fields_weight: float = 0.5
    """Partial credit: share of the six FEN fields (placement, side, castling, en passant, clocks) that match."""
    reward_weight: float = 0.2
    terminated_weight: float = 0.2
    truncated_weight: float = 0.2
    malformed_penalty: float = -1.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not math.isfinite(value) or (field.name != "malformed_penalty" and value < 0):
                raise ValueError(
                    f"{field.name} must be a finite number{' >= 0' if field.name != 'malformed_penalty' else ''}, got {value}"
                )

    @property
    def maximum(self) -> float:
        return (
            self.format_weight
            + self.fen_exact_weight
            + self.fen_fields_weight
            + self.reward_weight
            + self.terminated_weight
            + self.truncated_weight
        )


@dataclasses.dataclass
class RookWorldRewardConfig:
    policy: PolicyRewardConfig = dataclasses.field(default_factory=PolicyRewardConfig)
    environment: EnvironmentRewardConfig = dataclasses.field(default_factory=EnvironmentRewardConfig)


@dataclasses.dataclass(frozen=True)
class Reward:
    """A completion's total reward and its parts."""

    total: float
    components: dict[str, float]
    """Component name -> value in [0, 1] (plus, for P: when measurable, ``eval_error`` in pawns and
    ``best_regret`` / ``moves_regret`` in win probability, < 0 when a searched move beats the best line)."""
    malformed: str | None = None
    """The parse failure, or None."""
    answer: Any = None
    """The parsed `PolicyAnswer` / `EnvironmentAnswer` (None when malformed)."""


POLICY_COMPONENTS = ("format", "legal", "best", "top5", "eval", "best_exact", "top5_overlap")
"""P: components: the first five are weighted into the total; ``best_exact`` (B is the engine's best
move) and ``top5_overlap`` (|M ∩ top k| / k) are what the "exact" modes score, always reported."""
ENVIRONMENT_COMPONENTS = ("format", "fen_exact", "fen_fields", "reward", "terminated", "truncated")


def _move_wins(truth: PolicyTruth, unlisted: dict[str, MoveValue] | None) -> dict[str, float]:
    """Win probability of every move with a value: the engine's lines, then the searched unlisted moves."""
    truth.best_win  # noqa: B018 -- raises, naming the position, when the truth carries no win probabilities
    wins = dict(zip(truth.moves, truth.wins))
    for move, value in (unlisted or {}).items():
        wins.setdefault(move, value.win)
    return wins


def _regret(move: str, truth: PolicyTruth, wins: dict[str, float]) -> float:
    """Win probability a legal move gives up against the best line (< 0 when its own search rates it higher)."""
    if move not in wins:
        raise ValueError(
            f"legal move {move!r} in {truth.fen!r} has no value: pass its search in `unlisted` (score_completions does)"
        )
    return truth.best_win - wins[move]


def _graded_top5(
    moves: Sequence[str], truth: PolicyTruth, config: PolicyRewardConfig, wins: dict[str, float]
) -> tuple[float, list[float]]:
    """(graded `top5`, regrets of `moves`): the distinct legal moves' summed credits over the engine's top k's.

    Normalised by what the engine's own top k earn, not by |M|: a mean over M would give a one-move M
    holding the best move full credit, so listing fewer moves would pay.
    """
    k = min(MAX_LISTED_MOVES, len(truth.moves))
    attainable = sum(config.credit(truth.best_win - win) for win in truth.wins[:k])  # >= 1: the best line's credit
    regrets = [_regret(move, truth, wins) for move in moves]
    return min(1.0, sum(config.credit(r) for r in regrets) / attainable), regrets


def _eval_credit(
    answer: PolicyAnswer, truth: PolicyTruth, config: PolicyRewardConfig, unlisted: dict[str, MoveValue] | None
) -> tuple[float, list[float]]:
    """(`eval` credit, absolute errors in pawns of the moves with a known value)."""
    known = dict(zip(truth.moves, truth.pawns))
    if truth.exact is not None:  # an exact truth values every legal move
        known = {move: tablebase_pawns(value) for move, value in truth.exact.items()}
    if unlisted and config.eval_unlisted_moves:
        known.update({m: v.pawns for m, v in unlisted.items() if m not in known})
    clip = (
        config.eval_clip
        if config.eval_clip is not None
        else (TABLEBASE_WIN_PAWNS if truth.exact is not None else ENGINE_EVAL_CLIP)
    )
    errors = []
    credits = []
    seen = set()
    for move, value in zip(answer.moves, answer.evals):
        if move not in truth.legal or move in seen:
            continue
        seen.add(move)
        if move not in known:
            credits.append(0.0)
            continue
        target = round(known[move], 2)
        error = abs(max(-clip, min(clip, value)) - max(-clip, min(clip, target)))
        error = 0.0 if error < 1e-9 else error
        errors.append(error)
        credits.append(max(0.0, 1.0 - error / config.eval_scale))
    return (sum(credits) / len(answer.moves) if credits else 0.0), errors


def exact_credit(value: ExactMoveValue, best: ExactMoveValue, config: PolicyRewardConfig) -> float:
    """Credit in [0, 1] of a legal move worth `value` where the best move is worth `best` (tablebase truth).

    1 for a move as good as the best (DTZ-optimal); for the same result reached `e` plies slower
    (a longer win, a shorter loss) draw_credit + (win_credit - draw_credit) * h / (h + e); a draw where
    a win exists ``tablebase_draw_credit``; anything worse 0. So an optimal move > a slower win > a
    draw > a loss = an illegal move.
    """
    if value.key >= best.key:
        return 1.0
    if value.score == best.score:
        extra = abs(value.plies - best.plies)
        low, high, half = config.tablebase_draw_credit, config.tablebase_win_credit, config.tablebase_half_plies
        return low + (high - low) * half / (half + extra)
    if value.score == 0.5:
        return config.tablebase_draw_credit
    return 0.0


def _legal_share(answer: PolicyAnswer, legal_moves: Sequence[str], truth: PolicyTruth) -> float:
    """`legal`: the distinct legal moves of M over the moves of M; a move-first answer without M:/E: is graded on
    its one move instead (B is legal), its M:/E: being absent, not wrong."""
    if not answer.listed:
        return float(answer.best in truth.legal)
    return len(legal_moves) / len(answer.moves)


def _score_policy_exact(answer: PolicyAnswer, truth: PolicyTruth, config: PolicyRewardConfig) -> Reward:
    """`score_policy` against an exact (tablebase) truth: every legal move has its value, none is searched."""
    exact = truth.exact
    assert exact is not None
    best_value = exact[truth.best]
    legal_moves = [m for m in dict.fromkeys(answer.moves) if m in truth.legal]
    legal = _legal_share(answer, legal_moves, truth)
    optimal = truth.optimal
    best_exact = float(is_dtz_optimal(answer, truth))
    extra: dict[str, float] = {}
    if config.best_mode == "graded":
        best = exact_credit(exact[answer.best], best_value, config) if answer.best in exact else 0.0
    else:
        best = best_exact
    if answer.best in exact and exact[answer.best].score == best_value.score:  # plies B wastes against the optimum
        extra["best_extra_plies"] = float(abs(exact[answer.best].plies - best_value.plies))
    top = truth.moves[: min(MAX_LISTED_MOVES, len(truth.moves))]
    top5_overlap = len(set(answer.moves) & (set(top) | optimal)) / len(top)
    top5 = min(1.0, top5_overlap)
    if config.top5_mode == "graded":
        attainable = sum(exact_credit(exact[m], best_value, config) for m in top)
        top5 = min(1.0, sum(exact_credit(exact[m], best_value, config) for m in legal_moves) / attainable)
    evaluation, errors = _eval_credit(answer, truth, config, None)
    if errors:
        extra["eval_error"] = sum(errors) / len(errors)
    components = {
        "format": 1.0,
        "legal": legal,
        "best": best,
        "top5": top5,
        "eval": evaluation,
        "best_exact": best_exact,
        "top5_overlap": min(1.0, top5_overlap),
        **extra,
    }
    total = (
        config.format_weight
        + config.legal_weight * legal
        + config.best_weight * best
        + config.top5_weight * top5
        + config.eval_weight * evaluation
    )
    return Reward(total, components, None, answer)


def score_policy(
    answer: PolicyAnswer | Malformed,
    truth: PolicyTruth,
    config: PolicyRewardConfig,
    unlisted: dict[str, MoveValue] | None = None,
) -> Reward:
    """The P: reward of a parsed completion against the engine's truth.

    `unlisted` maps legal moves outside the engine's list (of M, and B) to their searched values;
    a graded mode raises `ValueError` for a legal move it needs and lacks (never a silent 0).
    Besides `POLICY_COMPONENTS`, reports when measurable ``eval_error`` (pawns), ``best_regret``
    (B's win-probability regret) and ``moves_regret`` (mean over M's distinct legal moves, graded `top5` only).
    """
    if isinstance(answer, Malformed):
        return Reward(config.malformed_penalty, {name: 0.0 for name in POLICY_COMPONENTS}, answer.reason)
    if truth.exact is not None:
        return _score_policy_exact(answer, truth, config)
    legal_moves = [m for m in dict.fromkeys(answer.moves) if m in truth.legal]
    legal = _legal_share(answer, legal_moves, truth)
    graded = "graded" in (config.best_mode, config.top5_mode)
    wins = _move_wins(truth, unlisted) if graded else {}
    extra: dict[str, float] = {}

    best_exact = float(answer.best == truth.best)
    best = best_exact
    if config.best_mode == "graded":
        best = 0.0  # an illegal B
        if answer.best in truth.legal:
            extra["best_regret"] = _regret(answer.best, truth, wins)
            best = config.credit(extra["best_regret"])

    top = truth.moves[: min(MAX_LISTED_MOVES, len(truth.moves))]
    top5_overlap = len(set(answer.moves) & set(top)) / len(top)
    top5 = top5_overlap
    if config.top5_mode == "graded":
        top5, regrets = _graded_top5(legal_moves, truth, config, wins)
        if regrets:
            extra["moves_regret"] = sum(regrets) / len(regrets)

    evaluation, errors = _eval_credit(answer, truth, config, unlisted)
    if errors:
        extra["eval_error"] = sum(errors) / len(errors)
    components = {
        "format": 1.0,
        "legal": legal,
        "best": best,
        "top5": top5,
        "eval": evaluation,
        "best_exact": best_exact,
        "top5_overlap": top5_overlap,
        **extra,
    }
    total = (
        config.format_weight
        + config.legal_weight * legal
        + config.best_weight * best
        + config.top5_weight * top5
        + config.eval_weight * evaluation
    )
    return Reward(total, components, None, answer)


def score_environment(
    answer: EnvironmentAnswer | Malformed, truth: EnvironmentAnswer, config: EnvironmentRewardConfig
) -> Reward:
    """The A: reward of a parsed completion against python-chess's truth."""
    if isinstance(answer, Malformed):
        return Reward(config.malformed_penalty, {name: 0.0 for name in ENVIRONMENT_COMPONENTS}, answer.reason)
    predicted, expected = answer.fen.split(), truth.fen.split()
    fen_exact = float(predicted == expected)
    fen_fields = sum(a == b for a, b in zip(predicted, expected)) / 6.0
    components = {
        "format": 1.0,
        "fen_exact": fen_exact,
        "fen_fields": fen_fields,
        "reward": float(abs(answer.reward - truth.reward) < 1e-9),
        "terminated": float(answer.terminated == truth.terminated),
        "truncated": float(answer.truncated == truth.truncated),
    }
    total = (
        config.format_weight
        + config.fen_exact_weight * fen_exact
        + config.fen_fields_weight * fen_fields
        + config.reward_weight * components["reward"]
        + config.terminated_weight * components["terminated"]
        + config.truncated_weight * components["truncated"]
    )
    return Reward(total, components, None, answer)


def _unlisted_pairs(
    truth: PolicyTruth, answer: PolicyAnswer | Malformed, config: PolicyRewardConfig
) -> list[tuple[str, str]]:
    """The (FEN, move) pairs `score_policy` needs searched: legal moves of the answer outside the engine's list."""
    if isinstance(answer, Malformed):
        return []
    moves: list[str] = []
    if config.top5_mode == "graded" or (config.eval_unlisted_moves and config.eval_weight > 0):
        moves += answer.moves
    if config.best_mode == "graded":
        moves.append(answer.best)
    return [(truth.fen, m) for m in dict.fromkeys(moves) if m in truth.legal and m not in truth.moves]


@functools.lru_cache(maxsize=4)
def shared_tablebase(path: str) -> Tablebase:
    """One open `Tablebase` per path for the process (its probe caches then serve every step)."""
    from chessgrpo.engine.tablebase import Tablebase

    return Tablebase(path)


def policy_truths_for(pool: EnginePool | None, fens: Sequence[str], config: PolicyRewardConfig) -> list[PolicyTruth]:
    """The truths of P: positions from the oracle `config.truth` names (engine: one batched, cached
    multipv search per position; tablebase: exact probes, a `ValueError` naming a position no table covers)."""
    if config.truth == "tablebase":
        tablebase = shared_tablebase(config.syzygy_path)
        try:
            return tablebase_truths(tablebase, fens, multipv=config.multipv)
        except KeyError as error:
            raise InputError(f"rewards.policy.truth is tablebase but {error.args[0]}") from None
    if pool is None:
        raise ValueError("policy-task rewards with rewards.policy.truth: engine need an engine pool")
    return policy_truths(pool, fens, nodes=config.nodes, multipv=config.multipv)


def score_policy_completions(
    pool: EnginePool | None, prompts: Sequence[str], completions: Sequence[str], config: RookWorldRewardConfig
) -> list[Reward]:
    """Rewards of completions of P: prompts: each answer against the truth of its position (`policy_truths_for`;
    an engine truth also searches each move the answer lists outside the engine's top 5)."""
    pc = config.policy
    fens = [policy_prompt_fen(prompt) for prompt in prompts]
    truths = policy_truths_for(pool, fens, pc)
    if pc.truth == "tablebase":
        return [score_policy(parse_policy_completion(c), truth, pc) for truth, c in zip(truths, completions)]
    answers = [parse_policy_completion(completion) for completion in completions]
    pairs = [pair for truth, answer in zip(truths, answers) for pair in _unlisted_pairs(truth, answer, pc)]
    by_fen: dict[str, dict[str, MoveValue]] = {}
    for (fen, move), value in unlisted_move_values(pool, pairs, nodes=pc.nodes).items():
        by_fen.setdefault(fen, {})[move] = value
    return [score_policy(answer, truth, pc, by_fen.get(truth.fen)) for truth, answer in zip(truths, answers)]


def is_dtz_optimal(answer: PolicyAnswer | Malformed, truth: PolicyTruth) -> bool:
    """Whether a parsed P: answer's B: move is one of the exactly best moves of a tablebase truth (`PolicyTruth.optimal`:
    the DTZ-optimal ones in a won position). The one definition behind ``best_exact`` (`_score_policy_exact`),
    `eval lm`'s best-move accuracy under a tablebase truth and the binary ``dtz_optimal`` reward."""
    return not isinstance(answer, Malformed) and answer.best in truth.optimal


def dtz_optimal_rewards(prompts: Sequence[str], completions: Sequence[str], config: PolicyRewardConfig) -> list[Reward]:
    """The binary reward of completions of P: prompts: 1.0 when B: is DTZ-optimal by the tables at
    ``config.syzygy_path`` (`is_dtz_optimal`), 0.0 otherwise (a slower win, a draw, illegal, ill-formed). The
    tables are the truth whatever ``config.truth`` says; component ``dtz_optimal`` is the same 0/1."""
    tablebase_config = dataclasses.replace(config, truth="tablebase")
    truths = policy_truths_for(None, [policy_prompt_fen(prompt) for prompt in prompts], tablebase_config)
    rewards = []
    for truth, completion in zip(truths, completions):
        answer = parse_policy_completion(completion)
        value = float(is_dtz_optimal(answer, truth))
        malformed = answer.reason if isinstance(answer, Malformed) else None
        rewards.append(Reward(value, {"dtz_optimal": value}, malformed, None if malformed else answer))
    return rewards


def score_environment_completions(
    pool: EnginePool | None, prompts: Sequence[str], completions: Sequence[str], config: RookWorldRewardConfig
) -> list[Reward]:
    """Rewards of completions of A: prompts: each answer against python-chess's step of the environment."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        query = parse_environment_prompt(prompt)
        truth = environment_step(query.fen, query.move)
        rewards.append(score_environment(parse_environment_completion(completion), truth, config.environment))
    return rewards


TaskRewards = Callable[["EnginePool | None", Sequence[str], Sequence[str], RookWorldRewardConfig], list[Reward]]
"""A RookWorld text task's reward: (pool, its prompts, their completions, the reward config) -> one `Reward`
per completion (`Reward.total` is what GRPO trains on; its components are logged)."""

TASK_GRADERS: dict[str, TaskRewards] = {
    "policy": score_policy_completions,
    "environment": score_environment_completions,
}
"""The grader of each text task (`data.rookworld_format.task_of` of the prompt), in the order they are scored.
Training names its rewards in `tasks.lm_rewards.ROOKWORLD_REWARDS`, whose built-in ``policy`` and
``environment`` records are these graders."""


def score_completions(
    pool: EnginePool | None,
    prompts: Sequence[str],
    completions: Sequence[str],
    config: RookWorldRewardConfig,
) -> list[Reward]:
    """Rewards of completions of P: and A: prompts (any mix), each task by its `TASK_GRADERS` entry.

    A prompt that is not a valid P:/A: prompt raises `ValueError` (prompts are inputs, not model
    outputs); a completion that does not parse scores the task's malformed penalty.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    tasks = [task_of(p) for p in prompts]
    rewards: list[Reward | None] = [None] * len(prompts)
    for task, score in TASK_GRADERS.items():
        rows = [i for i, t in enumerate(tasks) if t == task]
        if rows:
            for row, reward in zip(
                rows, score(pool, [prompts[i] for i in rows], [completions[i] for i in rows], config)
            ):
                rewards[row] = reward
    return rewards  # type: ignore[return-value]
