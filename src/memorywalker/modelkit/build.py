"""Build a tiny tokenizer and tiny random causal LMs locally, saved as ordinary Hugging Face dirs.

Nothing is downloaded: the tokenizer is a byte-level BPE trained with the ``tokenizers`` library on
text you give it (by default a bundled corpus); the models are randomly initialised from a seed.

>>> tok_dir = build_tokenizer("/tmp/kit/tok")                          # doctest: +SKIP
>>> model_dir = build_model("/tmp/kit/llama", tok_dir, arch="llama")   # doctest: +SKIP
>>> AutoModelForCausalLM.from_pretrained(model_dir)                    # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from memorywalker.errors import InputError
from memorywalker.modelkit.templates import SCAFFOLD_TOKENS, SPECIAL_TOKENS, TEMPLATES

ARCHS = ("llama", "qwen2")


def bundled_corpus() -> list[str]:
    """The small English corpus shipped with the package (agent/tool-use flavoured text)."""
    text = resources.files("memorywalker.data").joinpath("corpus.txt").read_text(encoding="utf-8")
    return [p for p in text.split("\n\n") if p.strip()]


def build_tokenizer(
    out_dir: str | os.PathLike,
    corpus: Iterable[str] | None = None,
    *,
    vocab_size: int = 1024,
    template: str = "chatml",
) -> Path:
    """Train a byte-level BPE on ``corpus`` and save it with a chat template; return the directory.

    Byte-level BPE decodes every byte sequence exactly, so ``decode(encode(text)) == text``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # lazy: kit build only
    from transformers import PreTrainedTokenizerFast  # lazy: kit build only

    if template not in TEMPLATES:
        raise InputError(f"unknown template {template!r}; valid: {sorted(TEMPLATES)}")
    texts = list(corpus) if corpus is not None else bundled_corpus()
    tok = Tokenizer(models.BPE())
    # trim_offsets=False keeps character offsets exact, which span labelling relies on.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(SCAFFOLD_TOKENS)
    fast.chat_template = TEMPLATES[template]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def build_model(
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 8192,
    seed: int = 0,
    vocab_size: int | None = None,
    head_dim: int | None = None,
) -> Path:
    """Save a randomly initialised causal LM of ``arch`` (one of :data:`ARCHS`) sized to the tokenizer.

    ``vocab_size`` (default: the tokenizer's) may be larger, as a real model's is (e.g. 151,936 with
    the kit tokenizer: the cost of a real vocabulary at the kit's width); ``head_dim`` defaults to
    ``hidden_size // num_heads``."""
    import torch  # lazy: torch/transformers only to build a kit (a built kit's lookup stays light)
    from transformers import (  # lazy: as torch
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )
    from transformers.utils import logging as hf_logging  # lazy: as torch

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if vocab_size is not None and vocab_size < len(tok):
        raise InputError(f"vocab_size {vocab_size} < the tokenizer's {len(tok)} entries")
    common = dict(
        vocab_size=vocab_size or len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        **({"head_dim": head_dim} if head_dim else {}),
    )
    if arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    else:
        raise InputError(f"unknown arch {arch!r}; valid: {list(ARCHS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def kit_dir(cache: str | os.PathLike | None = None) -> Path:
    """Where :func:`default_kit` caches its build (``$MEMORYWALKER_CACHE`` or ~/.cache/memorywalker)."""
    root = cache or os.environ.get("MEMORYWALKER_CACHE") or Path.home() / ".cache" / "memorywalker"
    return Path(root)


KIT_POSITIONS = 65_536


def default_kit(
    cache: str | os.PathLike | None = None, *, template: str = "chatml", arch: str = "llama", seed: int = 0
) -> tuple[Path, Path]:
    """Build (once, then reuse) the default tokenizer and tiny model; return ``(tokenizer_dir, model_dir)``.

    The model has :data:`KIT_POSITIONS` positions, so that a real harness's first prompt fits it (Claude
    Code's, Codex's and OpenCode's are 15.6K–30K kit tokens with their tools rendered). The cache key
    covers the corpus, the template and the build code, so a change rebuilds.
    """
    key_src = json.dumps([bundled_corpus(), TEMPLATES[template], arch, seed, _build_version()])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    root = kit_dir(cache) / f"kit-{template}-{arch}-{key}"
    tok_dir, model_dir = root / "tokenizer", root / "model"
    if not (model_dir / "config.json").exists():
        tmp = root.with_name(root.name + f".tmp{os.getpid()}")
        build_tokenizer(tmp / "tokenizer", template=template)
        build_model(tmp / "model", tmp / "tokenizer", arch=arch, seed=seed, max_positions=KIT_POSITIONS)
        try:
            tmp.rename(root)  # atomic: a concurrent builder either wins or finds it built
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return tok_dir, model_dir


def _build_version() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]
