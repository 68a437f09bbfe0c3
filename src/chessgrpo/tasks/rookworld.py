"""RookWorld text tasks: exact formats, tolerant parsers, verifiable rewards and LM rollout groups.

**Policy task** (one line; `format_policy_line`)::

    P: <FEN>                   M: <up to 5 UCI moves>  E: <their evaluations>    B: <best move>
    |<------ 92 chars ------->|<----- 33 chars ----->|<------ 43 chars ------->|

Each field is its marker plus content, left-justified with spaces to the width measured on the
real RookWorld lines (``../shared/data/rookworld_samples.txt``): 92, 33 and 43 characters (a
longer content is not cut; parsers split on the markers). M holds the engine's top moves in a
shuffled order, E their evaluations in pawns from the side to move's point of view in the same
order (mate = +/-1000.0, Python's shortest float repr of the value rounded to centipawns), B the
best move. Prompt = ``"P: " + FEN``; completion = the rest of the line, padding included.

**Environment task** (`format_environment_line`)::

    A: <FEN>+<uci>+<last <= 10 moves incl. this one>+<new FEN>+<reward>+<terminated>+<truncated>

Prompt = everything up to and including the third ``+``. The truth comes from python-chess
(`environment_step`): reward 1.0 when the mover mates, 0.5 when the game is otherwise over
(stalemate, insufficient material, 75-move rule: python-chess's ``outcome()`` of the position
without history, since the prompt carries no repetition record), 0.001 for another legal move,
-1.0 for an illegal one (then the FEN is unchanged and truncated = 1); flags are 0/1.

**Parsers** accept any whitespace between fields and around values and reject any content that
is not exactly what the format says (1-5 distinct UCI moves, as many numbers, a UCI best move; a valid
position, a number and two 0/1 flags). A malformed completion is a `Malformed` value with the
reason, never an exception.

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
- environment task (`EnvironmentRewardConfig`): ``format``, ``fen_exact`` (the whole new FEN),
  ``fen_fields`` (partial credit: the share of the six FEN fields that match), ``reward``,
  ``terminated``, ``truncated`` (each 1 when equal to the truth). Maximum 2.3 by default.

`policy_reward`, `environment_reward` and `rookworld_reward` have TRL's reward-function
signature ``(prompts, completions, **kwargs) -> list[float]`` and start (once) and reuse an
engine pool.

**Upstream defect**: in the RookWorld data, for Black to move B: is often the worst of the
listed moves; `upstream_best_defect` flags a line whose B is not the best of its own listed
evaluations.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import random
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import chess

from chessgrpo.board.validation import parse_board, parse_move

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from chessgrpo.engine import EnginePool
    from chessgrpo.models.lm import ChessLM, Generation
    from chessgrpo.rl import PolicyOutputs, RolloutBatch

P_FIELD_WIDTH = 92
"""Width of ``"P: " + FEN`` with its padding, as in the RookWorld data."""
M_FIELD_WIDTH = 33
"""Width of ``"M: " + moves`` with its padding."""
E_FIELD_WIDTH = 43
"""Width of ``"E: " + evaluations`` with its padding."""
MAX_LISTED_MOVES = 5
MATE_PAWNS = 1000.0
"""E value of a forced mate for the side to move (negative: it gets mated)."""
HISTORY_MOVES = 10
"""The A: prompt carries the last <= 10 moves, this one included."""

REWARD_MATE = 1.0
REWARD_DRAW = 0.5
REWARD_MOVE = 0.001
REWARD_ILLEGAL = -1.0
ENVIRONMENT_REWARDS = (REWARD_MATE, REWARD_DRAW, REWARD_MOVE, REWARD_ILLEGAL)

_UCI = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")
_NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?$")
_POLICY_COMPLETION = re.compile(r"^\s*M:(?P<moves>.*?)E:(?P<evals>.*?)B:(?P<best>.*)$", re.DOTALL)
_ENVIRONMENT_PROMPT = re.compile(r"^\s*A:\s*(?P<fen>[^+]*?)\s*\+\s*(?P<move>[^+]*?)\s*\+(?P<history>[^+]*)\+$", re.DOTALL)


def _is_uci(text: str) -> bool:
    """A UCI move's syntax: two distinct squares and an optional promotion piece ("c5c5" is not a move)."""
    return bool(_UCI.match(text)) and text[:2] != text[2:4]


# ------------------------------------------------------------------------------------------------
# Values


@dataclasses.dataclass(frozen=True)
class Malformed:
    """A completion that does not parse, and why."""

    reason: str

    def __bool__(self) -> bool:  # a Malformed is falsy, so `if parsed:` reads naturally
        return False


@dataclasses.dataclass(frozen=True)
class PolicyAnswer:
    """The content of a P: completion."""

    moves: tuple[str, ...]
    """M: the candidate moves (UCI), in the order written."""
    evals: tuple[float, ...]
    """E: evaluation of each move of M in pawns, side to move's view, same order."""
    best: str
    """B: the chosen move (UCI)."""


