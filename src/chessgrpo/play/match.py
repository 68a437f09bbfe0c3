"""The match driver of `chessgrpo eval games`: from a `GamesConfig` to a summary and a PGN.

`play_match(config, checkpoint)` does everything between parsing the command line and printing:

1. checks the config (`validate_games_config`) and builds the evaluated player's search, once,
   so a checkpoint without a value head is one clear error before any game; a chess LM checkpoint
   (`models.checkpoint_kind`) is loaded once instead (`play.lm_player`, settings ``lm.*``), and the
   options only an action policy has (search, temperature) are refused for it;
2. the anchors (`play.anchors`: random, Stockfish levels, UCI engines, checkpoints; the SPRT
   opponent alone with ``sprt_elo0/1``), each engine probed and started once (`play.anchor_checks`);
3. the openings: a file, or a suite generated with Stockfish's node-limited balance check
   (`board.openings.generate_openings`);
4. the games (`play.games.make_tasks`, `run_games`) with a journal beside the PGN
   (`play.game_journal`): a rerun after an interruption plays only the games it lacks, and the
   SPRT (`play.elo.sprt`) sees the finished pairs in the order they first finished and stops the
   match as soon as it decides;
5. the PGN of every game, the summary (`summarise`: per-anchor W/D/L, Wilson score, pentanomial,
   Elo difference, losses on time per side under a clock (``time_losses``), and what each engine
   anchor actually ran against the limit it was asked (``ran``, `play.anchor_runs`); the maximum-likelihood Elo over rated anchors; the SPRT; a chess LM's
   ill-formed, illegal, re-sampled and fallback rates, ``lm_player``, per anchor and in all), with
   the per-pair records `eval compare` pairs, written to ``output`` when set.

Defaults and every key: configs/games.yaml.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from chessgrpo.config import EngineConfig, to_dict
from chessgrpo.errors import InputError
from chessgrpo.play.game_journal import GameJournal, journal_path, remaining
from chessgrpo.play.lm_player import LMPlayerConfig


@dataclasses.dataclass
class GamesConfig:
    """`chessgrpo eval games`: games against anchors (see configs/games.yaml for each key)."""

    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """Stockfish binary (path), the pool that checks opening balance (processes, cache), and the
    Syzygy directory for adjudication and the search's exact endgame values (syzygy_path; null
    disables both)."""
    anchors: list[str] = dataclasses.field(default_factory=lambda: ["random", "sf-skill:0"])
    """Opponents: random, sf-skill:N, sf-elo:N, sf-nodes:N, uci:PATH[:KEY=VALUE]... (any UCI engine),
    the name of an engine in the engines file, or checkpoint paths (docs/engines.md)."""
    engines: str | None = None
    """Engines file (YAML): UCI engines with a name, command, args, options, limit and optional elo;
    anchors name them. null = none. See docs/engines.md."""
    games: int = 40
    """Games per anchor; even (colour-swapped pairs). With SPRT: the most games played."""
    seed: int = 0
    """Seeds the opening suite, the random anchor and sampling (per game)."""
    workers: int = 0
    """Game worker processes; 0 = one per CPU core."""
    temperature: float = 0.0
    """The policy's temperature: 0 = argmax, > 0 = sampled (checkpoint anchors use it too)."""
    device: str = "cpu"
    """Torch device of the policies."""
    avoid_repetition: bool = True
    """When winning (material ahead by winning_material), do not play into a threefold repetition."""
    winning_material: int = 3
    """Material lead in pawns (P1 N3 B3 R5 Q9) that counts as winning (for avoid_repetition; argmax play only)."""
    search_nodes: int = 0
    """The evaluated policy's search budget per move (PUCT simulations or alpha-beta network
    evaluations); 0 = no search, the policy's argmax. Needs a checkpoint with a value head."""
    search_algorithm: Literal["puct", "alphabeta"] = "puct"
    """puct (policy-guided MCTS) or alphabeta (policy-pruned negamax); see `chessgrpo.search`."""
    search_c_puct: float = 1.5
    """PUCT exploration weight."""
    search_batch_size: int = 16
    """PUCT leaves per network call."""
    anchor_nodes: int = 1000
    """Node limit per move of sf-skill and sf-elo anchors, and of UCI engine anchors that give no limit."""
    anchor_depth: int | None = None
    """Depth limit per move of those anchors instead of nodes."""
    random_rating: float = 0.0
    """The rating given to the random anchor: a convention, not a measurement."""
    anchor_ratings: list[str] = dataclasses.field(default_factory=list)
    """Fixed ratings as ANCHOR=RATING (e.g. sf-nodes:50=1800); override the built-in ones."""
    openings: str | None = None
    """Opening file (.pgn, or FEN/EPD per line); null = generate a balanced suite."""
    opening_min_plies: int = 4
    """Generated openings: fewest random plies from the start."""
    opening_max_plies: int = 8
    """Generated openings: most random plies from the start."""
    opening_max_cp: int = 60
    """Generated openings: keep only |eval| < this many centipawns."""
    opening_nodes: int = 2000
    """Generated openings: node limit of the balance check."""
    max_plies: int = 400
    """Move cap: a game not decided after this many plies from the opening is a draw."""
    tablebase_pieces: int = 4
    """Adjudicate by Syzygy at this many pieces or fewer (kings included); 0 disables."""
    resign_cp: int | None = None
    """Resignation threshold in centipawns (null = never resign; games are played out)."""
    resign_plies: int = 8
    """Consecutive plies the engine eval must stay beyond resign_cp."""
    resign_nodes: int = 1000
    """Node limit of the resignation eval."""
    opponent: str | None = None
    """SPRT: the checkpoint to test against (B in A/B)."""
    sprt_elo0: float | None = None
    """SPRT: Elo difference of H0 (logistic, per game); set with sprt_elo1 to run an SPRT."""
    sprt_elo1: float | None = None
    """SPRT: Elo difference of H1."""
    sprt_alpha: float = 0.05
    """SPRT: false positive rate (accepting H1 when H0 holds)."""
    sprt_beta: float = 0.05
    """SPRT: false negative rate."""
    confidence: float = 0.95
    """Confidence level of every interval."""
    pgn: str | None = None
    """PGN of every game; null = <run>/eval/games.pgn for a run directory, else runs/eval_games/games.pgn."""
    output: str | None = None
    """If set, also write the JSON summary to this file."""
    resume: bool = True
    """Keep each finished game in a journal beside the PGN (`chessgrpo.play.game_journal`) and, when
    the same command is run again after an interruption, play only the games it does not hold yet.
    false = ignore any journal and play every game (a journal is still written)."""
    tc: str | None = None
    """Time control of both sides, cutechess syntax MOVES/SECONDS+INC, SECONDS+INC or SECONDS (e.g.
    40/10+0.1); null = no clocks, per-move limits only. Under a clock engine anchors keep only a limit
    given for them (sf-nodes:N, uci:...:nodes=N), and the policy's search stops at its budget or its
    clock's share, whichever first (`play.game_clock`, docs/engines.md)."""
    anchor_tc: str | None = None
    """The anchors' time control when it differs from the policy's (cutechess's per-engine tc); null = tc."""
    lm: LMPlayerConfig = dataclasses.field(default_factory=LMPlayerConfig)
    """How a chess LM checkpoint plays (`play.lm_player`: re-samples, fallback, answer length, BOS);
    unused for an action policy."""


