"""One player evaluated beside its baselines on the same items: `chessgrpo eval offline|puzzles|epd`.

`EvalConfig` configures them (configs/eval.yaml). The evaluated player is a checkpoint's policy
(with an optional search, `search_settings`), a policy in memory (a training run's held-out evaluation) or a
baseline (``random``, ``stockfish``); unless ``baselines=false`` the other baselines play the same positions, so
a number always has context. `run_offline`, `run_puzzles` and `run_epd` are the registry's runners
(`eval.registry`: ``(config, subject, context)``, `eval.running`) and return a `PlayerResults`: each player's
result, the JSON summary the commands print, the payload `eval.registry.write_result` writes (``to_json``: the
summary with per-item records for `eval compare`), the metrics a training run logs, and what the tables need.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Literal

from chessgrpo.config import EngineConfig
from chessgrpo.errors import InputError
from chessgrpo.eval.running import EvalContext, Subject, interval_metrics, policy_player
from chessgrpo.paths import PUZZLES_DEFAULT

BASELINE_POLICIES = ("random", "stockfish")


@dataclasses.dataclass
class EvalConfig:
    """`chessgrpo eval offline|puzzles`: offline move metrics and Lichess puzzles."""

    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """The Stockfish pool (processes, cache, ...). Its nodes/depth apply only when `nodes` is null.
    Its syzygy_path gives a searching --checkpoint policy exact 3-4-piece values (null = none)."""
    nodes: int | None = 2000
    """Node limit for labelling unlabelled positions and valuing every move (label and chosen
    move alike, positions after the move); null = the pool's own limit (engine.nodes/engine.depth)."""
    positions: str | None = "data/tiny"
    """`eval offline` positions: a dataset directory (its test split), .parquet, .epd/.fen/.txt or .pgn."""
    puzzles: str = PUZZLES_DEFAULT
    """`eval puzzles` input: a Lichess puzzle CSV, plain or compressed (.csv.zst as Lichess publishes it, .csv.gz)."""
    epd: str | None = None
    """`eval epd` input: an EPD test suite scored by its bm/am operations (--epd overrides)."""
    max_positions: int = 1000
    """Positions sampled (seeded) from `positions`; the bootstrap intervals shrink like 1/sqrt(n)."""
    max_puzzles: int = 500
    """Puzzles sampled (seeded) from `puzzles`."""
    min_theme_puzzles: int = 20
    """`eval puzzles`: a Lichess theme is reported when at least this many puzzles carry it."""
    rating_bands: list[int] = dataclasses.field(default_factory=lambda: [1000, 1400, 1800, 2200])
    """`eval puzzles`: increasing edges of the rating bands ([1000, 1400] = <1000, 1000-1399, >=1400)."""
    baseline_nodes: int = 50
    """Node budget of the Stockfish baseline (see `chessgrpo.play.players.DEFAULT_BASELINE_NODES`)."""
    baselines: bool = True
    """Also evaluate the random and Stockfish baselines on the same positions."""
    seed: int = 0
    """Seed of the position/puzzle sample, the random player, sampling and the bootstrap."""
    confidence: float = 0.95
    """Confidence level of every interval."""
    resamples: int = 2000
    """Bootstrap resamples for the offline intervals."""
    batch_size: int = 256
    """Positions per player call and per engine batch."""
    temperature: float = 0.0
    """Sampling temperature of a --checkpoint policy; 0 = argmax over legal moves."""
    device: str = "cpu"
    """Torch device for a --checkpoint policy."""
    search_nodes: int = 0
    """A --checkpoint policy's search budget per position (PUCT simulations or alpha-beta network
    evaluations); 0 = no search, the policy's argmax. Needs a checkpoint with a value head."""
    search_algorithm: Literal["puct", "alphabeta"] = "puct"
    """puct (policy-guided MCTS) or alphabeta (policy-pruned negamax); see `chessgrpo.search`."""
    search_c_puct: float = 1.5
    """PUCT exploration weight."""
    search_batch_size: int = 16
    """PUCT leaves per network call."""
    output: str | None = None
    """If set, write the full result (config, metrics, per-position records) as JSON here."""

    def __post_init__(self) -> None:
        if self.min_theme_puzzles < 1:
            raise InputError(f"min_theme_puzzles must be >= 1, got {self.min_theme_puzzles}")
        edges = list(self.rating_bands)
        if not edges or any(b <= a for a, b in zip(edges, edges[1:])):
            raise InputError(f"rating_bands must be one or more strictly increasing integers, got {edges}")


