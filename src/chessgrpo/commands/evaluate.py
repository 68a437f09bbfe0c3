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
    chessgrpo eval NAME (--checkpoint PATH | --policy NAME) [--json] [--config F] [key=value ...]
                        (an evaluation added to the registry without a command of its own)

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

Every `eval NAME` command runs its evaluation through the registry (`run_registered`: `eval.registry`'s runner,
then its one writer of result files, `write_result`, at ``output=FILE``); this module parses flags and renders.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, cast

from chessgrpo.commands.common import add_config_arguments, add_search_arguments, positive_int, run_registered
from chessgrpo.config import load_config
from chessgrpo.errors import InputError
from chessgrpo.eval.running import EvalContext, Subject
from chessgrpo.eval.standalone import (
    BASELINE_POLICIES,
    EvalConfig,
    PlayerResults,
    resolve_input,
    resolve_syzygy,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="evaluate a policy: offline move metrics, Lichess puzzles, paired comparisons, games against anchors",
    )
    sub = evaluate.add_subparsers(dest="eval_command", required=True, metavar="SUBCOMMAND")
    _add_player_parsers(sub)
    _add_compare_and_value_parsers(sub)

    from chessgrpo.commands.games import add_games_parser  # games against anchors: its own module

    add_games_parser(sub)

    from chessgrpo.commands.endgame import add_endgame_parser  # endgames against the perfect defender

    add_endgame_parser(sub)

    from chessgrpo.commands.rookworld import add_eval_parser as add_lm_parser  # chess LM: RookWorld task metrics

    add_lm_parser(sub)
    _add_registered_parsers(sub)


def _add_player_parsers(sub: argparse._SubParsersAction) -> None:
    """`eval offline|puzzles|epd`: one player (a checkpoint or a baseline) beside the baselines."""
    offline = sub.add_parser(
        "offline", help="top-1 agreement, expected-score loss and blunder rate on held-out positions"
    )
    _add_player_arguments(offline)
    offline.add_argument("--positions", help="dataset dir, .parquet, .epd/.fen/.txt (one position per line) or .pgn")
    offline.add_argument(
        "--max-positions", type=positive_int, help="positions to sample (default: config max_positions)"
    )
    add_search_arguments(offline)
    offline.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(offline)
    offline.set_defaults(handler=run_offline)

    puzzles = sub.add_parser("puzzles", help="first-move accuracy and solve rate on Lichess puzzles, by rating")
    _add_player_arguments(puzzles)
    puzzles.add_argument("--puzzles", help="Lichess puzzle CSV, also .csv.zst or .csv.gz (default: config puzzles)")
    puzzles.add_argument("--max-puzzles", type=positive_int, help="puzzles to sample (default: config max_puzzles)")
    puzzles.add_argument(
        "--min-theme-puzzles",
        type=positive_int,
        help="report a theme with at least N puzzles (default: config min_theme_puzzles, 20)",
    )
    puzzles.add_argument(
        "--rating-bands",
        type=_rating_edges,
        help="rating band edges, e.g. 1000,1400,1800,2200 (default: config rating_bands)",
    )
    add_search_arguments(puzzles)
    puzzles.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(puzzles)
    puzzles.set_defaults(handler=run_puzzles)

    epd = sub.add_parser(
        "epd", help="share of an EPD test suite solved: best moves (bm) found, moves to avoid (am) avoided"
    )
    _add_player_arguments(epd)
    epd.add_argument("--epd", help="EPD file with bm/am operations, also .gz or .zst (default: config epd)")
    add_search_arguments(epd)
    epd.add_argument(
        "-v", "--verbose", dest="list_positions", action="store_true", help="one line per position (id, move, bm/am)"
    )
    epd.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(epd)
    epd.set_defaults(handler=run_epd)