@dataclasses.dataclass(frozen=True)
class EnvironmentQuery:
    """The content of an A: prompt."""

    fen: str
    move: str
    history: tuple[str, ...]
    """The last <= 10 moves, ending with `move`."""


@dataclasses.dataclass(frozen=True)
class EnvironmentAnswer:
    """The content of an A: completion: the environment's response to the move."""

    fen: str
    reward: float
    terminated: bool
    truncated: bool


# ------------------------------------------------------------------------------------------------
# Formatting


def format_pawns(value: float) -> str:
    """An evaluation as upstream writes it: the shortest repr of the value rounded to 0.01 pawns."""
    if not math.isfinite(value):
        raise ValueError(f"evaluation must be finite, got {value}")
    return repr(round(float(value), 2) + 0.0)  # + 0.0 turns -0.0 into 0.0


def format_reward(value: float) -> str:
    return repr(float(value))


def policy_prompt(fen: str) -> str:
    """``"P: " + FEN`` (the FEN is validated and written as given, whitespace-normalised)."""
    parse_board(fen)
    return "P: " + " ".join(fen.split())


def format_policy_line(fen: str, answer: PolicyAnswer) -> str:
    """The whole P: line (prompt + completion), fields padded to 92/33/43 characters."""
    if not 1 <= len(answer.moves) <= MAX_LISTED_MOVES or len(answer.evals) != len(answer.moves):
        raise ValueError(f"a P: answer needs 1-{MAX_LISTED_MOVES} moves and one evaluation each, got {answer}")
    for move in (*answer.moves, answer.best):
        if not _UCI.match(move):
            raise ValueError(f"{move!r} is not a UCI move")
    head = policy_prompt(fen).ljust(P_FIELD_WIDTH)
    moves = ("M: " + " ".join(answer.moves)).ljust(M_FIELD_WIDTH)
    evals = ("E: " + " ".join(format_pawns(v) for v in answer.evals)).ljust(E_FIELD_WIDTH)
    return head + moves + evals + "B: " + answer.best


def format_policy_completion(fen: str, answer: PolicyAnswer) -> str:
    """The completion of `policy_prompt(fen)`: the rest of the line, padding included."""
    return format_policy_line(fen, answer)[len(policy_prompt(fen)) :]


def environment_prompt(query: EnvironmentQuery) -> str:
    for move in query.history:
        if not _UCI.match(move):
            raise ValueError(f"history move {move!r} is not a UCI move")
    if not query.history or query.history[-1] != query.move or len(query.history) > HISTORY_MOVES:
        raise ValueError(f"the history must hold 1-{HISTORY_MOVES} moves ending with the move {query.move!r}")
    parse_board(query.fen)
    return f"A: {' '.join(query.fen.split())}+{query.move}+{' '.join(query.history)}+"


def format_environment_completion(answer: EnvironmentAnswer) -> str:
    return f"{answer.fen}+{format_reward(answer.reward)}+{int(answer.terminated)}+{int(answer.truncated)}"


def format_environment_line(query: EnvironmentQuery, answer: EnvironmentAnswer) -> str:
    return environment_prompt(query) + format_environment_completion(answer)


# ------------------------------------------------------------------------------------------------
# Parsing


def parse_policy_completion(text: str) -> PolicyAnswer | Malformed:
    """The M/E/B content of a P: completion, or `Malformed` with the reason."""
    if not isinstance(text, str):
        return Malformed(f"completion is {type(text).__name__}, not text")
    match = _POLICY_COMPLETION.match(text)
    if match is None:
        missing = [marker for marker in ("M:", "E:", "B:") if marker not in text]
        return Malformed(f"missing {', '.join(missing)}" if missing else "fields out of order (expected M: E: B:)")
    moves = match.group("moves").split()
    evals = match.group("evals").split()
    best = match.group("best").split()
    if not 1 <= len(moves) <= MAX_LISTED_MOVES:
        return Malformed(f"M: holds {len(moves)} moves, expected 1-{MAX_LISTED_MOVES}")
    for move in moves:
        if not _is_uci(move):
            return Malformed(f"M: {move[:12]!r} is not a UCI move")
    if len(set(moves)) != len(moves):
        return Malformed("M: lists a move twice")
    if len(evals) != len(moves):
        return Malformed(f"E: holds {len(evals)} values for {len(moves)} moves")
    values = []
    for text_value in evals:
        if not _NUMBER.match(text_value):
            return Malformed(f"E: {text_value[:12]!r} is not a number")
        value = float(text_value)
        if abs(value) > MATE_PAWNS:
            return Malformed(f"E: {text_value!r} exceeds the mate value {MATE_PAWNS}")
        values.append(value)
    if len(best) != 1 or not _is_uci(best[0]):
        return Malformed(f"B: {' '.join(best)[:20]!r} is not one UCI move")
    return PolicyAnswer(moves=tuple(moves), evals=tuple(values), best=best[0])


