"""The players that make the moves of rating games: the evaluated policy and its anchors
(`chessgrpo.play.anchors`).

Players (`Mover`) choose one move given a `chess.Board` that carries the game's move stack, so
repetitions are visible: `RandomMover`, `EngineMover` (any UCI engine, python-chess's client), and
`PolicyMover` (an `ActionPolicy`: argmax or sampled; when it is winning on material it avoids
moves that allow a threefold repetition, see `PolicyMover`; or, with `SearchSettings`, the move
of a search with its value head, which scores repeated positions as draws).

Under a clock (`play.game_clock`), `play_game` calls ``move(board, clock=ClockView)`` on the
players that take one (``plays_on_clock``): `EngineMover` sends the clocks with ``go wtime btime
winc binc movestogo`` (plus a limit given for the engine itself, `AnchorSpec.asked`), and
`PolicyMover` with a search budgets its time as ``chessgrpo uci`` does (`play.search_control.clock_seconds`,
its deadline kept by `uci_go.SearchControl`); without a search it plays its argmax at once.
`EngineMover` also keeps the depth and nodes each move reported (`play.anchor_runs`), so the
match can say what the anchor ran.

`make_mover` builds an anchor's player.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import chess
import chess.engine

from chessgrpo.board.move_facts import PIECE_VALUES
from chessgrpo.board.repetitions import position_counts, position_key
from chessgrpo.engine.locate import EngineError, find_stockfish
from chessgrpo.engine.pool_workers import RetryPolicy
from chessgrpo.engine.uci import EngineTimeout, EngineUnsupported, UciOption, choose_settings
from chessgrpo.errors import InputError
from chessgrpo.play.anchor_runs import MoveSearch
from chessgrpo.play.anchors import ENGINE_HASH_MB, AnchorSpec
from chessgrpo.play.game_clock import ClockView
from chessgrpo.play.players import build_searcher

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from chessgrpo.search import SearchResult, SearchSettings

logger = logging.getLogger(__name__)


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

    plays_on_clock = True

    def __init__(self) -> None:
        self._rng = random.Random(0)

    def new_game(self, game_id: object, seed: int) -> None:
        self._rng = random.Random(seed)

    def move(self, board: chess.Board, clock: ClockView | None = None) -> chess.Move:
        return self._rng.choice(list(board.legal_moves))

    def close(self) -> None:
        pass


class EngineMover:
    """An engine anchor in its own UCI process (python-chess's client), configured per `AnchorSpec`:
    Stockfish at ``engine.path`` for ``sf-*`` anchors, the anchor's own engine for UCI anchors.

    Threads 1 and Hash 16 are set where the engine has them (clamped to its range); the anchor's
    own options (Skill Level, UCI_Elo, ``option.NAME``) must be advertised, else
    `EngineUnsupported` at start-up. ``ucinewgame`` is sent at each new game. Every move has a
    deadline (`timeout_s` beyond the limit: python-chess's ``play`` has none for node and depth
    limits). A crashed engine, a hang past the deadline, or an answer that is not a legal move
    (``bestmove (none)`` or ``0000`` with legal moves, garbage, an illegal move) is a fault: the
    process is replaced after a backoff with jitter and the move asked again, within the same
    budgets as the reward pool (`RetryPolicy`); past them `EngineError` names the anchor, the
    engine, the position and the last fault (never a silent fallback move).

    Each move's reported depth and nodes (its last ``info`` values) and wall time are kept in
    `searches` for the current game (`play.anchor_runs`). Under a clock (``move(board, clock=...)``)
    the engine gets both clocks, increments and moves to go, plus its own limit when one was given
    for it (`AnchorSpec.asked`), and the deadline is its remaining time plus `timeout_s`.
    """

    plays_on_clock = True

    def __init__(
        self,
        spec: AnchorSpec,
        path: str | None = None,
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
    ):
        if not spec.is_engine:
            raise ValueError(f"{spec.text!r} is not an engine anchor")
        self.spec = spec
        if spec.engine is not None:
            self.command = list(spec.engine.command)
            self.timeout_s = spec.engine.timeout_s if timeout_s is None else timeout_s
            self.retry = retry or spec.engine.retry
        else:
            self.command = [str(find_stockfish(path))]
            self.timeout_s = 60.0 if timeout_s is None else timeout_s
            self.retry = retry or RetryPolicy()
        self.path = self.command[0]
        self.engine_name = ""
        """The engine's ``id name`` once started."""
        self._jitter = random.Random()  # retry delays only
        self._engine: chess.engine.SimpleEngine | None = None
        self._game: object = None
        self.searches: list[MoveSearch] = []
        """This game's moves: reported depth, nodes and wall time of each (`play.anchor_runs`)."""

    @property
    def label(self) -> str:
        engine = f"{self.engine_name} ({self.path})" if self.engine_name else self.path
        return f"anchor {self.spec.text!r} ({engine})"

    def _start(self) -> chess.engine.SimpleEngine:
        last_error: BaseException | None = None
        handshake_s = min(30.0, self.timeout_s)
        for attempt in range(self.retry.startup_attempts):
            if attempt:
                time.sleep(self.retry.delay(attempt - 1, self._jitter))
            try:
                engine = chess.engine.SimpleEngine.popen_uci(self.command, timeout=handshake_s)
            except (TimeoutError, asyncio.TimeoutError):
                last_error = EngineTimeout(
                    f"no `uciok` within {handshake_s:g} s of `uci` (is it a UCI engine? xboard engines such as "
                    "fairymax are not supported)"
                )
                continue
            except (chess.engine.EngineError, OSError) as error:
                last_error = error
                continue
            self.engine_name = engine.id.get("name", "")
            try:
                advertised = {
                    name.lower(): UciOption(o.name, o.type, None, o.min, o.max, tuple(o.var or ()))
                    for name, o in engine.options.items()
                }
                settings = choose_settings(
                    advertised, self.label, threads=1, hash_mb=ENGINE_HASH_MB, options=self.spec.required_options()
                )
                engine.configure(settings)
                return engine
            except EngineUnsupported:
                engine.close()
                raise  # a missing option stays missing: no retries
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError) as error:
                last_error = error
                try:
                    engine.close()
                except Exception:  # noqa: BLE001 - already broken; only released here
                    pass
        raise EngineError(f"cannot start {self.label} in {self.retry.startup_attempts} attempts: {last_error}")

    def new_game(self, game_id: object, seed: int) -> None:
        self._game = game_id
        self.searches = []

    def warm_up(self) -> None:
        """Start the engine and send ``ucinewgame`` now, before the clocks run (as cutechess-cli does):
        not on the clock of its first move (python-chess would send it there; ~12 ms for Stockfish)."""
        if self._engine is None:
            self._engine = self._start()
        protocol = self._engine.protocol
        new_game = getattr(protocol, "_ucinewgame", None)  # python-chess's own step; absent: it stays on the first move
        if new_game is None or (protocol.game == self._game and not protocol.first_game):
            return

        async def fresh_game() -> None:
            protocol.game = self._game  # `play` sees the same game and sends no second ucinewgame
            new_game()
            await protocol.ping()  # isready / readyok: the engine has finished clearing

        try:
            asyncio.run_coroutine_threadsafe(asyncio.wait_for(fresh_game(), self.timeout_s), protocol.loop).result()
        except (
            RuntimeError,
            TimeoutError,
            asyncio.TimeoutError,
            chess.engine.EngineError,
            chess.engine.EngineTerminatedError,
        ):
            self._kill()  # a broken engine: `move` replaces it, with its retries

    def game_searches(self) -> list[MoveSearch]:
        """This game's moves (`searches`), for `play_game`."""
        return list(self.searches)

    def _limit(self, clock: ClockView | None) -> chess.engine.Limit:
        """The move's limit: the anchor's own, or on a clock the clocks plus any limit given for the engine."""
        if clock is None:
            return self.spec.limit()
        kind, value = self.spec.asked()
        return chess.engine.Limit(
            white_clock=clock.white,
            black_clock=clock.black,
            white_inc=clock.white_increment,
            black_inc=clock.black_increment,
            remaining_moves=clock.moves_to_go or None,
            nodes=value if kind == "nodes" else None,
            depth=value if kind == "depth" else None,
            time=value / 1000 if kind == "movetime" and value else None,
        )

    def _play(
        self, engine: chess.engine.SimpleEngine, board: chess.Board, clock: ClockView | None = None
    ) -> chess.Move:
        """One move from `engine` within the deadline; `EngineError` for any answer that is not
        a legal move of `board`."""
        limit = self._limit(clock)
        timeout = self.timeout_s + (limit.time or 0.0) + (clock.remaining(board.turn) if clock is not None else 0.0)
        protocol = engine.protocol
        started = time.perf_counter()
        try:
            future = asyncio.run_coroutine_threadsafe(
                asyncio.wait_for(protocol.play(board, limit, game=self._game, info=chess.engine.INFO_BASIC), timeout),
                protocol.loop,
            )
        except RuntimeError as error:  # python-chess closes the client's event loop when the process dies
            raise EngineError(f"the engine process has ended ({error})") from None
        try:
            result = future.result()
        except (TimeoutError, asyncio.TimeoutError):
            raise EngineTimeout(
                f"no `bestmove` within {timeout:g} s ({self._limit_text()} plus engine.timeout_s)"
            ) from None
        if not result.move:  # None for `bestmove (none)`, the null move for `0000`
            text = "(none)" if result.move is None else result.move.uci()
            raise EngineError(f"answered `bestmove {text}` in a position with legal moves")
        if not board.is_legal(result.move):  # python-chess already refuses these; kept as the contract
            raise EngineError(f"answered `bestmove {result.move.uci()}`, an illegal move")
        self.searches.append(
            MoveSearch(result.info.get("depth"), result.info.get("nodes"), time.perf_counter() - started)
        )
        return result.move

    def _limit_text(self) -> str:
        if self.spec.engine is not None:
            return self.spec.engine.limit_text()
        limit = self.spec.limit()
        return f"nodes={limit.nodes}" if limit.nodes is not None else f"depth={limit.depth}"

    def move(self, board: chess.Board, clock: ClockView | None = None) -> chess.Move:
        failures = 0
        while True:
            if self._engine is None:
                self._engine = self._start()
            try:
                return self._play(self._engine, board, clock)
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, EngineError) as error:
                failures += 1
                logger.warning("%s failed in %s (%s); replacing it", self.label, board.fen(), error)
                self._kill()
                if failures > self.retry.retries_per_position:
                    raise EngineError(
                        f"{self.label} failed {failures} times in {board.fen()!r} ({self._limit_text()}, "
                        f"retries_per_position={self.retry.retries_per_position}); last error: {error}"
                    ) from None
                time.sleep(self.retry.delay(failures - 1, self._jitter))

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


