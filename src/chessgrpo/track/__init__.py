"""Run tracking: metrics to JSONL (one JSON object per logged step)."""

from chessgrpo.track.metrics import METRICS_FILE, MetricsWriter, read_metrics

__all__ = ["METRICS_FILE", "MetricsWriter", "read_metrics"]