def resolve_games_paths(config: GamesConfig) -> GamesConfig:
    """The openings file and the Syzygy directory found from any current directory where they
    exist (`chessgrpo.paths`); a path found nowhere is left as is for `_require` to name."""
    from chessgrpo.paths import resolve_optional

    return dataclasses.replace(
        config,
        openings=resolve_optional(config.openings, required=False),
        engine=dataclasses.replace(
            config.engine, syzygy_path=resolve_optional(config.engine.syzygy_path, required=False)
        ),
    )


def _require(path: str, what: str, hint: str = "") -> str:
    """`path` found from any current directory, else one error naming where it was looked for."""
    from chessgrpo.paths import DataNotFoundError, resolve_optional

    try:
        return resolve_optional(path, what)  # type: ignore[return-value]
    except DataNotFoundError as error:
        raise DataNotFoundError(f"{error}{hint}") from None


_SYZYGY_HINT = "; or set engine.syzygy_path=null to play without tablebase adjudication"


def validate_games_config(config: GamesConfig) -> None:
    """One clear error for a config no match can be played with (odd games, SPRT without an opponent, ...)."""
    if config.games < 2 or config.games % 2:
        raise InputError(
            f"games must be a positive even number: games are played in colour-swapped pairs (got {config.games}; "
            f"use {max(2, config.games + config.games % 2)})"
        )
    if config.workers < 0:
        raise InputError(f"workers must be >= 0 (0 = one per CPU core), got {config.workers}")
    if config.temperature < 0:
        raise InputError(f"temperature must be >= 0, got {config.temperature}")
    if config.search_nodes > 0 and config.temperature > 0:
        raise InputError(
            f"search plays deterministically (its most visited move): use temperature 0 with search_nodes > 0, "
            f"got temperature {config.temperature:g} with {config.search_nodes} search nodes"
        )
    if config.max_plies < 1 or config.resign_plies < 1 or config.opening_nodes < 1:
        raise InputError("max_plies, resign_plies and opening_nodes must be >= 1")
    if config.resign_cp is not None and config.resign_cp <= 0:
        raise InputError(f"resign_cp must be > 0 or null, got {config.resign_cp}")
    if not 0 < config.confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got {config.confidence}")
    if (config.sprt_elo0 is None) != (config.sprt_elo1 is None):
        raise InputError("SPRT needs both sprt_elo0 and sprt_elo1 (--sprt ELO0,ELO1)")
    if config.sprt_elo0 is not None:
        if config.opponent is None:
            raise InputError("--sprt needs --opponent CKPT2: the checkpoint to test against")
        if not config.sprt_elo0 < config.sprt_elo1:  # type: ignore[operator]
            raise InputError(f"--sprt needs elo0 < elo1, got {config.sprt_elo0:g},{config.sprt_elo1:g}")
    elif config.opponent is not None:
        raise InputError("--opponent is only used with --sprt ELO0,ELO1; add the checkpoint to --anchors instead")
    from chessgrpo.play.game_clock import parse_time_control

    if config.tc is not None:
        parse_time_control(config.tc, "tc")
    if config.anchor_tc is not None:
        if config.tc is None:
            raise InputError(f"anchor_tc {config.anchor_tc!r} needs tc (the policy's clock) too: give --tc")
        parse_time_control(config.anchor_tc, "anchor_tc")


