"""The checks of what the policy does: a near-uniform or collapsed entropy, groups without reward signal, the chess
LM's answers collapsing onto a few moves, and an endgame policy that stops moving a piece type or gives wins away.
Each is ``(RunData, Thresholds) -> list[Finding]`` (`track.diagnose.CHECKS`)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from chessgrpo.track.diagnose.findings import Finding, Thresholds, finite_series, pct, rounded
from chessgrpo.track.run_data import RunData

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
                f"the policy is near uniform: entropy is {pct(float(np.median(ratio)))} of ln(#legal) (median over steps "
                f"{int(steps[half])}-{int(steps[-1])})",
                {
                    "median_entropy": rounded(float(np.median(entropy[half:]))),
                    "median_ln_legal": rounded(float(np.median(ln_legal[half:]))),
                    "median_ratio": rounded(float(np.median(ratio))),
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
        _, unique = finite_series(*run.series("rollout/unique_moves", rows))
        evidence = {
            "median_entropy_last_quarter": rounded(float(np.median(tail))),
            "threshold_nats": t.collapse_entropy,
            "first_step_below": int(steps[below][0]),
            "median_ln_legal": rounded(float(np.median(ln_legal))),
        }
        if len(unique):
            evidence["median_unique_moves_last_quarter"] = rounded(float(np.median(unique[quarter:])))
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
    _, zero = finite_series(*run.series("rollout/frac_reward_zero_std", run.train_rows))
    if not len(zero) or run.setting("task.supervision") == "critic":
        return []
    if run.setting("task.dynamic_sampling"):
        return _dynamic_sampling_signal(run, t, float(np.median(zero)))
    median = float(np.median(zero))
    if median <= t.zero_std_fraction:
        return []
    severity = "critical" if median >= t.zero_std_critical else "warning"
    evidence = {
        "median_frac_reward_zero_std": rounded(median),
        "fraction_of_steps_over_half": rounded(float((zero > 0.5).mean())),
        "steps_logged": len(zero),
        "grpo.drop_zero_std_groups": run.setting("grpo.drop_zero_std_groups"),
        "task.group_size": run.setting("task.group_size"),
        "task.reward_nodes": run.setting("task.reward_nodes"),
    }
    _, unique = finite_series(*run.series("rollout/unique_moves", run.train_rows))
    if len(unique):
        evidence["median_unique_moves"] = rounded(float(np.median(unique)))
    return [
        Finding(
            "signal.zero_reward_variance",
            severity,
            f"no signal: in the median step {pct(median)} of the groups have identical rewards for every sampled move, so their "
            f"advantages are 0 and they teach nothing",
            evidence,
            "Start from positions where moves differ in value (start_win_prob_range for datasets; decided positions score every "
            "move the same), raise task.group_size or task.temperature, raise task.reward_nodes if values are too coarse, or set "
            "grpo.drop_zero_std_groups=true (DAPO dynamic sampling) so these groups stop diluting the batch.",
        )
    ]


def _dynamic_sampling_signal(run: RunData, t: Thresholds, drawn_flat: float) -> list[Finding]:
    """Under ``task.dynamic_sampling`` the flat groups are dropped and more drawn, so what the learner misses is the
    share of the step's groups it could not fill with groups that have spread (``rollout/groups_kept``)."""
    _, kept = finite_series(*run.series("rollout/groups_kept", run.train_rows))
    wanted = run.setting("task.prompts_per_step")
    if not len(kept) or not wanted:
        return []
    missing = 1.0 - float(np.median(kept)) / float(wanted)
    if missing <= t.zero_std_fraction:
        return []
    evidence = {
        "median_groups_kept": rounded(float(np.median(kept))),
        "task.prompts_per_step": wanted,
        "median_frac_reward_zero_std_drawn": rounded(drawn_flat),
        "task.max_resample_rounds": run.setting("task.max_resample_rounds"),
    }
    return [
        Finding(
            "signal.zero_reward_variance",
            "critical" if missing >= t.zero_std_critical else "warning",
            f"little signal: dynamic sampling filled only {pct(1.0 - missing)} of the step's {wanted} groups with groups "
            f"whose rewards differ (in the median step {pct(drawn_flat)} of the groups drawn had none)",
            evidence,
            "The policy answers most prompts all right or all wrong: raise task.max_resample_rounds, task.group_size or "
            "task.temperature, or draw harder (or easier) prompts.",
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
    steps, distinct = finite_series(*run.series("eval/p_distinct_best"))
    if len(distinct) < 2 or distinct[0] <= 0:
        return []
    _, share = finite_series(*run.series("eval/p_top_best_share"))
    ratio = float(distinct[-1] / distinct[0])
    rise = float(share[-1] - share[0]) if len(share) >= 2 else 0.0
    evidence: dict[str, Any] = {
        "steps": [int(steps[0]), int(steps[-1])],
        "distinct_best": [int(distinct[0]), int(distinct[-1])],
        "distinct_ratio": rounded(ratio),
        "threshold_ratio": t.lm_distinct_ratio,
    }
    if len(share) >= 2:
        evidence.update(
            {
                "top_share": [rounded(float(share[0])), rounded(float(share[-1]))],
                "threshold_share_rise": t.lm_share_rise,
            }
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
        evidence["favourite"] = {"move": favourite[0], "share": rounded(favourite[1])}
    numbers = f"distinct greedy B: moves {int(distinct[0])} -> {int(distinct[-1])} (x{ratio:.2f}{interval_text})"
    if len(share) >= 2:
        numbers += f", most common move's share {pct(float(share[0]))} -> {pct(float(share[-1]))}"
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


def _repetition_advice(run: RunData, reasons: dict[str, float]) -> str:
    """What to do about repetition draws: a policy that cannot see the game's history repeats any cycle it enters."""
    sees_history = any(run.setting(f"model.{name}", False) for name in ("repetition", "threefold", "allows_threefold"))
    if reasons.get("threefold_repetition", 0.0) > 0 and not sees_history:
        return (
            "Repetition: the policy cannot see the game's history, so a cycle it enters once it enters again; give it "
            "the repetition facts (model.move_facts, model.repetition, model.threefold and model.allows_threefold: true), and reward DTZ progress "
            "(task.shaping > 0). "
        )
    return (
        "Repetition: the policy shuffles without progress (reward DTZ progress: task.shaping > 0, a longer horizon). "
    )


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
        text = ", ".join(f"{p} {pct(first_shares.get(p, 0.0))} -> {pct(shares.get(p, 0.0))}" for p in vanished)
        findings.append(
            Finding(
                "endgame.piece_vanished",
                "warning",
                f"the policy stopped moving a piece type on the held-out starts: {text} of its moves "
                f"(king {pct(shares.get('K', 0.0))}), {span}",
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
            f"{_DRAW_REASONS.get(r, r)} {pct(v) if v >= 0.01 else '<1%'}"
            for r, v in sorted(reasons.items(), key=lambda kv: -kv[1])
            if v > 0
        )
        findings.append(
            Finding(
                "endgame.win_given_away",
                "warning",
                f"the policy gave away the win in {pct(lost)} of the held-out games ({named or 'mated'}), {span}",
                {
                    "step": int(last["step"]),
                    "win_lost_rate": rounded(lost),
                    "reasons": reasons,
                    "threshold": t.endgame_win_lost,
                },
                _repetition_advice(run, reasons)
                + "Stalemate or a lost piece: a blunder the exact reward punishes only if such moves are sampled and "
                "compared at the same position (task.regret: true, larger groups) (docs/diagnose.md, endgame.win_given_away).",
            )
        )
    return findings
