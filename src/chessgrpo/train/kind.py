"""What a kind of run plugs into the training spine (`train.loop.Trainer`).

A kind (pretrain, sft, move_group, trajectory, rookworld) builds its model(s) and data, does one
training step, evaluates, and saves/loads what is its own. Everything every run shares (the run
directory and its lock, seeding, device and precision, the optimizer and schedule, clipping, the
step loop, metrics and tracking, evaluation cadence, checkpoints, resume, divergence recovery,
early stops, signals) is the `Trainer`'s, written once.

A kind's `train_step` calls ``learner.update(loss)`` for every optimizer update it wants (one for
supervised kinds, one per minibatch for GRPO): the learner does backward, clipping and the step,
and raises `rl.NonFiniteError` on a non-finite loss or gradient, which the loop handles.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from chessgrpo.train.config import TrainConfig
from chessgrpo.train.distributed import Parallel, derived_seed, group_generators

if TYPE_CHECKING:
    from chessgrpo.rl import RolloutBatch
    from chessgrpo.rl.learner import Forward
    from chessgrpo.train.learner import Learner


@dataclasses.dataclass
class RunContext:
    """What the loop tells a kind when it builds it."""

    run_dir: Path
    device: torch.device
    seed: int
    bf16: bool = False
    parallel: Parallel = dataclasses.field(default_factory=lambda: Parallel())
    """This process's place in a data-parallel run (world size 1 for a plain run): see `train.distributed`."""

    @property
    def rank(self) -> int:
        return self.parallel.rank

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on the run's device when the run asks for it, else nothing."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)


class Kind:
    """Base class of a kind of run. Subclasses set `name` and `config_class` and override the hooks.

    Construction (``Kind(config, context)``) builds models and data and writes nothing. `model` is
    the module the optimizer trains. The loop restores a checkpoint by calling `load_model` and
    `load_state_dict` after construction.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[TrainConfig]] = TrainConfig
    model: torch.nn.Module
    _learner_model: torch.nn.Module | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A kind that declares its own config class becomes that config's plug-in: the spine runs a
        # config through `type(config).kind_class` and never imports the kinds' layer.
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__:
            cls.config_class.kind_class = cls

    def __init__(self, config: Any, context: RunContext) -> None:
        self.config = config
        self.context = context

    @property
    def learner_model(self) -> torch.nn.Module:
        """What the learner's forwards call: `model`, or `model` in DDP in a data-parallel run (set by
        the spine), so that backward averages gradients over the ranks. Sampling and evaluation use `model`."""
        return self._learner_model if self._learner_model is not None else self.model

    @learner_model.setter
    def learner_model(self, module: torch.nn.Module) -> None:
        self._learner_model = module

    # -- optimisation ------------------------------------------------------------------------------

    def head_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters trained at `head_lr` (when set)."""
        return []

    def frozen_parameters(self, freeze_layers: int) -> list[torch.nn.Parameter]:
        """Parameters not trained when the config freezes the embeddings and first `freeze_layers` blocks."""
        if freeze_layers:
            from chessgrpo.config import ConfigError

            raise ConfigError(f"config key freeze_layers: kind {self.name} cannot freeze layers")
        return []

    def train_step(self, step: int, learner: Learner) -> dict[str, float]:
        """Do training step `step` (0-based: the number of steps already done); return its metrics."""
        raise NotImplementedError

    def finish_window(self, values: dict[str, float]) -> dict[str, float]:
        """Turn the mean of a log window's rows into the logged row (e.g. a perplexity from a mean NLL)."""
        return values

    # -- evaluation ---------------------------------------------------------------------------------

    @property
    def evaluates(self) -> bool:
        """Whether this run has anything to evaluate."""
        return False

    def evaluate(self, step: int, out_dir: Path) -> dict[str, float]:
        """Held-out evaluation of the current model: flat ``eval/`` metrics (``_low``/``_high`` interval
        bounds) for metrics.jsonl; full results go to ``out_dir/step_NNNNNN_<what>.json``."""
        return {}

    def after_run(self, out_dir: Path) -> None:
        """Called once a run reached its last step (e.g. a paired first-vs-last comparison)."""

    # -- state --------------------------------------------------------------------------------------

    def save_model(self, directory: Path) -> None:
        """Write the model files of a checkpoint."""
        raise NotImplementedError

    def load_model(self, checkpoint: Path) -> None:
        """Load the weights of a checkpoint written by `save_model` into `model`."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The kind's own resumable state (generators, data positions, controllers): plain data and tensors."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""

    # -- presentation --------------------------------------------------------------------------------

    def progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        """A few numbers from a metrics row for the progress bar."""
        return {}

    def eval_line(self, step: int, row: dict[str, Any]) -> str | None:
        """One line describing an evaluation row (None: the row holds no evaluation)."""
        return None

    def summary(self) -> list[str]:
        """Lines for the end-of-run summary (model, data)."""
        return []

    def close(self) -> None:
        """Release engines, tablebases and other processes."""

    @contextlib.contextmanager
    def closing(self) -> Iterator[Kind]:
        try:
            yield self
        finally:
            self.close()


@dataclasses.dataclass(frozen=True)
class StepGroups:
    """One task's groups in one step: how many there are over all ranks, and which of them this rank plays."""

    count: int
    """The task's groups this step, over every rank (what its start positions are drawn for)."""
    mine: Sequence[int]
    """Indices into 0..count-1 of the groups this rank plays."""
    seeds: Sequence[int]
    """For each of `mine`, the global group index that seeds its sampling generator."""


