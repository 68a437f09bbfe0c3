"""Evaluation: offline move metrics, Lichess puzzles, games against anchors (Elo), and intervals.

Games (`games`, `anchors`, `anchor_checks`, `movers`, `elo`, and `match`, the match driver of
`chessgrpo eval games` with its `GamesConfig`) and the UCI adapter (`uci_engine`, `uci_go`) are
imported from their modules; they pull in multiprocessing and engines, so they are not loaded here.
`standalone` runs one player beside the baselines (`chessgrpo eval offline|puzzles|epd`,
`EvalConfig`). `registry` has one entry per evaluation: how its result files are named and
recognised, its metrics with their direction, how `eval compare` pairs it and what run data reads
from it.

Every metric is reported with an interval (`stats.Interval`) and beside two fixed baselines
(a uniformly random player and Stockfish at a tiny node budget), so a number always has context.
"""

from chessgrpo.eval.compare import Comparison, compare_files, compare_records
from chessgrpo.eval.offline import BLUNDER_THRESHOLD, MoveRecord, OfflineResult, evaluate_offline, move_values, score_moves
from chessgrpo.eval.players import DEFAULT_BASELINE_NODES, Player, PolicyPlayer, RandomPlayer, StockfishPlayer
from chessgrpo.eval.positions import LabelledPosition, load_eval_positions
from chessgrpo.eval.puzzles import (
    RATING_BUCKETS,
    Puzzle,
    PuzzleRecord,
    PuzzleResult,
    PuzzleSet,
    parse_puzzle,
    read_puzzles,
    solve_puzzles,
)
from chessgrpo.eval.stats import Interval, bootstrap_interval, paired_bootstrap_difference, wilson_interval

__all__ = [
    "Comparison",
    "compare_files",
    "compare_records",
    "BLUNDER_THRESHOLD",
    "DEFAULT_BASELINE_NODES",
    "RATING_BUCKETS",
    "Interval",
    "LabelledPosition",
    "MoveRecord",
    "OfflineResult",
    "Player",
    "PolicyPlayer",
    "Puzzle",
    "PuzzleRecord",
    "PuzzleResult",
    "PuzzleSet",
    "RandomPlayer",
    "StockfishPlayer",
    "bootstrap_interval",
    "evaluate_offline",
    "load_eval_positions",
    "move_values",
    "paired_bootstrap_difference",
    "parse_puzzle",
    "read_puzzles",
    "score_moves",
    "solve_puzzles",
    "wilson_interval",
]