def split_policy_line(line: str) -> tuple[str, str]:
    """(prompt ``"P: " + FEN``, completion) of a whole P: line; `ValueError` if it has no valid FEN."""
    text = line.rstrip("\n")
    if not text.startswith("P:"):
        raise ValueError(f"not a P: line: {text[:40]!r}")
    cut = text.find("M:")
    if cut < 0:
        raise ValueError(f"P: line without M: {text[:60]!r}")
    fen = " ".join(text[2:cut].split())
    try:
        parse_board(fen)
    except ValueError as error:
        raise ValueError(f"P: line: {error}") from None
    prompt = "P: " + fen
    if text.startswith(prompt):
        return prompt, text[len(prompt) :]
    # Unusual spacing inside the prompt: the completion starts after the FEN's last character.
    return prompt, text[len(text[:cut].rstrip()) :]


def parse_policy_line(line: str) -> tuple[str, PolicyAnswer]:
    """(FEN, answer) of a whole P: line; `ValueError` naming the problem."""
    prompt, completion = split_policy_line(line)
    answer = parse_policy_completion(completion)
    if isinstance(answer, Malformed):
        raise ValueError(f"P: line {line[:60]!r}: {answer.reason}")
    return prompt[3:], answer


def parse_environment_prompt(text: str) -> EnvironmentQuery:
    """The query of an A: prompt; `ValueError` naming the problem (prompts are inputs, not outputs)."""
    match = _ENVIRONMENT_PROMPT.match(text.rstrip("\n"))
    if match is None:
        raise ValueError(f"not an A: prompt (A: FEN+move+history+): {text[:80]!r}")
    fen = " ".join(match.group("fen").split())
    board = parse_board(fen)
    move = match.group("move").strip()
    if not _UCI.match(move):
        raise ValueError(f"A: prompt move {move!r} is not a UCI move")
    history = tuple(match.group("history").split())
    if not history or len(history) > HISTORY_MOVES or history[-1] != move or any(not _UCI.match(m) for m in history):
        raise ValueError(f"A: prompt history {' '.join(history)!r} must be 1-{HISTORY_MOVES} UCI moves ending with {move!r}")
    del board
    return EnvironmentQuery(fen=fen, move=move, history=history)


def parse_environment_completion(text: str) -> EnvironmentAnswer | Malformed:
    """The new FEN, reward and flags of an A: completion, or `Malformed` with the reason."""
    if not isinstance(text, str):
        return Malformed(f"completion is {type(text).__name__}, not text")
    parts = text.strip().split("+")
    if len(parts) != 4:
        return Malformed(f"expected FEN+reward+terminated+truncated, got {len(parts)} '+'-separated fields")
    fen_text, reward_text, terminated_text, truncated_text = (part.strip() for part in parts)
    fen = " ".join(fen_text.split())
    try:
        parse_board(fen)
    except ValueError as error:
        return Malformed(f"new FEN: {error}"[:200])
    if not _NUMBER.match(reward_text):
        return Malformed(f"reward {reward_text[:12]!r} is not a number")
    flags = []
    for name, flag in (("terminated", terminated_text), ("truncated", truncated_text)):
        if flag not in ("0", "1"):
            return Malformed(f"{name} {flag[:12]!r} is not 0 or 1")
        flags.append(flag == "1")
    return EnvironmentAnswer(fen=fen, reward=float(reward_text), terminated=flags[0], truncated=flags[1])


def split_environment_line(line: str) -> tuple[str, str]:
    """(prompt, completion) of a whole A: line: the prompt ends at the third '+'."""
    text = line.rstrip("\n")
    cut = -1
    for _ in range(3):
        cut = text.find("+", cut + 1)
        if cut < 0:
            raise ValueError(f"A: line with fewer than three '+': {text[:60]!r}")
    return text[: cut + 1], text[cut + 1 :]


def parse_environment_line(line: str) -> tuple[EnvironmentQuery, EnvironmentAnswer]:
    prompt, completion = split_environment_line(line)
    query = parse_environment_prompt(prompt)
    answer = parse_environment_completion(completion)
    if isinstance(answer, Malformed):
        raise ValueError(f"A: line {line[:60]!r}: {answer.reason}")
    return query, answer


def task_of(prompt: str) -> str:
    """"policy" or "environment" from a prompt's marker; `ValueError` otherwise."""
    head = prompt.lstrip()[:2]
    if head == "P:":
        return "policy"
    if head == "A:":
        return "environment"
    raise ValueError(f"prompt {prompt[:40]!r} starts with neither 'P:' nor 'A:'")


# ------------------------------------------------------------------------------------------------
# Ground truth


