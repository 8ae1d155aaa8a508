"""What FSDP2 holds through one backward that spans several forwards, plain and with memorywalker's fix.

    OMP_NUM_THREADS=1 python scripts/fsdp2_multi_forward_memory.py [--forwards 1 2 5] [--reduce-per-forward]

Eight blocks of two Linear layers (2048 -> 4096 -> 2048, 16.8M parameters, 64 MiB per block; a 32 MiB
shard at 2 ranks), each ``fully_shard``-ed with FSDP2's defaults, 2 gloo ranks. The loss sums K
forwards of the same batch; one backward. Printed for rank 0: the heap in use (glibc mallinfo2) after
each block's ``post_backward``, above what the rank held before the forwards. With K = 1 each block
adds its sharded gradient (32 MiB); with K >= 2 each block adds about twice that during the first
forward's backward, and the surplus is released only as the last forward's backward passes the block:
through a backward over several forwards FSDP2 holds about one more shard per block. The cause:
autograd keeps a parameter's gradient until its last use in the graph has run, so the first
post-backward finds no gradient to reduce-scatter and the unsharded gradient waits. The radix
schedule's backward spans one forward per tree level. ``--reduce-per-forward`` applies
:func:`memorywalker.train.fsdp.reduce_per_forward` to each block (what ``parallel=fsdp`` does to every
decoder layer): each forward's gradient is written at once and reduce-scattered after its own backward.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group  # private: the hook we time

from memorywalker.bench.memory import _cpu_bytes_probe
from memorywalker.train.fsdp import reduce_per_forward


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(2048, 4096), nn.Linear(4096, 2048)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def _worker(rank: int, world: int, port: int, forwards: list[int], per_forward: bool) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    probe, _ = _cpu_bytes_probe()
    real = _fsdp_param_group.FSDPParamGroup.post_backward
    heaps: list[float] = []

    def timed(self, *args):
        out = real(self, *args)
        heaps.append((probe() - base) / 2**20)
        return out

    _fsdp_param_group.FSDPParamGroup.post_backward = timed
    for k in forwards:
        torch.manual_seed(0)
        model = nn.Sequential(*[Block() for _ in range(8)])
        for block in model:
            fully_shard(block)
            if per_forward:
                reduce_per_forward(block)
        fully_shard(model)
        x = torch.randn(64, 2048)
        gc.collect()
        base = probe()
        heaps.clear()
        sum(model(x).square().mean() for _ in range(k)).backward()
        if rank == 0:
            print(f"K={k}: heap MiB after each block's post_backward (first forward's backward: blocks 7..0): "
                  + " ".join(f"{h:.0f}" for h in heaps[:8]) + f" ... end {heaps[-1]:.0f}", flush=True)
        del model
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forwards", type=int, nargs="+", default=[1, 2, 5])
    ap.add_argument("--reduce-per-forward", action="store_true", help="memorywalker's fix on every block")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, args.forwards, args.reduce_per_forward), nprocs=2, join=True)


if __name__ == "__main__":
    main()