def _check_lm_player(config: GamesConfig, checkpoint: Path) -> LMPlayerConfig:
    """The settings a chess LM checkpoint plays with, checked once here: the options only an action
    policy has are one clear error, and the LM is loaded once (a broken model fails before any game).
    Its answer length and BOS come back resolved, so the PGN and the journal record what was played."""
    from chessgrpo.play.lm_player import LMPlayer

    if config.search_nodes > 0:
        raise InputError(
            f"search_nodes (--search-nodes) needs an action-policy checkpoint with a value head, but {str(checkpoint)!r} "
            "is a chess language model: it plays its greedy B: answer"
        )
    if config.temperature > 0:
        raise InputError(
            f"temperature (--temperature) samples an action policy's moves, but {str(checkpoint)!r} is a chess language "
            "model: it plays its greedy B: answer (lm.retry_temperature sets its re-samples)"
        )
    player = LMPlayer.from_path(checkpoint, device=config.device, config=config.lm)
    return dataclasses.replace(config.lm, prompt_bos=player.prompt_bos, max_new_tokens=player.max_new_tokens)


def _check_policy_anchors(anchors: list[Any]) -> None:
    """Checkpoint anchors play as action policies: a chess LM there is one clear error."""
    from chessgrpo.models.checkpoint_kind import is_lm_directory

    for anchor in anchors:
        if anchor.kind == "checkpoint" and anchor.path and is_lm_directory(Path(anchor.path)):
            raise InputError(
                f"anchor {anchor.text!r} is a chess language model; checkpoint anchors (and --opponent) must be "
                "action policies. Play the LM as --checkpoint instead"
            )


