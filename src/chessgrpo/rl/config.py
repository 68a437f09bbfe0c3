"""`GRPOConfig`: every knob of the GRPO algorithm, with its default and the paper it comes from.

The fields become YAML keys under ``grpo:``. Each variant is named after its paper (TRL's
``grpo_config.py`` convention), so a config reads as a list of citations:

- advantages: ``grpo`` (DeepSeekMath, Shao et al. 2024), ``dr_grpo`` (Liu et al. 2025),
  ``rloo`` (Ahmadian et al. 2024), ``batch_std`` (REINFORCE++, Hu 2025; "Lite PPO", Liu et al. 2025);
- loss aggregation: ``token_mean`` (DAPO, Yu et al. 2025), ``seq_mean_token_mean`` (GRPO),
  ``seq_mean_token_sum_norm`` (Dr. GRPO);
- importance ratio: ``token`` (PPO, Schulman et al. 2017) or ``sequence`` (GSPO, Zheng et al. 2025);
- KL: the exact KL(policy || reference) over every action, or the sampled estimators k1/k2/k3 (Schulman 2020), each
  with the gradient it gives stated below; schedules fixed/warmup/adaptive (Ziegler et al. 2019).

`__post_init__` rejects every unknown variant and out-of-range number with a ValueError naming the
field, so a typo can never fall back to a default silently.
"""

from __future__ import annotations

import dataclasses
import math

ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "batch_std")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("exact", "k1", "k2", "k3")
KL_SCHEDULES = ("fixed", "warmup", "adaptive")


