"""Stockfish process pool, evaluation cache, win probabilities and Syzygy probing."""

from chessgrpo.engine.cache import EvaluationCache
from chessgrpo.engine.evaluation import Analysis, Evaluation, MoveEvaluation, wdl_model_for
from chessgrpo.engine.locate import EngineError, EngineNotFoundError, find_stockfish
from chessgrpo.engine.pool import EnginePool, available_cores
from chessgrpo.engine.pool_workers import PoolStats, RetryPolicy, SearchLimit
from chessgrpo.engine.tablebase import Tablebase, TablebaseResult

__all__ = [
    "Analysis",
    "EngineError",
    "EngineNotFoundError",
    "EnginePool",
    "Evaluation",
    "EvaluationCache",
    "MoveEvaluation",
    "PoolStats",
    "RetryPolicy",
    "SearchLimit",
    "Tablebase",
    "TablebaseResult",
    "available_cores",
    "find_stockfish",
    "wdl_model_for",
]
