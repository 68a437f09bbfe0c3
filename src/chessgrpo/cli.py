"""The `chessgrpo` command: parses arguments and renders errors; each command lives in `commands/`."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence

from chessgrpo.commands import COMMAND_MODULES
from chessgrpo.config import ConfigError
from chessgrpo.errors import ChessGRPOError, InputError


def version_text() -> str:
    """ "chessgrpo X (torch Y, python-chess Z, Python W)": installed distribution versions, read from
    their metadata (fast: torch is not imported)."""
    import platform
    from importlib import metadata

    def version(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"chessgrpo {version('chessgrpo')} (torch {version('torch')}, python-chess {version('chess')}, "
        f"Python {platform.python_version()})"
    )


class _VersionAction(argparse.Action):
    """``--version``: print `version_text` and exit 0 (computed only when asked for)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        help = "print the versions of chessgrpo, torch and python-chess and exit"
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chessgrpo", description="GRPO with verifiable rewards for chess policies.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"chessgrpo.commands.{name}").add_parser(commands)
    return parser


_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``key=value`` overrides may stand anywhere, also after options."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [token for token in extra if not _OVERRIDE.match(token)]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        if not hasattr(args, "overrides"):
            parser.error(f"this command takes no key=value overrides: {' '.join(extra)}")
        args.overrides = list(args.overrides or []) + extra
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    # In a torchrun job the ranks other than 0 say only what goes wrong (rank 0 tells the story).
    quiet_rank = os.environ.get("RANK", "0") not in ("", "0")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet_rank else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.handler(args) or 0)
    except ConfigError as error:
        print(f"chessgrpo: config error: {error}", file=sys.stderr)
        return 2
    except InputError as error:  # bad input named by the library (a file, a FEN, a checkpoint)
        print(f"chessgrpo: {error}", file=sys.stderr)
        return 2
    except ChessGRPOError as error:  # expected: one line, no traceback
        print(f"chessgrpo: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except FileNotFoundError as error:  # a missing input file (the OS error names it)
        print(f"chessgrpo: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chessgrpo: interrupted", file=sys.stderr)
        return 130
    # Anything else (a CUDA out-of-memory, a plain ValueError from a shape check, a bug) keeps its
    # traceback and exits 1: only `InputError` says the user's input was wrong.


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
