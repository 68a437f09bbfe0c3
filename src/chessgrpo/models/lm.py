"""The chess language model: a GPT-2-family causal LM from `transformers`, with its tokenizer.

Two ways to get one, one loading path (`load_lm`):

- a local directory with a model and its tokenizer, e.g. a downloaded RookWorld-LM-124M
  (`AutoModelForCausalLM` + `AutoTokenizer`, ``local_files_only``: nothing is ever downloaded);
- a fresh model from `LMModelConfig` with, by default (``tokenizer: chess``), the word-level
  `models.chess_tokenizer.ChessTokenizer` (one token per UCI move, FEN item, tag, number part and
  space run; ``<|endoftext|>`` = end of sequence), saved as a standard ``tokenizer.json`` that plain
  `transformers` loads too; or (``tokenizer: char``) `models.lm_tokenizers.CharTokenizer`, a
  character-level vocabulary of chess text (newline = end of sequence) saved as
  ``chess_char_tokenizer.json``, which `load_lm` prefers over a `transformers` tokenizer when present.
  Both are built offline.

Layout of every LM batch (sampling, old policy, learner, reference and SFT alike)::

    [left pad ... prompt tokens][completion tokens ... EOS][right pad ...]
     prompt_mask = 0 ... 1       completion_mask = 1 ... 1  0 ...

Position ids are ``cumsum(attention_mask) - 1`` (clamped at 0), so a left-padded row sees exactly
the positions it would see alone; pads are excluded by the attention mask, never by a token id
(GPT-2 pads with its EOS id and our char tokenizer's EOS has id 0: an id says nothing).

**One log-prob function** (docs/architecture.md, invariant 1): `tempered_log_probs` turns logits into the
sampling distribution, and `completion_log_probs` applies it to a full prompt + completion
forward. `generate` samples with it (KV cache, one token at a time), and the behaviour log-probs
of a rollout are then recomputed by `completion_log_probs` on the finished sequences, the very
call the learner, the old policy and the reference make (as TRL does); so on the first minibatch
the ratio is 1 up to float summation order. Temperature only: no top-k/top-p truncation
(invariant 6). `prepare_for_rl` turns every dropout off (invariant 2): set ``dropout`` in a model
config as you like for SFT, RL never sees it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from chessgrpo.errors import InputError, one_line
from chessgrpo.models.lm_tokenizers import CHAR_TOKENIZER_FILE, LM_TOKENIZERS, CharTokenizer, HFTokenizer, LMTokenizer

logger = logging.getLogger(__name__)

LM_MARKER_FILE = "model_config.json"
"""Written next to the weights so `train.checkpoint` recognises an LM checkpoint as complete."""
LM_WEIGHTS_FILE = "model.safetensors"

LM_ARCHITECTURES = ("gpt2", "llama")
"""The architectures of a fresh model (`LMModelConfig.architecture`)."""


# ------------------------------------------------------------------------------------------------
# Models


@dataclasses.dataclass
class LMModelConfig:
    """A fresh GPT-2 for chess text with a chess tokenizer (the `model:` section of a config)."""

    path: str | None = None
    """A local directory (a RookWorld-LM download, an SFT run or checkpoint) to load instead of
    building a fresh model; the fields below then do not apply (SFT keeps the loaded model's own
    dropout unless its `override_dropout` says otherwise)."""
    n_layer: int = 4
    """Transformer blocks."""
    n_embd: int = 128
    """Width."""
    n_head: int = 4
    """Attention heads (n_embd must be a multiple)."""
    n_positions: int = 384
    """Longest sequence (prompt + completion). A: lines are at most ~260 characters."""
    dropout: float = 0.0
    """Residual, embedding and attention dropout of a fresh model during SFT. RL forwards always run without it."""
    architecture: str = "gpt2"
    """Fresh model: "gpt2" (`GPT2LMHeadModel`, learned absolute positions, as RookWorld-LM) or "llama"
    (`LlamaForCausalLM`: rotary relative positions, SwiGLU, RMSNorm, tied embeddings; a stock
    `transformers` class, so the saved directory loads with `AutoModelForCausalLM` as well)."""
    tokenizer: str = "chess"
    """Tokenizer of a fresh model: "chess" (word-level, `models.chess_tokenizer`: ~22 tokens per P:
    answer, saved as a standard tokenizer.json) or "char" (one token per character, `CharTokenizer`).
    A model loaded from `path` always keeps its own tokenizer."""

    def __post_init__(self) -> None:
        if self.architecture not in LM_ARCHITECTURES:
            raise ValueError(f"architecture must be one of {', '.join(LM_ARCHITECTURES)}, got {self.architecture!r}")
        if self.tokenizer not in LM_TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {', '.join(LM_TOKENIZERS)}, got {self.tokenizer!r}")
        if min(self.n_layer, self.n_embd, self.n_head, self.n_positions) < 1:
            raise ValueError("n_layer, n_embd, n_head and n_positions must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@dataclasses.dataclass
class ChessLM:
    """A causal LM and its tokenizer."""

    model: Any
    """A `transformers` causal LM (`PreTrainedModel`)."""
    tokenizer: LMTokenizer
    source: str = "fresh"
    """Where it came from (a directory, or "fresh")."""
    policy_prompt: str = "fen"
    """How its P: prompts are written (`data.rookworld_format.POLICY_PROMPTS`): "fen" (``P: <FEN>``) or
    "legal_moves" (the FEN and its legal moves). Set by SFT from its data, saved in ``model_config.json``
    (a directory without the key, every model before issue 66's second lever, is "fen")."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_positions(self) -> int | None:
        config = self.model.config
        return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def build_lm(config: LMModelConfig, *, seed: int | None = None) -> ChessLM:
    """A freshly initialised causal LM (`config.architecture`) with the configured chess tokenizer
    (offline; no downloads)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from chessgrpo.models.chess_tokenizer import ChessTokenizer

    tokenizer: LMTokenizer = ChessTokenizer() if config.tokenizer == "chess" else CharTokenizer()
    if seed is not None:
        torch.manual_seed(seed)
    if config.architecture == "llama":
        llama_config = LlamaConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=config.n_embd,
            # SwiGLU's three matrices at 8/3 x width hold as many weights as GPT-2's 4 x width MLP.
            intermediate_size=int(math.ceil(config.n_embd * 8 / 3 / 8) * 8),
            num_hidden_layers=config.n_layer,
            num_attention_heads=config.n_head,
            num_key_value_heads=config.n_head,
            max_position_embeddings=config.n_positions,
            attention_dropout=config.dropout,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        )
        return ChessLM(model=LlamaForCausalLM(llama_config), tokenizer=tokenizer, source="fresh")
    gpt_config = GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    model = GPT2LMHeadModel(gpt_config)
    return ChessLM(model=model, tokenizer=tokenizer, source="fresh")


def resolve_lm_directory(path: str | os.PathLike) -> Path:
    """A model directory from itself, or a run directory / its checkpoints dir (the newest intact checkpoint)."""
    from chessgrpo.files import resolve_model_directory

    found = resolve_model_directory(path, lambda d: (d / "config.json").is_file())
    if found is None:
        from chessgrpo.models.checkpoint_kind import LM, is_policy_directory, wrong_kind_error

        policy = resolve_model_directory(path, is_policy_directory)
        mismatch = wrong_kind_error(path, policy, LM) if policy is not None else None
        if mismatch is not None:  # an action-policy checkpoint: say so
            raise mismatch
        raise FileNotFoundError(
            f"no language model at {str(path)!r}: expected a transformers config.json there or an intact "
            "checkpoint in its checkpoints/ (a save_pretrained directory, an SFT run or a checkpoint)"
        )
    return found


def load_lm(path: str | os.PathLike, *, device: str | torch.device = "cpu", dropout: float | None = None) -> ChessLM:
    """Load a causal LM and its tokenizer from a local directory (never from the network).

    `path` is a `save_pretrained` directory (e.g. RookWorld-LM-124M as downloaded), a checkpoint
    or an SFT/GRPO run directory. The tokenizer is ``chess_char_tokenizer.json`` when present,
    else the chess word-level tokenizer when ``tokenizer_config.json`` names it, else the
    directory's `transformers` tokenizer (e.g. GPT-2 BPE). `dropout` (when given) replaces the model
    config's dropout probabilities; RL callers use `prepare_for_rl` instead.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from chessgrpo.models.chess_tokenizer import ChessTokenizer, is_chess_tokenizer_directory

    directory = resolve_lm_directory(path)
    if (directory / CHAR_TOKENIZER_FILE).is_file():
        tokenizer: LMTokenizer = CharTokenizer.load(directory)
    elif is_chess_tokenizer_directory(directory):
        tokenizer = ChessTokenizer.load(directory)
    else:
        try:
            tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
        except (OSError, ValueError) as error:
            raise InputError(
                f"{directory} has a model but no usable tokenizer ({CHAR_TOKENIZER_FILE} or transformers "
                f"tokenizer files): {error}"
            ) from None
    kwargs: dict[str, Any] = {}
    if dropout is not None:
        kwargs = {"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True, **kwargs)
    except SafetensorError as error:  # not an OSError: a truncated or corrupt weights file
        raise InputError(
            f"{directory / LM_WEIGHTS_FILE} is not a readable safetensors file (truncated or corrupt): {one_line(error)}"
        ) from None
    except (OSError, ValueError) as error:
        raise InputError(f"{directory} is not a loadable causal LM: {one_line(error)}") from None
    model.to(device)
    model_vocab = model.get_input_embeddings().num_embeddings
    if tokenizer.vocab_size > model_vocab:
        raise InputError(f"{directory}: tokenizer has {tokenizer.vocab_size} tokens but the model only {model_vocab}")
    return ChessLM(
        model=model, tokenizer=tokenizer, source=str(directory), policy_prompt=saved_policy_prompt(directory)
    )


def saved_policy_prompt(directory: Path) -> str:
    """The P: prompt style `save_lm` recorded in `directory`'s ``model_config.json`` ("fen" when absent)."""
    try:
        marker = json.loads((directory / LM_MARKER_FILE).read_text())
    except (OSError, ValueError):
        return "fen"
    style = marker.get("policy_prompt", "fen") if isinstance(marker, dict) else "fen"
    if style not in ("fen", "legal_moves"):
        raise InputError(f"{directory / LM_MARKER_FILE}: policy_prompt must be fen or legal_moves, got {style!r}")
    return str(style)


def save_lm(lm: ChessLM, directory: str | os.PathLike) -> Path:
    """Write weights (safetensors), config and tokenizer; loadable with `load_lm` and `from_pretrained`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lm.model.save_pretrained(str(directory), safe_serialization=True)
    lm.tokenizer.save(directory)
    marker = {
        "kind": "causal_lm",
        "tokenizer": getattr(lm.tokenizer, "kind", "unknown"),
        "source": lm.source,
        "policy_prompt": lm.policy_prompt,
    }
    (directory / LM_MARKER_FILE).write_text(json.dumps(marker, indent=1))
    if not (directory / LM_WEIGHTS_FILE).is_file():
        raise RuntimeError(f"save_pretrained did not write {LM_WEIGHTS_FILE} into {directory} (sharded?)")
    return directory


def lm_head_parameters(model: torch.nn.Module, head_lr: float | None) -> list[torch.nn.Parameter]:
    """The LM head's parameters when it is its own matrix; a head tied to the token embeddings
    (GPT-2's) has none, and asking for a separate `head_lr` is then a config error."""
    from chessgrpo.config import ConfigError

    head = model.get_output_embeddings()
    if head is None or head.weight is model.get_input_embeddings().weight:
        if head_lr is not None:
            raise ConfigError(
                "config key head_lr: the model's lm_head is tied to its token embeddings; there is no separate head"
            )
        return []
    return list(head.parameters())


def lm_frozen_parameters(model: torch.nn.Module, freeze_layers: int) -> list[torch.nn.Parameter]:
    """The token (and GPT-2's position) embeddings and the first `freeze_layers` blocks (a head
    tied to the embeddings is frozen with them), for GPT-2 (`transformer.wte/wpe/h`) and Llama
    (`model.embed_tokens/layers`); none for 0."""
    from chessgrpo.config import ConfigError

    if not freeze_layers:
        return []
    transformer = getattr(model, "transformer", None)
    decoder = getattr(model, "model", None)
    if (
        transformer is not None
        and hasattr(transformer, "h")
        and hasattr(transformer, "wte")
        and hasattr(transformer, "wpe")
    ):
        blocks, embeddings = transformer.h, [transformer.wte, transformer.wpe]
    elif decoder is not None and hasattr(decoder, "layers") and hasattr(decoder, "embed_tokens"):
        blocks, embeddings = decoder.layers, [decoder.embed_tokens]
    else:
        raise ConfigError(
            f"config key freeze_layers: only GPT-2 and Llama models can freeze layers, not {type(model).__name__}"
        )
    if freeze_layers > len(blocks):
        raise ConfigError(f"config key freeze_layers={freeze_layers} but the model has {len(blocks)} blocks")
    modules = [*embeddings, *blocks[:freeze_layers]]
    return [p for module in modules for p in module.parameters()]


def dropout_probabilities(model: torch.nn.Module) -> list[float]:
    """p of every dropout module, and of every attention module's functional dropout (Llama's
    `attention_dropout` attribute), for tests and diagnostics."""
    modules = list(model.modules())
    return [m.p for m in modules if isinstance(m, torch.nn.Dropout)] + [
        float(m.attention_dropout) for m in modules if isinstance(getattr(m, "attention_dropout", None), float)
    ]


def prepare_for_rl(model: torch.nn.Module) -> torch.nn.Module:
    """Turn every dropout off (p = 0, config probabilities 0) and switch to eval mode.

    Both: eval mode alone is undone by any stray `model.train()`, p = 0 alone leaves other
    train-mode behaviour. docs/architecture.md, invariant 2: no dropout in any RL forward.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):  # Llama: F.dropout with this p in train mode
            module.attention_dropout = 0.0
    config = getattr(model, "config", None)
    if config is not None:
        for name in (
            "resid_pdrop",
            "embd_pdrop",
            "attn_pdrop",
            "summary_first_dropout",
            "dropout",
            "attention_dropout",
            "hidden_dropout",
        ):
            if isinstance(getattr(config, name, None), float):
                setattr(config, name, 0.0)
    model.eval()
    return model


# ------------------------------------------------------------------------------------------------
# Batches and the one log-prob function


def _pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str, left: bool, name: str
) -> tuple[Tensor, Tensor]:
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError(f"{name} needs at least one sequence and no empty sequence")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), None) if left else slice(None, len(seq))
        ids[row, span] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, span] = True
    return ids.to(device), mask.to(device)


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """([N, P] long ids, [N, P] bool mask) with each sequence right-aligned (left padding)."""
    return _pad(sequences, pad_id, device, left=True, name="left_pad")


def right_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """([N, L] long ids, [N, L] bool mask) with each sequence left-aligned (right padding)."""
    return _pad(sequences, pad_id, device, left=False, name="right_pad")


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions counting real tokens only: a left-padded row starts at 0 at its first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def tempered_log_probs(logits: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / temperature) in fp32: THE sampling distribution (no truncation)."""
    return F.log_softmax(_tempered(logits, temperature), dim=-1)


def _tempered(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature in fp32 (no copy for fp32 logits at temperature 1)."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def token_log_probs_and_entropy(
    logits: Tensor, tokens: Tensor, temperature: float, *, with_entropy: bool = False, entropy_grad: bool = True
) -> tuple[Tensor, Tensor | None]:
    """(log-prob of `tokens` [..], exact entropy [..] or None) under softmax(logits / temperature) [.., V].

    The same distribution as `tempered_log_probs`, computed as ``z[token] - logsumexp(z)`` so that
    no [.., V] log-softmax is materialised: with gradients, autograd keeps only z (and, for an
    entropy with gradient, softmax(z)) per row, not the three or four [.., V] copies of
    log_softmax + gather + `categorical_entropy`. `entropy_grad=False` computes the entropy under
    no_grad (a metric only), which frees softmax(z) at once.
    """
    z = _tempered(logits, temperature)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # H = logsumexp(z) - sum_a p(a) z(a); every z is finite (no masked actions in an LM vocabulary).
        entropy = lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
    return logp, entropy


def completion_log_probs(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float,
    with_entropy: bool = False,
    chunk_rows: int = 0,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs [N, L] (fp32) of the completion tokens given left-padded prompts; 0 at masked positions.

    The one function for behaviour (right after sampling), old policy, learner, reference and SFT.
    With `with_entropy`, also the exact entropy [N, L] of the tempered next-token distribution
    at each completion step (`entropy_grad=False`: computed without gradient, a metric only).
    Gradients flow when the caller has them enabled.

    `chunk_rows` > 0 runs the model on at most that many rows at a time, so the [rows, L, vocab]
    logits and their softmax temporaries exist for one chunk only (a GPT-2 vocabulary costs
    ~35 MB per row and copy at L = 176); only [N, L] results are kept. Without gradients that
    bounds the peak; with gradients the graph still holds every chunk until backward, so the
    learner bounds it with micro-batches (`GRPOConfig.micro_batch_size`). 0 = all rows at once.
    Chunking does not change the results beyond float summation order.
    """
    logp, entropy, _ = _chunked_log_probs(
        model,
        None,
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_rows=chunk_rows,
        entropy_grad=entropy_grad,
    )
    return logp, entropy


def completion_log_probs_and_kl(
    model: torch.nn.Module,
    reference: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float,
    chunk_rows: int = 0,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """`completion_log_probs` with entropy, and the exact KL(policy || reference) [N, L] of the whole tempered
    next-token distribution at each completion step (0 at masked positions): the KL term of
    ``grpo.kl_estimator: exact``. The reference runs under no_grad on the same rows; the KL's gradient flows
    through the policy's logits. Costs one reference forward and a [rows, L, vocab] softmax per chunk."""
    logp, entropy, kl = _chunked_log_probs(
        model,
        reference,
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        temperature=temperature,
        with_entropy=True,
        chunk_rows=chunk_rows,
        entropy_grad=entropy_grad,
    )
    assert entropy is not None and kl is not None
    return logp, entropy, kl


def _chunked_log_probs(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    chunk_rows: int,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(log-probs, entropy or None, exact KL to `reference` or None), `chunk_rows` rows per model call."""
    if prompt_ids.shape != prompt_mask.shape or completion_ids.shape != completion_mask.shape:
        raise ValueError("ids and masks must have the same shapes")
    if chunk_rows < 0:
        raise ValueError(f"chunk_rows must be >= 0 (0 = all rows at once), got {chunk_rows}")
    rows = prompt_ids.shape[0]
    step = chunk_rows or max(rows, 1)
    parts = [
        _completion_log_probs_rows(
            model,
            prompt_ids[start : start + step],
            prompt_mask[start : start + step],
            completion_ids[start : start + step],
            completion_mask[start : start + step],
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            reference=reference,
        )
        for start in range(0, rows, step)
    ]
    if len(parts) == 1:
        return parts[0]
    logp = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts]) if with_entropy else None  # type: ignore[misc]
    kl = torch.cat([p[2] for p in parts]) if reference is not None else None  # type: ignore[misc]
    return logp, entropy, kl


def _completion_log_probs_rows(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    reference: torch.nn.Module | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`_chunked_log_probs` of one chunk of rows: one forward (and one of the reference), [n, L] results."""
    length = completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_mask], dim=1).long()
    positions = position_ids(attention)
    # Logits only where they predict a completion token: positions P-1 .. P+L-2, the last L+1
    # positions minus the very last (which predicts past the end).
    out = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=length + 1, use_cache=False
    )
    logits = out.logits[:, :-1]
    del out  # the [n, L+1, V] logits live on only through `logits` (and what autograd saves)
    if logits.shape[1] != length:
        raise RuntimeError(
            f"model returned {logits.shape[1]} positions for a completion of {length} (logits_to_keep unsupported?)"
        )
    logp, entropy = token_log_probs_and_entropy(
        logits, completion_ids, temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
    )
    logp = torch.where(completion_mask, logp, torch.zeros_like(logp))
    if entropy is not None:
        entropy = torch.where(completion_mask, entropy, torch.zeros_like(entropy))
    kl = None
    if reference is not None:
        with torch.no_grad():
            ref_out = reference(
                input_ids=ids,
                attention_mask=attention,
                position_ids=positions,
                logits_to_keep=length + 1,
                use_cache=False,
            )
            ref_logp_full = torch.log_softmax(_tempered(ref_out.logits[:, :-1].to(logits.device), temperature), dim=-1)
            del ref_out
        logp_full = torch.log_softmax(_tempered(logits, temperature), dim=-1)
        # Every logit is finite in an LM vocabulary, so no -inf handling (unlike `rl.exact_kl` over legal moves).
        kl = (logp_full.exp() * (logp_full - ref_logp_full)).sum(dim=-1)
        kl = torch.where(completion_mask, kl, torch.zeros_like(kl))
    return logp, entropy, kl
