"""The shared base of the action policy's GRPO kinds (move_group, trajectory, and the mixture of them).

`PolicyGRPOKind` owns what those kinds have in common: the frozen reference and its trainable copy,
the engine pool (or the mixture's, through `SharedParts`), checkpoints, head and frozen parameters,
and running the registry's evaluations on the policy at a held-out step (`held_out_evaluation`: the
offline evaluation of `chessgrpo eval offline`, and those a run adds with ``eval.extra``);
`policy_eval_line` turns their metrics into the log line.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from chessgrpo.config import EngineConfig
from chessgrpo.eval.registry import extra_evaluations, run_at_step
from chessgrpo.eval.running import EvalContext, Subject
from chessgrpo.models.add_facts import missing_facts, requested_facts, with_move_facts
from chessgrpo.models.placement import place_reference
from chessgrpo.models.policy import (
    ActionPolicy,
    ModelConfig,
    frozen_parameters,
    load_policy,
    save_policy,
    value_head_parameters,
)
from chessgrpo.rl import GRPOConfig
from chessgrpo.train.kind import GRPOKind, RunContext, SharedParts, interval_text

logger = logging.getLogger(__name__)


class PolicyGRPOKind(GRPOKind):
    """GRPO of an `ActionPolicy` (move_group, trajectory): the frozen reference, its trainable copy,
    checkpoints, head and frozen parameters, and the held-out offline evaluation of `chessgrpo eval offline`.

    Built with `shared` (a task of `kind: mixture`), it uses the mixture's policy, reference and engine
    pool instead of its own."""

    family: ClassVar[str] = "action_policy"
    reference: ActionPolicy
    _eval_items: dict[str, Any] | None = None

    def __init__(self, config: Any, context: RunContext, shared: SharedParts | None = None):
        super().__init__(config, context, shared)

    def make_pool(self, engine_config: EngineConfig) -> Any:
        """The mixture's pool when shared, else a new `EnginePool` (which `close` stops)."""
        from chessgrpo.engine import EnginePool

        if self.shared is not None:
            if self.shared.pool is None:
                raise ValueError("a task of this mixture needs Stockfish, but the mixture started no engine pool")
            return self.shared.pool
        return EnginePool.from_config(engine_config)

    def close_pool(self, pool: Any) -> None:
        """Stop `pool` unless the mixture owns it."""
        if pool is not None and self.shared is None:
            pool.close()

    @classmethod
    def shared_parts(cls, configs: Sequence[Any], context: RunContext) -> SharedParts:
        """What a mixture of these tasks shares: one policy pair built from the first task's config
        (init_checkpoint, model and reference_device are the mixture's, the same in every task), and one
        Stockfish pool when any task needs one (its config's `needs_pool`: every action-policy task config has one)."""
        from chessgrpo.engine import EnginePool

        first = configs[0]
        model, reference = _policy_pair(first.init_checkpoint, first.model, context.device, first.reference_device)
        needs_pool = any(config.needs_pool for config in configs)
        return SharedParts(
            model=model, reference=reference, pool=EnginePool.from_config(first.engine) if needs_pool else None
        )

    def build_policy(self, init_checkpoint: str | None, model_config: ModelConfig, grpo_config: GRPOConfig) -> None:
        """The reference (the starting checkpoint, or a fresh `model_config`), frozen; `model`, a trainable copy."""
        if self.shared is not None:
            self.model, self.reference = self.shared.model, self.shared.reference
        else:
            self.model, self.reference = _policy_pair(
                init_checkpoint, model_config, self.context.device, self.config.reference_device
            )
        self.init_grpo_state(grpo_config)

    def head_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.head.parameters())

    @property
    def trains_value_head(self) -> bool:
        """Whether a value loss trains the value head (move_group's value_loss_weight > 0)."""
        return getattr(self.config, "value_loss_weight", 0.0) > 0

    def frozen_parameters(self, freeze_layers: int) -> list[torch.nn.Parameter]:
        # Without a value loss the value head is kept as pretraining left it (the shared trunk still moves).
        return frozen_parameters(self.model, freeze_layers) + (
            [] if self.trains_value_head else value_head_parameters(self.model)
        )

    def save_model(self, directory: Path) -> None:
        save_policy(self.model, directory)

    def load_model(self, checkpoint: Path) -> None:
        self.model.load_state_dict(load_policy(checkpoint, device=self.context.device).state_dict())

    @property
    def eval_items(self) -> dict[str, Any]:
        """The held-out items the registry's evaluations loaded, by evaluation name (positions labelled once,
        puzzles read once): the same ones at every evaluation, so steps pair item by item."""
        if self._eval_items is None:
            self._eval_items = {}
        return self._eval_items

    def held_out_evaluation(
        self, name: str, config: Any, step: int, out_dir: Path, pool: Any = None, tablebase: Any = None
    ) -> dict[str, float]:
        """Evaluation `name` of the registry (`eval.registry.run_at_step`) on the current policy at argmax, named
        "RUN_DIR step N", with `pool` and `tablebase` lent; writes out_dir/step_NNNNNN_<name>.json, returns its metrics."""
        subject = Subject(model=self.model, name=f"{self.context.run_dir} step {step}")
        context = EvalContext(pool=pool, tablebase=tablebase, items=self.eval_items)
        return run_at_step(name, config, subject, context, eval_dir=out_dir, step=step)

    def extra_evaluations(self, extra: Any, step: int, out_dir: Path, pool: Any = None) -> dict[str, float]:
        """The evaluations the run's ``eval.extra`` adds (`eval.registry.extra_evaluations`), each through the registry."""
        metrics: dict[str, float] = {}
        for name, config in extra_evaluations(extra).items():
            metrics.update(self.held_out_evaluation(name, config, step, out_dir, pool=pool))
        return metrics

    def offline_evaluation(
        self, step: int, out_dir: Path, pool: Any, source: str, max_positions: int, nodes: int, resamples: int
    ) -> dict[str, float]:
        """Held-out ESL, top-1 and blunder rate of the argmax policy (intervals) on the same seeded sample of
        `source` every time: the registry's ``offline`` (`chessgrpo eval offline` without baselines); writes
        out_dir/step_NNNNNN_offline.json (what `chessgrpo eval compare` reads)."""
        from chessgrpo.eval.standalone import EvalConfig

        config = EvalConfig(
            engine=self.config.engine,
            positions=source,
            max_positions=max_positions,
            nodes=nodes,
            resamples=resamples,
            seed=self.context.seed,
            baselines=False,
        )
        return self.held_out_evaluation("offline", config, step, out_dir, pool=pool)


