"""`kind: pretrain`: supervised pretraining of the action policy on engine-labelled positions.

The objectives (``bc``: cross-entropy to the best move; ``distill``: cross-entropy to
``softmax(win_probs / T)`` over the labelled multipv moves), their targets and the held-out
metrics are the pure functions of `tasks.supervised`.

``human`` imitates people instead of the engine (in the style of Maia): cross-entropy to the move
actually played in the game (the ``human_move`` column that `data import-pgn` keeps). Both splits are
loaded with only the rows that have one, and with `human_min_rating` / `human_max_rating` only the
rows whose mover's rating (``mover_rating``) is inside the band (inclusive; a row without a rating is
then left out): one model per rating band, as Maia trains them. Held-out evaluation adds
eval/human_top1 (agreement with the players' moves: the number that matters), eval/human_top5 and
eval/human_nll beside the engine metrics on the same rows; eval/loss is eval/human_nll, and
`checkpoints/best` follows it by default.

A model with a value head (`model.value_head`) also learns each position's labelled value
(cross-entropy to the expected score, weight `value_loss_weight`); search evaluates leaves with it.

One step (`PretrainKind.train_step`): the next `batch_size` positions of the shuffled train split
(`train.dataset.EpochSampler`: one seeded permutation per epoch), the forward in train mode
(dropout on, bf16 autocast when asked; the log-probs and the loss stay fp32), one optimizer update
through the loop's `Learner` (backward, clipping to `max_grad_norm`, AdamW step). With
`prefetch_batches` > 0 (the default, 2) a background thread builds the next batches while the model
steps (`train.dataset.BatchPrefetcher`; pinned memory and an asynchronous copy on CUDA); the batches,
and so the run, are the same as built in the step, bit for bit.

Evaluation runs on the dataset's test split in eval mode and fp32 (eval/loss, eval/top1,
eval/top5, eval/nll, eval/perplexity, eval/in_multipv); a dataset without a test split is trained
without held-out evaluation. `checkpoints/best` follows eval/nll (the best-move cross-entropy,
comparable across objectives) unless `checkpoint_best_metric` says otherwise.

The kind's resumable state is the sampler's position (of the batches trained on, not of those
prefetched); with the loop's optimizer and RNG state a resumed run is bitwise identical to a straight
one on the same device and thread count.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, Literal

import torch

from chessgrpo.config import ConfigError, RunConfig, resumable
from chessgrpo.errors import InputError
from chessgrpo.models.policy import (
    ActionPolicy,
    ModelConfig,
    frozen_parameters,
    load_policy,
    log_probs,
    save_policy,
    value_head_parameters,
)
from chessgrpo.rl.loss import categorical_entropy
from chessgrpo.tasks.supervised import (
    OBJECTIVES,
    accuracy_sums,
    best_move_nll,
    evaluate_policy_on_split,
    objective_loss,
    split_sums,
    value_loss,
    value_sums,
    value_targets,
)
from chessgrpo.train.config import TrainConfig
from chessgrpo.train.dataset import (
    Batch,
    BatchPrefetcher,
    EpochSampler,
    HumanMoves,
    NoRowsLeft,
    PositionTensors,
    has_split,
    load_split,
)
from chessgrpo.train.kind import Kind, RunContext

logger = logging.getLogger(__name__)

PretrainObjective = Literal["bc", "distill", "human"]
PRETRAIN_OBJECTIVES: tuple[str, ...] = (*OBJECTIVES, "human")


@dataclasses.dataclass
class PretrainTrainConfig(TrainConfig):
    """`chessgrpo pretrain` (= `chessgrpo train` with ``kind: pretrain``): supervised pretraining of the action policy."""

    kind: str = "pretrain"
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(name="pretrain"))
    steps: int = resumable(1000)
    """Total optimizer steps of the run (the cosine reaches its floor here). A resume may extend it (the schedule then moves)."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay, on matrices and embeddings only (not biases or norms)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""
    warmup_steps: int = 50
    """Linear warmup steps before the cosine decay."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine as a fraction of lr."""
    log_every: int = resumable(10)
    """Write train metrics (averaged over the steps since the last row) every this many steps."""
    eval_every: int = resumable(200)
    """Evaluate on the test split every this many steps and at the last step (0 = only at the last)."""
    eval_at_start: bool = False
    """Also evaluate the initial (random) policy at step 0."""
    checkpoint_every: int = resumable(200)
    """Save a checkpoint every this many steps (0 = only at the end); the last step is always saved."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy's shape (a named size, optionally with fields replaced) and its pretraining dropout."""
    init_checkpoint: str | None = None
    """Start from this policy's weights (run or checkpoint dir) instead of a fresh `model`, whose shape
    is then the checkpoint's (`model` is ignored): continued supervised training, e.g. the
    equal-compute alternative to a GRPO stage."""
    data: str = "data/tiny"
    """Dataset directory with train/ and test/ Parquet shards (`chessgrpo data generate`)."""
    objective: PretrainObjective = "bc"
    """bc: cross-entropy to the best move; distill: cross-entropy to softmax(win_probs / T) over the multipv moves;
    human: cross-entropy to the move played in the game (`human_move` of `data import-pgn`; rows without one are skipped)."""
    human_min_rating: int | None = None
    """objective human only: keep rows whose mover's rating (`mover_rating`) is >= this; null = no lower bound.
    With a bound set, rows without a rating are left out."""
    human_max_rating: int | None = None
    """objective human only: keep rows whose mover's rating is <= this; null = no upper bound."""
    distill_temperature: float = 0.05
    """T of the distill target, in win-probability units (0.05: a move 0.05 worse gets e^-1 of the weight)."""
    value_loss_weight: float = 1.0
    """Weight of the value head's loss (cross-entropy to the labelled position value) beside the move
    objective; used only when the model has a value head (`model.value_head`). 0 leaves the head as it is."""
    batch_size: int = 256
    """Positions per optimizer step."""
    eval_batch_size: int = resumable(1024)
    """Positions per forward pass during evaluation (does not change the metrics beyond float rounding)."""
    prefetch_batches: int = resumable(2)
    """Build this many training batches ahead in a background thread (pinned for an asynchronous copy on CUDA),
    so the GPU does not wait for the host between steps; 0 = build each batch in the step. The batches and the
    results are the same either way, bit for bit (`train.dataset.BatchPrefetcher`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind != "pretrain":
            raise ConfigError(f"config key kind must be pretrain for this config, got {self.kind!r}")
        for name in ("batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config key {name} must be >= 1, got {getattr(self, name)}")
        if (
            isinstance(self.prefetch_batches, bool)
            or not isinstance(self.prefetch_batches, int)
            or self.prefetch_batches < 0
        ):
            raise ConfigError(
                f"config key prefetch_batches must be an integer >= 0 (0 = no prefetching), got {self.prefetch_batches!r}"
            )
        if self.objective not in PRETRAIN_OBJECTIVES:
            raise ConfigError(
                f"config key objective must be one of {', '.join(PRETRAIN_OBJECTIVES)}, got {self.objective!r}"
            )
        for name in ("human_min_rating", "human_max_rating"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.objective != "human":
                raise ConfigError(
                    f"config key {name} filters the human moves: it needs objective: human (got {self.objective!r}), or set it to null"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config key {name} must be an integer rating >= 0 or null, got {value!r}")
        low, high = self.human_min_rating, self.human_max_rating
        if low is not None and high is not None and low > high:
            raise ConfigError(
                f"config keys human_min_rating ({low}) > human_max_rating ({high}): the rating band is empty"
            )
        if not (math.isfinite(self.distill_temperature) and self.distill_temperature > 0):
            raise ConfigError(f"config key distill_temperature must be > 0, got {self.distill_temperature}")
        if not (math.isfinite(self.value_loss_weight) and self.value_loss_weight >= 0):
            raise ConfigError(f"config key value_loss_weight must be >= 0, got {self.value_loss_weight}")
        try:
            self.model.policy_config()
        except ValueError as error:
            raise ConfigError(f"config key model: {error}") from None

    def default_best_metric(self) -> tuple[str, str] | None:
        return ("eval/human_nll", "min") if self.objective == "human" else ("eval/nll", "min")

    @property
    def human_moves(self) -> HumanMoves | None:
        """The row filter of the human objective (None for bc and distill)."""
        return HumanMoves(self.human_min_rating, self.human_max_rating) if self.objective == "human" else None


class PretrainKind(Kind):
    """Supervised pretraining of an `ActionPolicy` (module docstring)."""

    name = "pretrain"
    config_class = PretrainTrainConfig

    def __init__(self, config: PretrainTrainConfig, context: RunContext):
        super().__init__(config, context)
        if config.reference_device is not None:
            from chessgrpo.config import ConfigError

            raise ConfigError(f"config key reference_device: kind {self.name} has no reference model (set it to null)")
        started = time.perf_counter()
        start = load_policy(config.init_checkpoint, device=context.device) if config.init_checkpoint else None
        shape = start.config if start is not None else config.model
        facts, extra = shape.move_facts, shape.extra_facts  # then load them with the positions
        human = config.human_moves
        try:
            self.train_data = load_split(config.data, "train", move_facts=facts, human=human, extra_facts=extra)
        except NoRowsLeft as error:
            raise InputError(f"objective human: {error}") from None
        self.test_data: PositionTensors | None = None
        self.no_test_reason = "the dataset has no test split"
        if has_split(config.data, "test"):
            try:
                self.test_data = load_split(config.data, "test", move_facts=facts, human=human, extra_facts=extra)
            except NoRowsLeft as error:
                self.no_test_reason = "the test split has no row to imitate"
                logger.warning("objective human: %s; held-out evaluation is skipped", error)
        else:
            logger.warning("dataset %s has no test split: held-out evaluation is skipped", config.data)
        logger.info(
            "loaded %d train and %d test positions from %s in %.1fs",
            len(self.train_data),
            len(self.test_data or ()),
            config.data,
            time.perf_counter() - started,
        )
        # The loop seeded torch just before building the kind: this draws the initial weights.
        self.model = start if start is not None else ActionPolicy(config.model.policy_config()).to(context.device)
        self.model.train()  # dropout during the steps; evaluation switches to eval mode and back
        self.sampler = EpochSampler(len(self.train_data), config.batch_size, config.run.seed)
        self._prefetcher: BatchPrefetcher[Batch] | None = (
            None  # started at the first step, from the sampler's state then
        )
        self.last_eval: dict[str, float] | None = None
        self._samples, self._seconds = 0, 0.0  # this invocation's training throughput (the summary)
        logger.info("model: %s, %.2fM parameters", self.model.config, self.model.num_parameters() / 1e6)

    def head_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.head.parameters())

    @property
    def trains_value(self) -> bool:
        """The model has a value head and the value loss has a weight."""
        return self.model.value_head is not None and self.config.value_loss_weight > 0

    def frozen_parameters(self, freeze_layers: int) -> list[torch.nn.Parameter]:
        # An untrained value head stays frozen (DDP needs a gradient for every trainable parameter).
        return frozen_parameters(self.model, freeze_layers) + (
            [] if self.trains_value else value_head_parameters(self.model)
        )

    # -- the step -----------------------------------------------------------------------------------

    def train_step(self, step: int, learner: Any) -> dict[str, float]:
        config, device = self.config, self.context.device
        tick = time.perf_counter()
        indices, batch = self.next_batch()
        parallel = self.context.parallel
        mine = parallel.split(len(indices))
        with self.context.autocast():
            output = self.learner_model(batch.tokens, with_value=self.trains_value)
        logits, value_logits = output if self.trains_value else (output, None)
        logp = log_probs(logits, batch.legal_mask)  # float32 whatever the autocast dtype
        policy_loss = _objective_loss(logp, batch, config.objective, config.distill_temperature).mean()
        loss = policy_loss
        if value_logits is not None:
            targets = value_targets(batch)
            loss = loss + config.value_loss_weight * value_loss(value_logits, targets).mean()
        # The mean over the global batch: each rank's mean weighted by its share (DDP averages gradients).
        weight = parallel.world_size * len(mine) / len(indices)
        grad_norm = learner.update(loss if parallel.world_size == 1 else loss * weight)

        with torch.no_grad():
            sums = accuracy_sums(logp.detach(), batch)
            size = len(batch.best_action)
            metrics = {
                "loss/train": float(loss),
                "loss/moves": float(policy_loss),
                "train/top1": sums["top1"] / size,
                "train/top5": sums["top5"] / size,
                "train/nll": sums["nll"] / size,
                "entropy/mean": float(categorical_entropy(logp.detach()).mean()),  # logp: the masked log-probs above
                "entropy/ln_legal": float(batch.legal_mask.sum(dim=-1).float().log().mean()),
                "grad_norm": grad_norm,
            }
            if batch.human_action is not None:  # objective human: agreement with the players' moves
                metrics["train/human_top1"] = _human_sums(logp.detach(), batch)["human_top1"] / size
            if value_logits is not None:
                values = value_sums(value_logits.detach(), targets)
                metrics["loss/value"] = values["value_bce"] / size
                metrics["train/value_mae"] = values["value_mae"] / size
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - tick
        self._samples += len(indices)  # every rank's samples: the ranks step together
        self._seconds += seconds
        metrics["perf/step_s"] = seconds  # batch, forward, update: what perf/samples_per_s divides by
        return metrics

    def next_batch(self) -> tuple[torch.Tensor, Batch]:
        """The step's global indices (the sampler advances by one batch) and this rank's share of them as a
        batch on the device: built here, or taken from the prefetch thread (`prefetch_batches`)."""
        if self.config.prefetch_batches and self._prefetcher is None:  # it copies the sampler's position now
            self._prefetcher = BatchPrefetcher(self.sampler, self._build_batch, self.config.prefetch_batches)
        indices = self.sampler.next_indices()  # the global batch; a data-parallel rank learns from its share
        if self._prefetcher is None:
            mine = self.context.parallel.split(len(indices))
            return indices, self.train_data.batch(indices[mine.start : mine.stop]).to(self.context.device)
        ahead, batch = self._prefetcher.next()
        if not torch.equal(
            ahead, indices
        ):  # the thread's copy of the sampler must draw what the checkpointed one draws
            raise RuntimeError("the prefetched batch is not the sampler's next batch (prefetch out of step)")
        return indices, batch.to(self.context.device)  # pinned already on CUDA: an asynchronous copy

    def _build_batch(self, indices: torch.Tensor) -> Batch:
        """This rank's share of a global batch on the host (prefetch thread): uint8 inputs, pinned for CUDA."""
        mine = self.context.parallel.split(len(indices))
        batch = self.train_data.batch(indices[mine.start : mine.stop], token_dtype=torch.uint8)
        return batch.pin_memory() if self.context.device.type == "cuda" else batch

    def _stop_prefetch(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def close(self) -> None:
        """Stop the prefetch thread."""
        self._stop_prefetch()

    def finish_window(self, values: dict[str, float]) -> dict[str, float]:
        """train/nll (a mean over the window) becomes train/perplexity; perf/samples_per_s from the mean step time."""
        row = dict(values)
        if "train/nll" in row:
            row["train/perplexity"] = math.exp(row.pop("train/nll"))
        if "perf/step_s" in row:
            row["perf/samples_per_s"] = self.config.batch_size / max(row["perf/step_s"], 1e-9)
        return row

    # -- evaluation ---------------------------------------------------------------------------------

    @property
    def evaluates(self) -> bool:
        return self.test_data is not None

    def evaluate(self, step: int, out_dir: Path) -> dict[str, float]:
        """The objective, top-1/top-5, best-move nll and perplexity on the test split (fp32, eval mode);
        for objective human also the agreement with the players' moves (`evaluate_human_on_split`)."""
        return dict(self._evaluate_test_split())

    def after_run(self, out_dir: Path) -> None:
        """A resumed run that was already finished evaluated nothing in this invocation: evaluate for the summary."""
        if self.last_eval is None and self.test_data is not None:
            self._evaluate_test_split()

    def _evaluate_test_split(self) -> dict[str, float]:
        assert self.test_data is not None
        config = self.config
        if config.objective == "human":
            self.last_eval = evaluate_human_on_split(
                self.model, self.test_data, batch_size=config.eval_batch_size, device=self.context.device
            )
        else:
            self.last_eval = evaluate_policy_on_split(
                self.model,
                self.test_data,
                objective=config.objective,
                temperature=config.distill_temperature,
                batch_size=config.eval_batch_size,
                device=self.context.device,
            )
        return self.last_eval

    # -- state --------------------------------------------------------------------------------------

    def save_model(self, directory: Path) -> None:
        save_policy(self.model, directory)

    def load_model(self, checkpoint: Path) -> None:
        self.model.load_state_dict(load_policy(checkpoint, device=self.context.device).state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        config = self.config
        self._stop_prefetch()  # its batches follow the old position (a resume, or a rollback to a checkpoint)
        self.sampler = EpochSampler.from_state(
            state["sampler"], len(self.train_data), config.batch_size, config.run.seed
        )

    # -- presentation -------------------------------------------------------------------------------

    def progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        postfix = {}
        if "loss/train" in row:
            postfix["loss"] = f"{row['loss/train']:.3f}"
        if "train/human_top1" in row:
            postfix["human_top1"] = f"{row['train/human_top1']:.3f}"
        elif "train/top1" in row:
            postfix["top1"] = f"{row['train/top1']:.3f}"
        if "perf/samples_per_s" in row:
            postfix["sps"] = f"{row['perf/samples_per_s']:.0f}"
        if "eval/human_top1" in row:
            postfix["heldout_human_top1"] = f"{row['eval/human_top1']:.3f}"
        elif "eval/top1" in row:
            postfix["heldout_top1"] = f"{row['eval/top1']:.3f}"
        return postfix

    def eval_line(self, step: int, row: dict[str, Any]) -> str | None:
        if "eval/top1" not in row:
            return None
        value = f", value MAE {row['eval/value_mae']:.3f}" if "eval/value_mae" in row else ""
        if "eval/human_top1" in row:
            return (
                f"step {step}: held-out human-move top-1 {row['eval/human_top1']:.3f}, top-5 {row['eval/human_top5']:.3f}, "
                f"nll {row['eval/human_nll']:.4f}; engine best move top-1 {row['eval/top1']:.3f}, nll {row['eval/nll']:.4f}{value}"
            )
        return (
            f"step {step}: held-out top-1 {row['eval/top1']:.3f}, top-5 {row['eval/top5']:.3f}, "
            f"loss {row['eval/loss']:.4f}, best-move nll {row['eval/nll']:.4f}{value}"
        )

    def summary(self) -> list[str]:
        config = self.config
        throughput = f", {self._samples / self._seconds:.0f} samples/s" if self._seconds else ""
        band = f" ({config.human_moves.describe()})" if config.human_moves is not None else ""
        lines = [
            f"{config.objective}{band} on {config.data}, model {config.model.describe()} "
            f"({self.model.num_parameters() / 1e6:.2f}M parameters){throughput}"
        ]
        if self.test_data is None:
            lines.append(f"held-out: {self.no_test_reason}")
        elif self.last_eval is not None:
            e = self.last_eval
            value = f", value MAE {e['eval/value_mae']:.3f}" if "eval/value_mae" in e else ""
            if "eval/human_top1" in e:
                lines.append(
                    f"held-out ({len(self.test_data)} positions): human-move top-1 {100 * e['eval/human_top1']:.1f}%, "
                    f"top-5 {100 * e['eval/human_top5']:.1f}%, nll {e['eval/human_nll']:.4f}; engine best move "
                    f"top-1 {100 * e['eval/top1']:.1f}%, top-5 {100 * e['eval/top5']:.1f}%, nll {e['eval/nll']:.4f}{value}"
                )
            else:
                lines.append(
                    f"held-out ({len(self.test_data)} positions): top-1 {100 * e['eval/top1']:.1f}%, top-5 {100 * e['eval/top5']:.1f}%, "
                    f"loss {e['eval/loss']:.4f}, best-move nll {e['eval/nll']:.4f} (perplexity {e['eval/perplexity']:.2f}){value}"
                )
        return lines


# -- the human objective ------------------------------------------------------------------------------


def _objective_loss(logp: torch.Tensor, batch: Batch, objective: str, temperature: float) -> torch.Tensor:
    """Per-row loss: `supervised.objective_loss` for bc and distill, -log p(human move) for human."""
    if objective == "human":
        if batch.human_action is None:
            raise ValueError("objective human needs batches with human moves (load the split with HumanMoves)")
        return best_move_nll(logp, batch.human_action)
    return objective_loss(logp, batch, objective, temperature)  # type: ignore[arg-type]


@torch.no_grad()
def _human_sums(logp: torch.Tensor, batch: Batch) -> dict[str, float]:
    """Sums over the batch: top-1/top-5 agreement with the human move and its nll."""
    assert batch.human_action is not None
    human = batch.human_action.unsqueeze(1)
    top5 = logp.topk(min(5, logp.shape[1]), dim=-1).indices
    return {
        "human_top1": float((top5[:, :1] == human).sum()),
        "human_top5": float((top5 == human).any(dim=-1).sum()),
        "human_nll": float(best_move_nll(logp, batch.human_action).sum()),
    }


def evaluate_human_on_split(
    model: ActionPolicy, data: PositionTensors, *, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Held-out metrics of the human objective (fp32, eval mode, the model's mode restored): eval/human_top1,
    eval/human_top5, eval/human_nll (= eval/loss) against the players' moves, and on the same rows the
    engine metrics of `supervised.evaluate_policy_on_split` (eval/top1, eval/top5, eval/nll, eval/perplexity,
    eval/in_multipv; with a value head eval/value_mae and eval/value_bce)."""
    if data.human_action is None:
        raise ValueError("evaluate_human_on_split needs a split loaded with HumanMoves")
    totals = split_sums(model, data, batch_size=batch_size, device=device, extra=_human_sums)
    metrics = {f"eval/{key}": value / len(data) for key, value in totals.items()}
    metrics["eval/loss"] = metrics["eval/human_nll"]
    metrics["eval/perplexity"] = math.exp(metrics["eval/nll"])
    return metrics