def _check_search(checkpoint: Path, search: Any, device: str) -> None:
    """Build the searching player once, here: a checkpoint without a value head (or a missing
    Syzygy directory) is then one clear error before openings are made and games are played,
    instead of a worker's traceback."""
    if search is None:
        return
    from chessgrpo.play.movers import PolicyMover

    PolicyMover.from_checkpoint(checkpoint, device=device, search=search).close()


def default_pgn(checkpoint: Path, resolved: Path) -> Path:
    """<run>/eval/games.pgn when the checkpoint lives in a run directory, else runs/eval_games/games.pgn."""
    if (checkpoint / "checkpoints").is_dir():
        return checkpoint / "eval" / "games.pgn"
    for parent in resolved.parents:
        if parent.name == "checkpoints":
            return parent.parent / "eval" / "games.pgn"
    return Path("runs") / "eval_games" / "games.pgn"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


@dataclasses.dataclass
class _Lineup:
    """The anchors of a match, their given ratings, and the name of the engine that checks openings."""

    anchors: list[Any]
    engine_name: str
    ratings_given: dict[str, float]


def _lineup(config: GamesConfig, sprt_mode: bool) -> _Lineup:
    """The anchors (or the SPRT opponent), checked against the engine and started once: one clear error before any game."""
    from chessgrpo.engine import RetryPolicy
    from chessgrpo.play.anchor_checks import check_anchor, prepare_anchors, probe_engine
    from chessgrpo.play.anchors import load_engines, parse_anchor, parse_anchors, parse_ratings

    retry = RetryPolicy(
        retries_per_position=config.engine.retries_per_position,
        max_failures=config.engine.max_failures,
        startup_attempts=config.engine.startup_attempts,
    )
    limits: dict[str, Any] = dict(
        nodes=config.anchor_nodes, depth=config.anchor_depth, timeout_s=config.engine.timeout_s, retry=retry
    )
    if config.engines:
        limits["engines"] = load_engines(config.engines, **limits)
    if sprt_mode:
        anchors = [parse_anchor(config.opponent, **limits)]  # type: ignore[arg-type]
        if anchors[0].kind != "checkpoint":
            raise InputError(f"--opponent must be a checkpoint directory, got {config.opponent!r}")
    else:
        anchors = parse_anchors(config.anchors, **limits)
    _check_policy_anchors(anchors)
    ratings_given = parse_ratings(config.anchor_ratings)

    engine_name = ""
    needs_pool = config.openings is None or config.resign_cp is not None
    if any(anchor.is_stockfish for anchor in anchors) or needs_pool:
        info = probe_engine(config.engine.path)
        engine_name = info.name
        for anchor in anchors:
            check_anchor(anchor, info)
        if needs_pool and not info.is_stockfish:
            uses = "the generated opening suite is balanced" if config.openings is None else "resignation is judged"
            raise InputError(
                f"engine.path is {info.name} ({info.path}), not Stockfish: {uses} by Stockfish's node-limited "
                f"evaluation. Set engine.path to Stockfish{' or give --openings FILE' if config.openings is None else ''}; "
                f"to play {info.name}, use --anchors uci:{info.path}:depth=N (docs/engines.md)"
            )
    anchors = prepare_anchors(anchors)  # each UCI engine started once: one clear error before any game
    if config.engine.syzygy_path and config.tablebase_pieces > 0:
        _require(config.engine.syzygy_path, "Syzygy directory (engine.syzygy_path)", _SYZYGY_HINT)
    return _Lineup(anchors, engine_name, ratings_given)


def _openings(config: GamesConfig, pairs: int) -> tuple[list[Any], str]:
    """The match's openings and how they were made: read from `openings`, or a balanced suite generated by Stockfish."""
    from chessgrpo.board.openings import generate_openings, read_openings
    from chessgrpo.engine import EnginePool

    if config.openings:
        openings = read_openings(_require(config.openings, "openings file"))
        note = f"{len(openings)} openings from {config.openings}"
        if len(openings) < pairs:
            note += f" (cycled: {pairs} pairs)"
        return openings, note
    with EnginePool.from_config(config.engine) as pool:

        def centipawns(boards):
            return [e.cp if e.mate is None else None for e in pool.evaluate(boards, nodes=config.opening_nodes)]

        openings = generate_openings(
            pairs,
            centipawns,
            seed=config.seed,
            min_plies=config.opening_min_plies,
            max_plies=config.opening_max_plies,
            max_cp=config.opening_max_cp,
        )
    note = (
        f"{len(openings)} generated openings (seed {config.seed}, {config.opening_min_plies}-{config.opening_max_plies} "
        f"random plies, |eval| < {config.opening_max_cp} cp at {config.opening_nodes} nodes)"
    )
    return openings, note


