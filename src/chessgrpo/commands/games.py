"""`chessgrpo eval games`: games against engine anchors, with Elo intervals, SPRT and PGN.

::

    chessgrpo eval games --checkpoint CKPT [--anchors random,sf-skill:0,uci:PATH,NAME] [--games N]
                         [--engines FILE] [--openings FILE] [--workers K] [--temperature T]
                         [--search-nodes N] [--search-algorithm puct|alphabeta]
                         [--anchor-nodes N | --anchor-depth D] [--tc MOVES/SECONDS+INC [--anchor-tc TC]]
                         [--pgn FILE] [--json]
                         [--sprt ELO0,ELO1 --opponent CKPT2] [--config F] [key=value ...]

Plays N games (N/2 colour-swapped pairs, one opening per pair) against every anchor
(`chessgrpo.play.anchors`: random, Stockfish levels, any UCI engine as ``uci:PATH[:KEY=VALUE]...``
or by its name in an engines file, checkpoints; docs/engines.md) with the adjudication of
`chessgrpo.play.games`, writes every game to a PGN, and reports per anchor W/D/L, the score with
a Wilson interval, pentanomial pair counts and the Elo difference; then the maximum-likelihood Elo
over all rated anchors with a likelihood-ratio interval (`chessgrpo.play.elo`). With ``--sprt elo0,elo1 --opponent CKPT2`` it
plays CKPT against CKPT2 only and stops as soon as the SPRT decides (at most N games).
With ``--search-nodes N`` CKPT plays the move of a search with its value head (`chessgrpo.search`)
at N nodes per move instead of its policy's argmax; the PGN's PlayerSettings and the JSON record
the search settings. Checkpoint anchors (and the SPRT opponent) play without search.
With ``--tc 40/10+0.1`` (cutechess syntax) both sides play on clocks (``--anchor-tc`` gives the
anchors another): losses on time are counted per side and the PGN has TimeControl tags and
``%clk`` comments (`chessgrpo.play.game_clock`). Every engine anchor's line says what it ran (depth
and nodes per move from its ``info`` lines) against what it was asked, with a WARNING when it did not
keep its limit (`chessgrpo.play.anchor_runs`).
A chess LM checkpoint plays its greedy B: answer (`chessgrpo.play.lm_player`; settings ``lm.*``;
``--search-nodes`` and ``--temperature`` are refused for it); the summary adds its ill-formed,
illegal, re-sampled and fallback rates (``lm_player``).
This module parses the flags and renders the summary; the match runs through the evaluation registry
(`eval.games.run_games`, its ``output`` written by `eval.registry.write_result`), and the match itself (anchors,
openings, journal and resume, SPRT, PGN, summary) is `chessgrpo.play.match.play_match`.
Defaults and every key: configs/games.yaml (`chessgrpo.play.match.GamesConfig`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from chessgrpo.commands.common import add_config_arguments, add_search_arguments, progress_bar, run_registered
from chessgrpo.config import load_config
from chessgrpo.errors import InputError
from chessgrpo.play.match import GamesConfig, resolve_games_paths


def add_games_parser(sub: argparse._SubParsersAction) -> None:
    """Register `eval games` on the `eval` subparsers."""
    games = sub.add_parser("games", help="play game pairs against engine anchors: W/D/L, Elo with intervals, SPRT, PGN")
    games.add_argument(
        "--checkpoint", type=Path, required=True, help="policy or chess LM checkpoint directory, or run directory"
    )
    games.add_argument(
        "--anchors",
        help="comma-separated: random, sf-skill:N, sf-elo:N, sf-nodes:N, uci:PATH[:nodes=N|:depth=N|:movetime=MS]"
        "[:option.NAME=VALUE][:name=NAME][:elo=R], an engine's name from --engines, checkpoint paths",
    )
    games.add_argument("--engines", help="engines file (YAML): UCI engines by name, see docs/engines.md")
    games.add_argument("--games", type=int, help="games per anchor, even: colour-swapped pairs (default: config games)")
    games.add_argument("--openings", help="opening file (.pgn, or .epd/.fen/.txt one position per line)")
    games.add_argument("--workers", type=int, help="game worker processes (default: one per CPU core)")
    games.add_argument("--temperature", type=float, help="policy temperature; 0 = argmax (default)")
    add_search_arguments(games)
    games.add_argument(
        "--anchor-nodes", type=int, help="node limit per move of sf-skill/sf-elo anchors and UCI engines without one"
    )
    games.add_argument("--anchor-depth", type=int, help="depth limit per move of those anchors (instead of nodes)")
    games.add_argument(
        "--tc",
        metavar="MOVES/SECONDS+INC",
        help="clocks for both sides, cutechess syntax: 40/10+0.1, 30+0.3 or 60 (default: none, per-move limits)",
    )
    games.add_argument("--anchor-tc", metavar="TC", help="the anchors' clock when it differs from --tc")
    games.add_argument(
        "--sprt", metavar="ELO0,ELO1", help="SPRT of --checkpoint against --opponent; stops when decided"
    )
    games.add_argument("--opponent", help="the checkpoint to play in SPRT mode")
    games.add_argument("--pgn", help="PGN output file")
    games.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    add_config_arguments(games)
    games.set_defaults(handler=run_games_command)


def _load(args: argparse.Namespace) -> GamesConfig:
    config = load_config(GamesConfig, args.config, args.overrides)
    flags: dict[str, Any] = {
        "games": args.games,
        "openings": args.openings,
        "workers": args.workers,
        "temperature": args.temperature,
        "search_nodes": args.search_nodes,
        "search_algorithm": args.search_algorithm,
        "anchor_nodes": args.anchor_nodes,
        "anchor_depth": args.anchor_depth,
        "opponent": args.opponent,
        "pgn": args.pgn,
        "engines": args.engines,
        "tc": args.tc,
        "anchor_tc": args.anchor_tc,
    }
    if args.anchors is not None:
        if args.sprt is not None:
            raise InputError("--sprt plays --checkpoint against --opponent only; drop --anchors")
        flags["anchors"] = [item.strip() for item in args.anchors.split(",") if item.strip()]
    if args.sprt is not None:
        try:
            elo0, elo1 = (float(x) for x in args.sprt.split(","))
        except ValueError:
            raise InputError(f"--sprt expects ELO0,ELO1 such as 0,10; got {args.sprt!r}") from None
        flags.update(sprt_elo0=elo0, sprt_elo1=elo1)
    return resolve_games_paths(
        dataclasses.replace(config, **{key: value for key, value in flags.items() if value is not None})
    )


def run_games_command(args: argparse.Namespace) -> int:
    from chessgrpo.eval.running import EvalContext, Subject

    config = _load(args)
    context = EvalContext(
        progress=lambda total, description: progress_bar(
            total, description, "game", leave=False
        ),  # in a log file: a line every 30 s
        notify=lambda text: print(text, file=sys.stderr),
    )
    summary = run_registered("games", config, Subject(checkpoint=args.checkpoint), context).to_json()
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_summary(summary, config.confidence))
    return 0


# --------------------------------------------------------------------------------------------
# Rendering


def _elo_text(estimate: dict, signed: bool = True) -> str:
    from chessgrpo.play.elo import EloEstimate

    fields = {k: estimate[k] for k in ("value", "low", "high", "n", "bound")}
    return EloEstimate(**fields).format(signed=signed)


def format_summary(summary: dict, confidence: float = 0.95) -> str:
    """The match summary as the command prints it: header, anchor table, anchors, Elo, SPRT, PGN path."""
    level = f"{100 * confidence:g}%"
    planned = f"at most {summary['games_per_anchor']}" if "sprt" in summary else str(summary["games_per_anchor"])
    workers = f"{summary['workers']} worker" + ("s" if summary["workers"] != 1 else "")
    lines = [
        f"games: {summary['player']}",
        f"{summary['games_played']} games ({planned} per anchor in colour-swapped pairs) from "
        f"{summary['openings']}; {workers}, {summary['games_per_minute']} games/minute",
    ]
    if summary.get("games_resumed"):
        lines.append(
            f"resumed: {summary['games_resumed']} of the games were played by an earlier, interrupted run (its journal)"
        )
    if summary["stopped_early"]:
        lines.append("stopped early: the SPRT decided")
    if summary.get("tc"):
        clocks = (
            summary["tc"] if not summary.get("anchor_tc") else f"policy {summary['tc']}, anchors {summary['anchor_tc']}"
        )
        losses = summary["time_losses"]
        lines.append(f"time control {clocks}: time losses: policy {losses['player']}, anchors {losses['anchor']}")
        lines.append(summary["clock_note"])
    lines.extend(_anchor_table(summary["anchors"], level, clocks=bool(summary.get("tc"))))
    if "lm_player" in summary:  # a chess LM played: how its moves were made (play.lm_player)
        lines.append(summary["lm_player"]["line"])
    lines.append("")
    lines.append("anchors:")
    for row in summary["anchors"]:
        rating = "unrated" if row["rating"] is None else f"rated {row['rating']:g}"
        terminations = ", ".join(f"{name} {count}" for name, count in row["terminations"].items())
        lines.append(f"  {row['anchor']}: {row['settings']}; {rating} ({row['rating_source']})")
        lines.append(f"    terminations: {terminations or 'none'}; mean length {row['mean_plies']} plies")
        if summary.get("tc"):
            losses = row["time_losses"]
            lines.append(f"    time losses: policy {losses['player']}, {row['anchor']} {losses['anchor']}")
        if "ran" in row:
            lines.append(f"    ran: {row['ran']['line']}")
        if "lm_player" in row:
            lines.append(f"    {row['lm_player']['line']}")
    lines.append("")
    if summary["elo"] is None and "sprt" in summary:
        pass  # A/B between checkpoints: the Elo difference above and the SPRT below are the result
    elif summary["elo"] is None:
        lines.append("maximum-likelihood Elo: n/a (no rated anchor; give ratings with anchor_ratings=[NAME=RATING])")
    else:
        lines.append(
            f"maximum-likelihood Elo: {_elo_text(summary['elo'], signed=False)} ({level}; {summary['elo_method']})"
        )
    warnings = [row["ran"]["warning"] for row in summary["anchors"] if row.get("ran", {}).get("warning")]
    lines.extend(warnings)
    lines.append(f"note: {summary['calibration']}")
    if "sprt" in summary:
        from chessgrpo.play.elo import SprtResult

        s = summary["sprt"]
        result = SprtResult(
            llr=s["llr"],
            lower=s["lower"],
            upper=s["upper"],
            elo0=s["elo0"],
            elo1=s["elo1"],
            alpha=s["alpha"],
            beta=s["beta"],
            pairs=tuple(s["pentanomial"]),
        )
        lines.append(result.format())
    lines.append(f"PGN: {summary['pgn']}")
    return "\n".join(lines)


def _ran_cell(row: dict) -> str:
    """What an engine anchor ran, short: "d1 ~6n LIMIT IGNORED", "d3 ~60n"; "-" for other anchors."""
    ran = row.get("ran")
    if not ran or not ran["moves"]:
        return "-"
    depth = "d?" if ran["depth_median"] is None else f"d{ran['depth_median']:g}"
    nodes = "n?" if ran["nodes_median"] is None else f"~{ran['nodes_median']:.0f}n"
    return f"{depth} {nodes}" + (" LIMIT IGNORED" if ran["kept"] is False else "")


def _anchor_table(anchors: list[dict], level: str, clocks: bool = False) -> list[str]:
    """One row per anchor: rating, W/D/L, time losses (policy/anchor, under clocks), score with its Wilson
    interval, pentanomial pairs, Elo difference, and what an engine anchor ran (median depth and nodes per move)."""
    header = [
        "anchor",
        "rating",
        "W",
        "D",
        "L",
        *(["time losses P/A"] if clocks else []),
        f"score [{level} Wilson]",
        "pairs 0/½/1/1½/2",
        f"Elo diff [{level}]",
        "ran/move",
    ]
    table = []
    for row in anchors:
        score = row["score"]
        score_text = (
            "n/a" if score["value"] is None else f"{score['value']:.3f} [{score['low']:.3f}, {score['high']:.3f}]"
        )
        rating = "-" if row["rating"] is None else f"{row['rating']:.0f}"
        table.append(
            [
                row["anchor"],
                rating,
                str(row["wins"]),
                str(row["draws"]),
                str(row["losses"]),
                *([f"{row['time_losses']['player']}/{row['time_losses']['anchor']}"] if clocks else []),
                score_text,
                "/".join(str(c) for c in row["pentanomial"]),
                _elo_text(row["elo_difference"]),
                _ran_cell(row),
            ]
        )
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    lines = [""]
    for row in [header, *table]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return lines
