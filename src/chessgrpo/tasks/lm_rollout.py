"""GRPO on text: groups of sampled completions of a chess LM, as rollout rows, and the learner's forward.

- `RookWorldTaskConfig`: what a group is (the `task:` section of a `kind: rookworld` config);
- `sample_completion_groups`: G completions per prompt (`models.lm_generation.generate`: batched, left-padded,
  KV cache, temperature only), then the behaviour (and reference) log-probs and the exact per-token
  entropy from `models.lm.completion_log_probs` on the finished sequences;
- `to_rollout_batch`: the B * G completions as `rl.RolloutBatch` rows (L tokens, mask through EOS);
- `make_forward`: the learner's forward, the same `completion_log_probs` at the same temperature.

Nothing here knows the RookWorld rewards (`data.rookworld_grading`) or the prompts' format.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from chessgrpo.models.lm import ChessLM, completion_log_probs, completion_log_probs_and_kl
from chessgrpo.models.lm_generation import Generation, StopRule, generate
from chessgrpo.rl import PolicyOutputs, RolloutBatch, eval_mode_forward
from chessgrpo.rl.learner import Forward
from chessgrpo.tasks.reward_registry import check_weights


@dataclasses.dataclass
class RookWorldTaskConfig:
    """What a group is (the `task:` section of a `kind: rookworld` config)."""

    group_size: int = 8
    """G: completions sampled per prompt."""
    prompts_per_step: int = 16
    """B: prompts per step; a step learns from B * G completions."""
    policy_fraction: float = 0.8
    """Share of the B prompts that are P: prompts (round(B * fraction)); the rest are A: prompts."""
    temperature: float = 1.0
    """Sampling temperature; the learner, old policy and reference use the same one (invariant 1)."""
    max_new_tokens: int = 192
    """Longest completion in tokens (a P: completion is <= ~160 characters, an A: one <= ~100)."""
    logprob_chunk_rows: int = dataclasses.field(default=0, metadata={"resumable": True})  # memory, not math
    """Rows per forward when the behaviour, reference and learner log-probs and entropies are computed
    (`models.lm.completion_log_probs` ``chunk_rows``; 0 = all rows at once). Bounds the [rows, L,
    vocab] temporaries: ~35 MB per row and copy for GPT-2's vocabulary at L = 176. The learner's
    gradient memory is bounded by `grpo.micro_batch_size` instead."""
    rewards: dict[str, float] | None = None
    """The rewards a completion is trained on, {name: weight} (names of `tasks.lm_rewards.ROOKWORLD_REWARDS` or a
    user's TRL-style ``module:function``): a completion's reward is the weighted sum of those that grade it, each
    logged as reward/<name>. null = {policy: 1, environment: 1}: each prompt graded by its own task."""
    prompt_bos: bool = False
    """Put the tokenizer's BOS token (GPT-2: ``<|endoftext|>``, also its EOS) before every prompt, as
    the upstream RookWorld data did before every sample; for models trained that way (e.g. a
    downloaded RookWorld-LM-124M). Off for models fine-tuned here without it (`kind: sft` key
    ``prompt_bos`` must match). Applies to sampling and evaluation alike."""
    stop_after_move: bool = False
    """Stop each P: completion once its move-first ``B: <move>`` is complete (`data.rookworld_format.MoveStop`),
    so the completion the learner scores is the move alone (issue 66): for a model trained on
    ``data rookworld layout=move_first`` lines (the dataset must record that layout). A completion that starts
    otherwise (an A: answer, a rookworld-layout P: answer) runs to EOS as before; the held-out evaluation stops
    the same way (`eval.lm.LMEvalConfig.stop_after_move`)."""
    fresh_endgames: str | None = None
    """A material signature (e.g. ``KQvK``): each step's P: prompts are fresh positions of it won for the side to move
    (`board.endgames.EndgameStarts`, one tablebase probe each, tables at ``rewards.policy.syzygy_path``), never a
    position of the data's train or test split nor any rotation or mirror image of one, nor of the held-out set
    (``eval.endgame_positions``). null = P: prompts from the data's train split (issue 66)."""
    fresh_endgame_colours: str = "white"
    """The strong side's colour in `fresh_endgames` draws: white, black or both."""
    fresh_endgame_clocks: bool = True
    """Give each `fresh_endgames` position the clocks of a position reached in play, as the data's train positions
    (`data.fresh_endgames.fresh_draw`); false = placements (``0 1``), as issue 66's first arms drew them."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop the groups whose rewards are all equal and draw more prompts, round after round,
    until the step has `prompts_per_step` groups with spread or `max_resample_rounds` extra rounds were drawn (it then
    learns from the groups it has). Single-process runs of the kind on its own only (issue 66)."""
    max_resample_rounds: int = 4
    """Extra draws at most per step with `dynamic_sampling`."""
    shuffle_rewards: bool = False
    """The placebo arm (issue 66): the learner gets a seeded permutation of the step's rewards across all its rows
    (groups mixed), so a reward says nothing about its own completion while their distribution, the sampling, the
    clipping and the KL stay as in the real run. The logged reward/* metrics are the true rewards. Single-process."""

    def __post_init__(self) -> None:
        if self.max_resample_rounds < 0:
            raise ValueError(f"max_resample_rounds must be >= 0, got {self.max_resample_rounds}")
        if self.fresh_endgame_colours not in ("white", "black", "both"):
            raise ValueError(f"fresh_endgame_colours must be white, black or both, got {self.fresh_endgame_colours!r}")
        if self.logprob_chunk_rows < 0:
            raise ValueError(f"logprob_chunk_rows must be >= 0 (0 = all rows at once), got {self.logprob_chunk_rows}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a group of one has no baseline), got {self.group_size}")
        if self.prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if not 0.0 <= self.policy_fraction <= 1.0:
            raise ValueError(f"policy_fraction must be in [0, 1], got {self.policy_fraction}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_weights(self.weights)  # the names are checked by the kind's config (tasks.lm_rewards)

    @property
    def weights(self) -> dict[str, float]:
        """The run's rewards, {name: weight}: `rewards`, else each text task's own grader at weight 1."""
        return dict(self.rewards) if self.rewards is not None else {"policy": 1.0, "environment": 1.0}

    def split(self, count: int | None = None) -> tuple[int, int]:
        """(P: prompts, A: prompts) of `count` prompts (default: prompts_per_step, a step's prompts)."""
        count = self.prompts_per_step if count is None else count
        policy = round(count * self.policy_fraction)
        return policy, count - policy


@dataclasses.dataclass
class CompletionGroups:
    """B prompts with G sampled completions each (rows prompt-major), and what the policy thought."""

    prompts: list[str]
    """[B] prompt texts."""
    generation: Generation
    """B * G rows; row r belongs to prompt r // G."""
    texts: list[str]
    """[B * G] decoded completions (no EOS)."""
    behaviour_logp: torch.Tensor
    """[B * G, L] log-probs of the sampled tokens under the sampling weights (`completion_log_probs`)."""
    ref_logp: torch.Tensor | None
    """[B * G, L] under the frozen reference, or None."""
    entropy: torch.Tensor
    """[B * G, L] exact entropy of the tempered next-token distribution (0 at masked positions)."""
    group_size: int

    @property
    def group_ids(self) -> torch.Tensor:
        return torch.arange(len(self.prompts)).repeat_interleave(self.group_size)

    def row_prompts(self) -> list[str]:
        return [p for p in self.prompts for _ in range(self.group_size)]


def sample_completion_groups(
    lm: ChessLM,
    prompts: Sequence[str],
    group_size: int,
    *,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    reference: torch.nn.Module | None = None,
    chunk_rows: int = 0,
    stop: StopRule | None = None,
) -> CompletionGroups:
    """Sample G completions per prompt, then record behaviour (and reference) log-probs and entropy.

    The behaviour log-probs are recomputed on the finished sequences with `completion_log_probs`,
    the learner's own function, at the sampling temperature (see `models.lm`), `chunk_rows` rows
    per forward (0 = all). The completion tokens are the generated ids themselves, never the
    decoded text encoded again: a prompt/completion boundary inside what would be one BPE token
    of the joint text cannot shift the tokens that log-probs are taken of. `stop` (a fresh
    `models.lm_generation.StopRule` for these rows) ends rows before EOS: they are finished, their last
    token the one the rule stopped at.
    """
    with torch.no_grad():
        return _sample_completion_groups(
            lm, prompts, group_size, temperature, max_new_tokens, generator, reference, chunk_rows, stop
        )


def _sample_completion_groups(
    lm, prompts, group_size, temperature, max_new_tokens, generator, reference, chunk_rows=0, stop=None
) -> CompletionGroups:
    model = lm.model
    if model.training or (reference is not None and reference.training):
        raise RuntimeError("sampling needs every model in eval mode (no dropout in RL forwards)")
    encoded = [lm.tokenizer.encode(p) for p in prompts]
    rows = [ids for ids in encoded for _ in range(group_size)]
    generation = generate(
        model,
        rows,
        eos_token_id=lm.tokenizer.eos_token_id,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        generator=generator,
        row_groups=[i // group_size for i in range(len(rows))],
        stop=stop,
    )
    logp, entropy = completion_log_probs(
        model,
        generation.prompt_ids,
        generation.prompt_mask,
        generation.completion_ids,
        generation.completion_mask,
        temperature=temperature,
        with_entropy=True,
        chunk_rows=chunk_rows,
    )
    ref_logp = None
    if reference is not None:
        ref_logp, _ = completion_log_probs(
            reference,
            generation.prompt_ids,
            generation.prompt_mask,
            generation.completion_ids,
            generation.completion_mask,
            temperature=temperature,
            chunk_rows=chunk_rows,
        )
    assert entropy is not None
    return CompletionGroups(
        prompts=list(prompts),
        generation=generation,
        texts=generation.texts(lm.tokenizer),
        behaviour_logp=logp,
        ref_logp=ref_logp,
        entropy=entropy,
        group_size=group_size,
    )


def _pad_to(value: torch.Tensor, length: int, *, left: bool) -> torch.Tensor:
    """[n, L] -> [n, length] with zeros (False) added on the left or the right."""
    if value.shape[1] == length:
        return value
    padding = torch.zeros(value.shape[0], length - value.shape[1], dtype=value.dtype, device=value.device)
    return torch.cat([padding, value] if left else [value, padding], dim=1)


def select_groups(parts: Sequence[CompletionGroups], keep: Sequence[tuple[int, int]]) -> CompletionGroups:
    """The groups `keep` ((part index, group index in that part), in that order) of `parts` as one `CompletionGroups`:
    prompts left-padded and completions right-padded to the longest (mask False), as `generate` lays them out."""
    if not keep:
        raise ValueError("select_groups needs at least one group")
    size = parts[0].group_size
    rows = [list(range(group * size, (group + 1) * size)) for _, group in keep]  # rows are prompt-major
    prompt_length = max(parts[p].generation.prompt_ids.shape[1] for p, _ in keep)
    completion_length = max(parts[p].generation.completion_ids.shape[1] for p, _ in keep)

    def gather(field: str, part: int, index: list[int]) -> torch.Tensor:
        return getattr(parts[part], field)[index]

    def joined(values: list[torch.Tensor], length: int | None, left: bool = False) -> torch.Tensor:
        return torch.cat([v if length is None else _pad_to(v, length, left=left) for v in values])

    generations = [parts[p].generation for p, _ in keep]
    generation = Generation(
        prompt_ids=joined([g.prompt_ids[i] for g, i in zip(generations, rows)], prompt_length, left=True),
        prompt_mask=joined([g.prompt_mask[i] for g, i in zip(generations, rows)], prompt_length, left=True),
        completion_ids=joined([g.completion_ids[i] for g, i in zip(generations, rows)], completion_length),
        completion_mask=joined([g.completion_mask[i] for g, i in zip(generations, rows)], completion_length),
        finished=joined([g.finished[i] for g, i in zip(generations, rows)], None),
    )
    with_reference = all(parts[p].ref_logp is not None for p, _ in keep)
    return CompletionGroups(
        prompts=[parts[p].prompts[g] for p, g in keep],
        generation=generation,
        texts=[parts[p].texts[r] for (p, _), index in zip(keep, rows) for r in index],
        behaviour_logp=joined([gather("behaviour_logp", p, i) for (p, _), i in zip(keep, rows)], completion_length),
        ref_logp=joined([gather("ref_logp", p, i) for (p, _), i in zip(keep, rows)], completion_length)
        if with_reference
        else None,
        entropy=joined([gather("entropy", p, i) for (p, _), i in zip(keep, rows)], completion_length),
        group_size=size,
    )


def to_rollout_batch(groups: CompletionGroups, rewards: torch.Tensor) -> RolloutBatch:
    """Rows = the B * G completions (L tokens, mask through EOS); group id = prompt index."""
    g = groups.generation
    n = g.completion_ids.shape[0]
    if rewards.shape != (n,):
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} for {n} completions")
    device = g.completion_ids.device
    return RolloutBatch(
        inputs={"prompt_ids": g.prompt_ids, "prompt_mask": g.prompt_mask},
        actions=g.completion_ids,
        behaviour_logp=groups.behaviour_logp.float(),
        mask=g.completion_mask,
        rewards=rewards.float().to(device),
        group_ids=groups.group_ids.to(device),
        ref_logp=None if groups.ref_logp is None else groups.ref_logp.float(),
    )


def make_forward(
    model: torch.nn.Module,
    *,
    temperature: float,
    chunk_rows: int = 0,
    entropy_grad: bool = True,
    reference: torch.nn.Module | None = None,
) -> Forward:
    """The learner's forward: `completion_log_probs` (with exact entropy) of any subset of rows.

    `chunk_rows`: rows per model call (0 = all). `entropy_grad=False` (no entropy bonus) keeps the
    entropy a metric computed without gradient, which spares autograd a [rows, L, vocab] softmax.
    With `reference`, also the exact per-token KL(policy || reference) over the vocabulary (`PolicyOutputs.kl`,
    `completion_log_probs_and_kl`)."""

    def outputs(minibatch: RolloutBatch) -> PolicyOutputs:
        inputs = minibatch.inputs
        if reference is not None:
            logp, entropy, kl = completion_log_probs_and_kl(
                model,
                reference,
                inputs["prompt_ids"],
                inputs["prompt_mask"],
                minibatch.actions,
                minibatch.mask,
                temperature=temperature,
                chunk_rows=chunk_rows,
                entropy_grad=entropy_grad,
            )
            return PolicyOutputs(logp=logp, entropy=entropy, kl=kl)
        logp, entropy = completion_log_probs(
            model,
            inputs["prompt_ids"],
            inputs["prompt_mask"],
            minibatch.actions,
            minibatch.mask,
            temperature=temperature,
            with_entropy=True,
            chunk_rows=chunk_rows,
            entropy_grad=entropy_grad,
        )
        return PolicyOutputs(logp=logp, entropy=entropy)

    return eval_mode_forward(model, outputs)
