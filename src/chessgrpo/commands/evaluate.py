"""`chessgrpo eval offline|puzzles|epd|compare|games`: move quality, puzzle skill and playing strength, with intervals.

::

    chessgrpo eval offline (--checkpoint PATH | --policy random|stockfish) [--positions FILE]
                           [--max-positions N] [--search-nodes N] [--search-algorithm A]
                           [--json] [--config F] [key=value ...]
    chessgrpo eval puzzles (--checkpoint PATH | --policy random|stockfish) [--puzzles CSV[.zst|.gz]]
                           [--max-puzzles N] [--search-nodes N] [--search-algorithm A]
                           [--min-theme-puzzles N] [--rating-bands 1000,1400,1800,2200]
                           [--json] [--config F] [key=value ...]
    chessgrpo eval epd (--checkpoint PATH | --policy random|stockfish) --epd FILE [-v]
                       [--search-nodes N] [--search-algorithm A] [--json] [--config F] [key=value ...]
    chessgrpo eval compare A.json B.json [--json]
    chessgrpo eval games --checkpoint PATH --anchors random,sf-skill:0 --games N [...]   (commands/games.py)

`offline` reports top-1 agreement with Stockfish's best move, mean expected-score loss (ESL) and
blunder rate (ESL > 0.2) with percentile-bootstrap intervals (`chessgrpo.eval.offline`);
`puzzles` reports first-move accuracy and solve rate on Lichess puzzles with Wilson intervals,
overall, by rating band and by Lichess theme (`chessgrpo.eval.puzzles`); `epd` reports the share
of an EPD test suite's positions solved by its `bm`/`am` operations (`chessgrpo.eval.epd`); `compare` reads two results written
with ``output=FILE`` and reports B - A per metric with paired bootstrap intervals over the
positions or puzzles both hold (`chessgrpo.eval.compare`). Unless ``baselines=false``, a uniformly
random player and Stockfish at `baseline_nodes` are measured on the same positions and printed
beside the player, so a number always has context. Moves are valued at `nodes` (default 2000:
Stockfish at 2000 nodes agrees with itself as the label on ~98% of moves with a mean ESL of
0.001, far below the differences we care about, and 1000 positions with both baselines take
about a minute on 2 cores; raise it for final numbers). With ``--search-nodes N`` a --checkpoint
policy plays the move of a search with its value head (`chessgrpo.search`, N nodes per move,
one position at a time) instead of its argmax; the player's name and the JSON record the search.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Literal

from chessgrpo.commands.common import add_config_arguments
from chessgrpo.config import EngineConfig, load_config, to_dict

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
    puzzles: str = "../shared/data/lichess_puzzles_dev.csv"
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
    """Node budget of the Stockfish baseline (see `chessgrpo.eval.players.DEFAULT_BASELINE_NODES`)."""
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
            raise ValueError(f"min_theme_puzzles must be >= 1, got {self.min_theme_puzzles}")
        edges = list(self.rating_bands)
        if not edges or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"rating_bands must be one or more strictly increasing integers, got {edges}")


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("eval", help="evaluate a policy: offline move metrics, Lichess puzzles, paired comparisons, games against anchors")
    sub = evaluate.add_subparsers(dest="eval_command", required=True, metavar="SUBCOMMAND")

    offline = sub.add_parser("offline", help="top-1 agreement, expected-score loss and blunder rate on held-out positions")
    _add_player_arguments(offline)
    offline.add_argument("--positions", help="dataset dir, .parquet, .epd/.fen/.txt (one position per line) or .pgn")
    offline.add_argument("--max-positions", type=_positive_int, help="positions to sample (default: config max_positions)")
    add_search_arguments(offline)
    offline.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(offline)
    offline.set_defaults(handler=run_offline)

    puzzles = sub.add_parser("puzzles", help="first-move accuracy and solve rate on Lichess puzzles, by rating")
    _add_player_arguments(puzzles)
    puzzles.add_argument("--puzzles", help="Lichess puzzle CSV, also .csv.zst or .csv.gz (default: config puzzles)")
    puzzles.add_argument("--max-puzzles", type=_positive_int, help="puzzles to sample (default: config max_puzzles)")
    puzzles.add_argument(
        "--min-theme-puzzles", type=_positive_int, help="report a theme with at least N puzzles (default: config min_theme_puzzles, 20)"
    )
    puzzles.add_argument(
        "--rating-bands", type=_rating_edges, help="rating band edges, e.g. 1000,1400,1800,2200 (default: config rating_bands)"
    )
    add_search_arguments(puzzles)
    puzzles.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(puzzles)
    puzzles.set_defaults(handler=run_puzzles)

    epd = sub.add_parser("epd", help="share of an EPD test suite solved: best moves (bm) found, moves to avoid (am) avoided")
    _add_player_arguments(epd)
    epd.add_argument("--epd", help="EPD file with bm/am operations, also .gz or .zst (default: config epd)")
    add_search_arguments(epd)
    epd.add_argument("-v", "--verbose", dest="list_positions", action="store_true", help="one line per position (id, move, bm/am)")
    epd.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(epd)
    epd.set_defaults(handler=run_epd)

    compare = sub.add_parser(
        "compare", help="paired difference B - A of two `eval offline|puzzles|endgame ... output=FILE` results, with intervals"
    )
    compare.add_argument("a", type=Path, help="evaluation JSON of player A (the baseline, e.g. before GRPO)")
    compare.add_argument("b", type=Path, help="evaluation JSON of player B (e.g. after GRPO)")
    compare.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    compare.add_argument("--resamples", type=_positive_int, default=2000, help="bootstrap resamples (default 2000)")
    compare.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    compare.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    compare.set_defaults(handler=run_compare)

    value = sub.add_parser(
        "value",
        help="value-head quality on held-out positions: MAE against the engine's values, a constant baseline, calibration",
    )
    value.add_argument("--checkpoint", type=Path, required=True, help="policy checkpoint or run directory (with a value head)")
    value.add_argument("--data", type=Path, default=Path("data/tiny"), help="dataset directory (default data/tiny): its test split is scored, its train split gives the constant")
    value.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    value.add_argument("--output", type=Path, help="also write the JSON summary here")
    value.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    value.set_defaults(handler=run_value)

    from chessgrpo.commands.games import add_games_parser  # games against anchors: its own module

    add_games_parser(sub)

    from chessgrpo.commands.endgame import add_endgame_parser  # endgames against the perfect defender

    add_endgame_parser(sub)

    from chessgrpo.commands.rookworld import add_eval_parser as add_lm_parser  # chess LM: RookWorld task metrics

    add_lm_parser(sub)


def _add_player_arguments(parser: argparse.ArgumentParser) -> None:
    player = parser.add_mutually_exclusive_group(required=True)
    player.add_argument("--checkpoint", type=Path, help="policy checkpoint directory or run directory (its latest checkpoint)")
    player.add_argument("--policy", choices=BASELINE_POLICIES, help="evaluate a baseline instead of a checkpoint")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """`--search-nodes` and `--search-algorithm`: the evaluated policy's search (`eval offline|puzzles|games`)."""
    parser.add_argument(
        "--search-nodes", type=_non_negative_int, help="search budget per move with the value head; 0 = policy argmax (default: config search_nodes)"
    )
    parser.add_argument("--search-algorithm", choices=("puct", "alphabeta"), help="search algorithm (default: config search_algorithm)")


