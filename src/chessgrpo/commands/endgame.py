"""`chessgrpo eval endgame`: mate rate against the tablebase-perfect defender, with baselines.

::

    chessgrpo eval endgame --checkpoint CKPT [--material KQvK] [--positions 200] [--seed 0]
                           [--max-moves 50] [--baselines] [--json] [output=FILE] [key=value ...]

The player (a policy at argmax, a chess LM's greedy B: answer with re-samples and a random fallback
(`play.lm_player`, settings ``lm.*``), or ``--policy random|tablebase``) plays the strong side of each
held-out start position for up to ``max_moves`` own moves against the perfect defender
(`eval.endgame.evaluate_endgame`). The start positions are exactly the held-out set of an
endgame training run with the same material, count and seed (``eval.positions`` and
``run.seed`` of the trainer; `data endgame` excludes them too), so numbers here and in a run's
``eval/`` files are comparable position by position. ``output=FILE`` writes per-position records
that `chessgrpo eval compare` pairs (mate rate, DTZ-optimal move rate). An LM's ill-formed,
illegal, re-sampled and fallback rates are printed under its row and written as ``lm_player``.
The evaluation runs through the registry (`eval.endgame.run_endgame`, written by `eval.registry.write_result`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import cast

from chessgrpo.commands.common import add_config_arguments, run_registered
from chessgrpo.config import load_config
from chessgrpo.eval.endgame import ENDGAME_BASELINES, EndgameEvalConfig, EndgameEvalResult

ENDGAME_PLAYERS = ENDGAME_BASELINES


def add_endgame_parser(sub: argparse._SubParsersAction) -> None:
    """Register `eval endgame` (called from `commands.evaluate.add_parser`)."""
    parser = sub.add_parser(
        "endgame", help="mate rate against the tablebase-perfect defender from held-out won endgame positions"
    )
    player = parser.add_mutually_exclusive_group(required=True)
    player.add_argument(
        "--checkpoint", type=Path, help="policy or chess LM checkpoint, or run directory (its latest checkpoint)"
    )
    player.add_argument("--policy", choices=ENDGAME_PLAYERS, help="evaluate a baseline instead of a checkpoint")
    parser.add_argument("--material", help="material signature, e.g. KQvK or KRvK (config key material)")
    parser.add_argument("--positions", type=int, help="held-out start positions (config key positions)")
    parser.add_argument("--seed", type=int, help="seed of the held-out set = the trainer's run.seed (config key seed)")
    parser.add_argument("--max-moves", type=int, help="own moves allowed to mate (config key max_moves)")
    parser.add_argument(
        "--baselines", action="store_true", default=None, help="also play the random mover and the tablebase"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_config_arguments(parser)
    parser.set_defaults(handler=run_endgame_eval)


def run_endgame_eval(args: argparse.Namespace) -> int:
    from chessgrpo.eval.endgame import EndgameRun
    from chessgrpo.eval.running import Subject

    config = load_config(EndgameEvalConfig, args.config, args.overrides)
    flags = {
        "material": args.material,
        "positions": args.positions,
        "seed": args.seed,
        "max_moves": args.max_moves,
        "baselines": args.baselines,
    }
    config = dataclasses.replace(config, **{key: value for key, value in flags.items() if value is not None})
    subject = Subject(checkpoint=args.checkpoint, policy=args.policy)
    run = cast(EndgameRun, run_registered("endgame", config, subject))
    results, lm_player, seconds = run.results, run.lm_player, run.seconds
    if args.json:
        print(json.dumps(run.to_json()["results"]))
        return 0
    print(
        f"{config.material}: {config.positions} held-out won positions (seed {config.seed}), up to {config.max_moves} own moves "
        f"against the perfect defender; Wilson 95% intervals; {seconds:.1f}s"
    )
    print(f"{'player':<40}  {'mate rate':<24}  {'DTZ-optimal moves':<24}  moves to mate (optimal)")
    for label, result in results.items():
        mate, optimal = result.mate_rate, result.dtz_optimal_rate
        moves = (
            "-"
            if result.moves_to_mate != result.moves_to_mate
            else f"{result.moves_to_mate:.2f} ({result.optimal_moves_to_mate:.2f})"
        )
        print(
            f"{label[-40:]:<40}  {f'{mate.value:.3f} [{mate.low:.3f}, {mate.high:.3f}]':<24}  "
            f"{f'{optimal.value:.3f} [{optimal.low:.3f}, {optimal.high:.3f}]':<24}  {moves}"
        )
        print(f"  {outcome_line(result)}")
        if lm_player is not None and label == run.player:
            print(f"  {lm_player.stats_line()}")
    if config.output:
        print(f"wrote {config.output}", file=sys.stderr)
    return 0


def outcome_line(result: EndgameEvalResult) -> str:
    """How the games ended and which pieces moved: "games: mate 62%, draw by threefold_repetition 30%, ...;
    moves: K 55%, Q 45%" (a piece type near 0% is the king-only optimum: `chessgrpo diagnose` names it)."""
    games = ", ".join(
        f"{'draw by ' + r[5:] if r.startswith('draw:') else r} {100 * v:.0f}%"
        for r, v in sorted(result.outcome_rates.items(), key=lambda kv: -kv[1])
    )
    pieces = ", ".join(f"{p} {100 * v:.0f}%" for p, v in result.piece_shares.items())
    return f"games: {games}; moves: {pieces}"
