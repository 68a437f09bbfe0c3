"""The action policy: a small bidirectional transformer from 77 FEN tokens to 1968 move logits.

Every row has exactly 77 real tokens (`chessgrpo.board.encode_fen`), so there is no padding and
no attention mask; attention is bidirectional. Pre-norm blocks, learned positions, no dropout by
default, and one of two heads over `chessgrpo.board.ACTIONS`:

- ``square_pair`` (default): the logit of a move is a scaled dot product between a query from
  its from-square token and a key from its to-square token, plus a promotion-piece term from the
  from-square token and a learned per-action bias. Every move reads the two squares it connects,
  as in Lc0's attention policy head; on our small datasets it reached top-1 0.232 where a pooled
  head plateaued at 0.132 (docs/results.md, "Design choices").
- ``pooled``: a linear layer over the mean of all token representations (the first design).

With ``move_facts`` (`board.move_facts`: check, checkmate, stalemate, dead draw, fifty moves per
legal move), each row also carries one fact byte per action after its 77 tokens, and
`MoveFactsHead` adds a learned, position-dependent weight per fact to the moves' logits: rules a
small transformer cannot derive from the board in one pass (docs/results.md, "Design choices").

`log_probs` (`models.sampling`) is the single function that turns logits into log-probabilities
(temperature and legal-move mask applied); sampling, evaluation and every loss call it, so the behaviour
policy and the learner can never disagree on the distribution (docs/architecture.md, invariant 1).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import chess
import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save
from torch import nn

from chessgrpo.board import ACTIONS, NUM_ACTIONS, SEQUENCE_LENGTH, VOCAB_SIZE, encode_fens, legal_masks
from chessgrpo.board.encoding import VOCABULARY
from chessgrpo.board.move_facts import EXTRA_FACTS, MOVE_FACTS, fact_bit_positions, move_fact_array
from chessgrpo.errors import InputError, one_line
from chessgrpo.files import write_bytes_atomic, write_text_atomic
from chessgrpo.models.sampling import log_probs as log_probs  # re-exported: callers know it as the policy's
from chessgrpo.models.sampling import sample_actions

MODEL_FILE = "model.safetensors"
WHITE_TO_MOVE_TOKEN = VOCABULARY.index("w")
"""Token 0 of every encoded position is the side to move (`board.encoding`)."""
CONFIG_FILE = "model_config.json"


@dataclasses.dataclass
class PolicyConfig:
    """Shape of an `ActionPolicy`. Sizes by name: `PolicyConfig.from_size("tiny")`."""

    n_layers: int = 2
    """Transformer blocks."""
    d_model: int = 64
    """Width of the token representations."""
    n_heads: int = 4
    """Attention heads (d_model must be divisible by it)."""
    d_ff: int = 0
    """Hidden width of the MLP; 0 means 4 * d_model."""
    dropout: float = 0.0
    """Dropout in attention and MLP (training only; RL forwards always run without it)."""
    head: str = "square_pair"
    """``square_pair`` (from-square query . to-square key, the default) or ``pooled`` (linear over the mean token)."""
    head_dim: int = 0
    """Query/key width of the square_pair head; 0 means d_model."""
    move_facts: bool = False
    """Also read each legal move's facts (check, mate, stalemate, dead draw: `board.move_facts`):
    the inputs are then [B, 77 + 1968] (the 77 board tokens, then one fact byte per action), and
    each fact adds a learned, position-dependent amount to its moves' logits (zero at init)."""
    en_prise: bool = False
    """With `move_facts`: one more fact, `board.move_facts.EN_PRISE` (the moved piece can be taken at
    a loss, a one-exchange static estimate). False in every policy saved before it existed."""
    mate_in_two: bool = False
    """With `move_facts`: one more fact, `board.move_facts.MATE_IN_TWO` (the move is a check that forces
    mate in two; exact). False in every policy saved before it existed."""
    leaves_hanging: bool = False
    """With `move_facts`: one more fact, `board.move_facts.LEAVES_HANGING` (after the move the opponent can
    win a piece's worth with one capture, a one-exchange static estimate over all the mover's pieces).
    False in every policy saved before it existed."""
    repetition: bool = False
    """With `move_facts`: one more fact, `board.repetitions.REPETITION` (the position after the move stood on the
    board before in this game; from the move stack, so 0 on a board without one). False in older policies."""
    threefold: bool = False
    """With `move_facts`: one more fact, `board.repetitions.THREEFOLD` (the move draws by threefold repetition).
    False in older policies."""
    allows_threefold: bool = False
    """With `move_facts`: one more fact, `board.repetitions.ALLOWS_THREEFOLD` (the opponent can then draw by threefold
    repetition at once). False in older policies."""
    value_head: bool = False
    """Also predict the side to move's expected score in [0, 1] (`ValueHead`, on the shared trunk):
    what search (`chessgrpo.search`) evaluates its leaves with."""

    @classmethod
    def from_size(cls, size: str) -> PolicyConfig:
        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}")
        return cls(**MODEL_SIZES[size])

    def __post_init__(self) -> None:
        if min(self.n_layers, self.d_model, self.n_heads) < 1 or min(self.d_ff, self.head_dim) < 0:
            raise ValueError(
                f"need n_layers, d_model, n_heads >= 1 and d_ff, head_dim >= 0, got n_layers={self.n_layers}, "
                f"d_model={self.d_model}, n_heads={self.n_heads}, d_ff={self.d_ff}, head_dim={self.head_dim}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.head not in HEADS:
            raise ValueError(f"unknown policy head {self.head!r}; choose one of {list(HEADS)}")
        for name in self.extra_facts:
            if not self.move_facts:
                raise ValueError(f"{name} is a move fact: it needs move_facts: true")

    @property
    def extra_facts(self) -> tuple[str, ...]:
        """The optional move facts (`board.move_facts.EXTRA_FACTS`) this policy reads."""
        return tuple(name for name in EXTRA_FACTS if getattr(self, name))  # each optional fact is a bool field

    @property
    def fact_names(self) -> tuple[str, ...]:
        """The move facts this policy reads, in bit order (none without `move_facts`)."""
        if not self.move_facts:
            return ()
        return (*MOVE_FACTS, *self.extra_facts)


HEADS = ("square_pair", "pooled")


MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(n_layers=2, d_model=64, n_heads=4),  # ~0.2M parameters: minutes on a laptop CPU
    "small": dict(n_layers=8, d_model=256, n_heads=8),  # ~7M, close to searchless_chess's 9M
    "medium": dict(n_layers=12, d_model=512, n_heads=8),  # ~39M
}


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: PolicyConfig):
        super().__init__()
        d_ff = config.d_ff or 4 * config.d_model
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, d_ff), nn.GELU(), nn.Linear(d_ff, config.d_model))
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).split(width, dim=-1)
        shape = (batch, length, self.n_heads, width // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        # Bidirectional: every square sees every other; no padding exists, so no mask at all.
        if x.device.type == "cpu" and not torch.is_grad_enabled() and not (self.training and self.dropout > 0):
            # Inference on the CPU (rollouts, games, search): at 77 tokens and head width 16 the explicit
            # product is ~2x faster than PyTorch's fused CPU kernel (docs/results.md, "Design choices";
            # docs/benchmarks.md, "GRPO steps: `bench/rollout_throughput.py`"); the same function, equal to
            # float rounding (logits within ~4e-6). Training keeps the fused kernel.
            attended = ((q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)).softmax(dim=-1) @ v
        else:
            attended = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.resid_dropout(self.proj(attended.transpose(1, 2).reshape(batch, length, width)))
        return x + self.resid_dropout(self.mlp(self.ln_mlp(x)))


def _square_pair_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per action: its index into a flattened [64 from, 64 to] grid, its from-square, its promotion slot.

    Squares are python-chess indices (a1 = 0); promotion slot 0 means none, 1..4 = q, r, b, n.
    """
    pair, source, promotion = [], [], []
    slots = {"": 0, "q": 1, "r": 2, "b": 3, "n": 4}
    for uci in ACTIONS:
        move = chess.Move.from_uci(uci)
        pair.append(move.from_square * 64 + move.to_square)
        source.append(move.from_square)
        promotion.append(slots[uci[4:]])
    return torch.tensor(pair), torch.tensor(source), torch.tensor(promotion)


def _board_token_positions() -> torch.Tensor:
    """Token position of each square (a1 = 0 ... h8 = 63): the board is tokens 1..64 in FEN order."""
    return torch.tensor([1 + (7 - square // 8) * 8 + square % 8 for square in range(64)])


class SquarePairHead(nn.Module):
    """Move logits from the two squares a move connects (see the module docstring)."""

    def __init__(self, d_model: int, head_dim: int):
        super().__init__()
        self.query = nn.Linear(d_model, head_dim)
        self.key = nn.Linear(d_model, head_dim)
        self.promotion = nn.Linear(d_model, 5)  # slot 0 (no promotion) is never read as a bonus
        self.action_bias = nn.Parameter(torch.zeros(NUM_ACTIONS))
        self.scale = 1.0 / math.sqrt(head_dim)
        pair, source, promotion = _square_pair_tables()
        self.register_buffer("square_tokens", _board_token_positions(), persistent=False)
        self.register_buffer("action_pair", pair, persistent=False)
        self.register_buffer("action_source", source, persistent=False)
        self.register_buffer("action_promotion", promotion, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        squares = x[:, self.square_tokens]  # [B, 64, d], a1..h8
        pair_logits = torch.einsum("bfd,btd->bft", self.query(squares), self.key(squares)) * self.scale
        logits = pair_logits.flatten(1)[:, self.action_pair]  # [B, 1968]
        promotion = self.promotion(squares)  # [B, 64, 5]
        promotion = promotion.masked_fill(torch.arange(5, device=x.device) == 0, 0.0)
        logits = logits + promotion[:, self.action_source, self.action_promotion]
        return logits + self.action_bias


class MoveFactsHead(nn.Module):
    """Logit bias of each action from its fact byte: sum over set facts f of w_f(position).

    w(position) is linear in the mean token representation, so what a fact is worth depends on the
    position (stalemating is a blunder when winning, a save when losing). Zero-initialised: adding
    the head leaves a policy's distribution unchanged until training moves it.
    """

    def __init__(self, d_model: int, facts: Sequence[str] = MOVE_FACTS):
        super().__init__()
        self.weights = nn.Linear(d_model, len(facts))  # one weight per named fact; other bits are ignored
        self.register_buffer("shifts", torch.tensor(fact_bit_positions(facts)), persistent=False)
        # [V, F]: which named facts each possible fact value sets; V = 256, or up to 2048 with the history facts (bits 8-10).
        values = 1 << max(8, max(fact_bit_positions(facts), default=0) + 1)
        self.register_buffer("byte_bits", (torch.arange(values).unsqueeze(-1) >> self.shifts) & 1, persistent=False)

    def reset(self) -> None:
        nn.init.zeros_(self.weights.weight)
        nn.init.zeros_(self.weights.bias)

    def forward(self, x: torch.Tensor, facts: torch.Tensor) -> torch.Tensor:
        weights = self.weights(x.mean(dim=1))  # [B, F]
        # The bias of each possible fact value, then looked up per action: the same sums as expanding
        # every action's bits ([B, 1968, F]), at a tenth of the cost in a training step.
        per_byte = weights @ self.byte_bits.to(weights.dtype).T  # [B, V]
        return per_byte.gather(1, facts.long())


class ValueHead(nn.Module):
    """The side to move's expected score (win + draw / 2, the engine labels' `value`) as a logit;
    `torch.sigmoid` of the output is the value.

    Lc0's value head shape: each token is projected to a few channels, the board is flattened and
    an MLP reads it, so the head sees *where* every piece is. It predicts **White's** score and the
    side to move's follows exactly (sigmoid(-z) = 1 - sigmoid(z)): the tokens are not flipped for
    Black (searchless_chess's encoding), so a head asked for the mover's score directly must first
    learn "material sign XOR side to move". Measured on data/tiny, trained beside the policy: a
    head over the mean token stayed at the constant baseline (MAE 0.37-0.40 after 600 steps) in
    either form; this one reaches 0.14 in 400 (docs/results.md, "Design choices").
    """

    def __init__(self, d_model: int, channels: int = 8, hidden: int = 128):
        super().__init__()
        self.project = nn.Linear(d_model, channels)
        self.mlp = nn.Sequential(nn.Linear(SEQUENCE_LENGTH * channels, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, white_to_move: torch.Tensor) -> torch.Tensor:
        white_logit = self.mlp(self.project(x).flatten(1)).squeeze(-1)
        return torch.where(white_to_move, white_logit, -white_logit)


class ActionPolicy(nn.Module):
    """Logits over the 1968 actions for a batch of encoded positions ([B, 77] token ids, or
    [B, 77 + 1968] with ``move_facts``: `inputs` builds either)."""

    def __init__(self, config: PolicyConfig | None = None):
        super().__init__()
        self.config = config or PolicyConfig()
        d = self.config.d_model
        self.token_embedding = nn.Embedding(VOCAB_SIZE, d)
        self.position_embedding = nn.Parameter(torch.zeros(SEQUENCE_LENGTH, d))
        self.blocks = nn.ModuleList(Block(self.config) for _ in range(self.config.n_layers))
        self.ln_final = nn.LayerNorm(d)
        if self.config.head == "square_pair":
            self.head: nn.Module = SquarePairHead(d, self.config.head_dim or d)
        else:
            self.head = nn.Linear(d, NUM_ACTIONS)
        self.apply(self._init_weights)
        nn.init.normal_(self.position_embedding, std=0.02)
        # Scaled init of residual projections (GPT-2): keeps the residual stream's variance flat.
        for block in self.blocks:
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layers))
        # Last and zero-initialised (no random draws): the same seed gives the same policy with or without it.
        self.move_facts = MoveFactsHead(d, self.config.fact_names) if self.config.move_facts else None
        if self.move_facts is not None:
            self.move_facts.reset()
        # After every policy parameter, so adding a value head leaves the seeded policy unchanged.
        self.value_head = ValueHead(d) if self.config.value_head else None
        if self.value_head is not None:
            self.value_head.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def device(self) -> torch.device:
        return self.ln_final.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def input_length(self) -> int:
        """Columns of an input row: the 77 board tokens, plus one fact byte per action with move facts."""
        return SEQUENCE_LENGTH + (NUM_ACTIONS if self.config.move_facts else 0)

    def forward(
        self, tokens: torch.Tensor, with_value: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Raw (unmasked) logits [B, 1968]; mask and temperature belong to `log_probs`.

        With `with_value` (a model with a value head): (logits, value logits [B]) from one trunk
        pass; `torch.sigmoid(value_logits)` is the side to move's expected score.
        """
        if tokens.dim() != 2 or tokens.shape[1] != self.input_length:
            facts = (
                " (77 board tokens + 1968 move-fact bytes: build inputs with `ActionPolicy.inputs`)"
                if self.config.move_facts
                else ""
            )
            raise ValueError(f"expected inputs of shape [B, {self.input_length}]{facts}, got {tuple(tokens.shape)}")
        board = tokens[:, :SEQUENCE_LENGTH]
        x = self.token_embedding(board.long()) + self.position_embedding
        for block in self.blocks:
            x = block(x)
        x = self.ln_final(x)
        if self.config.head == "pooled":
            logits = self.head(x.mean(dim=1))
        else:
            logits = self.head(x)
        if self.move_facts is not None:
            logits = logits + self.move_facts(x, tokens[:, SEQUENCE_LENGTH:])
        if not with_value:
            return logits
        if self.value_head is None:
            raise ValueError("this policy has no value head (train one with model.value_head: true)")
        return logits, self.value_head(x, board[:, 0] == WHITE_TO_MOVE_TOKEN)

    def inputs(
        self,
        boards: Sequence[chess.Board],
        facts: Sequence[list[tuple[int, int]]] | None = None,
        fens: Sequence[str] | None = None,
        *,
        legal_actions: Sequence[Sequence[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [B, `input_length`] long, legal mask [B, 1968] bool) on the model's device.

        `facts`: the boards' `board.move_facts.move_facts`, if the caller computed them already;
        `fens`: the boards' FENs, likewise; `legal_actions`: each board's legal moves as action
        indices, likewise (hot loops compute each once; the caller vouches they match the boards).
        """
        tokens = torch.from_numpy(encode_fens(boards if fens is None else fens).astype(np.int64))
        if self.config.move_facts:
            facts_array = move_fact_array(boards, facts, fens, extra=self.config.extra_facts)
            tokens = torch.cat([tokens, torch.from_numpy(facts_array.astype(np.int64))], dim=1)
        if legal_actions is None:
            masks = torch.from_numpy(legal_masks(boards))
        else:
            if len(legal_actions) != len(boards):
                raise ValueError(f"{len(legal_actions)} legal-action lists for {len(boards)} boards")
            masks = torch.zeros(len(boards), NUM_ACTIONS, dtype=torch.bool)
            for row, indices in enumerate(legal_actions):
                masks[row, list(indices)] = True
        return tokens.to(self.device), masks.to(self.device)

    @torch.no_grad()
    def predict_moves(
        self,
        boards: Sequence[chess.Board],
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        batch_size: int = 512,
    ) -> list[chess.Move]:
        """One legal move per board: argmax when temperature == 0, else a sample at that temperature.

        Runs in eval mode (no dropout) and restores the previous mode.
        """
        if any(not any(board.generate_legal_moves()) for board in boards):
            raise ValueError("predict_moves needs positions with at least one legal move")
        was_training = self.training
        self.eval()
        moves: list[chess.Move] = []
        try:
            for start in range(0, len(boards), batch_size):
                tokens, masks = self.inputs(boards[start : start + batch_size])
                logits = self(tokens).float()
                if temperature == 0.0:
                    actions = logits.masked_fill(~masks, float("-inf")).argmax(dim=-1)
                else:
                    actions = sample_actions(logits, masks, temperature=temperature, generator=generator)
                moves.extend(chess.Move.from_uci(ACTIONS[a]) for a in actions.tolist())
        finally:
            self.train(was_training)
        return moves


@dataclasses.dataclass
class ModelConfig:
    """The policy's shape in a training config: a named size, optionally with some of its fields replaced."""

    size: str = "tiny"
    """Named size from `MODEL_SIZES`: tiny (~0.2M), small (~7M), medium (~39M)."""
    n_layers: int | None = None
    """Override the size's number of transformer blocks (null = the size's value)."""
    d_model: int | None = None
    """Override the size's width (null = the size's value)."""
    n_heads: int | None = None
    """Override the size's attention heads (null = the size's value)."""
    d_ff: int | None = None
    """Override the MLP hidden width (null = the size's value, 4 * d_model)."""
    dropout: float = 0.0
    """Dropout during pretraining only (evaluation and every RL forward run without it)."""
    head: str = "square_pair"
    """Policy head: square_pair (from-square query . to-square key) or pooled (linear over the mean token)."""
    head_dim: int | None = None
    """Override the square_pair head's query/key width (null = d_model)."""
    move_facts: bool = False
    """Give the policy each legal move's facts (check, mate, stalemate, dead draw; `board.move_facts`)."""
    en_prise: bool = False
    """With `move_facts`: also whether each move puts the moved piece en prise (a static one-exchange
    estimate; `board.move_facts.en_prise_actions`): the quickstart policy's commonest blunder."""
    mate_in_two: bool = False
    """With `move_facts`: also whether each move is a check that forces mate in two (exact;
    `board.move_facts.mate_in_two_actions`): most mates in two are beyond a small network."""
    leaves_hanging: bool = False
    """With `move_facts`: also whether each move leaves one of the mover's pieces to be won by one capture
    (a static one-exchange estimate over every piece; `board.move_facts.leaves_hanging_actions`): the recipe
    policy's commonest one-capture blunder against Stockfish at Skill Level 0."""
    repetition: bool = False
    """With `move_facts`: also whether each move brings back a position of the game (from the game's move stack;
    `board.repetitions`): without it a policy that enters a cycle once enters it again."""
    threefold: bool = False
    """With `move_facts`: also whether each move draws by threefold repetition (`board.repetitions`)."""
    allows_threefold: bool = False
    """With `move_facts`: also whether each move lets the opponent draw by threefold repetition with its reply
    (`board.repetitions`): cycles the opponent closes."""
    value_head: bool = False
    """Also train a value head (the side to move's expected score) on the shared trunk: what search evaluates leaves with."""

    def __post_init__(self) -> None:
        self.policy_config()  # a ValueError when the size is unknown or the overrides make no valid policy

    def overrides(self) -> dict[str, int]:
        """The fields of the named size that this config replaces."""
        return {
            f: getattr(self, f)
            for f in ("n_layers", "d_model", "n_heads", "d_ff", "head_dim")
            if getattr(self, f) is not None
        }

    def policy_config(self) -> PolicyConfig:
        base = dataclasses.asdict(PolicyConfig.from_size(self.size))
        return PolicyConfig(
            **{
                **base,
                **self.overrides(),
                "dropout": self.dropout,
                "head": self.head,
                "move_facts": self.move_facts,
                "en_prise": self.en_prise,
                "mate_in_two": self.mate_in_two,
                "leaves_hanging": self.leaves_hanging,
                "repetition": self.repetition,
                "threefold": self.threefold,
                "allows_threefold": self.allows_threefold,
                "value_head": self.value_head,
            }
        )

    @property
    def extra_facts(self) -> tuple[str, ...]:
        """The optional move facts the policy reads (`PolicyConfig.extra_facts`)."""
        return self.policy_config().extra_facts

    def describe(self) -> str:
        """The size's name, with the replaced fields when there are any (e.g. "tiny, n_layers=4, d_model=128")."""
        extras = (
            (["move facts"] if self.move_facts else [])
            + (["en prise"] if self.en_prise else [])
            + (["mate in two"] if self.mate_in_two else [])
            + (["leaves hanging"] if self.leaves_hanging else [])
            + (["repetition"] if self.repetition else [])
            + (["threefold"] if self.threefold else [])
            + (["allows threefold"] if self.allows_threefold else [])
            + (["value head"] if self.value_head else [])
        )
        return ", ".join([self.size, *(f"{f}={v}" for f, v in self.overrides().items()), *extras])


def frozen_parameters(model: ActionPolicy, freeze_layers: int) -> list[nn.Parameter]:
    """The token and position embeddings and the first `freeze_layers` blocks' parameters (none for 0)."""
    if not freeze_layers:
        return []
    if freeze_layers > len(model.blocks):
        from chessgrpo.config import ConfigError

        raise ConfigError(f"config key freeze_layers={freeze_layers} but the model has {len(model.blocks)} blocks")
    modules = [model.token_embedding, *model.blocks[:freeze_layers]]
    return [p for module in modules for p in module.parameters()] + [model.position_embedding]


def value_head_parameters(model: ActionPolicy) -> list[nn.Parameter]:
    """The value head's parameters (none without one): GRPO kinds keep them frozen, since no
    policy-gradient loss trains them (and DDP requires every trainable parameter to get a gradient)."""
    return [] if model.value_head is None else list(model.value_head.parameters())


# ------------------------------------------------------------------------------------------------
# Saving and loading


def save_policy(model: ActionPolicy, directory: str | os.PathLike) -> Path:
    """Write model.safetensors and model_config.json into `directory` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    write_bytes_atomic(directory / MODEL_FILE, save(state))  # each file whole or not at all
    write_text_atomic(directory / CONFIG_FILE, json.dumps(dataclasses.asdict(model.config), indent=2))
    return directory


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from a checkpoint dir, or a run dir / its checkpoints dir (the newest
    intact checkpoint: a truncated or partial newer one is skipped with a warning)."""
    from chessgrpo.files import resolve_model_directory

    found = resolve_model_directory(path, lambda d: (d / MODEL_FILE).is_file() and (d / CONFIG_FILE).is_file())
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint at {str(path)!r}: expected {MODEL_FILE} and {CONFIG_FILE} there "
            "or an intact checkpoint in its checkpoints/"
        )
    return found


def load_policy(path: str | os.PathLike, device: str | torch.device = "cpu") -> ActionPolicy:
    """Load an `ActionPolicy` from a checkpoint or run directory (see `resolve_checkpoint`).

    A config that is not a JSON object of `PolicyConfig` fields, a truncated or corrupt weights
    file, or weights of another shape raise one `ValueError` naming the file.
    """
    from chessgrpo.models.checkpoint_kind import POLICY, wrong_kind_error

    directory = resolve_checkpoint(path)
    mismatch = wrong_kind_error(path, directory, POLICY)
    if mismatch is not None:  # an LM checkpoint: say so, not "not a valid policy config"
        raise mismatch
    config_path, weights_path = directory / CONFIG_FILE, directory / MODEL_FILE
    try:
        raw = json.loads(config_path.read_bytes())
        if not isinstance(raw, dict):
            raise InputError(f"expected a JSON object, got {type(raw).__name__}")
        raw.setdefault("head", "pooled")  # checkpoints from before the head option had the pooled head
        config = PolicyConfig(**raw)
    except (OSError, ValueError, TypeError) as error:  # also UnicodeDecodeError and JSONDecodeError
        raise InputError(f"{config_path} is not a valid policy config: {one_line(error)}") from None
    model = ActionPolicy(config)
    try:
        state = load_file(str(weights_path))
    except Exception as error:  # noqa: BLE001 - safetensors raises its own SafetensorError on a truncated file
        raise InputError(
            f"{weights_path} is not a readable safetensors file (truncated or corrupt): {one_line(error)}"
        ) from None
    try:
        model.load_state_dict(state)
    except RuntimeError as error:  # missing, unexpected or differently shaped tensors
        raise InputError(f"{weights_path} does not match its {CONFIG_FILE}: {one_line(error)}") from None
    return model.to(device).eval()
