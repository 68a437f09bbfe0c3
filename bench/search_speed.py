"""Search speed: PUCT simulations/s and alpha-beta evaluations/s, one thread, on fixed positions.

Searches the same positions (the first `--positions` test positions of a dataset, or the start
position and a few fixed middlegames) with a checkpoint's value-head network, alternating the
algorithms `--repeats` times; the figure per algorithm is the median over repeats of
(nodes searched / seconds) over all positions. Also reports the PUCT leaf-batch size's effect.

    .venv/bin/python bench/search_speed.py --checkpoint runs/quickstart/pretrain --nodes 256 --repeats 3

With no checkpoint a fresh tiny network (2 x 64, move facts, value head) is used: the speed
depends on the shape, not on the weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import chess  # noqa: E402
import torch  # noqa: E402

from chessgrpo.models.policy import ActionPolicy, PolicyConfig, load_policy  # noqa: E402
from chessgrpo.search import Searcher, SearchSettings  # noqa: E402

FIXED = [
    chess.STARTING_FEN,
    "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
    "r1bq1rk1/pp2bppp/2n1pn2/3p4/2PP4/2N1PN2/PP3PPP/R2QKB1R w KQ - 0 8",
    "2r2rk1/pp1bqppp/2n1pn2/3p4/3P4/2PBPN2/PP1N1PPP/R2Q1RK1 w - - 4 12",
    "8/5pk1/6p1/3R4/5P2/6PK/r7/8 b - - 3 45",
]


def measure(searcher: Searcher, boards: list[chess.Board]) -> float:
    nodes, started = 0, time.perf_counter()
    for board in boards:
        nodes += searcher.search(board).nodes
    return nodes / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="policy with a value head (default: a fresh tiny network)")
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.checkpoint:
        policy = load_policy(args.checkpoint)
    else:
        torch.manual_seed(0)
        policy = ActionPolicy(PolicyConfig(move_facts=True, value_head=True))
    boards = [chess.Board(fen) for fen in FIXED]
    variants = {
        "puct batch 16": SearchSettings(nodes=args.nodes, algorithm="puct", batch_size=16),
        "puct batch 1": SearchSettings(nodes=args.nodes, algorithm="puct", batch_size=1),
        "alphabeta width 4": SearchSettings(nodes=args.nodes, algorithm="alphabeta"),
    }
    searchers = {name: Searcher(policy, settings) for name, settings in variants.items()}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, searcher in searchers.items():
            rates[name].append(measure(searcher, boards))
    print(f"{len(boards)} positions, {args.nodes} nodes each, one torch thread, median of {args.repeats} repeats")
    for name, values in rates.items():
        print(f"  {name:<18} {statistics.median(values):8.0f} nodes/s   ({', '.join(f'{v:.0f}' for v in values)})")
    base = statistics.median(rates["puct batch 1"])
    print(f"  leaf batching: {statistics.median(rates['puct batch 16']) / base:.2f}x the batch-1 rate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
