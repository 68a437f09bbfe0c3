"""`kind: rookworld`: GRPO on text for the chess language model (the P: policy and A: environment tasks).

One step (`RookWorldKind.rollout`, then the step every GRPO kind shares, `train.kind.GRPOKind.learn`):

1. **prompts**: B prompts from the dataset's train split, round(B * policy_fraction) P: prompts
   and the rest A: prompts, drawn without replacement as a function of (seed, step), so a
   resumed run sees what a straight run would (each data-parallel rank takes its share of them);
2. **sample**: G completions per prompt from the current model at the rollout temperature
   (`tasks.lm_rollout.sample_completion_groups`: batched, left-padded, KV cache, temperature only);
   the behaviour and reference log-probs and the exact per-token entropy are then computed by
   `models.lm.completion_log_probs` on the finished sequences;
3. **reward**: the run's rewards (`task.rewards`, `tasks.lm_rewards.ROOKWORLD_REWARDS`; by default each prompt
   by its own task's grader of `data.rookworld_grading`: the engine pool with its cache for P:, python-chess
   for A:), a completion's reward the weighted sum of those that grade it, each reward and its components
   logged by name, malformed completions at the configured penalty;
4. **learn**: `rl.optimize` with L = completion tokens and their mask: token-level (or GSPO
   sequence-level) ratios against the behaviour log-probs, the chosen aggregation, KL to the frozen
   SFT reference (the exact per-token KL over the vocabulary by default, fixed/warmup/adaptive coefficient), the first-minibatch ratio
   check; each optimizer update through the loop's `Learner` (clipping at the top-level
   `max_grad_norm`). Reward normalisation: `grpo.advantage_estimator` (``batch_std`` = batch-level).
   Memory (docs/lm_124m.md): every log-prob forward runs `task.logprob_chunk_rows` rows at a time
   and the learner `grpo.micro_batch_size` rows per backward (gradient accumulation, the same
   gradient); with ``grpo.entropy_coef: 0`` the learner's entropy is a metric without gradient.

``task.stop_after_move`` (issue 66) ends each P: completion once its move-first ``B: <move>`` is complete
(`data.rookworld_format.MoveStop`), for a model trained on ``data rookworld layout=move_first`` lines (the
dataset's manifest must say so): the completion the learner scores is then the move, and the held-out
evaluation stops the same way.

Issue 66's GRPO run (docs/rookworld_reward.md, "Binary reward, dynamic sampling, fresh prompts"):
``task.rewards: {dtz_optimal: 1}`` pays 1 for a DTZ-optimal B: move and 0 for anything else;
``task.dynamic_sampling`` drops the groups without reward spread and draws more (up to ``task.max_resample_rounds``
extra rounds, each group seeded by its own index beyond the step's first ``prompts_per_step``);
``task.fresh_endgames: KQvK`` draws the P: prompts as fresh won positions of that material, none in the data (nor an
image of one); ``eval.endgame_positions: 2000`` then evaluates on that many held-out won positions of it, disjoint with
all their images from every draw and from the data.

``task.prompt_bos`` puts the tokenizer's BOS before every prompt (sampling and evaluation), as
upstream RookWorld-LM was trained. The reference is the starting model, frozen; the policy is its copy. Both run with every dropout
off and in eval mode (`models.lm.prepare_for_rl`), whatever the model config says
(docs/architecture.md, invariant 2). With ``bf16: true`` the sampling and learner forwards run under bf16 autocast
(log-probs stay fp32) and the ratio check uses its bf16 tolerance.

Evaluation (cadence: the loop's `eval_every` / `eval_at_start`) is the code of `chessgrpo eval lm`
(`eval.lm.evaluate_lm`): the greedy model on the same held-out P: positions, A: prompts and
puzzles every time, written to RUN_DIR/eval/step_NNNNNN_lm.json. When the run reaches its last
step, the paired difference last - first of those files (`eval.lm.compare_lm_results`, across
resumes too) is logged and written to RUN_DIR/eval/paired_first_last.json (`after_run`).

Checkpoints hold the model (a `save_pretrained` directory, `models.lm.save_lm`); the kind's own
resumable state is the KL controller (sampling is seeded by (seed, step, group)).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chessgrpo.board.endgames import EndgameStarts
from chessgrpo.config import ConfigError
from chessgrpo.data.fresh_endgames import fresh_draw, held_out_endgame_fens
from chessgrpo.data.rookworld_format import MoveStop, policy_prompt
from chessgrpo.data.rookworld_grading import shared_tablebase
from chessgrpo.errors import InputError
from chessgrpo.eval.registry import EVALUATIONS, extra_evaluations, run_at_step  # result files, running
from chessgrpo.eval.running import EvalContext, Subject
from chessgrpo.files import write_json_atomic
from chessgrpo.models.lm import (
    ChessLM,
    build_lm,
    lm_frozen_parameters,
    lm_head_parameters,
    load_lm,
    prepare_for_rl,
    save_lm,
)
from chessgrpo.models.placement import place_reference
from chessgrpo.models.prompt_bos import with_prompt_bos
from chessgrpo.tasks.kinds.rookworld_config import RookWorldTrainConfig, check_data_layout, check_data_prompts
from chessgrpo.tasks.lm_rewards import ROOKWORLD_REWARDS
from chessgrpo.tasks.lm_rollout import (
    CompletionGroups,
    make_forward,
    sample_completion_groups,
    select_groups,
    to_rollout_batch,
)
from chessgrpo.tasks.reward_registry import combine, reward_metrics
from chessgrpo.train.distributed import group_generators
from chessgrpo.train.kind import GRPOKind, RunContext, SharedParts, StepGroups, TaskRollout, interval_text, postfix

logger = logging.getLogger(__name__)

PAIRED_FILE = "paired_first_last.json"
"""The paired last - first comparison `after_run` writes under RUN_DIR/eval/."""


class RookWorldKind(GRPOKind):
    """Text GRPO of a `ChessLM` on the RookWorld tasks (module docstring). `model` is ``lm.model``."""

    name = "rookworld"
    config_class = RookWorldTrainConfig
    group_count_name = "task.prompts_per_step"
    family = "chess_lm"
    # grpo.pipeline: the LM samples through its `ChessLM` (tokenizer, generation and KV cache around `lm.model`), which
    # a snapshot of the weights alone does not give: its steps run serially.
    supports_pipeline = False

    @classmethod
    def shared_parts(cls, configs: Sequence[Any], context: RunContext) -> SharedParts:
        """What a mixture of rookworld tasks shares: the LM and its frozen reference (built from the
        mixture's init_checkpoint / model) and one engine pool (P: rewards and evaluation)."""
        from chessgrpo.engine import EnginePool

        lm, reference_model = _lm_pair(configs[0], context.device)
        return SharedParts(model=lm, reference=reference_model, pool=EnginePool.from_config(configs[0].engine))

    def __init__(self, config: RookWorldTrainConfig, context: RunContext, shared: SharedParts | None = None):
        from chessgrpo.data.rookworld import read_rookworld
        from chessgrpo.engine import EnginePool

        super().__init__(config, context, shared)
        check_data_layout(config)
        if config.task.shuffle_rewards and (context.world_size > 1 or shared is not None):
            raise ConfigError(
                "config key task.shuffle_rewards: the placebo permutes a whole step's rewards, which a data-parallel run "
                "or a task mixture splits: set it false or run one process on its own"
            )
        if config.task.dynamic_sampling and (context.world_size > 1 or shared is not None):
            raise ConfigError(
                "config key task.dynamic_sampling: a data-parallel run or a task mixture cannot resample its groups "
                "(every rank would need every rank's rewards): set it false or run one process on its own"
            )
        train = read_rookworld(config.data, "train")
        test = read_rookworld(config.data, "test")
        self.endgames = _fresh_endgames(config) if config.task.fresh_endgames else None
        """The fresh P: prompts' stream (`task.fresh_endgames`), None = P: prompts from the train split."""
        self.policy_prompts = [e.prompt for e in train if e.task == "policy"]
        self.environment_prompts = [e.prompt for e in train if e.task == "environment"]
        n_policy, n_environment = config.task.split()
        for label, prompts, wanted in (
            ("P:", self.policy_prompts, n_policy),
            ("A:", self.environment_prompts, n_environment),
        ):
            if wanted and not prompts and not (label == "P:" and self.endgames is not None):
                raise ConfigError(
                    f"config key data: {config.data!r} has no {label} train prompts but the task mix asks for {wanted} per step"
                )
        self.eval_policy_fens = [e.fen for e in test if e.task == "policy"][: config.eval.policy_prompts]
        self.endgame_held_out = bool(config.eval.endgame_positions)
        if self.endgames is not None and config.eval.endgame_positions:
            self.eval_policy_fens = held_out_endgame_fens(
                self.endgames, config.eval.endgame_positions, seed=config.eval.endgame_seed
            )
        self.eval_environment_prompts = [e.prompt for e in test if e.task == "environment"][
            : config.eval.environment_prompts
        ]

        if shared is not None:
            self.lm, self.reference_model = shared.model, shared.reference
        else:
            self.lm, self.reference_model = _lm_pair(config, context.device)
        check_data_prompts(config, self.lm.policy_prompt)
        self.model = self.lm.model
        # Sampling and evaluation encode prompts through this view (task.prompt_bos: BOS first).
        self.prompt_lm = with_prompt_bos(self.lm, config.task.prompt_bos)
        limit = self.lm.max_positions
        longest = max(
            len(self.prompt_lm.tokenizer.encode(p))
            for p in self.policy_prompts[:2000] + self.environment_prompts[:2000]
        )
        if limit is not None and longest + config.task.max_new_tokens > limit:
            raise ConfigError(
                f"config key task.max_new_tokens={config.task.max_new_tokens} + the longest prompt ({longest} tokens) "
                f"exceeds the model's {limit} positions"
            )

        self.init_grpo_state(config.grpo)
        self.rewards = config.weighted_rewards()
        if shared is not None:
            self.pool = shared.pool
        else:
            # The pool starts when a reward's record needs it, or for the held-out P: grading with an engine truth.
            eval_needs_pool = config.rewards.policy.truth == "engine" and bool(self.eval_policy_fens)
            needs_pool = "pool" in ROOKWORLD_REWARDS.needs_of(self.rewards, config) or eval_needs_pool
            self.pool = EnginePool.from_config(config.engine) if needs_pool else None
        self._eval_items: dict[str, Any] = {}  # the held-out items of the registry's evaluations, loaded once
        self.paired: dict[str, Any] | None = None
        """The paired last - first comparison once `after_run` made it (the content of PAIRED_FILE)."""
        self._paired_lines: list[str] = []

    def close(self) -> None:
        if self.pool is not None and self.shared is None:  # a mixture closes the pool it shares
            self.pool.close()

    # -- optimisation ------------------------------------------------------------------------------

    def head_parameters(self) -> list[torch.nn.Parameter]:
        return lm_head_parameters(self.model, self.config.head_lr)

    def frozen_parameters(self, freeze_layers: int) -> list[torch.nn.Parameter]:
        return lm_frozen_parameters(self.model, freeze_layers)

    # -- the step -----------------------------------------------------------------------------------

    def draw_prompts(self, step: int, count: int | None = None, resample_round: int = 0) -> list[str]:
        """The `count` prompts of `step` (default `task.prompts_per_step`; P: first, then A:, split by
        `task.policy_fraction`), a function of (seed, step) (every rank draws all of them); `resample_round` > 0:
        dynamic sampling's extra draw of that round, a function of (seed, step, round). With
        ``task.fresh_endgames`` the P: prompts are fresh won positions (`data.fresh_endgames.fresh_draw`, rank = the round)."""
        n_policy, n_environment = self.config.task.split(count)
        seed = self.config.run.seed
        rng = np.random.default_rng([seed, step] if resample_round == 0 else [seed, step, resample_round])
        prompts = []
        if self.endgames is not None and n_policy:
            boards = fresh_draw(
                self.endgames,
                shared_tablebase(self.config.rewards.policy.syzygy_path),
                n_policy,
                seed=seed,
                step=step,
                rank=resample_round,
                clocks=self.config.task.fresh_endgame_clocks,
            )
            prompts += [policy_prompt(board.fen(), self.lm.policy_prompt) for board in boards]
            n_policy = 0
        for pool, count in ((self.policy_prompts, n_policy), (self.environment_prompts, n_environment)):
            if count:
                chosen = rng.choice(len(pool), count, replace=count > len(pool))
                prompts += [pool[int(i)] for i in chosen]
        return prompts

    def _learner_forward(self, temperature: float) -> Any:
        """`tasks.lm_rollout.make_forward` of the policy, under bf16 autocast when the run asks for it."""
        forward = make_forward(
            self.learner_model,
            temperature=temperature,
            chunk_rows=self.config.task.logprob_chunk_rows,
            entropy_grad=self.config.grpo.entropy_coef > 0,
            reference=self.reference_model if self.config.grpo.exact_kl_term else None,
        )
        if not self.context.bf16:
            return forward

        def autocast_forward(minibatch: Any) -> Any:
            with self.context.autocast():
                return forward(minibatch)

        return autocast_forward

    def group_count(self) -> int:
        return self.config.task.prompts_per_step

    @classmethod
    def exclusive_evaluations(cls, config: RookWorldTrainConfig) -> tuple[str, ...]:
        held_out = config.eval.policy_prompts or config.eval.environment_prompts or config.eval.puzzles
        return ("the chess LM's held-out tasks",) if held_out else ()

    def rollout(self, step: int, groups: StepGroups, sampler: torch.nn.Module | None = None) -> TaskRollout:
        """Sample G completions for each of this rank's prompts of the step and reward them (P: by the
        engine, A: by python-chess); the learning is the GRPO step every kind shares (`GRPOKind.learn`).
        Always from `model` (`supports_pipeline` is False): a `sampler` is refused."""
        if sampler is not None:
            raise ValueError("kind rookworld samples from its own model only (supports_pipeline is False)")
        task, context = self.config.task, self.context
        stats_before = dataclasses.replace(self.pool.stats) if self.pool is not None else None

        if task.dynamic_sampling:
            completions, graded, totals, sample_s, reward_s, extra = self._dynamic_rollout(step, groups.count)
        else:
            tick = time.perf_counter()
            drawn = self.draw_prompts(step, groups.count)
            prompts = [drawn[i] for i in groups.mine]
            draw_s = time.perf_counter() - tick
            completions, graded, totals, sample_s, reward_s = self._sample_and_grade(step, prompts, groups.seeds)
            sample_s += draw_s  # perf/sample_s counted the draw before dynamic sampling existed
            extra = {}
        prompts = completions.prompts
        rewards = torch.tensor(totals, dtype=torch.float32)
        if task.shuffle_rewards:  # the placebo: each row learns from another row's reward (seeded by the step)
            order = torch.randperm(
                len(rewards), generator=torch.Generator().manual_seed(context.seed * 1_000_003 + step)
            )
            rewards = rewards[order]
        batch = to_rollout_batch(completions, rewards.to(context.device))
        metrics = self._rollout_metrics(completions, graded, groups.count, stats_before)
        metrics.update({"perf/sample_s": sample_s, "perf/reward_s": reward_s, **extra})
        row_groups = torch.arange(len(prompts)).repeat_interleave(task.group_size)  # rows are prompt-major
        # every rank's completions: the ranks step together
        return TaskRollout(
            batch,
            self._learner_forward(task.temperature),
            metrics,
            samples=int(extra.get("rollout/groups_drawn", groups.count)) * task.group_size,
            rollout_s=sample_s + reward_s,
            row_groups=row_groups,
        )

    def _sample_and_grade(
        self, step: int, prompts: list[str], seeds: Sequence[int] | range
    ) -> tuple[CompletionGroups, dict[str, list], list[float], float, float]:
        """G completions of each prompt (group i's sampling seeded by (seed, step, seeds[i])), each graded by the
        run's rewards: (completions, grades by reward name, each row's weighted total, sample_s, reward_s)."""
        config, task, context = self.config, self.config.task, self.context
        tick = time.perf_counter()
        with context.autocast():
            completions = sample_completion_groups(
                self.prompt_lm,
                prompts,
                task.group_size,
                temperature=task.temperature,
                max_new_tokens=task.max_new_tokens,
                generator=group_generators(context.seed, step, seeds, context.device),
                reference=self.reference_model,
                chunk_rows=task.logprob_chunk_rows,
                stop=MoveStop(self.prompt_lm.tokenizer.decode) if task.stop_after_move else None,
            )
        sample_s = time.perf_counter() - tick

        tick = time.perf_counter()
        row_prompts = completions.row_prompts()
        # Each reward of the run grades the rows it grades; a row's reward is the weighted sum of its grades.
        graded = {
            item.name: item.reward.function(self.pool, row_prompts, completions.texts, config.rewards)
            for item in self.rewards
        }
        totals = []
        for row, prompt in enumerate(row_prompts):
            grades = [(item.weight, graded[item.name][row]) for item in self.rewards]
            parts = [(weight, grade.total) for weight, grade in grades if grade is not None]
            if not parts:
                raise ValueError(
                    f"no reward of task.rewards {list(config.task.weights)} grades the prompt {prompt[:40]!r}"
                )
            totals.append(combine(parts))
        return completions, graded, totals, sample_s, time.perf_counter() - tick

    def _dynamic_rollout(
        self, step: int, count: int
    ) -> tuple[CompletionGroups, dict[str, list], list[float], float, float, dict[str, float]]:
        """DAPO dynamic sampling (``task.dynamic_sampling``): round 0 is the step's `count` groups; each later round
        draws as many new prompts as groups with reward spread are still missing (`draw_prompts` of that round, group
        j of round r seeded by the global index r * count + j, so a resumed run reproduces it), until `count` groups
        have spread or ``task.max_resample_rounds`` extra rounds were drawn. The groups kept are the first ones with
        spread in draw order (all of round 0 when none has any). Returns `_sample_and_grade`'s values over the kept
        groups and the metrics: ``rollout/frac_reward_zero_std`` over every group drawn (before dropping),
        ``rollout/groups_drawn``, ``rollout/groups_kept``, ``rollout/resample_rounds``, ``rollout/resample_short``
        (1 when the cap left the step short)."""
        size = self.config.task.group_size
        parts: list[tuple[CompletionGroups, dict[str, list], list[float]]] = []
        keep: list[tuple[int, int]] = []
        sample_s = reward_s = 0.0
        drawn = flat = 0
        for resample_round in range(self.config.task.max_resample_rounds + 1):
            missing = count - len(keep)
            if missing == 0:
                break
            prompts = self.draw_prompts(step, missing, resample_round)
            seeds = range(resample_round * count, resample_round * count + missing)
            completions, graded, totals, sampled, rewarded = self._sample_and_grade(step, prompts, seeds)
            sample_s, reward_s = sample_s + sampled, reward_s + rewarded
            parts.append((completions, graded, totals))
            for group in range(missing):
                values = totals[group * size : (group + 1) * size]
                if max(values) > min(values):
                    keep.append((len(parts) - 1, group))
                else:
                    flat += 1
            drawn += missing
        kept, short = len(keep), len(keep) < count
        if short:
            logger.info("step %d: dynamic sampling found %d of %d groups with reward spread", step, len(keep), count)
        if not keep:  # nothing to learn from but the KL term: the step's own groups, as without dynamic sampling
            keep = [(0, group) for group in range(count)]
        metrics = {
            "rollout/frac_reward_zero_std": flat / drawn,
            "rollout/groups_drawn": float(drawn),
            "rollout/groups_kept": float(kept),
            "rollout/resample_rounds": float(len(parts) - 1),
            "rollout/resample_short": float(short),
            # reward/* cover the kept groups, which exclude the all-right and all-wrong ones: this is the policy's rate.
            "rollout/reward_mean_drawn": float(np.mean([total for part in parts for total in part[2]])),
        }
        rows = [(part, group * size + i) for part, group in keep for i in range(size)]
        graded = {name: [parts[part][1][name][row] for part, row in rows] for name in parts[0][1]}
        totals = [parts[part][2][row] for part, row in rows]
        return select_groups([p[0] for p in parts], keep), graded, totals, sample_s, reward_s, metrics

    def _rollout_metrics(self, groups: Any, graded: dict[str, list], count: int, stats_before: Any) -> dict[str, float]:
        """The rollout's metrics: completion lengths, malformed rate, each reward by name over the rows it graded (its
        mean and std, its total, malformed rate and components), the engine's work."""
        mask = groups.generation.completion_mask
        lengths = groups.generation.lengths.float()
        rollout_entropy = float(groups.entropy[mask].mean())
        rows = len(groups.texts)
        metrics: dict[str, float] = {
            "entropy/rollout": rollout_entropy,
            "entropy/mean": rollout_entropy,  # the sampling policy's, as every kind logs it (the entropy early stop)
            "rollout/completion_tokens": float(lengths.mean()),
            "rollout/completion_tokens_max": float(lengths.max()),
            "rollout/truncated_frac": float((~groups.generation.finished).float().mean()),
            # A row is malformed when a reward that grades it could not parse it.
            "rollout/malformed_rate": sum(
                any(g[row] is not None and g[row].malformed is not None for g in graded.values()) for row in range(rows)
            )
            / rows,
            "rollout/prompts": float(count),
        }
        for name, grades in graded.items():
            scored = [r for r in grades if r is not None]
            if not scored:  # a reward of another text task than this step's prompts
                continue
            metrics.update(reward_metrics(name, [r.total for r in scored]))
            metrics[f"reward/{name}_total"] = sum(r.total for r in scored) / len(scored)
            metrics[f"reward/{name}_malformed_rate"] = sum(r.malformed is not None for r in scored) / len(scored)
            # Each component over the rows that report it (eval_error, the regrets: only where measurable).
            for component in dict.fromkeys(key for r in scored for key in r.components):
                values = [r.components[component] for r in scored if component in r.components]
                metrics[f"reward/{name}_{component}"] = sum(values) / len(values)
        if self.pool is not None and stats_before is not None:
            stats = self.pool.stats
            lookups = (stats.cache_hits - stats_before.cache_hits) + (stats.cache_misses - stats_before.cache_misses)
            metrics["perf/engine_searches"] = float(stats.searches - stats_before.searches)
            metrics["perf/cache_hit_rate"] = (stats.cache_hits - stats_before.cache_hits) / lookups if lookups else 0.0
        return metrics

    # -- evaluation ---------------------------------------------------------------------------------

    @property
    def evaluates(self) -> bool:
        return bool(self._lm_held_out or self.config.eval.extra)

    @property
    def _lm_held_out(self) -> bool:
        """Whether the LM's own held-out evaluation has anything to answer (P:/A: prompts, puzzles)."""
        return bool(self.eval_policy_fens or self.eval_environment_prompts or self.config.eval.puzzles)

    def evaluate(self, step: int, out_dir: Path) -> dict[str, float]:
        """Greedy held-out evaluation (flat ``eval/`` metrics) through the registry (`eval.lm.run_lm`), and the
        evaluations of ``eval.extra``; writes out_dir/step_NNNNNN_lm.json (and one file per extra)."""
        from chessgrpo.eval.lm import LMEvalConfig

        config, seed = self.config.eval, self.config.run.seed
        subject = Subject(model=self.prompt_lm, name=f"{self.context.run_dir} step {step}")
        context = EvalContext(pool=self.pool, items=self._eval_items)
        metrics: dict[str, float] = {}
        if self._lm_held_out:
            lm = LMEvalConfig(
                data=self.config.data,
                policy_prompts=config.policy_prompts,
                environment_prompts=config.environment_prompts,
                puzzles=config.puzzles,
                max_puzzles=config.max_puzzles,
                rewards=self.config.rewards,
                engine=self.config.engine,
                max_new_tokens=self.config.task.max_new_tokens,
                batch_size=config.batch_size,
                prompt_bos=self.config.task.prompt_bos,
                stop_after_move=self.config.task.stop_after_move,
                seed=seed,
                resamples=config.resamples,
            )
            if self.endgame_held_out:
                # eval.endgame_positions: the held-out won positions instead of the test split's P: positions, recorded
                # in the step file's config as `chessgrpo eval lm` names the same set.
                lm.policy_prompts = len(self.eval_policy_fens)
                lm.endgame_positions = config.endgame_positions
                lm.endgame_material = self.config.task.fresh_endgames
                lm.endgame_colours = self.config.task.fresh_endgame_colours
                lm.endgame_seed = config.endgame_seed
            if self.endgame_held_out and "lm" not in self._eval_items:
                from chessgrpo.eval.lm import load_lm_items

                items = load_lm_items(dataclasses.replace(lm, policy_prompts=0, endgame_positions=0))
                items.policy_fens = list(self.eval_policy_fens)  # built once at start-up, the same set
                self._eval_items["lm"] = items
            # Its items (the first N prompts of the test split, the puzzles) are loaded once and kept in _eval_items.
            metrics.update(run_at_step("lm", lm, subject, context, eval_dir=out_dir, step=step))
        for name, extra in extra_evaluations(config.extra).items():
            metrics.update(run_at_step(name, extra, subject, context, eval_dir=out_dir, step=step))
        return metrics

    def after_run(self, out_dir: Path) -> None:
        """Paired last - first difference of this run directory's evaluations (also across resumes)."""
        from chessgrpo.eval.lm import compare_lm_results

        files = EVALUATIONS["lm"].step_files(out_dir)
        if len(files) < 2:
            return
        first, last = json.loads(files[0].read_text()), json.loads(files[-1].read_text())
        diffs = compare_lm_results(first, last, resamples=self.config.eval.resamples, seed=self.config.run.seed)
        self.paired = {
            "a": files[0].name,
            "b": files[-1].name,
            "differences": {k: v.to_json() for k, v in diffs.items()},
        }
        write_json_atomic(out_dir / PAIRED_FILE, self.paired)
        self._paired_lines = [f"paired held-out {files[0].name} -> {files[-1].name} ({out_dir / PAIRED_FILE}):"]
        for name, interval in diffs.items():
            logger.info("held-out %s, %s -> %s: %s", name, files[0].name, files[-1].name, interval.format(4))
            self._paired_lines.append(f"  {name}: {interval.format(4)}")

    # -- state --------------------------------------------------------------------------------------

    def save_model(self, directory: Path) -> None:
        save_lm(self.lm, directory)

    def load_model(self, checkpoint: Path) -> None:
        self.model.load_state_dict(load_lm(checkpoint, device=self.context.device).model.state_dict())
        prepare_for_rl(self.model)  # still dropout off, eval mode

    # -- presentation -------------------------------------------------------------------------------

    def progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        return postfix(
            row,
            (
                ("reward/mean", "reward", ".3f"),
                ("rollout/malformed_rate", "malformed", ".2f"),
                ("perf/samples_per_s", "sps", ".1f"),
                ("eval/p_reward", "heldout_p_reward", ".3f"),
            ),
        )

    def eval_line(self, step: int, row: dict[str, Any]) -> str | None:
        parts = []
        if "eval/p_format_rate" in row:
            text = f"P: format {interval_text(row, 'eval/p_format_rate')}"
            for key, label in (
                ("eval/p_best_accuracy", "best"),
                ("eval/p_best_accuracy_well_formed", "best (well-formed)"),
                ("eval/p_reward", "reward"),
            ):
                if key in row:
                    text += f", {label} {interval_text(row, key)}"
            parts.append(text)
        if "eval/a_format_rate" in row:
            text = f"A: format {interval_text(row, 'eval/a_format_rate')}"
            if "eval/a_exact_state_accuracy" in row:
                text += f", exact state {interval_text(row, 'eval/a_exact_state_accuracy')}"
            parts.append(text)
        if "eval/puzzle_first_move_accuracy" in row:
            parts.append(f"puzzles {interval_text(row, 'eval/puzzle_first_move_accuracy')}")
        return f"step {step}: " + "; ".join(parts) if parts else None

    def summary(self) -> list[str]:
        lines = [
            f"model: {self.lm.source} ({self.lm.num_parameters():,} parameters); data: {self.config.data} "
            f"({len(self.policy_prompts)} P: / {len(self.environment_prompts)} A: train prompts)"
        ]
        if self.endgames is not None:
            lines.append(
                f"P: prompts: fresh won {self.endgames.material.name} positions (none of the data's, nor an image); "
                f"held-out: {len(self.eval_policy_fens)} P: positions"
            )
        return lines + self._paired_lines


def _lm_pair(config: RookWorldTrainConfig, device: torch.device) -> tuple[ChessLM, torch.nn.Module]:
    """(trainable LM, frozen reference model placed for calls from the policy's device): the reference is
    the starting model (init_checkpoint, else model.path, else a fresh `model`); the LM is its copy. Both
    run with every dropout off and in eval mode (invariant 2)."""
    start = config.init_checkpoint or config.model.path  # model.path: the same, for symmetry with kind: sft
    if start:
        reference = load_lm(start, device=device)
    else:
        reference = build_lm(config.model, seed=config.run.seed)
        reference.model.to(device)
    prepare_for_rl(reference.model).requires_grad_(False)
    lm = ChessLM(copy.deepcopy(reference.model), reference.tokenizer, reference.source, reference.policy_prompt)
    prepare_for_rl(lm.model).requires_grad_(True)  # dropout off, eval mode (invariant 2)
    # The frozen reference may sit on its own device (reference_device), called from the policy's.
    return lm, place_reference(reference.model, device, config.reference_device)


def _fresh_endgames(config: RookWorldTrainConfig) -> EndgameStarts:
    """The stream of `task.fresh_endgames` positions (`data.fresh_endgames.fresh_endgame_starts`): won for the side
    to move by the tables at ``rewards.policy.syzygy_path``, never a P: position of the data nor an image of one."""
    from chessgrpo.data.fresh_endgames import fresh_endgame_starts

    material = config.task.fresh_endgames
    assert material is not None
    try:
        tablebase = shared_tablebase(config.rewards.policy.syzygy_path)
        return fresh_endgame_starts(config.data, material, tablebase, colours=config.task.fresh_endgame_colours)
    except (InputError, FileNotFoundError) as error:
        raise ConfigError(f"config key task.fresh_endgames={material!r}: {error}") from None
