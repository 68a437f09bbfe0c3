"""The RookWorld text format: exact P:/A: line layouts, tolerant parsers and python-chess's A: truth.

The engine's truths (`data.rookworld_truths`), the rewards (`data.rookworld_grading`) and the
datasets (`data.rookworld`) build on it.

**Policy task** (one line; `format_policy_line`)::

    P: <FEN>                   M: <up to 5 UCI moves>  E: <their evaluations>    B: <best move>
    |<------ 92 chars ------->|<----- 33 chars ----->|<------ 43 chars ------->|

Each field is its marker plus content, left-justified with spaces to the width measured on the
real RookWorld lines (``data/rookworld_samples.txt``): 92, 33 and 43 characters (a
longer content is not cut; parsers split on the markers). M holds the engine's top moves in a
shuffled order, E their evaluations in pawns from the side to move's point of view in the same
order (mate = +/-1000.0, Python's shortest float repr of the value rounded to centipawns), B the
best move. Prompt = ``"P: " + FEN``; completion = the rest of the line, padding included.

**Policy layouts** (`POLICY_LAYOUTS`; `format_policy_line`'s ``layout``, a `PolicyAnswer`'s ``layout``):

- ``rookworld`` (the default, above): M:, E:, then B: -- the decision is the last of ~23 answer tokens;
- ``move_first`` (issue 66): the decision first, ``P: <FEN> B: <move>``, then optionally the same content
  as auxiliary text, ``P: <FEN> B: <move> M: <moves> E: <evaluations>`` (single spaces, no padding). An
  answer without M:/E: (``moves == ()``) is a whole answer, not a malformed one: the graders grade its
  move and give the M:/E: components nothing (`data.rookworld_grading`). GRPO and the LM player stop
  generating once the move is complete (`move_complete`, `MoveStop`), so what is scored is the move.

`parse_policy_completion` reads both: the first marker (B: or M:) says which.

**Policy prompts** (`POLICY_PROMPTS`; `policy_prompt`'s ``style``, a model's `models.lm.ChessLM.policy_prompt`):

- ``fen`` (the default): ``P: <FEN>``;
- ``legal_moves`` (issue 66's second lever): the position's legal moves after it, sorted, between ``+``
  separators as in A: prompts, ``P: <FEN>+<move> <move> ...+``, so that a legal answer is a copy and the
  model can read the board from its moves. The prompt's FEN is everything before the first ``+``
  (`policy_prompt_fen`); the list is derived from the FEN alone.

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

**Upstream defect**: in the RookWorld data, for Black to move B: is often the worst of the
listed moves; `upstream_best_defect` flags a line whose B is not the best of its own listed
evaluations.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

import chess

from chessgrpo.board.validation import parse_board, parse_move
from chessgrpo.errors import InputError

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
_MOVE_FIRST_COMPLETION = re.compile(r"^\s*B:(?P<best>.*?)(?:M:(?P<moves>.*?)E:(?P<evals>.*))?$", re.DOTALL)

ROOKWORLD_LAYOUT = "rookworld"
MOVE_FIRST_LAYOUT = "move_first"
POLICY_LAYOUTS = (ROOKWORLD_LAYOUT, MOVE_FIRST_LAYOUT)
"""The P: answer layouts (module docstring): RookWorld's M: E: B:, and the decision first, B: [M: E:]."""
FEN_PROMPT = "fen"
LEGAL_MOVES_PROMPT = "legal_moves"
POLICY_PROMPTS = (FEN_PROMPT, LEGAL_MOVES_PROMPT)
"""The P: prompt styles (module docstring): the FEN alone, or the FEN and its legal moves."""
_ENVIRONMENT_PROMPT = re.compile(
    r"^\s*A:\s*(?P<fen>[^+]*?)\s*\+\s*(?P<move>[^+]*?)\s*\+(?P<history>[^+]*)\+$", re.DOTALL
)


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
    layout: str = ROOKWORLD_LAYOUT
    """How the answer is (or was) written (`POLICY_LAYOUTS`); ``move_first`` allows no M:/E: (``moves == ()``)."""

    @property
    def listed(self) -> bool:
        """Whether the answer lists M:/E: (always in the rookworld layout; optional after a move-first B:)."""
        return bool(self.moves)


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