def environment_step(fen: str, move: str) -> EnvironmentAnswer:
    """What the environment answers to `move` in `fen` (python-chess; see the module docstring)."""
    board = parse_board(fen)
    try:
        parsed = parse_move(board, move)
    except ValueError:
        return EnvironmentAnswer(fen=" ".join(fen.split()), reward=REWARD_ILLEGAL, terminated=False, truncated=True)
    board.push(parsed)
    outcome = board.outcome(claim_draw=False)
    if outcome is None:
        reward, terminated = REWARD_MOVE, False
    elif outcome.termination == chess.Termination.CHECKMATE:
        reward, terminated = REWARD_MATE, True
    else:
        reward, terminated = REWARD_DRAW, True
    return EnvironmentAnswer(fen=board.fen(), reward=reward, terminated=terminated, truncated=False)


def upstream_best_defect(answer: PolicyAnswer) -> bool:
    """True when B is not (one of) the best of the line's own listed evaluations.

    The upstream RookWorld generator took the last multipv entry for Black, so such lines teach
    the worst listed move. A B outside M is flagged too.
    """
    if answer.best not in answer.moves:
        return True
    return answer.evals[answer.moves.index(answer.best)] < max(answer.evals)


def mover_pawns(cp: int | None, mate: int | None) -> float:
    """An engine score for the side to move in pawns, mate = +/-1000."""
    if mate is not None:
        return MATE_PAWNS if mate > 0 else -MATE_PAWNS
    if cp is None:
        raise ValueError("a score needs cp or mate")
    return cp / 100.0


@dataclasses.dataclass(frozen=True)
class PolicyTruth:
    """The engine's view of a position for the policy task."""

    fen: str
    moves: tuple[str, ...]
    """The engine's top moves, best first (multipv order)."""
    pawns: tuple[float, ...]
    """Their values in pawns for the side to move."""
    legal: frozenset[str]
    """Every legal move (UCI)."""
    wins: tuple[float, ...] = ()
    """Their win probabilities (expected score for the side to move, the pool's python-chess WDL
    model); empty in a truth built without them (graded rewards need them: use `policy_truths`)."""

    @property
    def best(self) -> str:
        return self.moves[0]

    @property
    def best_win(self) -> float:
        """The reference win probability regrets are measured from: the best listed line's."""
        if len(self.wins) != len(self.moves):
            raise ValueError(f"the truth of {self.fen!r} carries no win probabilities (build it with policy_truths)")
        return max(self.wins)

    def answer(self, seed: int | None = None) -> PolicyAnswer:
        """The engine's answer in P: form: M shuffled (seeded), E rounded as written, B = best."""
        order = list(range(len(self.moves)))
        random.Random(seed if seed is not None else self.fen).shuffle(order)
        return PolicyAnswer(
            moves=tuple(self.moves[i] for i in order),
            evals=tuple(round(self.pawns[i], 2) for i in order),
            best=self.best,
        )


def policy_truths(pool: EnginePool, fens: Sequence[str], *, nodes: int, multipv: int = MAX_LISTED_MOVES) -> list[PolicyTruth]:
    """One `PolicyTruth` per FEN from a multipv analysis (cached by the pool); distinct FENs once."""
    boards = {fen: parse_board(fen) for fen in dict.fromkeys(fens)}
    for fen, board in boards.items():
        if not any(board.generate_legal_moves()):
            raise ValueError(f"position {fen!r} has no legal move: no policy task")
    analyses = pool.analyse_many(list(boards.values()), multipv=multipv, nodes=nodes)
    truths = {}
    for (fen, board), analysis in zip(boards.items(), analyses):
        if not analysis.lines:
            raise RuntimeError(f"the engine returned no line for {fen!r}")
        truths[fen] = PolicyTruth(
            fen=fen,
            moves=tuple(line.move for line in analysis.lines),
            pawns=tuple(mover_pawns(line.cp, line.mate) for line in analysis.lines),
            legal=frozenset(move.uci() for move in board.legal_moves),
            wins=tuple(line.win_probability for line in analysis.lines),
        )
    return [truths[fen] for fen in fens]


# ------------------------------------------------------------------------------------------------
# Rewards


REWARD_MODES = ("graded", "exact")
"""Values of `PolicyRewardConfig.best_mode` / `top5_mode`."""


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
    eval_clip: float = 10.0
    """Both evaluations are clipped to +/- this many pawns before comparing (mate = +/-1000)."""
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
        if self.eval_scale <= 0 or self.eval_clip <= 0:
            raise ValueError("eval_scale and eval_clip must be > 0")
        if not math.isfinite(self.malformed_penalty):
            raise ValueError("malformed_penalty must be finite")
        if self.nodes < 1 or not 1 <= self.multipv <= MAX_LISTED_MOVES:
            raise ValueError(f"need nodes >= 1 and multipv in 1..{MAX_LISTED_MOVES}")

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
                raise ValueError(f"{field.name} must be a finite number{' >= 0' if field.name != 'malformed_penalty' else ''}, got {value}")

    @property
    def maximum(self) -> float:
        return (self.format_weight + self.fen_exact_weight + self.fen_fields_weight + self.reward_weight
                + self.terminated_weight + self.truncated_weight)  # fmt: skip


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


