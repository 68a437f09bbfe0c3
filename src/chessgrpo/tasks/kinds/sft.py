"""`kind: sft`: supervised fine-tuning of a chess LM on RookWorld text (loss on completions only).

One step (`SFTKind.train_step`):

1. draw `batch_size` examples from the train split (a seeded permutation per epoch; the epoch and
   the position in it are the kind's checkpointed state, so a resumed run sees the same batches);
   P: examples list their M:/E: pairs in a fresh order seeded by (seed, step, example) each draw
   (`move_order: shuffle`; or once, as written, in UCI text order or best first);
2. loss = mean negative log-likelihood of the completion tokens (EOS included) given the prompt
   (`tasks.sft.sft_loss`: `models.lm.completion_log_probs` at temperature 1, the same function and
   left-padded layout that sampling and GRPO use). Prompt tokens carry no loss unless
   `prompt_loss_weight` > 0 (then they count at that weight, as in upstream RookWorld's whole-line
   training; the held-out `eval/loss` stays completion-only, comparable across runs). The model is in
   train mode for the step (dropout: a loaded model's own, `override_dropout` to change it; a fresh
   model's `model.dropout`, 0 by default) and in eval mode after. With `micro_batch_size` the batch
   runs as micro-batches whose token-weighted losses accumulate into one update;
3. one optimizer update through the loop's `Learner` (AdamW, warmup + cosine, clipping: the spine's).

Evaluation (`eval_every`): held-out loss on `eval_examples` test examples, and `eval_prompts`
held-out prompts per task decoded greedily, giving the well-formed rate per task (the acceptance
number), the best-move agreement with the dataset's engine label (P:) and the exact-completion rate
(A:), from the data alone (no engine). `eval/loss` picks `checkpoints/best`.

The model starts fresh from `model` (its `tokenizer`: chess by default, or char) or from `model.path` (any local
GPT-2-family directory, e.g. RookWorld-LM-124M). Checkpoints are `save_pretrained` directories
(`models.lm.save_lm`) plus the trainer state; `load_lm(RUN_DIR)` loads the newest, and a
``kind: rookworld`` GRPO run takes the run directory as its `init_checkpoint`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chessgrpo.config import ConfigError
from chessgrpo.data.rookworld_format import format_policy_completion
from chessgrpo.errors import InputError
from chessgrpo.models.lm import build_lm, lm_frozen_parameters, lm_head_parameters, load_lm, save_lm
from chessgrpo.models.prompt_bos import with_prompt_bos
from chessgrpo.tasks.kinds.sft_config import TASKS, SFTTrainConfig
from chessgrpo.tasks.sft import any_of_loss, loss_tokens, policy_answers, sft_loss, tokenize_examples
from chessgrpo.train.kind import Kind, RunContext, interval_text

logger = logging.getLogger(__name__)


class SFTKind(Kind):
    """Supervised fine-tuning of a `ChessLM` on RookWorld P:/A: text (module docstring)."""

    name = "sft"
    config_class = SFTTrainConfig

    def __init__(self, config: SFTTrainConfig, context: RunContext):
        from chessgrpo.data.rookworld import read_rookworld

        super().__init__(config, context)
        if config.reference_device is not None:
            raise ConfigError(f"config key reference_device: kind {self.name} has no reference model (set it to null)")
        device, seed = context.device, config.run.seed
        if config.model.path:  # the model's own dropout unless override_dropout says otherwise
            self.lm = load_lm(config.model.path, device=device)
            if config.override_dropout is not None:
                set_dropout_modules(self.lm.model, config.override_dropout)
        else:
            self.lm = build_lm(config.model, seed=seed)
            self.lm.model.to(device)
        self.lm.model.eval()
        self.model = self.lm.model
        self._adopt_policy_prompt(config.data)
        # Evaluation encodes prompts through this view (prompt_bos: BOS first, as in training).
        self.prompt_lm = with_prompt_bos(self.lm, config.prompt_bos)
        train = [e for e in read_rookworld(config.data, "train") if e.task in config.tasks]
        test = [e for e in read_rookworld(config.data, "test") if e.task in config.tasks]
        if not train:
            raise InputError(f"dataset {config.data!r} has no train examples of tasks {list(config.tasks)}")
        self.train_data = tokenize_examples(self.lm, train, prompt_bos=config.prompt_bos)
        self.train_policy_answers = policy_answers(train) if config.move_order == "shuffle" else {}
        if config.move_order in ("sorted", "best_first"):
            self._encode_fixed_orders(self.train_data.completions, policy_answers(train))
        self.test_examples = test
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.permutation(len(test))[: config.eval_examples]) if test else []
        held_out = [test[i] for i in chosen]
        self.test_data = tokenize_examples(self.lm, held_out, prompt_bos=config.prompt_bos) if test else None
        if self.test_data is not None and config.move_order in ("sorted", "best_first"):
            # The held-out loss scores the answers in the order the model is taught to write them, as the train ones.
            self._encode_fixed_orders(self.test_data.completions, policy_answers(held_out))
        self.epoch = 0
        self.position = 0
        self._orders: tuple[int, np.ndarray] | None = None
        # The curriculum's first stage reads its own seeded permutations of its tasks' examples.
        first = set(config.first_tasks or ())
        self._first_stage_indices = np.asarray(
            [i for i, task in enumerate(self.train_data.tasks) if task in first], dtype=np.int64
        )
        if config.first_tasks_steps > 0 and not len(self._first_stage_indices):
            raise InputError(
                f"dataset {config.data!r} has no train examples of first_tasks {list(config.first_tasks or ())}"
            )
        self.first_epoch = 0
        self.first_position = 0
        if config.fresh_target == "any_optimal":
            from chessgrpo.data.rookworld import dataset_policy_layout
            from chessgrpo.data.rookworld_format import MOVE_FIRST_LAYOUT

            if dataset_policy_layout(config.data) != MOVE_FIRST_LAYOUT:
                raise ConfigError(
                    f"config key fresh_target=any_optimal scores the answer's first move, but data {config.data!r} "
                    f"is not in the {MOVE_FIRST_LAYOUT} layout: make it with layout={MOVE_FIRST_LAYOUT}"
                )
            if context.world_size > 1:
                raise ConfigError("config key fresh_target=any_optimal runs in one process: set it to label or run one")
        self.fresh = _fresh_stream(config) if config.fresh_endgames else None
        """(the fresh positions' stream, the tables) of `fresh_endgames`; None = batches from the train split."""
        logger.info(
            "SFT of a %.2fM-parameter model on %d train examples", self.lm.num_parameters() / 1e6, len(self.train_data)
        )

    # -- optimisation (the same rules as kind: rookworld) ------------------------------------------

    def head_parameters(self) -> list[torch.nn.Parameter]:
        return lm_head_parameters(self.model, self.config.head_lr)

    def frozen_parameters(self, freeze_layers: int) -> list[torch.nn.Parameter]:
        return lm_frozen_parameters(self.model, freeze_layers)

    # -- data ---------------------------------------------------------------------------------------

    def _order(self, epoch: int) -> np.ndarray:
        """A seeded permutation of the train examples, sorted by (task, prompt length) within chunks of
        8 batches: batches are then nearly uniform in shape and carry little padding (a mixed P:/A:
        batch is ~30% padding, since P: completions and A: prompts are the long parts)."""
        if self._orders is not None and self._orders[0] == epoch:
            return self._orders[1]
        data = self.train_data
        order = np.random.default_rng([self.config.run.seed, epoch]).permutation(len(data))
        chunk = 8 * self.config.batch_size
        out = []
        for start in range(0, len(order), chunk):
            part = order[start : start + chunk].tolist()
            out += sorted(part, key=lambda i: (data.tasks[i], len(data.prompts[i])))
        result = np.asarray(out, dtype=np.int64)
        self._orders = (epoch, result)
        return result

    def _next_batch(self, step: int) -> list[int]:
        """The train examples of step `step` (0-based, the steps done before it): from the first
        stage's tasks for the first `first_tasks_steps` steps, else from every task."""
        if step < self.config.first_tasks_steps:
            return self._next_first_stage_batch()
        indices: list[int] = []
        while len(indices) < self.config.batch_size:
            order = self._order(self.epoch)
            take = order[self.position : self.position + self.config.batch_size - len(indices)]
            indices += take.tolist()
            self.position += len(take)
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return indices

    def _next_first_stage_batch(self) -> list[int]:
        indices: list[int] = []
        pool = self._first_stage_indices
        while len(indices) < self.config.batch_size:
            order = pool[np.random.default_rng([self.config.run.seed, 1, self.first_epoch]).permutation(len(pool))]
            take = order[self.first_position : self.first_position + self.config.batch_size - len(indices)]
            indices += take.tolist()
            self.first_position += len(take)
            if self.first_position >= len(order):
                self.first_epoch, self.first_position = self.first_epoch + 1, 0
        # Shapes as in `_order`: sorted by prompt length, so the batch carries little padding.
        return sorted(indices, key=lambda i: len(self.train_data.prompts[i]))

    def _completion(self, index: int, step: int) -> list[int]:
        """Token ids of train example `index`'s completion: a P: one with its moves in `move_order`
        (fixed orders are encoded once, at start-up; a shuffle is seeded by (run seed, step, index),
        so a resumed run draws the same orders)."""
        parsed = self.train_policy_answers.get(index)
        if parsed is None:
            return self.train_data.completions[index]
        fen, answer = parsed
        order = np.random.default_rng([self.config.run.seed, step, index]).permutation(len(answer.moves)).tolist()
        return self._encode_policy_answer(fen, answer, order)

    def _encode_policy_answer(self, fen: str, answer: Any, order: list[int]) -> list[int]:
        """Token ids (EOS last) of a P: completion with its M:/E: pairs listed in `order`."""
        listed = dataclasses.replace(
            answer, moves=tuple(answer.moves[k] for k in order), evals=tuple(answer.evals[k] for k in order)
        )
        return self.lm.tokenizer.encode(format_policy_completion(fen, listed)) + [self.lm.tokenizer.eos_token_id]

    def _encode_fixed_orders(self, completions: list[list[int]], answers: dict[int, tuple[str, Any]]) -> None:
        """Re-encode the P: `completions` (train or held-out, indexed as `answers`) once in the fixed `move_order`
        (sorted or best_first)."""
        for index, (fen, answer) in answers.items():
            moves, evals = answer.moves, answer.evals
            if self.config.move_order == "sorted":
                order = sorted(range(len(moves)), key=lambda k: moves[k])
            else:  # best_first; stable: ties keep the written order
                order = sorted(range(len(moves)), key=lambda k: -evals[k])
            completions[index] = self._encode_policy_answer(fen, answer, order)

    # -- the step -----------------------------------------------------------------------------------

    def train_step(self, step: int, learner: Any) -> dict[str, float]:
        if self.config.fresh_target == "any_optimal":
            return self._any_optimal_step(step, learner)
        tick = time.perf_counter()
        # The global batch; a data-parallel rank learns from its share.
        all_prompts, completions = self._fresh_batch(step) if self.fresh is not None else self._train_batch(step)
        parallel = self.context.parallel
        self.model.train()  # dropout as configured (the loaded model's own by default)
        try:
            mine = parallel.split(len(all_prompts))
            weight = self.config.prompt_loss_weight
            batch_tokens = sum(loss_tokens(p, c, weight) for p, c in zip(all_prompts, completions))
            loss_value, grad_norm = self._learn(
                all_prompts[mine.start : mine.stop],
                completions[mine.start : mine.stop],
                len(all_prompts),
                batch_tokens,
                learner,
            )
        finally:
            self.model.eval()
        seconds = time.perf_counter() - tick
        return {
            "loss/train": loss_value,
            "grad_norm": grad_norm,
            "perf/step_s": seconds,
            "perf/tokens_per_s": sum(len(c) for c in completions) / max(seconds, 1e-9),  # every rank's tokens
            "train/epoch": float(self.epoch),
        }

    def _any_optimal_step(self, step: int, learner: Any) -> dict[str, float]:
        """One update of ``fresh_target: any_optimal``: step `step`'s fresh positions, each one term
        -log sum over its DTZ-optimal moves m of p(`` B: <m>`` | its P: prompt) (`tasks.sft.any_of_loss`)."""
        from chessgrpo.data.fresh_endgames import fresh_truths
        from chessgrpo.data.rookworld_format import policy_prompt
        from chessgrpo.models.prompt_bos import prompt_bos_id

        assert self.fresh is not None
        tick = time.perf_counter()
        starts, tablebase = self.fresh
        config, tokenizer = self.config, self.lm.tokenizer
        truths = fresh_truths(
            starts, tablebase, config.batch_size, seed=config.run.seed, step=step, clocks=config.fresh_endgame_clocks
        )
        prefix = [prompt_bos_id(tokenizer)] if config.prompt_bos else []
        prompts = [prefix + tokenizer.encode(policy_prompt(truth.fen, self.lm.policy_prompt)) for truth in truths]
        # The completion text of a move-first answer starts " B: <move>" (`format_policy_completion`).
        candidates = [[tokenizer.encode(f" B: {move}") for move in sorted(truth.optimal)] for truth in truths]
        self.model.train()
        try:
            with self.context.autocast():
                loss = any_of_loss(self.lm, prompts, candidates, model=self.learner_model)
            grad_norm = learner.update(loss)
        finally:
            self.model.eval()
        return {
            "loss/train": float(loss.detach()),
            "grad_norm": grad_norm,
            "perf/step_s": time.perf_counter() - tick,
            "train/optimal_moves": sum(len(c) for c in candidates) / len(candidates),
        }

    def _train_batch(self, step: int) -> tuple[list[list[int]], list[list[int]]]:
        """(prompt ids, completion ids) of step `step`'s examples of the train split."""
        indices = self._next_batch(step)
        return [self.train_data.prompts[i] for i in indices], [self._completion(i, step) for i in indices]

    def _fresh_batch(self, step: int) -> tuple[list[list[int]], list[list[int]]]:
        """(prompt ids, completion ids) of step `step`'s `fresh_endgames` positions, labelled by the tables, their M:
        moves in `move_order` as the train split's."""
        from chessgrpo.data.fresh_endgames import labelled_fresh_examples

        assert self.fresh is not None
        starts, tablebase = self.fresh
        config = self.config
        examples = labelled_fresh_examples(
            starts,
            tablebase,
            config.batch_size,
            data=config.data,
            seed=config.run.seed,
            step=step,
            clocks=config.fresh_endgame_clocks,
        )
        tokens = tokenize_examples(self.lm, examples, prompt_bos=config.prompt_bos)
        answers = policy_answers(examples)
        if config.move_order in ("sorted", "best_first"):
            self._encode_fixed_orders(tokens.completions, answers)
        elif config.move_order == "shuffle":
            for index, (fen, answer) in answers.items():
                order = np.random.default_rng([config.run.seed, step, index]).permutation(len(answer.moves)).tolist()
                tokens.completions[index] = self._encode_policy_answer(fen, answer, order)
        return tokens.prompts, tokens.completions

    def _learn(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        batch_examples: int,
        batch_tokens: float,
        learner: Any,
    ) -> tuple[float, float]:
        """One optimizer update from this rank's examples, in micro-batches: (its token-mean loss, grad norm).

        The global loss is a token mean over the whole batch (every rank's `batch_tokens`, the
        `tasks.sft.loss_tokens` weights when prompt tokens are scored too): each
        micro-batch's mean is weighted by world size x its tokens / `batch_tokens` (DDP averages the
        gradients over the ranks), and every rank runs the same number of micro-batches (a rank
        with fewer examples backpropagates a placeholder at weight 0), since DDP reduces in every backward.
        """
        world = self.context.parallel.world_size
        size = self.config.micro_batch_size or max(batch_examples, 1)
        count = max(1, math.ceil(math.ceil(batch_examples / world) / size))
        total = weighted = 0.0
        grad_norm = math.nan
        for k in range(count):
            part_prompts, part_completions = prompts[k * size : (k + 1) * size], completions[k * size : (k + 1) * size]
            placeholder = not part_prompts
            if placeholder:  # join DDP's reduction with a zero-weight loss
                part_prompts, part_completions = [self.train_data.prompts[0]], [self.train_data.completions[0]]
            with self.context.autocast():
                loss, tokens = sft_loss(
                    self.lm,
                    part_prompts,
                    part_completions,
                    model=self.learner_model,
                    prompt_weight=self.config.prompt_loss_weight,
                )
            weight = 0.0 if placeholder else world * tokens / max(batch_tokens, 1)
            if not placeholder:
                total += float(loss.detach()) * tokens
                weighted += tokens
            scaled = loss if weight == 1.0 else loss * weight
            grad_norm = learner.update(scaled) if k == count - 1 else learner.update(scaled, step=False)
        return total / max(weighted, 1.0), grad_norm

    # -- evaluation ---------------------------------------------------------------------------------

    @property
    def evaluates(self) -> bool:
        return self.test_data is not None

    @torch.no_grad()
    def evaluate(self, step: int, out_dir: Path) -> dict[str, float]:
        """Held-out loss and greedy well-formed rates (see the module docstring)."""
        from chessgrpo.data.rookworld_format import Malformed, parse_environment_completion, parse_policy_completion
        from chessgrpo.models.lm_generation import generate_texts
        from chessgrpo.stats import wilson_interval

        config = self.config
        self.model.eval()
        metrics: dict[str, float] = {}
        if self.test_data is None:
            return metrics
        total = tokens = 0.0
        for start in range(0, len(self.test_data), config.eval_batch_size):
            with self.context.autocast():
                loss, n = sft_loss(
                    self.lm,
                    self.test_data.prompts[start : start + config.eval_batch_size],
                    self.test_data.completions[start : start + config.eval_batch_size],
                    chunk_rows=config.micro_batch_size,
                )
            total += float(loss.detach()) * n
            tokens += n
        metrics["eval/loss"] = total / max(tokens, 1)
        well_formed_all: list[bool] = []
        for task in config.tasks:
            examples = [e for e in self.test_examples if e.task == task][: config.eval_prompts]
            if not examples:
                continue
            texts = generate_texts(
                self.prompt_lm,
                [e.prompt for e in examples],
                max_new_tokens=config.max_new_tokens,
                batch_size=config.eval_batch_size,
            )
            parse = parse_policy_completion if task == "policy" else parse_environment_completion
            parsed = [parse(t) for t in texts]
            well_formed = [not isinstance(p, Malformed) for p in parsed]
            well_formed_all += well_formed
            rate = wilson_interval(sum(well_formed), len(well_formed))
            metrics.update(
                {
                    f"eval/{task}_format_rate": rate.value,
                    f"eval/{task}_format_rate_low": rate.low,
                    f"eval/{task}_format_rate_high": rate.high,
                }
            )
            if task == "policy":
                best = [
                    not isinstance(p, Malformed) and bool(e.moves) and p.best == e.moves[0]
                    for p, e in zip(parsed, examples)
                ]
                metrics["eval/policy_best_label_accuracy"] = sum(best) / len(best)
                # Does the model read the board? A board-blind model writes the same few moves everywhere.
                legal = [not isinstance(p, Malformed) and _is_legal(e.fen, p.best) for p, e in zip(parsed, examples)]
                metrics["eval/policy_best_legal_rate"] = sum(legal) / len(legal)
                distinct = {p.best for p in parsed if not isinstance(p, Malformed)}
                metrics["eval/policy_distinct_best_moves"] = float(len(distinct))
            else:
                exact = [t.strip() == e.completion.strip() for t, e in zip(texts, examples)]
                metrics["eval/environment_exact_rate"] = sum(exact) / len(exact)
        if well_formed_all:
            rate = wilson_interval(sum(well_formed_all), len(well_formed_all))
            metrics.update(
                {"eval/format_rate": rate.value, "eval/format_rate_low": rate.low, "eval/format_rate_high": rate.high}
            )
        return metrics

    def _adopt_policy_prompt(self, data: str) -> None:
        """The model writes its P: prompts as its data does (the manifest's ``policy_prompt``); it is saved with
        it, so GRPO, `eval lm` and the LM player prompt it the way it was taught."""
        from chessgrpo.data.rookworld import dataset_policy_prompt

        style = dataset_policy_prompt(data)
        if style is not None and style != self.lm.policy_prompt:
            if self.config.model.path:
                logger.warning(
                    "the model at %s was taught %s prompts; data %s writes %s prompts, which it learns from now on",
                    self.config.model.path,
                    self.lm.policy_prompt,
                    data,
                    style,
                )
            self.lm.policy_prompt = style

    # -- state --------------------------------------------------------------------------------------

    def save_model(self, directory: Path) -> None:
        save_lm(self.lm, directory)

    def load_model(self, checkpoint: Path) -> None:
        """The checkpoint's weights, in place (the optimizer holds these parameters)."""
        loaded = load_lm(checkpoint, device=self.context.device)
        self.model.load_state_dict(loaded.model.state_dict())
        self.model.eval()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "first_epoch": self.first_epoch,
            "first_position": self.first_position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.first_epoch, self.first_position = int(state.get("first_epoch", 0)), int(state.get("first_position", 0))

    # -- presentation -------------------------------------------------------------------------------

    def progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        postfix = {}
        if "loss/train" in row:
            postfix["loss"] = f"{row['loss/train']:.3f}"
        if "eval/format_rate" in row:
            postfix["well_formed"] = f"{row['eval/format_rate']:.3f}"
        return postfix

    def eval_line(self, step: int, row: dict[str, Any]) -> str | None:
        if "eval/loss" not in row:
            return None
        parts = [f"step {step}: loss {row['eval/loss']:.4f}"]
        for task in TASKS:
            key = f"eval/{task}_format_rate"
            if key in row:
                parts.append(f"{task} well-formed {interval_text(row, key)}")
        if "eval/policy_best_label_accuracy" in row:
            parts.append(f"best-move = label {row['eval/policy_best_label_accuracy']:.3f}")
        if "eval/policy_best_legal_rate" in row:
            parts.append(
                f"B: legal {row['eval/policy_best_legal_rate']:.3f} ({row['eval/policy_distinct_best_moves']:.0f} distinct)"
            )
        if "eval/environment_exact_rate" in row:
            parts.append(f"A: exact {row['eval/environment_exact_rate']:.3f}")
        return ", ".join(parts)

    def summary(self) -> list[str]:
        lines = [
            f"model: {self.lm.num_parameters() / 1e6:.2f}M parameters ({self.lm.source})",
            f"data: {len(self.train_data)} train examples of {', '.join(self.config.tasks)} from {self.config.data}",
        ]
        if self.fresh is not None:
            lines[-1] = (
                f"data: fresh won {self.config.fresh_endgames} positions labelled by the tables (none of "
                f"{self.config.data}'s, nor an image, nor the {self.config.endgame_positions} held out)"
            )
        return lines


def set_dropout_modules(model: torch.nn.Module, p: float) -> None:
    """Set p of every dropout module and Llama attention dropout (not the model config, so
    `save_pretrained` keeps the model's own)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = p


def _is_legal(fen: str, move: str) -> bool:
    """True when UCI `move` is legal in `fen` (False for a malformed FEN or move)."""
    import chess

    try:
        return chess.Move.from_uci(move) in chess.Board(fen).legal_moves
    except ValueError:
        return False


def _fresh_stream(config: SFTTrainConfig) -> tuple[Any, Any]:
    """(`EndgameStarts` of `config.fresh_endgames` with its `endgame_positions` held out, the open tables)."""
    from chessgrpo.data.fresh_endgames import fresh_endgame_starts, held_out_endgame_fens
    from chessgrpo.data.rookworld_grading import shared_tablebase

    material = config.fresh_endgames
    assert material is not None
    try:
        tablebase = shared_tablebase(config.syzygy_path)
        starts = fresh_endgame_starts(config.data, material, tablebase, colours=config.fresh_endgame_colours)
        if config.endgame_positions:
            held_out_endgame_fens(starts, config.endgame_positions, seed=config.endgame_seed)
    except (InputError, FileNotFoundError) as error:
        raise ConfigError(f"config key fresh_endgames={material!r}: {error}") from None
    return starts, tablebase
