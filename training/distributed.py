"""Process topology: one process, or DDP ranks started by ``torchrun``.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; with them we join a
process group (nccl on CUDA, gloo on CPU). Every rank draws the same global batch and
keeps its own slice, so N ranks see exactly the rows one process would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training.errors import UsageError

__all__ = ["Topology", "all_reduce_mean", "resolve_device", "setup", "teardown"]


@dataclass(frozen=True)
class Topology:
    """Where this process sits."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, saves state and exports."""
        return self.rank == 0


def resolve_device(pref: str, local_rank: int) -> torch.device:
    """auto -> cuda:<local_rank> when CUDA is available, else cpu."""
    if pref == "auto":
        pref = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device("cuda", local_rank) if pref == "cuda" else torch.device(pref)
    except RuntimeError:
        raise UsageError(f"--device {pref!r}: not a device torch knows; use auto, cpu, cuda "
                         f"or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise UsageError(f"--device {pref}: torch sees {count} CUDA device(s) here; use "
                             f"--device cpu, or auto to take a GPU when there is one")
    return device


def setup(device_pref: str) -> Topology:
    """Join the process group when launched by torchrun; a plain run is world_size 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    device = resolve_device(device_pref, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Topology(rank, world_size, local_rank, local_world, device)


def all_reduce_mean(value: torch.Tensor, topo: Topology) -> torch.Tensor:
    """Mean over ranks (identity for one process)."""
    if topo.world_size == 1:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / topo.world_size


def teardown() -> None:
    """Leave the process group, if any."""
    if dist.is_initialized():
        dist.destroy_process_group()
