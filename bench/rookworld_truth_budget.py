"""How many Stockfish nodes the P: reward's truth needs: stability and agreement with upstream labels.

For the P: lines of ``data/rookworld_samples.txt`` (real upstream RookWorld lines) and
each node budget N, the truth is `policy_truths` at N nodes (multipv 5, one process, no cache, 1 MB
hash cleared per search: deterministic). Columns:

- ``self@2N``: share of positions whose best move at N equals the best move at 2N (exact);
- ``credit@2N``: mean graded credit (`regret_credit`) of N's best move under the truth at 2N;
- ``credit@ref``: mean graded credit of N's best move under a deep reference truth (``--reference``);
- ``regret@ref``: mean win-probability regret (percentage points) of N's best move under that reference;
- ``=upstream``: share whose best move at N equals the upstream B: label;
- ``upstream credit``: mean graded credit of the upstream B: under the truth at N (all lines, and
  White-to-move lines only: upstream's Black labels are often the worst listed move, see the file);
- ``s/truth``: wall seconds per truth (one multipv-5 analysis, one process).

A B: outside the engine's list is valued by searching the position after it, as the reward does.

    .venv/bin/python bench/rookworld_truth_budget.py --budgets 1000 2000 5000 10000 20000
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import chess  # noqa: E402

from chessgrpo.data.rookworld_format import PolicyAnswer, parse_environment_line, parse_policy_line  # noqa: E402
from chessgrpo.data.rookworld_grading import regret_credit  # noqa: E402
from chessgrpo.data.rookworld_truths import PolicyTruth, policy_truths, unlisted_move_values  # noqa: E402
from chessgrpo.engine import EnginePool  # noqa: E402

SAMPLES = ROOT / "data" / "rookworld_samples.txt"  # shipped with the repository


def read_samples(path: Path, with_a_positions: bool) -> list[tuple[str, PolicyAnswer | None]]:
    """(FEN, upstream answer) of every P: line of the samples file, then (FEN, None) of its A: lines' positions."""
    lines = path.read_text().splitlines()
    samples: list[tuple[str, PolicyAnswer | None]] = [
        parse_policy_line(line) for line in lines if line.startswith("P:")
    ]
    if with_a_positions:
        samples += [(parse_environment_line(line)[0].fen, None) for line in lines if line.startswith("A:")]
    return samples


class Truths:
    """Truths per node budget, each budget analysed once (timed) and kept."""

    def __init__(self, pool: EnginePool, fens: list[str]):
        self.pool, self.fens = pool, fens
        self.by_nodes: dict[int, list[PolicyTruth]] = {}
        self.seconds: dict[int, float] = {}

    def at(self, nodes: int) -> list[PolicyTruth]:
        if nodes not in self.by_nodes:
            started = time.perf_counter()
            self.by_nodes[nodes] = policy_truths(self.pool, self.fens, nodes=nodes)
            self.seconds[nodes] = (time.perf_counter() - started) / len(self.fens)
        return self.by_nodes[nodes]


def move_regret(pool: EnginePool, truth: PolicyTruth, move: str, nodes: int) -> float:
    """Win probability `move` gives up against `truth`'s best line (a legal move outside its list searched at `nodes`)."""
    wins = dict(zip(truth.moves, truth.wins))
    if move not in wins:
        wins[move] = unlisted_move_values(pool, [(truth.fen, move)], nodes=nodes)[(truth.fen, move)].win
    return truth.best_win - wins[move]


def move_credit(pool: EnginePool, truth: PolicyTruth, move: str, nodes: int, tolerance: float, zero_at: float) -> float:
    """The reward's graded credit of `move` under `truth` (an illegal move: 0)."""
    if move not in truth.legal:
        return 0.0
    return regret_credit(move_regret(pool, truth, move, nodes), tolerance=tolerance, zero_at=zero_at)


