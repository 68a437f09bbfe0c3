"""Data parallelism for the training spine: torchrun's process group, DDP, and the few collectives a run needs.

A run started by ``torchrun`` (which sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and the
rendezvous address) joins the process group here (gloo on CPU, NCCL on CUDA); a plain
``chessgrpo train`` is world size 1 and every method below is then a cheap identity.

What keeps N processes the same experiment as one (docs/architecture.md, "The spine and its plug-ins"):

- the global batch is a function of (seed, step) only; each rank takes a contiguous share of its
  groups (`Parallel.shard`): a group is never split across ranks;
- every group samples from its own generator seeded by (seed, step, group index)
  (`group_generators`), so which rank plays a group does not change its moves;
- the learner's minibatches are the same rows in any world size (`rl.learner.optimize` with
  `parallel`): each rank backpropagates its share of a minibatch, weighted by the global
  normaliser, and DDP averages the gradients;
- statistics that span the batch (batch std, the observed KL, metrics, stop and divergence
  decisions) are reduced here, so every rank decides the same;
- rank 0 alone writes checkpoints, metrics, events and evaluations and broadcasts what the others need.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from chessgrpo.config import ConfigError
from chessgrpo.models.placement import FollowsModuleMode

logger = logging.getLogger(__name__)

# Evaluations run on rank 0 while the others wait in a collective: allow long ones.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


@dataclasses.dataclass
class Parallel:
    """This process's place in a data-parallel run and the collectives the spine and kinds use."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    """gloo or nccl when a process group is in use, else None."""
    collective_device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    _owns_group: bool = False

    @classmethod
    def from_env(cls, device: torch.device) -> Parallel:
        """Join torchrun's process group when WORLD_SIZE > 1 (gloo for CPU, NCCL for CUDA devices)."""
        world_size = _env_int("WORLD_SIZE", 1)
        rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
        local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
        if world_size <= 1:
            return cls()
        if not 0 <= rank < world_size:
            raise ConfigError(
                f"RANK={rank} is outside WORLD_SIZE={world_size} (start data-parallel runs with torchrun)"
            )
        backend = "nccl" if device.type == "cuda" else "gloo"
        collective_device = torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
            collective_device = torch.device("cuda", local_rank)
        owns = False
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
            owns = True
        logger.info(
            "rank %d of %d (local %d of %d), backend %s", rank, world_size, local_rank, local_world_size, backend
        )
        return cls(rank, world_size, local_rank, local_world_size, backend, collective_device, owns)

    # -- who does what -----------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """True in a run of more than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the run directory."""
        return self.rank == 0

    def device_for(self, device: torch.device) -> torch.device:
        """The device this rank trains on: ``cuda`` becomes ``cuda:LOCAL_RANK`` in a multi-process run."""
        if self.enabled and device.type == "cuda" and device.index is None:
            return torch.device("cuda", self.local_rank)
        return device

    def shard(self, count: int, what: str) -> range:
        """This rank's contiguous share of `count` items (groups, prompts); `count` must divide evenly.

        Raises ConfigError naming `what` (the config key) otherwise: an uneven split would change the
        experiment with the world size.
        """
        if count % self.world_size:
            raise ConfigError(
                f"config key {what}: {count} cannot be split evenly over {self.world_size} processes; "
                f"use a multiple of {self.world_size}"
            )
        share = count // self.world_size
        return range(self.rank * share, (self.rank + 1) * share)

    def split(self, count: int) -> range:
        """This rank's contiguous share of `count` rows, as even as possible (minibatch rows)."""
        base, extra = divmod(count, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (1 if self.rank < extra else 0))

    # -- collectives ---------------------------------------------------------------------------------

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's `value` (picklable), in rank order."""
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` (picklable) on every rank."""
        if not self.enabled:
            return value
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks of a few numbers (float64)."""
        if not self.enabled:
            return [float(v) for v in values]
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.collective_device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any rank."""
        return self.sum([1.0 if flag else 0.0])[0] > 0 if self.enabled else bool(flag)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean_metrics(self, values: dict[str, float]) -> dict[str, float]:
        """Each metric averaged over the ranks that report it (``*/min*`` by min, ``*/max*`` by max),
        so every rank holds the same row and takes the same decisions from it."""
        if not self.enabled:
            return values
        from chessgrpo.rl.learner import reduce_metrics

        return reduce_metrics(self.all_gather(values))

    def std(self, values: torch.Tensor) -> torch.Tensor:
        """The unbiased std of the values of all ranks together (concatenated in rank order), as a tensor."""
        if not self.enabled:
            return values.std() if values.numel() > 1 else values.new_zeros(())
        gathered = torch.cat([v.to(values.device) for v in self.all_gather(values.detach().cpu())])
        return gathered.std() if gathered.numel() > 1 else gathered.new_zeros(())

    # -- models ---------------------------------------------------------------------------------------

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` in DistributedDataParallel in a multi-process run (the module itself otherwise).

        The learner's forwards go through the wrapper, so backward averages the gradients over the
        ranks; sampling and evaluation call the module directly (no gradient, nothing to reduce).
        """
        if not self.enabled or not any(p.requires_grad for p in model.parameters()):
            return model
        device = next(model.parameters()).device
        device_ids = [device.index] if device.type == "cuda" else None
        # No buffer broadcast: the models' buffers are constant tables (never trained or updated), and a
        # broadcast is a collective inside forward, so ranks that call forward a different number of times
        # per update (a task mixture's parts, the auxiliary losses' extra forwards) would wait on each other.
        return _Replicated(model, device_ids=device_ids, broadcast_buffers=False)

    def close(self, together: bool = False) -> None:
        """Leave the process group this object joined; `together` (a clean finish, every rank
        here) first waits for all ranks, never on an error path, where a peer may be gone."""
        if self._owns_group and dist.is_initialized():
            if together:
                # A rank destroying its gloo connections while a peer still holds them can abort
                # the peer at exit ("terminate called without an active exception").
                dist.barrier()
            dist.destroy_process_group()
            self._owns_group = False


class _Replicated(FollowsModuleMode, DistributedDataParallel):
    """DDP whose train/eval mode is its module's (dropout on in pretraining, off in every RL forward)."""


def seed_words(*parts: int) -> list[int]:
    """Non-negative integers for `numpy.random.SeedSequence` (negative seeds are folded)."""
    return [int(p) % (2**63) for p in parts]


def derived_seed(*parts: int) -> int:
    """A 63-bit seed from (seed, step, ...): the same parts give the same seed in every process."""
    return int(np.random.SeedSequence(seed_words(*parts)).generate_state(1, np.uint64)[0]) & (2**63 - 1)


def group_generators(
    seed: int, step: int, groups: Sequence[int] | range, device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One sampling generator per group, seeded by (seed, step, global group index).

    A group's moves then do not depend on which rank samples it or on the other groups in the batch.
    """
    device = torch.device(device)
    return [torch.Generator(device=device).manual_seed(derived_seed(seed, step, int(g), 0x5A3)) for g in groups]
