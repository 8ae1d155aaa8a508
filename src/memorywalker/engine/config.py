"""What the engine runs: the method, the objective and how they are computed (one typed config)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EngineConfig:
    method: str = "radix"  # a name in memorywalker.engine.methods.METHODS
    objective: str = "nll"  # one of OBJECTIVES
    normalization: str = "token"  # token | call | trajectory | sequence
    attention: str | None = None  # mask schedule: sdpa | eager | flex; None = the model's current one
    # Tokens per forward: the packed buffer size of the masked schedule, the chunk (and batch) size of
    # the radix schedule (a longer node runs in chunks of this many tokens against its cached prefix).
    max_tokens: int = 8192
    clip_low: float = 0.2  # PPO ε for ratios below 1
    clip_high: float = 0.2  # PPO ε for ratios above 1 (DAPO's clip-higher uses 0.28)
    tis_cap: float | None = None  # truncated importance sampling cap C (e.g. 2.0); None = off
    # Rollout correction (objectives/rollout_correction.py, verl's names), ρ = π_old / π_rollout at a level
    # of rollout_correction.LEVELS (token | call | sequence | geometric); needs the old logprobs.
    rollout_is: str | None = None  # TIS: the loss is weighted by min(ρ, rollout_is_threshold); None = off
    rollout_is_threshold: float = 2.0
    rollout_rs: str | None = None  # MIS: weight 0 where ρ leaves [lo, hi] = rollout_rs_threshold; None = off
    rollout_rs_threshold: tuple[float, float] = (0.5, 2.0)
    grpo_scale_by_std: bool = True  # False = Dr. GRPO (no division by the group std)
    sdcc_lambda: float = 1.0  # weight λ of the KL term
    sdcc_students: str = "junctions"  # junctions | all (one student per selected call)
    # A student call's main loss on its compressed S_t (as exact methods train it) instead of the full view
    sdcc_compressed_main: bool = False
    dp_size: int = 1  # data-parallel ranks whose gradients are averaged (DDP/FSDP); scales the loss
    # Logprobs (and SDCC's KL) are of logits / temperature: the sampling temperature of the rollouts, whose
    # recorded logprobs are of that distribution, so the PPO ratio is against the policy that sampled.
    temperature: float = 1.0
    # Radix schedule: recompute each forward's activations in the backward, keeping only the cached
    # keys/values (long chains in memory ~ U x K/V bytes per token + one forward's activations).
    checkpoint_chunks: bool = False


@dataclass
class Denominators:
    """What one optimizer step divides by, summed over its micro-batches and data-parallel ranks."""

    loss: torch.Tensor  # scalar: the normalization denominator D of the main loss
    kl: torch.Tensor  # scalar: number of SDCC students (the KL term is a mean over them)
