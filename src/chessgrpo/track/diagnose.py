"""Why is this run not learning? Pure checks over a run's metric rows, config and evaluations.

Each check is a function ``(RunData, Thresholds) -> list[Finding]``; `diagnose` runs them all
and sorts the findings by severity. A finding names what is wrong, the numbers and steps that
show it (``evidence``), and what to change (``advice``). Severities:

- ``critical``: the run's numbers cannot be trusted or the run cannot learn (ratio != 1 on the
  first minibatch, NaN, a KL estimate below zero, engine failures);
- ``warning``: the run can learn but very likely does not, or not for the reason it seems
  (loss budget, pinned controller, no trend, noise read as progress, uniform or collapsed
  policy, no reward signal, gradient spikes without clipping, engine retries);
- ``info``: worth knowing, not a failure (a regularizer larger than the policy term's value,
  phase times, cache hit rate, a run too short to judge, invariant checks switched off).

A healthy run gets no warnings. The checks read whatever is there, so they work on a run that
is still going and on pretraining runs (checks whose metrics are absent return nothing). The
thresholds are the fields of `Thresholds`, each documented; docs/diagnose.md lists the findings.

Intervals: a trend is the change over the run of a least-squares line, with a moving-block
bootstrap interval (blocks of ~n^(1/3) consecutive steps keep short-range autocorrelation).
Two evaluation points are compared *paired* on the same positions/puzzles when the per-item
records of ``eval/step_NNNNNN_*.json`` exist (`stats.paired_bootstrap_difference`), else
from their own intervals (difference +- the root sum of squares of the half-widths, which is
wider than the paired interval: it errs towards "not significant").
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chessgrpo.eval.registry import held_out_metrics
from chessgrpo.stats import paired_bootstrap_difference
from chessgrpo.track.run_data import AnchorResult, EvalPoint, GamesEvaluation, RunData, load_run, resolve_run_path

SEVERITIES = ("critical", "warning", "info")
_ORDER = {severity: rank for rank, severity in enumerate(SEVERITIES)}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One diagnosis: what (`id`, `message`), how bad (`severity`), the numbers, what to change."""

    id: str
    """Stable dotted name, e.g. ``ratio.first_minibatch`` (docs/diagnose.md lists them)."""
    severity: str
    """"critical", "warning" or "info"."""
    message: str
    """One or two sentences: what is wrong, with the key numbers."""
    evidence: dict[str, Any]
    """The numbers and steps behind the message (JSON-serialisable)."""
    advice: str
    """What to change."""

    def __post_init__(self) -> None:
        if self.severity not in _ORDER:
            raise ValueError(f"severity must be one of {list(SEVERITIES)}, got {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "evidence": _jsonable(self.evidence),
            "advice": self.advice,
        }


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Every threshold of the checks, with its default."""

    ratio_tolerance: float | None = None
    """|ratio - 1| allowed on the first minibatch; None = the run's grpo.ratio_tolerance(_bf16) (1e-4 fp32)."""
    share_dominant: float = 0.5
    """A regularizer term "dominates" a step when its |value| is more than this share of the sum of |terms|."""
    most_of_run: float = 0.5
    """"Most of the run": more than this fraction of the logged training steps."""
    share_warning: float = 0.75
    """Median share of the entropy or KL term from which the loss-budget finding is a warning (info below)."""
    share_critical: float = 0.9
    """... and from which it is critical (the predecessor's entropy bonus was 95% of its loss)."""
    pinned_fraction: float = 0.5
    """Fraction of adaptive-KL updates at a bound (kl/frac_at_max or kl/frac_at_min) that is "pinned"."""
    min_controller_steps: int = 10
    """Fewest training steps before the KL controller is judged."""
    inert_ratio: float = 1.01
    """An adaptive coefficient whose max/min over the run stays below this never moved."""
    min_trend_steps: int = 50
    """Fewest training steps (or steps between evaluations) before "no learning" is a warning (info below)."""
    confidence: float = 0.95
    """Confidence of every interval."""
    resamples: int = 1000
    """Bootstrap resamples for trends and paired evaluation differences."""
    near_uniform_ratio: float = 0.95
    """entropy / ln(#legal) at or above this (median over the last half of the run) is a near-uniform policy."""
    collapse_entropy: float = 0.1
    """Entropy in nats at or below this (median over the last quarter of the run) is a collapsed policy."""
    zero_std_fraction: float = 0.5
    """Median rollout/frac_reward_zero_std above this: most groups carry no signal (warning)."""
    zero_std_critical: float = 0.9
    """... at or above this: almost no group carries signal (critical)."""
    spike_z: float = 6.0
    """Robust z-score (median/MAD of log grad_norm) above which a step is a gradient-norm spike."""
    spike_ratio: float = 5.0
    """A spike must also be this many times the median grad_norm."""
    spike_ratio_warning: float = 100.0
    """A spike this many times the median is a warning even with gradient clipping on."""
    min_spike_rows: int = 20
    """Fewest training rows before spikes are looked for."""
    negative_kl: float = -1e-6
    """kl/min, kl/value or kl/exact below this is a negative KL estimate."""
    low_cache_hit: float = 0.1
    """Median perf/cache_hit_rate over the second half of the run below this is low (info)."""
    phase_dominant: float = 0.8
    """A phase (sample, reward, learn) taking more than this share of perf/step_s dominates (info)."""
    lm_distinct_ratio: float = 0.8
    """Chess LM: distinct greedy B: moves at the last evaluation / at the first below this is a collapse."""
    lm_share_rise: float = 0.15
    """Chess LM: the most common greedy B: move's share rising by this much (absolute) is a collapse."""
    endgame_piece_floor: float = 0.05
    """Endgame runs: a piece type (other than the king) making less than this share of the policy's held-out moves
    at the last evaluation has vanished as a class (the king-only optimum)."""
    endgame_win_lost: float = 0.10
    """Endgame runs: wins given away (drawn by repetition, stalemate, material, 50 moves) in at least this share of
    the held-out games at the last evaluation is a warning."""


Check = Callable[[RunData, Thresholds], list[Finding]]


# ------------------------------------------------------------------------------------------------
# Small helpers


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _round(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}") if math.isfinite(value) else value


def _steps(steps: np.ndarray, mask: np.ndarray | None = None, limit: int = 10) -> list[int]:
    chosen = steps if mask is None else steps[mask]
    return [int(s) for s in chosen[:limit]]


