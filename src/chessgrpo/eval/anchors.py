"""Opponents for rating games ("anchors"), their names, ratings, and the players that move in games.

Anchors on the command line (`parse_anchor`):

- ``random``: a uniformly random legal mover. Its rating is a **convention** (`random_rating`,
  default 0): no rating list measures it, it only fixes where the scale starts.
- ``sf-skill:N``: Stockfish with ``Skill Level`` N (0..20) at a fixed node (or depth) limit.
- ``sf-elo:N``: Stockfish with ``UCI_LimitStrength`` and ``UCI_Elo`` N at the same limit. The
  allowed range is read from the engine at runtime (Stockfish 15.1: 1350..2850; 16: 1320..3190).
- ``sf-nodes:N``: full-strength Stockfish searching N nodes per move (deterministic with one
  thread; no published rating).
- a checkpoint path: another policy (a checkpoint or run directory, `resolve_checkpoint`).

Where anchor ratings come from (`anchor_rating`), and what they mean:

- Stockfish's ``UCI_Elo`` is calibrated against **CCRL** ratings, not human (FIDE, Lichess)
  ratings: Stockfish 15.1's source says it is "anchored to CCRL Elo (goldfish 1.13 = 2000)" with
  "a fit through Ordo derived Elo for match (TC 60+0.6) results". ``sf-elo:N`` is rated N.
- ``sf-skill:N`` is rated by inverting Stockfish 15/15.1's own map from UCI_Elo to skill level,
  level = ((Elo - 1346.6) / 143.4) ^ (1 / 0.806), i.e. Elo = 1346.6 + 143.4 * N^0.806 (level 0:
  1347, 5: 1871, 10: 2264). Level 20 is full strength and has no rating. Other Stockfish
  versions use other maps; their skill anchors are unrated unless `anchor_ratings` gives one.
- Skill play is calibrated at 60s+0.6s, but Stockfish picks its weakened move from the MultiPV=4
  lines of iteration depth 1 + level, so the node/depth limit only has to reach that depth
  (level 0 picks at depth 1; 1000 nodes reach depth ~5-7 in the middlegame).
- Stockfish's weakened move choice is randomised (its PRNG is seeded from the clock), so games
  against ``sf-skill``/``sf-elo`` are **not** reproducible; ``random`` (seeded), ``sf-nodes`` and
  argmax checkpoints are. Engine anchors therefore run in a dedicated UCI process per game
  worker, never through the cached `EnginePool`.

Players (`Mover`) choose one move given a `chess.Board` that carries the game's move stack, so
repetitions are visible: `RandomMover`, `EngineMover` (python-chess's UCI client), and
`PolicyMover` (an `ActionPolicy`: argmax or sampled; when it is winning on material it avoids
moves that allow a threefold repetition, see `PolicyMover`; or, with `SearchSettings`, the move
of a search with its value head, which scores repeated positions as draws).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import chess
import chess.engine

from chessgrpo.engine.locate import EngineError, find_stockfish
from chessgrpo.engine.pool import RetryPolicy
from chessgrpo.eval.players import build_searcher

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from chessgrpo.search import SearchResult, SearchSettings

logger = logging.getLogger(__name__)

CALIBRATION_NOTE = (
    "Stockfish's UCI_Elo and Skill Level ratings are CCRL-anchored engine ratings (CCRL 40/4, Goldfish 1.13 = 2000, "
    "fitted at 60s+0.6s), not human FIDE or Lichess ratings; 'random' is rated by convention."
)

SKILL_LEVELS = range(0, 21)
DEFAULT_ANCHOR_NODES = 1000
ENGINE_HASH_MB = 16
PIECE_VALUES = {chess.PAWN: 1, chess.KNIGHT: 3, chess.BISHOP: 3, chess.ROOK: 5, chess.QUEEN: 9, chess.KING: 0}

_ENGINE_ANCHOR = re.compile(r"^(sf-skill|sf-elo|sf-nodes):(-?\d+)$")


# --------------------------------------------------------------------------------------------
# Anchor specifications


@dataclasses.dataclass(frozen=True)
class AnchorSpec:
    """A parsed anchor: what it is and its search limit. Picklable (sent to game workers)."""

    text: str
    """The anchor as named on the command line: "random", "sf-skill:0", or the checkpoint path."""
    kind: str
    """"random", "sf-skill", "sf-elo", "sf-nodes" or "checkpoint"."""
    value: int | None = None
    """Skill level, UCI_Elo or node count for engine anchors."""
    nodes: int | None = None
    """Node limit per move of sf-skill / sf-elo anchors (sf-nodes: `value`)."""
    depth: int | None = None
    """Depth limit per move of sf-skill / sf-elo anchors (instead of nodes)."""
    path: str | None = None
    """The resolved checkpoint directory of a checkpoint anchor."""

    @property
    def is_engine(self) -> bool:
        return self.kind.startswith("sf-")

    def engine_options(self) -> dict[str, Any]:
        """UCI options set on the anchor's engine (Threads 1 and a fixed Hash for every engine)."""
        options: dict[str, Any] = {"Threads": 1, "Hash": ENGINE_HASH_MB}
        if self.kind == "sf-skill":
            options["Skill Level"] = self.value
        elif self.kind == "sf-elo":
            options["UCI_LimitStrength"] = True
            options["UCI_Elo"] = self.value
        return options

    def limit(self) -> chess.engine.Limit:
        if self.kind == "sf-nodes":
            return chess.engine.Limit(nodes=self.value)
        return chess.engine.Limit(nodes=self.nodes) if self.depth is None else chess.engine.Limit(depth=self.depth)

    def describe(self, engine_name: str = "Stockfish") -> str:
        """A reproducible description: engine id name, options, limit (or the policy's path)."""
        if self.kind == "random":
            return "uniform random legal mover"
        if self.kind == "checkpoint":
            return f"policy {self.path}"
        options = "; ".join(f"{name}={_uci_value(value)}" for name, value in self.engine_options().items())
        limit = self.limit()
        bound = f"nodes={limit.nodes}" if limit.nodes is not None else f"depth={limit.depth}"
        return f"{engine_name}; {options}; {bound}"


