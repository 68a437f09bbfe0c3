"""Hyperparameter search on the training spine, with Optuna (`chessgrpo sweep`, docs/sweep.md).

- `config`: the sweep YAML (`SweepConfig`: base, overrides, space, objective, budget, sampler,
  pruner, storage, parallel) and `resolve_sweep`, which checks it against the base kind's config class;
- `study`: `run_sweep`, the Optuna study whose trials are ordinary run directories trained by
  `train.loop.Trainer`, pruned on their held-out evaluations, failed with their reason;
- `storage`: opening the Optuna storage (`open_storage`), `quiet_optuna`, `redacted` URLs;
- `summary`: `summarize` (best trials with intervals, importances), `write_best_config`, and
  `remeasure` (the best trial against the default on positions no trial was evaluated on).
"""

from chessgrpo.sweep.config import ParamSpace, Sweep, SweepConfig, load_sweep, resolve_sweep

__all__ = ["ParamSpace", "Sweep", "SweepConfig", "load_sweep", "resolve_sweep"]
