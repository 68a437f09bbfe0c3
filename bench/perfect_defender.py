"""The perfect defender's cost per answer: `Tablebase.best_moves` (every legal move probed) against the cached
`Tablebase.tablebase_move`, on the positions where a KQvK or KRvK rollout asks for an answer.

    .venv/bin/python bench/perfect_defender.py [--material KRvK] [--games 128] [--repeats 5]

The positions: `--games` games from won starts within `--max-plies` of mate (the curriculum's early steps), the
strong side playing uniformly random legal moves (a random network), the defender answering perfectly, up to 10
own moves: every position where the defender is to move is recorded with its move stack stripped. Then, in each of
`--repeats` rounds, the same positions are answered three ways, alternated so that a slow spell of the machine hits
all of them: ``uncached`` (`best_moves`, with the probe caches of a fresh `Tablebase`: a run's first step),
``probes cached`` (`best_moves` again, its probes now cached: a run's later steps before this cache existed) and
``cached`` (`tablebase_move`, filled in round one). The table gives the median microseconds per answer.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import chess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from chessgrpo.board.endgames import EndgameStarts  # noqa: E402
from chessgrpo.engine.tablebase import Tablebase  # noqa: E402
from chessgrpo.engine.tablebase_values import game_over  # noqa: E402
from chessgrpo.paths import find_data_path  # noqa: E402


def defender_positions(tablebase: Tablebase, material: str, games: int, max_plies: int, seed: int) -> list[chess.Board]:
    """The positions where the defender answers, in `games` games of a random attacker (module docstring)."""
    rng = random.Random(seed)
    starts = EndgameStarts(material, tablebase.is_won, tables=tablebase.names, plies=tablebase.probe_dtz)
    positions = []
    for board in starts.draw(games, seed=seed, step=0, max_plies=max_plies):
        for _ in range(10):
            board.push(rng.choice(list(board.legal_moves)))
            if game_over(board) is not None:
                break
            positions.append(board.copy(stack=False))
            board.push(tablebase.tablebase_move(board))
            if game_over(board) is not None:
                break
    return positions


def per_answer_us(answer, positions: list[chess.Board]) -> float:
    start = time.perf_counter()
    for board in positions:
        answer(board)
    return 1e6 * (time.perf_counter() - start) / len(positions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--material", default="KQvK")
    parser.add_argument("--games", type=int, default=128)
    parser.add_argument("--max-plies", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tables = str(find_data_path("data/syzygy"))
    with Tablebase(tables) as setup:
        positions = defender_positions(setup, args.material, args.games, args.max_plies, args.seed)
    times: dict[str, list[float]] = {"uncached": [], "probes cached": [], "cached": []}
    cached = Tablebase(tables)
    for _ in range(args.repeats):
        with Tablebase(tables) as fresh:
            times["uncached"].append(per_answer_us(lambda board: fresh.best_moves(board)[0], positions))
            times["probes cached"].append(per_answer_us(lambda board: fresh.best_moves(board)[0], positions))
        times["cached"].append(per_answer_us(cached.tablebase_move, positions))
    cached.close()
    print(f"{args.material}: {len(positions)} defender positions, {args.repeats} rounds (median us per answer)")
    print("| answer | us per answer | x uncached |")
    print("|---|---|---|")
    base = statistics.median(times["uncached"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {base / median:.1f} |")


if __name__ == "__main__":
    main()
