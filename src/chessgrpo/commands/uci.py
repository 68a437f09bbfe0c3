"""`chessgrpo uci --checkpoint CKPT [--device D] [--temperature T]`: the policy as a UCI engine.

Speaks UCI on stdin/stdout (see `chessgrpo.eval.uci_engine`), so the policy plays in chess GUIs,
cutechess-cli, fastchess and lichess-bot; logs go to stderr. Startup loads the model (a few
seconds for torch) before the first command is read; a bad checkpoint fails right away.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    uci = commands.add_parser("uci", help="run a policy checkpoint as a UCI engine on stdin/stdout")
    uci.add_argument("--checkpoint", type=Path, required=True, help="policy checkpoint directory or run directory")
    uci.add_argument("--device", default="cpu", help="torch device (default cpu; also the UCI option Device)")
    uci.add_argument(
        "--temperature", type=float, default=0.0, help="0 = argmax (default), > 0 samples (also the UCI option Temperature)"
    )
    uci.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from chessgrpo.eval.uci_engine import UciEngine

    torch.set_num_threads(1)  # one position per call: threads only add hand-off latency
    engine = UciEngine(args.checkpoint, device=args.device, temperature=args.temperature)
    return engine.run()
