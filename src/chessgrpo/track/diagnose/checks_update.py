"""The checks of the update itself: the first minibatch's ratio (sampler and learner must agree), the loss budget
(a regularizer outweighing the policy term), the adaptive KL controller (pinned or inert), negative KL estimates
and gradient-norm spikes. Each is ``(RunData, Thresholds) -> list[Finding]`` (`track.diagnose.CHECKS`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from chessgrpo.track.diagnose.findings import (
    Finding,
    Thresholds,
    finite_series,
    learning_rows,
    pct,
    rounded,
    steps_where,
)
from chessgrpo.track.run_data import RunData

# ------------------------------------------------------------------------------------------------
# 1. The first minibatch after a rollout


def check_first_minibatch(run: RunData, t: Thresholds) -> list[Finding]:
    """ratio/first_max_abs_dev above the tolerance (or, on older logs, clipping at step 1)."""
    rows = learning_rows(run)
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
    steps, dev = finite_series(*run.series("ratio/first_max_abs_dev", rows))
    if not len(dev) and not run.has("ratio/max_abs_dev"):  # not a GRPO run (or nothing learned yet)
        bad = np.zeros(0, dtype=bool)
        evidence: dict[str, Any] = {}
    elif len(dev):
        bad = dev > tolerance
        evidence = {
            "steps_affected": int(bad.sum()),
            "steps_logged": len(dev),
            "tolerance": tolerance,
            "max_first_max_abs_dev": rounded(float(dev.max())),
            "median_first_max_abs_dev": rounded(float(np.median(dev))),
            "first_steps": steps_where(steps, bad),
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
    rows = learning_rows(run)
    findings = []
    by_gradient = run.has("grad_norm/policy")
    gradient_rows = [row for row in rows if "grad_norm/policy" in row]
    _, policy_value = finite_series(*run.series("loss/policy", rows))
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
            steps, share = finite_series(*run.series(f"loss/share_{term}", rows))
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
            "median_share": rounded(median),
            "fraction_of_steps_dominant": rounded(fraction),
            "steps_logged": len(share),
            "first_dominant_steps": steps_where(steps, dominant),
        }
        if by_gradient:
            _, policy_share = _gradient_share(run, gradient_rows, "policy")
            evidence["median_policy_share"] = rounded(float(np.median(policy_share))) if len(policy_share) else None
        else:
            _, policy = finite_series(*run.series("loss/share_policy", rows))
            evidence["median_policy_share"] = rounded(float(np.median(policy))) if len(policy) else None
        if term == "entropy":
            coef = run.setting("grpo.entropy_coef")
            _, entropy = finite_series(*run.series("entropy/mean", rows))
            evidence["grpo.entropy_coef"] = coef
            if len(entropy):
                evidence["median_entropy"] = rounded(float(np.median(entropy)))
            advice = (
                f"Lower grpo.entropy_coef (now {coef}; the default is 0) until the policy term dominates: the bonus "
                "pushes the policy towards uniform instead of towards reward."
            )
        elif term == "kl":
            _, coef = finite_series(*run.series("kl/coef", rows))
            _, kl = finite_series(*run.series("kl/value", rows))
            evidence["median_kl_coef"] = rounded(float(np.median(coef))) if len(coef) else None
            evidence["median_kl"] = rounded(float(np.median(kl))) if len(kl) else None
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
            f"the {label} is more than {pct(t.share_dominant)} of {of} in {pct(fraction)} of the "
            f"{'measured ' if by_gradient else ''}steps (median share {pct(median)})"
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
        return finite_series(steps, norms[term] / total)


# ------------------------------------------------------------------------------------------------
# 3. Controllers and monitors


def check_kl_controller(run: RunData, t: Thresholds) -> list[Finding]:
    """The adaptive KL coefficient pinned at a bound most of the run, or never moving."""
    if run.setting("grpo.kl_schedule") != "adaptive":
        return []
    rows = [row for row in learning_rows(run) if "kl/coef" in row]
    if len(rows) < t.min_controller_steps:
        return []
    last = rows[-1]
    steps, coef = run.series("kl/coef", rows)
    _, kl = finite_series(*run.series("kl/value", rows))
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
            "fraction_of_updates_at_bound": rounded(fraction),
            f"grpo.{label}": value,
            "grpo.kl_target": target,
            "median_kl": rounded(median_kl),
            "median_kl_over_target": rounded(median_kl / target),
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
            f"the adaptive KL coefficient sat at {label} = {value:g} after {pct(fraction)} of the updates "
            f"(median KL {median_kl:.3g} vs target {target:g})"
        )
        findings.append(Finding(f"kl.controller_pinned_{bound}", "warning", message, evidence, advice))
    if not findings:
        finite = coef[np.isfinite(coef) & (coef > 0)]
        off_target = math.isfinite(median_kl) and not (0.5 * target <= median_kl <= 2 * target)
        if len(finite) and finite.max() / finite.min() < t.inert_ratio and off_target:
            _, rows_per_step = finite_series(*run.series("learn/rows", rows))
            per_step = float(np.median(rows_per_step)) if len(rows_per_step) else math.nan
            horizon = float(run.setting("grpo.kl_horizon", 10000))
            evidence = {
                "coef_min": rounded(float(finite.min())),
                "coef_max": rounded(float(finite.max())),
                "steps_logged": len(rows),
                "median_kl": rounded(median_kl),
                "grpo.kl_target": target,
                "grpo.kl_horizon": horizon,
                "rows_per_step": per_step,
                "max_change_per_step": rounded(0.2 * per_step / horizon),
            }
            findings.append(
                Finding(
                    "kl.controller_inert",
                    "warning",
                    f"the adaptive KL coefficient never moved ({finite.min():.4g} .. {finite.max():.4g} over {len(rows)} steps) "
                    f"although the KL (median {median_kl:.3g}) is far from its target {target:g}",
                    evidence,
                    f"The coefficient changes by at most 20% x rows/kl_horizon = {pct(0.2 * per_step / horizon)} per step: lower "
                    f"grpo.kl_horizon (time constant kl_horizon / rows per step = {horizon / per_step:.0f} steps) so it can "
                    f"react within the run.",
                )
            )
    return findings


def check_grad_spikes(run: RunData, t: Thresholds) -> list[Finding]:
    """Gradient-norm spikes: robust z-score of log grad_norm above `spike_z` and `spike_ratio` x the median."""
    steps, norm = finite_series(*run.series("grad_norm", learning_rows(run)))
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
                "steps": steps_where(steps, spikes),
                "max_grad_norm_seen": rounded(float(norm[worst])),
                "max_step": int(steps[worst]),
                "median_grad_norm": rounded(typical),
                "max_over_median": rounded(ratio),
                "fraction_of_steps": rounded(fraction),
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
        steps, values = finite_series(*run.series(key, rows))
        negative = values < t.negative_kl
        if negative.any():
            hits[key] = {
                "min": rounded(float(values.min())),
                "steps": steps_where(steps, negative),
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
        steps, values = finite_series(*run.series("kl/value", rows))
        if len(values) and np.median(values) < t.negative_kl:
            findings.append(
                Finding(
                    "kl.negative_k1",
                    "info",
                    f"the k1 KL estimate is negative in the median step ({np.median(values):.3g}): k1 is unbiased but noisy and "
                    f"can go below 0",
                    {"median_kl": rounded(float(np.median(values))), "grpo.kl_estimator": "k1"},
                    "Use grpo.kl_estimator=exact (the default: the exact KL over every action, never negative) so the controller "
                    "sees a valid value; k1 as a loss has zero expected gradient and is refused with kl_coef > 0.",
                )
            )
    return findings
