"""A run dir belongs to one run: a fresh start needs an unused one, a resume needs the same configuration.

Checked before the model loads, so a wrong command fails in a second with one line:

* without ``resume``, a run dir that already holds a run (``config.json``, ``metrics.jsonl``,
  ``checkpoints/``, ``final/``) is refused: "pass --resume to continue or choose another run_dir";
* with ``resume``, every field of the recorded ``config.json`` that changes what a step computes must
  be unchanged; the differing fields are listed, and ``override_config`` (``--override-config``)
  accepts them (the replaced configuration is appended to ``config.history.jsonl``).

>>> config_changes({"lr": 0.001, "steps": 10, "seed": 0}, {"lr": 0.002, "steps": 20, "seed": 0})
['lr: 0.001 -> 0.002']
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memorywalker.train.config import ConfigError

RUN_ARTIFACTS = ("config.json", "metrics.jsonl", "checkpoints", "final")
# Fields that do not change what any step computes: a resume may change them freely. ``steps`` only
# moves the end of the run (the learning-rate schedule depends on warmup_steps, not on steps).
RESUMABLE_FIELDS = frozenset({"resume", "override_config", "run_dir", "steps", "save_every",
                              "keep_checkpoints", "tensorboard", "wandb", "wandb_project", "wandb_mode",
                              "device", "parallel",
                              "activation_checkpointing", "checkpoint_chunks", "collective_timeout"})


def config_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"field: old -> new"`` for every result-changing field that differs (missing = None)."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        if key in RESUMABLE_FIELDS:
            continue
        old, new = recorded.get(key), current.get(key)
        if old != new:
            out.append(f"{key}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def check_run_dir(cfg: BaseModel) -> None:
    """Refuse a used run dir without ``resume``, and a resume whose configuration changed."""
    run_dir = Path(cfg.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"run_dir {run_dir}: is a file, not a directory")
    used = [name for name in RUN_ARTIFACTS if (run_dir / name).exists()]
    if not cfg.resume:
        if used:
            raise FileExistsError(f"run_dir {run_dir} already holds a run ({', '.join(used)}): "
                                  "pass --resume to continue or choose another run_dir")
        return
    path = run_dir / "config.json"
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: the recorded configuration is unreadable ({e})") from None
    changed = config_changes(recorded, cfg.model_dump(mode="json"))
    if changed and not getattr(cfg, "override_config", False):
        raise ConfigError(f"resume: the configuration differs from {path} in {'; '.join(changed)}; "
                          "pass --override-config to resume with the new values")


def record_config(cfg: BaseModel) -> None:
    """Write ``run_dir/config.json`` (atomically); a replaced, different one goes to config.history.jsonl."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    text = cfg.model_dump_json(indent=2)
    if path.exists():
        old = path.read_text()
        if old == text:
            return
        with open(run_dir / "config.history.jsonl", "a", encoding="utf-8") as f:
            try:
                f.write(json.dumps(json.loads(old)) + "\n")
            except ValueError:
                f.write(json.dumps({"unparsable": old}) + "\n")
    tmp = run_dir / f".config-{os.getpid()}.json"
    tmp.write_text(text)
    os.replace(tmp, path)
