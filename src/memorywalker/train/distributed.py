"""Data parallelism through torch.distributed, launched by torchrun or ``accelerate launch``.

Both launchers export ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``, so the same
recipe runs single-process, under torchrun, or under accelerate without code changes. Methods such as
``per-call``, ``logit-tree`` and ``sdcc`` run several forwards (and backwards) per micro-batch, and their
number differs between ranks holding different trees. DDP decides at *forward* time whether the next
backward all-reduces, so wrapping the model in DDP would all-reduce once per backward — a different
number of collectives on each rank. The recipes therefore run the bare model and all-reduce (sum)
gradients once per optimizer step (:func:`allreduce_gradients`); losses are normalized by global
counts (the engine reduces denominators across ranks before dividing, ``dp_size=1``), so the sum of the
per-rank gradients is the gradient of the whole step's batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float | None = None) -> DistInfo:
    """Initialise the process group when launched with several processes; no-op otherwise.
    ``timeout_s``: how long a collective may wait for the other ranks before it fails."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        kw = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
        dist.init_process_group(backend=backend, **kw)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def device_for(name: str, info: DistInfo) -> torch.device:
    """``auto`` = this rank's GPU when CUDA is available, else the CPU; anything else as given."""
    if name == "auto":
        return torch.device(f"cuda:{info.local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def end_distributed() -> None:
    """Destroy the process group if one was started, before the interpreter's teardown (where NCCL warns
    that it leaks, and a gloo thread still winding down can abort a rank that finished)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (a list of one element when not distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None on the others): what only rank 0 writes, sent only to it."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@torch.no_grad()
def allreduce_gradients(model: torch.nn.Module, bucket_mib: float = 25.0) -> None:
    """Sum gradients across ranks once per step, in flat buckets of at most ``bucket_mib`` MiB per
    dtype/device (DDP's ``bucket_cap_mb`` default): one all-reduce per bucket, and no more than one
    bucket's copy of the gradients alive at a time (a single flat buffer would double them)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # a parameter unused on this rank still takes part in the sum
            p.grad = torch.zeros_like(p)
    cap = int(bucket_mib * 2**20)
    open_: dict[tuple, tuple[list[torch.Tensor], int]] = {}  # dtype/device -> (bucket being filled, bytes)
    buckets: list[list[torch.Tensor]] = []
    for g in (p.grad for p in params):
        key, size = (g.dtype, g.device), g.numel() * g.element_size()
        bucket, used = open_.get(key, ([], 0))
        if bucket and used + size > cap:
            bucket, used = [], 0
        if not bucket:
            buckets.append(bucket)
        open_[key] = (bucket, used + size)
        bucket.append(g)
    for bucket in buckets:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
