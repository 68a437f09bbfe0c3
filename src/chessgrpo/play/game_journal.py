"""A journal of finished games: a long `chessgrpo eval games` run survives an interruption.

Searched games are slow (200 games of a 1024-node search take hours on two cores), and a stopped
run used to lose every game it had played: the PGN and the JSON are written at the end. The
journal (``<pgn>.journal.jsonl`` beside the PGN) gets one JSON line per game as it finishes,
flushed to disk; a rerun of the same command reads it, keeps the games it already has and plays
only the rest. A finished run removes it (its PGN and JSON hold everything).

Each line is keyed by what decides the game: the player's settings (search included), a digest of
its weights, the anchor and its settings (a checkpoint anchor's weights too), the opening, the
colour and the game's seed (`task_key`). A rerun with other settings, other weights or another
suite of openings finds no matching keys and plays everything again; a rerun with more games keeps
the pairs both runs share. A line cut short by a crash is skipped with a warning; nothing else in
the file is trusted blindly: a line whose key matches no game of this run is ignored.

Engine anchors with randomness (Stockfish's Skill Level picks among moves with a time-seeded
generator) do not replay a game move for move anyway, so a resumed run is a run whose games were
played in two sittings, not a re-creation of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from chessgrpo.play.games import GameResult, GameSettings, GameTask

log = logging.getLogger(__name__)

JOURNAL_SUFFIX = ".journal.jsonl"
_WEIGHT_FILES = ("model.safetensors", "model_config.json")


def journal_path(pgn_path: Path) -> Path:
    """Where the journal of a run writing `pgn_path` lives."""
    return pgn_path.with_name(pgn_path.name + JOURNAL_SUFFIX)


def weights_digest(checkpoint: str | os.PathLike[str]) -> str:
    """sha256 of a checkpoint directory's weights and model config (of every file's name, size and
    modification time when it has neither): two runs of one path with retrained weights differ."""
    directory = Path(checkpoint)
    digest = hashlib.sha256()
    files = [directory / name for name in _WEIGHT_FILES if (directory / name).is_file()]
    if files:
        for file in files:
            digest.update(file.name.encode())
            with open(file, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    elif directory.is_dir():
        for file in sorted(p for p in directory.rglob("*") if p.is_file()):
            stat = file.stat()
            digest.update(f"{file.relative_to(directory)}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


class GameJournal:
    """The journal of one run (module docstring): `load` what was played, `append` each new game."""

    def __init__(self, path: Path, settings: GameSettings, tasks: Sequence[GameTask]):
        self.path = Path(path)
        player = json.dumps(dataclasses.asdict(settings), sort_keys=True, default=str)
        weights = {settings.checkpoint: weights_digest(settings.checkpoint)}
        for task in tasks:
            if task.anchor.kind == "checkpoint" and task.anchor.path and task.anchor.path not in weights:
                weights[task.anchor.path] = weights_digest(task.anchor.path)
        self._keys = {(task.anchor_index, task.pair, task.game): task_key(player, weights, task) for task in tasks}
        self._handle = None

    def key(self, result: GameResult) -> str:
        """The key of the task that `result` finished."""
        return self._keys[(result.anchor_index, result.pair, result.game)]

    def load(self) -> list[GameResult]:
        """The games of this run already in the journal (one per task at most), in journal order."""
        if not self.path.is_file():
            return []
        wanted = {key: place for place, key in self._keys.items()}
        found: dict[str, GameResult] = {}
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    key, fields = record["key"], record["result"]
                    if key not in wanted or key in found:
                        continue
                    result = GameResult(**fields)
                except (ValueError, KeyError, TypeError) as error:
                    log.warning(
                        "games journal %s line %d is unreadable (%s); that game is played again",
                        self.path,
                        number,
                        error,
                    )
                    continue
                if (result.anchor_index, result.pair, result.game) != wanted[key]:
                    log.warning(
                        "games journal %s line %d does not match its key; that game is played again", self.path, number
                    )
                    continue
                found[key] = result
        return list(found.values())

    def append(self, result: GameResult) -> None:
        """Write `result` as one line, flushed and synced: a crash loses at most the game in flight."""
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")
        self._handle.write(json.dumps({"key": self.key(result), "result": dataclasses.asdict(result)}) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def remove(self) -> None:
        """Delete the journal (the run finished and wrote its PGN and JSON)."""
        self.close()
        self.path.unlink(missing_ok=True)


def task_key(player: str, weights: dict[str, str], task: GameTask) -> str:
    """What decides one game, hashed: the player's settings and weights, the anchor, the opening,
    the colour and the seed."""
    anchor = dataclasses.asdict(task.anchor)
    fields = {
        "player": player,
        "player_weights": weights[json.loads(player)["checkpoint"]],
        "anchor": anchor,
        "anchor_weights": weights.get(task.anchor.path or "", None) if task.anchor.kind == "checkpoint" else None,
        "anchor_settings": task.anchor_settings,
        "pair": task.pair,
        "game": task.game,
        "opening": [task.opening.fen, list(task.opening.moves)],
        "seed": task.seed,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def remaining(tasks: Iterable[GameTask], done: Iterable[GameResult]) -> list[GameTask]:
    """The tasks not finished by `done`, in their order."""
    finished = {(r.anchor_index, r.pair, r.game) for r in done}
    return [task for task in tasks if (task.anchor_index, task.pair, task.game) not in finished]
