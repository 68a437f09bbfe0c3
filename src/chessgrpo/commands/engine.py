"""`chessgrpo engine eval`: evaluate positions with the Stockfish pool."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from chessgrpo.commands.common import add_config_arguments
from chessgrpo.config import EngineEvalConfig, load_config, save_config
from chessgrpo.files import write_text_atomic


def add_parser(commands: argparse._SubParsersAction) -> None:
    engine = commands.add_parser("engine", help="engine pool utilities")
    engine_commands = engine.add_subparsers(dest="engine_command", required=True, metavar="SUBCOMMAND")
    evaluate = engine_commands.add_parser(
        "eval", help="evaluate positions with the Stockfish pool (FENs, a FEN/EPD file, or seeded random playouts)"
    )
    add_config_arguments(evaluate)
    evaluate.add_argument("--fen", action="append", default=[], help="a position to evaluate (repeatable)")
    evaluate.add_argument("--file", type=Path, help="UTF-8 text file with one FEN or EPD per line")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object per position instead of a table")
    evaluate.set_defaults(handler=run_engine_eval)


def run_engine_eval(args: argparse.Namespace) -> int:
    """Evaluate positions with the pool; print a table (or JSON lines) and a throughput summary."""
    from tqdm import tqdm

    from chessgrpo.board.sources import random_playout_positions, read_fen_file
    from chessgrpo.board.validation import parse_board
    from chessgrpo.engine import EnginePool

    config = load_config(EngineEvalConfig, args.config, args.overrides)
    if args.fen or args.file:
        boards = [parse_board(fen) for fen in args.fen]
        if args.file:
            boards += list(read_fen_file(args.file))
    else:
        boards = random_playout_positions(config.random_positions, seed=config.run.seed, max_plies=config.max_plies)
    run_dir = config.run.directory
    save_config(config, run_dir / "config.yaml")

    started = time.perf_counter()
    with EnginePool.from_config(config.engine) as pool:
        with tqdm(total=len(boards), desc="evaluating", unit="pos", disable=args.json or None, file=sys.stderr) as bar:
            evaluations = pool.evaluate(boards, progress=bar.update)
        elapsed = time.perf_counter() - started
        stats = pool.stats
        engine_name, processes = pool.engine_name, pool.processes
        limit = str(pool.default_limit)

    out_path = write_text_atomic(  # never half-written
        run_dir / "evaluations.jsonl", "".join(json.dumps(dataclasses.asdict(e)) + "\n" for e in evaluations)
    )
    if args.json:
        for evaluation in evaluations:
            print(json.dumps(dataclasses.asdict(evaluation)))
        return 0
    if len(evaluations) <= 20:
        print(f"{'win%':>6} {'score':>8} {'best':>6}  position")
        for evaluation in evaluations:
            score = (
                f"#{evaluation.mate}"
                if evaluation.mate is not None
                else f"{evaluation.cp:+d}cp"
                if evaluation.cp is not None
                else "-"
            )
            print(
                f"{100 * evaluation.win_probability:6.1f} {score:>8} {evaluation.best_move or '-':>6}  {evaluation.fen}"
            )
    win = [e.win_probability for e in evaluations]
    print(
        f"\n{len(evaluations)} positions ({stats.searches} searched, {stats.cache_hits} from cache, "
        f"hit rate {100 * stats.cache_hit_rate:.0f}%) with {engine_name} x{processes} at {limit} "
        f"in {elapsed:.2f}s ({len(evaluations) / max(elapsed, 1e-9):.0f} positions/s, startup included)"
    )
    if win:
        print(f"mean win probability for the side to move: {sum(win) / len(win):.3f}")
    print(f"wrote {out_path} and {run_dir / 'config.yaml'}")
    return 0
