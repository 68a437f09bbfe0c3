"""`chessgrpo data rookworld` and `chessgrpo eval lm`: the RookWorld text tasks' data and evaluation.

::

    chessgrpo data rookworld --out DIR [--positions N] [--nodes K] [--seed S] [key=value ...]
    chessgrpo data rookworld --out DIR --from-text FILE [keep_defective=true]
    chessgrpo data rookworld --out DIR --positions N endgames=[KQvK,KRvK]   (Syzygy truths)
    chessgrpo eval lm --checkpoint DIR [--data DIR] [--policy-prompts N] [--environment-prompts N]
                      [--puzzles CSV] [--prompt-bos] [--json] [key=value ...]
    chessgrpo eval lm --compare A.json B.json [--json]

Registered by `commands.data` and `commands.evaluate` (one call each); not a top-level command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import cast

from chessgrpo.commands.common import add_config_arguments, progress_bar, run_registered
from chessgrpo.config import (
    ConfigError,
    load_config,
    parse_override,
)
from chessgrpo.eval.lm import LMEvalConfig

_DATA_FLAGS = {"out": "out", "positions": "positions", "nodes": "nodes", "seed": "seed", "from_text": "from_text"}


def add_data_parser(data_commands: argparse._SubParsersAction) -> None:
    """`chessgrpo data rookworld` (called from `commands.data.add_parser`)."""
    rookworld = data_commands.add_parser(
        "rookworld",
        help="RookWorld P:/A: text datasets: generate with Stockfish multipv and python-chess, or import a text file",
        description="Write RookWorld policy (P:) and environment (A:) examples as text and Parquet, split by position.",
    )
    add_config_arguments(rookworld)
    rookworld.add_argument("--out", metavar="DIR", help="output directory (config key out)")
    rookworld.add_argument(
        "--positions", type=int, metavar="N", help="distinct positions, one P: and one A: example each"
    )
    rookworld.add_argument("--nodes", type=int, metavar="K", help="node limit of each multipv analysis")
    rookworld.add_argument("--seed", type=int, metavar="S", help="random seed")
    rookworld.add_argument(
        "--from-text", metavar="FILE", help="import an existing RookWorld text file instead of generating"
    )
    rookworld.set_defaults(handler=run_data_rookworld)


def run_data_rookworld(args: argparse.Namespace) -> int:
    from chessgrpo.data.rookworld import RookWorldDataConfig, run_rookworld_data

    config = load_config(RookWorldDataConfig, args.config, args.overrides)
    overridden = {parse_override(text)[0][0] for text in args.overrides}
    for dest, key in _DATA_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if key in overridden:
            raise ConfigError(f"{key} is given twice: as a flag and as {key}=...; give it once")
        setattr(config, key, value)
    total = None if config.from_text else config.positions + config.held_out * len(config.endgames)
    with progress_bar(total, "rookworld", "pos") as bar:
        summary = run_rookworld_data(config, progress=bar.update)
    counts = "; ".join(f"{split}: {c['policy']} P:, {c['environment']} A:" for split, c in summary.counts.items())
    if summary.already_complete:
        print(f"{summary.directory} already holds this dataset ({counts}); nothing to do")
        return 0
    print(f"wrote {summary.directory} ({counts}) in {summary.seconds:.1f}s")
    if config.from_text:
        print(f"upstream B: defect (B: not the best listed move): {summary.defects} lines, {summary.dropped} dropped")
    return 0


# --------------------------------------------------------------------------------------------
# eval lm


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    """`chessgrpo eval lm` (called from `commands.evaluate.add_parser`)."""
    lm = sub.add_parser(
        "lm", help="RookWorld P:/A: task metrics of a chess language model, with intervals; or compare two results"
    )
    source = lm.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="model directory, checkpoint or SFT/GRPO run directory")
    source.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A.json", "B.json"),
        help="paired B - A of two `eval lm output=...` results",
    )
    lm.add_argument("--data", help="dataset directory (config key data)")
    lm.add_argument("--policy-prompts", type=int, metavar="N", help="held-out P: positions (config key policy_prompts)")
    lm.add_argument(
        "--environment-prompts", type=int, metavar="N", help="held-out A: prompts (config key environment_prompts)"
    )
    lm.add_argument("--puzzles", help="Lichess puzzle CSV (config key puzzles)")
    lm.add_argument(
        "--prompt-bos",
        action="store_true",
        default=None,
        help="BOS before every prompt, as upstream RookWorld-LM was trained (config key prompt_bos)",
    )
    lm.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(lm)
    lm.set_defaults(handler=run_eval_lm)


def run_eval_lm(args: argparse.Namespace) -> int:
    from chessgrpo.eval.lm import compare_lm_results

    if args.compare is not None:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        diffs = compare_lm_results(a, b)
        if args.json:
            print(json.dumps({k: v.to_json() for k, v in diffs.items()}))
        else:
            print(f"paired difference {args.compare[1]} - {args.compare[0]} (95% bootstrap intervals):")
            for name, interval in diffs.items():
                print(f"  {name:<24} {interval.format(4)}")
        return 0
    from tqdm import tqdm

    from chessgrpo.eval.lm import LMEvalRun
    from chessgrpo.eval.running import EvalContext, Subject

    config = load_config(LMEvalConfig, args.config, args.overrides)
    flags = {
        "data": args.data,
        "policy_prompts": args.policy_prompts,
        "environment_prompts": args.environment_prompts,
        "puzzles": args.puzzles,
        "prompt_bos": getattr(args, "prompt_bos", None),
    }
    config = dataclasses.replace(config, **{k: v for k, v in flags.items() if v is not None})
    context = EvalContext(
        progress=lambda total, description: tqdm(
            total=total, desc=description, unit="prompt", file=sys.stderr, disable=None
        )
    )
    run = cast(LMEvalRun, run_registered("lm", config, Subject(checkpoint=args.checkpoint), context))
    result, items = run.result, run.items
    fens, prompts, puzzles = items.policy_fens, items.environment_prompts, items.puzzles
    if args.json:
        print(json.dumps({k: v.to_json() for k, v in result.metrics.items()}))
        return 0
    print(
        f"eval lm: {run.source} on {config.data} ({config.split}); {len(fens)} P:, {len(prompts)} A:, {len(puzzles)} puzzles; "
        f"{'greedy' if config.temperature == 0 else f'temperature {config.temperature}'}"
        f"{'; BOS before prompts' if config.prompt_bos else ''}; {100 * config.confidence:g}% intervals"
    )
    for name, interval in result.metrics.items():
        print(f"  {name:<28} {interval.format(4)}")
    return 0
