"""The trajectory task's rewards: one registered record each (`tasks.reward_registry`), giving every own ply its reward.

A reward maps the played trajectories and the sources it may read (`RewardSources`: the Syzygy
tables, the engine pool, the values the rollout prefetched) to `StepRewards`: [N, T] rewards of
every own ply for its mover (0 where masked; module docstring of `tasks.trajectory` for the
definitions), and how many distinct positions the engine valued. The `task.reward` config key picks
one, `task.rewards` several with weights (the plies' rewards are their weighted sum); adding a reward is
one function here and one `TRAJECTORY_REWARDS.register` line with what it needs (the run starts it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import chess
import torch

from chessgrpo.board.actions import ACTIONS
from chessgrpo.engine.tablebase_values import TablebaseState, terminal_after_move
from chessgrpo.tasks.endgame_rewards import best_step_reward, step_reward
from chessgrpo.tasks.engine_values import EngineValues
from chessgrpo.tasks.reward_registry import RewardRegistry
from chessgrpo.tasks.trajectory import Point, Trajectories, TrajectoryConfig

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.engine import EnginePool
    from chessgrpo.engine.tablebase import Tablebase


@dataclasses.dataclass
class RewardSources:
    """What a trajectory reward may read."""

    tablebase: Tablebase | None = None
    """The Syzygy tables (exact values), when the run has them."""
    pool: EnginePool | None = None
    """The Stockfish pool, when the run has one."""
    prefetched: EngineValues | None = None
    """Engine values the rollout searched as it went (`task.overlap_rewards`)."""


@dataclasses.dataclass
class StepRewards:
    """A trajectory reward's result."""

    rewards: torch.Tensor
    """[N, T] the reward of every own ply for its mover (0 where masked)."""
    evaluations: int = 0
    """Distinct positions the engine valued for them (perf/engine_evals_per_s)."""


def tablebase_step_rewards(
    trajectories: Trajectories, oracle: Tablebase, *, shaping: float, regret: bool = False
) -> torch.Tensor:
    """[N, T] exact endgame rewards of every own ply for its mover (0 where masked); `tasks.endgame_rewards.step_reward`,
    minus `tasks.endgame_rewards.best_step_reward` of the position before the ply when `regret`."""
    rewards = torch.zeros(trajectories.mask.shape, dtype=torch.float32)
    for i, (colour, points) in enumerate(zip(trajectories.row_colour, trajectories.points)):
        states = [oracle.state(p.board, colour, terminal=p.terminal, checked=True) for p in points]
        for t in range(len(points) - 1):
            reward = step_reward(states[t], states[t + 1], shaping)
            rewards[i, t] = reward - best_step_reward(states[t], shaping) if regret else reward
    return rewards.to(trajectories.mask.device)


def move_regret(
    oracle: Tablebase, board: chess.Board, move: chess.Move, before: TablebaseState, shaping: float
) -> float:
    """The regret of playing `move` at `board` (the mover's exact state `before`) against the perfect defender,
    without playing the reply: `step_reward` of the state after the reply minus `best_step_reward`.

    One probe of the position after the move (the defender to move) gives it: the rules first (mate, stalemate,
    dead draw, 50 moves), else the tables' value, and a win's distance after the defender's best reply is one ply
    shorter than before it (DTZ). This equals the regret of the same move played in a trajectory
    (`tablebase_step_rewards`, tests/test_trajectory.py) except for a threefold repetition, which only a game's
    move stack shows."""
    mover = board.turn
    after = board.copy(stack=False)
    after.push(move)
    terminal = terminal_after_move(after)
    if terminal == "checkmate":
        state = TablebaseState(score=1.0, plies=0, terminal=terminal, delivered_mate=True)
    elif terminal is not None:
        state = TablebaseState(score=0.5, plies=0, terminal=terminal)
    else:
        value = oracle.state(after, mover, terminal=None, checked=True)
        plies = max(value.plies - 1, 0) if value.score == 1.0 else value.plies + 1 if value.score == 0.0 else 0
        state = TablebaseState(score=value.score, plies=plies)
    return step_reward(before, state, shaping) - best_step_reward(before, shaping)


def sibling_baselines(trajectories: Trajectories, oracle: Tablebase, *, shaping: float) -> torch.Tensor:
    """[N, T] the mean regret of each own ply's sibling moves (`TrajectoryConfig.sibling_moves`, drawn at the same
    position from the same distribution; 0 where masked): an unbiased per-position baseline for the played move's
    regret (the siblings do not include it)."""
    if trajectories.siblings is None:
        raise ValueError("these trajectories were played without sibling moves (task.sibling_moves: 0)")
    baselines = torch.zeros(trajectories.mask.shape, dtype=torch.float32)
    for i, (colour, points, siblings) in enumerate(
        zip(trajectories.row_colour, trajectories.points, trajectories.siblings)
    ):
        for t, actions in enumerate(siblings):
            board = points[t].board
            before = oracle.state(board, colour, terminal=None, checked=True)
            regrets = [move_regret(oracle, board, chess.Move.from_uci(ACTIONS[a]), before, shaping) for a in actions]
            baselines[i, t] = sum(regrets) / len(regrets)
    return baselines.to(trajectories.mask.device)


