"""The chess LM's rewards: one registered record each (`tasks.reward_registry`), combined with weights per completion.

An LM reward maps ``(pool, prompts, completions, config)`` (the engine pool or None, the rows' prompts and their
completions, the run's `data.rookworld_grading.RookWorldRewardConfig`) to one `Reward` per row, or None for a row it
does not grade (a prompt of another text task). A completion's training reward is the weighted sum of the rewards
that grade it (`task.rewards`; default ``{policy: 1, environment: 1}``: each prompt graded by its own task, as before).

- ``policy``: the P: grader (`data.rookworld_grading.score_policy_completions`); needs the pool for an engine truth
  when the step has P: prompts;
- ``environment``: the A: grader (python-chess only);
- ``dtz_optimal`` (issue 66): the binary P: reward, 1.0 when the answer's B: move is DTZ-optimal by the Syzygy tables
  (`data.rookworld_grading.is_dtz_optimal`, the definition `eval lm`'s best-move accuracy counts under a tablebase
  truth), 0.0 for anything else: a slower win, a draw, an illegal move, an ill-formed answer. Needs the tables
  (``rewards.policy.syzygy_path``), whatever ``rewards.policy.truth`` says.

A user's function, ``module:function``, takes TRL's reward-function signature ``(prompts, completions, **kwargs) ->
list[float]`` and grades every row (it gets the step's prompts and completions as keywords, as TRL passes them).
Adding a reward is one function and one `ROOKWORLD_REWARDS.register` line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chessgrpo.data.rookworld_format import task_of
from chessgrpo.data.rookworld_grading import TASK_GRADERS, Reward, RookWorldRewardConfig, dtz_optimal_rewards
from chessgrpo.tasks.reward_registry import RegisteredReward, RewardRegistry

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool

LMReward = Callable[["EnginePool | None", Sequence[str], Sequence[str], RookWorldRewardConfig], "list[Reward | None]"]
"""An LM reward's signature: (pool, prompts, completions, reward config) -> one `Reward` per row, None where it does not grade."""


def text_task_reward(task: str) -> LMReward:
    """The reward grading the prompts of text task `task` (``policy``: P:, ``environment``: A:) with its
    `data.rookworld_grading.TASK_GRADERS` entry; None for the other rows."""
    grade = TASK_GRADERS[task]

    def reward(
        pool: EnginePool | None, prompts: Sequence[str], completions: Sequence[str], config: RookWorldRewardConfig
    ) -> list[Reward | None]:
        rows = [i for i, prompt in enumerate(prompts) if task_of(prompt) == task]
        out: list[Reward | None] = [None] * len(prompts)
        if rows:
            for row, graded in zip(
                rows, grade(pool, [prompts[i] for i in rows], [completions[i] for i in rows], config)
            ):
                out[row] = graded
        return out

    reward.__doc__ = f"The {task} task's grader on its own prompts (None for the other rows)."
    return reward


def dtz_optimal_reward(
    pool: EnginePool | None, prompts: Sequence[str], completions: Sequence[str], config: RookWorldRewardConfig
) -> list[Reward | None]:
    """1.0 for a P: answer whose B: move is DTZ-optimal by the tables, else 0.0 (ill-formed included); None for the
    rows of other tasks."""
    rows = [i for i, prompt in enumerate(prompts) if task_of(prompt) == "policy"]
    out: list[Reward | None] = [None] * len(prompts)
    if rows:
        graded = dtz_optimal_rewards([prompts[i] for i in rows], [completions[i] for i in rows], config.policy)
        for row, reward in zip(rows, graded):
            out[row] = reward
    return out


def policy_needs(config: Any) -> frozenset[str]:
    """The P: reward needs the engine pool when its truth is the engine's and the step draws P: prompts (a tablebase
    truth probes the tables itself: `data.rookworld_grading.shared_tablebase`)."""
    if config is None:  # no run: what it may need
        return frozenset({"pool"})
    engine_truth = config.rewards.policy.truth == "engine"
    return frozenset({"pool"}) if engine_truth and config.task.split()[0] > 0 else frozenset()


def user_lm_reward(spec: str, key: str = "task.rewards") -> RegisteredReward[LMReward]:
    """The user's TRL-style function ``module:function`` (``(prompts, completions, **kwargs) -> list[float]``) as an
    LM reward named `spec` that grades every row. A `ValueError` naming `key` and `spec` when it does not import,
    cannot take those keywords, or (when called) returns other than one finite number per completion."""
    from chessgrpo.tasks.user_rewards import check_signature, import_function

    function = import_function(spec, key)
    check_signature(function, spec, key, "(prompts, completions, **kwargs) as keywords", prompts=[], completions=[])

    def reward(
        pool: EnginePool | None, prompts: Sequence[str], completions: Sequence[str], config: RookWorldRewardConfig
    ) -> list[Reward | None]:
        values = function(prompts=list(prompts), completions=list(completions))
        if not isinstance(values, (list, tuple)) or len(values) != len(completions):
            raise ValueError(
                f"{key} {spec!r} returned {type(values).__name__} for {len(completions)} completions: expected a list of as many floats"
            )
        out: list[Reward | None] = []
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key} {spec!r} returned {value!r}: expected a finite number per completion")
            out.append(Reward(float(value), {}))
        return out

    return RegisteredReward(spec, reward, frozenset(), user=True)


ROOKWORLD_REWARDS: RewardRegistry[LMReward] = RewardRegistry(
    "chess-LM",
    "(pool, prompts, completions, config: RookWorldRewardConfig) -> list[Reward | None] (None: a row it does not grade)",
    needs={
        "pool": "the Stockfish pool (engine.*), passed as the first argument",
        "tablebase": "the Syzygy tables (rewards.policy.syzygy_path), opened by the reward itself",
    },
    user=user_lm_reward,
)
"""`task.rewards` of a ``kind: rookworld`` run -> an LM reward."""
ROOKWORLD_REWARDS.register("policy", text_task_reward("policy"), needs=policy_needs)
ROOKWORLD_REWARDS.register("environment", text_task_reward("environment"))
ROOKWORLD_REWARDS.register("dtz_optimal", dtz_optimal_reward, needs={"tablebase"})
