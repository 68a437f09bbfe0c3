"""A pipelined GRPO step (``grpo.pipeline``): the next step's rollout runs while the learner updates.

`GRPOKind.train_step` with a `RolloutPipeline`: step t takes the rollout of step t that was started
during step t-1, copies the current (pre-update) weights into a snapshot, starts step t+1's rollout
from that snapshot in a background thread, and then learns from step t's rollout on the live
weights. Sampling (torch ops) and the engine searches (pipe waits) release the GIL, so the engines
search and the policy samples while the learner's forwards and backwards run.

So every step learns from a batch sampled one update earlier: the behaviour log-probs are the
snapshot's (recorded at sampling), PPO's clipped ratio corrects for the lag, and the first
minibatch's ratio invariant is checked against the snapshot (`rl.optimize`'s behaviour_forward).

Two snapshot buffers alternate: the one step t sampled from (its ratio check still needs it) and
the one step t+1 samples from. Resume: the checkpoint after step t holds the snapshot step t+1
samples from (`state_dict`); a resumed run re-runs that rollout synchronously from it, which gives
the same batch (sampling is seeded by (seed, step, group), engine searches are reproducible).
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")
Rollout = Callable[[torch.nn.Module], T]
"""Runs a step's rollout sampling from the given weights: ``lambda sampler: kind.rollout(step, groups, sampler)``
(`GRPOKind.rollout`, whose `sampler` parameter is this module), which returns a `TaskRollout`."""


@dataclasses.dataclass
class _Next:
    """The next step's rollout: its snapshot, the kind's rollout state before it, and its future once started."""

    step: int
    sampler: torch.nn.Module
    rollout_state: dict[str, Any]
    future: concurrent.futures.Future | None = None


class RolloutPipeline:
    """Runs the next step's rollout in a background thread on a snapshot of `model`'s weights (module docstring)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._buffers: list[torch.nn.Module] = []
        self._next: _Next | None = None
        self._replay: tuple[int, dict[str, torch.Tensor]] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    # -- snapshots ------------------------------------------------------------------------------------

    def _free_buffer(self, busy: torch.nn.Module | None) -> torch.nn.Module:
        """A snapshot module other than `busy` (two at most: one per step in flight)."""
        for buffer in self._buffers:
            if buffer is not busy:
                return buffer
        buffer = copy.deepcopy(self.model)
        # A compiled model's forward would call the original module's weights: the copy runs eagerly.
        if getattr(buffer, "_compiled_call_impl", None) is not None:
            buffer._compiled_call_impl = None
        for param in buffer.parameters():
            param.grad = None
        buffer.eval().requires_grad_(False)
        self._buffers.append(buffer)
        return buffer

    def snapshot(
        self, busy: torch.nn.Module | None = None, weights: dict[str, torch.Tensor] | None = None
    ) -> torch.nn.Module:
        """A frozen copy of the live weights (or of `weights`) in a buffer other than `busy`."""
        buffer = self._free_buffer(busy)
        with torch.no_grad():
            buffer.load_state_dict(self.model.state_dict() if weights is None else weights)
        return buffer

    # -- the step -------------------------------------------------------------------------------------

    def take(self, step: int, rollout: Rollout[T]) -> tuple[T, torch.nn.Module, float]:
        """Step `step`'s rollout, its sampler and the seconds spent waiting for it: the one started during the
        previous step, else run now (from the checkpoint's snapshot after a resume, else from the live weights)."""
        tick = time.perf_counter()
        pending, self._next = self._next, None
        if pending is not None and pending.step == step:
            if pending.future is not None:
                return pending.future.result(), pending.sampler, time.perf_counter() - tick
            return rollout(pending.sampler), pending.sampler, time.perf_counter() - tick
        if pending is not None:  # a rollout for another step (a rollback moved the step): drop it
            _settle(pending)
        replay, self._replay = self._replay, None
        if replay is not None and replay[0] == step:
            sampler = self.snapshot(weights=replay[1])
        else:
            sampler = self.snapshot()
        return rollout(sampler), sampler, time.perf_counter() - tick

    def start(
        self, step: int, rollout: Rollout[Any], rollout_state: dict[str, Any], *, busy: torch.nn.Module, launch: bool
    ) -> None:
        """Snapshot the live weights for step `step`'s rollout (what a checkpoint saves) and, with `launch`, start it
        in the background. `rollout_state`: the kind's state that rollouts change, as it is before this one."""
        sampler = self.snapshot(busy)
        pending = _Next(step, sampler, rollout_state)
        if launch:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grpo-rollout")
            pending.future = self._executor.submit(rollout, sampler)
        self._next = pending

    def wait(self) -> None:
        """Block until a started rollout has finished (its result or error stays for `take`)."""
        if self._next is not None and self._next.future is not None:
            concurrent.futures.wait([self._next.future])

    @property
    def held_rollout_state(self) -> dict[str, Any] | None:
        """The kind's rollout state before the next step's rollout (what a checkpoint must hold), or None."""
        return None if self._next is None else self._next.rollout_state

    # -- state ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The next step and the snapshot weights it samples from ({} when none is pending)."""
        if self._next is None:
            return {}
        weights = {key: value.detach().clone().cpu() for key, value in self._next.sampler.state_dict().items()}
        return {"step": self._next.step, "weights": weights}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Drop any rollout in flight; the step in `state` (if any) will re-run its rollout from its snapshot."""
        self.discard()
        self._replay = (int(state["step"]), state["weights"]) if state else None

    def discard(self) -> None:
        """Wait for a rollout in flight and drop it (and its error, if any)."""
        pending, self._next = self._next, None
        if pending is not None:
            _settle(pending)

    def close(self) -> None:
        """Discard what is in flight and stop the thread."""
        self.discard()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def _settle(pending: _Next) -> None:
    """Wait for a dropped rollout: its error is not this step's (the step it belonged to never runs)."""
    if pending.future is not None:
        concurrent.futures.wait([pending.future])
