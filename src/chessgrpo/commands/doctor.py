"""`chessgrpo doctor`: check the installation.

The engine at ``engine.path`` is started and asked who it is (``id name``), which options it has
(MultiPV) and whether it stops at a node limit (one ``go nodes`` search of the start position).
Rewards, labels and the engine evaluations of `engine eval`, `data generate`, training and the
opening suite of `eval games` need Stockfish (its MultiPV, its node limits and the WDL model of its
scores), so any other engine there is reported as NOT STOCKFISH and the doctor exits 1; as an
`eval games` opponent any UCI engine works (``--anchors uci:PATH``, docs/engines.md).

The data the defaults name is reported as found (with the path it was found at) or MISSING (with
every place it was looked for, `chessgrpo.paths`): the Syzygy tables, the Lichess puzzles, the
RookWorld samples and data/tiny. All of it is optional for the doctor's verdict: a missing file
fails only the commands that read it, with the same places named.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
from pathlib import Path

from chessgrpo.config import EngineConfig, load_config
from chessgrpo.paths import PUZZLES_DEFAULT, ROOKWORLD_SAMPLES_DEFAULT


def add_parser(commands: argparse._SubParsersAction) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check the installation: Python, torch, python-chess, Stockfish (or what engine.path runs), Syzygy, CPU/GPU",
    )
    doctor.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="engine settings, e.g. engine.path=/usr/games/stockfish"
    )
    doctor.set_defaults(handler=run_doctor)


PROBE_NODES = 1000
"""Node limit of the doctor's one search (Stockfish answers in milliseconds)."""


def engine_rows(path: str | None, timeout_s: float = 30.0) -> tuple[list[tuple[str, str]], bool]:
    """Doctor rows about the engine at `path` (default: Stockfish) and whether it is usable for
    rewards and labels: it is Stockfish, it has MultiPV, and it stops at a node limit."""
    from chessgrpo.engine import EngineError, find_stockfish
    from chessgrpo.engine.uci import EngineUnsupported, UciProcess

    try:
        binary = find_stockfish(path)
        engine = UciProcess(binary, startup_timeout_s=min(30.0, timeout_s))
    except EngineError as error:
        return [("stockfish", f"MISSING: {error}")], False
    try:
        name = engine.name or "an engine without an id name"
        try:
            result = engine.search(
                "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", nodes=PROBE_NODES, timeout_s=timeout_s
            )
            node_limit, stops = f"go nodes {PROBE_NODES}: stopped (bestmove {result.bestmove_text})", True
        except EngineUnsupported as error:
            node_limit, stops = f"go nodes {PROBE_NODES}: IGNORED ({error})", False
        except EngineError as error:
            node_limit, stops = f"go nodes {PROBE_NODES}: FAILED ({error})", False
        multipv = engine.supports("MultiPV")
    finally:
        engine.quit()
    capabilities = f"MultiPV {'yes' if multipv else 'NO'}; {node_limit}"
    if engine.is_stockfish and multipv and stops:
        return [("stockfish", f"{name} ({binary})"), ("engine checks", capabilities)], True
    rows = [
        ("engine", f"{name} ({binary}), UCI; {capabilities}"),
        (
            "stockfish",
            f"NOT STOCKFISH: engine.path runs {name}. Rewards, labels and engine evaluations (engine eval, data "
            "generate, training, the eval games opening suite) need Stockfish's MultiPV and node limits; point "
            f"engine.path at Stockfish. As an eval games opponent any UCI engine works: --anchors uci:{binary}:depth=N",
        ),
    ]
    return rows, False


def run_doctor(args: argparse.Namespace) -> int:
    """Print versions and paths of everything chessgrpo uses; non-zero exit when Stockfish is missing
    (or engine.path runs another engine)."""
    import chess

    from chessgrpo.engine import available_cores
    from chessgrpo.engine.tablebase import split_paths, table_names
    from chessgrpo.paths import DATA_ENV, data_origin, resolve_optional

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
    found, usable = engine_rows(config.engine.path, config.engine.timeout_s)
    rows.extend(found)
    ok = ok and usable
    if config.engine.syzygy_path:
        syzygy = resolve_optional(config.engine.syzygy_path, required=False)
        names = table_names(syzygy)
        where = ", ".join(str(p.resolve()) for p in split_paths(syzygy))
        if names:
            largest = max(len(n) - 1 for n in names)
            origins = ", ".join(
                dict.fromkeys(data_origin(part) for part in str(config.engine.syzygy_path).split(os.pathsep) if part)
            )
            rows.append(("syzygy", f"{len(names)} WDL tables up to {largest} pieces in {where} ({origins})"))
        elif looked := _syzygy_looked(config.engine.syzygy_path):
            missing = f"MISSING (optional): {config.engine.syzygy_path} not found{looked}"
            rows.append(("syzygy", f"{missing}; set engine.syzygy_path or {DATA_ENV}"))
        else:
            rows.append(("syzygy", f"MISSING (optional): no tables found in {where}; set engine.syzygy_path"))
    else:
        rows.append(("syzygy", "disabled (engine.syzygy_path is null)"))
    rows.extend(data_rows())
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if not ok:
        print("\nchessgrpo doctor: something required is missing (see above)", file=sys.stderr)
        return 1
    print("\nall required components found")
    return 0


DATA_FILES = (
    ("puzzles", PUZZLES_DEFAULT, "eval puzzles' default puzzle file"),
    ("rookworld samples", ROOKWORLD_SAMPLES_DEFAULT, "the RookWorld format tests"),
    (
        "data/tiny",
        "data/tiny",
        "eval offline and the tiny configs; make it with `chessgrpo data generate --config configs/data_tiny.yaml`",
    ),
)
"""The data the commands' defaults name (besides the Syzygy tables): (row, default path, used by)."""


def data_rows() -> list[tuple[str, str]]:
    """A doctor row per default data path: where it was found, or MISSING with where it was looked
    for. All optional: a missing one fails only the commands that read it (with the same places named)."""
    from chessgrpo.paths import DATA_ENV, data_origin, find_data_path, places_looked

    rows = []
    for name, path, used_by in DATA_FILES:
        found = find_data_path(path)
        if found is not None:
            rows.append((name, f"found: {found} ({data_origin(path)})"))
        else:
            looked = places_looked(path)
            rows.append(
                (name, f"MISSING (optional; needed by {used_by}): looked at {looked}; set {DATA_ENV} or pass a path")
            )
    return rows


def _syzygy_looked(path: str) -> str:
    """Where the parts of a Syzygy path that exist nowhere were looked for ("" when all exist)."""
    from chessgrpo.paths import find_data_path, places_looked

    missing = [part for part in path.split(os.pathsep) if part and find_data_path(part) is None]
    return f" (looked at {'; '.join(places_looked(part) for part in missing)})" if missing else ""


@dataclasses.dataclass
class _DoctorConfig:
    """What the doctor checks: only the engine section (`chessgrpo doctor engine.path=...`)."""

    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