def _finite(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(values)
    return steps[keep], values[keep]


def _learning_rows(run: RunData) -> list[dict[str, Any]]:
    """Training rows that took an optimizer step (DAPO dynamic sampling may skip one)."""
    return [row for row in run.train_rows if row.get("loss/skipped", 0.0) != 1.0]


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def linear_trend(
    steps: np.ndarray, values: np.ndarray, *, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> tuple[float, float, float]:
    """(change, low, high): the change over the steps' span of a least-squares line through (steps, values),
    with a moving-block bootstrap interval (blocks of round(n^(1/3)) consecutive points)."""
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        return math.nan, math.nan, math.nan
    span = x[-1] - x[0]

    def slopes(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        dx = xs - xs.mean(axis=-1, keepdims=True)
        dy = ys - ys.mean(axis=-1, keepdims=True)
        denominator = (dx * dx).sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denominator > 0, (dx * dy).sum(axis=-1) / denominator, np.nan)

    change = float(slopes(x, y)) * span
    block = max(1, round(n ** (1 / 3)))
    blocks = math.ceil(n / block)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n - block + 1, size=(resamples, blocks))
    index = (starts[:, :, None] + np.arange(block)).reshape(resamples, -1)[:, :n]
    samples = slopes(x[index], y[index]) * span
    samples = samples[np.isfinite(samples)]
    alpha = 1.0 - confidence
    low, high = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return change, float(low), float(high)


@dataclasses.dataclass(frozen=True)
class HeldOutChange:
    """One held-out metric at a later evaluation against the first evaluation."""

    metric: str
    step_a: int
    step_b: int
    a: float
    b: float
    difference: float
    """b - a."""
    low: float
    high: float
    paired: bool
    """True: paired bootstrap over the shared items; False: from the two points' own intervals."""
    higher_is_better: bool

    @property
    def gain(self) -> float:
        """The difference signed so that > 0 is better."""
        return self.difference if self.higher_is_better else -self.difference

    @property
    def improved(self) -> bool:
        return (self.low > 0) if self.higher_is_better else (self.high < 0)

    @property
    def worse(self) -> bool:
        return (self.high < 0) if self.higher_is_better else (self.low > 0)

    def describe(self) -> str:
        how = "paired" if self.paired else "from the two intervals"
        return (
            f"{self.metric} {self.a:.4f} -> {self.b:.4f} (step {self.step_a} -> {self.step_b}): "
            f"{self.difference:+.4f} [{self.low:+.4f}, {self.high:+.4f}] {how}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "step_a": self.step_a,
            "step_b": self.step_b,
            "a": _round(self.a),
            "b": _round(self.b),
            "difference": _round(self.difference),
            "low": _round(self.low),
            "high": _round(self.high),
            "paired": self.paired,
        }


def heldout_change(
    run: RunData, metric: str, first: EvalPoint, later: EvalPoint, thresholds: Thresholds
) -> HeldOutChange | None:
    """`metric` at `later` against `first`: paired when both have records, else from the intervals."""
    evaluation, definition = held_out_metrics()[metric]
    field, higher = definition.record_field, definition.higher_is_better
    if metric not in first.metrics or metric not in later.metrics:
        return None
    a, b = first.metrics[metric], later.metrics[metric]
    records_a, records_b = first.records.get(evaluation.name), later.records.get(evaluation.name)
    if records_a and records_b:
        key = evaluation.item_key
        by_key = {r.get(key): r for r in records_b}
        pairs = [(r, by_key[r.get(key)]) for r in records_a if r.get(key) in by_key and field in r]
        if pairs:
            va = [float(x[field]) for x, _ in pairs]
            vb = [float(y[field]) for _, y in pairs]
            interval = paired_bootstrap_difference(
                vb, va, confidence=thresholds.confidence, resamples=thresholds.resamples
            )
            return HeldOutChange(
                metric,
                first.step,
                later.step,
                float(np.mean(va)),
                float(np.mean(vb)),
                interval.value,
                interval.low,
                interval.high,
                True,
                higher,
            )
    if not (a.has_interval and b.has_interval):
        return None
    half = math.hypot((a.high - a.low) / 2, (b.high - b.low) / 2)
    difference = b.value - a.value
    return HeldOutChange(
        metric,
        first.step,
        later.step,
        a.value,
        b.value,
        difference,
        difference - half,
        difference + half,
        False,
        higher,
    )


def _heldout_changes(run: RunData, thresholds: Thresholds) -> dict[str, list[HeldOutChange]]:
    """metric -> its change at every later evaluation point against the first one."""
    if len(run.evals) < 2:
        return {}
    first = run.evals[0]
    changes: dict[str, list[HeldOutChange]] = {}
    for metric in held_out_metrics():
        for later in run.evals[1:]:
            change = heldout_change(run, metric, first, later, thresholds)
            if change is not None:
                changes.setdefault(metric, []).append(change)
    return changes


# ------------------------------------------------------------------------------------------------
# 1. The first minibatch after a rollout


def check_first_minibatch(run: RunData, t: Thresholds) -> list[Finding]:
    """ratio/first_max_abs_dev above the tolerance (or, on older logs, clipping at step 1)."""
    rows = _learning_rows(run)
    if not rows:
        return []
    bf16 = bool(run.setting("bf16", False))
    tolerance = t.ratio_tolerance
    if tolerance is None:
        tolerance = float(
            run.setting("grpo.ratio_tolerance_bf16", 2e-2) if bf16 else run.setting("grpo.ratio_tolerance", 1e-4)
        )
    checked = bool(run.setting("grpo.check_invariants", True))
    findings: list[Finding] = []
    steps, dev = _finite(*run.series("ratio/first_max_abs_dev", rows))
    if not len(dev) and not run.has("ratio/max_abs_dev"):  # not a GRPO run (or nothing learned yet)
        bad = np.zeros(0, dtype=bool)
        evidence: dict[str, Any] = {}
    elif len(dev):
        bad = dev > tolerance
        evidence = {
            "steps_affected": int(bad.sum()),
            "steps_logged": len(dev),
            "tolerance": tolerance,
            "max_first_max_abs_dev": _round(float(dev.max())),
            "median_first_max_abs_dev": _round(float(np.median(dev))),
            "first_steps": _steps(steps, bad),
            "check_invariants": checked,
        }
    else:  # no first-minibatch metric: only a single-minibatch first step can tell
        first = rows[0]
        single = first.get("learn/minibatches") == 1.0
        clip, dev0 = first.get("ratio/clip_frac", 0.0), first.get("ratio/max_abs_dev", 0.0)
        bad = np.array([single and (clip > 0 or dev0 > tolerance)])
        evidence = {
            "step": first["step"],
            "ratio/clip_frac": clip,
            "ratio/max_abs_dev": dev0,
            "tolerance": tolerance,
            "check_invariants": checked,
        }
        steps = np.array([first["step"]], dtype=float)
    if bad.any():
        first_step = int(steps[bad][0])
        advice = (
            "Sample and learn with the same log-prob function, temperature and legal mask, in eval mode (no dropout) "
            "and the same precision."
        )
        debug_t, temperature = run.setting("debug_learn_temperature"), run.setting("task.temperature")
        if debug_t is not None:
            advice += (
                f" This run learns at debug_learn_temperature={debug_t} but samples at "
                f"task.temperature={temperature}: remove it."
            )
            evidence["debug_learn_temperature"], evidence["task.temperature"] = debug_t, temperature
        if not checked:
            advice += " Keep grpo.check_invariants=true so the run stops at the first such step."
        message = (
            f"the first minibatch after a rollout has |ratio - 1| above {tolerance:g} in {int(bad.sum())} of "
            f"{len(bad)} steps (first at step {first_step}"
            + (f", up to {evidence['max_first_max_abs_dev']:.3g}" if "max_first_max_abs_dev" in evidence else "")
            + "): the learner's log-probs differ from the sampler's, so every update is off-policy "
            "and clipped by construction"
        )
        findings.append(Finding("ratio.first_minibatch", "critical", message, evidence, advice))
    if not checked and run.kind == "grpo":
        findings.append(
            Finding(
                "monitor.invariants_off",
                "info",
                "runtime invariant checks were off (grpo.check_invariants=false): a ratio or KL violation did not stop the run",
                {"grpo.check_invariants": False},
                "Set grpo.check_invariants=true (the default): the checks are cheap and stop a broken run at step 1.",
            )
        )
    return findings


# ------------------------------------------------------------------------------------------------
# 2. Loss budget


def check_loss_budget(run: RunData, t: Thresholds) -> list[Finding]:
    """A regularizer or auxiliary loss larger than all other terms together for most of the run.

    Read from the per-term gradient norms (``grad_norm/{policy,kl,entropy,aux}``, logged every
    ``grpo.term_gradient_every`` steps) when the run has them: a term's pull on the weights. Older
    runs fall back to the loss values' shares (entropy and KL only), which mislead when the policy
    term's value is ~0 by construction."""
    rows = _learning_rows(run)
    findings = []
    by_gradient = run.has("grad_norm/policy")
    gradient_rows = [row for row in rows if "grad_norm/policy" in row]
    _, policy_value = _finite(*run.series("loss/policy", rows))
    # One on-policy minibatch per step: the surrogate's value is -mean(A) = 0 by construction, so any
    # regularizer holds ~100% of the loss value whatever its weight; the value shares are then uninformative.
    degenerate = not by_gradient and len(policy_value) > 0 and float(np.median(np.abs(policy_value))) < 1e-6
    labels = (("entropy", "entropy bonus"), ("kl", "KL penalty"), ("aux", "auxiliary loss (value head, bc anchor)"))
    for term, label in labels:
        if by_gradient:
            steps, share = _gradient_share(run, gradient_rows, term)
        elif term == "aux":
            continue  # loss values cannot weigh a supervised term against the policy gradient
        else:
            steps, share = _finite(*run.series(f"loss/share_{term}", rows))
        if not len(share):
            continue
        dominant = share > t.share_dominant
        fraction = float(dominant.mean())
        if fraction <= t.most_of_run:
            continue
        median = float(np.median(share))
        severity = "critical" if median >= t.share_critical else "warning" if median >= t.share_warning else "info"
        if degenerate:
            severity = "info"
        evidence: dict[str, Any] = {
            "basis": "gradient norm" if by_gradient else "loss value",
            "median_share": _round(median),
            "fraction_of_steps_dominant": _round(fraction),
            "steps_logged": len(share),
            "first_dominant_steps": _steps(steps, dominant),
        }
        if by_gradient:
            _, policy_share = _gradient_share(run, gradient_rows, "policy")
            evidence["median_policy_share"] = _round(float(np.median(policy_share))) if len(policy_share) else None
        else:
            _, policy = _finite(*run.series("loss/share_policy", rows))
            evidence["median_policy_share"] = _round(float(np.median(policy))) if len(policy) else None
        if term == "entropy":
            coef = run.setting("grpo.entropy_coef")
            _, entropy = _finite(*run.series("entropy/mean", rows))
            evidence["grpo.entropy_coef"] = coef
            if len(entropy):
                evidence["median_entropy"] = _round(float(np.median(entropy)))
            advice = (
                f"Lower grpo.entropy_coef (now {coef}; the default is 0) until the policy term dominates: the bonus "
                "pushes the policy towards uniform instead of towards reward."
            )
        elif term == "kl":
            _, coef = _finite(*run.series("kl/coef", rows))
            _, kl = _finite(*run.series("kl/value", rows))
            evidence["median_kl_coef"] = _round(float(np.median(coef))) if len(coef) else None
            evidence["median_kl"] = _round(float(np.median(kl))) if len(kl) else None
            advice = (
                "Lower grpo.kl_coef, or use kl_schedule=adaptive with a kl_target you accept. A share above one half is "
                "not by itself a bug: if the held-out metrics still improve, the KL weight is a choice; if they do not, "
                "it holds the policy at the reference."
            )
        else:
            weights = {
                key: run.setting(key) for key in ("bc_loss_weight", "value_loss_weight") if run.setting(key)
            }  # the ones in use
            evidence.update(weights)
            if weights.get("bc_loss_weight"):
                named = ", ".join(f"{key} (now {value})" for key, value in weights.items())
                advice = (
                    f"The update is mostly supervised, not reinforcement: lower {named}. A behaviour-cloning anchor "
                    "whose gradient outweighs GRPO's trains the policy towards the labels instead of towards reward "
                    "(the CPU-hour recipe's bc 0.3 arm: 96% of the gradient, -75 Elo against its own start; "
                    'docs/results.md, "Design choices").'
                )
            else:
                # A value loss shapes the shared trunk but never the policy head; measured not to stop GRPO's gain in
                # games (the CPU-hour recipe: 96% of the gradient, still +44/+52 Elo against its start), so a warning at most.
                severity = "warning" if severity == "critical" else severity
                advice = (
                    f"The value head's loss (value_loss_weight {weights.get('value_loss_weight', '?')}) shapes the shared "
                    "trunk far more than GRPO does; the policy head still learns from GRPO alone. Lower value_loss_weight "
                    "(or value_batch_size) until the policy term's share is larger: in the CPU-hour recipe 1.0 held 96% "
                    "of the gradient and 0.1 held 61%, with the same value MAE and +42 Elo [+11, +73] in games for the "
                    'policy (SPRT against the 1.0 stage; docs/results.md, "Design choices").'
                )
        of = "the gradient norm" if by_gradient else "the loss"
        message = (
            f"the {label} is more than {_pct(t.share_dominant)} of {of} in {_pct(fraction)} of the "
            f"{'measured ' if by_gradient else ''}steps (median share {_pct(median)})"
        )
        if degenerate:
            message += (
                "; but the policy term's value is 0 by construction here (one on-policy minibatch per step), so "
                "the value shares say nothing about the gradients"
            )
            evidence["policy_value_zero_by_construction"] = True
        findings.append(Finding(f"loss_budget.{term}", severity, message, evidence, advice))
    return findings


def _gradient_share(run: RunData, rows: list[dict[str, Any]], term: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, share) of `term`'s gradient norm in the sum of every logged term's norm (absent terms 0)."""
    from chessgrpo.rl.learner import TERM_NAMES as names  # the terms the learner measures

    steps = np.asarray([row["step"] for row in rows], dtype=float)
    norms = {name: np.asarray([float(row.get(f"grad_norm/{name}", 0.0)) for row in rows]) for name in names}
    total = sum(norms.values())
    with np.errstate(invalid="ignore", divide="ignore"):
        return _finite(steps, norms[term] / total)


# ------------------------------------------------------------------------------------------------
# 3. Controllers and monitors


def check_kl_controller(run: RunData, t: Thresholds) -> list[Finding]:
    """The adaptive KL coefficient pinned at a bound most of the run, or never moving."""
    if run.setting("grpo.kl_schedule") != "adaptive":
        return []
    rows = [row for row in _learning_rows(run) if "kl/coef" in row]
    if len(rows) < t.min_controller_steps:
        return []
    last = rows[-1]
    steps, coef = run.series("kl/coef", rows)
    _, kl = _finite(*run.series("kl/value", rows))
    target = float(run.setting("grpo.kl_target", 0.01))
    median_kl = float(np.median(kl)) if len(kl) else math.nan
    findings = []
    for bound, key, label in (("max", "kl/frac_at_max", "kl_coef_max"), ("min", "kl/frac_at_min", "kl_coef_min")):
        fraction = float(last.get(key, 0.0))
        if fraction < t.pinned_fraction:
            continue
        value = float(run.setting(f"grpo.{label}", math.nan))
        at = np.isclose(coef, value, rtol=1e-9, atol=0.0) if math.isfinite(value) else np.zeros(len(coef), bool)
        evidence = {
            "fraction_of_updates_at_bound": _round(fraction),
            f"grpo.{label}": value,
            "grpo.kl_target": target,
            "median_kl": _round(median_kl),
            "median_kl_over_target": _round(median_kl / target),
            "first_step_at_bound": int(steps[at][0]) if at.any() else None,
            "steps_logged": len(rows),
        }
        if bound == "max":
            advice = (
                f"The observed KL (median {median_kl:.3g}) stays above kl_target = {target:g} even at the largest "
                f"coefficient, so the controller cannot do its job: raise grpo.kl_target to a KL you accept (same units "
                f"as kl/value: mean per-token KL), raise grpo.kl_coef_max, or lower lr."
            )
        else:
            advice = (
                f"The observed KL (median {median_kl:.3g}) stays below kl_target = {target:g} even at the smallest "
                f"coefficient: the policy barely moves from the reference. Lower grpo.kl_target or grpo.kl_coef_min, "
                f"or raise lr."
            )
        message = (
            f"the adaptive KL coefficient sat at {label} = {value:g} after {_pct(fraction)} of the updates "
            f"(median KL {median_kl:.3g} vs target {target:g})"
        )
        findings.append(Finding(f"kl.controller_pinned_{bound}", "warning", message, evidence, advice))
    if not findings:
        finite = coef[np.isfinite(coef) & (coef > 0)]
        off_target = math.isfinite(median_kl) and not (0.5 * target <= median_kl <= 2 * target)
        if len(finite) and finite.max() / finite.min() < t.inert_ratio and off_target:
            _, rows_per_step = _finite(*run.series("learn/rows", rows))
            per_step = float(np.median(rows_per_step)) if len(rows_per_step) else math.nan
            horizon = float(run.setting("grpo.kl_horizon", 10000))
            evidence = {
                "coef_min": _round(float(finite.min())),
                "coef_max": _round(float(finite.max())),
                "steps_logged": len(rows),
                "median_kl": _round(median_kl),
                "grpo.kl_target": target,
                "grpo.kl_horizon": horizon,
                "rows_per_step": per_step,
                "max_change_per_step": _round(0.2 * per_step / horizon),
            }
            findings.append(
                Finding(
                    "kl.controller_inert",
                    "warning",
                    f"the adaptive KL coefficient never moved ({finite.min():.4g} .. {finite.max():.4g} over {len(rows)} steps) "
                    f"although the KL (median {median_kl:.3g}) is far from its target {target:g}",
                    evidence,
                    f"The coefficient changes by at most 20% x rows/kl_horizon = {_pct(0.2 * per_step / horizon)} per step: lower "
                    f"grpo.kl_horizon (time constant kl_horizon / rows per step = {horizon / per_step:.0f} steps) so it can "
                    f"react within the run.",
                )
            )
    return findings


# ------------------------------------------------------------------------------------------------
# 4. and 5. Learning: trends and evaluation points


def _objective(run: RunData) -> tuple[str, bool] | None:
    if run.has("reward/mean"):
        return "reward/mean", True
    if run.has("loss/train"):
        return "loss/train", False
    return None


def check_learning(run: RunData, t: Thresholds) -> list[Finding]:
    """No trend in the training objective or the held-out metrics over a run long enough to show one."""
    findings: list[Finding] = []
    short: dict[str, Any] = {}
    games = games_against_start(run)
    # Games are the verdict that matters: a policy that beats its start has learned, whatever a flat
    # reward of fresh positions or an unresolved held-out difference says (those become information).
    stronger = games is not None and games[1].elo is not None and (games[1].elo.low or 0) > 0
    objective = _objective(run)
    if objective is not None:
        key, higher = objective
        steps, values = _finite(*run.series(key, _learning_rows(run)))
        if len(values) >= 3:
            change, low, high = linear_trend(steps, values, confidence=t.confidence, resamples=t.resamples)
            gain_low, gain_high = (low, high) if higher else (-high, -low)
            tenth = max(1, len(values) // 10)
            evidence = {
                "metric": key,
                "steps_logged": len(values),
                "first_step": int(steps[0]),
                "last_step": int(steps[-1]),
                "change_over_run": _round(change),
                "interval": [_round(low), _round(high)],
                "confidence": t.confidence,
                "mean_first_10pct": _round(float(values[:tenth].mean())),
                "mean_last_10pct": _round(float(values[-tenth:].mean())),
            }
            described = (
                f"{key} changed by {change:+.4f} [{low:+.4f}, {high:+.4f}] over steps {int(steps[0])}-{int(steps[-1])}"
            )
            if len(values) < t.min_trend_steps:
                if gain_low <= 0:  # inconclusive (a significant gain needs no warning, however short the run)
                    short["training"] = evidence
            elif gain_high < 0:
                findings.append(
                    Finding(
                        "learning.objective_worse",
                        "warning",
                        f"the training objective got worse: {described} (linear fit, {_pct(t.confidence)} block-bootstrap interval)",
                        evidence,
                        "Look at the findings above (loss budget, KL, collapse); lower lr; check that the reward is from the mover's "
                        "point of view.",
                    )
                )
            elif gain_low <= 0:
                findings.append(
                    Finding(
                        "learning.no_objective_trend",
                        "info" if stronger else "warning",
                        f"no learning in the training objective: {described}; the {_pct(t.confidence)} interval of the linear "
                        f"trend includes 0"
                        + ("; in games it beats its start (learning.games_against_start)" if stronger else ""),
                        evidence,
                        "Check the signal (rollout/frac_reward_zero_std), the loss budget and the first-minibatch ratio; then raise "
                        "lr or num_iterations, or the group size. The reward of fresh positions varies from batch to batch: a real "
                        "trend needs more steps than that noise.",
                    )
                )
    changes = _heldout_changes(run, t)
    finals = [c[-1] for c in changes.values() if c]
    if finals:
        span = finals[0].step_b - finals[0].step_a
        evidence = {"changes": [c.to_json() for c in finals], "confidence": t.confidence}
        worse = [c for c in finals if c.worse]
        checks = _puzzle_loss_from_fewer_checks(run, t) if any(c.metric.startswith("puzzle_") for c in worse) else None
        if worse:
            findings.append(
                Finding(
                    "learning.heldout_worse",
                    "warning",
                    "held-out metrics got significantly worse: " + "; ".join(c.describe() for c in worse),
                    {"changes": [c.to_json() for c in worse], "confidence": t.confidence},
                    "The policy drifts away from good moves: look at the entropy (collapse) and KL findings, raise kl_coef or "
                    "lower lr, and keep the checkpoint of the best held-out point."
                    + (" The puzzles' part: see learning.puzzles_fewer_checks." if checks else ""),
                )
            )
        if checks:
            findings.append(checks)
        if not any(c.improved for c in finals):
            if span < t.min_trend_steps:
                short["held_out"] = evidence
            else:
                findings.append(
                    Finding(
                        "learning.no_heldout_gain",
                        "info" if stronger else "warning",
                        f"no held-out metric improved significantly from step {finals[0].step_a} to {finals[0].step_b} "
                        f"({_pct(t.confidence)} intervals of the differences: "
                        + "; ".join(c.describe() for c in finals)
                        + ")"
                        + ("; in games it beats its start (learning.games_against_start)" if stronger else ""),
                        evidence,
                        "Train longer or with a stronger signal before reading the curve; compare the two checkpoints with "
                        "`chessgrpo eval compare` on more positions (eval.max_positions) to resolve smaller differences.",
                    )
                )
    findings.extend(_games_against_start_finding(games))
    if short:
        findings.append(
            Finding(
                "learning.too_short",
                "info",
                f"too short to tell learning from noise (fewer than {t.min_trend_steps} steps): "
                + "; ".join(
                    f"{ev['metric']} changed by {ev['change_over_run']:+.4f} [{ev['interval'][0]:+.4f}, "
                    f"{ev['interval'][1]:+.4f}] over {ev['steps_logged']} steps"
                    if name == "training"
                    else "no held-out metric changed significantly between the first and last evaluation"
                    for name, ev in short.items()
                ),
                short,
                f"Run at least {t.min_trend_steps} steps (and evaluate at least twice) before judging whether it learns.",
            )
        )
    return findings


def games_against_start(run: RunData) -> tuple[GamesEvaluation, AnchorResult] | None:
    """The newest `eval games` result in the run directory whose anchor is the run's starting policy
    (`init_checkpoint`), with that anchor's row; None when there is none (e.g. `make run`'s
    eval/games_vs_pretrain.json is one). Matched by the anchor's path or by the checkpoint it loaded."""
    start = run.setting("init_checkpoint")
    if not start:
        return None
    start_path = resolve_run_path(run, str(start)) or Path(str(start)).resolve()  # found from any working directory
    for evaluation in reversed(run.games):
        for anchor in evaluation.anchors:
            anchor_path = resolve_run_path(run, anchor.anchor) or Path(anchor.anchor).resolve()
            if anchor_path == start_path or str(start_path) + "/" in anchor.settings:
                return evaluation, anchor
    return None