def _uci_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def parse_anchor(text: str, *, nodes: int | None = DEFAULT_ANCHOR_NODES, depth: int | None = None) -> AnchorSpec:
    """Parse one anchor name (see the module docstring); `ValueError` says what is accepted.

    `nodes` / `depth` are the search limit of sf-skill and sf-elo anchors (depth wins when set).
    """
    text = text.strip()
    if depth is not None and (depth < 1 or isinstance(depth, bool)):
        raise ValueError(f"anchor depth must be >= 1, got {depth!r}")
    if depth is None and (nodes is None or nodes < 1):
        raise ValueError(f"anchor nodes must be >= 1, got {nodes!r}")
    if text == "random":
        return AnchorSpec(text=text, kind="random")
    match = _ENGINE_ANCHOR.match(text)
    if match:
        kind, value = match.group(1), int(match.group(2))
        if kind == "sf-skill" and value not in SKILL_LEVELS:
            raise ValueError(f"anchor {text!r}: Skill Level must be 0..20, got {value}")
        if kind == "sf-nodes" and value < 1:
            raise ValueError(f"anchor {text!r}: the node count must be >= 1")
        if kind == "sf-nodes":
            return AnchorSpec(text=text, kind=kind, value=value)
        # UCI_Elo's range depends on the engine; `check_anchor` checks it against the running one.
        return AnchorSpec(text=text, kind=kind, value=value, nodes=None if depth is not None else nodes, depth=depth)
    if text.startswith("sf-") or ":" in text and not Path(text).exists():
        raise ValueError(
            f"unknown anchor {text!r}: use random, sf-skill:N (0..20), sf-elo:N, sf-nodes:N, or a checkpoint directory"
        )
    from chessgrpo.models.policy import resolve_checkpoint  # lazy: torch only for checkpoint anchors

    try:
        directory = resolve_checkpoint(text)
    except FileNotFoundError as error:
        raise ValueError(
            f"unknown anchor {text!r}: not random, sf-skill:N, sf-elo:N or sf-nodes:N, and not a checkpoint ({error})"
        ) from None
    return AnchorSpec(text=text, kind="checkpoint", path=str(directory))


