"""The report's figures of the training steps, one function per figure over one or several runs: the reward, the
pretraining curves, the loss terms and their budget, the KL and its coefficient, the entropy, the signal, the clip
fractions, the importance ratio, throughput and the optimizer. Each returns None when no run logged its metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from chessgrpo.track.figure_panels import Panel, Reference
from chessgrpo.track.figures import ReportFigure
from chessgrpo.track.plot_series import (
    Z95,
    any_logged,
    finite_series,
    legend_group,
    line_style,
    moving_average,
    plot_metrics,
    plot_smoothed,
    plot_stacked,
    plot_trend,
    series_label,
    window_for,
)
from chessgrpo.track.run_data import RunData


def _run_rewards(run: RunData) -> frozenset[str]:
    """The rewards a run trains on: the names of `task.rewards` (weighted) when set, else `task.reward`."""
    weighted = run.setting("task.rewards")
    if isinstance(weighted, dict) and weighted:
        return frozenset(str(name) for name in weighted)
    return frozenset([str(run.setting("task.reward", "win_prob"))])


def _reward_units(runs: Sequence[RunData]) -> str:
    kinds: set[str] = set().union(*(_run_rewards(run) for run in runs))
    if kinds == {"regret"}:
        return "regret (win-prob units, <= 0)"
    if kinds == {"win_prob"}:
        return "win probability of the move (0-1, mover's view)"
    return "reward (win-prob units)"


def figure_reward(runs: Sequence[RunData]) -> ReportFigure | None:
    if not any_logged(runs, "reward/mean"):
        return None
    panel = Panel("reward of the sampled moves", _reward_units(runs))
    for r, run in enumerate(runs):
        steps, mean = finite_series(run, "reward/mean")
        if not len(mean):
            continue
        style, group = line_style(r, 0, len(runs)), legend_group(run, len(runs))
        plot_smoothed(panel, steps, mean, series_label(run, "reward/mean", len(runs)), style, group=group)
        if window_for(len(mean)) == 1:  # short run: the per-step batch mean's own interval
            _, std = run.series("reward/std", run.train_rows)
            _, rows = run.series("learn/rows", run.train_rows)
            if len(std) == len(mean) and len(rows) == len(mean):
                width = Z95 * std / np.sqrt(np.maximum(rows, 1))
                panel.band(
                    steps,
                    mean - width,
                    mean + width,
                    "95% interval of the batch mean",
                    color=style["color"],
                    group=group,
                )
        plot_trend(panel, steps, mean, style, group)
    panels = [panel]
    if any_logged(runs, "reward/esl"):
        esl = Panel("rollout ESL: best move's value - sampled move's", "expected score loss (win-prob units)")
        plot_metrics(esl, runs, ["reward/esl"])
        panels.append(esl)
    return ReportFigure(
        "reward",
        "Reward",
        "Mean reward of the sampled moves per step and the rollout's expected score loss "
        "(lower is better). Bands: 95% intervals (see the note on moving averages).",
        "Reward (training rollouts)",
        panels,
    )


def figure_pretraining(runs: Sequence[RunData]) -> ReportFigure | None:
    if not any_logged(runs, "loss/train"):
        return None
    panels = []
    for train_key, eval_key, unit, title in (
        ("loss/train", "eval/loss", "cross-entropy (nats)", "loss: training batches and held-out split"),
        ("train/top1", "eval/top1", "fraction of positions", "top-1 agreement with the engine's best move"),
    ):
        panel = Panel(title, unit)
        for r, run in enumerate(runs):
            group = legend_group(run, len(runs))
            steps, values = finite_series(run, train_key)
            if len(values):
                plot_smoothed(
                    panel,
                    steps,
                    values,
                    series_label(run, train_key, len(runs)),
                    line_style(r, 0, len(runs)),
                    group=group,
                )
                if train_key == "loss/train":
                    plot_trend(panel, steps, values, line_style(r, 0, len(runs)), group)
            steps, values = finite_series(run, eval_key, train_only=False)
            if len(values):
                label = series_label(run, eval_key + " (point estimate)", len(runs))
                panel.line(
                    steps, values, label, source=label, marker="circle", group=group, **line_style(r, 1, len(runs))
                )
        panels.append(panel)
    return ReportFigure(
        "pretraining",
        "Pretraining curves",
        "Training metrics (batch means) and held-out metrics on the "
        "dataset's test split. Pretraining evaluation logs point estimates only (no interval).",
        "Pretraining: training and held-out",
        panels,
    )


def figure_loss(runs: Sequence[RunData]) -> ReportFigure | None:
    terms = ["loss/policy", "loss/kl_weighted", "loss/entropy", "loss/total"]
    if not any_logged(runs, *terms):
        return None
    shares = ["loss/share_policy", "loss/share_kl", "loss/share_entropy"]
    panel = Panel("loss terms (entropy term = -coef x entropy)", "loss value (dimensionless)")
    plot_metrics(panel, runs, [t for t in terms if any_logged(runs, t)], band=False)
    panel.hline(0.0, None, color="black", dash="solid", width=0.6)
    panels = [panel]
    if any_logged(runs, *shares):
        budget = Panel("loss budget: each term's share", "share of sum |terms| (0-1)", ylim=(0, 1.02))
        plot_stacked(budget, runs, shares, shares)
        budget.hline(0.5, "one half (dominance)", color="black", dash="dash")
        panels.append(budget)
    gradients = [f"grad_norm/{term}" for term in ("policy", "kl", "entropy", "aux")]
    if any_logged(runs, "grad_norm/policy"):
        pull = Panel("gradient of each term alone (every grpo.term_gradient_every steps)", "gradient L2 norm")
        plot_metrics(pull, runs, [k for k in gradients if any_logged(runs, k)], raw=True)
        panels.append(pull)
    return ReportFigure(
        "loss",
        "Loss terms and shares",
        "The policy (clipped surrogate), weighted KL and entropy terms, and "
        "each term's share of the sum of their magnitudes. With normalised advantages the policy term's "
        "value is near 0 by construction, so the last panel shows what each term pulls on the weights "
        "(its own gradient's norm, auxiliary = value head and bc anchor); a term other than the policy "
        "above one half of the sum for most measured steps is flagged.",
        "Loss terms and their shares",
        panels,
    )


def figure_kl(runs: Sequence[RunData]) -> ReportFigure | None:
    if not any_logged(runs, "kl/value", "kl/coef"):
        return None
    value = Panel("KL to the reference: raw estimate, exact, weighted", "KL (nats per move/token)")
    plot_metrics(value, runs, [k for k in ("kl/value", "kl/exact", "loss/kl_weighted") if any_logged(runs, k)])
    for r, run in enumerate(runs):
        if run.setting("grpo.kl_schedule") == "adaptive":
            value.hline(
                float(run.setting("grpo.kl_target", 0.01)),
                f"{run.name if len(runs) > 1 else ''} kl_target".strip(),
                color=line_style(r, 0, len(runs))["color"],
                dash="dash",
                width=0.9,
            )
    coef = Panel("KL coefficient (controller output)", "KL coefficient beta (dimensionless)")
    plot_metrics(coef, runs, ["kl/coef"], raw=True)
    values = [v for run in runs for v in finite_series(run, "kl/coef")[1] if v > 0]
    for r, run in enumerate(runs):
        if run.setting("grpo.kl_schedule") == "adaptive":
            for bound in ("kl_coef_min", "kl_coef_max"):
                limit = float(run.setting(f"grpo.{bound}", math.nan))
                if limit > 0:
                    coef.hline(
                        limit,
                        f"{run.name + ' ' if len(runs) > 1 else ''}{bound}",
                        color=line_style(r, 0, len(runs))["color"],
                        dash="dot",
                        width=0.9,
                    )
                    values.append(limit)
    coef.ylog = bool(values) and max(values) / min(values) > 20
    panels = [p for p in (value, coef) if p.traces]
    return ReportFigure(
        "kl",
        "KL and its coefficient",
        "kl/value: the k-estimator on the sampled moves (mean per move/token); "
        "kl/exact: the exact KL of the full distributions at sampling; loss/kl_weighted = coef x KL. The "
        "coefficient: the controller's output, with its bounds when adaptive.",
        "KL to the reference policy",
        panels,
    )


def figure_entropy(runs: Sequence[RunData]) -> ReportFigure | None:
    if not any_logged(runs, "entropy/mean"):
        return None
    panel = Panel("policy entropy against the uniform policy's", "entropy (nats)", ylim=(0, None))
    for r, run in enumerate(runs):
        group = legend_group(run, len(runs))
        steps, entropy = finite_series(run, "entropy/mean")
        if len(entropy):
            plot_smoothed(
                panel,
                steps,
                entropy,
                series_label(run, "entropy/mean", len(runs)),
                line_style(r, 0, len(runs)),
                group=group,
            )
        steps, legal = finite_series(run, "entropy/ln_legal")
        if len(legal):
            mean, _ = moving_average(legal, window_for(len(legal)))
            label = series_label(run, "ln(#legal moves) = uniform policy", len(runs))
            panel.line(steps, mean, label, group=group, **line_style(r, 1, len(runs)))
            panel.sources.append((label, legal))
            panel.band(
                steps,
                0.95 * mean,
                mean,
                "near-uniform zone (>= 95% of ln #legal)" if r == 0 else None,
                color="#808080",
                opacity=0.15,
                group=group,
            )
    panel.references.append(Reference(0.0, "collapse zone (< 0.1 nats)", color="#d62728", y1=0.1, opacity=0.08))
    return ReportFigure(
        "entropy",
        "Entropy",
        "Exact entropy of the masked, tempered policy at the sampled positions against "
        "ln(#legal moves), the entropy of the uniform policy.",
        "Entropy of the sampling distribution",
        [panel],
        columns=1,
        width=9.0,
    )


def figure_signal(runs: Sequence[RunData]) -> ReportFigure | None:
    if not any_logged(runs, "rollout/frac_reward_zero_std"):
        return None
    panel = Panel("groups whose rewards are all equal (no signal)", "fraction of groups", ylim=(-0.02, 1.02))
    plot_metrics(panel, runs, ["rollout/frac_reward_zero_std"])
    panel.hline(0.5, "one half", color="black", dash="dash")
    panels = [panel]
    if any_logged(runs, "rollout/unique_moves"):
        unique = Panel("distinct sampled moves per group", "distinct moves per group (count)")
        plot_metrics(unique, runs, ["rollout/unique_moves"])
        panels.append(unique)
    return ReportFigure(
        "signal",
        "Signal",
        "A group whose sampled moves all get the same reward has zero advantage and teaches nothing.",
        "Signal: reward variance inside groups",
        panels,
    )


def figure_clip(runs: Sequence[RunData]) -> ReportFigure | None:
    keys = [k for k in ("ratio/clip_frac", "ratio/clip_frac_low", "ratio/clip_frac_high") if any_logged(runs, k)]
    if not keys:
        return None
    panel = Panel(
        "clipped fraction: low (A < 0, ratio < 1-eps), high (A > 0, ratio > 1+eps)",
        "fraction of tokens (moves)",
        ylim=(0, None),
    )
    plot_metrics(panel, runs, keys)
    return ReportFigure(
        "clip",
        "Clip fractions",
        "Share of sampled moves whose ratio was clipped, over all minibatches of a "
        "step. The first minibatch after a rollout must clip nothing.",
        "PPO clipping",
        [panel],
        columns=1,
        width=9.0,
    )


def figure_ratio(runs: Sequence[RunData]) -> ReportFigure | None:
    if not any_logged(runs, "ratio/mean", "ratio/first_max_abs_dev"):
        return None
    ratio = Panel("importance ratio over all minibatches", "ratio pi/pi_old (dimensionless)")
    for r, run in enumerate(runs):
        group = legend_group(run, len(runs))
        steps, low = finite_series(run, "ratio/min")
        _, high = finite_series(run, "ratio/max")
        style = line_style(r, 0, len(runs))
        if len(low) and len(low) == len(high):
            ratio.band(
                steps,
                low,
                high,
                series_label(run, "ratio min-max over moves", len(runs)),
                color=style["color"],
                group=group,
            )
            ratio.sources += [
                (series_label(run, "ratio/min", len(runs)), low),
                (series_label(run, "ratio/max", len(runs)), high),
            ]
        steps, mean = finite_series(run, "ratio/mean")
        if len(mean):
            label = series_label(run, "ratio/mean", len(runs))
            ratio.line(steps, mean, label, source=label, group=group, **style)
        eps_low = float(run.setting("grpo.epsilon", 0.2))
        eps_high = run.setting("grpo.epsilon_high") or eps_low
        if r == 0 and run.kind == "grpo":
            ratio.hline(1 - eps_low, f"clip bounds 1-{eps_low:g}, 1+{float(eps_high):g}", color="black", dash="dash")
            ratio.hline(1 + float(eps_high), None, color="black", dash="dash")
    deviation = Panel("first minibatch after each rollout (must be ~0)", "max |ratio - 1| (log scale)", ylog=True)
    floor = 1e-9
    for r, run in enumerate(runs):
        steps, dev = finite_series(run, "ratio/first_max_abs_dev")
        if len(dev):
            label = series_label(run, f"ratio/first_max_abs_dev (0 drawn at {floor:g})", len(runs))
            deviation.line(
                steps,
                np.maximum(dev, floor),
                label,
                marker="dot" if len(dev) < 60 else None,
                group=legend_group(run, len(runs)),
                **line_style(r, 0, len(runs)),
            )
            deviation.sources.append((series_label(run, "ratio/first_max_abs_dev", len(runs)), dev))
        bf16 = run.setting("bf16")
        tolerance = float(
            run.setting("grpo.ratio_tolerance_bf16", 2e-2) if bf16 else run.setting("grpo.ratio_tolerance", 1e-4)
        )
        if r == 0:
            deviation.hline(tolerance, f"tolerance {tolerance:g}", color="#d62728", dash="dash", width=0.9)
    panels = [p for p in (ratio, deviation) if p.traces]
    return ReportFigure(
        "ratio",
        "Ratio range",
        "The range and mean of the ratio used in the loss, and the largest "
        "|ratio - 1| on the first minibatch after each rollout, where the learner's weights still equal "
        "the sampler's: above the tolerance the log-probs of sampling and learning differ.",
        "Importance ratio",
        panels,
    )


def figure_throughput(runs: Sequence[RunData]) -> ReportFigure | None:
    phases = ["perf/sample_s", "perf/reward_s", "perf/learn_s"]
    rates = [k for k in ("perf/samples_per_s", "perf/engine_evals_per_s") if any_logged(runs, k)]
    if not any_logged(runs, *phases) and not rates:
        return None
    panels = []
    if any_logged(runs, *phases):
        panel = Panel("time per phase (stacked: sample, reward, learn)", "seconds per step (s)")
        plot_stacked(panel, runs, phases, [p.split("/")[1].removesuffix("_s") for p in phases])
        panels.append(panel)
    for key in rates:
        panel = Panel(
            key, "samples per second (1/s)" if key == "perf/samples_per_s" else "engine evaluations per second (1/s)"
        )
        plot_metrics(panel, runs, [key])
        panels.append(panel)
    if any_logged(runs, "perf/cache_hit_rate"):
        panel = Panel("evaluation cache hit rate", "fraction of lookups", ylim=(-0.02, 1.02))
        plot_metrics(panel, runs, ["perf/cache_hit_rate"])
        panels.append(panel)
    panels = [p for p in panels if p.traces]
    return ReportFigure(
        "throughput",
        "Throughput",
        "Time per training step split into sampling, engine rewards and learning; "
        "samples and engine evaluations per second; the evaluation cache's hit rate.",
        "Throughput and phase times",
        panels,
        columns=2 if len(panels) > 1 else 1,
    )


def figure_optimizer(runs: Sequence[RunData]) -> ReportFigure | None:
    if not any_logged(runs, "grad_norm", "lr"):
        return None
    grad = Panel("gradient norm", "gradient L2 norm before clipping")
    plot_metrics(grad, runs, ["grad_norm"], band=False)
    for r, run in enumerate(runs):
        clip = run.setting("max_grad_norm", run.setting("grpo.max_grad_norm", run.setting("grad_clip")))
        if clip and grad.traces:
            grad.hline(
                float(clip),
                f"{run.name + ' ' if len(runs) > 1 else ''}clip at {clip}",
                color=line_style(r, 0, len(runs))["color"],
                dash="dash",
                width=0.9,
            )
    values = [v for run in runs for v in finite_series(run, "grad_norm")[1] if v > 0]
    grad.ylog = bool(values) and max(values) / min(values) > 20
    lr = Panel("learning rate", "learning rate (per update)")
    plot_metrics(lr, runs, ["lr"], raw=True)
    panels = [p for p in (grad, lr) if p.traces]
    return ReportFigure(
        "optimizer",
        "Gradient norm and learning rate",
        "Gradient norm before clipping (mean over the step's "
        "minibatches) with the clipping threshold, and the learning rate schedule.",
        "Optimizer",
        panels,
    )
