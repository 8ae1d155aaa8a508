"""Runs inside vLLM's worker processes: the weight-sync entry point of :class:`~memorywalker.samplers.
vllm.VLLMPolicy` and of a ``vllm serve`` fleet (:mod:`~memorywalker.samplers.vllm_server`).
``worker_extension_cls`` (``vllm serve --worker-extension-cls``) mixes this class into vLLM's worker, so
``collective_rpc("memorywalker_load_weights", args=(path,))`` — in process, or ``POST /collective_rpc``
on a server started with ``VLLM_SERVER_DEV_MODE=1`` — calls the method below on every worker.

The trainer writes the weights as safetensors (one file in shared memory, or a directory of shards on a
path every server can read) and only the path crosses the RPC: vLLM's RPC is for control messages
(tensors in untyped RPC arguments arrive as raw buffers, not tensors; the HTTP route takes strings only).
The files are memory-mapped here, one tensor at a time, and handed to the worker's ``reload_weights``:
vLLM's in-place reload, which takes Hugging Face checkpoint names, does the model's fusing (q/k/v into
qkv_proj, gate/up into gate_up_proj) and sharding, and re-runs the post-load processing (the CPU backend
repacks linear weights for its kernels, so a plain ``model.load_weights`` into the packed parameters
fails). Imports nothing of memorywalker's beyond this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