def resolve_syzygy(config: EvalConfig, needed: bool) -> EvalConfig:
    """engine.syzygy_path found from any current directory (`chessgrpo.paths`): an error naming
    where it looked when a search will open it (`needed`), else left as is when it is not found."""
    from chessgrpo.paths import resolve_optional

    syzygy = resolve_optional(config.engine.syzygy_path, "Syzygy directory (engine.syzygy_path)", required=needed)
    return dataclasses.replace(config, engine=dataclasses.replace(config.engine, syzygy_path=syzygy))


def resolve_input(path: str, what: str) -> str:
    """An input file's path found from any current directory; one clear error naming where it looked."""
    from chessgrpo.paths import resolve_data_path

    return str(resolve_data_path(path, what))


def search_for(subject: Subject, config: EvalConfig) -> Any:
    """The evaluated policy's `SearchSettings` from the search_* keys; None for no search.

    Raises:
        ValueError: a bad search_* value, or a search budget for a --policy baseline.
    """
    from chessgrpo.play.players import search_settings

    search = search_settings(
        config.search_nodes,
        config.search_algorithm,
        config.search_c_puct,
        config.search_batch_size,
        config.engine.syzygy_path,
    )
    if search is not None and subject.policy is not None:
        raise InputError(
            f"search_nodes={config.search_nodes}: only a --checkpoint policy searches, not --policy {subject.policy}"
        )
    return search


def players(subject: Subject, config: EvalConfig, pool: Any, stack: contextlib.ExitStack) -> tuple[Any, dict[str, Any]]:
    """The evaluated player and the baselines to show beside it (a baseline is never shown twice).

    A searching policy's tablebase is released when `stack` closes.
    """
    from chessgrpo.play.players import RandomPlayer, StockfishPlayer

    def baseline(name: str) -> Any:
        return RandomPlayer(config.seed) if name == "random" else StockfishPlayer(pool, config.baseline_nodes)

    search = search_for(subject, config)
    if search is not None and config.device == "cpu":
        import torch

        # A search sends batches of ~16 positions: extra threads only add hand-off latency (and
        # oversubscribe the cores beside the engine processes); measured 4-70x slower with the default.
        torch.set_num_threads(1)
    if subject.policy is None:
        main = policy_player(
            subject,
            device=config.device,
            temperature=config.temperature,
            batch_size=config.batch_size,
            seed=config.seed,
            search=search,
        )
        stack.callback(main.close)
    else:
        main = baseline(subject.policy)
    names = [name for name in BASELINE_POLICIES if name != subject.policy] if config.baselines else []
    return main, {name: baseline(name) for name in names}


def search_record(player: Any) -> dict | None:
    """The evaluated player's search settings for the JSON summary (None: no search)."""
    search = getattr(player, "search", None)
    return dataclasses.asdict(search) if search is not None else None


def needs_pool(subject: Subject, config: EvalConfig) -> bool:
    """Whether Stockfish plays (the stockfish policy or baseline)."""
    return subject.policy == "stockfish" or config.baselines


