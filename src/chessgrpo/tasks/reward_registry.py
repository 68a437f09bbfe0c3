"""Rewards as registered records, one registry per policy family, combined with weights (`task.rewards`).

A reward is one `RegisteredReward`: its name, its function (one signature per family: the family's
registry says which) and what the run must start for it (`needs`: the engine pool, the Syzygy tables,
...). A run names its rewards with weights, as TRL's ``reward_funcs`` + ``reward_weights``::

    task:
      rewards: {shaped: 1.0, win_prob: 0.5}    # or the one-reward form, task.reward: shaped (weight 1)

and trains on their weighted sum (`combine`), logging each as ``reward/<name>`` beside the combined
``reward/mean``. What the run starts is the union of its records' `needs` (`needs_of`), never a test of
a reward's name. A user's function, ``module:function``, is a name too: the family's registry wraps it
into a record of the same type (`RewardRegistry.record`), so it takes the same path as a built-in one.

The families' registries: `tasks.move_group.MOVE_GROUP_REWARDS`, `tasks.trajectory_rewards.TRAJECTORY_REWARDS`
and `tasks.lm_rewards.ROOKWORLD_REWARDS` (docs/architecture.md, "Rewards").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from chessgrpo.errors import InputError

if TYPE_CHECKING:
    import torch

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
R = TypeVar("R", float, "torch.Tensor")
"""A reward value: one number, or one per row."""

RESERVED_NAMES = frozenset({"mean", "std", "min", "max"})
"""Names no reward may take: ``reward/<name>`` would collide with the combined reward's metrics (`rl.learner`)."""
USER_SEPARATOR = ":"
"""A name with a colon is a user's ``module:function``; registered names have none."""


@dataclasses.dataclass(frozen=True)
class RegisteredReward(Generic[F]):
    """One reward of a family's registry: its name, its function and what a run needs for it."""

    name: str
    """Its name in ``task.reward`` / ``task.rewards`` and in the metric ``reward/<name>``."""
    function: F
    """The reward itself, with its family's signature (the registry's `signature`)."""
    needs: frozenset[str] | Callable[[Any], Iterable[str]] = frozenset()
    """What the run must start for it, from its registry's vocabulary (`RewardRegistry.needs`); a function of
    the run's config when that depends on it (e.g. the LM's P: reward needs the pool only for an engine truth),
    called with None where no run config is known yet (it then says what it may need)."""
    user: bool = False
    """A user's ``module:function`` wrapped by its registry."""

    def needs_of(self, config: Any = None) -> frozenset[str]:
        """What a run with `config` must start for this reward."""
        return frozenset(self.needs(config) if callable(self.needs) else self.needs)


@dataclasses.dataclass(frozen=True)
class WeightedReward(Generic[F]):
    """A reward of a run and its weight in the combined reward."""

    reward: RegisteredReward[F]
    weight: float

    @property
    def name(self) -> str:
        return self.reward.name


