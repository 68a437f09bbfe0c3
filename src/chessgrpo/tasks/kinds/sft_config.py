"""The config of `kind: sft` (`SFTTrainConfig`): supervised fine-tuning of a chess LM on RookWorld text.

The plug-in that runs it is `tasks.kinds.sft.SFTKind` (its module docstring says what a step does).
"""

from __future__ import annotations

import dataclasses
import math

from chessgrpo.config import ConfigError, RunConfig, resumable
from chessgrpo.models.lm import LMModelConfig
from chessgrpo.paths import SYZYGY_DEFAULT
from chessgrpo.train.config import TrainConfig

TASKS = ("policy", "environment")
MOVE_ORDERS = ("shuffle", "as_written", "sorted", "best_first")
FRESH_TARGETS = ("label", "any_optimal")


@dataclasses.dataclass
class SFTTrainConfig(TrainConfig):
    """`chessgrpo sft` (``kind: sft``): supervised fine-tuning on a `chessgrpo data rookworld` dataset."""

    kind: str = "sft"
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="rookworld_sft"))
    data: str = "data/rookworld_tiny"
    """Dataset directory from `chessgrpo data rookworld` (train/ and test/ Parquet shards)."""
    model: LMModelConfig = dataclasses.field(default_factory=LMModelConfig)
    """A fresh GPT-2 with the chess (or character) tokenizer, or `model.path` to fine-tune a local model."""
    tasks: tuple[str, ...] = TASKS
    """Which tasks of the dataset to train on."""
    first_tasks: tuple[str, ...] | None = None
    """A curriculum's first stage: the first `first_tasks_steps` steps draw only examples of these
    tasks (e.g. [environment]: the A: task's FEN copy gets every gradient until it sets in), then
    `tasks`. null = no first stage."""
    first_tasks_steps: int = 0
    """Length of the first stage in optimizer steps (0 = none)."""
    move_order: str = "shuffle"
    """How a drawn P: example lists its M: moves (each with its E: value; B: unchanged). M is a set,
    so every order is an equally true line: "shuffle" = a fresh seeded order per draw (many orders
    show the model that M is a set); "as_written" = the dataset's order; "sorted" = UCI text order
    (a canonical order: each move follows a smaller one, so greedy decoding that repeats a move
    breaks a pattern the model saw in every example); "best_first" = by E: value, best first."""
    reshuffle_moves: bool | None = None
    """Deprecated (before `move_order`): true = move_order shuffle, false = as_written; null = use move_order."""
    batch_size: int = 32
    """Examples per optimizer step."""
    prompt_loss_weight: float = 0.0
    """Weight of the prompt tokens in the training loss relative to completion tokens (0 = completions
    only). The prompts are FENs and moves in the very grammar the completions must write, so a weight
    > 0 gives every step more of it to learn from; the forward is the same, but the output head then runs
    on every prompt token too (~1.8x the step cost of the tiny chess-tokenizer model; no better per
    minute there: docs/chess_tokenizer.md)."""
    micro_batch_size: int = resumable(0)
    """Examples per forward/backward (gradient accumulation; 0 = the whole batch at once). Each
    micro-batch's loss is weighted by its share of the batch's loss tokens (completion tokens, plus
    prompt tokens at `prompt_loss_weight`), so the gradient is
    the whole batch's token mean; peak memory follows the micro-batch. In a data-parallel run it
    counts each process's examples."""
    override_dropout: float | None = None
    """Dropout of a model loaded from `model.path` during this SFT (its modules only; the saved config
    keeps the model's own values). null = the model's own dropout. A fresh model uses `model.dropout`."""
    prompt_bos: bool = False
    """Put the tokenizer's BOS (GPT-2: ``<|endoftext|>``) before every prompt, as the upstream RookWorld
    data did before every sample (for a downloaded RookWorld-LM-124M); GRPO's ``task.prompt_bos`` must
    then match. Off for fresh models."""
    fresh_endgames: str | None = None
    """A material (e.g. KQvK): every step trains on `batch_size` fresh won positions of it instead of the data's train
    split, each labelled by the Syzygy tables at `syzygy_path` and written as the data writes its P: lines; never a
    position of the data nor an image of one, nor one of the `endgame_positions` held out (`data.fresh_endgames`).
    It is the continued-SFT control arm of a GRPO run with ``task.fresh_endgames``: the same stream of positions,
    drawn by step, the labelling inside the arm's wall-clock. Needs ``tasks: [policy]``. null = the train split."""
    fresh_endgame_colours: str = "white"
    """The strong side's colour in `fresh_endgames` draws: white, black or both (a GRPO run's
    ``task.fresh_endgame_colours``)."""
    fresh_endgame_clocks: bool = True
    """Give each `fresh_endgames` position the clocks of a position reached in play, as the data's train positions
    (a GRPO run's ``task.fresh_endgame_clocks``); false = placements (``0 1``), as issue 66's first arms drew them."""
    endgame_positions: int = 0
    """With `fresh_endgames`: first hold out this many positions (seeded by `endgame_seed`), never drawn: a GRPO run's
    ``eval.endgame_positions``, so the arm never trains on the positions both arms are evaluated on."""
    endgame_seed: int = 0
    """The seed of the `endgame_positions` set (a GRPO run's ``eval.endgame_seed``)."""
    syzygy_path: str = SYZYGY_DEFAULT
    """The Syzygy tables that label the `fresh_endgames` positions."""
    fresh_target: str = "label"
    """With `fresh_endgames`, what a position teaches: "label" = the data's P: line with one DTZ-optimal B: (the
    control arm); "any_optimal" = the move alone, loss -log of the probability that the answer begins ``B: <m>`` for
    any DTZ-optimal m (`tasks.sft.any_of_loss`; issue 66's any-optimal arm: by supervision, the objective the binary
    GRPO reward pays for). any_optimal needs data in the move-first layout and one process."""
    eval_examples: int = resumable(256)
    """Held-out examples for the held-out loss."""
    eval_prompts: int = resumable(100)
    """Held-out prompts per task decoded greedily for the well-formed rate."""
    eval_batch_size: int = resumable(64)
    max_new_tokens: int = resumable(176)
    """Longest decoded completion in evaluation, in tokens (characters for the char tokenizer)."""

    # Shared knobs with other defaults (train/config.py has their meanings).
    steps: int = resumable(1000)
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    log_every: int = resumable(10)
    eval_every: int = resumable(200)
    checkpoint_every: int = resumable(500)
    eval_at_start: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind != "sft":
            raise ConfigError(f"config key kind must be sft for this config, got {self.kind!r}")
        for name in ("batch_size", "eval_examples", "eval_batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key {name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.prompt_loss_weight) and self.prompt_loss_weight >= 0):
            raise ConfigError(f"config key prompt_loss_weight must be a number >= 0, got {self.prompt_loss_weight}")
        if self.micro_batch_size < 0:
            raise ConfigError(f"config key micro_batch_size must be >= 0 (0 = no split), got {self.micro_batch_size}")
        if self.reshuffle_moves is not None:
            if self.move_order != "shuffle":
                raise ConfigError(
                    f"config keys reshuffle_moves and move_order={self.move_order} both given: "
                    "reshuffle_moves is the old name, set move_order only (reshuffle_moves: null)"
                )
            self.move_order = "shuffle" if self.reshuffle_moves else "as_written"
            self.reshuffle_moves = None
        if self.move_order not in MOVE_ORDERS:
            raise ConfigError(f"config key move_order must be one of {', '.join(MOVE_ORDERS)}, got {self.move_order!r}")
        if self.override_dropout is not None and not 0.0 <= self.override_dropout < 1.0:
            raise ConfigError(f"config key override_dropout must be in [0, 1) or null, got {self.override_dropout}")
        if self.eval_prompts < 0:
            raise ConfigError(f"config key eval_prompts must be >= 0, got {self.eval_prompts}")
        if not self.tasks or any(t not in TASKS for t in self.tasks):
            raise ConfigError(
                f"config key tasks must be a non-empty list of policy/environment, got {list(self.tasks)}"
            )
        if self.first_tasks_steps < 0:
            raise ConfigError(f"config key first_tasks_steps must be >= 0, got {self.first_tasks_steps}")
        if self.first_tasks is not None:
            self.first_tasks = tuple(self.first_tasks)
            if not self.first_tasks or any(t not in self.tasks for t in self.first_tasks):
                raise ConfigError(
                    f"config key first_tasks must be a non-empty subset of tasks {list(self.tasks)}, got {list(self.first_tasks)}"
                )
        if self.first_tasks_steps > 0 and self.first_tasks is None:
            raise ConfigError(
                f"config key first_tasks_steps is {self.first_tasks_steps} but first_tasks is null: name the first stage's tasks"
            )

        if self.fresh_endgames is not None:
            if tuple(self.tasks) != ("policy",):
                raise ConfigError(
                    f"config key fresh_endgames trains on P: examples only: set tasks: [policy], got {list(self.tasks)}"
                )
            if self.fresh_endgame_colours not in ("white", "black", "both"):
                raise ConfigError(
                    f"config key fresh_endgame_colours must be white, black or both, got {self.fresh_endgame_colours!r}"
                )
        if self.fresh_target not in FRESH_TARGETS:
            raise ConfigError(
                f"config key fresh_target must be one of {', '.join(FRESH_TARGETS)}, got {self.fresh_target!r}"
            )
        if self.fresh_target != "label" and self.fresh_endgames is None:
            raise ConfigError(
                f"config key fresh_target={self.fresh_target} trains on fresh positions: set fresh_endgames"
            )
        if self.endgame_positions < 0:
            raise ConfigError(f"config key endgame_positions must be >= 0, got {self.endgame_positions}")
        if self.endgame_positions and self.fresh_endgames is None:
            raise ConfigError("config key endgame_positions holds out fresh positions: it needs fresh_endgames")

    def default_best_metric(self) -> tuple[str, str] | None:
        return "eval/loss", "min"
