"""The GRPO algorithm, policy-agnostic: it sees tensors only and knows nothing about chess.

A task builds a `RolloutBatch` (rows of sampled tokens with behaviour log-probs, rewards and group
ids); `optimize` turns it into optimizer steps with the clipped group-relative surrogate. The same
code serves a one-move group (L = 1), a trajectory of plies (L = T) and an LM completion (L tokens).
"""

from chessgrpo.rl.advantages import (
    SUPERVISIONS,
    critic_advantages,
    group_advantages,
    process_advantages,
    stepwise_advantages,
    zero_advantage_groups,
    zero_std_groups,
)
from chessgrpo.rl.batch import RolloutBatch
from chessgrpo.rl.config import GRPOConfig
from chessgrpo.rl.forward import eval_mode_forward
from chessgrpo.rl.invariants import (
    InvariantViolation,
    NonFiniteError,
    check_finite,
    check_first_minibatch,
    check_kl_nonnegative,
)
from chessgrpo.rl.kl_control import KLController
from chessgrpo.rl.learner import PolicyOutputs, compute_advantages, optimize
from chessgrpo.rl.loss import LossOutput, aggregate, categorical_entropy, exact_kl, kl_estimate, policy_loss

__all__ = [
    "SUPERVISIONS",
    "GRPOConfig",
    "InvariantViolation",
    "KLController",
    "LossOutput",
    "NonFiniteError",
    "PolicyOutputs",
    "RolloutBatch",
    "aggregate",
    "categorical_entropy",
    "check_finite",
    "check_first_minibatch",
    "check_kl_nonnegative",
    "compute_advantages",
    "critic_advantages",
    "eval_mode_forward",
    "exact_kl",
    "group_advantages",
    "kl_estimate",
    "optimize",
    "policy_loss",
    "process_advantages",
    "stepwise_advantages",
    "zero_advantage_groups",
    "zero_std_groups",
]
