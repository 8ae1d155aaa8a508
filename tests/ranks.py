"""Gloo ranks for a test, started as torchrun would start them and ended so that teardown cannot fail them.

:func:`spawn` starts ``nprocs`` processes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``
set, one thread each) and runs ``fn(rank, world, *args)`` in each; ``fn`` starts the process group itself
(directly, or through the recipe it runs). Once ``fn`` returns, the group is destroyed and the rank leaves
by ``os._exit(0)``, past the interpreter's teardown, where a gloo thread still winding down can abort a
rank whose results are all on disk ("terminate called without an active exception", pytorch#65237; CI
saw it in test_fsdp_uneven and in test_engine_ddp, a run in several hundred). A rank that raises leaves
through ``mp.spawn``, whose error names the exception. Each rank's stderr goes to
``<log_dir>/rank<r>.stderr``, and a rank that dies by a signal (no Python traceback) fails the test with
the end of every rank's stderr quoted."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from memorywalker.samplers.http import free_port


def spawn(fn: Callable[..., None], *args: Any, nprocs: int = 2, log_dir: str | Path) -> None:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` ranks; returns when every rank finished."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        mp.spawn(_rank, args=(nprocs, free_port(), fn, args, str(log_dir)), nprocs=nprocs, join=True)
    except mp.ProcessExitedException as err:
        tails = {r: (log_dir / f"rank{r}.stderr").read_text(errors="replace")[-3000:] for r in range(nprocs)
                 if (log_dir / f"rank{r}.stderr").exists()}
        raise AssertionError(f"{err}; the ranks' stderr ends:\n"
                             + "\n".join(f"--- rank {r}\n{t}" for r, t in tails.items())) from err


def _rank(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple, log_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    log = open(Path(log_dir) / f"rank{rank}.stderr", "w")  # noqa: SIM115 - fd 2 points at it until the process ends
    os.dup2(log.fileno(), 2)
    torch.set_num_threads(1)
    try:
        fn(rank, world, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
