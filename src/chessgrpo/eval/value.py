"""How good a value head is on held-out positions: error and calibration against the engine's values.

The target of a position is its label's `value` (the side to move's expected score after the
engine's best move, `data.schema`). The comparison point is the best **constant** predictor a
user could have without any network: the mean target of the train split (so the baseline never
sees the held-out values). Reported, each with a bootstrap interval over positions:

- ``mae``: mean |predicted - target| of the head; ``baseline_mae`` of the constant;
- ``mae_gain``: baseline_mae - mae, paired on the same positions (> 0: the head is better);
- calibration: positions binned by predicted value (10 equal-width bins), the mean prediction
  and mean target per bin, and the expected calibration error (bin-weighted |mean prediction -
  mean target|; 0 is perfectly calibrated).

`run_value` is the registry's runner (`eval.registry`); the positions come encoded from the caller (`ValueItems`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from chessgrpo.eval.running import EvalContext, Subject, interval_metrics
from chessgrpo.stats import Interval, bootstrap_interval, paired_bootstrap_difference

CALIBRATION_BINS = 10


@dataclasses.dataclass
class ValueQuality:
    """A value head's error and calibration on one set of positions (module docstring)."""

    mae: Interval
    baseline_mae: Interval
    baseline: float
    """The constant the baseline predicts (mean train target)."""
    mae_gain: Interval
    """baseline_mae - mae, paired; > 0 means the head beats the constant."""
    calibration: list[dict[str, float]]
    """Per non-empty bin: low, high, n, mean_predicted, mean_target."""
    ece: float

    def to_json(self) -> dict[str, Any]:
        return {
            "mae": self.mae.to_json(),
            "baseline_mae": self.baseline_mae.to_json(),
            "baseline": self.baseline,
            "mae_gain": self.mae_gain.to_json(),
            "calibration": self.calibration,
            "ece": self.ece,
        }


def value_quality(
    predicted: np.ndarray, targets: np.ndarray, baseline: float, *, confidence: float = 0.95, seed: int = 0
) -> ValueQuality:
    """Error, paired gain over the constant `baseline` and calibration of `predicted` against `targets`."""
    predicted, targets = np.asarray(predicted, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    if predicted.shape != targets.shape or predicted.ndim != 1 or len(predicted) == 0:
        raise ValueError(f"need equal, non-empty 1-D arrays, got {predicted.shape} and {targets.shape}")
    errors = np.abs(predicted - targets)
    baseline_errors = np.abs(baseline - targets)
    bins = np.minimum((predicted * CALIBRATION_BINS).astype(int), CALIBRATION_BINS - 1)
    calibration, ece = [], 0.0
    for index in range(CALIBRATION_BINS):
        chosen = bins == index
        if not chosen.any():
            continue
        mean_predicted, mean_target = float(predicted[chosen].mean()), float(targets[chosen].mean())
        calibration.append(
            {
                "low": index / CALIBRATION_BINS,
                "high": (index + 1) / CALIBRATION_BINS,
                "n": int(chosen.sum()),
                "mean_predicted": mean_predicted,
                "mean_target": mean_target,
            }
        )
        ece += chosen.mean() * abs(mean_predicted - mean_target)
    return ValueQuality(
        mae=bootstrap_interval(errors, confidence=confidence, seed=seed),
        baseline_mae=bootstrap_interval(baseline_errors, confidence=confidence, seed=seed),
        baseline=float(baseline),
        mae_gain=paired_bootstrap_difference(baseline_errors, errors, confidence=confidence, seed=seed),
        calibration=calibration,
        ece=float(ece),
    )


@torch.no_grad()
def predict_values(model: Any, tokens: torch.Tensor, batch_size: int = 1024) -> np.ndarray:
    """The value head's expected score for each encoded position (eval mode, fp32)."""
    if model.value_head is None:
        raise ValueError("this checkpoint has no value head (pretrain one with model.value_head: true)")
    model.eval()
    out = []
    for start in range(0, len(tokens), batch_size):
        _, value_logits = model(tokens[start : start + batch_size].to(model.device), with_value=True)
        out.append(torch.sigmoid(value_logits.float()).cpu().numpy())
    return np.concatenate(out)


@dataclasses.dataclass
class ValueEvalConfig:
    """`chessgrpo eval value`: the value head's quality on a dataset's test split (its flags set these)."""

    data: str = "data/tiny"
    """Dataset directory: its test split is scored, its train split gives the constant baseline."""
    confidence: float = 0.95
    """Interval level."""
    output: str | None = None
    """Also write the JSON summary here."""


@dataclasses.dataclass
class ValueItems:
    """The held-out positions of a value evaluation, encoded as the model reads them (``train.dataset.load_split``
    with its move facts: a layer above this one, so the caller loads them), and the constant baseline."""

    tokens: torch.Tensor
    targets: np.ndarray
    """Each position's value label (the expected score after the engine's best move)."""
    baseline: float
    """The mean train target: the best constant predictor without a network."""


def require_value_head(model: Any, name: str) -> None:
    """An `InputError` naming the checkpoint when `model` has no value head."""
    from chessgrpo.errors import InputError

    if model.value_head is None:
        raise InputError(f"checkpoint {name!r} has no value head (pretrain one with model.value_head: true)")


@dataclasses.dataclass
class ValueRun:
    """One value evaluation: where the model came from, how many positions, and its `ValueQuality`."""

    config: ValueEvalConfig
    checkpoint: str
    n: int
    quality: ValueQuality

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "data": self.config.data, "n": self.n, **self.quality.to_json()}

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """``value_mae`` and ``value_mae_gain`` with their interval bounds."""
        return interval_metrics({"value_mae": self.quality.mae, "value_mae_gain": self.quality.mae_gain}, prefix)


def run_value(config: ValueEvalConfig, subject: Subject, context: EvalContext) -> ValueRun:
    """The registry's runner of ``value``: the subject's value head (a policy checkpoint, or a policy in memory named
    by its checkpoint) on ``context.items["value"]`` (`ValueItems`, which the caller loads: `chessgrpo eval value`)."""
    from chessgrpo.errors import InputError

    items = context.items.get("value")
    if items is None:
        raise InputError(
            f"the value evaluation of {subject.label} needs its positions loaded by the caller "
            "(context.items['value'], as `chessgrpo eval value` does)"
        )
    if subject.checkpoint is not None:
        from chessgrpo.models.policy import load_policy, resolve_checkpoint

        model, name = load_policy(subject.checkpoint), str(resolve_checkpoint(subject.checkpoint))
    elif subject.model is not None:
        model, name = subject.model, subject.label
    else:
        raise InputError(f"eval value scores a policy's value head, not the baseline {subject.policy!r}")
    require_value_head(model, name)
    quality = value_quality(
        predict_values(model, items.tokens), items.targets, items.baseline, confidence=config.confidence
    )
    return ValueRun(config, name, len(items.targets), quality)
