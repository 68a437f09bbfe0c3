"""Run tracking, diagnosis and reports.

- `metrics`: metrics.jsonl (one JSON object per logged step), optionally mirrored to TensorBoard and
  W&B (`backends`, configured by `TrackingConfig`, the ``tracking:`` config section);
- `run_data`: a run directory read back (config, rows, evaluation files), also while it runs;
- `diagnose`: pure checks over a run that say why it is not learning (`chessgrpo diagnose`);
- `plots` and `report`: the figures and the self-contained HTML report (`chessgrpo report`).

Heavy modules (matplotlib, tensorboard, wandb) are imported only by the functions that need them.
"""

from chessgrpo.track.backends import BackendUnavailable, TrackingConfig
from chessgrpo.track.metrics import METRICS_FILE, MetricsWriter, read_metrics

__all__ = ["METRICS_FILE", "BackendUnavailable", "MetricsWriter", "TrackingConfig", "read_metrics"]
