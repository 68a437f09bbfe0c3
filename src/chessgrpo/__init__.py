"""chessgrpo: GRPO with verifiable rewards (Stockfish, Syzygy tablebases) for chess policies."""

__version__ = "0.1.0"