def _add_compare_and_value_parsers(sub: argparse._SubParsersAction) -> None:
    """`eval compare` (paired B - A of two result files) and `eval value` (value-head quality)."""
    compare = sub.add_parser(
        "compare",
        help="paired difference B - A of two `eval offline|puzzles|endgame ... output=FILE` results, with intervals",
    )
    compare.add_argument("a", type=Path, help="evaluation JSON of player A (the baseline, e.g. before GRPO)")
    compare.add_argument("b", type=Path, help="evaluation JSON of player B (e.g. after GRPO)")
    compare.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    compare.add_argument("--resamples", type=positive_int, default=2000, help="bootstrap resamples (default 2000)")
    compare.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    compare.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    compare.set_defaults(handler=run_compare)

    value = sub.add_parser(
        "value",
        help="value-head quality on held-out positions: MAE against the engine's values, a constant baseline, calibration",
    )
    value.add_argument(
        "--checkpoint", type=Path, required=True, help="policy checkpoint or run directory (with a value head)"
    )
    value.add_argument(
        "--data",
        type=Path,
        default=Path("data/tiny"),
        help="dataset directory (default data/tiny): its test split is scored, its train split gives the constant",
    )
    value.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    value.add_argument("--output", type=Path, help="also write the JSON summary here")
    value.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    value.set_defaults(handler=run_value)


def _add_registered_parsers(sub: argparse._SubParsersAction) -> None:
    """`eval NAME` for every evaluation of the registry that runs and has no command of its own (one added with
    `eval.registry.register`): its config file and ``key=value`` overrides, the subject, ``--json``."""
    from chessgrpo.eval.registry import EVALUATIONS

    for entry in EVALUATIONS.values():
        if not entry.runnable or entry.name in sub.choices:
            continue
        parser = sub.add_parser(entry.name, help=f"the registered evaluation {entry.name!r} (config keys: key=value)")
        player = parser.add_mutually_exclusive_group(required=True)
        player.add_argument("--checkpoint", type=Path, help="checkpoint directory or run directory (its latest)")
        player.add_argument("--policy", help="evaluate a baseline by name instead of a checkpoint")
        parser.add_argument(
            "--json", action="store_true", help="print one JSON object (the summary) instead of a table"
        )
        add_config_arguments(parser)
        parser.set_defaults(handler=run_registered_command, evaluation=entry.name)


def run_registered_command(args: argparse.Namespace) -> int:
    """`eval NAME` of a registered evaluation: its config, run through the registry, its summary or metrics."""
    from chessgrpo.eval.registry import evaluation

    entry = evaluation(args.evaluation)
    config: Any = load_config(entry.config_class(), args.config, args.overrides)
    output = run_registered(entry.name, config, _subject(args), EvalContext(progress=_progress))
    if args.json:
        print(json.dumps({key: value for key, value in output.to_json().items() if key != "records"}))
        return 0
    metrics = output.metrics("")
    print(f"{entry.name}: {_subject(args).label}")
    for key, value in metrics.items():
        if key.endswith(("_low", "_high")):
            continue
        bounds = f" [{metrics[key + '_low']:.4f}, {metrics[key + '_high']:.4f}]" if key + "_low" in metrics else ""
        print(f"  {key:<28} {value:.4f}{bounds}")
    return 0


def _add_player_arguments(parser: argparse.ArgumentParser) -> None:
    player = parser.add_mutually_exclusive_group(required=True)
    player.add_argument(
        "--checkpoint", type=Path, help="policy checkpoint directory or run directory (its latest checkpoint)"
    )
    player.add_argument("--policy", choices=BASELINE_POLICIES, help="evaluate a baseline instead of a checkpoint")


def _rating_edges(text: str) -> list[int]:
    """An argparse type: comma-separated increasing integers (rating band edges)."""
    from chessgrpo.eval.puzzles import rating_bands

    try:
        edges = [int(part) for part in text.split(",")]
        rating_bands(edges)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected increasing integers like 1000,1400,1800,2200, got {text!r}"
        ) from None
    return edges


# --------------------------------------------------------------------------------------------
# Shared plumbing


def _load(args: argparse.Namespace, **flags: Any) -> EvalConfig:
    config = load_config(EvalConfig, args.config, args.overrides)
    flags.update(search_nodes=args.search_nodes, search_algorithm=args.search_algorithm)
    config = dataclasses.replace(config, **{key: value for key, value in flags.items() if value is not None})
    return resolve_syzygy(config, needed=args.checkpoint is not None and config.search_nodes > 0)


def _subject(args: argparse.Namespace) -> Subject:
    return Subject(checkpoint=args.checkpoint, policy=args.policy)


def _label(name: str, config: EvalConfig) -> str:
    return f"stockfish ({config.baseline_nodes} nodes)" if name == "stockfish" else name


