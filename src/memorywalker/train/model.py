"""Load the model a recipe trains: any local Hugging Face causal LM dir, ``kit`` (the offline tiny one), or a
packaged pretrained model by name once converted (``smollm2-135m``: :mod:`memorywalker.modelkit.pretrained`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from memorywalker.errors import InputError, judging
from memorywalker.modelkit import default_kit
from memorywalker.modelkit.pretrained import model_path

# What a directory transformers refuses is not (its ValueError becomes bad input naming the directory).
TOKENIZER = "not a tokenizer transformers can load"
MODEL = "not a causal LM transformers can load"


def resolve_dirs(model: str, tokenizer: str | None = None) -> tuple[Path, Path]:
    """``(model_dir, tokenizer_dir)``: ``kit`` builds (once) and uses :func:`~memorywalker.modelkit.default_kit`;
    a :data:`~memorywalker.modelkit.pretrained.PACKAGED` name is its converted dir (FileNotFoundError naming
    ``memorywalker models get NAME`` when it is not converted); the tokenizer defaults to the model dir's."""
    if model == "kit":
        tok_dir, model_dir = default_kit()
        return model_dir, Path(tokenizer) if tokenizer else tok_dir
    model_dir = model_path(model)  # a packaged name (smollm2-135m) is its converted dir
    return model_dir, Path(tokenizer) if tokenizer else model_dir


def load_tokenizer(model: str, tokenizer: str | None = None):
    """The tokenizer a recipe uses (``tokenizer`` dir, else the model dir's; an adapter dir holds its
    own), loaded before the model so that the data can be checked against its vocabulary first."""
    from transformers import AutoTokenizer  # lazy: transformers (~3 s); resolve_dirs users need none

    _, tok_dir = resolve_dirs(model, tokenizer)
    if not tok_dir.is_dir():
        raise FileNotFoundError(f"{tok_dir} is not a local directory (recipes never download models)")
    with judging(tok_dir, TOKENIZER):
        return AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)


def load_model(model: str, tokenizer: str | None, *, dtype: str, device: torch.device):
    """``(model, tokenizer)`` from local dirs only (nothing is downloaded). An adapter dir (one written
    with ``adapter.kind=lora``) loads its base, checks the base hash its manifest pins, and merges
    the adapter into the weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: as in load_tokenizer

    model_dir, tok_dir = resolve_dirs(model, tokenizer)
    if (model_dir / "adapter_config.json").is_file():
        return _load_merged_adapter(model_dir, tokenizer, dtype=dtype, device=device)
    for d in (model_dir, tok_dir):
        if not d.is_dir():
            raise FileNotFoundError(f"{d} is not a local directory (recipes never download models)")
    with judging(tok_dir, TOKENIZER):
        tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    with judging(model_dir, MODEL):
        lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), local_files_only=True)
    return lm.to(device), tok


def _load_merged_adapter(adapter_dir: Path, tokenizer: str | None, *, dtype: str, device: torch.device):
    from memorywalker.train.adapter import load_adapter  # lazy: +0.2 s (engine); resolve_dirs users need none

    base = json.loads((adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise InputError(f"{adapter_dir}: adapter_config.json names no base_model_name_or_path")
    lm, tok = load_model(base, tokenizer or str(adapter_dir), dtype=dtype, device=torch.device("cpu"))
    return load_adapter(lm, adapter_dir).merge_and_unload().to(device), tok