@dataclasses.dataclass
class TaskRollout:
    """A GRPO task's sampled and rewarded groups, ready for the learner (`GRPOKind.learn`)."""

    batch: RolloutBatch
    forward: Forward
    """Recomputes the batch's log-probs (`rl.optimize`'s forward)."""
    metrics: dict[str, float]
    """The task's own metrics of the rollout (entropy, rewards, its phase timings)."""
    samples: int
    """Trained samples (own plies) over every rank: what perf/samples_per_s counts."""
    rollout_s: float
    """Seconds of sampling and rewarding."""
    row_groups: torch.Tensor | None = None
    """[N] long: each row's group as an index into the `StepGroups.mine` it was played for (a task mixture
    orders its joined rows by group, so that the rows of N processes are in the one-process order)."""
    minibatch_terms: Callable[[], torch.Tensor] | None = None
    """A loss added once to every minibatch's forward (`PolicyOutputs.aux_loss`), whatever its rows: e.g.
    the value and bc losses on labelled positions drawn per call (`tasks.move_group.labelled_loss`). Every
    rank calls it once per forward, so ranks draw the same positions."""
    behaviour_forward: Forward | None = None
    """A pipelined step (``grpo.pipeline``): the same forward on the weights that sampled the batch (the
    snapshot, `train.pipeline`), on which `rl.optimize` checks the first minibatch's ratio; None = `forward`."""


@dataclasses.dataclass
class SharedParts:
    """What the tasks of a task mixture (`kind: mixture`) share instead of building their own."""

    model: Any
    """The trainable policy every task samples from and trains (an `ActionPolicy`, or the chess LM's `ChessLM`)."""
    reference: Any
    """The frozen reference (the KL anchor, and the ``reference`` opponent of trajectories)."""
    pool: Any
    """The Stockfish pool (`engine.EnginePool`), owned and closed by the mixture; None when no task needs one."""