def _labels(run: PlayerResults) -> tuple[dict[str, str], int]:
    """Each player's table label and the width of the label column."""
    labels = {name: _label(result.player, run.config) for name, result in run.results.items()}
    return labels, max(len(label) for label in labels.values())


def _progress(total: int, description: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="pos", file=sys.stderr, disable=None, leave=False)


def _row(label: str, cells: list[str], width: int) -> str:
    return f"{label:<{width}}" + "".join(f"  {cell:<29}" for cell in cells)


def _short(interval: Any) -> str:
    """An interval as "value [low, high]", without its "(n=...)"."""
    return interval.format().split(" (n=")[0]


# --------------------------------------------------------------------------------------------
# eval offline


def run_offline(args: argparse.Namespace) -> int:
    from chessgrpo.eval.standalone import OFFLINE_METRICS

    config = _load(args, positions=args.positions, max_positions=args.max_positions)
    run = cast(PlayerResults, run_registered("offline", config, _subject(args), EvalContext(progress=_progress)))
    if args.json:
        print(json.dumps(run.summary))
        return 0
    config, summary = run.config, run.summary
    labels, width = _labels(run)
    print(
        f"offline eval: {run.items} positions from {config.positions}; moves valued by {summary['engine']} at {summary['valuation']}; "
        f"{100 * config.confidence:g}% bootstrap intervals"
    )
    print(_row("player", ["top-1 agreement (higher)", "expected-score loss (lower)", "blunder rate (lower)"], width))
    for name, result in run.results.items():
        print(_row(labels[name], [_short(getattr(result, m)) for m in OFFLINE_METRICS], width))
    return 0


# --------------------------------------------------------------------------------------------
# eval value and eval compare


def run_value(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from chessgrpo.data.schema import read_positions
    from chessgrpo.eval.value import ValueEvalConfig, ValueItems, ValueRun, require_value_head
    from chessgrpo.models.policy import load_policy, resolve_checkpoint
    from chessgrpo.train.dataset import load_split

    args.data = Path(resolve_input(args.data, "dataset"))
    config = ValueEvalConfig(
        data=str(args.data), confidence=args.confidence, output=str(args.output) if args.output else None
    )
    model = load_policy(args.checkpoint)
    require_value_head(model, str(args.checkpoint))
    # The positions as the model reads them (its move facts): the training data loader, a layer above eval/.
    test = load_split(args.data, "test", move_facts=model.config.move_facts, extra_facts=model.config.extra_facts)
    batch = test.batch(torch.arange(len(test)))
    train_values = read_positions(args.data, "train", ["value"]).column("value").to_numpy(zero_copy_only=False)
    items = ValueItems(batch.tokens, batch.win_probs[:, 0].numpy(), float(np.mean(train_values)))
    subject = Subject(model=model, name=str(resolve_checkpoint(args.checkpoint)))
    run = cast(ValueRun, run_registered("value", config, subject, EvalContext(items={"value": items})))
    summary, quality, baseline = run.to_json(), run.quality, items.baseline
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"value head of {summary['checkpoint']} on {run.n} held-out positions of {args.data} ({100 * args.confidence:g}% bootstrap intervals)"
    )
    print(f"  MAE                      {quality.mae}")
    print(f"  constant {baseline:.3f} MAE       {quality.baseline_mae}")
    print(f"  gain over the constant   {quality.mae_gain}")
    print(f"  calibration error (ECE)  {quality.ece:.3f}")
    print("  predicted bin   n      mean predicted  mean target")
    for row in quality.calibration:
        print(
            f"  [{row['low']:.1f}, {row['high']:.1f})  {row['n']:>5}  {row['mean_predicted']:>14.3f}  {row['mean_target']:>11.3f}"
        )
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from chessgrpo.eval.compare import compare_files, format_comparison

    if not 0 < args.confidence < 1:
        raise InputError(f"--confidence must be in (0, 1), got {args.confidence}")
    comparison = compare_files(args.a, args.b, confidence=args.confidence, resamples=args.resamples, seed=args.seed)
    print(json.dumps(comparison.to_json()) if args.json else format_comparison(comparison, args.confidence))
    return 0


# --------------------------------------------------------------------------------------------
# eval puzzles


