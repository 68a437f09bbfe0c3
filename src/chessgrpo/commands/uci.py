"""`chessgrpo uci --checkpoint CKPT [--device D] [--temperature T] [--search S] [--nodes N] [--syzygy-path DIR]`:
the policy as a UCI engine.

Speaks UCI on stdin/stdout (see `chessgrpo.eval.uci_engine` and ``docs/uci.md``), so the policy
plays in chess GUIs, cutechess-cli, fastchess and lichess-bot; logs go to stderr. A checkpoint with
a value head searches (PUCT by default) under the ``go`` limits; one without plays the policy's
move. Searches run in a thread, so ``go infinite``/``go ponder`` wait for ``stop``/``ponderhit``
and ``isready`` is answered during a search. The flags set the initial values of the UCI options
of the same names (``UCI_Chess960``, ``UCI_ShowWDL`` and ``MultiPV`` are set over UCI). Startup
loads the model (a few seconds for torch) before the first command is read; a bad checkpoint,
Syzygy directory or temperature fails right away.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SEARCH_CHOICES = ("puct", "alphabeta", "none")  # = chessgrpo.eval.uci_engine.SEARCH_CHOICES (not imported: keeps --help fast)


def add_parser(commands: argparse._SubParsersAction) -> None:
    uci = commands.add_parser("uci", help="run a policy checkpoint as a UCI engine on stdin/stdout")
    uci.add_argument("--checkpoint", type=Path, required=True, help="policy checkpoint directory or run directory")
    uci.add_argument("--device", default="cpu", help="torch device (default cpu; also the UCI option Device)")
    uci.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 = argmax (default), or in [0.001, 100] to sample, without search (also the UCI option Temperature)",
    )
    uci.add_argument(
        "--search",
        choices=SEARCH_CHOICES,
        default="puct",
        help="puct (default), alphabeta, or none = the policy's move without search; needs a value head (also the UCI option Search)",
    )
    uci.add_argument(
        "--nodes", type=int, default=256, help="node budget of a go without node or time limits (default 256; also the UCI option Nodes)"
    )
    uci.add_argument(
        "--syzygy-path",
        default="",
        metavar="DIR",
        help="Syzygy tables for exact 3-4-piece values (default off; also the UCI option SyzygyPath)",
    )
    uci.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from chessgrpo.eval.uci_engine import UciEngine

    torch.set_num_threads(1)  # one position (or one small batch) per call: threads only add hand-off latency
    engine = UciEngine(
        args.checkpoint,
        device=args.device,
        temperature=args.temperature,
        search=args.search,
        nodes=args.nodes,
        syzygy_path=args.syzygy_path or None,
    )
    return engine.run()
