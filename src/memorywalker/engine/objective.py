"""The objectives the engine trains with, one lookup: per-target loss functions over the exact logprobs,
and where each objective's per-target inputs (advantages) come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from memorywalker.engine.config import EngineConfig
from memorywalker.errors import InputError
from memorywalker.layout.batch import Batch
from memorywalker.objectives.losses import (
    behaviour_logprob,
    grpo_advantages,
    nll,
    ppo_clip,
    weighted_logprob,
)
from memorywalker.objectives.rollout_correction import rollout_corr_metrics, rollout_correction_weight


@dataclass
class Columns:
    """Per-target inputs of an objective, on the model's device ([N] each)."""

    advantage: torch.Tensor
    rollout_logprob: torch.Tensor
    old_logprob: torch.Tensor | None
    correction: torch.Tensor | None = None  # rollout correction weight (TIS x MIS), detached

    def take(self, idx: torch.Tensor) -> Columns:
        return Columns(self.advantage[idx], self.rollout_logprob[idx],
                       None if self.old_logprob is None else self.old_logprob[idx],
                       None if self.correction is None else self.correction[idx])


def apply_rollout_correction(cols: Columns, batch: Batch, cfg: EngineConfig, *, required: bool
                             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Set ``cols.correction`` from ``cfg.rollout_is`` / ``cfg.rollout_rs`` (ρ = π_old / π_rollout, the
    trainer's recomputation of the collecting policy against the recorded rollout logprobs) and return its
    per-target stats [N] and the ``rollout_corr/*`` metrics; nothing where no correction is configured.
    Without old logprobs: an error when ``required`` (a training pass), else nothing (the pass computing
    π_old, or an evaluation)."""
    if cfg.rollout_is is None and cfg.rollout_rs is None:
        return {}, {}
    if cfg.tis_cap is not None and cfg.rollout_is is not None:
        raise InputError("tis_cap and rollout_is are both truncated importance sampling: set one")
    if cols.old_logprob is None:
        if required:
            raise InputError("rollout_is / rollout_rs need old logprobs (batch.old_logprob or old_logprobs=): "
                             "the trainer's logprobs of the collecting policy (the RL recipe recomputes them "
                             "once per step)")
        return {}, {}
    tg = batch.targets
    device = cols.old_logprob.device
    call, seq = torch.from_numpy(tg.call).to(device), torch.from_numpy(tg.trajectory).to(device)
    cols.correction, stats = rollout_correction_weight(
        cols.old_logprob, cols.rollout_logprob, call, seq, rollout_is=cfg.rollout_is,
        rollout_is_threshold=cfg.rollout_is_threshold, rollout_rs=cfg.rollout_rs,
        rollout_rs_threshold=tuple(cfg.rollout_rs_threshold))
    return stats, rollout_corr_metrics(cols.old_logprob, cols.rollout_logprob, seq, threshold=cfg.rollout_is_threshold)


def _nll(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    return nll(logprob), {}


def _ppo(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    old = behaviour_logprob(logprob, cols.old_logprob, cols.rollout_logprob)
    loss, stats = ppo_clip(logprob, old, cols.advantage, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                           rollout_logprob=cols.rollout_logprob, tis_cap=cfg.tis_cap)
    if cols.correction is not None:
        loss = loss * cols.correction  # ℓ_i · w_i, w = min(ρ, C) · 1[lo ≤ ρ ≤ hi] (rollout correction)
    return loss, stats


def _weighted(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    return weighted_logprob(logprob, cols.advantage), {}


def _batch_advantage(batch: Batch, cfg: EngineConfig) -> np.ndarray:
    return batch.targets.advantage


def _grpo_advantage(batch: Batch, cfg: EngineConfig) -> np.ndarray:
    if np.isnan(batch.reward).any():
        raise InputError("grpo needs a reward on every trajectory (Trajectory.reward)")
    adv = grpo_advantages(torch.from_numpy(batch.reward), torch.from_numpy(batch.group),
                          scale_by_std=cfg.grpo_scale_by_std)
    return adv.numpy()[batch.targets.trajectory]


@dataclass(frozen=True)
class Objective:
    per_target: Callable  # (logprob [M], Columns, EngineConfig) -> (loss [M], stats {name: [M]})
    advantage: Callable[[Batch, EngineConfig], np.ndarray] = _batch_advantage
    # Each target's loss is its advantage times a finite factor: with every advantage 0 (GRPO groups whose
    # rewards are all equal) the loss and its gradient are exactly 0, and the backward can be skipped.
    scaled_by_advantage: bool = False


OBJECTIVES: dict[str, Objective] = {
    "nll": Objective(_nll),  # SFT: masked negative log-likelihood
    "ppo": Objective(_ppo, scaled_by_advantage=True),  # PPO-clip with the advantages on the targets table
    # PPO-clip with group-relative advantages from rewards
    "grpo": Objective(_ppo, _grpo_advantage, scaled_by_advantage=True),
    # −c_i·log p_i with c = the targets' advantage column: sequence-level losses (DPO) set c = −dL/dΣlogp
    "weighted": Objective(_weighted, scaled_by_advantage=True),
}


def _lookup(table: dict, name: str, what: str):
    try:
        return table[name]
    except KeyError:
        raise InputError(f"unknown {what} {name!r}; valid: {sorted(table)}") from None


def get_objective(name: str) -> Objective:
    return _lookup(OBJECTIVES, name, "objective")