def parse_anchors(texts: str | list[str], **limits: Any) -> list[AnchorSpec]:
    """Anchors from a comma-separated string or a list; duplicates are an error."""
    items = [t for t in (texts.split(",") if isinstance(texts, str) else texts) if t.strip()]
    if not items:
        raise ValueError("no anchors given: e.g. --anchors random,sf-skill:0")
    specs = [parse_anchor(item, **limits) for item in items]
    names = [spec.text for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"anchor {duplicates[0]!r} is listed twice")
    return specs


# --------------------------------------------------------------------------------------------
# The engine and its limits


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What a Stockfish binary says about itself (read once, before any game)."""

    path: str
    name: str
    """``id name``, e.g. "Stockfish 15.1"."""
    elo_min: int | None
    elo_max: int | None
    """The ``UCI_Elo`` option's range (None when the engine has no such option)."""


def probe_engine(path: str | None = None, timeout_s: float = 30.0) -> EngineInfo:
    """Start the engine once to read its name and ``option name UCI_Elo ... min X max Y``."""
    binary = find_stockfish(path)
    try:
        engine = chess.engine.SimpleEngine.popen_uci(str(binary), timeout=timeout_s)
    except (chess.engine.EngineError, OSError, TimeoutError) as error:
        raise EngineError(f"cannot start {binary}: {error}") from error
    try:
        option = engine.options.get("UCI_Elo")
        return EngineInfo(
            path=str(binary),
            name=engine.id.get("name", "unknown engine"),
            elo_min=option.min if option is not None else None,
            elo_max=option.max if option is not None else None,
        )
    finally:
        engine.quit()


def check_anchor(spec: AnchorSpec, info: EngineInfo) -> None:
    """`ValueError` when the engine cannot play the anchor (UCI_Elo outside its range)."""
    if spec.kind != "sf-elo":
        return
    if info.elo_min is None or info.elo_max is None:
        raise ValueError(f"anchor {spec.text!r}: {info.name} has no UCI_Elo option; use sf-skill:N instead")
    if not info.elo_min <= spec.value <= info.elo_max:  # type: ignore[operator]
        raise ValueError(
            f"anchor {spec.text!r}: {info.name} accepts UCI_Elo {info.elo_min}..{info.elo_max} only "
            f"(for weaker play use sf-skill:0..20)"
        )


# --------------------------------------------------------------------------------------------
# Ratings


@dataclasses.dataclass(frozen=True)
class AnchorRating:
    value: float | None
    """None: unrated (the anchor still gets its own score and Elo difference)."""
    source: str


def skill_level_elo(level: float) -> float:
    """Stockfish 15/15.1's nominal UCI_Elo of a skill level: 1346.6 + 143.4 * level^0.806."""
    if not 0 <= level < 20:
        raise ValueError(f"skill level {level} has no nominal Elo (0 <= level < 20)")
    return 1346.6 + 143.4 * level**0.806


