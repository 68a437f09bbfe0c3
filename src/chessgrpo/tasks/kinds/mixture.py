"""`kind: mixture`: one policy trained by GRPO on several tasks at once.

The tasks are GRPO kinds of one policy family: the action policy's (move_group, trajectory) or the
chess LM's (rookworld, e.g. a P:-only and an A:-only task with their own rewards). Any registered GRPO kind
that follows the task contract (`train.kind.GRPOKind`: `rollout`, `group_count_name`, a `family` and
`shared_parts`; `GRPOKind.can_be_task`) can be a task: nothing here names a kind.

Each step has `groups_per_step` groups. Every group draws its task from the weights (a seeded draw
per step, `draw_task_groups`), so one-move groups with shaped engine rewards, trajectory groups
rewarded by the game's outcome and endgame groups against the tablebase can all land in the same
step and the same optimizer updates. The step:

1. **draw**: the task of each of the step's groups, a function of (seed, step);
2. **roll out** (`MixtureKind.rollout`): each task samples and rewards its groups with its own code (its `rollout`:
   `MoveGroupKind.rollout`, `TrajectoryKind.rollout`, ...), from the shared policy, and fills its groups' advantages with the
   mixture's `grpo` estimator and the task's own supervision (`rl.compute_advantages`): a group is only
   ever compared with groups of its own task;
3. **learn**: the tasks' rows are joined (`rl.combine.concat_rollouts`, shorter rows padded and
   masked) and `rl.optimize` runs once over them: the same minibatches, clipping, KL and updates
   as any GRPO kind (token_mean counts a trajectory's plies as samples beside one-move samples).
   Auxiliary losses: a one-move task's value loss on its rollout's positions is a per-row term that the
   learner averages over all the minibatch's rows (other tasks' rows count 0, so its weight is in effect
   value_loss_weight x the one-move share of the rows); its losses on labelled positions (value, bc) are
   added to every minibatch, on every rank, whether or not the rank plays one of its groups this step.

A task's config holds only its own keys (`task`, start positions, rewards, evaluation); the loop's
knobs, `init_checkpoint`, `model`, `grpo` and `engine` are the mixture's, shared by every task, and
setting them in a task is an error. Tasks share one policy, one frozen reference and one engine pool.

A group's task and its sampling generator depend on (seed, step, group index) only, so a mixture
with one task plays that task's own run (the same groups and rewards), and a data-parallel run plays the same groups
as one process (each rank plays the groups of its contiguous share, whatever their tasks).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from chessgrpo.config import (
    ConfigError,
    EngineConfig,
    RunConfig,
    engine_limits_unused,
    from_dict,
    grpo_engine_config,
    to_dict,
)
from chessgrpo.rl import GRPOConfig, compute_advantages
from chessgrpo.rl.combine import concat_forwards, concat_rollouts
from chessgrpo.tasks.kinds import KINDS, kind_class
from chessgrpo.train.config import TrainConfig
from chessgrpo.train.distributed import Parallel, derived_seed
from chessgrpo.train.kind import GRPOKind, RunContext, StepGroups, TaskRollout, postfix

logger = logging.getLogger(__name__)


def task_kind_class(name: str, key: str) -> type[GRPOKind]:
    """The kind registered as `name` when it can be a mixture's task (`GRPOKind.can_be_task`); otherwise a
    `ConfigError` naming the config key `key` and the registered kinds that can. Only the task's own kind module is
    imported (so an action-policy mixture never imports transformers), every registered one only for that error."""
    cls = kind_class(name) if name in KINDS else None
    if cls is None or not (issubclass(cls, GRPOKind) and cls.can_be_task()):
        raise ConfigError(
            f"config key {key} must be one of {task_kinds()} (the registered GRPO kinds with a policy family and "
            f"shared_parts), got {name!r}"
        )
    return cls


def task_kinds() -> list[str]:
    """The registered kinds (`tasks.kinds.KINDS`) that can be a mixture's task, by name (imports each kind module)."""
    names = []
    for name in sorted(KINDS):
        cls = kind_class(name)
        if issubclass(cls, GRPOKind) and cls.can_be_task():
            names.append(name)
    return names


def _sets_key(mapping: dict[str, Any], dotted: str) -> bool:
    """Whether the raw config `mapping` sets the dotted key (``task.positions_per_step``)."""
    *sections, leaf = dotted.split(".")
    for section in sections:
        inner = mapping.get(section)
        if not isinstance(inner, dict):
            return False
        mapping = inner
    return leaf in mapping


