"""`chessgrpo doctor`: check the installation."""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
from pathlib import Path

from chessgrpo.config import EngineConfig, load_config


def add_parser(commands: argparse._SubParsersAction) -> None:
    doctor = commands.add_parser("doctor", help="check the installation: Python, torch, python-chess, Stockfish, Syzygy, CPU/GPU")
    doctor.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="engine settings, e.g. engine.path=/usr/games/stockfish")
    doctor.set_defaults(handler=run_doctor)




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
