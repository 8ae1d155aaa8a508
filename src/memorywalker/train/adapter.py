"""LoRA adapters through PEFT: apply, unwrap for the engine, save with a manifest, load onto a checked base.

    model = apply_adapter(model, AdapterConfig(kind="lora", rank=16, target_modules=["q_proj", "v_proj"]))
    run(engine_model(model), batch, cfg)          # the engine sees the base model with LoRA layers injected
    save_final(run_dir, model, tokenizer)         # PEFT saves adapter_config.json + adapter_model.safetensors
    write_adapter_manifest(run_dir / "final", ...)  # pins the base model hash, tokenizer and template hashes

An adapter is only meaningful on the base it was trained on: :func:`load_adapter` refuses (an
``InputError`` naming both hashes) to apply it to a model whose weights hash differs from the one its
manifest pins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from memorywalker.errors import InputError
from memorywalker.train.config import AdapterConfig
from memorywalker.train.refcache import template_hash, tokenizer_hash, weights_hash

ADAPTER_MANIFEST = "adapter_manifest.json"


def apply_adapter(model: torch.nn.Module, cfg: AdapterConfig) -> torch.nn.Module:
    """``model`` unchanged for ``kind="none"``; else a PEFT model whose only trainable parameters are
    the adapter's (the base is frozen). LoRA's B starts at 0, so the adapted model computes the base's
    function until the first update."""
    if cfg.kind == "none":
        return model
    from peft import LoraConfig, get_peft_model  # lazy: peft loads transformers; only LoRA runs need it

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in cfg.target_modules if t not in names]
    if missing:
        raise InputError(f"adapter.target_modules {missing} are not modules of this model; "
                         f"linear modules: {sorted(n for n in names if n.endswith('proj'))}")
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules),
                      lora_dropout=cfg.dropout, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def is_adapted(model) -> bool:
    return hasattr(model, "peft_config")


def engine_model(model):
    """What the engine runs: the base model with the adapter layers injected (PEFT modifies it in
    place), so the engine's schedules see the architecture's own forward and config."""
    return model.get_base_model() if is_adapted(model) else model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def write_adapter_manifest(out_dir: str | Path, *, cfg: AdapterConfig, base_model: str, base_hash: str,
                           tokenizer, dtype: str, data: list[str] | None = None,
                           evaluations: list[str] | None = None) -> Path:
    """``out_dir/adapter_manifest.json``: what the adapter needs to be applied and reproduced."""
    manifest: dict[str, Any] = {
        "kind": cfg.kind, "rank": cfg.rank, "alpha": cfg.alpha, "target_modules": list(cfg.target_modules),
        "dropout": cfg.dropout, "base_model": str(base_model), "base_model_hash": base_hash,
        "tokenizer_hash": tokenizer_hash(tokenizer), "template_hash": template_hash(tokenizer), "dtype": dtype,
        "data": list(data or []), "evaluations": list(evaluations or []),
    }
    path = Path(out_dir) / ADAPTER_MANIFEST
    path.write_text(json.dumps(manifest, indent=2))
    return path


def load_adapter(model: torch.nn.Module, adapter_dir: str | Path, *, trainable: bool = False):
    """``model`` with the adapter of ``adapter_dir`` applied (a PEFT model), after checking that
    ``model`` is the base the adapter's manifest pins."""
    from peft import PeftModel  # lazy: peft loads transformers; only adapter dirs need it

    adapter_dir = Path(adapter_dir)
    path = adapter_dir / ADAPTER_MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no {ADAPTER_MANIFEST} (not an adapter written by memorywalker)")
    manifest = json.loads(path.read_text())
    have = weights_hash(model)
    if have != manifest["base_model_hash"]:
        raise InputError(f"adapter {adapter_dir} was trained on base {manifest['base_model']} (weights sha256 "
                         f"{manifest['base_model_hash'][:12]}…), this model's weights hash to {have[:12]}…: "
                         "load it onto the same base")
    return PeftModel.from_pretrained(model, adapter_dir, is_trainable=trainable)


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The weights ``model`` computes with, in the base checkpoint's names: a LoRA layer's weight is
    ``W + ΔW`` (PEFT's ``get_delta_weight``: scale · B·A) under the name of the base layer's weight, and
    the adapter's own tensors are dropped. What a server that loads the base architecture (vLLM) takes;
    ``model`` itself is not modified (no merge/unmerge round trip through its parameters). A model
    without an adapter gives its plain state dict."""
    base = engine_model(model)
    if not is_adapted(model):
        return {k: v.detach() for k, v in base.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for name, t in base.state_dict().items():
        if ".lora_" not in name:
            out[name.replace(".base_layer.", ".")] = t.detach()
    for name, module in base.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):
            weight = module.base_layer.weight
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    weight = weight + module.get_delta_weight(adapter)  # W + (α/r)·B·A
            out[f"{name}.weight"] = weight.detach()
    return out