def _games_against_start_finding(found: tuple[GamesEvaluation, AnchorResult] | None) -> list[Finding]:
    """Games are where a policy's change shows (`games_against_start`'s result): info when it beats its
    start, a warning when it loses to it, nothing without such games."""
    if found is None or found[1].elo is None or found[1].elo.value is None:
        return []
    evaluation, anchor = found
    elo, games = anchor.elo, anchor.wins + anchor.draws + anchor.losses
    evidence = {
        "file": str(evaluation.path),
        "anchor": anchor.anchor,
        "games": games,
        "wins": anchor.wins,
        "draws": anchor.draws,
        "losses": anchor.losses,
        "elo": elo.value,
        "elo_interval": [elo.low, elo.high],
        "pentanomial": list(anchor.pentanomial),
    }
    described = f"{elo.text()} Elo over {games} games against {anchor.anchor} ({evaluation.path.name})"
    if elo.low is not None and elo.low > 0:
        return [
            Finding(
                "learning.games_against_start",
                "info",
                f"the policy beats its start in games: {described}",
                evidence,
                "Nothing to fix: games show what single-move held-out metrics may not.",
            )
        ]
    if elo.high is not None and elo.high < 0:
        return [
            Finding(
                "learning.games_against_start",
                "warning",
                f"the policy loses to its start in games: {described}",
                evidence,
                "It plays worse than before training: keep the starting checkpoint, and look at the findings above.",
            )
        ]
    return [
        Finding(
            "learning.games_against_start",
            "info",
            f"no significant difference in games against its start: {described}",
            evidence,
            "More games narrow the interval (eval games --games N, or --sprt for a sequential test).",
        )
    ]