def policy_prompt(fen: str, style: str = FEN_PROMPT) -> str:
    """The P: prompt of `fen` in `style` (`POLICY_PROMPTS`): ``"P: " + FEN`` (the FEN is validated and written as
    given, whitespace-normalised), with ``legal_moves`` followed by ``+<its legal moves, sorted>+``."""
    board = parse_board(fen)
    prompt = "P: " + " ".join(fen.split())
    if check_policy_prompt(style) == LEGAL_MOVES_PROMPT:
        prompt += "+" + " ".join(sorted(move.uci() for move in board.legal_moves)) + "+"
    return prompt


def policy_prompt_fen(prompt: str) -> str:
    """The FEN of a P: prompt in any style (`POLICY_PROMPTS`): the text after ``P:`` up to the first ``+``,
    whitespace-normalised (not validated: the graders' truths reject a bad one by name)."""
    text = prompt.strip()
    if not text.startswith("P:"):
        raise InputError(f"not a P: prompt: {text[:40]!r}")
    return " ".join(text[2:].split("+", 1)[0].split())


def check_policy_prompt(style: str, key: str = "policy_prompt") -> str:
    """`style` when it is one of `POLICY_PROMPTS`, else `InputError` naming the config `key`."""
    if style not in POLICY_PROMPTS:
        raise InputError(f"config key {key} must be one of {', '.join(POLICY_PROMPTS)}, got {style!r}")
    return style


def check_policy_layout(layout: str, key: str = "layout") -> str:
    """`layout` when it is one of `POLICY_LAYOUTS`, else `InputError` naming the config `key`."""
    if layout not in POLICY_LAYOUTS:
        raise InputError(f"config key {key} must be one of {', '.join(POLICY_LAYOUTS)}, got {layout!r}")
    return layout


def format_policy_line(fen: str, answer: PolicyAnswer, prompt: str = FEN_PROMPT) -> str:
    """The whole P: line (prompt + completion) in ``answer.layout``: rookworld = fields padded to 92/33/43
    characters; move_first = ``P: <FEN> B: <move>`` and, when the answer lists moves, `` M: ... E: ...``.
    `prompt` is the prompt's style (`POLICY_PROMPTS`); ``legal_moves`` needs the move-first layout."""
    move_first = check_policy_layout(answer.layout) == MOVE_FIRST_LAYOUT
    low = 0 if move_first else 1
    if not low <= len(answer.moves) <= MAX_LISTED_MOVES or len(answer.evals) != len(answer.moves):
        raise ValueError(f"a P: answer needs {low}-{MAX_LISTED_MOVES} moves and one evaluation each, got {answer}")
    for move in (*answer.moves, answer.best):
        if not _UCI.match(move):
            raise ValueError(f"{move!r} is not a UCI move")
    moves = "M: " + " ".join(answer.moves)
    evals = "E: " + " ".join(format_pawns(v) for v in answer.evals)
    if check_policy_prompt(prompt) != FEN_PROMPT and not move_first:
        raise ValueError(f"a {prompt} prompt needs the {MOVE_FIRST_LAYOUT} layout, got {answer.layout!r}")
    if move_first:
        return policy_prompt(fen, prompt) + " B: " + answer.best + (f" {moves} {evals}" if answer.moves else "")
    head = policy_prompt(fen).ljust(P_FIELD_WIDTH)
    return head + moves.ljust(M_FIELD_WIDTH) + evals.ljust(E_FIELD_WIDTH) + "B: " + answer.best


def format_policy_completion(fen: str, answer: PolicyAnswer, prompt: str = FEN_PROMPT) -> str:
    """The completion of `policy_prompt(fen, prompt)`: the rest of the line, padding included."""
    return format_policy_line(fen, answer, prompt)[len(policy_prompt(fen, prompt)) :]


