"""The start and the end every recipe (sft, rl, dpo) shares.

:func:`begin`: the ranks (with the configured collective timeout), the run directory checked (a used one
needs ``--resume``, a resume needs the recorded configuration), every rank past the check before rank 0
writes ``config.json``. :func:`finish`: ``run_dir/final`` (consolidated from the shards under fsdp),
the adapter's manifest when an adapter was trained, the training manifest, every rank waiting for rank 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memorywalker.train.adapter import is_adapted, write_adapter_manifest
from memorywalker.train.distributed import DistInfo, barrier, init_distributed
from memorywalker.train.fsdp import save_model
from memorywalker.train.manifest import write_training_manifest
from memorywalker.train.rundir import check_run_dir


def begin(cfg) -> tuple[DistInfo, Path]:
    """This process's rank info and the run directory, checked on every rank before any rank writes to it."""
    info = init_distributed(cfg.collective_timeout)
    check_run_dir(cfg)  # a used run_dir needs --resume; a resume needs the recorded configuration
    barrier()  # every rank checks before rank 0 writes config.json
    return info, Path(cfg.run_dir)


def finish(cfg, info: DistInfo, model, tokenizer, *, recipe: str, steps: int, base_hash: str,
           inputs: list[str] | None = None, optimizer=None, **manifest: Any) -> Path:
    """Save ``run_dir/final`` and its manifests (``manifest``: the rest of
    :func:`~memorywalker.train.manifest.write_training_manifest`'s keywords); returns the final dir.
    ``inputs``: the data files the run read (named by both manifests). ``optimizer``: its state is
    dropped first (the last checkpoint holds it), so a sharded run's export gathers the full weights
    beside the shards only, not beside the AdamW moments as well."""
    run_dir = Path(cfg.run_dir)
    if optimizer is not None:
        optimizer.state.clear()
    save_model(run_dir, model, tokenizer, {"recipe": recipe, "steps": steps}, info)  # fsdp: consolidated
    if info.is_main:
        if is_adapted(model):
            write_adapter_manifest(run_dir / "final", cfg=cfg.adapter, base_model=cfg.model, base_hash=base_hash,
                                   tokenizer=tokenizer, dtype=cfg.dtype, data=inputs or [])
        write_training_manifest(run_dir, recipe=recipe, cfg=cfg, tokenizer=tokenizer, base_model_hash=base_hash,
                                inputs=inputs or [], **manifest)
    barrier()
    return run_dir / "final"