def _puzzle_loss_from_fewer_checks(run: RunData, t: Thresholds) -> Finding | None:
    """A finding when the puzzles lost are check-first ones while quiet-first ones did not fall and the
    policy checks less often: the policy gave up a checking habit (puzzles mostly start with a check),
    which is not the same as drifting from good moves. None when the records cannot tell (older files)."""
    from chessgrpo.eval.compare import compare_records

    first, last = run.evals[0], run.evals[-1]
    records_a, records_b = first.records.get("puzzles"), last.records.get("puzzles")
    if not records_a or not records_b:
        return None
    rows = {
        m.metric: m
        for m in compare_records(
            "puzzles", records_a, records_b, confidence=t.confidence, resamples=t.resamples
        ).metrics
    }
    check_first, quiet_first, played = (
        rows.get(k) for k in ("check_first_accuracy", "quiet_first_accuracy", "played_check_rate")
    )
    if check_first is None or quiet_first is None or played is None:
        return None
    if not (check_first.verdict == "worse" and quiet_first.verdict != "worse" and played.verdict == "lower"):
        return None

    def row(m: Any) -> str:
        d = m.difference
        return f"{m.a.value:.3f} -> {m.b.value:.3f} ({d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}], n={m.a.n})"

    return Finding(
        "learning.puzzles_fewer_checks",
        "info",
        f"the puzzles lost (step {first.step} -> {last.step}) are check-first ones: check-first {row(check_first)}, "
        f"quiet-first {row(quiet_first)}; the policy's first move checks less often: {row(played)}",
        {
            key: m.to_json()
            for key, m in (("check_first", check_first), ("quiet_first", quiet_first), ("played_check_rate", played))
        },
        "The policy gave up a checking habit that most puzzles reward (their solutions start with a check) rather than "
        "drifting from good moves: compare `eval compare`'s played_check_rate with label_check_rate on the held-out "
        "positions, and judge the run by games against its start (`chessgrpo eval games --anchors START`) before "
        'raising kl_coef (docs/results.md, "The quickstart: `make run`").',
    )


