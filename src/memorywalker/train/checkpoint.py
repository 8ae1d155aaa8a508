"""Atomic, exactly-resumable checkpoints: weights (safetensors), optimizer, RNG states, data position.

Layout of ``run_dir``::

    checkpoints/step-000040/{model.safetensors, optimizer.pt, state.json, rng.pt, manifest.json}
    checkpoints/latest          # text file naming the newest checkpoint (for people; resume scans)
    checkpoints/step-000040/{dcp/, state.json, rng.pt, manifest.json}   # parallel="fsdp": sharded (train/fsdp.py)
    final/                      # the trained model as a Hugging Face dir (save_pretrained + tokenizer)

A checkpoint is written to a temporary folder and renamed into place; ``manifest.json`` (the size and
SHA-256 of every other file) is written last. A checkpoint is trusted only when it verifies against
its manifest, so a process killed at any instant (SIGKILL included), a full disk or a file cut short
later never passes for a complete checkpoint. Resuming takes the newest checkpoint that verifies and
says why newer ones were skipped; when checkpoints exist but none verifies it refuses
(:class:`CheckpointError`) instead of starting over. Older checkpoints are deleted only after a newer
one has verified. Restoring weights, optimizer moments, every RNG and the data position makes a resumed
CPU run bitwise identical to an uninterrupted one.

A save that fails (a full disk, a read-only folder) removes its temporary folder and raises an
``OSError`` naming the file it was writing (safetensors and ``torch.save`` report the system error in
their own exceptions; it is recovered), so the CLI says ``PATH: No space left on device`` and exits 2.
The temporary folders of saves killed mid-write (``checkpoints/.tmp-step-*``) are removed once a
resume has loaded its checkpoint (the run dir's lock guarantees no other process is writing them).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule

from memorywalker.errors import InputError
from memorywalker.fileio import file_sha256, naming

MANIFEST = "manifest.json"
FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "state.json")  # what a checkpoint must hold
# A sharded checkpoint (parallel="fsdp", torch.distributed.checkpoint) holds dcp/ instead of the first two.
FORMAT_FILES = {"safetensors": FILES, "dcp": ("dcp/.metadata", "rng.pt", "state.json")}


DCP_DIR = "dcp"  # a sharded checkpoint's folder of .distcp files


class CheckpointError(InputError):
    """No checkpoint to trust where one was expected; the message names the run dir or the file."""


def verify_checkpoint(path: str | Path) -> str | None:
    """Why checkpoint folder ``path`` cannot be trusted, or None when every file matches its manifest."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (the write did not finish, or an older memorywalker wrote it)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({e})"
    fmt = manifest.get("format", "safetensors")
    if fmt not in FORMAT_FILES:
        return f"{MANIFEST} names an unknown format {fmt!r}"
    for name in FORMAT_FILES[fmt]:
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, the manifest says {want['bytes']}"
        if file_sha256(f) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def _step_of(path: Path) -> int | None:
    try:
        return int(path.name.removeprefix("step-"))
    except ValueError:
        return None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint folders of ``run_dir``, newest step first (temporary folders excluded)."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step-*") if p.is_dir() and _step_of(p) is not None] if root.is_dir() else []
    return sorted(found, key=_step_of, reverse=True)


def newest_verified(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint of ``run_dir`` that verifies, and the newer ones skipped with the reason."""
    skipped: list[tuple[Path, str]] = []
    for path in list_checkpoints(run_dir):
        reason = verify_checkpoint(path)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


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
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        # clone(): safetensors refuses tensors that share storage (tied embeddings).
        with naming(tmp / "model.safetensors"):  # SafetensorError "(os error 28)" -> OSError naming the file
            save_file({k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()},
                      str(tmp / "model.safetensors"))
        torch_save(optimizer.state_dict(), tmp / "optimizer.pt")
        write_extras(tmp, step, state)
        return seal_checkpoint(run_dir, step, tmp, keep=keep)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk gets its space back; older checkpoints stay
        raise


class _RecordingWriter:
    """A binary file for ``torch.save`` that keeps the OSError of a failed write: torch reports it as
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``, without the cause."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def torch_save(obj: Any, path: Path) -> None:
    """``torch.save(obj, path)``; an I/O failure raises an ``OSError`` naming ``path``."""
    with naming(path), open(path, "wb") as f:
        w = _RecordingWriter(f)
        try:
            torch.save(obj, w)
        except RuntimeError as e:
            if w.error is None:
                raise
            raise OSError(w.error.errno, w.error.strerror, str(path)) from e


def write_extras(tmp: Path, step: int, state: dict[str, Any]) -> None:
    """The RNG states and ``state.json`` (step, data position…) of a checkpoint being written."""
    torch_save(_rng_state(), tmp / "rng.pt")
    with naming(tmp / "state.json"):
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))


