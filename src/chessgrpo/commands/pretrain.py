"""Placeholder: `chessgrpo pretrain` is being written (owned by one engineer at a time)."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:  # noqa: ARG001 - not registered yet
    return None
