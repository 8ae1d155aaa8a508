"""``train.fsdp.RowShards`` on 3 gloo ranks, 7 rows (``torch.chunk`` blocks of 3, 3 and 1: the padded
case), reduced in blocks of one row: gather gives the whole matrix, a freed weight gathers back into
the same parameter, and release adds to each rank's shard the sum over ranks of its rows.

Rank r's gradient is (r + 1) · G with G[i, j] = 10 i + j, so the summed gradient is (1 + 2 + 3) · G = 6 G:
rank 0's shard rows 0–2 get 6 G[0:3], rank 1's 6 G[3:6], rank 2's 6 G[6:7]; a second backward's
release adds as much again (12 G)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from memorywalker.train import row_shards as fsdp
from ranks import spawn

ROWS, COLS, WORLD = 7, 3, 3


class Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS))


def _worker(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo")
    fsdp.REDUCE_BLOCK_BYTES = 1  # one row per block: the block loop runs
    table = Table()
    whole = table.weight.detach().clone()
    unit = fsdp.RowShards(table, [table.weight], init_device_mesh("cpu", (WORLD,)), None)
    local = table.weight.to_local().clone()
    unit.gather()
    gathered = table.weight.detach().clone()
    param = table.weight
    unit.free()
    freed = param.untyped_storage().size()
    unit.gather()  # into the same parameter
    same = table.weight is param and torch.equal(table.weight, whole)
    g = torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS)
    g = (g // COLS) * 10 + g % COLS  # G[i, j] = 10 i + j
    for _ in range(2):
        (table.weight * ((rank + 1) * g)).sum().backward()
        unit.release(reduce=True)
        reduced = table.weight.grad.to_local().clone()
        unit.gather()
    unit.release(reduce=False)
    torch.save({"whole": whole, "local": local, "gathered": gathered, "freed": freed, "same": same,
                "grad": reduced, "g": g}, Path(out) / f"rank{rank}.pt")


def test_row_shards_gather_free_and_reduce_with_padded_rows(tmp_path):
    spawn(_worker, str(tmp_path), nprocs=WORLD, log_dir=tmp_path)
    blocks = [(0, 3), (3, 6), (6, 7)]  # torch.chunk(7 rows, 3)
    for rank, (lo, hi) in enumerate(blocks):
        r = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(r["local"], r["whole"][lo:hi])
        assert torch.equal(r["gathered"], r["whole"]) and r["freed"] == 0 and r["same"]
        assert torch.equal(r["grad"], 12 * r["g"][lo:hi])  # 6 G per backward, two backwards