def seal_checkpoint(run_dir: str | Path, step: int, tmp: Path, *, keep: int = 2, fmt: str = "safetensors") -> Path:
    """Fsync every file of the temporary folder ``tmp``, write the manifest last, rename it into
    place as ``step-NNNNNN``, verify, point ``latest`` at it, drop older checkpoints beyond ``keep``.
    ``fmt`` (``safetensors`` | ``dcp``) is recorded in the manifest and decides which files it must list."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step:06d}"
    files = sorted(f for f in tmp.rglob("*") if f.is_file())
    for f in files:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    # The manifest goes last: a folder without it (or with files that disagree) is never trusted.
    manifest = {"step": step, "format": fmt,
                "files": {f.relative_to(tmp).as_posix(): {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
                          for f in files}}
    with naming(tmp / MANIFEST), open(tmp / MANIFEST, "w") as fh:
        fh.write(json.dumps(manifest, indent=2))
        fh.flush()
        os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    reason = verify_checkpoint(final)
    if reason is not None:  # e.g. a full disk: keep every older checkpoint, stop the run
        raise CheckpointError(f"checkpoint {final} did not verify after writing: {reason}")
    latest_tmp = root / f".latest-{os.getpid()}"
    with naming(latest_tmp):
        latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    _fsync_dir(root)
    # Only after the new one verified: drop older checkpoints beyond the newest ``keep``. Newer
    # folders (left by a run that resumed from before them) are not touched here; a later save of
    # the same step replaces them.
    older = [p for p in list_checkpoints(run_dir) if _step_of(p) < step]
    for old in older[keep - 1:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of ``run_dir`` that verifies against its manifest, or None."""
    return newest_verified(run_dir)[0]


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Verify ``path``, then restore weights, optimizer and RNG from it; return its state dict (step,
    data position…). Raises :class:`CheckpointError` naming the checkpoint and the cause."""
    path = Path(path)
    reason = verify_checkpoint(path)
    if reason is not None:
        raise CheckpointError(f"checkpoint {path}: {reason}")
    if json.loads((path / MANIFEST).read_text()).get("format") == "dcp":
        load_sharded(path, model, optimizer)  # any world size; collective when distributed
        _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
        return json.loads((path / "state.json").read_text())
    if _is_sharded(model):
        raise CheckpointError(f"checkpoint {path} was written unsharded (parallel=ddp); resume it with "
                              "parallel=ddp, or start the fsdp run afresh")
    weights = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied weights are saved under both names and restored through either one.
    if unexpected or any(k not in weights for k in missing):
        raise CheckpointError(f"checkpoint {path} does not match the model: missing={missing} "
                              f"unexpected={unexpected}")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())


def state_dicts(model, optimizer):
    return get_state_dict(model, optimizer)  # FQN-keyed (sharded DTensors under FSDP)


def load_sharded(path: Path, model, optimizer) -> None:
    """Restore model and optimizer from a DCP checkpoint folder, on any world size (collective when
    distributed; an unsharded model on one process reads every shard)."""
    msd, osd = state_dicts(model, optimizer)  # templates; initializes AdamW's moments (lr 0)
    target = {"model": msd, "optim": osd}
    dcp.load(target, checkpoint_id=str(Path(path) / DCP_DIR))
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])


def _is_sharded(model) -> bool:
    return any(isinstance(m, FSDPModule) for m in model.modules())


def remove_unfinished(run_dir: str | Path) -> list[str]:
    """Delete what killed saves left behind (``checkpoints/.tmp-step-*``, ``.latest-*``,
    ``.tmp-final-*``, ``.old-final-*``); return their names. Only the run dir's owner may call it."""
    run_dir = Path(run_dir)
    root = run_dir / "checkpoints"
    left = [*(root.glob(".tmp-step-*") if root.is_dir() else []), *(root.glob(".latest-*") if root.is_dir() else []),
            *run_dir.glob(".tmp-final-*"), *run_dir.glob(".old-final-*")]
    for p in left:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return sorted(p.name for p in left)


def restore(run_dir: str | Path, resume: bool, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            *, verbose: bool = True, clean_up: bool = True) -> dict[str, Any] | None:
    """The state of the newest verified checkpoint of ``run_dir`` after loading it (``resume``), or
    None for a fresh start.

    * Resuming says which checkpoint it took and why newer ones were skipped (on stderr).
    * Resuming where checkpoints exist but none verifies raises :class:`CheckpointError`: never a
      silent start from step 0 over a run's history.
    * A fresh start into a run dir that already holds checkpoints is refused, so a run is never
      silently mixed with an older one.
    * After a resume loaded (``clean_up``: on the rank that owns the run dir), the temporary folders
      of saves that were killed are removed (:func:`remove_unfinished`)."""
    path, skipped = newest_verified(run_dir)
    if resume:
        if path is None and skipped:
            why = "; ".join(f"{p.name}: {r}" for p, r in skipped)
            raise CheckpointError(f"{run_dir}: no checkpoint verifies ({why}); refusing to start over "
                                  "from step 0 - fix or move the checkpoints, or choose another run_dir")
        if verbose and path is not None:
            for p, r in skipped:
                print(f"resume: skipped {p.name}: {r}", file=sys.stderr)
            print(f"resume: from {path}" + (" (newest that verifies)" if skipped else ""), file=sys.stderr)
        state = None if path is None else load_checkpoint(path, model, optimizer)
        if clean_up:
            removed = remove_unfinished(run_dir)
            if removed and verbose:
                print(f"resume: removed what killed saves left behind: {', '.join(removed)}", file=sys.stderr)
        return state
    if path is not None or skipped:
        name = (path or skipped[0][0]).name
        raise FileExistsError(f"{run_dir} already holds checkpoints ({name}); "
                              "pass --resume to continue or choose another run_dir")
    return None


def save_final(run_dir: str | Path, model, tokenizer, provenance: dict[str, Any] | None = None) -> Path:
    """``run_dir/final``: ``model.save_pretrained`` + the tokenizer (+ ``memorywalker.json`` with
    ``provenance``: recipe, steps), swapped into place atomically."""
    final = Path(run_dir) / "final"
    tmp = Path(run_dir) / f".tmp-final-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with naming(tmp):  # save_pretrained's SafetensorError "(os error 28)" -> OSError naming the folder
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            if provenance is not None:
                (tmp / "memorywalker.json").write_text(json.dumps(provenance))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = Path(run_dir) / f".old-final-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