@dataclasses.dataclass(frozen=True)
class MoveValue:
    """A legal move's value for the mover, from a search of the position after it (`unlisted_move_values`)."""

    pawns: float
    """Pawns, mover's view (mate = +/-1000)."""
    win: float
    """Win probability (expected score) for the mover: 1 - the opponent's after the move."""


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
        raise ValueError(f"legal move {move!r} in {truth.fen!r} has no value: pass its search in `unlisted` (score_completions does)")
    return truth.best_win - wins[move]


def _graded_top5(moves: Sequence[str], truth: PolicyTruth, config: PolicyRewardConfig, wins: dict[str, float]) -> tuple[float, list[float]]:
    """(graded `top5`, regrets of `moves`): the distinct legal moves' summed credits over the engine's top k's.

    Normalised by what the engine's own top k earn, not by |M|: a mean over M would give a one-move M
    holding the best move full credit, so listing fewer moves would pay.
    """
    k = min(MAX_LISTED_MOVES, len(truth.moves))
    attainable = sum(config.credit(truth.best_win - win) for win in truth.wins[:k])  # >= 1: the best line's credit
    regrets = [_regret(move, truth, wins) for move in moves]
    return min(1.0, sum(config.credit(r) for r in regrets) / attainable), regrets


def _eval_credit(answer: PolicyAnswer, truth: PolicyTruth, config: PolicyRewardConfig,
                 unlisted: dict[str, MoveValue] | None) -> tuple[float, list[float]]:  # fmt: skip
    """(`eval` credit, absolute errors in pawns of the moves with a known value)."""
    known = dict(zip(truth.moves, truth.pawns))
    if unlisted and config.eval_unlisted_moves:
        known.update({m: v.pawns for m, v in unlisted.items() if m not in known})
    clip = config.eval_clip
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


def score_policy(answer: PolicyAnswer | Malformed, truth: PolicyTruth, config: PolicyRewardConfig,
                 unlisted: dict[str, MoveValue] | None = None) -> Reward:  # fmt: skip
    """The P: reward of a parsed completion against the engine's truth.

    `unlisted` maps legal moves outside the engine's list (of M, and B) to their searched values;
    a graded mode raises `ValueError` for a legal move it needs and lacks (never a silent 0).
    Besides `POLICY_COMPONENTS`, reports when measurable ``eval_error`` (pawns), ``best_regret``
    (B's win-probability regret) and ``moves_regret`` (mean over M's distinct legal moves, graded `top5` only).
    """
    if isinstance(answer, Malformed):
        return Reward(config.malformed_penalty, {name: 0.0 for name in POLICY_COMPONENTS}, answer.reason)
    legal_moves = [m for m in dict.fromkeys(answer.moves) if m in truth.legal]
    legal = len(legal_moves) / len(answer.moves)
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
    components = {"format": 1.0, "legal": legal, "best": best, "top5": top5, "eval": evaluation,
                  "best_exact": best_exact, "top5_overlap": top5_overlap, **extra}  # fmt: skip
    total = (config.format_weight + config.legal_weight * legal + config.best_weight * best + config.top5_weight * top5
             + config.eval_weight * evaluation)  # fmt: skip
    return Reward(total, components, None, answer)


def score_environment(answer: EnvironmentAnswer | Malformed, truth: EnvironmentAnswer, config: EnvironmentRewardConfig) -> Reward:
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
    total = (config.format_weight + config.fen_exact_weight * fen_exact + config.fen_fields_weight * fen_fields
             + config.reward_weight * components["reward"] + config.terminated_weight * components["terminated"]
             + config.truncated_weight * components["truncated"])  # fmt: skip
    return Reward(total, components, None, answer)


def unlisted_move_values(pool: EnginePool, pairs: Sequence[tuple[str, str]], *, nodes: int) -> dict[tuple[str, str], MoveValue]:
    """Values (mover's view) of (FEN, legal move) pairs from a search of the position after the move."""
    distinct = list(dict.fromkeys(pairs))
    if not distinct:
        return {}
    boards = []
    for fen, move in distinct:
        board = parse_board(fen)
        board.push(parse_move(board, move))
        boards.append(board)
    values = {}
    for pair, evaluation in zip(distinct, pool.evaluate(boards, nodes=nodes)):
        if evaluation.mate is not None:  # the opponent's mate score; mate 0 = the opponent is mated
            pawns = -MATE_PAWNS if evaluation.mate > 0 else MATE_PAWNS
        else:
            pawns = -(evaluation.cp or 0) / 100.0
        # The opponent's expected score, one ply later: the WDL model's ply term moves it negligibly.
        values[pair] = MoveValue(pawns=pawns, win=1.0 - evaluation.win_probability)
    return values