@dataclasses.dataclass
class MixtureTask:
    """One task of a mixture (an item of `tasks:`)."""

    name: str = ""
    """A short label: metrics of this task are logged as ``<group>/<name>/<metric>`` (e.g. reward/conversion/mean)."""
    weight: float = 1.0
    """Relative share of each step's groups drawn for this task (normalised over the tasks)."""
    kind: str = "move_group"
    """A registered GRPO kind that can be a task (`task_kinds`): move_group | trajectory (the action policy),
    rookworld (the chess LM), or one of your own (docs/training.md, "Writing a new GRPO kind")."""
    config: Any = None
    """The task's own keys of that kind's config (task, positions or position_mixture, rewards, eval, ...)."""


@dataclasses.dataclass
class MixtureTrainConfig(TrainConfig):
    """`chessgrpo train` with ``kind: mixture``: GRPO on a weighted mixture of tasks of one policy family."""

    kind: str = "mixture"
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="mixture"))
    init_checkpoint: str | None = "runs/pretrain_tiny"
    """Starting policy of every task (checkpoint or run directory), also the frozen reference; null = `model` from scratch."""
    model: Any = None
    """The policy's shape when init_checkpoint is null: the keys of the tasks' own `model` section
    (`models.policy.ModelConfig` for move_group and trajectory, `models.lm.LMModelConfig` for rookworld,
    checked there); null = that section's defaults. With an action-policy init_checkpoint, move-fact keys set true
    that the checkpoint lacks are added with zero weights (`models.add_facts`)."""
    groups_per_step: int = 32
    """Groups per step over all tasks; each draws its task from the weights."""
    tasks: list[MixtureTask] = dataclasses.field(default_factory=list)
    """The tasks (name, weight, kind, config)."""
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    """The learner's hyperparameters, for every task (advantages are computed per task, within its groups)."""
    engine: EngineConfig = dataclasses.field(default_factory=grpo_engine_config)
    """The Stockfish pool every task shares (rewards, opponents, evaluation)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind != "mixture":
            raise ConfigError(f"config key kind must be mixture for this config, got {self.kind!r}")
        engine_limits_unused(self.engine, "each task's own limit keys")
        if self.groups_per_step < 1:
            raise ConfigError(f"config key groups_per_step must be >= 1, got {self.groups_per_step}")
        if self.grpo.pipeline:  # its step joins several tasks' rollouts (train_step), which the pipelined step does not
            raise ConfigError(
                "config key grpo.pipeline: a mixture cannot pipeline its steps (set grpo.pipeline: false)"
            )
        if not self.tasks:
            return  # the defaults alone (the base a config file is read onto); `task_configs` refuses to run without tasks
        names = [task.name for task in self.tasks]
        for index, task in enumerate(self.tasks):
            if not task.name or not task.name.replace("_", "").isalnum():
                raise ConfigError(
                    f"config key tasks[{index}].name must be a non-empty word (letters, digits, _), got {task.name!r}"
                )
            task_kind_class(task.kind, f"tasks[{index}].kind")
            if not (math.isfinite(task.weight) and task.weight >= 0):
                raise ConfigError(f"config key tasks[{index}].weight must be a finite number >= 0, got {task.weight}")
        if len(set(names)) != len(names):
            raise ConfigError(f"config key tasks: task names must differ, got {names}")
        families = sorted({task_kind_class(task.kind, "tasks").family for task in self.tasks})
        if len(families) > 1:
            raise ConfigError(
                f"config key tasks: the tasks share one policy, so they must be of one policy family; got {families} "
                f"({', '.join(f'{task.name}: {task.kind}' for task in self.tasks)})"
            )
        if sum(task.weight for task in self.tasks) <= 0:
            raise ConfigError("config key tasks: the weights sum to 0; give at least one task a positive weight")
        if self.grpo.advantage_estimator == "batch_std":
            raise ConfigError(
                "config key grpo.advantage_estimator: batch_std mixes every row of a step; a mixture centres each task on its own (grpo, dr_grpo or rloo)"
            )
        evaluating: dict[str, list[str]] = {}  # what a task evaluates that one mixture holds once -> its tasks
        for task, config in zip(self.tasks, self.task_configs()):
            for what in task_kind_class(task.kind, "tasks").exclusive_evaluations(config):
                evaluating.setdefault(what, []).append(task.name)
        for what, names in evaluating.items():
            if len(names) > 1:
                raise ConfigError(
                    f"config key tasks: tasks {names} both evaluate {what} (the same files and metrics); keep that evaluation in one task"
                )

    def shared_keys(self) -> list[str]:
        """The keys every task takes from the mixture (loop knobs, init_checkpoint, model, grpo, engine)."""
        shared = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "kind"] + [
            "init_checkpoint",
            "grpo",
            "engine",
        ]
        return shared + (["model"] if self.model is not None else [])

    def task_configs(self) -> list[Any]:
        """Each task's full config: its own keys, and the shared ones from the mixture (ConfigError on a clash)."""
        if not self.tasks:
            raise ConfigError("config key tasks is empty: a mixture needs at least one task")
        shared = self.shared_keys()
        plain = to_dict(self)
        configs: list[Any] = []
        for index, task in enumerate(self.tasks):
            prefix = f"tasks[{index}].config"
            own = task.config if task.config is not None else {}
            if not isinstance(own, dict):
                raise ConfigError(
                    f"config key {prefix}: expected a mapping of the {task.kind} keys, got {type(own).__name__}"
                )
            clash = sorted(set(own) & set(shared) | ({"kind"} & set(own)))
            if clash:
                raise ConfigError(
                    f"config key {prefix}.{clash[0]}: set it on the mixture, not in a task (every task shares it)"
                )
            if "model" in own:
                raise ConfigError(
                    f"config key {prefix}.model: set it on the mixture, not in a task (every task shares the policy)"
                )
            cls = task_kind_class(task.kind, f"tasks[{index}].kind")
            if _sets_key(own, cls.group_count_name):
                raise ConfigError(
                    f"config key {prefix}.{cls.group_count_name}: a mixture's groups per task come from groups_per_step and the weights"
                )
            config_class = cls.config_class
            configs.append(
                from_dict(
                    config_class, {**{key: plain[key] for key in shared}, **own, "kind": task.kind}, prefix=prefix
                )
            )
        return configs

    def default_best_metric(self) -> tuple[str, str] | None:
        for config in self.task_configs():
            metric = config.default_best_metric()
            if metric is not None:
                return metric
        return None