def material_balance(board: chess.Board) -> int:
    """Material of the side to move minus the opponent's, in pawns (P1 N3 B3 R5 Q9)."""
    balance = 0
    for piece_type in chess.PIECE_TYPES:
        balance += PIECE_VALUES[piece_type] * (
            len(board.pieces(piece_type, board.turn)) - len(board.pieces(piece_type, not board.turn))
        )
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

    Under a clock (``move(board, clock=...)``) a search stops at its node budget or at the time
    ``chessgrpo uci`` would give the move (`uci_go.clock_seconds` of the remaining time, increment
    and moves to go), whichever comes first; the argmax (no search) ignores the clock.
    """

    plays_on_clock = True

    def __init__(
        self,
        policy: Any,
        *,
        temperature: float = 0.0,
        avoid_repetition: bool = True,
        winning_material: int = 3,
        search: SearchSettings | None = None,
    ):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        self.policy = policy.eval()
        self.temperature = float(temperature)
        self.avoid_repetition = avoid_repetition
        self.winning_material = winning_material
        self.searcher = build_searcher(self.policy, search, self.temperature)
        self._generator: torch.Generator | None = None
        self.last_probability: float | None = None
        """Probability (at temperature 1, legal moves) of the last chosen move, for `info` lines;
        None for a searched move (the search's numbers are in `last_search`)."""
        self.last_search: SearchResult | None = None
        """The last search's result (value, nodes, principal variation); None without search."""

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "cpu", **kwargs: Any) -> PolicyMover:
        """Load a checkpoint or run directory; a `ValueError` of the player names the checkpoint."""
        from chessgrpo.models.policy import load_policy

        policy = load_policy(path, device=device)
        try:
            return cls(policy, **kwargs)
        except ValueError as error:
            raise InputError(f"checkpoint {path}: {error}") from None

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

    def move(self, board: chess.Board, clock: ClockView | None = None) -> chess.Move:
        if self.searcher is not None:
            return self._searched_move(board, clock)
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
                action = int(
                    sample_actions(logits, masks, temperature=self.temperature, generator=self._generator).item()
                )
            self.last_probability = float(log_probs(logits, full_mask)[0, action].exp().item())
        move = chess.Move.from_uci(ACTIONS[action])
        if not board.is_legal(move):
            raise RuntimeError(f"policy chose illegal move {move.uci()} in {board.fen()!r}")
        return move

    def _searched_move(self, board: chess.Board, clock: ClockView | None = None) -> chess.Move:
        """The search's move in `board` (searched with the game's move stack, so repetitions count),
        within the clock's budget for it when there is a clock."""
        should_stop = None
        if clock is not None:
            from chessgrpo.play.search_control import GoLimits, SearchControl, clock_seconds

            seconds = clock_seconds(
                round(1000 * clock.remaining(board.turn)), round(1000 * clock.increment(board.turn)), clock.moves_to_go
            )
            control = SearchControl(GoLimits(nodes=self.searcher.settings.nodes, seconds=seconds))  # type: ignore[union-attr]
            should_stop = control.should_stop
        result = self.searcher.search(board, should_stop=should_stop)  # type: ignore[union-attr]
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
    spec: AnchorSpec,
    *,
    engine_path: str | None = None,
    device: str = "cpu",
    temperature: float = 0.0,
    **policy_options: Any,
) -> Mover:
    """The game player of an anchor (checkpoint anchors play like the evaluated policy)."""
    if spec.kind == "random":
        return RandomMover()
    if spec.is_engine:
        return EngineMover(spec, engine_path if spec.is_stockfish else None)
    return PolicyMover.from_checkpoint(spec.path or spec.text, device=device, temperature=temperature, **policy_options)
