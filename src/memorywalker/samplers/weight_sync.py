"""The trainer's two ways of moving its weights into a ``vllm serve`` fleet (``weight_sync=shards|broadcast``;
:meth:`~memorywalker.samplers.vllm_server.ServerFleet.sync_weights` and ``broadcast_weights``), the
receiving side of both in :mod:`~memorywalker.samplers.vllm_worker`.

* :func:`write_shards`: safetensors shards in a directory every server reads (``/dev/shm`` on one machine,
  a shared filesystem across machines): costs a write and a read of the whole model, needs no network
  between trainer and servers beyond HTTP.
* :class:`WeightBroadcast`: one process group of the trainer's rank 0 and every worker of every live
  server (NCCL when the trainer has a GPU, else gloo; the ``TCPStore`` hosted here), the tensors sent by
  ``broadcast`` one at a time in the order of the names, dtypes and shapes the RPC carries: no
  filesystem, and on GPUs device to device. The group is formed at the first sync and formed anew when
  the live servers change (one died); the servers must reach this machine at ``host`` on the store's
  port and gloo's or NCCL's own.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file


class WeightBroadcast:
    """The broadcast group of one fleet (module docstring); ``timeout``: seconds the group's forming or
    one tensor's broadcast may take."""

    def __init__(self, host: str, *, timeout: float = 600.0):
        self.host, self.timeout = host, timedelta(seconds=timeout)
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.group: Any = None
        self.members: list[str] = []
        self._store: Any = None  # the group's rendezvous, alive as long as the group

    def send(self, fleet, servers: list, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Broadcast ``weights`` to every worker of ``servers`` (the fleet's live ones, paused); url → each
        server's answer (its workers' counts of tensors received)."""
        if self.members != [s.url for s in servers]:
            self._form(fleet, servers)
        metas = json.dumps([[name, str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in weights.items()])
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

        def broadcast() -> None:
            for t in weights.values():
                self.group.broadcast(t.detach().to(device).contiguous(), 0).wait()

        try:
            return fleet.rpc(servers, "memorywalker_receive_broadcast", lambda s: [metas], beside=broadcast)
        except BaseException:
            self.group, self.members = None, []  # a broadcast cut midway leaves the group unusable: form it anew
            raise

    def _form(self, fleet, servers: list) -> None:
        """A new group: rank 0 here, then each server's workers from its offset (its world size, tensor ×
        pipeline × data parallel, from ``GET /get_world_size``)."""
        self.group, self.members = None, []
        sizes = [fleet.world_size(s) for s in servers]
        world = 1 + sum(sizes)
        offsets = {s.url: 1 + sum(sizes[:i]) for i, s in enumerate(servers)}
        self._store = dist.TCPStore(self.host, 0, world, is_master=True, wait_for_workers=False, timeout=self.timeout)
        port, seconds = str(self._store.port), str(self.timeout.total_seconds())
        made: dict[str, Any] = {}

        def form() -> None:  # returns once every worker joined
            if self.backend == "nccl":
                made["group"] = dist.ProcessGroupNCCL(self._store, 0, world)
            else:
                made["group"] = dist.ProcessGroupGloo(self._store, 0, world, self.timeout)

        fleet.rpc(servers, "memorywalker_join_broadcast", lambda s: [self.host, port, str(offsets[s.url]), str(world), seconds],
                  beside=form)
        self.group, self.members = made["group"], [s.url for s in servers]


def cpu_tensors(state_dict: dict) -> dict[str, torch.Tensor]:
    """``state_dict``'s tensors on the CPU, contiguous, none sharing memory with another: a tied LM head
    (``lm_head.weight`` is ``model.embed_tokens.weight`` in SmolLM2, Qwen2.5-0.5B, Qwen3-0.6B) gets a copy
    of its own, which safetensors needs to write both names (the server ties them again on load)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in state_dict.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[name] = t
    return out


def write_shards(state_dict: dict, directory: str | Path, *, shard_mib: float = 1024.0) -> int:
    """Write ``state_dict`` (names → tensors, as :func:`cpu_tensors` gives them) as ``model-NNNNN.safetensors``
    shards of at most ``shard_mib`` MiB each (a tensor larger than that gets a shard of its own) into
    ``directory``, replacing what was there; returns the tensors written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors"):
        old.unlink()
    cap, shard, size, n = int(shard_mib * 2**20), {}, 0, 0

    def flush() -> None:
        nonlocal shard, size, n
        if shard:
            save_file(shard, str(directory / f"model-{n:05d}.safetensors"))
            shard, size, n = {}, 0, n + 1

    for name, t in cpu_tensors(state_dict).items():
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > cap:
            flush()
        shard[name], size = t, size + nbytes
    flush()
    return len(state_dict)
