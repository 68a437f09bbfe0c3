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

Where things are: the checks by what they look at (`checks_update`: ratio, loss budget, KL controller, KL
sign, gradient spikes; `checks_learning`: trends, held-out changes, games; `checks_policy`: entropy, signal, the
LM's and the endgame policy's play; `checks_health`: non-finite values, health events, engines, cache, time),
`Finding` and `Thresholds` in `findings`, trends and held-out changes in `changes`; this module runs them
(`CHECKS`, `diagnose`) and formats the findings. Adding a check: a function in the module of its kind and one
line in `CHECKS`.

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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chessgrpo.track.diagnose.checks_health import (
    check_cache,
    check_engine,
    check_health_events,
    check_non_finite,
    check_phase_time,
)
from chessgrpo.track.diagnose.checks_learning import check_learning, check_noise_as_progress
from chessgrpo.track.diagnose.checks_policy import check_endgame_play, check_entropy, check_lm_collapse, check_signal
from chessgrpo.track.diagnose.checks_update import (
    check_first_minibatch,
    check_grad_spikes,
    check_kl_controller,
    check_loss_budget,
    check_negative_kl,
)
from chessgrpo.track.diagnose.findings import SEVERITIES, SEVERITY_RANK, Check, Finding, Thresholds, jsonable
from chessgrpo.track.run_data import RunData, load_run

# `chessgrpo.track.diagnose` is the documented entry point (docs/diagnose.md): `Finding` and `Thresholds` are
# re-exported from `findings` for its callers; the checks themselves are imported from their modules.
__all__ = ["CHECKS", "SEVERITIES", "Check", "Finding", "Thresholds", "diagnose", "diagnose_run", "format_findings"]


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
    return sorted(findings, key=lambda f: SEVERITY_RANK[f.severity])


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
        evidence = ", ".join(f"{k}={_short(v)}" for k, v in jsonable(finding.evidence).items())
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