def policy_layout_of(completion: str) -> str | None:
    """The layout a P: completion is written in, from its first marker (B: = move_first, M: = rookworld);
    None when it starts with neither."""
    head = completion.lstrip()[:2]
    return MOVE_FIRST_LAYOUT if head == "B:" else ROOKWORLD_LAYOUT if head == "M:" else None


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
    """The M/E/B content of a P: completion in either layout, or `Malformed` with the reason.

    The first marker decides the layout (`policy_layout_of`): ``B:`` = move_first (the move, then
    optionally both M: and E:), anything else = rookworld (M:, E:, B:; its reasons are unchanged)."""
    if not isinstance(text, str):
        return Malformed(f"completion is {type(text).__name__}, not text")
    if policy_layout_of(text) == MOVE_FIRST_LAYOUT:
        return _parse_move_first(text)
    match = _POLICY_COMPLETION.match(text)
    if match is None:
        missing = [marker for marker in ("M:", "E:", "B:") if marker not in text]
        return Malformed(f"missing {', '.join(missing)}" if missing else "fields out of order (expected M: E: B:)")
    return _policy_answer(match.group("moves"), match.group("evals"), match.group("best"), ROOKWORLD_LAYOUT)


def _parse_move_first(text: str) -> PolicyAnswer | Malformed:
    """A completion whose first marker is B: (`parse_policy_completion`)."""
    match = _MOVE_FIRST_COMPLETION.match(text)
    if match is None or (match.group("moves") is None and ("M:" in text or "E:" in text)):
        return Malformed("move-first answer: after B: <move> come both M: and E: (in that order) or neither")
    if match.group("moves") is None:
        best = match.group("best").split()
        if len(best) != 1 or not _is_uci(best[0]):
            return Malformed(f"B: {' '.join(best)[:20]!r} is not one UCI move")
        return PolicyAnswer(moves=(), evals=(), best=best[0], layout=MOVE_FIRST_LAYOUT)
    return _policy_answer(match.group("moves"), match.group("evals"), match.group("best"), MOVE_FIRST_LAYOUT)


def _policy_answer(moves_text: str, evals_text: str, best_text: str, layout: str) -> PolicyAnswer | Malformed:
    """The answer of the M:, E: and B: fields' texts, checked (module docstring: Parsers)."""
    moves = moves_text.split()
    evals = evals_text.split()
    best = best_text.split()
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
    return PolicyAnswer(moves=tuple(moves), evals=tuple(values), best=best[0], layout=layout)


def move_complete(text: str, last_piece: str = "") -> bool:
    """Whether a completion being generated holds a whole move-first ``B: <move>`` (the first marker B:, then
    a word that has ended): the word is followed by whitespace, or is 5 characters long (a promotion, the
    longest UCI move), or `last_piece` (the text of the token just generated) is the whole 4-character move
    -- a word-level tokenizer writes each move as one token (`models.chess_tokenizer`), so its move ends there;
    a character tokenizer's ends at the next space or newline (kept in the completion) or at EOS.

    A completion in the rookworld layout (first marker M:) is never complete here: its B: is the last field."""
    stripped = text.lstrip()
    if not stripped.startswith("B:"):
        return False
    rest = stripped[2:].lstrip()
    word = rest.split(maxsplit=1)[0] if rest else ""
    if not word:
        return False
    if len(rest) > len(word) or len(word) >= 5:
        return True
    return len(word) == 4 and last_piece.strip() == word