def measure(
    pool: EnginePool,
    samples: list[tuple[str, PolicyAnswer | None]],
    budgets: list[int],
    reference: int,
    tolerance: float,
    zero_at: float,
) -> list[dict[str, float]]:
    fens = [fen for fen, _ in samples]
    truths = Truths(pool, fens)
    deep = truths.at(reference)
    labelled = [(i, a) for i, (_, a) in enumerate(samples) if a is not None]
    rows = []
    for nodes in budgets:
        here, double = truths.at(nodes), truths.at(2 * nodes)
        up = [move_credit(pool, here[i], a.best, nodes, tolerance, zero_at) for i, a in labelled]
        white = [chess.Board(fens[i]).turn == chess.WHITE for i, _ in labelled]
        rows.append(
            {
                "nodes": nodes,
                "self_2n": statistics.mean(h.best == d.best for h, d in zip(here, double)),
                "credit_2n": statistics.mean(
                    move_credit(pool, d, h.best, 2 * nodes, tolerance, zero_at) for h, d in zip(here, double)
                ),
                "credit_ref": statistics.mean(
                    move_credit(pool, r, h.best, reference, tolerance, zero_at) for h, r in zip(here, deep)
                ),
                "regret_ref": statistics.mean(
                    max(0.0, move_regret(pool, r, h.best, reference)) for h, r in zip(here, deep)
                ),
                "upstream_exact": statistics.mean(here[i].best == a.best for i, a in labelled),
                "upstream_credit": statistics.mean(up),
                "upstream_credit_white": statistics.mean(c for c, w in zip(up, white) if w),
                "seconds": truths.seconds[nodes],
            }
        )
    return rows


def markdown(rows: list[dict[str, float]], n: int, n_labelled: int, n_white: int) -> str:
    head = (
        "| nodes | self@2N | credit@2N | credit@ref | regret@ref (pp) | =upstream | upstream credit (all) "
        f"| upstream credit (White, n={n_white}) | s/truth |"
    )
    out = [head, "|" + "---|" * 9]
    for r in rows:
        out.append(
            f"| {r['nodes']} | {r['self_2n']:.2f} | {r['credit_2n']:.2f} | {r['credit_ref']:.2f} | {100 * r['regret_ref']:.2f} "
            f"| {r['upstream_exact']:.2f} "
            f"| {r['upstream_credit']:.2f} | {r['upstream_credit_white']:.2f} | {r['seconds']:.3f} |"
        )
    return "\n".join(out) + f"\n\n(stability columns: n = {n} positions; upstream columns: n = {n_labelled} P: lines)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=Path, default=SAMPLES)
    parser.add_argument("--budgets", type=int, nargs="+", default=[1000, 2000, 5000, 10000, 20000])
    parser.add_argument("--reference", type=int, default=200_000, help="nodes of the deep reference truth")
    parser.add_argument("--tolerance", type=float, default=0.02, help="regret_tolerance of the graded credit")
    parser.add_argument("--zero-at", type=float, default=0.2, help="regret_zero_credit of the graded credit")
    parser.add_argument("--with-a-positions", action="store_true", help="stability columns over the A: positions too")
    parser.add_argument("--engine", default=None, help="Stockfish path (default: as the project finds it)")
    parser.add_argument("--hash-mb", type=int, default=1, help="UCI Hash (the project's default engine.hash_mb is 1)")
    args = parser.parse_args()
    samples = read_samples(args.samples, args.with_a_positions)
    n_white = sum(chess.Board(fen).turn == chess.WHITE for fen, a in samples if a is not None)
    with EnginePool(args.engine, processes=1, hash_mb=args.hash_mb, cache_path=None) as pool:
        rows = measure(pool, samples, sorted(args.budgets), args.reference, args.tolerance, args.zero_at)
        engine = pool.engine_name
    print(
        f"{datetime.date.today()} {engine}, {platform.machine()} {platform.node()}, one process, one thread, hash {args.hash_mb} MB, "
        f"reference {args.reference} nodes, tolerance {args.tolerance}, zero credit at {args.zero_at}"
    )
    print(markdown(rows, len(samples), sum(a is not None for _, a in samples), n_white))
    return 0


if __name__ == "__main__":
    sys.exit(main())
