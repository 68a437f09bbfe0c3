"""The `chessgrpo` command. Parses arguments, loads configs, renders progress; logic lives in the packages."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Sequence

from chessgrpo.config import ConfigError, EngineConfig, EngineEvalConfig, load_config, save_config

logger = logging.getLogger("chessgrpo")


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="YAML config file (defaults apply where it is silent)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides applied after the file, e.g. engine.nodes=5000"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chessgrpo", description="GRPO with verifiable rewards for chess policies.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    doctor = commands.add_parser("doctor", help="check the installation: Python, torch, python-chess, Stockfish, Syzygy, CPU/GPU")
    doctor.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="engine settings, e.g. engine.path=/usr/games/stockfish")

    engine = commands.add_parser("engine", help="engine pool utilities")
    engine_commands = engine.add_subparsers(dest="engine_command", required=True, metavar="SUBCOMMAND")
    evaluate = engine_commands.add_parser(
        "eval", help="evaluate positions with the Stockfish pool (FENs, a FEN/EPD file, or seeded random playouts)"
    )
    _add_config_arguments(evaluate)
    evaluate.add_argument("--fen", action="append", default=[], help="a position to evaluate (repeatable)")
    evaluate.add_argument("--file", type=Path, help="text file with one FEN or EPD per line")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object per position instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        if args.command == "doctor":
            return run_doctor(args)
        if args.command == "engine" and args.engine_command == "eval":
            return run_engine_eval(args)
    except ConfigError as error:
        print(f"chessgrpo: config error: {error}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as error:
        print(f"chessgrpo: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # EngineError and friends: one clear line, no traceback
        print(f"chessgrpo: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("chessgrpo: interrupted", file=sys.stderr)
        return 130
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


# ------------------------------------------------------------------------------------------------
# doctor


def run_doctor(args: argparse.Namespace) -> int:
    """Print versions and paths of everything chessgrpo uses; non-zero exit when Stockfish is missing."""
    import chess

    from chessgrpo.engine import EngineError, available_cores, find_stockfish
    from chessgrpo.engine.tablebase import split_paths, table_names
    from chessgrpo.engine.uci import UciProcess

    config = load_config(_DoctorConfig, None, args.overrides)
    ok = True
    rows: list[tuple[str, str]] = []
    rows.append(("python", f"{platform.python_version()} ({sys.executable})"))
    try:
        import torch

        rows.append(("torch", f"{torch.__version__} ({Path(torch.__file__).parent})"))
        if torch.cuda.is_available():
            names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
            rows.append(("gpu", f"CUDA {torch.version.cuda}: {names}"))
        else:
            rows.append(("gpu", "none (CPU only)"))
    except ImportError:
        rows.append(("torch", "MISSING: run `make setup` (pip install torch==2.13.0)"))
        ok = False
    rows.append(("python-chess", f"{chess.__version__} ({Path(chess.__file__).parent})"))
    rows.append(("cpu", f"{platform.processor() or platform.machine()}, {available_cores()} usable cores"))
    try:
        path = find_stockfish(config.engine.path)
        engine = UciProcess(path)
        rows.append(("stockfish", f"{engine.name} ({path})"))
        engine.quit()
    except EngineError as error:
        rows.append(("stockfish", f"MISSING: {error}"))
        ok = False
    if config.engine.syzygy_path:
        names = table_names(config.engine.syzygy_path)
        where = ", ".join(str(p.resolve()) for p in split_paths(config.engine.syzygy_path))
        if names:
            largest = max(len(n) - 1 for n in names)
            rows.append(("syzygy", f"{len(names)} WDL tables up to {largest} pieces in {where}"))
        else:
            rows.append(("syzygy", f"no tables found in {where} (optional; set engine.syzygy_path)"))
    else:
        rows.append(("syzygy", "disabled (engine.syzygy_path is null)"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if not ok:
        print("\nchessgrpo doctor: something required is missing (see above)", file=sys.stderr)
        return 1
    print("\nall required components found")
    return 0


@dataclasses.dataclass
class _DoctorConfig:
    """What the doctor checks: only the engine section (`chessgrpo doctor engine.path=...`)."""

    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)


# ------------------------------------------------------------------------------------------------
# engine eval


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

    out_path = run_dir / "evaluations.jsonl"
    with out_path.open("w") as handle:
        for evaluation in evaluations:
            handle.write(json.dumps(dataclasses.asdict(evaluation)) + "\n")
    if args.json:
        for evaluation in evaluations:
            print(json.dumps(dataclasses.asdict(evaluation)))
        return 0
    if len(evaluations) <= 20:
        print(f"{'win%':>6} {'score':>8} {'best':>6}  position")
        for evaluation in evaluations:
            score = (
                f"#{evaluation.mate}" if evaluation.mate is not None else f"{evaluation.cp:+d}cp" if evaluation.cp is not None else "-"
            )
            print(f"{100 * evaluation.win_probability:6.1f} {score:>8} {evaluation.best_move or '-':>6}  {evaluation.fen}")
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