class MoveStop:
    """A generation stop rule (`models.lm_generation.generate`'s ``stop``): ends each row once `move_complete`
    holds for its text so far, so a move-first answer is just ``B: <move>``; rows in the rookworld layout run on.

    One instance per batch of rows: it keeps each row's decoded text (tokens decoded one at a time, cached by id).
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.texts: list[str] = []
        self._settled: list[bool] = []  # the row's first marker is known not to be B:, or the move ended
        self._pieces: dict[int, str] = {}

    def __call__(self, tokens: Sequence[int], live: Sequence[bool]) -> list[bool]:
        """Rows that end after this step's `tokens` (`live`: the row was still generating)."""
        if not self.texts:
            self.texts, self._settled = [""] * len(tokens), [False] * len(tokens)
        out = []
        for row, (token, alive) in enumerate(zip(tokens, live)):
            if not alive or self._settled[row]:
                out.append(False)
                continue
            piece = self._pieces.get(token)
            if piece is None:
                piece = self._pieces[token] = self.decode([int(token)])
            self.texts[row] += piece
            head = self.texts[row].lstrip()[:2]
            done = move_complete(self.texts[row], piece)
            self._settled[row] = done or (len(head) == 2 and head != "B:") or (len(head) == 1 and head != "B")
            out.append(done)
        return out


def split_policy_line(line: str) -> tuple[str, str]:
    """(prompt, completion) of a whole P: line in either layout and prompt style (the completion starts at
    its first M: or B:; the prompt is ``"P: " + FEN``, with its ``+<legal moves>+`` when it lists them);
    `ValueError` if it has no valid FEN."""
    text = line.rstrip("\n")
    if not text.startswith("P:"):
        raise InputError(f"not a P: line: {text[:40]!r}")
    cuts = [cut for cut in (text.find("M:"), text.find("B:")) if cut >= 0]  # a FEN or move list holds no ':'
    if not cuts:
        raise InputError(f"P: line without M: {text[:60]!r}")
    cut = min(cuts)
    fen = policy_prompt_fen(text[:cut])
    try:
        parse_board(fen)
    except ValueError as error:
        raise InputError(f"P: line: {error}") from None
    if "+" in text[:cut]:  # a legal_moves prompt: written as the data wrote it, up to the completion
        head = text[:cut].rstrip()
        return head, text[len(head) :]
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
        raise InputError(f"P: line {line[:60]!r}: {answer.reason}")
    return policy_prompt_fen(prompt), answer


def parse_environment_prompt(text: str) -> EnvironmentQuery:
    """The query of an A: prompt; `ValueError` naming the problem (prompts are inputs, not outputs)."""
    match = _ENVIRONMENT_PROMPT.match(text.rstrip("\n"))
    if match is None:
        raise InputError(f"not an A: prompt (A: FEN+move+history+): {text[:80]!r}")
    fen = " ".join(match.group("fen").split())
    board = parse_board(fen)
    move = match.group("move").strip()
    if not _UCI.match(move):
        raise InputError(f"A: prompt move {move!r} is not a UCI move")
    history = tuple(match.group("history").split())
    if not history or len(history) > HISTORY_MOVES or history[-1] != move or any(not _UCI.match(m) for m in history):
        raise InputError(
            f"A: prompt history {' '.join(history)!r} must be 1-{HISTORY_MOVES} UCI moves ending with {move!r}"
        )
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
            raise InputError(f"A: line with fewer than three '+': {text[:60]!r}")
    return text[: cut + 1], text[cut + 1 :]


def parse_environment_line(line: str) -> tuple[EnvironmentQuery, EnvironmentAnswer]:
    prompt, completion = split_environment_line(line)
    query = parse_environment_prompt(prompt)
    answer = parse_environment_completion(completion)
    if isinstance(answer, Malformed):
        raise InputError(f"A: line {line[:60]!r}: {answer.reason}")
    return query, answer


def task_of(prompt: str) -> str:
    """ "policy" or "environment" from a prompt's marker; `ValueError` otherwise."""
    head = prompt.lstrip()[:2]
    if head == "P:":
        return "policy"
    if head == "A:":
        return "environment"
    raise InputError(f"prompt {prompt[:40]!r} starts with neither 'P:' nor 'A:'")


# ------------------------------------------------------------------------------------------------
# The A: task's truth, and the upstream defect of P: lines


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
    the worst listed move. A B outside M is flagged too; a move-first answer without M:/E: never is.
    """
    if not answer.listed:
        return False
    if answer.best not in answer.moves:
        return True
    return answer.evals[answer.moves.index(answer.best)] < max(answer.evals)