@dataclasses.dataclass
class PlayerResults:
    """One evaluation of a player beside its baselines: the config it ran with, each player's result ("player"
    first, then the baselines), the JSON summary, how many items were evaluated from how many read, and the
    player's metrics a training run logs (`metrics`: ``eval/<metric_prefix><name>`` of `metric_names`)."""

    config: EvalConfig
    results: dict[str, Any]
    summary: dict[str, Any]
    items: int
    skipped: int = 0
    metric_names: tuple[str, ...] = ()
    metric_prefix: str = ""

    @property
    def main(self) -> Any:
        return self.results["player"]

    def to_json(self) -> dict[str, Any]:
        """The result file's payload: the summary and every player's per-item records."""
        return {**self.summary, "records": _records(self.results)}

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The player's metrics with their interval bounds (``eval/top1``, ``eval/puzzle_solve_rate``, ...)."""
        return interval_metrics(
            {name: getattr(self.main, name) for name in self.metric_names}, prefix + self.metric_prefix
        )


def _summary(
    player: Any, results: dict[str, Any], baselines: dict[str, Any], config: EvalConfig, source: dict
) -> dict[str, Any]:
    """The JSON summary of a puzzle or EPD evaluation: the player's result, the search, the baselines' results."""
    return {
        **results["player"].to_json(),
        "search": search_record(player),
        "baselines": {name: {k: v for k, v in results[name].to_json().items() if k != "player"} for name in baselines},
        **source,
        "baseline_nodes": config.baseline_nodes,
        "confidence": config.confidence,
    }


