"""Argument helpers shared by the command modules."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` plus positional ``key=value`` overrides, as every configurable command takes."""
    parser.add_argument("--config", type=Path, default=None, help="YAML config file (defaults apply where it is silent)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides applied after the file, e.g. engine.nodes=5000"
    )
