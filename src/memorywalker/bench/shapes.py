"""Random models at realistic shapes, built locally: nothing is downloaded.

A benchmark at the kit's 782-entry vocabulary and head_dim 16 measures a world no user is in. The shapes
shipped here are the published ``config.json`` values of real models (the architecture, widths, heads,
head_dim, vocabulary, tied embeddings, RoPE); the weights are random, which changes nothing about time
and memory. Any field can be overridden (fewer layers, the kit's width with a real vocabulary, ...):

>>> cfg = shape_config("qwen3-0.6b", num_hidden_layers=2)
>>> cfg.model_type, cfg.vocab_size, cfg.head_dim, cfg.num_hidden_layers
('qwen3', 151936, 128, 2)
>>> sorted(SHAPES)
['kit', 'llama-3.2-1b', 'qwen2.5-0.5b', 'qwen3-0.6b']

``kit`` is the kit model's own config (hidden 64, 2 layers, head_dim 16, the kit tokenizer's vocabulary).
"""

from __future__ import annotations

import json
from importlib import resources

from memorywalker.errors import InputError
from memorywalker.modelkit import default_kit

# Shipped shapes (bench/shapes/NAME.json, HF config.json fields), plus the kit's.
SHAPES = ("kit", *sorted(p.name.removesuffix(".json") for p in resources.files("memorywalker.bench")
                         .joinpath("shapes").iterdir() if p.name.endswith(".json")))

# CLI flag -> config field
OVERRIDES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
}


def shape_config(name: str, *, kit_model_dir=None, **fields):
    """The ``transformers`` config of shape ``name`` (one of :data:`SHAPES`) with ``fields`` overridden."""
    from transformers import AutoConfig  # lazy: transformers only to build a shape (SHAPES stays light)

    if name not in SHAPES:
        raise InputError(f"unknown shape {name!r}; valid: {list(SHAPES)}")
    if name == "kit":
        if kit_model_dir is None:
            kit_model_dir = default_kit()[1]
        config = AutoConfig.from_pretrained(kit_model_dir)
        for k, v in fields.items():
            setattr(config, k, v)
        return config
    data = json.loads(resources.files("memorywalker.bench").joinpath("shapes", f"{name}.json").read_text())
    data.update(fields)
    return AutoConfig.for_model(data.pop("model_type"), **data)


def random_model(name: str, tokenizer, *, dtype=None, seed: int = 0, kit_model_dir=None, **fields):
    """A randomly initialised causal LM of shape ``name`` (fields overridden) for ``tokenizer``: special
    token ids are the tokenizer's; the vocabulary must hold every id the tokenizer can produce."""
    import torch  # lazy: torch/transformers only to build a model (SHAPES stays light)
    from transformers import AutoModelForCausalLM  # lazy: as torch

    config = shape_config(name, kit_model_dir=kit_model_dir, **fields)
    if config.vocab_size < len(tokenizer):
        raise InputError(f"vocab_size {config.vocab_size} < the tokenizer's {len(tokenizer)} entries")
    config.eos_token_id, config.pad_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model
