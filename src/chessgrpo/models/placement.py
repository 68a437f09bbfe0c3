"""Device placement: which torch device a config names (`resolve_device`), and running a frozen
model on another device than the policy (`reference_device`).

`OnDevice` wraps a module that lives on one device and is called with tensors of another: its
inputs move to the module's device and its outputs (a tensor, or an object with ``logits``, as a
transformers model output) come back to the caller's device. Seed B of the predecessors put its
reference model on a second GPU this way; nothing here is specific to a device kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import chess
import torch
from torch import nn

from chessgrpo.config import ConfigError


def resolve_device(name: str, key: str = "device") -> torch.device:
    """The torch device for config key `key`, or a `ConfigError` saying why it cannot be used."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"config key {key}: {name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config key {key}: {name!r} requested but CUDA is not available (use {key}=cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"config key {key}: {name!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


class FollowsModuleMode:
    """For a wrapper module: its train/eval mode is its ``module``'s (the kinds switch the wrapped
    model, and RL forwards check the mode of what they are given)."""

    module: nn.Module

    @property
    def training(self) -> bool:
        return self.module.training

    @training.setter
    def training(self, value: bool) -> None:  # nn.Module.train() sets it; the module's flag is the truth
        pass


class OnDevice(FollowsModuleMode, nn.Module):
    """`module` on its own device, called from (and answering on) `caller_device`.

    Attributes the wrapper does not define (``config``, ``training``, ...) are the module's. For an
    `ActionPolicy`, `inputs` and `device` are the caller's, so code written for a policy on one
    device works unchanged.
    """

    def __init__(self, module: nn.Module, caller_device: torch.device | str):
        super().__init__()
        self.module = module
        self.caller_device = torch.device(caller_device)

    @property
    def module_device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def device(self) -> torch.device:
        return self.caller_device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        here = self.module_device
        out = self.module(*_to(args, here), **_to(kwargs, here))
        if isinstance(out, torch.Tensor):
            return out.to(self.caller_device)
        if hasattr(out, "logits"):  # a transformers ModelOutput: only the logits are read
            out.logits = out.logits.to(self.caller_device)
        return out

    def inputs(self, boards: Sequence[chess.Board]) -> tuple[torch.Tensor, torch.Tensor]:
        """The wrapped policy's (tokens, legal mask), on the caller's device."""
        tokens, legal = self.module.inputs(boards)
        return tokens.to(self.caller_device), legal.to(self.caller_device)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def place_reference(reference: nn.Module, device: torch.device, reference_device: str | None) -> nn.Module:
    """`reference` moved to `reference_device` and wrapped to be called from `device` (itself when they agree)."""
    if reference_device is None:
        return reference
    target = resolve_device(reference_device, "reference_device")
    if target == device:
        return reference
    return OnDevice(reference.to(target), device)