def anchor_rating(
    spec: AnchorSpec, engine_name: str = "", *, random_rating: float = 0.0, overrides: dict[str, float] | None = None
) -> AnchorRating:
    """The fixed rating of an anchor and where it comes from (see the module docstring)."""
    if overrides and spec.text in overrides:
        return AnchorRating(overrides[spec.text], "given in anchor_ratings")
    if spec.kind == "random":
        return AnchorRating(random_rating, "convention (random_rating), not a measured rating")
    if spec.kind == "sf-elo":
        return AnchorRating(float(spec.value), "UCI_Elo, Stockfish's CCRL-anchored calibration")  # type: ignore[arg-type]
    if spec.kind == "sf-skill":
        if spec.value == 20:
            return AnchorRating(None, "full strength: no nominal rating (give one in anchor_ratings)")
        if re.search(r"Stockfish 15(\.1)?\b", engine_name):
            return AnchorRating(
                round(skill_level_elo(spec.value), 1),  # type: ignore[arg-type]
                "nominal: Stockfish 15.1's UCI_Elo for this level, 1346.6 + 143.4 * level^0.806 (CCRL-anchored)",
            )
        return AnchorRating(None, f"no known skill calibration for {engine_name or 'this engine'} (give one in anchor_ratings)")
    return AnchorRating(None, "no published rating; give one in anchor_ratings")


def parse_ratings(entries: list[str]) -> dict[str, float]:
    """``["sf-nodes:50=1800", ...]`` -> {"sf-nodes:50": 1800.0}; `ValueError` names a bad entry."""
    ratings = {}
    for entry in entries:
        name, sep, value = entry.rpartition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            ratings[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"anchor_ratings entry {entry!r}: expected ANCHOR=RATING, e.g. sf-nodes:50=1800") from None
    return ratings


# --------------------------------------------------------------------------------------------
# Players in a game


class Mover(Protocol):
    """Chooses moves in games; the board carries the game's move stack (for repetitions)."""

    def new_game(self, game_id: object, seed: int) -> None:
        """Called before each game: reset per-game state and seed any randomness."""
        ...

    def move(self, board: chess.Board) -> chess.Move:
        """One legal move in `board` (which has at least one)."""
        ...

    def close(self) -> None: ...


class RandomMover:
    """A uniformly random legal move, reproducible per game seed."""

    def __init__(self) -> None:
        self._rng = random.Random(0)

    def new_game(self, game_id: object, seed: int) -> None:
        self._rng = random.Random(seed)

    def move(self, board: chess.Board) -> chess.Move:
        return self._rng.choice(list(board.legal_moves))

    def close(self) -> None:
        pass


class EngineMover:
    """A Stockfish anchor in its own UCI process (python-chess), configured per `AnchorSpec`.

    ``ucinewgame`` is sent at each new game. A crashed, hung or failed-to-start engine is
    replaced after a backoff with jitter and the move asked again, within the same budgets as the
    reward pool (`RetryPolicy`); past them `EngineError` names the anchor, the position and the
    count (never a silent fallback move).
    """

    def __init__(self, spec: AnchorSpec, path: str | None = None, timeout_s: float = 60.0, retry: RetryPolicy | None = None):
        if not spec.is_engine:
            raise ValueError(f"{spec.text!r} is not an engine anchor")
        self.spec = spec
        self.path = str(find_stockfish(path))
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._jitter = random.Random()  # retry delays only
        self._engine: chess.engine.SimpleEngine | None = None
        self._game: object = None

    def _start(self) -> chess.engine.SimpleEngine:
        last_error: BaseException | None = None
        for attempt in range(self.retry.startup_attempts):
            if attempt:
                time.sleep(self.retry.delay(attempt - 1, self._jitter))
            try:
                engine = chess.engine.SimpleEngine.popen_uci(self.path, timeout=self.timeout_s)
            except (chess.engine.EngineError, OSError, TimeoutError) as error:
                last_error = error
                continue
            try:
                engine.configure(self.spec.engine_options())
                return engine
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError) as error:
                last_error = error
                try:
                    engine.close()
                except Exception:  # noqa: BLE001 - already broken; only released here
                    pass
        raise EngineError(
            f"cannot start {self.path} for anchor {self.spec.text!r} in {self.retry.startup_attempts} attempts: {last_error}"
        )

    def new_game(self, game_id: object, seed: int) -> None:
        self._game = game_id

    def move(self, board: chess.Board) -> chess.Move:
        failures = 0
        while True:
            if self._engine is None:
                self._engine = self._start()
            try:
                result = self._engine.play(board, self.spec.limit(), game=self._game)
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError) as error:
                failures += 1
                logger.warning("anchor %s failed in %s (%s); replacing it", self.spec.text, board.fen(), error)
                self._kill()
                if failures > self.retry.retries_per_position:
                    raise EngineError(
                        f"anchor {self.spec.text!r} ({self.path}) failed {failures} times in {board.fen()!r}: {error}"
                    ) from error
                time.sleep(self.retry.delay(failures - 1, self._jitter))
                continue
            if result.move is None or not board.is_legal(result.move):
                raise EngineError(f"anchor {self.spec.text!r} returned no legal move ({result.move}) in {board.fen()!r}")
            return result.move

    def _kill(self) -> None:
        if self._engine is not None:
            try:
                self._engine.close()
            except Exception:  # noqa: BLE001 - the process is already broken; we only release it
                pass
            self._engine = None

    def close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.quit()
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError):
                pass
            self._kill()