def _int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`, else one clear error."""
    wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _rating_edges(text: str) -> list[int]:
    """An argparse type: comma-separated increasing integers (rating band edges)."""
    from chessgrpo.eval.puzzles import rating_bands

    try:
        edges = [int(part) for part in text.split(",")]
        rating_bands(edges)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected increasing integers like 1000,1400,1800,2200, got {text!r}") from None
    return edges


# --------------------------------------------------------------------------------------------
# Shared plumbing


def _load(args: argparse.Namespace, **flags: Any) -> EvalConfig:
    config = load_config(EvalConfig, args.config, args.overrides)
    flags.update(search_nodes=args.search_nodes, search_algorithm=args.search_algorithm)
    config = dataclasses.replace(config, **{key: value for key, value in flags.items() if value is not None})
    return _resolve_syzygy(config, needed=args.checkpoint is not None and config.search_nodes > 0)


def _resolve_syzygy(config: EvalConfig, needed: bool) -> EvalConfig:
    """engine.syzygy_path found from any current directory (`chessgrpo.paths`): an error naming
    where it looked when a search will open it (`needed`), else left as is when it is not found."""
    from chessgrpo.paths import resolve_optional

    syzygy = resolve_optional(config.engine.syzygy_path, "Syzygy directory (engine.syzygy_path)", required=needed)
    return dataclasses.replace(config, engine=dataclasses.replace(config.engine, syzygy_path=syzygy))


def _resolve_input(path: str, what: str) -> str:
    """An input file's path found from any current directory; one clear error naming where it looked."""
    from chessgrpo.paths import resolve_data_path

    return str(resolve_data_path(path, what))


def _search(args: argparse.Namespace, config: EvalConfig) -> Any:
    """The --checkpoint policy's `SearchSettings` from the search_* keys; None for no search.

    Raises:
        ValueError: a bad search_* value, or a search budget for a --policy baseline.
    """
    from chessgrpo.eval.players import search_settings

    search = search_settings(
        config.search_nodes, config.search_algorithm, config.search_c_puct, config.search_batch_size, config.engine.syzygy_path
    )
    if search is not None and args.checkpoint is None:
        raise ValueError(f"search_nodes={config.search_nodes}: only a --checkpoint policy searches, not --policy {args.policy}")
    return search


def _players(args: argparse.Namespace, config: EvalConfig, pool: Any, stack: contextlib.ExitStack) -> tuple[Any, dict[str, Any]]:
    """The evaluated player and the baselines to show beside it (a baseline is never shown twice).

    A searching policy's tablebase is released when `stack` closes.
    """
    from chessgrpo.eval.players import PolicyPlayer, RandomPlayer, StockfishPlayer

    def baseline(name: str) -> Any:
        return RandomPlayer(config.seed) if name == "random" else StockfishPlayer(pool, config.baseline_nodes)

    search = _search(args, config)
    if search is not None and config.device == "cpu":
        import torch

        # A search sends batches of ~16 positions: extra threads only add hand-off latency (and
        # oversubscribe the cores beside the engine processes); measured 4-70x slower with the default.
        torch.set_num_threads(1)
    if args.checkpoint is not None:
        main = PolicyPlayer.from_checkpoint(
            args.checkpoint,
            device=config.device,
            temperature=config.temperature,
            batch_size=config.batch_size,
            seed=config.seed,
            search=search,
        )
        stack.callback(main.close)
    else:
        main = baseline(args.policy)
    names = [name for name in BASELINE_POLICIES if name != args.policy] if config.baselines else []
    return main, {name: baseline(name) for name in names}


def _search_record(player: Any) -> dict | None:
    """The evaluated player's search settings for the JSON summary (None: no search)."""
    search = getattr(player, "search", None)
    return dataclasses.asdict(search) if search is not None else None


def _needs_pool(args: argparse.Namespace, config: EvalConfig) -> bool:
    return args.policy == "stockfish" or config.baselines


def _label(name: str, config: EvalConfig) -> str:
    return f"stockfish ({config.baseline_nodes} nodes)" if name == "stockfish" else name


def _progress(total: int, description: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="pos", file=sys.stderr, disable=None, leave=False)


def _write_output(config: EvalConfig, payload: dict) -> None:
    if config.output:
        path = Path(config.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"config": to_dict(config), **payload}, indent=1))
        tmp.replace(path)


def _row(label: str, cells: list[str], width: int) -> str:
    return f"{label:<{width}}" + "".join(f"  {cell:<29}" for cell in cells)


# --------------------------------------------------------------------------------------------
# eval offline


def run_offline(args: argparse.Namespace) -> int:
    from chessgrpo.engine import EnginePool
    from chessgrpo.eval.offline import evaluate_offline
    from chessgrpo.eval.positions import load_eval_positions

    config = _load(args, positions=args.positions, max_positions=args.max_positions)
    if not config.positions:
        raise ValueError("no evaluation positions: pass --positions FILE or set positions=PATH")
    config = dataclasses.replace(config, positions=_resolve_input(config.positions, "evaluation positions"))
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(EnginePool.from_config(config.engine))
        player, baselines = _players(args, config, pool, stack)
        with _progress(config.max_positions, "labelling") as bar:
            positions = load_eval_positions(
                config.positions, config.max_positions, config.seed, pool=pool, nodes=config.nodes, progress=bar.update
            )
        results = {}
        for name, each in [("player", player), *baselines.items()]:
            with _progress(len(positions), f"offline {each.name}") as bar:
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

    metrics = ("top1", "esl", "blunder_rate")
    main = results["player"]
    summary = {
        "player": player.name,
        "search": _search_record(player),
        **{metric: getattr(main, metric).to_json() for metric in metrics},
        "baselines": {name: {metric: getattr(results[name], metric).to_json() for metric in metrics} for name in baselines},
        "positions": {"source": str(config.positions), "n": len(positions)},
        "engine": engine_name,
        "valuation": valuation,
        "baseline_nodes": config.baseline_nodes,
        "confidence": config.confidence,
    }
    _write_output(config, {**summary, "records": {name: [r.to_json() for r in result.records] for name, result in results.items()}})
    if args.json:
        print(json.dumps(summary))
        return 0
    labels = {name: _label(results[name].player, config) for name in results}
    width = max(len(label) for label in labels.values())
    print(
        f"offline eval: {len(positions)} positions from {config.positions}; moves valued by {engine_name} at {valuation}; "
        f"{100 * config.confidence:g}% bootstrap intervals"
    )
    print(_row("player", ["top-1 agreement (higher)", "expected-score loss (lower)", "blunder rate (lower)"], width))
    for name, result in results.items():
        print(_row(labels[name], [getattr(result, m).format().split(" (n=")[0] for m in metrics], width))
    return 0


# --------------------------------------------------------------------------------------------
# eval compare


def run_value(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from chessgrpo.data.schema import read_positions
    from chessgrpo.eval.value import predict_values, value_quality
    from chessgrpo.models.policy import load_policy, resolve_checkpoint
    from chessgrpo.train.dataset import load_split

    args.data = Path(_resolve_input(args.data, "dataset"))
    model = load_policy(args.checkpoint)
    if model.value_head is None:
        raise ValueError(f"checkpoint {str(args.checkpoint)!r} has no value head (pretrain one with model.value_head: true)")
    test = load_split(args.data, "test", move_facts=model.config.move_facts, extra_facts=model.config.extra_facts)
    batch = test.batch(torch.arange(len(test)))
    train_values = read_positions(args.data, "train", ["value"]).column("value").to_numpy(zero_copy_only=False)
    baseline = float(np.mean(train_values))
    quality = value_quality(predict_values(model, batch.tokens), batch.win_probs[:, 0].numpy(), baseline, confidence=args.confidence)
    summary = {"checkpoint": str(resolve_checkpoint(args.checkpoint)), "data": str(args.data), "n": len(test), **quality.to_json()}
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(summary, indent=1))
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"value head of {summary['checkpoint']} on {len(test)} held-out positions of {args.data} ({100 * args.confidence:g}% bootstrap intervals)")
    print(f"  MAE                      {quality.mae}")
    print(f"  constant {baseline:.3f} MAE       {quality.baseline_mae}")
    print(f"  gain over the constant   {quality.mae_gain}")
    print(f"  calibration error (ECE)  {quality.ece:.3f}")
    print("  predicted bin   n      mean predicted  mean target")
    for row in quality.calibration:
        print(f"  [{row['low']:.1f}, {row['high']:.1f})  {row['n']:>5}  {row['mean_predicted']:>14.3f}  {row['mean_target']:>11.3f}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from chessgrpo.eval.compare import compare_files, format_comparison

    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must be in (0, 1), got {args.confidence}")
    comparison = compare_files(args.a, args.b, confidence=args.confidence, resamples=args.resamples, seed=args.seed)
    print(json.dumps(comparison.to_json()) if args.json else format_comparison(comparison, args.confidence))
    return 0


# --------------------------------------------------------------------------------------------
# eval puzzles


def run_puzzles(args: argparse.Namespace) -> int:
    from chessgrpo.engine import EnginePool
    from chessgrpo.eval.puzzles import rating_bands, read_puzzles, solve_puzzles

    config = _load(
        args, puzzles=args.puzzles, max_puzzles=args.max_puzzles, min_theme_puzzles=args.min_theme_puzzles, rating_bands=args.rating_bands
    )
    bands = rating_bands(config.rating_bands)
    config = dataclasses.replace(config, puzzles=_resolve_input(config.puzzles, "puzzle file"))
    puzzle_set = read_puzzles(config.puzzles, config.max_puzzles, config.seed)
    puzzles = puzzle_set.puzzles
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(EnginePool.from_config(config.engine)) if _needs_pool(args, config) else None
        player, baselines = _players(args, config, pool, stack)
        results = {}
        for name, each in [("player", player), *baselines.items()]:
            with _progress(len(puzzles), f"puzzles {each.name}") as bar:
                results[name] = solve_puzzles(
                    each,
                    puzzles,
                    confidence=config.confidence,
                    progress=bar.update,
                    rating_bands=bands,
                    min_theme_puzzles=config.min_theme_puzzles,
                )

    main = results["player"]
    summary = {
        **main.to_json(),
        "search": _search_record(player),
        "baselines": {name: {k: v for k, v in results[name].to_json().items() if k != "player"} for name in baselines},
        "puzzles": {"source": str(config.puzzles), "n": len(puzzles), "skipped": len(puzzle_set.skipped)},
        "baseline_nodes": config.baseline_nodes,
        "confidence": config.confidence,
    }
    _write_output(config, {**summary, "records": {name: [r.to_json() for r in result.records] for name, result in results.items()}})
    if args.json:
        print(json.dumps(summary))
        return 0
    labels = {name: _label(results[name].player, config) for name in results}
    width = max(len(label) for label in labels.values())
    print(
        f"puzzles: {len(puzzles)} from {config.puzzles} ({len(puzzle_set.skipped)} malformed rows skipped); "
        f"{100 * config.confidence:g}% Wilson intervals"
    )
    print(_row("player", ["first-move accuracy", "solve rate"], width))
    for name, result in results.items():
        print(_row(labels[name], [result.first_move_accuracy.format().split(" (n=")[0], result.solve_rate.format().split(" (n=")[0]], width))
    print("\nsolve rate by rating")
    bucket_width = max(len(name) for name, _, _ in bands)
    print(f"{'rating':<{bucket_width}}  {'n':>5}" + "".join(f"  {labels[name]:<29}" for name in results))
    for bucket, _, _ in bands:
        if bucket not in main.by_rating:
            continue
        n = main.by_rating[bucket]["solve_rate"].n
        cells = "".join(f"  {results[name].by_rating[bucket]['solve_rate'].format().split(' (n=')[0]:<29}" for name in results)
        print(f"{bucket:<{bucket_width}}  {n:>5}{cells}")
    print(f"\n{labels['player']} by rating band and by theme (themes of >= {config.min_theme_puzzles} puzzles)")
    groups = [(f"rating {band}", metrics) for band, metrics in main.by_rating.items()]
    groups += [(f"solution {kind}", metrics) for kind, metrics in main.by_solution.items()]
    groups += [(f"theme {theme}", metrics) for theme, metrics in main.by_theme.items()]
    group_width = max(len(name) for name, _ in groups)
    print(f"{'group':<{group_width}}  {'n':>5}  {'first-move accuracy':<29}  {'solve rate':<29}")
    for group, metrics in groups:
        cells = [metrics[key].format().split(" (n=")[0] for key in ("first_move_accuracy", "solve_rate")]
        print(f"{group:<{group_width}}  {metrics['solve_rate'].n:>5}" + "".join(f"  {cell:<29}" for cell in cells))
    if main.played_check_rate is not None:
        check_first = main.by_solution.get("check first")
        share = check_first["solve_rate"].n / max(main.solve_rate.n, 1) if check_first else 0.0
        print(f"first moves that give check: {main.played_check_rate.format().split(' (n=')[0]} of the player's, "
              f"{share:.3f} of the solutions'")
    if not main.by_theme:
        print(f"(no theme has {config.min_theme_puzzles} puzzles; lower it with --min-theme-puzzles)")
    return 0


# --------------------------------------------------------------------------------------------
# eval epd


def run_epd(args: argparse.Namespace) -> int:
    from chessgrpo.engine import EnginePool
    from chessgrpo.eval.epd import read_epd, solve_epd

    config = _load(args, epd=args.epd)
    if not config.epd:
        raise ValueError("no EPD suite: pass --epd FILE or set epd=PATH")
    config = dataclasses.replace(config, epd=_resolve_input(config.epd, "EPD suite"))
    suite = read_epd(config.epd)
    positions = suite.positions
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(EnginePool.from_config(config.engine)) if _needs_pool(args, config) else None
        player, baselines = _players(args, config, pool, stack)
        results = {}
        for name, each in [("player", player), *baselines.items()]:
            with _progress(len(positions), f"epd {each.name}") as bar:
                results[name] = solve_epd(each, positions, confidence=config.confidence, batch_size=config.batch_size, progress=bar.update)

    main = results["player"]
    summary = {
        **main.to_json(),
        "search": _search_record(player),
        "baselines": {name: {k: v for k, v in results[name].to_json().items() if k != "player"} for name in baselines},
        "epd": {"source": str(config.epd), "n": len(positions), "skipped": len(suite.skipped)},
        "baseline_nodes": config.baseline_nodes,
        "confidence": config.confidence,
    }
    _write_output(config, {**summary, "records": {name: [r.to_json() for r in result.records] for name, result in results.items()}})
    if args.json:
        print(json.dumps(summary))
        return 0
    labels = {name: _label(results[name].player, config) for name in results}
    width = max(len(label) for label in labels.values())
    print(
        f"epd: {len(positions)} positions from {config.epd} ({len(suite.skipped)} bad lines skipped); "
        f"solved = a bm move played and no am move; {100 * config.confidence:g}% Wilson intervals"
    )
    print(_row("player", ["solved", "solve rate"], width))
    for name, result in results.items():
        print(_row(labels[name], [f"{result.solved_count}/{len(positions)}", result.solved.format().split(" (n=")[0]], width))
    if args.list_positions or getattr(args, "verbose", False):
        print(f"\n{labels['player']}, position by position")
        for record in main.records:
            expected = "; ".join(f"{opcode} {' '.join(moves)}" for opcode, moves in (("bm", record.bm), ("am", record.am)) if moves)
            name = record.id if record.id is not None else f"line {record.line}"
            print(f"  {'solved' if record.solved else 'missed'}  {name}: played {record.san} ({expected})")
    return 0