class RewardRegistry(MutableMapping[str, RegisteredReward[F]]):
    """name -> `RegisteredReward` of one policy family.

    `register(name, function, needs=...)` adds one (a bare callable assigned with ``registry[name] = f``
    becomes a record that needs nothing). `record(name)` looks one up; a ``module:function`` name is the
    user's function, imported and wrapped by `user` (None: this family takes no user functions).
    """

    def __init__(
        self,
        family: str,
        signature: str,
        needs: Mapping[str, str],
        user: Callable[[str, str], RegisteredReward[F]] | None = None,
    ) -> None:
        self.family = family
        self.signature = signature
        """The functions' signature, in words (error messages and docs)."""
        self.needs = dict(needs)
        """The vocabulary of `RegisteredReward.needs`: need -> what the run starts for it."""
        self._user = user
        self._records: dict[str, RegisteredReward[F]] = {}

    # -- the mapping -------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> RegisteredReward[F]:
        return self._records[name]

    def __setitem__(self, name: str, value: RegisteredReward[F] | F) -> None:
        record = value if isinstance(value, RegisteredReward) else RegisteredReward(name, value)
        if record.name != name:
            raise ValueError(f"a {self.family} reward registered as {name!r} is named {record.name!r}")
        self._check(record)
        self._records[name] = record

    def __delitem__(self, name: str) -> None:
        del self._records[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"RewardRegistry({self.family!r}, {list(self._records)})"

    # -- registering and looking up ----------------------------------------------------------------

    def register(self, name: str, function: F, *, needs: Iterable[str] | Callable[[Any], Iterable[str]] = ()) -> F:
        """Add `function` as the reward `name` with its `needs`; returns the function."""
        self[name] = RegisteredReward(name, function, needs if callable(needs) else frozenset(needs))
        return function

    def known(self) -> str:
        """The registered names, and whether a ``module:function`` is accepted (for error messages)."""
        user = " or 'module:function' (a function you write)" if self._user is not None else ""
        return f"{list(self._records)}{user}"

    def record(self, name: str, key: str = "rewards") -> RegisteredReward[F]:
        """The reward `name`: a registered one, or a user's ``module:function`` wrapped by this family.

        A `ValueError` naming `key` lists the known names for an unknown one; a user's function that does not
        import (or has the wrong signature) raises naming the string.
        """
        if USER_SEPARATOR in name:
            if self._user is None:
                raise InputError(
                    f"{key}: {name!r} is a 'module:function', but {self.family} rewards take no user functions; "
                    f"register one ({self.signature}) or choose one of {list(self._records)}"
                )
            return self._user(name, key)
        if name not in self._records:
            raise InputError(f"{key}: unknown {self.family} reward {name!r}; known: {self.known()}")
        return self._records[name]

    def weighted(self, weights: Mapping[str, float], key: str = "rewards") -> list[WeightedReward[F]]:
        """The run's rewards with their weights, in the mapping's order (each checked: `record`, `check_weights`)."""
        check_weights(weights, key)
        return [WeightedReward(self.record(name, key), float(weight)) for name, weight in weights.items()]

    def needs_of(self, rewards: Sequence[WeightedReward[F]], config: Any = None) -> frozenset[str]:
        """The union of what `rewards` need in a run with `config`, each need checked against the vocabulary."""
        out: set[str] = set()
        for item in rewards:
            needs = item.reward.needs_of(config)
            self.check_needs(item.name, needs)
            out |= needs
        return frozenset(out)

    def _check(self, record: RegisteredReward[F]) -> None:
        if not record.name or USER_SEPARATOR in record.name or record.name in RESERVED_NAMES or "/" in record.name:
            raise ValueError(
                f"{record.name!r} cannot name a {self.family} reward (no ':' or '/', not one of {sorted(RESERVED_NAMES)})"
            )
        if not callable(record.function):
            raise ValueError(
                f"{self.family} reward {record.name!r}: {record.function!r} is not a function ({self.signature})"
            )
        if not callable(record.needs):
            self.check_needs(record.name, record.needs)

    def check_needs(self, name: str, needs: Iterable[str]) -> None:
        """A `ValueError` for a need outside this family's vocabulary (a typo would start nothing)."""
        unknown = sorted(set(needs) - set(self.needs))
        if unknown:
            raise ValueError(f"{self.family} reward {name!r} needs {unknown}: not among {sorted(self.needs)}")


def check_weights(weights: Mapping[str, float], key: str = "rewards") -> None:
    """A `ValueError` naming the key for an empty mapping, a weight that is not a finite number, or only zero weights."""
    if not weights:
        raise InputError(f"{key} is empty: name at least one reward with its weight, e.g. {{win_prob: 1.0}}")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise InputError(f"{key}: the weight of {name!r} must be a finite number, got {weight!r}")
    if all(weight == 0 for weight in weights.values()):
        raise InputError(f"{key}: every weight is 0, so every reward is 0 and nothing is learnt")


def combine(parts: Sequence[tuple[float, R]]) -> R:
    """The weighted sum of the rewards `parts` ((weight, value): tensors or floats), starting from the first
    term: one reward of weight 1 gives its values bit for bit (1.0 * x == x, -0.0 included)."""
    if not parts:
        raise ValueError("no rewards to combine")
    first_weight, first_value = parts[0]
    total: Any = first_weight * first_value
    for weight, value in parts[1:]:
        total = total + weight * value
    return total


def one_reward_weights(
    reward: str, rewards: Mapping[str, float] | None, default: str, user: str | None = None
) -> dict[str, float]:
    """The run's {name: weight}: `rewards` (``task.rewards``) when given, else the one reward ``task.reward_fn``
    (`user`) or ``task.reward`` names, with weight 1.

    A `ValueError` (keys relative to the ``task`` section) when they disagree: with ``rewards`` set, ``reward``
    must keep its default (`default`) or be one of its names, and ``reward_fn`` must be unset (its
    ``module:function`` goes into ``rewards`` with a weight instead)."""
    if rewards is None:
        return {user: 1.0} if user is not None else {reward: 1.0}
    check_weights(rewards, "rewards")
    if user is not None:
        raise InputError(
            f"rewards: set together with reward_fn {user!r}; name {user!r} in rewards with its weight instead"
        )
    if reward != default and reward not in rewards:
        raise InputError(
            f"rewards {list(rewards)} does not name task.reward {reward!r}: task.rewards replaces task.reward, "
            f"so name {reward!r} in it with its weight, or set task.reward to one of its names"
        )
    return dict(rewards)


def reward_metrics(name: str, values: Any) -> dict[str, float]:
    """``reward/<name>`` (the mean of one reward's values over the rows or plies it scored) and ``reward/<name>_std``
    (their sample standard deviation, as the combined ``reward/std``); nothing when it scored none."""
    import torch

    flat = (values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.float64)).reshape(-1)
    if flat.numel() == 0:
        return {}
    return {
        f"reward/{name}": float(flat.mean()),
        f"reward/{name}_std": float(flat.double().std()) if flat.numel() > 1 else 0.0,
    }