def _endgame_materials(tasks: list[GRPOKind]) -> dict[int, str]:
    """id(task) -> the material of each task that evaluates held-out endgame starts ('KQvK'), in task order."""
    return {
        id(task): task.endgame.material.name
        for task in tasks
        if task.evaluates and getattr(task, "endgame", None) is not None
    }


def draw_task_groups(weights: Sequence[float], groups: int, seed: int, step: int) -> torch.Tensor:
    """The task index of each of step `step`'s `groups` groups: independent draws from the normalised
    `weights`, a function of (seed, step) only."""
    generator = torch.Generator().manual_seed(derived_seed(seed, step, 0x7A5C))
    probabilities = torch.tensor([float(w) for w in weights], dtype=torch.float64)
    return torch.multinomial(probabilities / probabilities.sum(), groups, replacement=True, generator=generator)


def task_step_groups(tasks_of_groups: torch.Tensor, task: int, mine: Sequence[int]) -> StepGroups:
    """Task `task`'s groups of a step: their count, which of them fall in this rank's share `mine` of the
    step's groups, and the global group index that seeds each one's generator."""
    indices = (tasks_of_groups == task).nonzero().flatten().tolist()
    local = [i for i, group in enumerate(indices) if group in mine]
    return StepGroups(len(indices), local, [indices[i] for i in local])


