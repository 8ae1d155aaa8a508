"""Data parallelism through torch.distributed, launched by torchrun or ``accelerate launch``.

Both launchers export ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``, so the same
recipe runs single-process, under torchrun, or under accelerate without code changes. Methods such as
``logit-tree`` and ``sdcc`` run several forwards per step, so instead of DDP's per-backward hooks the
recipes all-reduce (sum) gradients once per optimizer step; losses are normalized by global counts
(reduced across ranks before dividing), so the sum of per-rank gradients is the full-batch gradient.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Initialise the process group when launched with several processes; no-op otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def shard(items: Sequence[T], info: DistInfo) -> list[T]:
    """This rank's share of a global batch: items rank, rank + world, rank + 2·world, …"""
    return list(items[info.rank :: info.world_size])


@torch.no_grad()
def allreduce_gradients(model: torch.nn.Module) -> None:
    """Sum gradients across ranks in one flat buffer per dtype/device (DDP-equivalent, once per step)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    for p, g in zip((p for p in model.parameters() if p.requires_grad), grads, strict=True):
        if g is None:  # a parameter unused on this rank still takes part in the sum
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        buckets.setdefault((g.dtype, g.device), []).append(g)
    for bucket in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
