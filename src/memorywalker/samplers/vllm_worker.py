"""Runs inside vLLM's worker processes: the weight-sync entry point of :class:`~memorywalker.samplers.
vllm.VLLMPolicy` (``worker_extension_cls``: vLLM mixes this class into its worker, so
``LLM.collective_rpc("memorywalker_load_weights", args=(path,))`` calls the method below on every worker).

The trainer writes the weights as one safetensors file in shared memory (``/dev/shm``) and only the path
crosses the RPC: vLLM's RPC is for control messages (tensors in untyped RPC arguments arrive as raw
buffers, not tensors). The file is memory-mapped here and handed to the worker's ``reload_weights``: vLLM's in-place reload,
which takes Hugging Face checkpoint names, does the model's fusing (q/k/v into qkv_proj, gate/up into
gate_up_proj) and sharding, and re-runs the post-load processing (the CPU backend repacks linear
weights for its kernels, so a plain ``model.load_weights`` into the packed parameters fails). Imports
nothing of memorywalker's beyond this module.
"""

from __future__ import annotations

from safetensors.torch import load_file


class WeightSyncExtension:
    """Mixed into vLLM's ``Worker`` (which provides ``reload_weights``)."""

    def memorywalker_load_weights(self, path: str) -> int:
        """Load every tensor of the safetensors file ``path`` into the served model; returns how many
        tensors were read."""
        weights = load_file(path)  # a tmpfs file: read from memory, no copy through the RPC
        self.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        return len(weights)