def _unlisted_pairs(truth: PolicyTruth, answer: PolicyAnswer | Malformed, config: PolicyRewardConfig) -> list[tuple[str, str]]:
    """The (FEN, move) pairs `score_policy` needs searched: legal moves of the answer outside the engine's list."""
    if isinstance(answer, Malformed):
        return []
    moves: list[str] = []
    if config.top5_mode == "graded" or (config.eval_unlisted_moves and config.eval_weight > 0):
        moves += answer.moves
    if config.best_mode == "graded":
        moves.append(answer.best)
    return [(truth.fen, m) for m in dict.fromkeys(moves) if m in truth.legal and m not in truth.moves]


def score_completions(
    pool: EnginePool | None,
    prompts: Sequence[str],
    completions: Sequence[str],
    config: RookWorldRewardConfig,
) -> list[Reward]:
    """Rewards of completions of P: and A: prompts (any mix), engine calls batched and cached.

    A prompt that is not a valid P:/A: prompt raises `ValueError` (prompts are inputs, not model
    outputs); a completion that does not parse scores the task's malformed penalty.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    tasks = [task_of(p) for p in prompts]
    rewards: list[Reward | None] = [None] * len(prompts)
    policy_rows = [i for i, t in enumerate(tasks) if t == "policy"]
    if policy_rows:
        if pool is None:
            raise ValueError("policy-task rewards need an engine pool")
        pc = config.policy
        fens = [" ".join(prompts[i].strip()[2:].split()) for i in policy_rows]
        truths = policy_truths(pool, fens, nodes=pc.nodes, multipv=pc.multipv)
        answers = [parse_policy_completion(completions[i]) for i in policy_rows]
        pairs = [pair for truth, answer in zip(truths, answers) for pair in _unlisted_pairs(truth, answer, pc)]
        by_fen: dict[str, dict[str, MoveValue]] = {}
        for (fen, move), value in unlisted_move_values(pool, pairs, nodes=pc.nodes).items():
            by_fen.setdefault(fen, {})[move] = value
        for row, truth, answer in zip(policy_rows, truths, answers):
            rewards[row] = score_policy(answer, truth, pc, by_fen.get(truth.fen))
    for i, task in enumerate(tasks):
        if task == "environment":
            query = parse_environment_prompt(prompts[i])
            truth = environment_step(query.fen, query.move)
            rewards[i] = score_environment(parse_environment_completion(completions[i]), truth, config.environment)
    return rewards  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------
# TRL-compatible reward functions


_POOL_LOCK = threading.Lock()
_DEFAULT_POOL: EnginePool | None = None


def default_pool() -> EnginePool:
    """The engine pool the TRL reward functions share: started on first use, closed at exit.

    Built from `EngineConfig` defaults (one process per core, the SQLite cache under runs/cache).
    """
    global _DEFAULT_POOL
    with _POOL_LOCK:
        if _DEFAULT_POOL is None:
            from chessgrpo.config import EngineConfig
            from chessgrpo.engine import EnginePool

            _DEFAULT_POOL = EnginePool.from_config(EngineConfig())
            atexit.register(_DEFAULT_POOL.close)
        return _DEFAULT_POOL


def _text(item: Any) -> str:
    """A prompt/completion as text: a string, or TRL's conversational list of messages (last content)."""
    if isinstance(item, str):
        return item
    if isinstance(item, (list, tuple)) and item and isinstance(item[-1], dict) and "content" in item[-1]:
        return str(item[-1]["content"])
    raise ValueError(f"expected a string or a list of chat messages, got {type(item).__name__}")


def _trl_rewards(prompts, completions, expected: str | None, pool, config) -> list[float]:
    prompt_texts = [_text(p) for p in prompts]
    if expected is not None:
        for prompt in prompt_texts:
            if task_of(prompt) != expected:
                raise ValueError(f"{expected} reward got a prompt of the other task: {prompt[:40]!r}; use rookworld_reward for a mix")
    needs_pool = any(task_of(p) == "policy" for p in prompt_texts)
    if needs_pool and pool is None:
        pool = default_pool()
    rewards = score_completions(pool, prompt_texts, [_text(c) for c in completions], config or RookWorldRewardConfig())
    return [r.total for r in rewards]


def policy_reward(prompts: Sequence[Any], completions: Sequence[Any], *, pool: EnginePool | None = None,
                  config: RookWorldRewardConfig | None = None, **kwargs: Any) -> list[float]:  # fmt: skip
    """TRL reward function for the P: task: ``policy_reward(prompts, completions) -> list[float]``.

    Prompts are ``"P: " + FEN``; completions the generated rest of the line. Extra keyword
    arguments (TRL passes dataset columns) are ignored. Starts the shared pool on first use.
    """
    return _trl_rewards(prompts, completions, "policy", pool, config)


def environment_reward(prompts: Sequence[Any], completions: Sequence[Any], *,
                       config: RookWorldRewardConfig | None = None, **kwargs: Any) -> list[float]:  # fmt: skip
    """TRL reward function for the A: task (python-chess only, no engine)."""
    return _trl_rewards(prompts, completions, "environment", None, config)