def position_key(board: chess.Board) -> tuple:
    """What makes two positions the same for repetition: pieces, side to move, castling rights and
    a legal en-passant capture (as python-chess's own repetition check)."""
    return (
        board.pawns,
        board.knights,
        board.bishops,
        board.rooks,
        board.queens,
        board.kings,
        board.occupied_co[chess.WHITE],
        board.occupied_co[chess.BLACK],
        board.turn,
        board.clean_castling_rights(),
        board.ep_square if board.has_legal_en_passant() else None,
    )


def position_counts(board: chess.Board) -> dict[tuple, int]:
    """How often each position since the last capture or pawn move has stood on the board."""
    counts: dict[tuple, int] = {}
    history = board.copy()
    counts[position_key(history)] = 1
    while history.move_stack:
        move = history.pop()
        key = position_key(history)
        counts[key] = counts.get(key, 0) + 1
        if history.is_zeroing(move):  # nothing before an irreversible move can recur
            break
    return counts


def material_balance(board: chess.Board) -> int:
    """Material of the side to move minus the opponent's, in pawns (P1 N3 B3 R5 Q9)."""
    balance = 0
    for piece_type, value in PIECE_VALUES.items():
        balance += value * (len(board.pieces(piece_type, board.turn)) - len(board.pieces(piece_type, not board.turn)))
    return balance


