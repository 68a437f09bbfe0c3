"""The config of `kind: rookworld` (`RookWorldTrainConfig`) and of its held-out evaluation (`RookWorldEvalConfig`).

The plug-in that runs it is `tasks.kinds.rookworld.RookWorldKind` (its module docstring says what a step does).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chessgrpo.config import ConfigError, EngineConfig, RunConfig, engine_limits_unused, grpo_engine_config, resumable
from chessgrpo.data.rookworld_grading import RookWorldRewardConfig
from chessgrpo.eval.registry import extra_evaluations
from chessgrpo.models.lm import LMModelConfig
from chessgrpo.rl import GRPOConfig
from chessgrpo.tasks.lm_rewards import ROOKWORLD_REWARDS, LMReward
from chessgrpo.tasks.lm_rollout import RookWorldTaskConfig
from chessgrpo.tasks.reward_registry import WeightedReward
from chessgrpo.train.config import TrainConfig


@dataclasses.dataclass
class RookWorldEvalConfig:
    """Held-out evaluation during GRPO (the code of `chessgrpo eval lm`); cadence: eval_every, eval_at_start."""

    policy_prompts: int = 200
    """Held-out P: positions (the first N of the test split: the same ones every time)."""
    environment_prompts: int = 100
    """Held-out A: prompts (the first N of the test split)."""
    puzzles: str | None = None
    """Lichess puzzle CSV, solved through the P: prompt; null = skip."""
    max_puzzles: int = 200
    """Puzzles sampled (seeded) from `puzzles`."""
    batch_size: int = resumable(64)
    """Prompts per greedy generation batch."""
    resamples: int = 2000
    """Bootstrap resamples of the intervals."""
    extra: Any = dataclasses.field(default_factory=dict)
    """More evaluations of the registry (`eval.registry`) run on the model at each held-out evaluation, each writing
    its step_NNNNNN_<name>.json and logging its eval/ metrics: a list of names, or a mapping name -> its config keys."""
    endgame_positions: int = 0
    """With ``task.fresh_endgames``: held-out P: positions of that material won for the side to move
    (`EndgameStarts.hold_out`, seeded by `endgame_seed`), evaluated instead of the test split's P: positions; no
    training draw and no position of the data is one of them or an image of one (issue 66: 2000). 0 = the test split."""
    endgame_seed: int = 0
    """Seed of the `endgame_positions` set: the same set for every run (and arm) of the same data and seed."""

    def __post_init__(self) -> None:
        if self.endgame_positions < 0:
            raise ValueError(f"endgame_positions must be >= 0, got {self.endgame_positions}")
        if self.policy_prompts < 0 or self.environment_prompts < 0 or self.max_puzzles < 1:
            raise ValueError("need policy_prompts, environment_prompts >= 0 and max_puzzles >= 1")
        if self.batch_size < 1 or self.resamples < 10:
            raise ValueError("need batch_size >= 1 and resamples >= 10")
        extra_evaluations(self.extra)  # a ConfigError now names an unknown evaluation or a bad key of its config


@dataclasses.dataclass
class RookWorldTrainConfig(TrainConfig):
    """`chessgrpo train` with ``kind: rookworld``: GRPO of a chess LM on the P:/A: text tasks."""

    kind: str = "rookworld"
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="rookworld_grpo"))
    init_checkpoint: str | None = "runs/rookworld_sft"
    """Starting model, also the frozen KL reference: an SFT run or checkpoint, or any local
    `save_pretrained` directory (e.g. RookWorld-LM-124M). null = a fresh `model` (for tests)."""
    model: LMModelConfig = dataclasses.field(default_factory=LMModelConfig)
    """Shape of a fresh model (only with init_checkpoint: null), or `model.path`: a local model directory
    used like init_checkpoint when that is null. Its dropout is ignored: RL runs without."""
    data: str = "data/rookworld_tiny"
    """`chessgrpo data rookworld` directory: prompts from its train split, evaluation on its test split."""
    task: RookWorldTaskConfig = dataclasses.field(default_factory=RookWorldTaskConfig)
    rewards: RookWorldRewardConfig = dataclasses.field(default_factory=RookWorldRewardConfig)
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    engine: EngineConfig = dataclasses.field(default_factory=grpo_engine_config)
    """Stockfish pool for P: rewards and evaluation (rewards.policy.nodes is the limit); keep the cache on."""
    eval: RookWorldEvalConfig = dataclasses.field(default_factory=RookWorldEvalConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind != "rookworld":
            raise ConfigError(f"config key kind must be rookworld for this config, got {self.kind!r}")
        engine_limits_unused(self.engine, "rewards.policy.nodes (P: rewards and evaluation)")
        if self.eval.endgame_positions and not self.task.fresh_endgames:
            raise ConfigError("config key eval.endgame_positions needs task.fresh_endgames (the material to hold out)")
        if self.eval.endgame_positions and self.rewards.policy.truth != "tablebase":
            raise ConfigError(
                "config key eval.endgame_positions grades DTZ-optimal moves: set rewards.policy.truth: tablebase"
            )
        try:
            self.weighted_rewards()
        except ValueError as error:
            raise ConfigError(f"config key {error}") from None

    def weighted_rewards(self) -> list[WeightedReward[LMReward]]:
        """The run's rewards and weights (`task.rewards`; a `ValueError` naming the key for an unknown name)."""
        return ROOKWORLD_REWARDS.weighted(self.task.weights, "task.rewards")

    def default_best_metric(self) -> tuple[str, str] | None:
        if self.eval.policy_prompts:
            return "eval/p_reward", "max"
        if self.eval.environment_prompts:
            return "eval/a_reward", "max"
        return ("eval/puzzle_first_move_accuracy", "max") if self.eval.puzzles else None


def check_data_layout(config: RookWorldTrainConfig) -> None:
    """`ConfigError` when ``task.stop_after_move`` asks for move-first answers the data does not write."""
    from chessgrpo.data.rookworld import dataset_policy_layout
    from chessgrpo.data.rookworld_format import MOVE_FIRST_LAYOUT

    layout = dataset_policy_layout(config.data)
    if config.task.stop_after_move and layout not in (None, MOVE_FIRST_LAYOUT):
        raise ConfigError(
            f"config key task.stop_after_move stops answers after a move-first B:, but data {config.data!r} "
            f"writes its P: answers in layout {layout!r}: make the data with "
            f"layout={MOVE_FIRST_LAYOUT} or set task.stop_after_move: false"
        )


def check_data_prompts(config: RookWorldTrainConfig, model_prompt: str) -> None:
    """`ConfigError` when the data's P: prompts are written in another style (``policy_prompt``) than the model
    was taught: its answers to them would say nothing about what it learned."""
    from chessgrpo.data.rookworld import dataset_policy_prompt

    style = dataset_policy_prompt(config.data)
    if style is not None and style != model_prompt:
        raise ConfigError(
            f"config key data: {config.data!r} writes {style} P: prompts but the model was taught {model_prompt} "
            "prompts (its model_config.json's policy_prompt): train it on this data with SFT first, or use data made "
            f"with policy_prompt={model_prompt}"
        )