class GRPOKind(Kind, abc.ABC):
    """A GRPO kind: the task contract, a KL controller (part of its resumable state) and the step's seeded randomness.

    The contract (docs/architecture.md, "The GRPO task contract"; a worked example: docs/training.md, "Writing a new
    GRPO kind"): a GRPO kind implements

    - `rollout(step, groups, sampler=None) -> TaskRollout`: sample and reward the groups this rank plays, from
      `sampler` when given (a pipelined step's snapshot of the weights), else from `model`;
    - `group_count() -> int`: the step's number of groups over every rank, with `group_count_name`, the config key
      it reads (error messages; a mixture refuses that key in a task's config);

    and, to be a task of a ``kind: mixture``, a `family` and `shared_parts`. Its step is
    ``learn(rollout(step, step_groups(group_count(), step)))``, written once here for every GRPO kind. A class that
    leaves `rollout` or `group_count` out cannot be instantiated (`abc`).

    Nothing random carries over between steps: the step's groups are drawn by (seed, step) and
    split over the ranks (`shard_groups`), each group samples from its own generator seeded by
    (seed, step, group) (`group_generators`) and the learner's minibatch shuffle is seeded by
    (seed, step) (`shuffle_seed`). So N processes run the same experiment as one, and a resumed
    run the same as a straight one. Subclasses call `init_grpo_state` once their models are built.
    """

    kl_controller: Any
    _pipeline: Any = None
    supports_pipeline: ClassVar[bool] = True
    """Whether `rollout` can sample from a `sampler` other than `model`, which a pipelined step (``grpo.pipeline``)
    needs. False only for a kind that cannot sample from a snapshot of the weights (``grpo.pipeline`` is then a
    `ConfigError`); its `rollout` refuses a `sampler`."""
    group_count_name: ClassVar[str] = ""
    """The config key that `group_count` reads, as a user writes it (``task.positions_per_step``): what error
    messages name, and the key a mixture refuses in its tasks' configs (it sets their counts)."""
    family: ClassVar[str] = ""
    """The policy family (tasks of one mixture share one policy, so they must be of one family); "" = none."""

    def __init__(self, config: Any, context: RunContext, shared: SharedParts | None = None) -> None:
        super().__init__(config, context)
        self.shared = shared
        """The mixture's policy, reference and pool when this kind runs as one of its tasks (`shared_parts`), else None."""

    @classmethod
    def shared_parts(cls, configs: Sequence[Any], context: RunContext) -> SharedParts:
        """The policy, reference and engine pool that a mixture of tasks of this family (`configs`, each
        task's full config) shares; each task is then built as ``cls(config, context, shared)``."""
        raise NotImplementedError(f"kind {cls.name!r} cannot be a task of a mixture")

    @classmethod
    def can_be_task(cls) -> bool:
        """Whether this kind can be a task of ``kind: mixture``: it is complete (not abstract), has a `family` and
        implements `shared_parts`."""
        parts_from = next(klass for klass in cls.__mro__ if "shared_parts" in vars(klass))
        return bool(cls.family) and parts_from is not GRPOKind and not inspect.isabstract(cls)

    @classmethod
    def exclusive_evaluations(cls, config: Any) -> tuple[str, ...]:
        """What a run with `config` evaluates that a mixture can hold only once (the same result files and metrics),
        in words (e.g. "held-out positions"): a mixture refuses two tasks that name the same one."""
        return ()

    def init_grpo_state(self, grpo_config: Any) -> None:
        from chessgrpo.rl import KLController

        if not self.group_count_name:
            raise TypeError(f"kind {type(self).__name__}: set group_count_name (the config key `group_count` reads)")
        self.kl_controller = KLController.from_config(grpo_config)
        self.shard_groups(self.group_count(), self.group_count_name)  # an uneven split is an error before anything runs
        if getattr(grpo_config, "pipeline", False):
            from chessgrpo.config import ConfigError
            from chessgrpo.train.pipeline import RolloutPipeline

            if not self.supports_pipeline:
                raise ConfigError(
                    f"config key grpo.pipeline: kind {self.name} cannot pipeline its steps (set grpo.pipeline: false)"
                )
            if self.context.world_size > 1:
                # The rollout thread would run collectives beside the learner's (DDP's all-reduces): their order would differ by rank.
                raise ConfigError(
                    "config key grpo.pipeline: a data-parallel run cannot pipeline its steps (set grpo.pipeline: false)"
                )
            self._pipeline = RolloutPipeline(self.model)

    def shard_groups(self, count: int, what: str) -> range:
        """This rank's groups (global indices) of the step's `count` groups; `what` names the config key."""
        return self.context.parallel.shard(count, what)

    def step_groups(self, count: int, step: int) -> StepGroups:
        """This rank's share of a step's `count` groups (a kind run on its own: contiguous shares)."""
        mine = self.shard_groups(count, self.group_count_name)
        return StepGroups(count, mine, mine)

    @abc.abstractmethod
    def group_count(self) -> int:
        """The step's number of groups over every rank (the config value `group_count_name` names)."""

    @abc.abstractmethod
    def rollout(self, step: int, groups: StepGroups, sampler: torch.nn.Module | None = None) -> TaskRollout:
        """Sample and reward the groups `groups.mine` of step `step` (each seeded by its `groups.seeds` entry); the
        rows of group i come out together and `row_groups` says which group each row is.

        `sampler`: the module to sample from, a pipelined step's snapshot of the weights (`train.pipeline`); None =
        `model`. With a sampler, the rollout also returns `TaskRollout.behaviour_forward`, the learner's forward on
        it (the ratio check's weights). A kind that cannot sample from a snapshot sets ``supports_pipeline = False``
        and raises on a sampler."""

    def rollout_state(self) -> dict[str, Any]:
        """The part of `state_dict` that a rollout changes (e.g. an adaptive curriculum): a pipelined step saves
        it as it was before the next step's rollout started, which a resumed run then re-runs."""
        return {}

    def minibatch_terms(self, step: int) -> Callable[[], torch.Tensor] | None:
        """Step `step`'s losses added once to every minibatch whatever its rows (`TaskRollout.minibatch_terms`),
        or None. A function of (seed, step) alone, so a task mixture adds a task's terms on every rank,
        including ranks that play none of its groups this step."""
        return None

    def train_step(self, step: int, learner: Learner) -> dict[str, float]:
        """One GRPO step: roll out this rank's share of the step's groups, then learn from them.

        Pipelined (``grpo.pipeline``, `train.pipeline`): take step `step`'s rollout (started during the
        previous step on a snapshot of the weights), start the next step's on a snapshot of the current
        weights, then learn while it runs."""
        if self._pipeline is None:
            return self.learn(step, learner, self.rollout(step, self.step_groups(self.group_count(), step)))
        tick = time.perf_counter()

        def rollout_of(at: int) -> Callable[[torch.nn.Module], TaskRollout]:
            return lambda sampler: self.rollout(at, self.step_groups(self.group_count(), at), sampler)

        rollout, sampler, wait_s = self._pipeline.take(step, rollout_of(step))
        following = step + 1
        if (
            following < self.config.steps
        ):  # the snapshot is recorded even when this process stops here (resume needs it)
            stop_at = self.config.stop_at
            self._pipeline.start(
                following,
                rollout_of(following),
                self.rollout_state(),
                busy=sampler,
                launch=stop_at is None or following < stop_at,
            )
        metrics = self.learn(step, learner, rollout)
        step_s = time.perf_counter() - tick
        metrics.update(
            {
                "perf/rollout_wait_s": wait_s,
                "perf/step_s": step_s,
                "perf/samples_per_s": rollout.samples / max(step_s, 1e-9),
            }
        )
        return metrics

    def wait_for_rollout(self) -> None:
        """Wait until a pipelined step's rollout in flight has finished (before the pool is used for evaluation)."""
        if self._pipeline is not None:
            self._pipeline.wait()

    def stop_pipeline(self) -> None:
        """Wait for a pipelined step's rollout in flight, drop it and stop its thread (before the pool closes)."""
        if self._pipeline is not None:
            self._pipeline.close()

    def learn(self, step: int, learner: Learner, rollout: TaskRollout) -> dict[str, float]:
        """`rl.optimize` on the rollout (one `learner.update` per minibatch); the step's metrics."""
        from chessgrpo.rl import optimize
        from chessgrpo.rl.combine import with_minibatch_terms

        tick = time.perf_counter()
        forward = (
            rollout.forward
            if rollout.minibatch_terms is None
            else with_minibatch_terms(rollout.forward, rollout.minibatch_terms)
        )
        metrics = optimize(
            rollout.batch,
            forward,
            learner.update,
            self.config.grpo,
            self.kl_controller,
            generator=None,
            bf16=self.context.bf16,
            parallel=self.context.parallel,
            shuffle_seed=self.shuffle_seed(step),
            step=step,
            parameters=learner.parameters,  # parameters: the per-term gradient norms (grpo.term_gradient_every)
            behaviour_forward=rollout.behaviour_forward,
        )
        learn_s = time.perf_counter() - tick
        metrics.update(rollout.metrics)
        step_s = rollout.rollout_s + learn_s
        metrics.update(
            {"perf/learn_s": learn_s, "perf/step_s": step_s, "perf/samples_per_s": rollout.samples / max(step_s, 1e-9)}
        )
        return metrics

    def group_generators(self, step: int, groups: range) -> list[torch.Generator]:
        """One sampling generator per group in `groups` (global indices), on the run's device."""
        return group_generators(self.context.seed, step, groups, self.context.device)

    def shuffle_seed(self, step: int) -> int:
        """The seed of step `step`'s minibatch shuffle (the same in every process)."""
        return derived_seed(self.context.seed, step, 0x5B)

    def state_dict(self) -> dict[str, Any]:
        state = {"kl_controller": self.kl_controller.state_dict()}
        held = self._pipeline.held_rollout_state if self._pipeline is not None else None
        if held is None:
            return {**state, **self.rollout_state()}
        # Pipelined: the next step's rollout is (or may be) under way; a resume re-runs it from the state before it.
        return {**state, **held, "pipeline": self._pipeline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Checkpoints of earlier versions also hold a "generator": sampling no longer carries state.
        self.kl_controller.load_state_dict(state["kl_controller"])
        if (
            self._pipeline is not None
        ):  # a checkpoint of a serial run holds none: the next rollout samples the live weights
            self._pipeline.load_state_dict(state.get("pipeline"))


def postfix(row: dict[str, Any], fields: tuple[tuple[str, str, str], ...]) -> dict[str, str]:
    """Progress-bar entries ``label: format(row[key])`` for the (key, label, format) fields present in `row`."""
    return {label: format(row[key], spec) for key, label, spec in fields if key in row}


def interval_text(row: dict[str, Any], key: str, digits: int = 3) -> str:
    """``value [low, high]`` for an evaluation metric with interval bounds (value alone without)."""
    if f"{key}_low" in row:
        return f"{row[key]:.{digits}f} [{row[key + '_low']:.{digits}f}, {row[key + '_high']:.{digits}f}]"
    return f"{row[key]:.{digits}f}"