def check_noise_as_progress(run: RunData, t: Thresholds) -> list[Finding]:
    """The best evaluation point of a metric not distinguishable from the first one."""
    changes = _heldout_changes(run, t)
    if not changes:
        return []
    noisy = []
    for points in changes.values():
        best = max(points, key=lambda c: c.gain)
        if best.gain > 0 and not best.improved:
            noisy.append(best)
    if not noisy:
        return []
    anything_real = any(c.improved for points in changes.values() for c in points)
    last_step = run.evals[-1].step
    # A "peak" (best point before the last evaluation) is what gets read as progress; a best point at the
    # end is the no-learning finding's business (learning.no_heldout_gain), so alone it is only info here.
    peaks = [c for c in noisy if c.step_b < last_step and c.step_b - c.step_a >= t.min_trend_steps]
    severity = "warning" if peaks and not anything_real else "info"
    message = (
        "apparent held-out gains are inside their intervals (not distinguishable from the first evaluation): "
        + "; ".join(f"best {c.describe()}" for c in noisy)
    )
    if anything_real:
        message += "; other metrics did improve significantly"
    return [
        Finding(
            "eval.noise_as_progress",
            severity,
            message,
            {
                "best_points": [c.to_json() for c in noisy],
                "evaluations": len(run.evals),
                "confidence": t.confidence,
                "peak_steps": sorted({c.step_b for c in peaks}),
                "other_metric_improved": anything_real,
            },
            "Do not read these differences as progress. Report intervals with every number, compare checkpoints paired "
            "(`chessgrpo eval compare`), and evaluate on more positions/puzzles to shrink the intervals.",
        )
    ]


# ------------------------------------------------------------------------------------------------
# 6. and 7. Entropy and signal


