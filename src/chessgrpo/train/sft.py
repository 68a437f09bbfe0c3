"""`chessgrpo sft`: supervised fine-tuning of a chess LM on RookWorld text (loss on completions only).

The loop, top to bottom (`SFTTrainer.train`):

1. draw `batch_size` examples from the train split (a seeded permutation per epoch; the position in
   the epoch is part of the checkpoint, so a resumed run sees the same batches);
   P: examples list their M:/E: pairs in a fresh seeded order each draw (`reshuffle_moves`);
2. loss = mean negative log-likelihood of the completion tokens (EOS included) given the prompt,
   from `models.lm.completion_log_probs` at temperature 1: the same function and the same
   left-padded layout that sampling and GRPO use, so SFT trains exactly the distribution RL starts
   from. Prompt tokens carry no loss;
3. AdamW with warmup + cosine, gradient clipping; dropout as the model config says (0 by default).

Every `eval_every` steps: held-out loss, and `eval_prompts` held-out prompts decoded greedily,
giving the well-formed rate per task (the acceptance number), the best-move agreement with the
dataset's engine label (P:) and the exact-completion rate (A:), from the data alone (no engine).

The model starts fresh from `model` (character tokenizer) or from `model.path` (any local
GPT-2-family directory, e.g. RookWorld-LM-124M). Checkpoints are `save_pretrained` directories
(`models.lm.save_lm`) plus the trainer state; `load_lm(RUN_DIR)` loads the latest.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chessgrpo.config import ConfigError, RunConfig, to_dict
from chessgrpo.models.lm import (
    ChessLM,
    LMModelConfig,
    build_lm,
    completion_log_probs,
    left_pad,
    load_lm,
    prepare_for_rl,
    right_pad,
    save_lm,
)
from chessgrpo.tasks.rookworld import format_policy_completion, parse_policy_line
from chessgrpo.track.metrics import METRICS_FILE, MetricsWriter
from chessgrpo.train.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_trainer_state,
    restore_rng_state,
    save_checkpoint,
)
from chessgrpo.train.schedule import WarmupCosine

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SFTConfig:
    """`chessgrpo sft`: supervised fine-tuning on a `chessgrpo data rookworld` dataset."""

    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="rookworld_sft"))
    data: str = "data/rookworld_tiny"
    """Dataset directory from `chessgrpo data rookworld` (train/ and test/ Parquet shards)."""
    model: LMModelConfig = dataclasses.field(default_factory=LMModelConfig)
    """A fresh GPT-2 with the character tokenizer, or `model.path` to fine-tune a local model."""
    tasks: tuple[str, ...] = ("policy", "environment")
    """Which tasks of the dataset to train on."""
    reshuffle_moves: bool = True
    """Each time a P: example is drawn, list its M: moves (with their E: values) in a fresh seeded
    order. The format says M is shuffled, so any order is an equally true line; many orders show the
    model that M is a set (meant against greedy decoding writing one move five times; its effect
    alone is not yet measured, docs/benchmarks.md issue 7)."""
    batch_size: int = 32
    """Examples per optimizer step."""
    steps: int = 1000
    """Optimizer steps."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of lr."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay on matrices."""
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = 1.0
    eval_every: int = 200
    """Held-out evaluation every this many steps (and at the end); 0 = only at the end."""
    eval_examples: int = 256
    """Held-out examples for the held-out loss."""
    eval_prompts: int = 100
    """Held-out prompts per task decoded greedily for the well-formed rate."""
    eval_batch_size: int = 64
    max_new_tokens: int = 176
    """Longest decoded completion in evaluation (characters for the char tokenizer)."""
    log_every: int = 10
    checkpoint_every: int = 500
    """Checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    stop_at: int | None = None
    """Stop this invocation after this step (checkpointed); `--resume` continues."""
    device: str = "cpu"
    threads: int = 0
    """Torch CPU threads (0 = torch's default)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps", "log_every", "keep_checkpoints", "eval_examples", "eval_batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key {name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "threads", "eval_prompts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"config key {name} must be >= 0, got {getattr(self, name)}")
        if not self.tasks or any(t not in ("policy", "environment") for t in self.tasks):
            raise ConfigError(f"config key tasks must be a non-empty list of policy/environment, got {list(self.tasks)}")
        if self.lr <= 0 or self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ConfigError("need lr > 0, weight_decay >= 0, max_grad_norm >= 0")
        if self.stop_at is not None and self.stop_at < 1:
            raise ConfigError(f"config key stop_at must be >= 1 or null, got {self.stop_at}")


RESUMABLE_KEYS = frozenset(
    {"steps", "stop_at", "log_every", "eval_every", "eval_batch_size", "eval_prompts", "eval_examples", "checkpoint_every",
     "keep_checkpoints", "threads", "max_new_tokens"}
)  # fmt: skip


@dataclasses.dataclass
class TokenizedExamples:
    """Examples as token ids: prompt ids and completion ids ending with EOS."""

    prompts: list[list[int]]
    completions: list[list[int]]
    tasks: list[str]

    def __len__(self) -> int:
        return len(self.prompts)


def tokenize_examples(lm: ChessLM, examples: list[Any]) -> TokenizedExamples:
    eos = lm.tokenizer.eos_token_id
    limit = lm.max_positions
    prompts, completions, tasks = [], [], []
    for example in examples:
        prompt = lm.tokenizer.encode(example.prompt)
        completion = lm.tokenizer.encode(example.completion) + [eos]
        if limit is not None and len(prompt) + len(completion) > limit:
            raise ValueError(f"example of {len(prompt) + len(completion)} tokens exceeds the model's {limit} positions: {example.line[:60]!r}")
        prompts.append(prompt)
        completions.append(completion)
        tasks.append(example.task)
    return TokenizedExamples(prompts, completions, tasks)


def _policy_answers(examples: list[Any]) -> dict[int, tuple[str, Any]]:
    """index -> (FEN, PolicyAnswer) of the P: examples whose line parses and whose moves can be
    reordered (two or more); other lines are always used as written."""
    answers = {}
    for index, example in enumerate(examples):
        if example.task != "policy":
            continue
        try:
            fen, answer = parse_policy_line(example.line)
        except ValueError:
            continue
        if len(answer.moves) > 1:
            answers[index] = (fen, answer)
    return answers


def sft_loss(lm: ChessLM, prompts: list[list[int]], completions: list[list[int]]) -> tuple[torch.Tensor, int]:
    """(mean NLL per completion token, number of tokens) for a batch, via `completion_log_probs` at T = 1."""
    device = lm.device
    pad = lm.tokenizer.eos_token_id
    prompt_ids, prompt_mask = left_pad(prompts, pad, device)
    completion_ids, completion_mask = right_pad(completions, pad, device)
    logp, _ = completion_log_probs(lm.model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0)
    tokens = int(completion_mask.sum())
    return -logp.sum() / max(tokens, 1), tokens


@dataclasses.dataclass
class SFTResult:
    step: int
    finished: bool
    checkpoint: Path
    eval_metrics: dict[str, float] | None


def _optimizer(model: torch.nn.Module, config: SFTConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))


class SFTTrainer:
    """Set up an SFT run (fresh or resumed), then `train`. Construction writes nothing."""

    def __init__(self, config: SFTConfig, *, resume: bool = False):
        from chessgrpo.data.rookworld import read_rookworld

        self.config = config
        self.run_dir = config.run.directory
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device!r} requested but CUDA is not available (use device=cpu)")
        if config.threads:
            torch.set_num_threads(config.threads)
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            raise FileNotFoundError(f"no checkpoint to resume under {str(self.run_dir / 'checkpoints')!r}")
        torch.manual_seed(config.run.seed)
        if checkpoint is not None:
            self.lm = load_lm(checkpoint, device=self.device, dropout=config.model.dropout)
        elif config.model.path:
            self.lm = load_lm(config.model.path, device=self.device, dropout=config.model.dropout)
        else:
            self.lm = build_lm(config.model, seed=config.run.seed)
            self.lm.model.to(self.device)
        train = [e for e in read_rookworld(config.data, "train") if e.task in config.tasks]
        test = [e for e in read_rookworld(config.data, "test") if e.task in config.tasks]
        if not train:
            raise ValueError(f"dataset {config.data!r} has no train examples of tasks {list(config.tasks)}")
        self.train_data = tokenize_examples(self.lm, train)
        self.train_policy_answers = _policy_answers(train) if config.reshuffle_moves else {}
        self.test_examples = test
        rng = np.random.default_rng(config.run.seed)
        chosen = np.sort(rng.permutation(len(test))[: config.eval_examples]) if test else []
        self.test_data = tokenize_examples(self.lm, [test[i] for i in chosen]) if test else None
        self.optimizer = _optimizer(self.lm.model, config)
        self.schedule = WarmupCosine(config.lr, config.warmup_steps, config.steps, config.min_lr_ratio)
        self.step = 0
        self.epoch = 0
        self.position = 0
        if checkpoint is not None:
            state = load_trainer_state(checkpoint)
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.epoch, self.position = int(state["step"]), int(state["epoch"]), int(state["position"])
            restore_rng_state(state["rng"])
            logger.info("resumed %s from %s (step %d)", self.run_dir, checkpoint, self.step)
        self.last_checkpoint: Path | None = checkpoint
        self._stop_requested = False
        logger.info("SFT of a %.2fM-parameter model on %d train examples", self.lm.num_parameters() / 1e6, len(self.train_data))

    def request_stop(self) -> None:
        self._stop_requested = True

    def _order(self, epoch: int) -> np.ndarray:
        """A seeded permutation of the train examples, sorted by (task, prompt length) within chunks of
        8 batches: batches are then nearly uniform in shape and carry little padding (a mixed P:/A:
        batch is ~30% padding, since P: completions and A: prompts are the long parts)."""
        data = self.train_data
        order = np.random.default_rng([self.config.run.seed, epoch]).permutation(len(data))
        chunk = 8 * self.config.batch_size
        out = []
        for start in range(0, len(order), chunk):
            part = order[start : start + chunk].tolist()
            out += sorted(part, key=lambda i: (data.tasks[i], len(data.prompts[i])))
        return np.asarray(out, dtype=np.int64)

    def _next_batch(self) -> list[int]:
        indices: list[int] = []
        while len(indices) < self.config.batch_size:
            order = self._order(self.epoch)
            take = order[self.position : self.position + self.config.batch_size - len(indices)]
            indices += take.tolist()
            self.position += len(take)
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return indices

    def _completion(self, index: int) -> list[int]:
        """Token ids of train example `index`'s completion; a P: one with its moves in a fresh order
        seeded by (run seed, step, index), so a resumed run draws the same orders."""
        parsed = self.train_policy_answers.get(index)
        if parsed is None:
            return self.train_data.completions[index]
        fen, answer = parsed
        order = np.random.default_rng([self.config.run.seed, self.step, index]).permutation(len(answer.moves))
        shuffled = dataclasses.replace(answer, moves=tuple(answer.moves[k] for k in order), evals=tuple(answer.evals[k] for k in order))
        return self.lm.tokenizer.encode(format_policy_completion(fen, shuffled)) + [self.lm.tokenizer.eos_token_id]

    def train_step(self) -> dict[str, float]:
        config = self.config
        lr = self.schedule.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        tick = time.perf_counter()
        indices = self._next_batch()
        self.lm.model.train()  # dropout as configured (0 by default)
        completions = [self._completion(i) for i in indices]
        loss, tokens = sft_loss(self.lm, [self.train_data.prompts[i] for i in indices], completions)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        limit = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.lm.model.parameters(), limit))
        loss_value = float(loss.detach())
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            raise RuntimeError(f"step {self.step}: non-finite loss {loss_value} or gradient norm {grad_norm}; nothing saved")
        self.optimizer.step()
        self.lm.model.eval()
        self.step += 1
        seconds = time.perf_counter() - tick
        return {
            "loss/train": loss_value,
            "lr": lr,
            "grad_norm": grad_norm,
            "perf/step_s": seconds,
            "perf/tokens_per_s": tokens / max(seconds, 1e-9),
            "train/epoch": float(self.epoch),
        }

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out loss and greedy well-formed rates (see the module docstring)."""
        from chessgrpo.eval.lm import generate_texts
        from chessgrpo.eval.stats import wilson_interval
        from chessgrpo.tasks.rookworld import (
            Malformed,
            parse_environment_completion,
            parse_policy_completion,
        )

        config = self.config
        self.lm.model.eval()
        metrics: dict[str, float] = {}
        if self.test_data is None:
            return metrics
        total = tokens = 0.0
        for start in range(0, len(self.test_data), config.eval_batch_size):
            loss, n = sft_loss(
                self.lm,
                self.test_data.prompts[start : start + config.eval_batch_size],
                self.test_data.completions[start : start + config.eval_batch_size],
            )
            total += float(loss.detach()) * n
            tokens += n
        metrics["eval/loss"] = total / max(tokens, 1)
        well_formed_all: list[bool] = []
        for task in config.tasks:
            examples = [e for e in self.test_examples if e.task == task][: config.eval_prompts]
            if not examples:
                continue
            texts = generate_texts(self.lm, [e.prompt for e in examples], max_new_tokens=config.max_new_tokens, batch_size=config.eval_batch_size)
            parse = parse_policy_completion if task == "policy" else parse_environment_completion
            parsed = [parse(t) for t in texts]
            well_formed = [not isinstance(p, Malformed) for p in parsed]
            well_formed_all += well_formed
            rate = wilson_interval(sum(well_formed), len(well_formed))
            metrics.update({f"eval/{task}_format_rate": rate.value, f"eval/{task}_format_rate_low": rate.low,
                            f"eval/{task}_format_rate_high": rate.high})  # fmt: skip
            if task == "policy":
                best = [not isinstance(p, Malformed) and bool(e.moves) and p.best == e.moves[0] for p, e in zip(parsed, examples)]
                metrics["eval/policy_best_label_accuracy"] = sum(best) / len(best)
            else:
                exact = [t.strip() == e.completion.strip() for t, e in zip(texts, examples)]
                metrics["eval/environment_exact_rate"] = sum(exact) / len(exact)
        if well_formed_all:
            rate = wilson_interval(sum(well_formed_all), len(well_formed_all))
            metrics.update({"eval/format_rate": rate.value, "eval/format_rate_low": rate.low, "eval/format_rate_high": rate.high})
        return metrics

    def _checkpoint(self) -> Path:
        state = {
            "step": self.step,
            "epoch": self.epoch,
            "position": self.position,
            "optimizer": self.optimizer.state_dict(),
            "rng": capture_rng_state(),
            "config": to_dict(self.config),
        }
        self.last_checkpoint = save_checkpoint(
            self.run_dir, self.step, save_model=lambda d: save_lm(self.lm, d), trainer_state=state, keep=self.config.keep_checkpoints
        )
        return self.last_checkpoint

    def train(self, progress: Callable[[int, dict[str, Any] | None], None] | None = None) -> SFTResult:
        config = self.config
        end = config.steps if config.stop_at is None else min(config.steps, config.stop_at)
        resume_step = self.step if self.last_checkpoint is not None else None
        eval_metrics: dict[str, float] | None = None
        with MetricsWriter(self.run_dir / METRICS_FILE, resume_step=resume_step) as writer:
            window: list[dict[str, float]] = []
            while self.step < end and not self._stop_requested:
                window.append(self.train_step())
                last = self.step == end or self._stop_requested
                row_values: dict[str, float] = {}
                if self.step % config.log_every == 0 or last:
                    row_values = {key: sum(w[key] for w in window) / len(window) for key in window[-1]}
                    window = []
                if (config.eval_every and self.step % config.eval_every == 0) or self.step == config.steps:
                    eval_metrics = self.evaluate()
                    row_values.update(eval_metrics)
                row = writer.log(self.step, row_values) if row_values else None
                if (config.checkpoint_every and self.step % config.checkpoint_every == 0) or last:
                    self._checkpoint()
                if progress is not None:
                    progress(self.step, row)
        if self.last_checkpoint is None:
            self._checkpoint()
        return SFTResult(self.step, self.step >= config.steps, self.last_checkpoint, eval_metrics)


def load_for_rl(path: str, device: str | torch.device = "cpu") -> ChessLM:
    """An SFT result (or any local LM) ready for RL: dropout off, eval mode."""
    lm = load_lm(path, device=device)
    prepare_for_rl(lm.model)
    return lm


CONFIG_CLASS = SFTConfig
TRAINER_CLASS = SFTTrainer