def point_value(point: Point, pov: chess.Color, engine_value: float | None) -> float:
    """The mover's expected score at `point`: exact when the game is over, else from the engine.

    `engine_value` is the engine's win probability for the side to move at the point.
    """
    if point.terminal == "checkmate":
        return 0.0 if point.board.turn == pov else 1.0
    if point.terminal is not None:
        return 0.5
    if engine_value is None:
        raise ValueError(f"no engine value for the unfinished position {point.board.fen()!r}")
    return engine_value if point.board.turn == pov else 1.0 - engine_value


def engine_step_rewards(
    trajectories: Trajectories, pool: EnginePool, *, nodes: int, prefetched: EngineValues | None = None
) -> tuple[torch.Tensor, int]:
    """([N, T] changes of the mover's win probability per own ply, distinct positions valued).

    `prefetched`: the `EngineValues` the rollout filled as it went (`play_trajectories(prefetch=...)`);
    any point it lacks is searched now. An engine failure is retried by the pool and raises if it
    persists: never a silent 0 reward.
    """
    values = prefetched if prefetched is not None else EngineValues(pool, nodes)
    if values.nodes != nodes:
        raise ValueError(f"prefetched values were searched at {values.nodes} nodes, the rewards need {nodes}")
    keys = [[p.key() if p.terminal is None else "" for p in points] for points in trajectories.points]
    unfinished = [
        (p.board, key) for points, row_keys in zip(trajectories.points, keys) for p, key in zip(points, row_keys) if key
    ]
    values.add([board for board, _ in unfinished], [key for _, key in unfinished])
    rewards = torch.zeros(trajectories.mask.shape, dtype=torch.float32)
    for i, (colour, points, row_keys) in enumerate(zip(trajectories.row_colour, trajectories.points, keys)):
        v = [point_value(p, colour, values.value(key) if key else None) for p, key in zip(points, row_keys)]
        for t in range(len(points) - 1):
            rewards[i, t] = v[t + 1] - v[t]
    return rewards.to(trajectories.mask.device), len({key for _, key in unfinished})


def tablebase_reward(trajectories: Trajectories, sources: RewardSources, task: TrajectoryConfig) -> StepRewards:
    """The exact endgame reward of every own ply (`tablebase_step_rewards`, `task.shaping`, `task.regret`)."""
    if sources.tablebase is None:
        raise ValueError("tablebase rewards need the Syzygy tables (engine.syzygy_path)")
    return StepRewards(
        tablebase_step_rewards(trajectories, sources.tablebase, shaping=task.shaping, regret=task.regret)
    )


def engine_reward(trajectories: Trajectories, sources: RewardSources, task: TrajectoryConfig) -> StepRewards:
    """The change of the mover's win probability across each own ply (`engine_step_rewards` at `task.reward_nodes`)."""
    if sources.pool is None:
        raise ValueError("engine rewards need the Stockfish pool")
    rewards, evaluations = engine_step_rewards(
        trajectories, sources.pool, nodes=task.reward_nodes, prefetched=sources.prefetched
    )
    return StepRewards(rewards, evaluations)


TrajectoryReward = Callable[[Trajectories, RewardSources, TrajectoryConfig], StepRewards]
"""A trajectory reward's signature: (the played trajectories, what it may read, the task's config) -> `StepRewards`."""

TRAJECTORY_REWARDS: RewardRegistry[TrajectoryReward] = RewardRegistry(
    "trajectory",
    "(trajectories: Trajectories, sources: RewardSources, task: TrajectoryConfig) -> StepRewards",
    needs={
        "tablebase": "the Syzygy tables (engine.syzygy_path must be set): RewardSources.tablebase",
        "pool": "the Stockfish pool: RewardSources.pool",
        "engine_values": "the engine's values of every point at task.reward_nodes, which the rollout prefetches "
        "while it plays with task.overlap_rewards (and in a pipelined step): RewardSources.prefetched",
    },
)
"""`task.reward` / `task.rewards` -> the reward of every own ply."""
TRAJECTORY_REWARDS.register("tablebase", tablebase_reward, needs={"tablebase"})
TRAJECTORY_REWARDS.register("engine", engine_reward, needs={"pool", "engine_values"})