class MixtureKind(GRPOKind):
    """GRPO of one policy on a weighted mixture of tasks (module docstring)."""

    name = "mixture"
    config_class = MixtureTrainConfig
    group_count_name = "groups_per_step"
    supports_pipeline = False  # its step joins several tasks' rollouts (MixtureTrainConfig refuses grpo.pipeline)

    def __init__(self, config: MixtureTrainConfig, context: RunContext):
        super().__init__(config, context)
        configs = config.task_configs()
        # The policy, its frozen reference and the engine pool, built once by the tasks' family.
        shared = task_kind_class(config.tasks[0].kind, "tasks[0].kind").shared_parts(configs, context)
        self.pool = shared.pool
        # The tasks roll out on this rank's groups only; the collectives (the learner's, the metrics')
        # are the mixture's, so a task never waits for a rank that has none of its groups this step.
        local = dataclasses.replace(context, parallel=Parallel())
        self.tasks: list[GRPOKind] = []
        try:
            for task, task_config in zip(config.tasks, configs):
                if context.world_size > 1 and getattr(task_config.task, "supervision", None) == "critic":
                    raise ConfigError(
                        f"config key tasks ({task.name}): critic supervision scales by the whole step's rewards; run it on its own in a data-parallel run"
                    )
                if context.world_size > 1 and getattr(task_config, "curriculum_widen_at", None) is not None:
                    raise ConfigError(
                        f"config key tasks ({task.name}): the adaptive curriculum widens on the whole step's mate rate; run it on its own in a data-parallel run"
                    )
                self.tasks.append(task_kind_class(task.kind, "tasks")(task_config, local, shared))
        except BaseException:
            self.close()
            raise
        self.model = self.tasks[0].model  # every task trains the same module
        self.init_grpo_state(config.grpo)
        self.weights = [task.weight for task in config.tasks]

    # -- the shared policy: every task holds the same module, so the first one answers for it -------

    @property
    def trains_value_head(self) -> bool:
        """The value head trains when any task trains it."""
        return any(getattr(task, "trains_value_head", False) for task in self.tasks)

    def head_parameters(self) -> list[torch.nn.Parameter]:
        return self.tasks[0].head_parameters()

    def frozen_parameters(self, freeze_layers: int) -> list[torch.nn.Parameter]:
        # Frozen when every task freezes it (e.g. the value head stays frozen unless some task trains it).
        kept = [{id(p) for p in task.frozen_parameters(freeze_layers)} for task in self.tasks[1:]]
        return [p for p in self.tasks[0].frozen_parameters(freeze_layers) if all(id(p) in ids for ids in kept)]

    def save_model(self, directory: Path) -> None:
        self.tasks[0].save_model(directory)

    def load_model(self, checkpoint: Path) -> None:
        self.tasks[0].load_model(checkpoint)

    def close(self) -> None:
        for task in getattr(self, "tasks", []):
            task.close()
        if getattr(self, "pool", None) is not None:
            self.pool.close()

    def state_dict(self) -> dict[str, Any]:
        """The mixture's KL controller and each task's own state (e.g. an adaptive curriculum), by task name."""
        return {
            **super().state_dict(),
            "tasks": {item.name: task.state_dict() for item, task in zip(self.config.tasks, self.tasks)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for item, task in zip(self.config.tasks, self.tasks):
            if item.name in state.get("tasks", {}):  # checkpoints written before tasks had state hold none
                task.load_state_dict(state["tasks"][item.name])

    # -- the step -----------------------------------------------------------------------------------

    def group_count(self) -> int:
        return self.config.groups_per_step

    def rollout(self, step: int, groups: StepGroups, sampler: torch.nn.Module | None = None) -> TaskRollout:
        """Draw the task of each of the step's `groups.count` groups, let each task roll out its groups of this rank's
        share `groups.mine` (global indices), and join their rows in the order of their groups (module docstring).
        A mixture samples from the shared `model` only: a `sampler` is refused (`supports_pipeline` is False)."""
        if sampler is not None:
            raise ValueError("kind mixture samples from its shared model only (supports_pipeline is False)")
        config = self.config
        tasks_of_groups = draw_task_groups(self.weights, groups.count, config.run.seed, step)
        mine = groups.mine
        parts: list[TaskRollout] = []
        names: list[str] = []
        row_seeds: list[Sequence[int]] = []
        for index, (item, task) in enumerate(zip(config.tasks, self.tasks)):
            task.learner_model = self.learner_model  # the DDP wrapper in a data-parallel run
            groups = task_step_groups(tasks_of_groups, index, mine)
            if not groups.mine:
                continue
            rollout = task.rollout(step, groups)
            rollout.batch.advantages = compute_advantages(rollout.batch, config.grpo)
            if rollout.row_groups is None:
                raise RuntimeError(
                    f"task {item.name}: its rollout does not say which group each row belongs to (row_groups)"
                )
            parts.append(rollout)
            names.append(item.name)
            row_seeds.append(groups.seeds)
        batch = concat_rollouts([part.batch for part in parts])
        # Rows in the order of their groups' global indices: N processes' rows, rank after rank, are then the
        # one-process rows in the same order, so the seeded minibatches hold the same rows whatever the world size.
        group_of_row = torch.cat(
            [
                torch.as_tensor(list(seeds), dtype=torch.long)[part.row_groups.cpu()]
                for seeds, part in zip(row_seeds, parts)
            ]
        )
        batch = batch.select(torch.sort(group_of_row, stable=True).indices)
        forward = concat_forwards([part.batch for part in parts], [part.forward for part in parts])
        (samples,) = self.context.parallel.sum([int(batch.mask.sum())])
        return TaskRollout(
            batch,
            forward,
            self._task_metrics(names, parts, tasks_of_groups),
            samples=int(samples),
            rollout_s=sum(part.rollout_s for part in parts),
            minibatch_terms=self._minibatch_terms(step),
        )

    def _minibatch_terms(self, step: int) -> Callable[[], torch.Tensor] | None:
        """Every task's minibatch-wide losses (e.g. value and bc on labelled positions), whether or not this rank
        plays any of its groups this step: the ranks then draw the same positions and use the same parameters."""
        terms = [term for term in (task.minibatch_terms(step) for task in self.tasks) if term is not None]
        if not terms:
            return None
        return lambda: sum((term() for term in terms[1:]), terms[0]())

    def _task_metrics(
        self, names: list[str], parts: list[TaskRollout], tasks_of_groups: torch.Tensor
    ) -> dict[str, float]:
        """Every task's metrics as ``<group>/<task>/<metric>``; entropy, KL and phase times over all its rows."""
        metrics: dict[str, float] = {}
        for index, item in enumerate(self.config.tasks):
            metrics[f"rollout/task/{item.name}"] = float((tasks_of_groups == index).float().mean())
        weights = [float(part.batch.mask.sum()) for part in parts]
        for name, part in zip(names, parts):
            for key, value in part.metrics.items():
                group, _, rest = key.partition("/")
                metrics[f"{group}/{name}/{rest}"] = value
        for key in ("entropy/mean", "entropy/ln_legal", "kl/exact"):
            pairs = [(part.metrics[key], w) for part, w in zip(parts, weights) if key in part.metrics]
            if pairs:
                metrics[key] = sum(v * w for v, w in pairs) / max(sum(w for _, w in pairs), 1e-9)
        for key in ("perf/sample_s", "perf/reward_s", "perf/engine_searches"):
            metrics[key] = sum(part.metrics.get(key, 0.0) for part in parts)
        return metrics

    # -- evaluation ---------------------------------------------------------------------------------

    @property
    def evaluates(self) -> bool:
        return any(task.evaluates for task in self.tasks)

    def evaluate(self, step: int, out_dir: Path) -> dict[str, float]:
        """Every task's held-out evaluation of the shared policy (at most one evaluates held-out positions).

        Endgame tasks on several materials (a network carried from KQvK to KBNvK) are each evaluated on their own
        held-out starts, once per material: metrics `eval/<material>/...` and files in out_dir/<material>/; the
        first material's also stay unprefixed (`eval/mate_rate`: the progress bar, the best checkpoint)."""
        metrics: dict[str, float] = {}
        materials = _endgame_materials(self.tasks)
        several, first = len(set(materials.values())) > 1, next(iter(materials.values()), None)
        seen: set[str | None] = set()
        for task in self.tasks:
            material = materials.get(id(task))
            if (
                not task.evaluates or material in seen
            ):  # the first task of a material evaluates it (same seed, same starts)
                continue
            if material is not None:
                seen.add(material)
            if material is None or not several:
                metrics.update(task.evaluate(step, out_dir))
                continue
            (out_dir / material).mkdir(parents=True, exist_ok=True)
            result = task.evaluate(step, out_dir / material)
            metrics.update({f"eval/{material}/{key.removeprefix('eval/')}": value for key, value in result.items()})
            if material == first:
                metrics.update(result)
        return metrics

    # -- presentation -------------------------------------------------------------------------------

    def progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        return postfix(
            row,
            (
                ("reward/mean", "reward", ".3f"),
                ("perf/samples_per_s", "sps", ".0f"),
                ("eval/esl", "heldout_esl", ".3f"),
                ("eval/mate_rate", "heldout_mate", ".3f"),
            ),
        )

    def eval_line(self, step: int, row: dict[str, Any]) -> str | None:
        return self.tasks[0].eval_line(step, row)  # the tasks of one family print the same line

    def after_run(self, out_dir: Path) -> None:
        for task in self.tasks:
            task.after_run(out_dir)

    def summary(self) -> list[str]:
        lines: list[str] = []
        for task in self.tasks:
            lines += [line for line in task.summary() if line not in lines]
        return lines