def rookworld_reward(prompts: Sequence[Any], completions: Sequence[Any], *, pool: EnginePool | None = None,
                     config: RookWorldRewardConfig | None = None, **kwargs: Any) -> list[float]:  # fmt: skip
    """TRL reward function for a mix of P: and A: prompts (each scored by its own task)."""
    return _trl_rewards(prompts, completions, None, pool, config)


# ------------------------------------------------------------------------------------------------
# GRPO on text: groups of completions


@dataclasses.dataclass
class RookWorldTaskConfig:
    """What a group is (the `task:` section of a `kind: rookworld` config)."""

    group_size: int = 8
    """G: completions sampled per prompt."""
    prompts_per_step: int = 16
    """B: prompts per step; a step learns from B * G completions."""
    policy_fraction: float = 0.8
    """Share of the B prompts that are P: prompts (round(B * fraction)); the rest are A: prompts."""
    temperature: float = 1.0
    """Sampling temperature; the learner, old policy and reference use the same one (invariant 1)."""
    max_new_tokens: int = 192
    """Longest completion in tokens (a P: completion is <= ~160 characters, an A: one <= ~100)."""
    logprob_chunk_rows: int = dataclasses.field(default=0, metadata={"resumable": True})  # memory, not math
    """Rows per forward when the behaviour, reference and learner log-probs and entropies are computed
    (`models.lm.completion_log_probs` ``chunk_rows``; 0 = all rows at once). Bounds the [rows, L,
    vocab] temporaries: ~35 MB per row and copy for GPT-2's vocabulary at L = 176. The learner's
    gradient memory is bounded by `grpo.micro_batch_size` instead."""
    prompt_bos: bool = False
    """Put the tokenizer's BOS token (GPT-2: ``<|endoftext|>``, also its EOS) before every prompt, as
    the upstream RookWorld data did before every sample; for models trained that way (e.g. a
    downloaded RookWorld-LM-124M). Off for models fine-tuned here without it (`kind: sft` key
    ``prompt_bos`` must match). Applies to sampling and evaluation alike."""

    def __post_init__(self) -> None:
        if self.logprob_chunk_rows < 0:
            raise ValueError(f"logprob_chunk_rows must be >= 0 (0 = all rows at once), got {self.logprob_chunk_rows}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a group of one has no baseline), got {self.group_size}")
        if self.prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if not 0.0 <= self.policy_fraction <= 1.0:
            raise ValueError(f"policy_fraction must be in [0, 1], got {self.policy_fraction}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def split(self, count: int | None = None) -> tuple[int, int]:
        """(P: prompts, A: prompts) of `count` prompts (default: prompts_per_step, a step's prompts)."""
        count = self.prompts_per_step if count is None else count
        policy = round(count * self.policy_fraction)
        return policy, count - policy


@dataclasses.dataclass
class CompletionGroups:
    """B prompts with G sampled completions each (rows prompt-major), and what the policy thought."""

    prompts: list[str]
    """[B] prompt texts."""
    generation: Generation
    """B * G rows; row r belongs to prompt r // G."""
    texts: list[str]
    """[B * G] decoded completions (no EOS)."""
    behaviour_logp: torch.Tensor
    """[B * G, L] log-probs of the sampled tokens under the sampling weights (`completion_log_probs`)."""
    ref_logp: torch.Tensor | None
    """[B * G, L] under the frozen reference, or None."""
    entropy: torch.Tensor
    """[B * G, L] exact entropy of the tempered next-token distribution (0 at masked positions)."""
    group_size: int

    @property
    def group_ids(self) -> torch.Tensor:
        import torch

        return torch.arange(len(self.prompts)).repeat_interleave(self.group_size)

    def row_prompts(self) -> list[str]:
        return [p for p in self.prompts for _ in range(self.group_size)]


class PromptBOSTokenizer:
    """An `LMTokenizer` whose `encode` puts the BOS token before the text: the prompt encoding of a
    model trained, as upstream RookWorld-LM was, with ``<|endoftext|>`` before every sample.
    Decoding, EOS and saving are the wrapped tokenizer's. Wrap for prompts only (`with_prompt_bos`)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.bos_token_id = prompt_bos_id(inner)
        self.eos_token_id = inner.eos_token_id
        self.vocab_size = inner.vocab_size
        self.kind = getattr(inner, "kind", "unknown")

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *self.inner.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def save(self, directory: Any) -> None:
        self.inner.save(directory)


def prompt_bos_id(tokenizer: Any) -> int:
    """The BOS id of an `LMTokenizer`: a `transformers` tokenizer's bos_token_id, else its EOS id
    (GPT-2's BOS and EOS are both ``<|endoftext|>``; the character tokenizer's EOS is newline)."""
    bos = getattr(getattr(tokenizer, "tokenizer", None), "bos_token_id", None)
    return int(bos) if bos is not None else int(tokenizer.eos_token_id)


def with_prompt_bos(lm: ChessLM, enabled: bool) -> ChessLM:
    """`lm` itself, or (`enabled`) the same model whose tokenizer prefixes BOS to every encoded text:
    for the code paths that encode only prompts (sampling, `eval.lm`)."""
    if not enabled:
        return lm
    from chessgrpo.models.lm import ChessLM

    return ChessLM(lm.model, PromptBOSTokenizer(lm.tokenizer), lm.source)  # type: ignore[arg-type]


def sample_completion_groups(
    lm: ChessLM,
    prompts: Sequence[str],
    group_size: int,
    *,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    reference: torch.nn.Module | None = None,
    chunk_rows: int = 0,
) -> CompletionGroups:
    """Sample G completions per prompt, then record behaviour (and reference) log-probs and entropy.

    The behaviour log-probs are recomputed on the finished sequences with `completion_log_probs`,
    the learner's own function, at the sampling temperature (see `models.lm`), `chunk_rows` rows
    per forward (0 = all). The completion tokens are the generated ids themselves, never the
    decoded text encoded again: a prompt/completion boundary inside what would be one BPE token
    of the joint text cannot shift the tokens that log-probs are taken of.
    """
    import torch

    with torch.no_grad():
        return _sample_completion_groups(lm, prompts, group_size, temperature, max_new_tokens, generator, reference, chunk_rows)


def _sample_completion_groups(lm, prompts, group_size, temperature, max_new_tokens, generator, reference, chunk_rows=0) -> CompletionGroups:
    from chessgrpo.models.lm import completion_log_probs, generate

    model = lm.model
    if model.training or (reference is not None and reference.training):
        raise RuntimeError("sampling needs every model in eval mode (no dropout in RL forwards)")
    encoded = [lm.tokenizer.encode(p) for p in prompts]
    rows = [ids for ids in encoded for _ in range(group_size)]
    generation = generate(
        model, rows, eos_token_id=lm.tokenizer.eos_token_id, max_new_tokens=max_new_tokens,
        temperature=temperature, generator=generator, row_groups=[i // group_size for i in range(len(rows))],
    )  # fmt: skip
    logp, entropy = completion_log_probs(
        model, generation.prompt_ids, generation.prompt_mask, generation.completion_ids, generation.completion_mask,
        temperature=temperature, with_entropy=True, chunk_rows=chunk_rows,
    )  # fmt: skip
    ref_logp = None
    if reference is not None:
        ref_logp, _ = completion_log_probs(
            reference, generation.prompt_ids, generation.prompt_mask, generation.completion_ids,
            generation.completion_mask, temperature=temperature, chunk_rows=chunk_rows,
        )  # fmt: skip
    assert entropy is not None
    return CompletionGroups(
        prompts=list(prompts),
        generation=generation,
        texts=generation.texts(lm.tokenizer),
        behaviour_logp=logp,
        ref_logp=ref_logp,
        entropy=entropy,
        group_size=group_size,
    )


def to_rollout_batch(groups: CompletionGroups, rewards: torch.Tensor) -> RolloutBatch:
    """Rows = the B * G completions (L tokens, mask through EOS); group id = prompt index."""
    from chessgrpo.rl import RolloutBatch

    g = groups.generation
    n = g.completion_ids.shape[0]
    if rewards.shape != (n,):
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} for {n} completions")
    device = g.completion_ids.device
    return RolloutBatch(
        inputs={"prompt_ids": g.prompt_ids, "prompt_mask": g.prompt_mask},
        actions=g.completion_ids,
        behaviour_logp=groups.behaviour_logp.float(),
        mask=g.completion_mask,
        rewards=rewards.float().to(device),
        group_ids=groups.group_ids.to(device),
        ref_logp=None if groups.ref_logp is None else groups.ref_logp.float(),
    )


def make_forward(model: torch.nn.Module, *, temperature: float, chunk_rows: int = 0, entropy_grad: bool = True):
    """The learner's forward: `completion_log_probs` (with exact entropy) of any subset of rows.

    `chunk_rows`: rows per model call (0 = all). `entropy_grad=False` (no entropy bonus) keeps the
    entropy a metric computed without gradient, which spares autograd a [rows, L, vocab] softmax."""
    from chessgrpo.models.lm import completion_log_probs
    from chessgrpo.rl import PolicyOutputs

    def forward(minibatch: RolloutBatch) -> PolicyOutputs:
        if model.training:
            raise RuntimeError("the GRPO forward needs the model in eval mode (no dropout in RL forwards)")
        inputs = minibatch.inputs
        logp, entropy = completion_log_probs(
            model, inputs["prompt_ids"], inputs["prompt_mask"], minibatch.actions, minibatch.mask,
            temperature=temperature, with_entropy=True, chunk_rows=chunk_rows, entropy_grad=entropy_grad,
        )  # fmt: skip
        return PolicyOutputs(logp=logp, entropy=entropy)

    return forward