def _game_settings(
    config: GamesConfig, checkpoint: Path, search: Any, engine_name: str, lm_player: LMPlayerConfig | None = None
) -> Any:
    from chessgrpo.play.games import GameSettings, checkpoint_name
    from chessgrpo.play.players import search_label

    player_name = checkpoint_name(str(checkpoint))  # the PGN's player name: the run's, not a path
    return GameSettings(
        checkpoint=str(checkpoint),
        player_name=f"{player_name} ({search_label(search)})" if search else player_name,
        temperature=config.temperature,
        device=config.device,
        avoid_repetition=config.avoid_repetition,
        winning_material=config.winning_material,
        engine_path=config.engine.path,
        engine_name=engine_name or "Stockfish",
        syzygy_path=config.engine.syzygy_path if config.tablebase_pieces > 0 else None,
        tablebase_pieces=config.tablebase_pieces,
        max_plies=config.max_plies,
        resign_cp=config.resign_cp,
        resign_plies=config.resign_plies,
        resign_nodes=config.resign_nodes,
        search=search,
        lm_player=lm_player,
        tc=config.tc,
        anchor_tc=config.anchor_tc,
    )


class _SprtWatch:
    """Counts finished games on the progress bar and, in SPRT mode, sums pair points as pairs complete
    and asks the SPRT after each: True = decided, stop the match."""

    def __init__(self, config: GamesConfig, progress: Any, sprt_mode: bool) -> None:
        self.config, self.progress, self.sprt_mode = config, progress, sprt_mode
        self.halves: dict[tuple[int, int], float] = {}
        self.pair_points: list[float] = []
        self.result: Any = None

    def __call__(self, result: Any) -> bool:
        from chessgrpo.play.elo import pentanomial, sprt

        config = self.config
        self.progress.update(1)
        if not self.sprt_mode:
            return False
        key = (result.anchor_index, result.pair)
        if key not in self.halves:
            self.halves[key] = result.player_points
            return False
        self.pair_points.append(self.halves.pop(key) + result.player_points)
        state = sprt(
            pentanomial(self.pair_points), config.sprt_elo0, config.sprt_elo1, config.sprt_alpha, config.sprt_beta
        )
        self.result = state
        self.progress.set_postfix(llr=f"{state.llr:.2f}")
        return state.decision is not None


Progress = Callable[[int], contextlib.AbstractContextManager[Any]]
"""total games -> a progress bar (a context with update(n) and set_postfix(**values)), e.g. the CLI's tqdm bar."""


