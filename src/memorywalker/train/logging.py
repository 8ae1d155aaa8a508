"""Metrics to JSONL every step (always), and to TensorBoard and Weights & Biases when asked."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

from memorywalker.errors import InputError
from memorywalker.fileio import naming


class MetricsLogger:
    """``log(step, metrics)`` appends one JSON line to ``run_dir/metrics.jsonl``.

    Opening in append mode keeps a resumed run's history in one file. Lines for steps at or beyond the
    resume point (``resume_step``; 0 or None = a fresh start) are moved, never deleted, to
    ``metrics.superseded.jsonl`` first, so a killed-and-resumed run does not log a step twice and no
    history is lost.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False, enabled: bool = True,
                 resume_step: int | None = None, wandb: dict[str, Any] | None = None):
        """``wandb``: ``{"project", "mode", "config"}`` to also log to Weights & Biases (the same rows)."""
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            lines = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
            start = resume_step or 0
            kept = [ln for ln in lines if (_step_of(ln) is not None and _step_of(ln) < start)]
            moved = [ln for ln in lines if not (_step_of(ln) is not None and _step_of(ln) < start)]
            if moved:
                with open(self.path.with_name("metrics.superseded.jsonl"), "a", encoding="utf-8") as f:
                    f.write("".join(ln + "\n" for ln in moved))
                tmp = self.path.with_name(".metrics.jsonl.tmp")
                tmp.write_text("".join(ln + "\n" for ln in kept))
                tmp.replace(self.path)
        self._f = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # lazy: optional dependency (tensorboard)

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb is not None:
            self._wandb = _wandb_run(Path(run_dir), **wandb)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with naming(self.path):  # a full disk: "metrics.jsonl: No space left on device", not "[Errno 28]"
            self._f.write(json.dumps(row) + "\n")
            self._f.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if k != "step"}, step=step, commit=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._f.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _wandb_run(run_dir: Path, project: str, mode: str, config: dict[str, Any]):
    """One W&B run per run_dir, resumed under the same id (kept in run_dir/wandb/run_id)."""
    try:
        import wandb  # optional dependency (the wandb extra)
    except ImportError:
        raise InputError('wandb=true needs the wandb package: pip install "memorywalker[wandb]"') from None
    id_file = run_dir / "wandb" / "run_id"
    id_file.parent.mkdir(parents=True, exist_ok=True)
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
    id_file.write_text(run_id)
    return wandb.init(project=project, mode=mode, dir=str(run_dir), id=run_id, resume="allow", config=config)


def wandb_options(cfg) -> dict[str, Any] | None:
    """The ``wandb`` argument of :class:`MetricsLogger` for a recipe config (None when off)."""
    if not cfg.wandb:
        return None
    return {"project": cfg.wandb_project, "mode": cfg.wandb_mode, "config": cfg.model_dump(mode="json")}


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v