def _records(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {name: [r.to_json() for r in result.records] for name, result in results.items()}


OFFLINE_METRICS = ("top1", "esl", "blunder_rate")


@contextlib.contextmanager
def _engine_pool(config: EvalConfig, context: EvalContext, needed: bool = True) -> Iterator[Any]:
    """The pool the caller lent, else one started from ``config.engine`` (stopped after) when `needed`, else None."""
    if context.pool is not None or not needed:
        yield context.pool
        return
    from chessgrpo.engine import EnginePool

    with EnginePool.from_config(config.engine) as pool:
        yield pool


def run_offline(config: EvalConfig, subject: Subject, context: EvalContext) -> PlayerResults:
    """Top-1 agreement, expected-score loss and blunder rate on `config.positions` (`eval.offline`): the runner of
    the registry's ``offline``. The positions are ``context.items["offline"]`` when given (a re-measure's unseen
    ones), else sampled from `config.positions`, labelled once and kept there."""
    from chessgrpo.eval.offline import evaluate_offline
    from chessgrpo.eval.positions import load_eval_positions

    positions = context.items.get("offline")
    if positions is None:
        if not config.positions:
            raise InputError("no evaluation positions: pass --positions FILE or set positions=PATH")
        config = dataclasses.replace(config, positions=resolve_input(config.positions, "evaluation positions"))
    progress = context.progress
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(_engine_pool(config, context))
        player, baselines = players(subject, config, pool, stack)
        if positions is None:
            with progress(config.max_positions, "labelling") as bar:
                positions = load_eval_positions(
                    config.positions,  # type: ignore[arg-type]
                    config.max_positions,
                    config.seed,
                    pool=pool,
                    nodes=config.nodes,
                    progress=bar.update,
                )
            context.items["offline"] = positions
        results = {}
        for name, each in [("player", player), *baselines.items()]:
            with progress(len(positions), f"offline {each.name}") as bar:
                results[name] = evaluate_offline(
                    each,
                    positions,
                    pool,
                    nodes=config.nodes,
                    batch_size=config.batch_size,
                    confidence=config.confidence,
                    resamples=config.resamples,
                    seed=config.seed,
                    progress=bar.update,
                )
        engine_name = pool.engine_name
        valuation = f"nodes={config.nodes}" if config.nodes is not None else str(pool.default_limit)

    main = results["player"]
    summary = {
        "player": player.name,
        "search": search_record(player),
        **{metric: getattr(main, metric).to_json() for metric in OFFLINE_METRICS},
        "baselines": {
            name: {metric: getattr(results[name], metric).to_json() for metric in OFFLINE_METRICS} for name in baselines
        },
        "positions": {"source": str(config.positions), "n": len(positions)},
        "engine": engine_name,
        "valuation": valuation,
        "baseline_nodes": config.baseline_nodes,
        "confidence": config.confidence,
    }
    return PlayerResults(config, results, summary, len(positions), metric_names=OFFLINE_METRICS)


def _every_player(
    subject: Subject,
    config: EvalConfig,
    context: EvalContext,
    label: str,
    count: int,
    solve: Callable[[Any, Callable[[int], None]], Any],
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(player, baselines, results by name): ``solve(player, progress_update)`` for the player and each baseline,
    each with its own progress bar, over an engine pool when one of them needs it."""
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(_engine_pool(config, context, needed=needs_pool(subject, config)))
        player, baselines = players(subject, config, pool, stack)
        results = {}
        for name, each in [("player", player), *baselines.items()]:
            with context.progress(count, f"{label} {each.name}") as bar:
                results[name] = solve(each, bar.update)
    return player, baselines, results


PUZZLE_METRICS = ("first_move_accuracy", "solve_rate")


def run_puzzles(config: EvalConfig, subject: Subject, context: EvalContext) -> PlayerResults:
    """First-move accuracy and solve rate on `config.puzzles`, by rating band and theme (`eval.puzzles`): the
    runner of the registry's ``puzzles``. The puzzles are ``context.items["puzzles"]`` (a `PuzzleSet`) when given,
    else sampled from `config.puzzles` and kept there."""
    from chessgrpo.eval.puzzles import rating_bands, read_puzzles, solve_puzzles

    bands = rating_bands(config.rating_bands)
    puzzle_set = context.items.get("puzzles")
    if puzzle_set is None:
        config = dataclasses.replace(config, puzzles=resolve_input(config.puzzles, "puzzle file"))
        puzzle_set = context.items["puzzles"] = read_puzzles(config.puzzles, config.max_puzzles, config.seed)
    puzzles = puzzle_set.puzzles
    player, baselines, results = _every_player(
        subject,
        config,
        context,
        "puzzles",
        len(puzzles),
        lambda each, update: solve_puzzles(
            each,
            puzzles,
            confidence=config.confidence,
            progress=update,
            rating_bands=bands,
            min_theme_puzzles=config.min_theme_puzzles,
        ),
    )
    source = {"puzzles": {"source": str(config.puzzles), "n": len(puzzles), "skipped": len(puzzle_set.skipped)}}
    summary = _summary(player, results, baselines, config, source)
    return PlayerResults(
        config,
        results,
        summary,
        len(puzzles),
        len(puzzle_set.skipped),
        metric_names=PUZZLE_METRICS,
        metric_prefix="puzzle_",
    )


def run_epd(config: EvalConfig, subject: Subject, context: EvalContext) -> PlayerResults:
    """The share of an EPD suite's positions solved by its bm/am operations (`eval.epd`): the runner of the
    registry's ``epd`` (the suite: ``context.items["epd"]``, an `EpdSuite`, when given)."""
    from chessgrpo.eval.epd import read_epd, solve_epd

    suite = context.items.get("epd")
    if suite is None:
        if not config.epd:
            raise InputError("no EPD suite: pass --epd FILE or set epd=PATH")
        epd = resolve_input(config.epd, "EPD suite")
        config = dataclasses.replace(config, epd=epd)
        suite = context.items["epd"] = read_epd(epd)
    positions = suite.positions
    player, baselines, results = _every_player(
        subject,
        config,
        context,
        "epd",
        len(positions),
        lambda each, update: solve_epd(
            each,
            positions,
            confidence=config.confidence,
            batch_size=config.batch_size,
            progress=update,
        ),
    )
    source = {"epd": {"source": str(config.epd), "n": len(positions), "skipped": len(suite.skipped)}}
    summary = _summary(player, results, baselines, config, source)
    return PlayerResults(
        config, results, summary, len(positions), len(suite.skipped), metric_names=("solved",), metric_prefix="epd_"
    )
