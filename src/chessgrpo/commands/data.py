"""`chessgrpo data generate`, `data import-pgn` and `data endgame`: labelled-position datasets.

Settings come from `--config FILE`, then ``key=value`` overrides, then the flags (shortcuts for
config keys: `--positions 5000` is ``positions=5000``). A flag and an override of the same key
on one command line is an error rather than a silent choice.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from chessgrpo.commands.common import add_config_arguments, progress_bar
from chessgrpo.config import ConfigError, load_config, parse_override

# Flag destination -> config key, per subcommand.
_GENERATE_FLAGS = {"out": "out", "positions": "positions", "nodes": "nodes", "multipv": "multipv", "seed": "seed"}
_IMPORT_FLAGS = {
    "pgn": "pgn",
    "out": "out",
    "min_elo": "min_elo",
    "max_games": "max_games",
    "positions_per_game": "positions_per_game",
    "nodes": "nodes",
    "multipv": "multipv",
    "seed": "seed",
}
_ENDGAME_FLAGS = {
    "out": "out",
    "material": "material",
    "positions": "positions",
    "seed": "seed",
    "symmetries": "symmetries",
}


class _IntermixedParser(argparse.ArgumentParser):
    """Accepts positionals between options (``import-pgn FILE --out DIR nodes=100``).

    Plain argparse takes all positionals of a run of them at once, so overrides after an
    option would be "unrecognized arguments"; the intermixed parse collects them wherever
    they are.
    """

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing:  # parse_known_intermixed_args calls back into parse_known_args
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def add_parser(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="labelled-position datasets: generate from engine games, import PGN")
    data_commands = data.add_subparsers(
        dest="data_command", required=True, metavar="SUBCOMMAND", parser_class=_IntermixedParser
    )

    generate = data_commands.add_parser(
        "generate",
        help="label positions from engine games (random openings, sampled moves) and random playouts",
        description="Generate (or resume) a dataset of Stockfish-labelled positions as Parquet shards.",
    )
    add_config_arguments(generate)
    generate.add_argument("--out", metavar="DIR", help="dataset directory (config key out)")
    generate.add_argument("--positions", type=int, metavar="N", help="total positions wanted (config key positions)")
    _add_labelling_flags(generate)
    generate.set_defaults(handler=run_generate)

    _add_search_label_parser(data_commands)
    _add_import_pgn_parser(data_commands)
    _add_endgame_parser(data_commands)

    from chessgrpo.commands.rookworld import add_data_parser as add_rookworld_parser  # RookWorld text data

    add_rookworld_parser(data_commands)


def _add_search_label_parser(data_commands: argparse._SubParsersAction) -> None:
    search = data_commands.add_parser(
        "search-label",
        help="label a dataset's train positions with a policy's own search (expert iteration; train on it with kind: pretrain)",
        description="Search every train position of --source with the checkpoint's PUCT (or alpha-beta) search and write "
        "a dataset of its moves and values; the test split is copied from --source (engine labels).",
    )
    search.add_argument("--checkpoint", required=True, help="policy checkpoint or run directory (with a value head)")
    search.add_argument("--source", required=True, help="dataset directory whose train positions are searched")
    search.add_argument("--out", required=True, help="new dataset directory")
    search.add_argument("--nodes", type=int, default=64, help="search nodes per position (default 64)")
    search.add_argument(
        "--algorithm", choices=("puct", "alphabeta"), default="puct", help="search algorithm (default puct)"
    )
    search.add_argument(
        "--syzygy-path", default=None, help="Syzygy directory: 3-4-piece positions exact (default: off)"
    )
    search.add_argument("--max-positions", type=int, default=None, help="label only the first N train positions")
    search.add_argument("--workers", type=int, default=0, help="search processes (0 = one per CPU core)")
    search.set_defaults(handler=run_search_label)


def _add_import_pgn_parser(data_commands: argparse._SubParsersAction) -> None:
    pgn = data_commands.add_parser(
        "import-pgn",
        help="label positions sampled from the games of a PGN file (.pgn, .pgn.gz, .pgn.zst)",
        description="Import positions from real games (e.g. the Lichess database), labelled like `data generate`.",
    )
    pgn.add_argument("pgn", metavar="FILE", help="PGN file: .pgn, .pgn.gz or .pgn.zst (config key pgn)")
    add_config_arguments(pgn)
    pgn.add_argument("--out", metavar="DIR", help="dataset directory (config key out)")
    pgn.add_argument("--min-elo", type=int, metavar="E", help="keep games where both players are rated >= E (min_elo)")
    pgn.add_argument("--max-games", type=int, metavar="G", help="read at most G games (max_games)")
    per_game = pgn.add_mutually_exclusive_group()
    per_game.add_argument(
        "--positions-per-game", type=int, metavar="K", help="positions sampled per game (positions_per_game)"
    )
    per_game.add_argument(
        "--every-ply",
        dest="positions_per_game",
        action="store_const",
        const="every",
        help="take every position of each game",
    )
    _add_labelling_flags(pgn)
    pgn.set_defaults(handler=run_import_pgn)


def _add_endgame_parser(data_commands: argparse._SubParsersAction) -> None:
    endgame = data_commands.add_parser(
        "endgame",
        help="won positions of a tablebase endgame (KQvK, KRvK, ...) with every move valued by the tablebase",
        description="Label uniform won endgame positions with exact Syzygy values of every legal move (the warm start "
        "of the endgame curriculum; `chessgrpo pretrain` reads the result). The trainer's held-out positions are excluded.",
    )
    add_config_arguments(endgame)
    endgame.add_argument("--out", metavar="DIR", help="dataset directory (config key out)")
    endgame.add_argument(
        "--material", metavar="SIG", help="material signature, strong side first, e.g. KQvK (config key material)"
    )
    endgame.add_argument("--positions", type=int, metavar="N", help="distinct won positions (config key positions)")
    endgame.add_argument("--seed", type=int, metavar="S", help="seed of the position draw (config key seed)")
    endgame.add_argument(
        "--symmetries",
        action="store_const",
        const=True,
        default=None,
        help="also write each position's rotations and mirror images (~8x rows, no extra probes; config key symmetries)",
    )
    endgame.set_defaults(handler=run_endgame)


def _add_labelling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, metavar="K", help="node limit per labelling search (config key nodes)")
    parser.add_argument("--multipv", type=int, metavar="M", help="top moves stored per position (config key multipv)")
    parser.add_argument("--seed", type=int, metavar="S", help="random seed (config key seed)")


def _load(cls: type, args: argparse.Namespace, flags: dict[str, str]) -> Any:
    """The config from file and overrides, with the flags given on the command line applied last."""
    config = load_config(cls, args.config, args.overrides)
    overridden = {parse_override(text)[0][0] for text in args.overrides}
    for dest, key in flags.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if key in overridden:
            raise ConfigError(f"{key} is given twice: as a flag and as {key}=...; give it once")
        setattr(config, key, None if value == "every" else value)
    return config


def _format_counts(counts: dict[str, Any]) -> str:
    splits = ", ".join(f"{name} {number}" for name, number in counts["splits"].items())
    sources = ", ".join(f"{name} {number}" for name, number in counts["sources"].items())
    return f"{splits}; {sources or 'no sources'}; {counts['shards']} shard(s) per split"


def run_generate(args: argparse.Namespace) -> int:
    """Generate or resume a dataset; print what was added and where."""
    from chessgrpo.data.generate import DatasetGenerator, GenerateConfig

    config = _load(GenerateConfig, args, _GENERATE_FLAGS)
    generator = DatasetGenerator(config)
    if generator.complete:
        print(
            f"dataset {config.out} already has {generator.existing} positions (asked for {config.positions}): nothing to do"
        )
        return 0
    if generator.existing:
        logging.getLogger(__name__).info("resuming %s: %d positions already stored", config.out, generator.existing)
    with progress_bar(config.positions, "labelling", "pos", initial=generator.existing, smoothing=0.1) as bar:
        summary = generator.run(progress=bar.update)
    rate = summary.added / max(summary.seconds, 1e-9)
    print(
        f"added {summary.added} positions to {summary.directory} ({summary.total} in total: {_format_counts(summary.counts)}) "
        f"with {summary.engine} at nodes={config.nodes} multipv={config.multipv} in {summary.seconds:.1f}s "
        f"({rate:.1f} positions/s, engine startup included)"
    )
    return 0


def run_endgame(args: argparse.Namespace) -> int:
    """Label endgame positions with the tablebase; print counts, rate and where."""
    from chessgrpo.data.endgame import EndgameDataConfig, generate_endgame_dataset

    config = _load(EndgameDataConfig, args, _ENDGAME_FLAGS)
    with progress_bar(config.positions, f"{config.material} (tablebase)", "pos", smoothing=0.1) as bar:
        summary = generate_endgame_dataset(config, progress=bar.update)
    splits = ", ".join(f"{name} {number}" for name, number in summary.splits.items())
    images = f" ({summary.drawn} drawn and labelled, the rest their symmetric images)" if config.symmetries else ""
    print(
        f"wrote {summary.positions} {config.material} positions{images} to {summary.directory} ({splits}) in {summary.seconds:.1f}s "
        f"({summary.positions / max(summary.seconds, 1e-9):.0f} positions/s); "
        f"{summary.optimal_moves_per_position:.2f} DTZ-optimal moves per position on average"
    )
    return 0


def run_search_label(args: argparse.Namespace) -> int:
    """Search-label a dataset's train split (expert iteration's data step); print counts and agreement."""
    import os

    from chessgrpo.data.search_labels import label_with_search

    if args.nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {args.nodes}")
    if args.max_positions is not None and args.max_positions < 1:
        raise ConfigError(f"--max-positions must be >= 1, got {args.max_positions}")
    workers = args.workers or os.cpu_count() or 1
    with progress_bar(
        args.max_positions, f"search-label ({args.algorithm} {args.nodes} nodes)", "pos", smoothing=0.1
    ) as bar:
        summary = label_with_search(
            args.checkpoint,
            args.source,
            args.out,
            nodes=args.nodes,
            algorithm=args.algorithm,
            syzygy_path=args.syzygy_path,
            max_positions=args.max_positions,
            workers=workers,
            progress=bar.update,
        )
    print(
        f"wrote {summary.positions} search-labelled positions to {summary.directory} in {summary.seconds:.1f}s "
        f"({summary.positions / max(summary.seconds, 1e-9):.1f} positions/s, {workers} workers); the search agrees with "
        f"the source labels on {100 * summary.agreement:.1f}%; test split copied from {args.source}"
    )
    return 0


def run_import_pgn(args: argparse.Namespace) -> int:
    """Import (or resume importing) a PGN file; print game and position counts."""
    from chessgrpo.data.pgn_import import ImportPgnConfig, PgnImporter

    config = _load(ImportPgnConfig, args, _IMPORT_FLAGS)
    # Malformed games are counted and reported below; python-chess would also log each one.
    logging.getLogger("chess.pgn").setLevel(logging.CRITICAL)
    importer = PgnImporter(config)
    if importer.complete:
        print(
            f"dataset {config.out} already holds the import of {config.pgn} ({importer.existing} positions): nothing to do"
        )
        return 0
    with progress_bar(None, "labelling", "pos", initial=importer.existing, smoothing=0.1) as bar:
        summary = importer.run(progress=bar.update)
    games = summary.games
    print(
        f"read {games.games_read} games ({games.games_used} used; skipped: {games.skipped_elo} by Elo, "
        f"{games.skipped_malformed} malformed, {games.skipped_variant} variant, {games.skipped_empty} empty); "
        f"added {summary.added} positions to {summary.directory} ({summary.total} in total: {_format_counts(summary.counts)}) "
        f"in {summary.seconds:.1f}s"
    )
    return 0