@dataclasses.dataclass
class GRPOConfig:
    """Hyperparameters of the GRPO learner (`chessgrpo.rl.optimize`); policy-agnostic."""

    # ---------------------------------------------------------------- advantages
    advantage_estimator: str = "grpo"
    """Default "grpo". How a group's rewards become advantages: "grpo" = (r - mean_g) / (std_g + eps)
    (DeepSeekMath, Shao et al. 2024); "dr_grpo" = r - mean_g, no std scaling (Dr. GRPO, Liu et al.
    2025); "rloo" = r - mean of the other group members (Ahmadian et al. 2024); "batch_std" =
    (r - mean_g) / (std over the whole batch + eps) (REINFORCE++, Hu 2025; Lite PPO, Liu et al. 2025).
    Step rewards [N, L] (a batch's ``process`` or ``step`` supervision, `rl.advantages`) take "grpo" or
    "dr_grpo"; ``critic`` supervision ignores it."""
    advantage_epsilon: float = 1e-4
    """Default 1e-4. Added to the std in the "grpo" and "batch_std" denominators (DeepSeekMath/TRL), and
    in the batch-std denominator of ``critic`` supervision."""
    drop_zero_std_groups: bool = False
    """Default False. Drop groups without signal from the loss: DAPO dynamic sampling (Yu et al. 2025). For the
    group-relative supervisions these are the groups whose rewards are all equal (zero advantage); under ``critic``
    supervision, whose advantages are not centred on the group, only the groups whose advantages are all zero
    (`rl.advantages.zero_advantage_groups`). `rollout/frac_reward_zero_std` is logged either way."""

    # ---------------------------------------------------------------- clipped surrogate
    epsilon: float = 0.2
    """Default 0.2. Lower clip range: the ratio is clipped at 1 - epsilon (PPO, Schulman et al. 2017)."""
    epsilon_high: float | None = None
    """Default None (= epsilon). Upper clip range 1 + epsilon_high; DAPO "clip-higher" uses 0.28 (Yu et al. 2025)."""
    loss_aggregation: str = "token_mean"
    """Default "token_mean". "token_mean": sum over all valid tokens of the batch / their count (DAPO,
    Yu et al. 2025); "seq_mean_token_mean": mean over tokens within a sequence, then over sequences
    (original GRPO, Shao et al. 2024); "seq_mean_token_sum_norm": token sum per sequence / a constant
    max length, then mean over sequences (Dr. GRPO, Liu et al. 2025)."""
    aggregation_max_length: int | None = None
    """Default None (= the batch's L). The constant divisor of "seq_mean_token_sum_norm" (Dr. GRPO)."""
    importance_sampling_level: str = "token"
    """Default "token". "token": one ratio per token (PPO/GRPO); "sequence": exp(mean over the valid
    tokens of logp - old_logp), applied to every token of the sequence (GSPO, Zheng et al. 2025)."""

    # ---------------------------------------------------------------- KL to the reference policy
    kl_coef: float = 0.0
    """Default 0.0. beta, the KL penalty weight (DeepSeekMath uses 0.04; Dr. GRPO and DAPO use 0).
    0 lets callers skip the reference forward (no KL is then measured either)."""
    kl_estimator: str = "exact"
    """Default "exact". What the KL term of the loss is; every option is a penalty on KL(policy || reference), the
    direction the RLHF objective names (docs/architecture.md, "The KL term"). With x = ref_logp - logp at a sampled
    token, and the gradient each gives as a loss in expectation:

    - "exact": sum_a p(a) (log p(a) - log ref(a)) over the whole next-action distribution at each step (all legal
      moves; the LM's vocabulary), from the task's forward (`PolicyOutputs.kl`). Gradient: exactly grad KL(p || ref)
      at every visited step, no sampling noise over actions, nothing to correct when samples are off-policy.
    - "k2" = x^2 / 2 on the sampled token, importance-weighted by the detached ratio p/behaviour. Gradient in
      expectation: grad KL(p || ref) (its value is biased, its gradient is not).
    - "k3" = exp(x) - x - 1 on the sampled token, importance-weighted likewise (DeepSeekMath's estimator). Its value
      is unbiased for KL(p || ref), but its gradient in expectation is grad KL(ref || p): the forward direction,
      which pulls p to cover every move the reference plays.
    - "k1" = -x: unbiased value, but zero gradient in expectation (E_p[grad log p] = 0): it regularises nothing,
      so it is refused as a loss (kl_coef > 0 or an adaptive schedule); with kl_coef 0 it only measures.
    """
    kl_schedule: str = "fixed"
    """Default "fixed". "fixed": kl_coef throughout; "warmup": linear from 0 to kl_coef over
    kl_warmup_steps; "adaptive": proportional controller toward kl_target (Ziegler et al. 2019)."""
    kl_warmup_steps: int = 0
    """Default 0. Training steps (learner calls) of the linear KL warmup; >= 1 when kl_schedule="warmup"."""
    kl_target: float = 0.01
    """Default 0.01. Target of the adaptive controller, in the units of kl/value (mean per-token KL);
    Ziegler et al. 2019 targeted 6 nats per whole sequence."""
    kl_horizon: int = 10000
    """Default 10000. Adaptive controller horizon, in samples (Ziegler et al. 2019): the learner passes
    the number of rollout rows per step, so the coefficient's time constant is horizon / rows steps."""
    kl_coef_min: float = 0.0
    """Default 0.0. Lower bound of the adaptive coefficient (time spent here is logged as kl/frac_at_min)."""
    kl_coef_max: float = 1.0
    """Default 1.0. Upper bound of the adaptive coefficient (time spent here is logged as kl/frac_at_max)."""

    # ---------------------------------------------------------------- entropy
    entropy_coef: float = 0.0
    """Default 0.0. Weight of the exact-entropy bonus (PPO, Schulman et al. 2017). Off by default:
    the predecessor system's bonus was 95% of its loss."""

    # ---------------------------------------------------------------- optimisation
    num_iterations: int = 1
    """Default 1. Optimisation epochs over each rollout batch, "mu" in DeepSeekMath (Shao et al. 2024).
    1 is exactly on-policy; > 1 is where the clipped ratio starts to matter."""
    minibatch_size: int = 0
    """Default 0 (= the whole batch). Rows (sequences) per optimizer step; rows are never split."""
    micro_batch_size: int = dataclasses.field(default=0, metadata={"resumable": True})  # memory, not math
    """Default 0 (= no split). Rows per forward/backward within a minibatch (gradient accumulation):
    the minibatch's rows run in micro-batches of at most this many rows, each loss weighted by its
    share of the minibatch (valid tokens for token_mean, rows for the sequence means), then one
    optimizer step. The gradient equals the whole minibatch's up to float summation order; peak
    memory is set by the micro-batch. In a data-parallel run it counts each process's rows."""

    # ---------------------------------------------------------------- runtime invariants
    ratio_tolerance: float = 1e-4
    """Default 1e-4. Largest |ratio - 1| allowed on the first minibatch in fp32, where the learner's
    weights equal the sampler's and the recomputed log-probs must match (docs/architecture.md, invariant 1)."""
    ratio_tolerance_bf16: float = 2e-2
    """Default 2e-2. The same bound under bf16: bf16 keeps 8 mantissa bits (relative precision
    2^-8 ~ 4e-3 per operation), so log-probs recomputed in a differently batched forward differ by ~1e-2."""
    check_invariants: bool = True
    """Default True. Raise `InvariantViolation` when the first minibatch's ratio is off or clipped, or
    when a non-negative KL estimator goes negative. (Non-finite losses and gradients always raise.)"""

    # ---------------------------------------------------------------- pipelining
    pipeline: bool = False
    """Default False. Pipelined steps (`train.pipeline`): the next step's rollout (sampling and engine searches)
    runs in a background thread on a snapshot of the weights while the learner updates on the current one,
    so every step learns from a batch sampled one update earlier (off-policy by one step: the behaviour
    log-probs are the snapshot's, the clipped ratio corrects for the lag, the first-minibatch ratio check
    runs on the snapshot and ``ratio/lag_first_max_abs_dev`` logs the live weights' deviation); a trajectory
    rollout then also hands each position to the engine pool as it is reached (``task.overlap_rewards``' path,
    the same rewards). move_group and trajectory kinds, one process; a mixture, rookworld and data-parallel runs refuse it. false = the
    serial step, bitwise as before (docs/scaling.md, "Pipelined steps")."""

    # ---------------------------------------------------------------- diagnostics
    term_gradient_every: int = dataclasses.field(default=10, metadata={"resumable": True})  # a measurement, not math
    """Default 10 (0 = never). Every this many steps (and at the first), measure the gradient norm of
    each loss term (policy, weighted KL, entropy bonus, auxiliary: value head / bc anchor) separately
    on the step's first micro-batch, over the parameters the policy term moves; logged as
    ``grad_norm/{policy,kl,entropy,aux}``. A term's loss value says little (the policy term's value is
    ~0 by construction with normalised advantages); its pull on the weights is what `diagnose` reads
    to say which term drives the update. Costs up to four extra backward passes of one micro-batch on
    those steps; does not change the update. Single-process runs only (skipped under data parallelism)."""

    @property
    def uses_kl(self) -> bool:
        """Whether the loss has a KL term (kl_coef > 0, or the adaptive controller, which starts at kl_coef)."""
        return self.kl_coef > 0 or self.kl_schedule == "adaptive"

    @property
    def exact_kl_term(self) -> bool:
        """Whether the learner's forward must compute the exact per-step KL (`PolicyOutputs.kl`): a KL term, exact."""
        return self.uses_kl and self.kl_estimator == "exact"

    def __post_init__(self) -> None:
        if self.term_gradient_every < 0:
            raise ValueError(f"term_gradient_every must be >= 0 (0 = never), got {self.term_gradient_every}")
        _choice("advantage_estimator", self.advantage_estimator, ADVANTAGE_ESTIMATORS)
        _choice("loss_aggregation", self.loss_aggregation, LOSS_AGGREGATIONS)
        _choice("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        _choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("kl_schedule", self.kl_schedule, KL_SCHEDULES)
        _at_least("advantage_epsilon", self.advantage_epsilon, 0.0)
        if not (math.isfinite(self.epsilon) and 0.0 < self.epsilon < 1.0):
            raise ValueError(f"epsilon must be in (0, 1) (the ratio is clipped at 1 - epsilon), got {self.epsilon!r}")
        if self.epsilon_high is not None and not (math.isfinite(self.epsilon_high) and self.epsilon_high > 0.0):
            raise ValueError(f"epsilon_high must be None or a number > 0, got {self.epsilon_high!r}")
        if self.aggregation_max_length is not None and self.aggregation_max_length < 1:
            raise ValueError(f"aggregation_max_length must be None or >= 1, got {self.aggregation_max_length!r}")
        _at_least("kl_coef", self.kl_coef, 0.0)
        _at_least("kl_warmup_steps", self.kl_warmup_steps, 0)
        if not (math.isfinite(self.kl_target) and self.kl_target > 0.0):
            raise ValueError(f"kl_target must be > 0, got {self.kl_target!r}")
        _at_least("kl_horizon", self.kl_horizon, 1)
        _at_least("kl_coef_min", self.kl_coef_min, 0.0)
        _at_least("kl_coef_max", self.kl_coef_max, self.kl_coef_min)
        if self.kl_estimator == "k1" and (self.kl_coef > 0.0 or self.kl_schedule == "adaptive"):
            raise ValueError(
                "kl_estimator='k1' as a loss has zero gradient in expectation (E_p[grad log p] = 0) and regularises "
                "nothing; use 'exact' (the default), 'k2' or 'k3' (docs/architecture.md, 'The KL term'), or kl_coef=0"
            )
        if self.kl_schedule == "warmup" and self.kl_warmup_steps < 1:
            raise ValueError("kl_schedule='warmup' needs kl_warmup_steps >= 1 (allowed: any integer >= 1)")
        if self.kl_schedule == "adaptive":
            if self.kl_coef <= 0.0:
                raise ValueError("kl_schedule='adaptive' multiplies kl_coef, so kl_coef must be > 0")
            if not self.kl_coef_min <= self.kl_coef <= self.kl_coef_max:
                raise ValueError(
                    f"kl_schedule='adaptive' starts at kl_coef={self.kl_coef}, which must lie in "
                    f"[kl_coef_min, kl_coef_max] = [{self.kl_coef_min}, {self.kl_coef_max}]"
                )
        _at_least("entropy_coef", self.entropy_coef, 0.0)
        _at_least("num_iterations", self.num_iterations, 1)
        _at_least("minibatch_size", self.minibatch_size, 0)
        _at_least("micro_batch_size", self.micro_batch_size, 0)
        if not (math.isfinite(self.ratio_tolerance) and self.ratio_tolerance > 0.0):
            raise ValueError(f"ratio_tolerance must be > 0, got {self.ratio_tolerance!r}")
        if not (math.isfinite(self.ratio_tolerance_bf16) and self.ratio_tolerance_bf16 > 0.0):
            raise ValueError(f"ratio_tolerance_bf16 must be > 0, got {self.ratio_tolerance_bf16!r}")

    @property
    def clip_range(self) -> tuple[float, float]:
        """(epsilon_low, epsilon_high): the ratio is clipped to [1 - low, 1 + high]."""
        return self.epsilon, self.epsilon if self.epsilon_high is None else self.epsilon_high

    def ratio_tolerance_for(self, bf16: bool) -> float:
        """The first-minibatch |ratio - 1| tolerance for this precision."""
        return self.ratio_tolerance_bf16 if bf16 else self.ratio_tolerance


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _at_least(name: str, value: float, low: float) -> None:
    if not (math.isfinite(value) and value >= low):
        raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
