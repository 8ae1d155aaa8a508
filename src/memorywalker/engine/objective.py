"""The objectives the engine trains with, one lookup: per-target loss functions over the exact logprobs,
and where each objective's per-target inputs (advantages) come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from memorywalker.engine.config import EngineConfig
from memorywalker.layout.batch import Batch
from memorywalker.objectives.losses import (
    behaviour_logprob,
    grpo_advantages,
    nll,
    ppo_clip,
    weighted_logprob,
)


@dataclass
class Columns:
    """Per-target inputs of an objective, on the model's device ([N] each)."""

    advantage: torch.Tensor
    rollout_logprob: torch.Tensor
    old_logprob: torch.Tensor | None

    def take(self, idx: torch.Tensor) -> Columns:
        return Columns(self.advantage[idx], self.rollout_logprob[idx],
                       None if self.old_logprob is None else self.old_logprob[idx])


def _nll(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    return nll(logprob), {}


def _ppo(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    old = behaviour_logprob(logprob, cols.old_logprob, cols.rollout_logprob)
    return ppo_clip(logprob, old, cols.advantage, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                    rollout_logprob=cols.rollout_logprob, tis_cap=cfg.tis_cap)


def _weighted(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    return weighted_logprob(logprob, cols.advantage), {}


def _batch_advantage(batch: Batch, cfg: EngineConfig) -> np.ndarray:
    return batch.targets.advantage


def _grpo_advantage(batch: Batch, cfg: EngineConfig) -> np.ndarray:
    if np.isnan(batch.reward).any():
        raise ValueError("grpo needs a reward on every trajectory (Trajectory.reward)")
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
        raise ValueError(f"unknown {what} {name!r}; valid: {sorted(table)}") from None


def get_objective(name: str) -> Objective:
    return _lookup(OBJECTIVES, name, "objective")
