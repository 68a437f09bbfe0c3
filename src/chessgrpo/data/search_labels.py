"""Search as a teacher: label positions with the policy's own search (expert iteration's data step).

`label_with_search` reads the positions of a dataset's train split, searches each with a policy
that has a value head (`chessgrpo.search`, PUCT by default) and writes a new dataset in the same
schema (`data.schema`), so `kind: pretrain` trains on it unchanged:

- ``best_move`` is the search's move (most visited), ``moves`` the root moves by visits (up to
  `top_moves`), ``win_probs`` their searched values (the mover's expected score) and ``value``
  the root's value: `objective: bc` learns the search's choices, `objective: distill` its
  value-weighted preferences, and the value head the search's backed-up values;
- ``source`` is ``"search"`` and ``nodes`` the budget;
- the test split is copied from the source dataset unchanged: held-out evaluation stays on the
  engine's labels, so a policy trained on search labels is judged against the same yardstick.

Positions are searched in `workers` processes (one torch thread each), in order of the source
rows; a position whose search finds a single legal move is kept (its label is exact).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chess

from chessgrpo.board import move_to_action
from chessgrpo.data.schema import read_positions, shard_checksums, shard_paths, write_manifest, write_shard
from chessgrpo.errors import InputError

SHARD_ROWS = 4096


@dataclasses.dataclass(frozen=True)
class SearchLabelSummary:
    directory: Path
    positions: int
    seconds: float
    agreement: float
    """Share of positions where the search's move equals the source label's best move."""


def _search_rows(job: tuple[str, dict[str, Any], list[str], list[str], int]) -> list[dict[str, Any]]:
    checkpoint, settings, fens, engine_best, top_moves = job
    import torch

    from chessgrpo.models.policy import load_policy
    from chessgrpo.search import Searcher, SearchSettings

    torch.set_num_threads(1)  # one core per worker: the search's batches are small
    searcher = Searcher(load_policy(checkpoint), SearchSettings(**settings))
    rows = []
    try:
        for fen, best in zip(fens, engine_best):
            board = chess.Board(fen)
            result = searcher.search(board)
            root = result.root_moves[:top_moves]
            moves = [m.move.uci() for m in root]
            rows.append(
                dict(
                    fen=fen,
                    source="search",
                    best_move=moves[0],
                    best_action=move_to_action(root[0].move),
                    moves=moves,
                    win_probs=[float(m.value) for m in root],
                    value=float(root[0].value),
                    legal_moves=None,
                    legal_win_probs=None,
                    nodes=int(settings["nodes"]),
                    agrees=moves[0] == best,
                )
            )
    finally:
        searcher.close()
    return rows


def label_with_search(
    checkpoint: str,
    source: str | Path,
    out: str | Path,
    *,
    nodes: int = 64,
    algorithm: str = "puct",
    syzygy_path: str | None = None,
    max_positions: int | None = None,
    top_moves: int = 5,
    workers: int = 1,
    chunk: int = 64,
    progress: Callable[[int], Any] | None = None,
) -> SearchLabelSummary:
    """Search-label the train split of `source` into the dataset directory `out` (module docstring).

    Raises:
        FileExistsError: `out` already has shards (nothing is overwritten).
        FileNotFoundError / ValueError: the source dataset or the checkpoint is unusable.
    """
    from chessgrpo.search import SearchSettings

    out = Path(out)
    if shard_paths(out, "train") or shard_paths(out, "test"):
        raise FileExistsError(f"dataset directory {str(out)!r} already has shards; choose a new --out")
    settings = dataclasses.asdict(SearchSettings(nodes=nodes, algorithm=algorithm, syzygy_path=syzygy_path))
    table = read_positions(source, "train", ["fen", "best_move"])
    fens, engine_best = table.column("fen").to_pylist(), table.column("best_move").to_pylist()
    if max_positions is not None:
        fens, engine_best = fens[:max_positions], engine_best[:max_positions]
    if not fens:
        raise InputError(f"dataset {str(source)!r} has no train positions to label")
    from chessgrpo.models.policy import load_policy
    from chessgrpo.search import NetworkEvaluator

    NetworkEvaluator(load_policy(checkpoint))  # fail fast: a bad checkpoint, or one without a value head
    jobs = [
        (str(checkpoint), settings, fens[i : i + chunk], engine_best[i : i + chunk], top_moves)
        for i in range(0, len(fens), chunk)
    ]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    context = multiprocessing.get_context("spawn")
    with context.Pool(max(1, workers)) as pool:
        for batch in pool.imap(_search_rows, jobs):
            rows.extend(batch)
            if progress is not None:
                progress(len(batch))
    agreement = sum(row.pop("agrees") for row in rows) / len(rows)
    for index, start in enumerate(range(0, len(rows), SHARD_ROWS)):
        write_shard(rows[start : start + SHARD_ROWS], out / "train" / f"shard-{index:05d}.parquet")
    for path in shard_paths(source, "test"):  # held-out evaluation stays on the engine's labels
        (out / "test").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / "test" / path.name)
    seconds = time.perf_counter() - started
    write_manifest(
        out,
        {
            "command": "data search-label",
            "checkpoint": str(checkpoint),
            "source": str(source),
            "search": settings,
            "positions": len(rows),
            "agreement_with_source": agreement,
            "seconds": seconds,
            "shard_sha256": shard_checksums(out),
        },
    )
    return SearchLabelSummary(out, len(rows), seconds, agreement)
