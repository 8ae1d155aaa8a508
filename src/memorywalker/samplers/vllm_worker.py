"""Runs inside vLLM's worker processes: the weight-sync entry point of :class:`~memorywalker.samplers.
vllm.VLLMPolicy` and of a ``vllm serve`` fleet (:mod:`~memorywalker.samplers.vllm_server`).
``worker_extension_cls`` (``vllm serve --worker-extension-cls``) mixes this class into vLLM's worker, so
``collective_rpc("memorywalker_load_weights", args=(path,))`` — in process, or ``POST /collective_rpc``
on a server started with ``VLLM_SERVER_DEV_MODE=1`` — calls the method below on every worker.

Two ways in, the tensors never crossing the RPC (vLLM's RPC is for control messages: tensors in untyped
RPC arguments arrive as raw buffers, not tensors; the HTTP route takes strings only):

* **shards** (``memorywalker_load_weights``): the trainer writes the weights as safetensors (one file in
  shared memory, or a directory of shards on a path every server can read) and the path crosses the RPC;
  the files are memory-mapped here, one tensor at a time.
* **broadcast** (``memorywalker_join_broadcast`` once, then ``memorywalker_receive_broadcast`` per sync):
  every worker of every server joins one process group with the trainer's rank 0 (rank 0 the trainer,
  then each server's workers from the ``rank_offset`` the trainer gives it: NCCL on GPUs, gloo on the
  CPU, over a ``TCPStore`` the trainer hosts), and the trainer broadcasts the tensors in the order of
  the names, dtypes and shapes the RPC carries, one at a time.

Either way the tensors are handed, as they arrive, to the worker's ``reload_weights``:
vLLM's in-place reload, which takes Hugging Face checkpoint names, does the model's fusing (q/k/v into
qkv_proj, gate/up into gate_up_proj) and sharding, and re-runs the post-load processing (the CPU backend
repacks linear weights for its kernels, so a plain ``model.load_weights`` into the packed parameters
fails). Imports nothing of memorywalker's beyond this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open


def weight_files(path: str | Path) -> list[Path]:
    """``path`` itself when it is a file, else the ``*.safetensors`` shards of the directory, in name order."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path}: no *.safetensors shards")
        return files
    if not path.exists():
        raise FileNotFoundError(f"No such file or directory: {path}")
    return [path]


class WeightSyncExtension:
    """Mixed into vLLM's ``Worker`` (which provides ``reload_weights``)."""

    def memorywalker_load_weights(self, path: str) -> int:
        """Load every tensor of the safetensors file or shard directory ``path`` into the served model;
        returns how many tensors were read."""
        files = weight_files(path)
        count = [0]

        def tensors() -> Iterator:
            for f in files:  # memory-mapped: one tensor in memory at a time, never the whole checkpoint
                with safe_open(str(f), framework="pt") as shard:
                    for name in shard.keys():  # noqa: SIM118 — safe_open is not iterable
                        count[0] += 1
                        yield name, shard.get_tensor(name)

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        return count[0]

    def memorywalker_join_broadcast(self, host: str, port: str, rank_offset: str, world_size: str,
                                    timeout_s: str) -> str:
        """Join the trainer's weight-broadcast group (rank ``rank_offset`` + this worker's rank in its
        server, of ``world_size``) over the trainer's ``TCPStore`` at ``host:port`` (strings: the HTTP route
        passes nothing else); replaces a group joined before. Returns the backend."""
        timeout = timedelta(seconds=float(timeout_s))
        store = dist.TCPStore(host, int(port), int(world_size), is_master=False, timeout=timeout)
        rank = int(rank_offset) + self.rank
        if self.device.type == "cuda":
            self.memorywalker_group = dist.ProcessGroupNCCL(store, rank, int(world_size))
        else:
            self.memorywalker_group = dist.ProcessGroupGloo(store, rank, int(world_size), timeout)
        return self.memorywalker_group.name()

    def memorywalker_receive_broadcast(self, metas: str) -> int:
        """Receive the tensors ``metas`` names (JSON: ``[[name, dtype, shape], ...]``, in the trainer's order)
        from rank 0 of the group joined by :meth:`memorywalker_join_broadcast`, each loaded as it arrives;
        returns how many were received. Every one is received even if the load stops early, so the trainer's
        broadcast never waits for a rank that left it."""
        group = getattr(self, "memorywalker_group", None)
        if group is None:
            raise RuntimeError("no weight-broadcast group: memorywalker_join_broadcast was not called")
        pending = [(name, getattr(torch, dtype), shape) for name, dtype, shape in json.loads(metas)]
        count = [0]

        def tensors() -> Iterator:
            while count[0] < len(pending):
                name, dtype, shape = pending[count[0]]
                tensor = torch.empty(shape, dtype=dtype, device=self.device)
                group.broadcast(tensor, 0).wait()
                count[0] += 1
                yield name, tensor

        received = tensors()
        try:
            self.reload_weights(weights_iterator=received, is_checkpoint_format=True)
        finally:
            for _ in received:  # the rest, if the load did not read them all
                pass
        return count[0]
