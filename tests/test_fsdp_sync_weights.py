"""What a rollout server loads from a sharded model (:func:`memorywalker.train.fsdp.main_rank_weights`): on
2 gloo FSDP ranks, rank 0 gets the whole weights — equal to the unsharded model's, a LoRA model's merged
W + (α/r)·B·A equal to :func:`~memorywalker.train.adapter.merged_state_dict` of the same model unsharded
(PEFT's own delta) — and rank 1 gets nothing (only rank 0 keeps the gathered tensors); the model stays
sharded after it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from memorywalker.train.adapter import apply_adapter, merged_state_dict
from memorywalker.train.config import AdapterConfig
from memorywalker.train.fsdp import fsdp_modules, main_rank_weights, shard_model
from ranks import spawn

LORA = AdapterConfig(kind="lora", rank=4, alpha=8, target_modules=["q_proj", "v_proj"])


def build(model_dir: str, lora: bool) -> torch.nn.Module:
    """The kit model (with LoRA whose B is random: the merge is not the base), the same on every process."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora:
        model = apply_adapter(model, LORA)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn_like(p) * 0.1)
    return model


def _worker(rank: int, world: int, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    for lora in (False, True):
        model = shard_model(build(model_dir, lora))
        weights = main_rank_weights(model, is_main=rank == 0)
        assert all(p.__class__.__name__ == "DTensor" for p in model.parameters())  # still sharded
        if rank == 0:
            torch.save(weights, Path(out) / f"weights-{lora}.pt")
        else:
            assert weights is None
        assert len(fsdp_modules(model)) > 1


@pytest.mark.slow
def test_rank_0_alone_gets_the_whole_merged_weights_of_a_sharded_model(kit, tmp_path):
    spawn(_worker, str(kit[1]), str(tmp_path), log_dir=tmp_path)
    for lora in (False, True):
        got = torch.load(tmp_path / f"weights-{lora}.pt")
        want = merged_state_dict(build(str(kit[1]), lora))
        assert sorted(got) == sorted(want) and not any(".lora_" in k or "base_layer" in k for k in got)
        assert max((got[k] - want[k]).abs().max().item() for k in want) <= 1e-6
        if lora:  # the merge moved the adapted weights off the base's
            base = AutoModelForCausalLM.from_pretrained(kit[1], dtype=torch.float32).state_dict()
            assert (got["model.layers.0.self_attn.q_proj.weight"] - base["model.layers.0.self_attn.q_proj.weight"]).abs().max() > 1e-3
