"""The report's figures: one function per figure, over one or several runs, matplotlib (Agg).

Every figure has a title, labelled axes with units and a legend; intervals are bands or error
bars. A figure whose metrics no run logged is skipped (the builder returns None), so the same
code draws GRPO and pretraining runs. With several runs, colour is the run and line style the
metric; with one run, colour is the metric.

Per-step training metrics are noisy (every step draws fresh positions), so long series are drawn
twice: the raw values thin and pale, and a centred moving average over ``w`` steps (w = n/25,
at least 5) with its 95% band ``mean +- 1.96 sd / sqrt(w)`` from the spread inside the window.
Short series (< 10 steps) are drawn raw; the reward then gets the per-step band
``reward/mean +- 1.96 reward/std / sqrt(rows)`` (the batch mean's own interval).

No pyplot: figures are `matplotlib.figure.Figure` objects drawn by the Agg canvas, so nothing
global is touched and no display is needed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from chessgrpo.track.run_data import HELDOUT_METRICS, HELDOUT_UNITS, RunData

if TYPE_CHECKING:
    from chessgrpo.sweep.summary import StudyPlotData

Z95 = 1.959964
STEP_LABEL = "training step"
_LINESTYLES = ("-", "--", ":", "-.")


@dataclasses.dataclass
class ReportFigure:
    """A drawn figure with what the report says about it."""

    name: str
    """File stem of the PNG (``reward`` -> reward.png)."""
    title: str
    caption: str
    figure: Figure

    def png(self, dpi: int = 100) -> bytes:
        from io import BytesIO

        buffer = BytesIO()
        FigureCanvasAgg(self.figure)
        self.figure.savefig(buffer, format="png", dpi=dpi)
        return buffer.getvalue()


# ------------------------------------------------------------------------------------------------
# Helpers


def _new_figure(panels: int, *, width: float = 11.0, height: float = 3.6, columns: int | None = None) -> tuple[Figure, list]:
    columns = columns or min(panels, 2)
    rows = math.ceil(panels / columns)
    figure = Figure(figsize=(width, height * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).flatten().tolist()
    for extra in axes[panels:]:
        extra.set_visible(False)
    return figure, axes[:panels]


def _style(run_index: int, metric_index: int, n_runs: int) -> dict:
    if n_runs == 1:
        return {"color": f"C{metric_index % 10}", "linestyle": "-"}
    return {"color": f"C{run_index % 10}", "linestyle": _LINESTYLES[metric_index % len(_LINESTYLES)]}


def _label(run: RunData, metric: str, n_runs: int) -> str:
    return metric if n_runs == 1 else f"{run.name}: {metric}"


def _series(run: RunData, key: str, train_only: bool = True) -> tuple[np.ndarray, np.ndarray]:
    steps, values = run.series(key, run.train_rows if train_only else None)
    keep = np.isfinite(values)
    return steps[keep], values[keep]


def window_for(n: int) -> int:
    """Moving-average window (steps) for a series of n points: 1 below 10 points, else max(5, n // 25)."""
    return 1 if n < 10 else max(5, n // 25)


def moving_average(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Centred moving mean and the 95% half-width 1.96 sd / sqrt(k) of each window (k points, edges shrink)."""
    n = len(values)
    if window <= 1 or n == 0:
        return values.astype(float), np.zeros(n)
    half = window // 2
    mean = np.empty(n)
    width = np.empty(n)
    for i in range(n):
        chunk = values[max(0, i - half) : min(n, i + half + 1)]
        mean[i] = chunk.mean()
        width[i] = Z95 * chunk.std(ddof=1) / math.sqrt(len(chunk)) if len(chunk) > 1 else 0.0
    return mean, width


def _plot_smoothed(ax, steps: np.ndarray, values: np.ndarray, label: str, style: dict, *, band: bool = True) -> None:
    window = window_for(len(values))
    if window == 1:
        ax.plot(steps, values, marker="." if len(values) < 30 else None, label=label, **style)
        return
    ax.plot(steps, values, color=style["color"], alpha=0.25, linewidth=0.7)
    mean, width = moving_average(values, window)
    ax.plot(steps, mean, label=f"{label} (mean of {window} steps)", linewidth=1.6, **style)
    if band:
        ax.fill_between(steps, mean - width, mean + width, color=style["color"], alpha=0.2, linewidth=0)


def _finish(ax, ylabel: str, title: str | None = None, *, xlabel: str = STEP_LABEL, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def _any(runs: Sequence[RunData], *keys: str) -> bool:
    return any(run.has(key) for run in runs for key in keys)


def _plot_metrics(ax, runs: Sequence[RunData], keys: Sequence[str], *, band: bool = True, raw: bool = False) -> bool:
    """Each run's `keys` on `ax`: smoothed with a band (noisy per-step metrics) or raw (schedules, controller outputs)."""
    drawn = False
    for r, run in enumerate(runs):
        for m, key in enumerate(keys):
            steps, values = _series(run, key)
            if not len(values):
                continue
            if raw:
                ax.plot(steps, values, label=_label(run, key, len(runs)), **_style(r, m, len(runs)))
            else:
                _plot_smoothed(ax, steps, values, _label(run, key, len(runs)), _style(r, m, len(runs)), band=band)
            drawn = True
    return drawn


def _plot_trend(ax, steps: np.ndarray, values: np.ndarray, style: dict) -> None:
    """The least-squares line the diagnosis tests, labelled with its change over the run and 95% interval."""
    from chessgrpo.track.diagnose import linear_trend

    if len(values) < 10:
        return
    change, low, high = linear_trend(steps, values)
    if not math.isfinite(change):
        return
    slope, intercept = np.polyfit(steps, values, 1)
    ax.plot(steps[[0, -1]], intercept + slope * steps[[0, -1]], color=style["color"], linestyle=(0, (5, 2)), linewidth=1.0,
            label=f"linear trend: {change:+.3f} [{low:+.3f}, {high:+.3f}] over the run")  # fmt: skip


def _reward_units(runs: Sequence[RunData]) -> str:
    kinds = {run.setting("task.reward", "win_prob") for run in runs}
    if kinds == {"regret"}:
        return "regret (win-prob units, <= 0)"
    if kinds == {"win_prob"}:
        return "win probability of the move (0-1, mover's view)"
    return "reward (win-prob units)"


# ------------------------------------------------------------------------------------------------
# Figures


def figure_reward(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "reward/mean"):
        return None
    has_esl = _any(runs, "reward/esl")
    figure, axes = _new_figure(2 if has_esl else 1)
    ax = axes[0]
    for r, run in enumerate(runs):
        steps, mean = _series(run, "reward/mean")
        if not len(mean):
            continue
        style = _style(r, 0, len(runs))
        _plot_smoothed(ax, steps, mean, _label(run, "reward/mean", len(runs)), style)
        if window_for(len(mean)) == 1:  # short run: the per-step batch mean's own interval
            _, std = run.series("reward/std", run.train_rows)
            _, rows = run.series("learn/rows", run.train_rows)
            if len(std) == len(mean) and len(rows) == len(mean):
                width = Z95 * std / np.sqrt(np.maximum(rows, 1))
                ax.fill_between(steps, mean - width, mean + width, color=style["color"], alpha=0.2, linewidth=0,
                                label="95% interval of the batch mean")  # fmt: skip
        _plot_trend(ax, steps, mean, style)
    _finish(ax, _reward_units(runs), "reward of the sampled moves")
    if has_esl:
        _plot_metrics(axes[1], runs, ["reward/esl"])
        _finish(axes[1], "expected score loss (win-prob units)", "rollout ESL: best move's value - sampled move's")
    figure.suptitle("Reward (training rollouts)")
    return ReportFigure("reward", "Reward", "Mean reward of the sampled moves per step and the rollout's expected score loss "
                        "(lower is better). Bands: 95% intervals (see the note on moving averages).", figure)  # fmt: skip


def figure_heldout(runs: Sequence[RunData]) -> ReportFigure | None:
    metrics = [m for m in HELDOUT_METRICS if any(m in p.metrics for run in runs for p in run.evals)]
    if not metrics:
        return None
    figure, axes = _new_figure(len(metrics), height=3.2, columns=min(3, len(metrics)), width=12.5)
    for ax, metric in zip(axes, metrics):
        higher = HELDOUT_METRICS[metric][3]
        for r, run in enumerate(runs):
            points = [p for p in run.evals if metric in p.metrics]
            if not points:
                continue
            steps = np.array([p.step for p in points], dtype=float)
            values = np.array([p.metrics[metric].value for p in points])
            low = np.array([p.metrics[metric].low for p in points])
            high = np.array([p.metrics[metric].high for p in points])
            offset = (r - (len(runs) - 1) / 2) * 0.01 * max(1.0, float(np.ptp(steps)))
            style = _style(r, 0, len(runs))
            has = np.isfinite(low) & np.isfinite(high)
            label = run.name if len(runs) > 1 else metric
            if has.all():
                ax.errorbar(steps + offset, values, yerr=[values - low, high - values], marker="o", capsize=4,
                            label=f"{label} (95% interval)", color=style["color"], linestyle=style["linestyle"])  # fmt: skip
            else:
                ax.plot(steps + offset, values, marker="o", label=f"{label} (no interval logged)", **style)
            if len(runs) == 1 and len(run.evals) >= 2:
                from chessgrpo.track.diagnose import Thresholds, heldout_change

                change = heldout_change(run, metric, run.evals[0], run.evals[-1], Thresholds())
                if change is not None:
                    how = "paired" if change.paired else "unpaired"
                    ax.text(0.02, 0.03, f"last - first: {change.difference:+.4f}\n[{change.low:+.4f}, {change.high:+.4f}] {how}",
                            transform=ax.transAxes, fontsize=7, va="bottom",
                            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "#ccc"})  # fmt: skip
        _finish(ax, HELDOUT_UNITS[metric], f"{metric} ({'higher' if higher else 'lower'} is better)")
    figure.suptitle("Held-out evaluation (the same positions and puzzles at every point)")
    return ReportFigure("heldout", "Held-out metrics", "Held-out ESL, top-1 agreement with the engine, blunder rate and "
                        "puzzle accuracy at each evaluation, with 95% intervals (bootstrap for the offline metrics, Wilson "
                        "for puzzles). Overlapping intervals are not progress; the diagnosis compares points paired.", figure)  # fmt: skip


def figure_pretraining(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "loss/train"):
        return None
    figure, axes = _new_figure(2)
    for ax, (train_key, eval_key, unit, title) in zip(axes, (
        ("loss/train", "eval/loss", "cross-entropy (nats)", "loss: training batches and held-out split"),
        ("train/top1", "eval/top1", "fraction of positions", "top-1 agreement with the engine's best move"),
    )):  # fmt: skip
        for r, run in enumerate(runs):
            steps, values = _series(run, train_key)
            if len(values):
                _plot_smoothed(ax, steps, values, _label(run, train_key, len(runs)), _style(r, 0, len(runs)))
                if train_key == "loss/train":
                    _plot_trend(ax, steps, values, _style(r, 0, len(runs)))
            steps, values = _series(run, eval_key, train_only=False)
            if len(values):
                style = _style(r, 1, len(runs)) if len(runs) == 1 else {**_style(r, 1, len(runs))}
                ax.plot(steps, values, marker="o", label=_label(run, eval_key + " (point estimate)", len(runs)), **style)
        _finish(ax, unit, title)
    figure.suptitle("Pretraining: training and held-out")
    return ReportFigure("pretraining", "Pretraining curves", "Training metrics (batch means) and held-out metrics on the "
                        "dataset's test split. Pretraining evaluation logs point estimates only (no interval).", figure)  # fmt: skip


def figure_loss(runs: Sequence[RunData]) -> ReportFigure | None:
    terms = ["loss/policy", "loss/kl_weighted", "loss/entropy", "loss/total"]
    if not _any(runs, *terms):
        return None
    shares = ["loss/share_policy", "loss/share_kl", "loss/share_entropy"]
    has_shares = _any(runs, *shares)
    figure, axes = _new_figure(2 if has_shares else 1)
    _plot_metrics(axes[0], runs, [t for t in terms if _any(runs, t)], band=False)
    axes[0].axhline(0, color="black", linewidth=0.6)
    _finish(axes[0], "loss value (dimensionless)", "loss terms (entropy term = -coef x entropy)")
    if has_shares:
        ax = axes[1]
        if len(runs) == 1:
            run = runs[0]
            series = [_series(run, key) for key in shares]
            steps = series[0][0]
            if all(len(s[1]) == len(steps) for s in series) and len(steps):
                window = window_for(len(steps))
                stacked = [moving_average(s[1], window)[0] for s in series]
                ax.stackplot(steps, stacked, labels=[f"{k} (mean of {window} steps)" if window > 1 else k for k in shares],
                             colors=["C0", "C1", "C2"], alpha=0.8)  # fmt: skip
        else:
            _plot_metrics(ax, runs, shares, band=False)
        ax.axhline(0.5, color="black", linestyle="--", linewidth=0.8, label="one half (dominance)")
        ax.set_ylim(0, 1.02)
        _finish(ax, "share of sum |terms| (0-1)", "loss budget: each term's share")
    figure.suptitle("Loss terms and their shares")
    return ReportFigure("loss", "Loss terms and shares", "The policy (clipped surrogate), weighted KL and entropy terms, and "
                        "each term's share of the sum of their magnitudes. With normalised advantages the policy term's "
                        "value is near 0 by construction; a regularizer above one half for most steps is flagged.", figure)  # fmt: skip


def figure_kl(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "kl/value", "kl/coef"):
        return None
    figure, axes = _new_figure(2)
    _plot_metrics(axes[0], runs, [k for k in ("kl/value", "kl/exact", "loss/kl_weighted") if _any(runs, k)])
    for r, run in enumerate(runs):
        if run.setting("grpo.kl_schedule") == "adaptive":
            axes[0].axhline(float(run.setting("grpo.kl_target", 0.01)), color=_style(r, 0, len(runs))["color"], linestyle="--",
                            linewidth=0.9, label=f"{run.name if len(runs) > 1 else ''} kl_target".strip())  # fmt: skip
    _finish(axes[0], "KL (nats per move/token)", "KL to the reference: raw estimate, exact, weighted")
    ax = axes[1]
    _plot_metrics(ax, runs, ["kl/coef"], raw=True)
    values = [v for run in runs for v in _series(run, "kl/coef")[1] if v > 0]
    for r, run in enumerate(runs):
        if run.setting("grpo.kl_schedule") == "adaptive":
            for bound in ("kl_coef_min", "kl_coef_max"):
                value = float(run.setting(f"grpo.{bound}", math.nan))
                if value > 0:
                    ax.axhline(value, color=_style(r, 0, len(runs))["color"], linestyle=":", linewidth=0.9,
                               label=f"{run.name + ' ' if len(runs) > 1 else ''}{bound}")  # fmt: skip
                    values.append(value)
    if values and max(values) / min(values) > 20:
        ax.set_yscale("log")
    _finish(ax, "KL coefficient beta (dimensionless)", "KL coefficient (controller output)")
    figure.suptitle("KL to the reference policy")
    return ReportFigure("kl", "KL and its coefficient", "kl/value: the k-estimator on the sampled moves (mean per move/token); "
                        "kl/exact: the exact KL of the full distributions at sampling; loss/kl_weighted = coef x KL. Right: "
                        "the coefficient, with the adaptive controller's bounds when adaptive.", figure)  # fmt: skip


def figure_entropy(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "entropy/mean"):
        return None
    figure, axes = _new_figure(1, width=9.0)
    ax = axes[0]
    for r, run in enumerate(runs):
        steps, entropy = _series(run, "entropy/mean")
        if len(entropy):
            _plot_smoothed(ax, steps, entropy, _label(run, "entropy/mean", len(runs)), _style(r, 0, len(runs)))
        steps, legal = _series(run, "entropy/ln_legal")
        if len(legal):
            style = _style(r, 1, len(runs)) if len(runs) == 1 else {**_style(r, 1, len(runs))}
            mean, _ = moving_average(legal, window_for(len(legal)))
            ax.plot(steps, mean, label=_label(run, "ln(#legal moves) = uniform policy", len(runs)), **style)
            ax.fill_between(steps, 0.95 * mean, mean, color="grey", alpha=0.15, linewidth=0,
                            label="near-uniform zone (>= 95% of ln #legal)" if r == 0 else None)  # fmt: skip
    ax.axhspan(0, 0.1, color="red", alpha=0.08, label="collapse zone (< 0.1 nats)")
    ax.set_ylim(bottom=0)
    _finish(ax, "entropy (nats)", "policy entropy against the uniform policy's")
    figure.suptitle("Entropy of the sampling distribution")
    return ReportFigure("entropy", "Entropy", "Exact entropy of the masked, tempered policy at the sampled positions against "
                        "ln(#legal moves), the entropy of the uniform policy.", figure)  # fmt: skip


def figure_signal(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "rollout/frac_reward_zero_std"):
        return None
    has_unique = _any(runs, "rollout/unique_moves")
    figure, axes = _new_figure(2 if has_unique else 1)
    _plot_metrics(axes[0], runs, ["rollout/frac_reward_zero_std"])
    axes[0].axhline(0.5, color="black", linestyle="--", linewidth=0.8, label="one half")
    axes[0].set_ylim(-0.02, 1.02)
    _finish(axes[0], "fraction of groups", "groups whose rewards are all equal (no signal)")
    if has_unique:
        _plot_metrics(axes[1], runs, ["rollout/unique_moves"])
        _finish(axes[1], "distinct moves per group (count)", "distinct sampled moves per group")
    figure.suptitle("Signal: reward variance inside groups")
    return ReportFigure("signal", "Signal", "A group whose sampled moves all get the same reward has zero advantage and "
                        "teaches nothing.", figure)  # fmt: skip


def figure_clip(runs: Sequence[RunData]) -> ReportFigure | None:
    keys = [k for k in ("ratio/clip_frac", "ratio/clip_frac_low", "ratio/clip_frac_high") if _any(runs, k)]
    if not keys:
        return None
    figure, axes = _new_figure(1, width=9.0)
    _plot_metrics(axes[0], runs, keys)
    axes[0].set_ylim(bottom=0)
    _finish(axes[0], "fraction of tokens (moves)", "clipped fraction: low (A < 0, ratio < 1-eps), high (A > 0, ratio > 1+eps)")
    figure.suptitle("PPO clipping")
    return ReportFigure("clip", "Clip fractions", "Share of sampled moves whose ratio was clipped, over all minibatches of a "
                        "step. The first minibatch after a rollout must clip nothing.", figure)  # fmt: skip


def figure_ratio(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "ratio/mean", "ratio/first_max_abs_dev"):
        return None
    figure, axes = _new_figure(2)
    ax = axes[0]
    for r, run in enumerate(runs):
        steps, low = _series(run, "ratio/min")
        _, high = _series(run, "ratio/max")
        style = _style(r, 0, len(runs))
        if len(low) and len(low) == len(high):
            ax.fill_between(steps, low, high, color=style["color"], alpha=0.2, linewidth=0,
                            label=_label(run, "ratio min-max over moves", len(runs)))  # fmt: skip
        steps, mean = _series(run, "ratio/mean")
        if len(mean):
            ax.plot(steps, mean, label=_label(run, "ratio/mean", len(runs)), **style)
        eps_low = float(run.setting("grpo.epsilon", 0.2))
        eps_high = run.setting("grpo.epsilon_high") or eps_low
        if r == 0 and run.kind == "grpo":
            bounds = f"clip bounds 1-{eps_low:g}, 1+{float(eps_high):g}"
            ax.axhline(1 - eps_low, color="black", linestyle="--", linewidth=0.8, label=bounds)
            ax.axhline(1 + float(eps_high), color="black", linestyle="--", linewidth=0.8)
    _finish(ax, "ratio pi/pi_old (dimensionless)", "importance ratio over all minibatches")
    ax = axes[1]
    floor = 1e-9
    for r, run in enumerate(runs):
        steps, dev = _series(run, "ratio/first_max_abs_dev")
        if len(dev):
            ax.plot(steps, np.maximum(dev, floor), marker="." if len(dev) < 60 else None,
                    label=_label(run, f"ratio/first_max_abs_dev (0 drawn at {floor:g})", len(runs)),
                    **_style(r, 0, len(runs)))  # fmt: skip
        bf16 = run.setting("bf16")
        tolerance = float(run.setting("grpo.ratio_tolerance_bf16", 2e-2) if bf16 else run.setting("grpo.ratio_tolerance", 1e-4))
        if r == 0:
            ax.axhline(tolerance, color="red", linestyle="--", linewidth=0.9, label=f"tolerance {tolerance:g}")
    ax.set_yscale("log")
    _finish(ax, "max |ratio - 1| (log scale)", "first minibatch after each rollout (must be ~0)")
    figure.suptitle("Importance ratio")
    return ReportFigure("ratio", "Ratio range", "Left: the range and mean of the ratio used in the loss. Right: the largest "
                        "|ratio - 1| on the first minibatch after each rollout, where the learner's weights still equal "
                        "the sampler's: above the tolerance the log-probs of sampling and learning differ.", figure)  # fmt: skip


def figure_throughput(runs: Sequence[RunData]) -> ReportFigure | None:
    phases = ["perf/sample_s", "perf/reward_s", "perf/learn_s"]
    has_phases = _any(runs, *phases)
    rates = [k for k in ("perf/samples_per_s", "perf/engine_evals_per_s") if _any(runs, k)]
    if not has_phases and not rates:
        return None
    has_cache = _any(runs, "perf/cache_hit_rate")
    panels = int(has_phases) + len(rates) + int(has_cache)
    figure, axes = _new_figure(panels, columns=2 if panels > 1 else 1)
    index = 0
    if has_phases:
        ax = axes[index]
        index += 1
        if len(runs) == 1:
            series = [_series(runs[0], key) for key in phases]
            steps = series[0][0]
            if len(steps) and all(len(s[1]) == len(steps) for s in series):
                window = window_for(len(steps))
                stacked = [moving_average(s[1], window)[0] for s in series]
                suffix = f" (mean of {window} steps)" if window > 1 else ""
                labels = [p.split("/")[1].removesuffix("_s") + suffix for p in phases]
                ax.stackplot(steps, stacked, labels=labels, colors=["C0", "C1", "C2"], alpha=0.85)
        else:
            _plot_metrics(ax, runs, phases, band=False)
        _finish(ax, "seconds per step (s)", "time per phase (stacked: sample, reward, learn)")
    for key in rates:
        ax = axes[index]
        index += 1
        _plot_metrics(ax, runs, [key])
        unit = "samples per second (1/s)" if key == "perf/samples_per_s" else "engine evaluations per second (1/s)"
        _finish(ax, unit, key)
    if has_cache:
        ax = axes[index]
        _plot_metrics(ax, runs, ["perf/cache_hit_rate"])
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, "fraction of lookups", "evaluation cache hit rate")
    figure.suptitle("Throughput and phase times")
    return ReportFigure("throughput", "Throughput", "Time per training step split into sampling, engine rewards and learning; "
                        "samples and engine evaluations per second; the evaluation cache's hit rate.", figure)  # fmt: skip


def figure_optimizer(runs: Sequence[RunData]) -> ReportFigure | None:
    if not _any(runs, "grad_norm", "lr"):
        return None
    figure, axes = _new_figure(2)
    _plot_metrics(axes[0], runs, ["grad_norm"], band=False)
    for r, run in enumerate(runs):
        clip = run.setting("max_grad_norm", run.setting("grpo.max_grad_norm", run.setting("grad_clip")))
        if clip:
            axes[0].axhline(float(clip), color=_style(r, 0, len(runs))["color"], linestyle="--", linewidth=0.9,
                            label=f"{run.name + ' ' if len(runs) > 1 else ''}clip at {clip}")  # fmt: skip
    values = [v for run in runs for v in _series(run, "grad_norm")[1] if v > 0]
    if values and max(values) / min(values) > 20:
        axes[0].set_yscale("log")
    _finish(axes[0], "gradient L2 norm before clipping", "gradient norm")
    _plot_metrics(axes[1], runs, ["lr"], raw=True)
    _finish(axes[1], "learning rate (per update)", "learning rate")
    figure.suptitle("Optimizer")
    return ReportFigure("optimizer", "Gradient norm and learning rate", "Gradient norm before clipping (mean over the step's "
                        "minibatches) with the clipping threshold, and the learning rate schedule.", figure)  # fmt: skip


FIGURES: tuple[Callable[[Sequence[RunData]], ReportFigure | None], ...] = (
    figure_reward,
    figure_heldout,
    figure_pretraining,
    figure_loss,
    figure_kl,
    figure_entropy,
    figure_signal,
    figure_clip,
    figure_ratio,
    figure_throughput,
    figure_optimizer,
)


def build_figures(runs: Sequence[RunData]) -> list[ReportFigure]:
    """Every figure some run has metrics for, in report order."""
    return [figure for build in FIGURES if (figure := build(runs)) is not None]


def figure_study(study: StudyPlotData) -> ReportFigure:
    """A sweep's optimisation history (each trial's objective, the best so far) beside its parameter importances."""
    figure, (history, importance) = _new_figure(2)
    minimize = study.direction == "minimize"
    done = [(n, v, i) for n, v, s, i in zip(study.numbers, study.values, study.states, study.intervals) if s == "complete" and v is not None]
    pruned = [(n, v) for n, v, s in zip(study.numbers, study.values, study.states) if s == "pruned" and v is not None]
    failed = [n for n, s in zip(study.numbers, study.states) if s == "failed"]
    if done:
        numbers = np.array([n for n, _, _ in done])
        values = np.array([v for _, v, _ in done], dtype=float)
        low = np.array([v - i[0] if i else 0.0 for _, v, i in done])
        high = np.array([i[1] - v if i else 0.0 for _, v, i in done])
        history.errorbar(numbers, values, yerr=[low, high], fmt="o", color="C0", ecolor="C0", alpha=0.8, capsize=2,
                         label="complete (95% interval)")  # fmt: skip
        best = np.minimum.accumulate(values) if minimize else np.maximum.accumulate(values)
        history.step(numbers, best, where="post", color="C3", label=f"best so far ({'lowest' if minimize else 'highest'})")
    if pruned:
        history.scatter([n for n, _ in pruned], [v for _, v in pruned], marker="x", color="0.5", label="pruned (last reported value)")
    history.xaxis.set_major_locator(MaxNLocator(integer=True))
    failed_text = f"; {len(failed)} failed (not drawn)" if failed else ""
    _finish(history, study.metric, f"optimisation history of {study.name}{failed_text}", xlabel="trial number")
    if study.importances:
        names = list(study.importances)[::-1]
        importance.barh(names, [study.importances[n] for n in names], color="C2")
        importance.set_xlim(0, 1)
        _finish(importance, "parameter", "parameter importances (PED-ANOVA, normalised)", xlabel="importance", legend=False)
    else:
        importance.text(0.5, 0.5, study.importance_note or "no importances", ha="center", va="center", transform=importance.transAxes)
        importance.set_axis_off()
    caption = (f"Each complete trial's objective ({study.metric}, {study.direction}) with its 95% interval (the evaluation's own, "
               "or the paired bootstrap of the change from step 0), pruned trials at their last reported value, and the best "
               "value so far. The best is selected on these positions: re-measure it on unseen ones "
               "(chessgrpo sweep --summary STUDY --remeasure). Importances: how much of the objective's variation over the "
               "complete trials each parameter explains.")  # fmt: skip
    return ReportFigure("study", f"Sweep {study.name}: optimisation history and parameter importances", caption, figure)
