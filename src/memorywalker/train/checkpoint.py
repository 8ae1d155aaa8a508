"""Atomic, exactly-resumable checkpoints: weights (safetensors), optimizer, RNG states, data position.

Layout of ``run_dir``::

    checkpoints/step-000040/{model.safetensors, optimizer.pt, state.json, rng.pt}
    checkpoints/latest          # text file naming the newest complete checkpoint
    final/                      # the trained model as a Hugging Face dir (save_pretrained + tokenizer)

A checkpoint is written to a temporary folder and renamed into place, and ``latest`` is replaced
atomically afterwards, so a process killed at any instant (SIGKILL included) leaves either the old or
the new checkpoint complete, never a half-written one. Restoring weights, optimizer moments, every RNG
and the data position makes a resumed CPU run bitwise identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], *, keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically; keep the newest ``keep`` checkpoints."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # clone(): safetensors refuses tensors that share storage (tied embeddings).
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()},
              str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".latest-{os.getpid()}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    _fsync_dir(root)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore weights, optimizer and RNG from ``path``; return its state dict (step, data position…)."""
    path = Path(path)
    weights = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied weights are saved under both names and restored through either one.
    if unexpected or any(k not in weights for k in missing):
        raise RuntimeError(f"checkpoint {path} does not match the model: missing={missing} unexpected={unexpected}")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())


def restore(run_dir: str | Path, resume: bool, model: torch.nn.Module, optimizer: torch.optim.Optimizer
            ) -> dict[str, Any] | None:
    """The state of the newest checkpoint of ``run_dir`` after loading it (``resume``), or None for a
    fresh start. A fresh start into a run dir that already holds checkpoints is refused, so a run is
    never silently mixed with an older one."""
    path = latest_checkpoint(run_dir)
    if resume:
        return None if path is None else load_checkpoint(path, model, optimizer)
    if path is not None:
        raise FileExistsError(f"{run_dir} already holds checkpoints ({path.name}); "
                              "pass --resume (resume=true) to continue it, or choose another run_dir")
    return None


def save_final(run_dir: str | Path, model, tokenizer, provenance: dict[str, Any] | None = None) -> Path:
    """``run_dir/final``: ``model.save_pretrained`` + the tokenizer (+ ``memorywalker.json`` with
    ``provenance``: recipe, steps), swapped into place atomically."""
    final = Path(run_dir) / "final"
    tmp = Path(run_dir) / f".tmp-final-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if provenance is not None:
        (tmp / "memorywalker.json").write_text(json.dumps(provenance))
    old = Path(run_dir) / f".old-final-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