def play_match(
    config: GamesConfig,
    checkpoint_path: Path,
    *,
    progress: Progress,
    notify: Callable[[str], None] = print,
    on_summary: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Play the match `config` describes for the checkpoint (or run directory) at `checkpoint_path`; the summary.

    Writes the PGN (and ``output`` when set); `notify` receives the one-line note of a resumed match, and
    `on_summary` the summary before the journal is removed (a result written there survives a crash after it).
    """
    from chessgrpo.engine import available_cores
    from chessgrpo.models.checkpoint_kind import LM, identify_checkpoint
    from chessgrpo.play.anchors import CALIBRATION_NOTE, anchor_rating
    from chessgrpo.play.game_runner import run_games
    from chessgrpo.play.games import make_tasks, pair_records
    from chessgrpo.play.players import search_settings

    validate_games_config(config)
    found = identify_checkpoint(checkpoint_path)
    checkpoint = found.directory
    lm_player = _check_lm_player(config, checkpoint_path) if found.kind == LM else None
    if lm_player is None and config.lm != LMPlayerConfig():
        raise InputError(
            f"the lm.* settings are for a chess LM checkpoint, but {str(checkpoint_path)!r} is an action policy; drop them"
        )
    if config.search_nodes > 0 and config.engine.syzygy_path:  # the search opens the tables
        config = dataclasses.replace(
            config,
            engine=dataclasses.replace(
                config.engine,
                syzygy_path=_require(config.engine.syzygy_path, "Syzygy directory (engine.syzygy_path)", _SYZYGY_HINT),
            ),
        )
    search = search_settings(
        config.search_nodes,
        config.search_algorithm,
        config.search_c_puct,
        config.search_batch_size,
        config.engine.syzygy_path,
    )
    _check_search(checkpoint, search, config.device)
    sprt_mode = config.sprt_elo0 is not None
    workers = config.workers or available_cores()
    clock_note = _clock_note(config, workers, available_cores())  # before the engines start and the openings are made
    lineup = _lineup(config, sprt_mode)
    pairs = config.games // 2
    openings, opening_note = _openings(config, pairs)
    settings = _game_settings(config, checkpoint, search, lineup.engine_name, lm_player)
    if config.tc is not None:  # every anchor plays on its clock (`AnchorSpec.clock`)
        lineup.anchors = [dataclasses.replace(anchor, clock=config.anchor_tc or config.tc) for anchor in lineup.anchors]
    described = [anchor.describe(lineup.engine_name or "Stockfish") for anchor in lineup.anchors]
    tasks = make_tasks(lineup.anchors, described, openings, pairs, seed=config.seed)

    bar = progress(len(tasks))  # in a log file: a line every 30 s
    watch = _SprtWatch(config, bar, sprt_mode)
    pgn_path = Path(config.pgn) if config.pgn else default_pgn(checkpoint_path, checkpoint)
    journal = GameJournal(journal_path(pgn_path), settings, tasks)
    if config.resume:
        earlier = journal.load()
    else:
        journal.remove()
        earlier = []
    stopped = False
    if earlier:
        notify(f"resuming: {len(earlier)} of {len(tasks)} games already played, from {journal.path}")
        for result in earlier:  # in the order they finished, as the SPRT first saw them
            stopped = watch(result) or stopped
            if stopped:
                break

    def record(result) -> bool:
        journal.append(result)
        return watch(result)

    started = time.perf_counter()
    fresh: list = []
    with bar:
        if not stopped:
            fresh, stopped = run_games(settings, remaining(tasks, earlier), workers=workers, on_result=record)
    journal.close()
    seconds = time.perf_counter() - started
    results = sorted([*earlier, *fresh], key=lambda r: (r.anchor_index, r.pair, r.game))

    _write_atomic(pgn_path, "".join(result.pgn + "\n" for result in results))

    ratings = [
        anchor_rating(anchor, lineup.engine_name, random_rating=config.random_rating, overrides=lineup.ratings_given)
        for anchor in lineup.anchors
    ]
    summary = summarise(
        results, lineup.anchors, described, ratings, confidence=config.confidence, sprt_result=watch.result
    )
    summary.update(
        checkpoint=str(checkpoint),
        player_kind="chess LM" if lm_player is not None else "action policy",
        player=settings.player_settings(),
        search=dataclasses.asdict(search) if search else None,
        engine=lineup.engine_name or None,
        games_per_anchor=config.games,
        games_played=len(results),
        games_resumed=len(earlier),
        stopped_early=stopped,
        workers=workers,
        seconds=round(seconds, 2),
        games_per_minute=round(60.0 * len(fresh) / seconds, 2) if seconds > 0 and fresh else None,
        openings=opening_note,
        pgn=str(pgn_path),
        calibration=CALIBRATION_NOTE,
        records={"player": pair_records(results)},  # for `eval compare`
        tc=config.tc,
        anchor_tc=config.anchor_tc,
        clock_note=clock_note,
    )
    if config.output:
        _write_atomic(Path(config.output), json.dumps({"config": to_dict(config), **summary}, indent=1))
    if on_summary is not None:
        on_summary(summary)
    journal.remove()  # everything is in the PGN and the JSON now
    return summary


def _clock_note(config: GamesConfig, workers: int, cores: int) -> str | None:
    """How the clocks share the machine (None without clocks); `ValueError` when games would share cores."""
    if config.tc is None:
        return None
    if workers > cores:
        raise InputError(
            f"tc: {workers} game workers on {cores} CPU cores would share cores between running clocks and distort "
            f"them; use --workers {cores} or fewer"
        )
    return (
        f"clocks: {workers} game{'s' if workers != 1 else ''} at a time on {cores} CPU core{'s' if cores != 1 else ''}; "
        "the two sides of a game alternate (no pondering; engines Threads=1, torch 1 thread), so each running game has "
        "a core, but other load on the machine is on the clocks too"
    )


def summarise(results, anchors, described, ratings, *, confidence: float = 0.95, sprt_result=None) -> dict:
    """Per-anchor W/D/L, Wilson score, pentanomial, Elo difference, losses on time per side, what an engine
    anchor ran (`play.anchor_runs`); ML Elo over rated anchors."""
    from chessgrpo.play.elo import AnchorGames, elo_from_score, maximum_likelihood_elo, pentanomial, score_interval

    rows = []
    rated: list[AnchorGames] = []
    for index, (anchor, settings, rating) in enumerate(zip(anchors, described, ratings)):
        games = [r for r in results if r.anchor_index == index]
        wins = sum(r.player_points == 1.0 for r in games)
        draws = sum(r.player_points == 0.5 for r in games)
        losses = len(games) - wins - draws
        by_pair: dict[int, list[float]] = collections.defaultdict(list)
        for r in games:
            by_pair[r.pair].append(r.player_points)
        complete = [sum(points) for points in by_pair.values() if len(points) == 2]
        score = score_interval(wins, draws, losses, confidence)
        rows.append(
            {
                "anchor": anchor.text,
                "settings": settings,
                **({"engine": anchor.engine.id_name, "command": list(anchor.engine.command)} if anchor.engine else {}),
                "rating": rating.value,
                "rating_source": rating.source,
                "wins": wins,
                "draws": draws,
                "losses": losses,
                "score": score.to_json(),
                "pentanomial": list(pentanomial(complete)),
                "elo_difference": elo_from_score(score).to_json(),
                "terminations": dict(collections.Counter(r.termination for r in games).most_common()),
                "mean_plies": round(sum(r.plies for r in games) / len(games), 1) if games else None,
                **({"lm_player": _lm_stats(games).to_json()} if any(r.player_stats for r in games) else {}),
                "time_losses": {side: sum(r.flagged == side for r in games) for side in ("player", "anchor")},
                **({"ran": _anchor_ran(anchor, games)} if anchor.is_engine else {}),
            }
        )
        if rating.value is not None and games:
            rated.append(AnchorGames(rating=rating.value, points=wins + 0.5 * draws, games=len(games)))
    elo = maximum_likelihood_elo(rated, confidence).to_json() if rated else None
    summary: dict[str, Any] = {
        "anchors": rows,
        "elo": elo,
        "elo_method": "maximum likelihood over rated anchors (logistic, draws = half points), likelihood-ratio interval",
    }
    summary["time_losses"] = {side: sum(r.flagged == side for r in results) for side in ("player", "anchor")}
    if any(r.player_stats for r in results):  # a chess LM played: how its moves were made, over every game
        summary["lm_player"] = _lm_stats(results).to_json()
    if sprt_result is not None:
        summary["sprt"] = sprt_result.to_json()
    return summary


def _anchor_ran(anchor: Any, games: list[Any]) -> dict[str, Any]:
    """What an engine anchor ran over its `games` against what it was asked (`play.anchor_runs.anchor_run`)."""
    from chessgrpo.play.anchor_runs import anchor_run, unpack

    moves = [m for r in games for m in unpack(r.anchor_search)]
    return anchor_run(anchor.text, anchor.asked(), anchor.asked_text(), moves, clocked=anchor.clock is not None)


def _lm_stats(results: list[Any]) -> Any:
    """The chess LM's counts summed over `results` (`play.lm_player.LMPlayerStats`)."""
    from chessgrpo.play.lm_player import LMPlayerStats

    total = LMPlayerStats()
    for result in results:
        if result.player_stats:
            total = total + LMPlayerStats.from_counts(result.player_stats)
    return total