def check_entropy(run: RunData, t: Thresholds) -> list[Finding]:
    """A near-uniform policy (entropy ~ ln #legal) or a collapsed one (entropy ~ 0)."""
    rows = [row for row in run.train_rows if "entropy/mean" in row and "entropy/ln_legal" in row]
    if not rows:
        return []
    steps, entropy = run.series("entropy/mean", rows)
    _, ln_legal = run.series("entropy/ln_legal", rows)
    keep = np.isfinite(entropy) & np.isfinite(ln_legal) & (ln_legal > 0)
    steps, entropy, ln_legal = steps[keep], entropy[keep], ln_legal[keep]
    if not len(entropy):
        return []
    findings = []
    half = len(entropy) // 2
    ratio = entropy[half:] / ln_legal[half:]
    if np.median(ratio) >= t.near_uniform_ratio:
        coef = run.setting("grpo.entropy_coef", 0.0) or 0.0
        advice = "A near-uniform policy samples random moves and learns slowly if at all."
        if coef > 0:
            advice += f" The entropy bonus (grpo.entropy_coef={coef}) pushes it there: lower it."
        if run.kind == "grpo" and run.setting("init_checkpoint", "x") is None:
            advice += " This run starts from scratch (init_checkpoint=null): start GRPO from a pretrained checkpoint."
        if run.kind == "pretrain":
            advice += " Pretraining should sharpen it: check the labels and raise lr or steps."
        findings.append(
            Finding(
                "entropy.near_uniform",
                "warning",
                f"the policy is near uniform: entropy is {_pct(float(np.median(ratio)))} of ln(#legal) (median over steps "
                f"{int(steps[half])}-{int(steps[-1])})",
                {
                    "median_entropy": _round(float(np.median(entropy[half:]))),
                    "median_ln_legal": _round(float(np.median(ln_legal[half:]))),
                    "median_ratio": _round(float(np.median(ratio))),
                    "threshold": t.near_uniform_ratio,
                    "steps": [int(steps[half]), int(steps[-1])],
                },
                advice,
            )
        )
    quarter = len(entropy) - max(1, len(entropy) // 4)
    tail = entropy[quarter:]
    if np.median(tail) <= t.collapse_entropy:
        below = entropy <= t.collapse_entropy
        _, unique = _finite(*run.series("rollout/unique_moves", rows))
        evidence = {
            "median_entropy_last_quarter": _round(float(np.median(tail))),
            "threshold_nats": t.collapse_entropy,
            "first_step_below": int(steps[below][0]),
            "median_ln_legal": _round(float(np.median(ln_legal))),
        }
        if len(unique):
            evidence["median_unique_moves_last_quarter"] = _round(float(np.median(unique[quarter:])))
        findings.append(
            Finding(
                "entropy.collapse",
                "warning",
                f"the policy collapsed: entropy {float(np.median(tail)):.3f} nats over the last quarter of the run (first below "
                f"{t.collapse_entropy} at step {evidence['first_step_below']}), against ln(#legal) = {evidence['median_ln_legal']:.2f}",
                evidence,
                "A deterministic policy samples the same move in a whole group (zero advantage, no signal). Raise grpo.kl_coef (the "
                "KL to the reference keeps it spread), lower lr, or add a small grpo.entropy_coef (check the loss budget after).",
            )
        )
    return findings


def check_signal(run: RunData, t: Thresholds) -> list[Finding]:
    """Most groups with zero reward variance: no advantage, no gradient. Not under ``critic`` supervision, whose
    advantages are not centred on the group: there a group of equal non-zero regrets still teaches."""
    _, zero = _finite(*run.series("rollout/frac_reward_zero_std", run.train_rows))
    if not len(zero) or run.setting("task.supervision") == "critic":
        return []
    median = float(np.median(zero))
    if median <= t.zero_std_fraction:
        return []
    severity = "critical" if median >= t.zero_std_critical else "warning"
    evidence = {
        "median_frac_reward_zero_std": _round(median),
        "fraction_of_steps_over_half": _round(float((zero > 0.5).mean())),
        "steps_logged": len(zero),
        "grpo.drop_zero_std_groups": run.setting("grpo.drop_zero_std_groups"),
        "task.group_size": run.setting("task.group_size"),
        "task.reward_nodes": run.setting("task.reward_nodes"),
    }
    _, unique = _finite(*run.series("rollout/unique_moves", run.train_rows))
    if len(unique):
        evidence["median_unique_moves"] = _round(float(np.median(unique)))
    return [
        Finding(
            "signal.zero_reward_variance",
            severity,
            f"no signal: in the median step {_pct(median)} of the groups have identical rewards for every sampled move, so their "
            f"advantages are 0 and they teach nothing",
            evidence,
            "Start from positions where moves differ in value (start_win_prob_range for datasets; decided positions score every "
            "move the same), raise task.group_size or task.temperature, raise task.reward_nodes if values are too coarse, or set "
            "grpo.drop_zero_std_groups=true (DAPO dynamic sampling) so these groups stop diluting the batch.",
        )
    ]


# ------------------------------------------------------------------------------------------------
# 8. Numbers, gradients, KL sign, engines, cache, time


def check_non_finite(run: RunData, t: Thresholds) -> list[Finding]:
    """NaN or Inf in any logged metric."""
    where: dict[str, list[int]] = {}
    for row in run.rows:
        skipped = row.get("loss/skipped") == 1.0 or row.get("learn/minibatches") == 0.0
        for key, value in row.items():
            if key in ("step", "time") or not isinstance(value, float) or math.isfinite(value):
                continue
            if key == "ratio/first_max_abs_dev" and skipped:  # no minibatch ran: NaN by definition
                continue
            where.setdefault(key, []).append(row["step"])
    if not where:
        return []
    first = min(steps[0] for steps in where.values())
    keys = sorted(where, key=lambda k: where[k][0])
    return [
        Finding(
            "values.non_finite",
            "critical",
            f"non-finite values (NaN/Inf) in {len(keys)} metric(s), first at step {first}: "
            + ", ".join(
                f"{k} (steps {', '.join(map(str, where[k][:5]))}{', ...' if len(where[k]) > 5 else ''})"
                for k in keys[:6]
            ),
            {
                "first_step": first,
                "metrics": {k: where[k][:10] for k in keys},
                "rows_affected": len({s for v in where.values() for s in v}),
            },
            "Resume from the last checkpoint before that step with a lower lr; keep gradient clipping on and bf16=false; a NaN "
            "reward points at the engine or the reward function.",
        )
    ]


def check_health_events(run: RunData, t: Thresholds) -> list[Finding]:
    """The training loop's divergence and stop events (events.jsonl): what happened, where, and why."""
    findings = []
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in run.events:
        by_kind.setdefault(event["event"], []).append(event)
    if "diverged" in by_kind:
        last = by_kind["diverged"][-1]
        findings.append(
            Finding(
                "health.diverged",
                "critical",
                f"the run diverged and stopped at step {last['step']}: {last['message']}",
                {"step": last["step"], "rollbacks": len(by_kind.get("rollback", []))},
                "Restart from the last good checkpoint with a lower lr or a larger KL coefficient; check the rewards for NaN.",
            )
        )
    if "rollback" in by_kind:
        events = by_kind["rollback"]
        findings.append(
            Finding(
                "health.rollback",
                "warning",
                f"{len(events)} rollback(s) to the last good checkpoint after non-finite updates (first at step {events[0]['step']}); "
                "the learning rate was lowered each time",
                {"steps": [e["step"] for e in events][:10], "messages": [e["message"] for e in events][:3]},
                "The run recovered, but it was unstable at its learning rate: lower lr (the backoff already did, for this run).",
            )
        )
    if "nonfinite_skip" in by_kind and "rollback" not in by_kind and "diverged" not in by_kind:
        events = by_kind["nonfinite_skip"]
        findings.append(
            Finding(
                "health.nonfinite_skip",
                "warning",
                f"{len(events)} update(s) skipped for a non-finite loss or gradient (steps {', '.join(str(e['step']) for e in events[:5])})",
                {"steps": [e["step"] for e in events][:10]},
                "Isolated skips are harmless; repeated ones mean the learning rate or the precision is too aggressive.",
            )
        )
    for event in by_kind.get("early_stop", []):
        findings.append(
            Finding(
                "health.early_stop",
                "warning",
                f"the run stopped early: {event['message']}",
                {"step": event["step"]},
                "A KL or entropy stop means the policy left its reference or collapsed: lower lr or raise the KL coefficient. "
                "A held-out stop means more steps would not have helped at these settings.",
            )
        )
    return findings


def check_grad_spikes(run: RunData, t: Thresholds) -> list[Finding]:
    """Gradient-norm spikes: robust z-score of log grad_norm above `spike_z` and `spike_ratio` x the median."""
    steps, norm = _finite(*run.series("grad_norm", _learning_rows(run)))
    keep = norm > 0
    steps, norm = steps[keep], norm[keep]
    if len(norm) < t.min_spike_rows:
        return []
    logs = np.log(norm)
    median = float(np.median(logs))
    mad = float(np.median(np.abs(logs - median))) * 1.4826
    if mad <= 0:
        return []
    z = (logs - median) / mad
    typical = math.exp(median)
    spikes = (z > t.spike_z) & (norm > t.spike_ratio * typical)
    if not spikes.any():
        return []
    clip = run.setting("max_grad_norm", run.setting("grpo.max_grad_norm", run.setting("grad_clip", None)))
    worst = int(np.argmax(norm))
    ratio = float(norm[worst] / typical)
    fraction = float(spikes.mean())
    severity = "warning" if (clip == 0 or ratio >= t.spike_ratio_warning or fraction > 0.05) else "info"
    return [
        Finding(
            "grad_norm.spikes",
            severity,
            f"{int(spikes.sum())} gradient-norm spike(s): up to {norm[worst]:.3g} at step {int(steps[worst])}, {ratio:.0f}x the "
            f"median {typical:.3g} (robust z > {t.spike_z:g})",
            {
                "spikes": int(spikes.sum()),
                "steps": _steps(steps, spikes),
                "max_grad_norm_seen": _round(float(norm[worst])),
                "max_step": int(steps[worst]),
                "median_grad_norm": _round(typical),
                "max_over_median": _round(ratio),
                "fraction_of_steps": _round(fraction),
                "clipping_max_norm": clip,
            },
            (
                f"Clipping at {clip} bounds each update, so isolated spikes are mostly harmless. "
                if clip
                else "Gradient clipping is off: turn it on (max_grad_norm = 1.0). "
            )
            + "Frequent spikes mean a too-high lr or outlier advantages (a group std near 0 under 'grpo' advantages: raise "
            "grpo.advantage_epsilon or use dr_grpo).",
        )
    ]


def check_negative_kl(run: RunData, t: Thresholds) -> list[Finding]:
    """A KL estimate below zero with a non-negative estimator (k2, k3) or the exact KL."""
    estimator = run.setting("grpo.kl_estimator", "k3")  # runs from before the exact default had k3
    keys = ["kl/exact"] + (["kl/min", "kl/value"] if estimator in ("exact", "k2", "k3") else [])
    rows = run.train_rows
    hits = {}
    for key in keys:
        steps, values = _finite(*run.series(key, rows))
        negative = values < t.negative_kl
        if negative.any():
            hits[key] = {
                "min": _round(float(values.min())),
                "steps": _steps(steps, negative),
                "count": int(negative.sum()),
            }
    findings = []
    if hits:
        first = min(h["steps"][0] for h in hits.values())
        findings.append(
            Finding(
                "kl.negative",
                "critical",
                f"KL estimates below zero (first at step {first}): "
                + ", ".join(f"{k} down to {h['min']:.3g} in {h['count']} steps" for k, h in hits.items())
                + f"; {'the ' + estimator + ' estimator and ' if {'kl/min', 'kl/value'} & set(hits) else ''}"
                + "the exact KL cannot be negative",
                {"grpo.kl_estimator": estimator, "threshold": t.negative_kl, **hits},
                "A negative value from a non-negative estimator is a bug: the reference or policy log-probs use another mask, "
                "temperature or normalisation. Compare kl/exact with kl/value on one batch.",
            )
        )
    elif estimator == "k1":
        steps, values = _finite(*run.series("kl/value", rows))
        if len(values) and np.median(values) < t.negative_kl:
            findings.append(
                Finding(
                    "kl.negative_k1",
                    "info",
                    f"the k1 KL estimate is negative in the median step ({np.median(values):.3g}): k1 is unbiased but noisy and "
                    f"can go below 0",
                    {"median_kl": _round(float(np.median(values))), "grpo.kl_estimator": "k1"},
                    "Use grpo.kl_estimator=exact (the default: the exact KL over every action, never negative) so the controller "
                    "sees a valid value; k1 as a loss has zero expected gradient and is refused with kl_coef > 0.",
                )
            )
    return findings


def _increments(steps: np.ndarray, cumulative: np.ndarray) -> tuple[int, list[int]]:
    """Total increase of a counter that restarts at each invocation, and the steps where it rose."""
    total, rose, previous = 0, [], 0.0
    for step, value in zip(steps, cumulative):
        delta = value - previous if value >= previous else value  # a restart (resume) begins from 0 again
        if delta > 0:
            total += round(delta)
            rose.append(int(step))
        previous = value
    return total, rose


def check_engine(run: RunData, t: Thresholds) -> list[Finding]:
    """Engine retries (a crash or hang, recovered) and failures (not recovered)."""
    findings = []
    for key, identifier, severity, what in (
        ("perf/engine_failures", "engine.failures", "critical", "exhausted its retries on one search"),
        ("perf/engine_retries", "engine.retries", "warning", "crashed or hung and was restarted"),
    ):
        steps, values = _finite(*run.series(key, run.train_rows))
        total, rose = _increments(steps, values)
        if total > 0:
            findings.append(
                Finding(
                    identifier,
                    severity,
                    f"Stockfish {what} {total} time(s) (first at step {rose[0]})",
                    {
                        "count": total,
                        "steps": rose[:10],
                        "engine.timeout_s": run.setting("engine.timeout_s"),
                        "engine.processes": run.setting("engine.processes"),
                    },
                    "Check the engine with `chessgrpo doctor`, the machine's memory, and engine.timeout_s (a slow machine under load "
                    "times out); retried searches are recomputed, never scored 0.",
                )
            )
    return findings


def check_cache(run: RunData, t: Thresholds) -> list[Finding]:
    """A low evaluation-cache hit rate in the second half of the run (cache on)."""
    if run.setting("engine.cache", True) is False:
        return []
    _, rate = _finite(*run.series("perf/cache_hit_rate", run.train_rows))
    if len(rate) < 20:
        return []
    median = float(np.median(rate[len(rate) // 2 :]))
    if median >= t.low_cache_hit:
        return []
    return [
        Finding(
            "engine.low_cache_hit",
            "info",
            f"the evaluation cache hits {_pct(median)} of lookups in the second half of the run: nearly every reward is a fresh search",
            {
                "median_cache_hit_rate_second_half": _round(median),
                "threshold": t.low_cache_hit,
                "engine.cache_path": run.setting("engine.cache_path"),
            },
            "Expected when every step draws new positions. If positions do recur, check that engine.cache_path is persistent "
            "and shared between runs; otherwise engine.cache=false saves the lookups.",
        )
    ]


def check_phase_time(run: RunData, t: Thresholds) -> list[Finding]:
    """One phase (sample, reward, learn) taking most of the step time."""
    rows = [row for row in run.train_rows if "perf/step_s" in row]
    if not rows:
        return []
    total = sum(row["perf/step_s"] for row in rows if math.isfinite(row["perf/step_s"]))
    if total <= 0:
        return []
    shares = {
        phase: sum(row.get(f"perf/{phase}_s", 0.0) for row in rows) / total for phase in ("sample", "reward", "learn")
    }
    phase, share = max(shares.items(), key=lambda item: item[1])
    if share <= t.phase_dominant:
        return []
    advice = {
        "reward": "More engine processes (engine.processes), fewer task.reward_nodes, keep engine.cache on; the policy waits "
        "for Stockfish.",
        "sample": "Sampling dominates: a larger batch per forward (positions_per_step) or a GPU.",
        "learn": "Learning dominates: fewer grpo.num_iterations or larger minibatches, bf16 on a GPU.",
    }[phase]
    return [
        Finding(
            "perf.phase_dominates",
            "info",
            f"{phase} takes {_pct(share)} of the step time ("
            + ", ".join(f"{p} {_pct(s)}" for p, s in shares.items())
            + ")",
            {
                "shares": {p: _round(s) for p, s in shares.items()},
                "total_seconds": _round(total),
                "steps_logged": len(rows),
            },
            advice,
        )
    ]


def _lm_favourite(run: RunData) -> tuple[str, float] | None:
    """(move, share) of the most common greedy B: move at the run's last LM evaluation, from its step file."""
    from collections import Counter

    from chessgrpo.eval.registry import EVALUATIONS

    files = EVALUATIONS["lm"].step_files(run.path / "eval")
    if not files:
        return None
    try:
        records = json.loads(files[-1].read_text()).get("records", {}).get("policy", [])
    except (OSError, ValueError):
        return None
    moves = [r.get("best_move") for r in records if r.get("best_move")]
    if not moves:
        return None
    move, count = Counter(moves).most_common(1)[0]
    return move, count / len(moves)


def check_lm_collapse(run: RunData, t: Thresholds) -> list[Finding]:
    """The chess LM's greedy B: moves collapsing onto a few favourites whatever the position: distinct moves
    over the held-out positions falling, or one move's share rising (first vs last evaluation)."""
    steps, distinct = _finite(*run.series("eval/p_distinct_best"))
    if len(distinct) < 2 or distinct[0] <= 0:
        return []
    _, share = _finite(*run.series("eval/p_top_best_share"))
    ratio = float(distinct[-1] / distinct[0])
    rise = float(share[-1] - share[0]) if len(share) >= 2 else 0.0
    evidence: dict[str, Any] = {
        "steps": [int(steps[0]), int(steps[-1])],
        "distinct_best": [int(distinct[0]), int(distinct[-1])],
        "distinct_ratio": _round(ratio),
        "threshold_ratio": t.lm_distinct_ratio,
    }
    if len(share) >= 2:
        evidence.update(
            {"top_share": [_round(float(share[0])), _round(float(share[-1]))], "threshold_share_rise": t.lm_share_rise}
        )
    interval_text = ""
    try:
        paired = json.loads((run.path / "eval" / "paired_first_last.json").read_text())["differences"][
            "p_distinct_best_ratio"
        ]
        evidence["distinct_ratio_interval"] = [paired["low"], paired["high"]]
        interval_text = f" [{paired['low']:.2f}, {paired['high']:.2f}]"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    favourite = _lm_favourite(run)
    if favourite is not None:
        evidence["favourite"] = {"move": favourite[0], "share": _round(favourite[1])}
    numbers = f"distinct greedy B: moves {int(distinct[0])} -> {int(distinct[-1])} (x{ratio:.2f}{interval_text})"
    if len(share) >= 2:
        numbers += f", most common move's share {_pct(float(share[0]))} -> {_pct(float(share[-1]))}"
        if favourite is not None:
            numbers += f" ({favourite[0]})"
    span = f"steps {int(steps[0])}-{int(steps[-1])}"
    if ratio < t.lm_distinct_ratio or rise >= t.lm_share_rise:
        return [
            Finding(
                "lm.collapse",
                "warning",
                f"the LM's answers collapsed onto a few moves whatever the position: {numbers}, {span}",
                evidence,
                "GRPO rewards a move that is good on average, not in this position, when the groups rarely hold a better "
                "answer the model can tell apart. Grade with an exact oracle where one exists (rewards.policy.truth: "
                "tablebase on endgame data), raise grpo.kl_coef, lower lr or the temperature's spread, and check "
                "held-out best-move accuracy among well-formed answers (docs/diagnose.md, lm.collapse).",
            )
        ]
    return [
        Finding(
            "lm.answers_diverse",
            "info",
            f"the LM's greedy B: moves did not collapse: {numbers}, {span}",
            evidence,
            "Nothing to change for diversity; judge the chess by held-out best-move accuracy among well-formed answers.",
        )
    ]


_DRAW_REASONS = {
    "threefold_repetition": "repetition",
    "stalemate": "stalemate",
    "insufficient_material": "the piece lost",
    "fifty_moves": "the 50-move rule",
}


def check_endgame_play(run: RunData, t: Thresholds) -> list[Finding]:
    """Endgame runs (held-out play against the perfect defender, `eval/piece_share/*`): a piece type's moves
    vanishing as a class (the king-only optimum: a king cannot mate alone), and wins given away by repetition,
    stalemate or a lost piece, named by reason."""
    findings: list[Finding] = []
    evals = [row for row in run.rows if any(key.startswith("eval/piece_share/") for key in row)]
    if not evals:
        return findings
    first, last = evals[0], evals[-1]
    span = f"step {int(last['step'])}"
    shares = {key.rsplit("/", 1)[1]: float(value) for key, value in last.items() if key.startswith("eval/piece_share/")}
    first_shares = {
        key.rsplit("/", 1)[1]: float(value) for key, value in first.items() if key.startswith("eval/piece_share/")
    }
    pieces = sorted((set(shares) | set(first_shares)) - {"K"}, key="KQRBNP".index)
    vanished = [p for p in pieces if shares.get(p, 0.0) < t.endgame_piece_floor]
    if vanished:
        text = ", ".join(f"{p} {_pct(first_shares.get(p, 0.0))} -> {_pct(shares.get(p, 0.0))}" for p in vanished)
        findings.append(
            Finding(
                "endgame.piece_vanished",
                "warning",
                f"the policy stopped moving a piece type on the held-out starts: {text} of its moves "
                f"(king {_pct(shares.get('K', 0.0))}), {span}",
                {
                    "steps": [int(first["step"]), int(last["step"])],
                    "first_shares": first_shares,
                    "last_shares": shares,
                    "vanished": vanished,
                    "threshold": t.endgame_piece_floor,
                },
                "A random network's piece moves hang the piece or stalemate more often than its king moves, so the policy "
                "gradient removes them as a class before it learns which are good, and a king alone cannot mate. Give every "
                "position an exact per-move baseline (one-move groups at the positions the policy visits, task.regret: true), "
                "start from near-mate positions (curriculum_start_dtz) or keep entropy up (docs/diagnose.md, endgame.piece_vanished).",
            )
        )
    lost = float(last.get("eval/win_lost_rate", float("nan")))
    if math.isfinite(lost) and lost >= t.endgame_win_lost:
        reasons = {
            key[len("eval/draw_") : -len("_rate")]: float(v)
            for key, v in last.items()
            if key.startswith("eval/draw_") and key.endswith("_rate")
        }
        named = ", ".join(
            f"{_DRAW_REASONS.get(r, r)} {_pct(v) if v >= 0.01 else '<1%'}"
            for r, v in sorted(reasons.items(), key=lambda kv: -kv[1])
            if v > 0
        )
        findings.append(
            Finding(
                "endgame.win_given_away",
                "warning",
                f"the policy gave away the win in {_pct(lost)} of the held-out games ({named or 'mated'}), {span}",
                {
                    "step": int(last["step"]),
                    "win_lost_rate": _round(lost),
                    "reasons": reasons,
                    "threshold": t.endgame_win_lost,
                },
                "Repetition: the policy shuffles without progress (reward DTZ progress: task.shaping > 0, a longer horizon). "
                "Stalemate or a lost piece: a blunder the exact reward punishes only if such moves are sampled and "
                "compared at the same position (task.regret: true, larger groups) (docs/diagnose.md, endgame.win_given_away).",
            )
        )
    return findings


CHECKS: tuple[Check, ...] = (
    check_first_minibatch,
    check_health_events,
    check_non_finite,
    check_negative_kl,
    check_engine,
    check_loss_budget,
    check_kl_controller,
    check_learning,
    check_noise_as_progress,
    check_entropy,
    check_lm_collapse,
    check_endgame_play,
    check_signal,
    check_grad_spikes,
    check_cache,
    check_phase_time,
)
"""Every check, in the order their findings are listed within one severity."""


def diagnose(run: RunData, thresholds: Thresholds | None = None, checks: Sequence[Check] = CHECKS) -> list[Finding]:
    """All findings for `run`, critical first (stable within a severity)."""
    thresholds = thresholds or Thresholds()
    findings = [finding for check in checks for finding in check(run, thresholds)]
    return sorted(findings, key=lambda f: _ORDER[f.severity])


def diagnose_run(run_dir: str | Path, thresholds: Thresholds | None = None) -> list[Finding]:
    """`diagnose` on a run directory (finished or still running)."""
    return diagnose(load_run(run_dir), thresholds)


def format_findings(findings: Sequence[Finding], run_name: str = "") -> str:
    """Plain text: one block per finding (severity, id, message, evidence, advice)."""
    head = f"{run_name}: " if run_name else ""
    if not findings:
        return f"{head}no findings: nothing in the metrics points to a problem."
    counts = ", ".join(
        f"{sum(f.severity == s for f in findings)} {s}" for s in SEVERITIES if any(f.severity == s for f in findings)
    )
    blocks = [f"{head}{len(findings)} finding(s): {counts}"]
    for finding in findings:
        evidence = ", ".join(f"{k}={_short(v)}" for k, v in _jsonable(finding.evidence).items())
        blocks.append(
            f"[{finding.severity.upper()}] {finding.id}\n"
            f"  {finding.message}\n"
            f"  evidence: {evidence}\n"
            f"  advice: {finding.advice}"
        )
    return "\n\n".join(blocks)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 6:
        return "[" + ", ".join(_short(v) for v in value[:6]) + ", ...]"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    return str(value)