def _policy_pair(
    init_checkpoint: str | None, model_config: ModelConfig, device: torch.device, reference_device: str | None
) -> tuple[ActionPolicy, ActionPolicy]:
    """(trainable policy, frozen reference): the reference is the starting checkpoint (or a fresh
    `model_config`), frozen; the policy is its trainable copy, in eval mode for every RL forward. Move facts that
    `model_config` sets and the checkpoint lacks are added to both with zero weights (`models.add_facts`)."""
    if init_checkpoint:
        reference = load_policy(init_checkpoint, device=device)
        missing = missing_facts(reference, requested_facts(model_config))
        if missing:  # the model section asks for facts the checkpoint lacks: added with zero weights (same policy)
            logger.info(
                "adding move facts %s to %s (zero weights: the starting policy is unchanged)", missing, init_checkpoint
            )
            reference = with_move_facts(reference, missing)
    else:
        reference = ActionPolicy(model_config.policy_config()).to(device)
    reference.eval().requires_grad_(False)
    model = copy.deepcopy(reference).requires_grad_(True)
    model.eval()  # eval mode for every RL forward: dropout off (invariant 2)
    # The frozen reference may sit on its own device (reference_device), called from the policy's.
    return model, place_reference(reference, device, reference_device)


def policy_eval_line(step: int, row: dict[str, Any]) -> str | None:
    """The evaluation line of an action policy's GRPO run: held-out ESL and top-1, puzzles, endgame mate rate."""
    parts = []
    if "eval/esl" in row:
        parts.append(f"ESL {interval_text(row, 'eval/esl')}, top-1 {interval_text(row, 'eval/top1')}")
    if "eval/puzzle_first_move_accuracy" in row:
        parts.append(f"puzzles {interval_text(row, 'eval/puzzle_first_move_accuracy')}")
    if "eval/mate_rate" in row:
        parts.append(f"held-out mate rate {interval_text(row, 'eval/mate_rate')}")
    return f"step {step}: " + ", ".join(parts) if parts else None
