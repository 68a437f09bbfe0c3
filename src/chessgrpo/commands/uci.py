"""`chessgrpo uci --checkpoint CKPT [--device D] [--temperature T] [--search S] [--nodes N] [--syzygy-path DIR]`:
the policy as a UCI engine.

Speaks UCI on stdin/stdout (see `chessgrpo.uci.engine` and ``docs/uci.md``), so the policy
plays in chess GUIs, cutechess-cli, fastchess and lichess-bot; logs go to stderr. A checkpoint with
a value head searches (PUCT by default) under the ``go`` limits; one without plays the policy's
move. Searches run in a thread, so ``go infinite``/``go ponder`` wait for ``stop``/``ponderhit``
and ``isready`` is answered during a search. The flags set the initial values of the UCI options
of the same names (``UCI_Chess960``, ``UCI_ShowWDL`` and ``MultiPV`` are set over UCI). Startup
loads the model (a few seconds for torch) before the first command is read; a bad checkpoint,
Syzygy directory or temperature fails right away.

A chess language model (``--checkpoint LM_DIR``: a save_pretrained directory, an SFT/GRPO run or
checkpoint) plays its greedy B: answer instead (`chessgrpo.uci.lm`, docs/uci.md "The chess LM
as a player"), within each move's clock budget, taking the options bots send (Move Overhead, Threads, Hash, and
without effect Ponder, MultiPV, UCI_ShowWDL, SyzygyPath); ``--retries`` and ``--prompt-bos`` are its settings, and the
action policy's ``--temperature``, ``--search``, ``--nodes`` and ``--syzygy-path`` are refused for it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from chessgrpo.errors import InputError
from chessgrpo.play.search_control import SEARCH_CHOICES  # light (no torch): keeps --help fast

POLICY_DEFAULTS = {"temperature": 0.0, "search": "puct", "nodes": 256, "syzygy_path": ""}
"""The action policy's flags: given for a chess LM they are an error, so their parser default is None."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    uci = commands.add_parser("uci", help="run a policy or chess LM checkpoint as a UCI engine on stdin/stdout")
    uci.add_argument(
        "--checkpoint", type=Path, required=True, help="policy or chess LM checkpoint directory, or run directory"
    )
    uci.add_argument("--device", default="cpu", help="torch device (default cpu; also the UCI option Device)")
    uci.add_argument(
        "--temperature",
        type=float,
        help="0 = argmax (default), or in [0.001, 100] to sample, without search (also the UCI option Temperature)",
    )
    uci.add_argument(
        "--search",
        choices=SEARCH_CHOICES,
        help="puct (default), alphabeta, or none = the policy's move without search; needs a value head (also the UCI option Search)",
    )
    uci.add_argument(
        "--nodes",
        type=int,
        help="node budget of a go without node or time limits (default 256; also the UCI option Nodes)",
    )
    uci.add_argument(
        "--syzygy-path",
        metavar="DIR",
        help="Syzygy tables for exact 3-4-piece values (default off; also the UCI option SyzygyPath)",
    )
    uci.add_argument(
        "--retries", type=int, help="chess LM only: re-samples of an ill-formed or illegal answer (default 3)"
    )
    uci.add_argument(
        "--prompt-bos",
        action="store_true",
        default=None,
        help="chess LM only: BOS before every prompt (default: as its run was trained)",
    )
    uci.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from chessgrpo.models.checkpoint_kind import LM, identify_checkpoint

    torch.set_num_threads(1)  # one position (or one small batch) per call: threads only add hand-off latency
    if identify_checkpoint(args.checkpoint).kind == LM:
        return _run_lm(args)
    if args.retries is not None or args.prompt_bos is not None:
        raise InputError(
            f"--retries and --prompt-bos are for a chess LM, but {str(args.checkpoint)!r} is an action policy"
        )
    from chessgrpo.uci.engine import UciEngine

    given = {name: getattr(args, name) for name in POLICY_DEFAULTS}
    options = {name: POLICY_DEFAULTS[name] if value is None else value for name, value in given.items()}
    engine = UciEngine(
        args.checkpoint,
        device=args.device,
        temperature=options["temperature"],
        search=options["search"],
        nodes=options["nodes"],
        syzygy_path=options["syzygy_path"] or None,
    )
    return engine.run()


def _run_lm(args: argparse.Namespace) -> int:
    from chessgrpo.play.lm_player import LMPlayerConfig
    from chessgrpo.uci.lm import LMUciEngine

    given = [f"--{name.replace('_', '-')}" for name in POLICY_DEFAULTS if getattr(args, name) is not None]
    if given:
        raise InputError(
            f"{', '.join(given)}: an action policy's option, but {str(args.checkpoint)!r} is a chess language model"
        )
    settings = {"retries": args.retries, "prompt_bos": args.prompt_bos}
    config = LMPlayerConfig(**{key: value for key, value in settings.items() if value is not None})
    return LMUciEngine(args.checkpoint, device=args.device, config=config).run()
