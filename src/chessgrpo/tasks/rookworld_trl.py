"""The RookWorld rewards as TRL reward functions, over an engine pool that one object owns.

`RookWorldTRLRewards` exposes TRL's reward-function signature
``(prompts, completions, **kwargs) -> list[float]`` three times: `policy_reward` (P: prompts),
`environment_reward` (A: prompts, python-chess only: it never starts an engine) and
`rookworld_reward` (any mix, each prompt scored by its own task). The numbers are
`data.rookworld_grading.score_completions`' totals, the ones GRPO and the evaluation use::

    with RookWorldTRLRewards() as rewards:        # or RookWorldTRLRewards(pool=pool): the caller's pool
        trainer = GRPOTrainer(..., reward_funcs=[rewards.rookworld_reward])

Without a `pool` the object starts one on first use of a P: prompt (from `engine`, default
`EngineConfig()`: one process per core, the SQLite cache under runs/cache) and closes it in
`close` / on leaving the ``with`` block; a given pool stays the caller's. There is no state
outside the object.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chessgrpo.data.rookworld_format import task_of
from chessgrpo.data.rookworld_grading import RookWorldRewardConfig, score_completions

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.config import EngineConfig
    from chessgrpo.engine import EnginePool


def _text(item: Any) -> str:
    """A prompt/completion as text: a string, or TRL's conversational list of messages (last content)."""
    if isinstance(item, str):
        return item
    if isinstance(item, (list, tuple)) and item and isinstance(item[-1], dict) and "content" in item[-1]:
        return str(item[-1]["content"])
    raise ValueError(f"expected a string or a list of chat messages, got {type(item).__name__}")


class RookWorldTRLRewards:
    """TRL reward functions for the RookWorld tasks, sharing one engine pool (see the module docstring)."""

    def __init__(
        self,
        config: RookWorldRewardConfig | None = None,
        *,
        pool: EnginePool | None = None,
        engine: EngineConfig | None = None,
    ):
        if pool is not None and engine is not None:
            raise ValueError("pass a pool or the engine config to start one, not both")
        self.config = config or RookWorldRewardConfig()
        self._pool = pool
        self._engine = engine
        self._owned: EnginePool | None = None
        self._lock = threading.Lock()  # TRL may call the functions from several threads

    @property
    def pool(self) -> EnginePool:
        """The pool given, else the one this object started (on first use) and closes."""
        with self._lock:
            if self._pool is None:
                from chessgrpo.config import EngineConfig
                from chessgrpo.engine import EnginePool

                self._pool = self._owned = EnginePool.from_config(self._engine or EngineConfig())
            return self._pool

    def close(self) -> None:
        """Close the pool this object started, if any (a given pool is left open); a later P: prompt starts a new one."""
        with self._lock:
            if self._owned is not None:
                self._owned.close()
                self._pool = self._owned = None

    def __enter__(self) -> RookWorldTRLRewards:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def policy_reward(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Rewards of P: completions; prompts are ``"P: " + FEN``, completions the generated rest of the line.

        Extra keyword arguments (TRL passes dataset columns) are ignored; an A: prompt raises `ValueError`.
        """
        return self._rewards(prompts, completions, "policy")

    def environment_reward(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Rewards of A: completions (python-chess only, no engine); a P: prompt raises `ValueError`."""
        return self._rewards(prompts, completions, "environment")

    def rookworld_reward(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Rewards of a mix of P: and A: completions, each scored by its own task."""
        return self._rewards(prompts, completions, None)

    def _rewards(self, prompts: Sequence[Any], completions: Sequence[Any], expected: str | None) -> list[float]:
        prompt_texts = [_text(p) for p in prompts]
        if expected is not None:
            for prompt in prompt_texts:
                if task_of(prompt) != expected:
                    raise ValueError(
                        f"{expected} reward got a prompt of the other task: {prompt[:40]!r}; use rookworld_reward for a mix"
                    )
        pool = self.pool if any(task_of(p) == "policy" for p in prompt_texts) else None
        rewards = score_completions(pool, prompt_texts, [_text(c) for c in completions], self.config)
        return [r.total for r in rewards]
