"""Reward functions users write (``module:function``), as TRL users pass `reward_funcs`.

A user's function is a reward like any other: its ``module:function`` string is its name, in ``task.rewards``
with a weight (``task.rewards: {"my_rewards:capture_bonus": 1.0, win_prob: 0.5}``) or alone as
``task.reward_fn`` (weight 1), and in its metric ``reward/module:function``. Each family's registry wraps it
into a `tasks.reward_registry.RegisteredReward` (move groups: `tasks.move_group.user_move_group_reward`;
the chess LM: `tasks.lm_rewards`), so it runs through the same code as a built-in reward.

A one-move reward function has the signature of `MoveReward`: it gets the position, the sampled move and
the engine's expected score for the mover after it (what the built-in ``win_prob`` reward returns), and
returns the move's reward (any finite float; the group baseline centres it). The built-in ``win_prob``
reward is ``lambda board, move, win_probability: win_probability``. The function is imported and its
signature checked when the config is built, so a typo fails before any engine starts.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import chess
import torch

from chessgrpo.errors import InputError


class MoveReward(Protocol):
    def __call__(self, board: chess.Board, move: chess.Move, win_probability: float) -> float:
        """The reward of playing `move` in `board` (`win_probability`: the mover's expected score after it, by the engine)."""
        ...


def import_function(spec: str, key: str) -> Callable[..., Any]:
    """The callable ``module:function`` names (a dotted attribute path after the colon is allowed).

    One `ValueError` naming `key` and `spec` when it has no colon, the module does not import, the
    attribute is missing or it is not callable.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InputError(
            f"{key} {spec!r}: expected 'module:function' (an importable module, a colon, the function's name)"
        )
    try:
        target: object = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure is the user's module's: say which
        # The `chessgrpo` script does not put the working directory on sys.path (python -m does): say so.
        hint = (
            " (is its folder on PYTHONPATH? e.g. PYTHONPATH=. chessgrpo train ...)"
            if isinstance(error, ModuleNotFoundError)
            else ""
        )
        raise InputError(
            f"{key} {spec!r}: module {module_name!r} does not import ({type(error).__name__}: {error}){hint}"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise InputError(f"{key} {spec!r}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        # InputError (a ValueError), not TypeError: load_config turns a config check's ValueError into a ConfigError.
        raise InputError(f"{key} {spec!r}: {attribute!r} is a {type(target).__name__}, not a function")  # noqa: TRY004
    return target


def check_signature(function: Callable[..., Any], spec: str, key: str, what: str, *args: Any, **kwargs: Any) -> None:
    """A `ValueError` naming `key` and `spec` when `function` cannot be called with `args` and `kwargs` (`what`: them in words)."""
    try:
        inspect.signature(function).bind(*args, **kwargs)
    except TypeError as error:
        raise InputError(f"{key} {spec!r}: it must take {what}: {error}") from None
    except ValueError:  # builtins without a signature: trust them
        pass


def load_reward_function(spec: str, key: str = "task.reward_fn") -> MoveReward:
    """The one-move reward function ``module:function`` names (`import_function`), checked to take
    (board, move, win_probability): one `ValueError` naming `key` and `spec` otherwise."""
    target = import_function(spec, key)
    check_signature(target, spec, key, "(board, move, win_probability)", chess.Board(), chess.Move.null(), 0.5)
    return target


def user_rewards(
    function: MoveReward,
    boards: Sequence[chess.Board],
    moves: Sequence[Sequence[chess.Move]],
    win_probabilities: torch.Tensor,
    spec: str,
    key: str = "task.reward_fn",
) -> torch.Tensor:
    """[B, G] rewards of `function` for each position's sampled moves; a non-finite or non-numeric answer is an error naming it."""
    rows = []
    for board, row, values in zip(boards, moves, win_probabilities.tolist()):
        out = []
        for move, value in zip(row, values):
            reward = function(board.copy(stack=False), move, float(value))  # a copy: the function may push moves
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise InputError(
                    f"{key} {spec!r} returned {reward!r} for {move.uci()} in {board.fen()!r}: expected a finite number"
                )
            out.append(float(reward))
        rows.append(out)
    return torch.tensor(rows, dtype=torch.float32)
