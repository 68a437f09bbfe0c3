"""The evaluations: offline move metrics, Lichess puzzles, EPD suites, held-out endgames, the chess LM's
text tasks, the value head, and their comparison.

`registry` has one entry per evaluation: its config and runner (every command, training run and re-measure runs
evaluations through it, and its `write_result` is the one writer of result files), how its result files are named
and recognised, its metrics with their direction, how `eval compare` pairs it and what run data reads from it.
`running` holds what a runner takes and gives (`Subject`, `EvalContext`, `EvalOutput`). `standalone` runs one
player beside the baselines (`chessgrpo eval offline|puzzles|epd`, `EvalConfig`); `games` runs the match of
`chessgrpo eval games`.

Games between players (Elo against anchors, the match driver of `chessgrpo eval games`) live in
`chessgrpo.play`; the policy as a UCI engine in `chessgrpo.uci`; intervals in `chessgrpo.stats`.

Every metric is reported with an interval (`chessgrpo.stats.Interval`) and beside two fixed baselines
(a uniformly random player and Stockfish at a tiny node budget), so a number always has context.
"""

from chessgrpo.eval.compare import Comparison, compare_files, compare_records
from chessgrpo.eval.offline import (
    BLUNDER_THRESHOLD,
    MoveRecord,
    OfflineResult,
    evaluate_offline,
    move_values,
    score_moves,
)
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

__all__ = [
    "Comparison",
    "compare_files",
    "compare_records",
    "BLUNDER_THRESHOLD",
    "RATING_BUCKETS",
    "LabelledPosition",
    "MoveRecord",
    "OfflineResult",
    "Puzzle",
    "PuzzleRecord",
    "PuzzleResult",
    "PuzzleSet",
    "evaluate_offline",
    "load_eval_positions",
    "move_values",
    "parse_puzzle",
    "read_puzzles",
    "score_moves",
    "solve_puzzles",
]