def run_puzzles(args: argparse.Namespace) -> int:
    from chessgrpo.eval.puzzles import rating_bands

    config = _load(
        args,
        puzzles=args.puzzles,
        max_puzzles=args.max_puzzles,
        min_theme_puzzles=args.min_theme_puzzles,
        rating_bands=args.rating_bands,
    )
    run = cast(PlayerResults, run_registered("puzzles", config, _subject(args), EvalContext(progress=_progress)))
    if args.json:
        print(json.dumps(run.summary))
        return 0
    config, results, main = run.config, run.results, run.main
    labels, width = _labels(run)
    print(
        f"puzzles: {run.items} from {config.puzzles} ({run.skipped} malformed rows skipped); "
        f"{100 * config.confidence:g}% Wilson intervals"
    )
    print(_row("player", ["first-move accuracy", "solve rate"], width))
    for name, result in results.items():
        print(_row(labels[name], [_short(result.first_move_accuracy), _short(result.solve_rate)], width))
    print("\nsolve rate by rating")
    bands = rating_bands(config.rating_bands)
    bucket_width = max(len(name) for name, _, _ in bands)
    print(f"{'rating':<{bucket_width}}  {'n':>5}" + "".join(f"  {labels[name]:<29}" for name in results))
    for bucket, _, _ in bands:
        if bucket not in main.by_rating:
            continue
        n = main.by_rating[bucket]["solve_rate"].n
        cells = "".join(f"  {_short(results[name].by_rating[bucket]['solve_rate']):<29}" for name in results)
        print(f"{bucket:<{bucket_width}}  {n:>5}{cells}")
    _print_puzzle_groups(main, labels["player"], config.min_theme_puzzles)
    return 0


def _print_puzzle_groups(main: Any, label: str, min_theme_puzzles: int) -> None:
    """The player's accuracy and solve rate by rating band, by the solution's first move and by theme."""
    print(f"\n{label} by rating band and by theme (themes of >= {min_theme_puzzles} puzzles)")
    groups = [(f"rating {band}", metrics) for band, metrics in main.by_rating.items()]
    groups += [(f"solution {kind}", metrics) for kind, metrics in main.by_solution.items()]
    groups += [(f"theme {theme}", metrics) for theme, metrics in main.by_theme.items()]
    group_width = max(len(name) for name, _ in groups)
    print(f"{'group':<{group_width}}  {'n':>5}  {'first-move accuracy':<29}  {'solve rate':<29}")
    for group, metrics in groups:
        cells = [_short(metrics[key]) for key in ("first_move_accuracy", "solve_rate")]
        print(f"{group:<{group_width}}  {metrics['solve_rate'].n:>5}" + "".join(f"  {cell:<29}" for cell in cells))
    if main.played_check_rate is not None:
        check_first = main.by_solution.get("check first")
        share = check_first["solve_rate"].n / max(main.solve_rate.n, 1) if check_first else 0.0
        print(
            f"first moves that give check: {_short(main.played_check_rate)} of the player's, "
            f"{share:.3f} of the solutions'"
        )
    if not main.by_theme:
        print(f"(no theme has {min_theme_puzzles} puzzles; lower it with --min-theme-puzzles)")


# --------------------------------------------------------------------------------------------
# eval epd


def run_epd(args: argparse.Namespace) -> int:
    config = _load(args, epd=args.epd)
    run = cast(PlayerResults, run_registered("epd", config, _subject(args), EvalContext(progress=_progress)))
    if args.json:
        print(json.dumps(run.summary))
        return 0
    config, main = run.config, run.main
    labels, width = _labels(run)
    print(
        f"epd: {run.items} positions from {config.epd} ({run.skipped} bad lines skipped); "
        f"solved = a bm move played and no am move; {100 * config.confidence:g}% Wilson intervals"
    )
    print(_row("player", ["solved", "solve rate"], width))
    for name, result in run.results.items():
        print(_row(labels[name], [f"{result.solved_count}/{run.items}", _short(result.solved)], width))
    if args.list_positions or getattr(args, "verbose", False):
        print(f"\n{labels['player']}, position by position")
        for record in main.records:
            expected = "; ".join(
                f"{opcode} {' '.join(moves)}" for opcode, moves in (("bm", record.bm), ("am", record.am)) if moves
            )
            name = record.id if record.id is not None else f"line {record.line}"
            print(f"  {'solved' if record.solved else 'missed'}  {name}: played {record.san} ({expected})")
    return 0
