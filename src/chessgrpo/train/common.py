"""Helpers shared by the RL trainers (`train.grpo`, `train.trajectory`, `train.rookworld`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from chessgrpo.config import ConfigError
from chessgrpo.models.policy import ActionPolicy


def rank_and_world_size() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def policy_optimizer(model: ActionPolicy, config: Any) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of an action policy for RL: head and body groups (the
    trainer scales the head group by head_lr / lr), decay on matrices only, the embeddings and the
    first `config.freeze_layers` blocks frozen. `config` needs freeze_layers, weight_decay, lr, betas."""
    frozen: set[int] = set()
    if config.freeze_layers:
        if config.freeze_layers > len(model.blocks):
            raise ConfigError(f"freeze_layers={config.freeze_layers} but the model has {len(model.blocks)} blocks")
        modules = [model.token_embedding, *model.blocks[: config.freeze_layers]]
        frozen = {id(p) for module in modules for p in module.parameters()} | {id(model.position_embedding)}
    head = {id(p) for p in model.head.parameters()}
    groups: list[dict[str, Any]] = []
    for is_head in (False, True):
        params = [p for p in model.parameters() if id(p) not in frozen and (id(p) in head) == is_head]
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            if chosen:
                groups.append({"params": chosen, "weight_decay": config.weight_decay if decay else 0.0, "head": is_head})
    for param in model.parameters():
        param.requires_grad_(id(param) not in frozen)
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write `payload` as JSON via a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)