class PolicyMover:
    """An `ActionPolicy` as a game player.

    Argmax over legal moves at temperature 0, else a sample from `log_probs` at that
    temperature (seeded per game). Repetition: our policy has no value head, so "winning" is
    approximated by material: the side to move is ahead by at least `winning_material` pawns
    (3 = a minor piece). When winning, the choice excludes moves that allow a threefold
    repetition claim (`repetition_moves`): moves after which the position stands for the third
    time, and moves after which the opponent has a reply that makes some position stand for the
    third time. The highest-probability remaining move is played (or sampled among the rest).
    If every move allows a claim, only the direct repeats are excluded; if every move repeats,
    none is. searchless_chess does the same with its value estimate.

    With an enabled `search` (`chessgrpo.search.SearchSettings`) the move is the search's
    instead, searched from the board with its full move stack: the search scores a repeated
    position as a draw, so the material rule above is not applied on that path. A search is
    deterministic, so `temperature` must be 0 (`ValueError` otherwise), and it needs a policy with
    a value head (`ValueError` from `search.NetworkEvaluator` otherwise).
    """

    def __init__(
        self,
        policy: Any,
        *,
        temperature: float = 0.0,
        avoid_repetition: bool = True,
        winning_material: int = 3,
        search: "SearchSettings | None" = None,
    ):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        self.policy = policy.eval()
        self.temperature = float(temperature)
        self.avoid_repetition = avoid_repetition
        self.winning_material = winning_material
        self.searcher = build_searcher(self.policy, search, self.temperature)
        self._generator: "torch.Generator | None" = None
        self.last_probability: float | None = None
        """Probability (at temperature 1, legal moves) of the last chosen move, for `info` lines;
        None for a searched move (the search's numbers are in `last_search`)."""
        self.last_search: "SearchResult | None" = None
        """The last search's result (value, nodes, principal variation); None without search."""

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "cpu", **kwargs: Any) -> "PolicyMover":
        """Load a checkpoint or run directory; a `ValueError` of the player names the checkpoint."""
        from chessgrpo.models.policy import load_policy

        policy = load_policy(path, device=device)
        try:
            return cls(policy, **kwargs)
        except ValueError as error:
            raise ValueError(f"checkpoint {path}: {error}") from None

    def new_game(self, game_id: object, seed: int) -> None:
        import torch

        self._generator = torch.Generator().manual_seed(seed) if self.temperature > 0 else None

    @staticmethod
    def repetition_moves(board: chess.Board) -> tuple[list[chess.Move], list[chess.Move]]:
        """(moves that make a position stand for the third time, moves that let the opponent do so).

        Only positions since the last capture or pawn move can recur, and only those already seen
        twice can become a threefold, so the two-ply look-ahead runs only when one exists.
        """
        counts = position_counts(board)
        twice = {key for key, count in counts.items() if count >= 2}
        if not twice:
            return [], []
        repeats, allows = [], []
        for move in list(board.legal_moves):
            board.push(move)
            try:
                if position_key(board) in twice:
                    repeats.append(move)
                    continue
                for reply in list(board.legal_moves):
                    board.push(reply)
                    hit = position_key(board) in twice
                    board.pop()
                    if hit:
                        allows.append(move)
                        break
            finally:
                board.pop()
        return repeats, allows

    def move(self, board: chess.Board) -> chess.Move:
        if self.searcher is not None:
            return self._searched_move(board)
        import torch

        from chessgrpo.board import ACTIONS, move_to_action
        from chessgrpo.models.policy import log_probs, sample_actions

        with torch.no_grad():
            tokens, masks = self.policy.inputs([board])
            logits = self.policy(tokens).float()
            full_mask = masks.clone()
            if self.avoid_repetition and material_balance(board) >= self.winning_material:
                repeats, allows = self.repetition_moves(board)
                legal = int(masks[0].sum().item())
                for excluded in (repeats + allows, repeats):
                    if excluded and len(excluded) < legal:
                        for move in excluded:
                            masks[0, move_to_action(move)] = False
                        break
            if self.temperature == 0.0:
                action = int(logits.masked_fill(~masks, float("-inf")).argmax(dim=-1).item())
            else:
                action = int(sample_actions(logits, masks, temperature=self.temperature, generator=self._generator).item())
            self.last_probability = float(log_probs(logits, full_mask)[0, action].exp().item())
        move = chess.Move.from_uci(ACTIONS[action])
        if not board.is_legal(move):
            raise RuntimeError(f"policy chose illegal move {move.uci()} in {board.fen()!r}")
        return move

    def _searched_move(self, board: chess.Board) -> chess.Move:
        """The search's move in `board` (searched with the game's move stack, so repetitions count)."""
        result = self.searcher.search(board)  # type: ignore[union-attr]
        self.last_search = result
        self.last_probability = None  # the move is the search's, not a draw from the policy
        if not board.is_legal(result.move):
            raise RuntimeError(f"search chose illegal move {result.move.uci()} in {board.fen()!r}")
        return result.move

    def close(self) -> None:
        """Release the search's tablebase (a no-op without search)."""
        if self.searcher is not None:
            self.searcher.close()


def make_mover(
    spec: AnchorSpec, *, engine_path: str | None = None, device: str = "cpu", temperature: float = 0.0, **policy_options: Any
) -> Mover:
    """The game player of an anchor (checkpoint anchors play like the evaluated policy)."""
    if spec.kind == "random":
        return RandomMover()
    if spec.is_engine:
        return EngineMover(spec, engine_path)
    return PolicyMover.from_checkpoint(spec.path or spec.text, device=device, temperature=temperature, **policy_options)
