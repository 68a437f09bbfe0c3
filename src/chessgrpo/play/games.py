"""Games between a policy and anchors: colour-swapped pairs, adjudication, PGN, parallel workers.

The evaluated player is an action policy (`PolicyMover`) or, with `GameSettings.lm_player`, a chess
LM (`play.lm_player.LMMover`), whose per-game counts of ill-formed, illegal, re-sampled and fallback
moves each `GameResult` carries (`player_stats`).

`make_tasks` lays out the games: for each pair index i (opening i, cycling when the suite is
shorter) and each anchor, game 1 has the player as White and game 2 as Black, both from the same
opening. `run_games` (`play.game_runner`) plays them, in this process (`workers=1`) or across
`workers` processes (multiprocessing "spawn"; each worker loads its own copy of the model, its own
anchor engines and its own tablebase handle), and hands every finished `GameResult` to a callback
(progress bars, SPRT early stopping). Each game is seeded from (seed, anchor, pair, game), so results do not
depend on which worker played it: with deterministic anchors (random, sf-nodes, argmax
checkpoints) and an argmax player a run is exactly reproducible. A player with a search budget
(`GameSettings.search`) is deterministic too when the search runs on nodes, not time.

Adjudication (`Adjudicator`), checked before every move, in this order:

1. the rules: checkmate, stalemate, insufficient material, threefold repetition (the position
   stands for the third time), the fifty-move rule (100 plies without capture or pawn move),
   and python-chess's fivefold / 75-move rules;
2. the Syzygy tablebase when at most `tablebase_pieces` pieces are left (kings included) and no
   castling rights: the side to move wins (WDL 2) or loses (WDL -2), else a draw (WDL 0 and the
   cursed/blessed results, which the 50-move rule turns into draws). A win that needs more than
   100 - halfmove clock plies to the next capture or pawn move (|DTZ|) is also a draw;
3. the move cap: after `max_plies` plies from the opening the game is a draw ("move cap");
4. optional resignation (off by default, `resign_cp=None`): a separate `EnginePool` evaluates
   every position at `resign_nodes`; when White's score stays at or beyond `resign_cp`
   centipawns (mates count as beyond) in the same direction for `resign_plies` consecutive
   plies, the losing side resigns. Off by default because it replaces play by an engine's
   opinion; useful to save time against strong anchors.

Clocks (`GameSettings.tc`, `anchor_tc`; `play.game_clock`): each side has a clock. Before each
move the mover is told both clocks, increments and its moves to go (`ClockView`); the wall time
the move really took (measured here, around the mover's call: engine pipes included, as
cutechess-cli measures) is taken off its clock and the increment added, and at each ``MOVES``
boundary the period's time is added again. A side whose clock goes below zero loses on time
("time forfeit"), or draws when the opponent has insufficient material to mate; the late move is
not played. Engines are started before the game, so start-up is not on the clock. Without a clock
every side plays by its per-move limit, as before.

PGN (`_pgn`): the seven-tag roster, SetUp/FEN for the opening and PlyCount, with the standard
`Termination` values of the PGN specification: "normal" for an end by the rules (checkmate,
stalemate, insufficient material, repetition, the fifty/seventy-five-move rules) and
"adjudication" for the tablebase, the move cap and the engine-eval resignation (`pgn_termination`).
The specific reason is kept in the non-standard ``TerminationDetails`` tag (and is
`GameResult.termination`). Player names are names, not paths: a checkpoint plays under its run's
name (`checkpoint_name`: ``run.name`` of the run directory's config.yaml, else the run
directory's name, plus the step) and its directory goes to ``WhiteSource``/``BlackSource``;
engines and the random mover play under their anchor name. ``Anchor``, ``AnchorSettings``,
``PlayerSettings``, ``OpeningSource`` and ``OpeningMoves`` say how each side played and from where.
Under a clock: ``TimeControl`` (cutechess's form, e.g. ``40/10+0.1``; ``WhiteTimeControl`` and
``BlackTimeControl`` instead when the sides' clocks differ) and a ``[%clk H:MM:SS]`` comment after
every move (the mover's clock after it, increment included).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import chess
import chess.pgn

from chessgrpo.board.openings import Opening
from chessgrpo.play.anchor_runs import pack
from chessgrpo.play.anchors import AnchorSpec
from chessgrpo.play.game_clock import (
    GameClock,
    TimeControl,
    parse_time_control,
    time_forfeit,
)
from chessgrpo.play.lm_player import LMPlayerConfig
from chessgrpo.play.movers import Mover
from chessgrpo.play.players import describe_search

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.search import SearchSettings

logger = logging.getLogger(__name__)

TERMINATIONS = {
    chess.Termination.CHECKMATE: "checkmate",
    chess.Termination.STALEMATE: "stalemate",
    chess.Termination.INSUFFICIENT_MATERIAL: "insufficient material",
    chess.Termination.SEVENTYFIVE_MOVES: "seventy-five-move rule",
    chess.Termination.FIVEFOLD_REPETITION: "fivefold repetition",
}
"""The reason of an end by the rules as `GameResult.termination` and PGN TerminationDetails say it."""

PGN_TERMINATIONS = {
    "tablebase": "adjudication",
    "move cap": "adjudication",
    "resignation (engine eval)": "adjudication",  # the engine's verdict, not a player's decision
    "illegal move": "rules infraction",
    "time forfeit": "time forfeit",
}
"""Standard PGN Termination values of the reasons that are not an end by the rules ("normal")."""


def pgn_termination(reason: str) -> str:
    """The standard PGN ``Termination`` value of a game-ending `reason` (`GameResult.termination`):
    "adjudication", "rules infraction", "time forfeit", else "normal" (checkmate, stalemate and the
    draw rules). The reason itself goes to the TerminationDetails tag."""
    return PGN_TERMINATIONS.get(reason, "normal")


_STEP_DIRECTORY = re.compile(r"step_0*(\d+)")


@functools.lru_cache(maxsize=64)
def checkpoint_name(checkpoint: str) -> str:
    """A player name for a checkpoint directory (or run directory): its run's name plus the step.

    The run is the directory holding ``checkpoints/`` (the checkpoint itself or an ancestor); its
    name is ``run.name`` of its config.yaml, else the directory's name. A ``step_NNNNNN``
    checkpoint adds " step N" (two checkpoints of one run stay apart). A checkpoint outside any
    run is named by its directory name.
    """
    path = Path(checkpoint).resolve()
    if (path / "checkpoints").is_dir():
        run_dir, step_dir = path, None
    else:
        run_dir = next((parent.parent for parent in path.parents if parent.name == "checkpoints"), None)
        step_dir = path if run_dir is not None else None
    if run_dir is None:
        return path.name or str(path)
    name = run_dir.name
    try:
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # no or unreadable config: the directory's name
        config = None
    run = config.get("run") if isinstance(config, dict) else None
    if isinstance(run, dict) and isinstance(run.get("name"), str) and run["name"].strip():
        name = run["name"].strip()
    if step_dir is not None:
        match = _STEP_DIRECTORY.fullmatch(step_dir.name)
        name += f" step {match.group(1)}" if match else f" {step_dir.name}"
    return name


@dataclasses.dataclass(frozen=True)
class GameSettings:
    """Everything a worker needs besides its tasks (picklable: sent to spawned processes)."""

    checkpoint: str
    """The evaluated policy: a resolved checkpoint directory (the PGN's WhiteSource/BlackSource)."""
    player_name: str = "policy"
    """The policy's PGN player name: `checkpoint_name` of the checkpoint (plus its search), not a path."""
    temperature: float = 0.0
    device: str = "cpu"
    avoid_repetition: bool = True
    winning_material: int = 3
    engine_path: str | None = None
    engine_name: str = "Stockfish"
    syzygy_path: str | None = None
    tablebase_pieces: int = 4
    max_plies: int = 400
    resign_cp: int | None = None
    resign_plies: int = 8
    resign_nodes: int = 1000
    event: str = "chessgrpo eval games"
    search: SearchSettings | None = None
    """The evaluated policy's search (None or 0 nodes = its argmax); checkpoint anchors never search."""
    lm_player: LMPlayerConfig | None = None
    """Set when the checkpoint is a chess LM: how it plays (`play.lm_player`); None for an action policy."""
    tc: str | None = None
    """The evaluated player's time control (``MOVES/SECONDS+INC``, `play.game_clock`); None = no clocks."""
    anchor_tc: str | None = None
    """The anchors' time control when it differs from `tc` (None = `tc`)."""

    def time_controls(self) -> tuple[TimeControl, TimeControl] | None:
        """(the player's, the anchors') time controls; None without clocks."""
        if self.tc is None:
            return None
        return parse_time_control(self.tc), parse_time_control(self.anchor_tc or self.tc, "anchor_tc")

    def player_settings(self) -> str:
        """How the evaluated policy plays, for the PGN's PlayerSettings header and the JSON summary."""
        if self.lm_player is not None:
            lm = self.lm_player
            tokens = "by the tokenizer" if lm.max_new_tokens is None else str(lm.max_new_tokens)
            bos = "as the run was trained" if lm.prompt_bos is None else str(lm.prompt_bos).lower()
            return (
                f"chess LM {self.checkpoint}; greedy B: of the P: answer (max new tokens {tokens}, BOS {bos}); "
                f"up to {lm.retries} re-samples at temperature {lm.retry_temperature:g}, then a uniformly random legal move; "
                "sees the FEN only, no repetition rule"
            )
        if self.search is not None and self.search.enabled:
            return f"policy {self.checkpoint}; {describe_search(self.search)}; the search scores repetitions as draws"
        mode = "argmax" if self.temperature == 0 else f"sampled at temperature {self.temperature:g}"
        repetition = (
            f"avoids threefold when >= {self.winning_material} pawns ahead"
            if self.avoid_repetition
            else "no repetition rule"
        )
        return f"policy {self.checkpoint}; {mode}; {repetition}"


@dataclasses.dataclass(frozen=True)
class GameTask:
    """One game: the player against one anchor from one opening, with the player's colour."""

    anchor_index: int
    anchor: AnchorSpec
    anchor_settings: str
    pair: int
    """0-based pair index; PGN Round is pair + 1."""
    game: int
    """0: the player has White; 1: the player has Black."""
    opening: Opening
    seed: int

    @property
    def player_white(self) -> bool:
        return self.game == 0


@dataclasses.dataclass(frozen=True)
class GameResult:
    anchor_index: int
    anchor: str
    pair: int
    game: int
    player_white: bool
    result: str
    """"1-0", "0-1" or "1/2-1/2"."""
    termination: str
    """The specific reason ("checkmate", "stalemate", "tablebase", "move cap", ...): the PGN's
    TerminationDetails; its Termination is the standard `pgn_termination` of it."""
    plies: int
    seconds: float
    pgn: str
    opening: str = ""
    """FEN of the game's opening position: with anchor and pair, what pairs two players' games."""
    player_stats: dict[str, int] | None = None
    """A chess LM player's counts of this game (`play.lm_player.LMPlayerStats.counts`); None for a policy."""
    flagged: str | None = None
    """Under a clock: "player" or "anchor", the side that ran out of time (termination "time forfeit"); else None."""
    anchor_search: dict[str, list] | None = None
    """An engine anchor's moves in this game: reported depth, nodes and wall time (`play.anchor_runs.pack`)."""

    @property
    def player_points(self) -> float:
        if self.result == "1/2-1/2":
            return 0.5
        return 1.0 if (self.result == "1-0") == self.player_white else 0.0


def pair_records(results: list[GameResult]) -> list[dict]:
    """One record per complete colour-swapped pair, keyed by anchor, pair and opening: what
    `chessgrpo eval compare` pairs between two players that met the same anchors from the same openings.
    Values are per-game shares: score, wins and stalemates of the pair's two games."""
    by_pair: dict[tuple[str, int], list[GameResult]] = {}
    for result in results:
        by_pair.setdefault((result.anchor, result.pair), []).append(result)
    records = []
    for (anchor, pair), games in sorted(by_pair.items()):
        if len(games) == 2:
            records.append(
                {
                    "pair_id": f"{anchor}|{pair}|{games[0].opening}",
                    "pair_score": sum(g.player_points for g in games) / 2,
                    "pair_win": sum(g.player_points == 1.0 for g in games) / 2,
                    "pair_stalemate": sum(g.termination == "stalemate" for g in games) / 2,
                }
            )
    return records


def game_seed(seed: int, anchor: str, pair: int, game: int) -> int:
    """A 63-bit seed per game from the run seed and the game's place in the schedule."""
    digest = hashlib.sha256(f"{seed}|{anchor}|{pair}|{game}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def make_tasks(
    anchors: Sequence[AnchorSpec],
    anchor_settings: Sequence[str],
    openings: Sequence[Opening],
    pairs: int,
    seed: int = 0,
) -> list[GameTask]:
    """Pairs 0..pairs-1 against every anchor; both games of a pair adjacent, pairs in order."""
    if not openings:
        raise ValueError("no openings to play from")
    tasks = []
    for pair in range(pairs):
        opening = openings[pair % len(openings)]
        for index, (anchor, settings) in enumerate(zip(anchors, anchor_settings)):
            for game in (0, 1):
                tasks.append(
                    GameTask(index, anchor, settings, pair, game, opening, game_seed(seed, anchor.text, pair, game))
                )
    return tasks


# --------------------------------------------------------------------------------------------
# Adjudication


class Adjudicator:
    """Decides when a game is over (see the module docstring); one per worker."""

    def __init__(self, settings: GameSettings):
        from chessgrpo.engine import EnginePool, Tablebase

        self.max_plies = settings.max_plies
        self.tablebase_pieces = settings.tablebase_pieces
        self.tablebase = (
            Tablebase(settings.syzygy_path) if settings.syzygy_path and settings.tablebase_pieces > 0 else None
        )
        self.resign_cp = settings.resign_cp
        self.resign_plies = settings.resign_plies
        self.pool = None
        if settings.resign_cp is not None:
            self.pool = EnginePool(settings.engine_path, processes=1, nodes=settings.resign_nodes, cache_path=None)
        self._streak = 0
        self._streak_sign = 0

    def new_game(self) -> None:
        self._streak, self._streak_sign = 0, 0

    def check(self, board: chess.Board, plies: int) -> tuple[str, str] | None:
        """(result, termination) when the game is over before the side to move plays."""
        outcome = board.outcome(claim_draw=False)
        if outcome is not None:
            return outcome.result(), TERMINATIONS.get(outcome.termination, outcome.termination.name.lower())
        if board.is_repetition(3):
            return "1/2-1/2", "threefold repetition"
        if board.is_fifty_moves():
            return "1/2-1/2", "fifty-move rule"
        if self.tablebase is not None:
            verdict = self._tablebase(board)
            if verdict is not None:
                return verdict
        if plies >= self.max_plies:
            return "1/2-1/2", "move cap"
        if self.pool is not None:
            return self._resignation(board)
        return None

    def _tablebase(self, board: chess.Board) -> tuple[str, str] | None:
        if (
            chess.popcount(board.occupied) > min(self.tablebase_pieces, self.tablebase.max_pieces)
            or board.castling_rights
        ):
            return None
        try:
            probe = self.tablebase.probe(board)
        except KeyError:  # a table is missing from the directory: play on
            return None
        if abs(probe.wdl) == 2 and board.halfmove_clock + abs(probe.dtz) <= 100:
            mover_wins = probe.wdl > 0
            return ("1-0" if mover_wins == board.turn else "0-1"), "tablebase"
        return "1/2-1/2", "tablebase"

    def _resignation(self, board: chess.Board) -> tuple[str, str] | None:
        evaluation = self.pool.evaluate([board])[0]  # type: ignore[union-attr]
        if evaluation.mate is not None:
            mover = 1 if evaluation.mate > 0 else -1
        else:
            mover = (
                0 if evaluation.cp is None or abs(evaluation.cp) < self.resign_cp else (1 if evaluation.cp > 0 else -1)
            )
        white = mover if board.turn == chess.WHITE else -mover
        if white != 0 and white == self._streak_sign:
            self._streak += 1
        else:
            self._streak, self._streak_sign = (1, white) if white != 0 else (0, 0)
        if self._streak >= self.resign_plies:
            return ("1-0" if self._streak_sign > 0 else "0-1"), "resignation (engine eval)"
        return None

    def close(self) -> None:
        if self.tablebase is not None:
            self.tablebase.close()
        if self.pool is not None:
            self.pool.close()


# --------------------------------------------------------------------------------------------
# Playing


class GameAbandoned(Exception):
    """`play_game`'s `abandon` check said to stop mid-game (a worker whose parent died)."""


def play_game(
    task: GameTask,
    player: Mover,
    anchor: Mover,
    adjudicator: Adjudicator,
    settings: GameSettings,
    abandon: Callable[[], bool] | None = None,
) -> GameResult:
    """Play one game from the task's opening to its end; returns the result with its PGN.

    `abandon`, asked before every move, raises `GameAbandoned` when it returns True.
    """
    started = time.perf_counter()
    board = chess.Board(task.opening.fen)
    game_id = (task.anchor.text, task.pair, task.game, task.seed)
    player.new_game(game_id, task.seed)
    anchor.new_game(game_id, task.seed ^ 0x5DEECE66D)
    adjudicator.new_game()
    white, black = (player, anchor) if task.player_white else (anchor, player)
    controls = settings.time_controls()
    clock = None
    if controls is not None:
        player_tc, anchor_tc = controls
        clock = GameClock(*((player_tc, anchor_tc) if task.player_white else (anchor_tc, player_tc)))
        for side in (player, anchor):  # start engines now: start-up is not on the clock
            warm_up = getattr(side, "warm_up", None)
            if callable(warm_up):
                warm_up()
    clocks: list[float] = []  # the mover's clock after each move (PGN %clk)
    flagged: str | None = None
    plies = 0
    while True:
        verdict = adjudicator.check(board, plies)
        if verdict is not None:
            break
        if abandon is not None and abandon():
            raise GameAbandoned(
                f"game {task.anchor.text} pair {task.pair + 1} game {task.game + 1} abandoned after {plies} plies"
            )
        mover = white if board.turn == chess.WHITE else black
        if clock is None:
            move = mover.move(board)
        else:
            view = clock.view(board.turn)
            on_clock = getattr(mover, "plays_on_clock", False)
            move_started = time.perf_counter()
            move = mover.move(board, clock=view) if on_clock else mover.move(board)  # type: ignore[call-arg]
            if clock.spend(board.turn, time.perf_counter() - move_started):
                flagged = "player" if mover is player else "anchor"
                verdict = (time_forfeit(board, board.turn), "time forfeit")
                break
            clocks.append(clock.left[board.turn])
        if not board.is_legal(move):
            raise RuntimeError(
                f"{'player' if mover is player else task.anchor.text} played illegal {move} in {board.fen()!r}"
            )
        board.push(move)
        plies += 1
    result, termination = verdict
    pgn = _pgn(task, board, result, termination, plies, settings, clocks if clock is not None else None)
    # A player that counts how its moves were made (the chess LM, `LMMover`) reports this game's counts.
    game_stats = getattr(player, "game_stats", None)
    searches = getattr(anchor, "game_searches", None)
    return GameResult(
        anchor_index=task.anchor_index,
        anchor=task.anchor.text,
        pair=task.pair,
        game=task.game,
        player_white=task.player_white,
        result=result,
        termination=termination,
        plies=plies,
        seconds=time.perf_counter() - started,
        pgn=pgn,
        opening=task.opening.fen,
        player_stats=game_stats() if callable(game_stats) else None,
        flagged=flagged,
        anchor_search=pack(searches()) if callable(searches) else None,
    )


def _pgn(
    task: GameTask,
    board: chess.Board,
    result: str,
    termination: str,
    plies: int,
    settings: GameSettings,
    clocks: list[float] | None = None,
) -> str:
    game = chess.pgn.Game.from_board(board)  # SetUp/FEN tags when the opening is not the start
    if clocks is not None:
        for node, left in zip(game.mainline(), clocks):
            node.set_clock(max(left, 0.0))
    headers = game.headers
    headers["Event"] = settings.event
    headers["Site"] = "?"
    headers["Date"] = datetime.date.today().strftime("%Y.%m.%d")
    headers["Round"] = str(task.pair + 1)
    player, anchor = settings.player_name, task.anchor.text
    sources: dict[str, str] = {"player": settings.checkpoint}
    if task.anchor.kind == "checkpoint" and task.anchor.path:
        anchor = checkpoint_name(task.anchor.path)
        if anchor == player:  # the same run on both sides (an SPRT against itself): keep the seats apart
            anchor += " (anchor)"
        sources["anchor"] = task.anchor.path
    seats = ("player", "anchor") if task.player_white else ("anchor", "player")
    headers["White"], headers["Black"] = ({"player": player, "anchor": anchor}[seat] for seat in seats)
    headers["Result"] = result
    headers["Termination"] = pgn_termination(termination)
    headers["TerminationDetails"] = termination
    headers["PlyCount"] = str(plies)
    for colour, seat in zip(("White", "Black"), seats):
        if seat in sources:
            headers[f"{colour}Source"] = sources[seat]
    headers["Anchor"] = task.anchor.text
    headers["AnchorSettings"] = task.anchor_settings
    headers["PlayerSettings"] = settings.player_settings()
    controls = settings.time_controls()
    if controls is not None:
        player_tc, anchor_tc = (control.text for control in controls)
        if player_tc == anchor_tc:
            headers["TimeControl"] = player_tc
        else:
            white_tc, black_tc = (player_tc, anchor_tc) if task.player_white else (anchor_tc, player_tc)
            headers["WhiteTimeControl"], headers["BlackTimeControl"] = white_tc, black_tc
    headers["OpeningSource"] = task.opening.source or "?"
    if task.opening.moves:
        headers["OpeningMoves"] = " ".join(task.opening.moves)
    game.headers["Result"] = result
    return str(game) + "\n"
