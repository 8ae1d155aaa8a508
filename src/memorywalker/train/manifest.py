"""The training manifest: ``run_dir/training_manifest.json`` binds a run's artifacts to what produced them.

Written by every recipe (sft, rl, dpo) after its final model, it holds the input files and their
SHA-256, the record ids (with their split and parent ids, so derived records keep their lineage), the
target-selection rule, the tokenizer and chat-template hashes, the method and normalization, the
resolved config, the seeds, the package version and git commit (when the package runs from a git
checkout), the base model's weights hash, and the SHA-256 of every output artifact in ``final/``.
A test recomputes each hash.
"""

from __future__ import annotations

import json
import os
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from memorywalker.fileio import file_sha256

MANIFEST_NAME = "training_manifest.json"


def package_version() -> str:
    try:
        return version("memorywalker")
    except PackageNotFoundError:  # not installed as a distribution (a PYTHONPATH checkout)
        return "unknown"


def git_commit() -> str | None:
    """The commit of the checkout the package runs from, or None (not a git checkout, no git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def record_rows(trajectories) -> list[dict[str, Any]]:
    """``{"id", "split", "parent"}`` per record (``parent``: its lineage parent, for derived records)."""
    return [{"id": t.id, "split": t.task.split if t.task is not None else None,
             "parent": t.lineage.parent} for t in trajectories]


def artifact_hashes(root: str | Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root``."""
    root = Path(root)
    return {str(p.relative_to(root)): file_sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def write_training_manifest(run_dir: str | Path, *, recipe: str, cfg, tokenizer, base_model_hash: str,
                            inputs: list[str | Path] = (), records: list[dict[str, Any]] = (),
                            target_rule: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``run_dir/training_manifest.json`` (atomically) and return its path."""
    from memorywalker.train.refcache import template_hash, tokenizer_hash  # lazy: torch; eval needs none

    run_dir = Path(run_dir)
    manifest = {
        "recipe": recipe,
        "inputs": [{"path": str(p), "sha256": file_sha256(p)} for p in inputs],
        "records": list(records),
        "target_rule": target_rule or {},
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "template_hash": template_hash(tokenizer),
        "method": cfg.method,
        "normalization": cfg.normalization,
        "config": cfg.model_dump(mode="json"),
        "seeds": {"seed": cfg.seed, **({"world_seed": cfg.world_seed} if hasattr(cfg, "world_seed") else {})},
        "package_version": package_version(),
        "git_commit": git_commit(),
        "base_model": cfg.model,
        "base_model_hash": base_model_hash,
        "artifacts": artifact_hashes(run_dir / "final"),
        **(extra or {}),
    }
    path = run_dir / MANIFEST_NAME
    tmp = run_dir / f".{MANIFEST_NAME}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(tmp, path)
    return path
