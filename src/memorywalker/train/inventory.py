"""Parameter-state memory of full vs adapter training (weights, gradients, master copy, optimizer moments).

Bytes per parameter are declared, not measured: a trainable parameter holds a 2-byte weight, a 2-byte
gradient, a 4-byte fp32 master copy and two 4-byte AdamW moments (2 + 2 + 4 + 8 = 16); a frozen one
holds its 2-byte weight only. Activations are not counted.

Worked example (an 8e9-parameter base, LoRA rank 16 on 2 matrices of 4096×4096 in each of 32 layers):

>>> n = lora_parameters([(4096, 4096)] * 2, rank=16, layers=32)
>>> n
8388608
>>> inv = inventory(8e9, n)
>>> round(100 * inv["adapter_fraction"], 2), round(inv["adapter_bytes"] / 1e6, 2)
(0.1, 134.22)
>>> round(inv["adapter_total_bytes"] / 1e9, 2), round(inv["full_bytes"] / 1e9, 2), round(inv["ratio"], 1)
(16.13, 128.0, 7.9)
"""

from __future__ import annotations

from collections.abc import Sequence

from memorywalker.errors import InputError

TRAINABLE_BYTES = {"weight": 2, "grad": 2, "master": 4, "moments": 8}  # per trainable parameter
FROZEN_BYTES = 2  # per frozen parameter (its weight)


def lora_parameters(shapes: Sequence[tuple[int, int]], rank: int, layers: int = 1) -> int:
    """LoRA parameters of matrices ``shapes`` (out, in) per layer: ``rank · (out + in)`` each (B: out×r, A: r×in)."""
    return layers * sum(rank * (o + i) for o, i in shapes)


def inventory(base_params: float, adapter_params: int) -> dict[str, float]:
    """Parameter-state bytes of full training and of adapter training over a frozen base."""
    per = sum(TRAINABLE_BYTES.values())
    full = base_params * per
    adapter = adapter_params * per
    frozen = base_params * FROZEN_BYTES
    return {"base_params": base_params, "adapter_params": adapter_params,
            "adapter_fraction": adapter_params / base_params, "full_bytes": full, "adapter_bytes": adapter,
            "frozen_bytes": frozen, "adapter_total_bytes": frozen + adapter, "ratio": full / (frozen + adapter)}


def from_model_config(config_path, rank: int, target_modules: Sequence[str]) -> tuple[int, int]:
    """``(base parameters, adapter parameters)`` of a Hugging Face model config (a ``config.json`` or a
    model dir), counted on the meta device: nothing is allocated or downloaded."""
    import torch  # lazy: torch/transformers only for a model config (the arithmetic needs none)
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: as torch

    config = AutoConfig.from_pretrained(config_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    base = sum(p.numel() for p in model.parameters())
    shapes = [tuple(m.weight.shape) for name, m in model.named_modules()
              if name.rsplit(".", 1)[-1] in target_modules and hasattr(m, "weight")]
    if not shapes:
        raise InputError(f"no module named {list(target_modules)} in {config_path}")
    return base, lora_parameters(shapes, rank)
