"""Per-target losses: pure functions over tensors. Shapes: ``N`` targets, ``V`` vocabulary.

They return one value per target (no reduction): normalization is declared separately
(:func:`memorywalker.objectives.normalize.normalize`) so micro-batching and data parallelism cannot
change it. Nothing here syncs with the device (no ``.item()``).
"""

from __future__ import annotations

import torch


def nll(logprob: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood per target. ``logprob`` [N] -> [N]."""
    return -logprob  # ℓ_i = −log p(y_i | context_i)


def weighted_logprob(logprob: torch.Tensor, coefficient: torch.Tensor) -> torch.Tensor:
    """``ℓ_i = −c_i · log p_i`` per target [N]: its gradient is ``−c_i`` times that of the logprob. A
    sequence-level loss L(Σ logp) trains through it with ``c_i = −dL/d(Σ logp)`` (the DPO recipe)."""
    return -coefficient * logprob  # ℓ_i = −c_i log p_i


def behaviour_logprob(logprob: torch.Tensor, old_logprob: torch.Tensor | None,
                      rollout_logprob: torch.Tensor | None) -> torch.Tensor:
    """The logprob the importance ratio is taken against, per target [N]: the old policy's where
    recorded, else the rollout engine's, else the current one detached (ratio 1: on-policy)."""
    base = logprob.detach()
    for cand in (rollout_logprob, old_logprob):  # later entries win
        if cand is not None:
            base = torch.where(torch.isfinite(cand), cand, base)
    return base


def ppo_clip(logprob: torch.Tensor, old_logprob: torch.Tensor, advantage: torch.Tensor, *,
             clip_low: float = 0.2, clip_high: float = 0.2,
             rollout_logprob: torch.Tensor | None = None, tis_cap: float | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip policy-gradient loss per target (Schulman et al. 2017, https://arxiv.org/abs/1707.06347).

    ``logprob``, ``old_logprob``, ``advantage``, ``rollout_logprob``: [N]. Returns the loss [N] and
    per-target stats ``ratio``, ``clipped`` (1.0 where the clipped branch is active), ``tis_weight``.

    Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"): when the rollout engine's logprobs differ from the old policy's, the
    loss is multiplied by ``min(p_old / p_rollout, tis_cap)``, detached. Only where both are finite.
    """
    ratio = torch.exp(logprob - old_logprob)  # ρ = π_θ / π_old
    unclipped = ratio * advantage  # ρ·A
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantage  # clip(ρ, 1−ε_l, 1+ε_h)·A
    loss = -torch.minimum(unclipped, clipped)  # ℓ = −min(ρA, clip(ρ)A)
    tis = torch.ones_like(loss)
    if tis_cap is not None and rollout_logprob is not None:
        w = torch.exp(old_logprob - rollout_logprob).clamp(max=tis_cap)  # min(π_old / π_rollout, C)
        tis = torch.where(torch.isfinite(w), w, tis).detach()
        loss = loss * tis
    stats = {"ratio": ratio.detach(), "clipped": (clipped < unclipped).to(loss.dtype).detach(), "tis_weight": tis}
    return loss, stats


def grpo_advantages(reward: torch.Tensor, group: torch.Tensor, *, eps: float = 1e-6,
                    scale_by_std: bool = True) -> torch.Tensor:
    """Group-relative advantages (Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300).

    ``reward`` float [T], ``group`` int64 [T] (rollouts of one task share a group id) -> [T]:
    ``A_i = (r_i − mean_g r) / (std_g r + eps)`` with the unbiased std (as verl's
    ``compute_grpo_outcome_advantage``); ``scale_by_std=False`` gives ``r_i − mean_g r`` (Dr. GRPO).
    A group of one has advantage 0.
    """
    _, inv, counts = torch.unique(group, return_inverse=True, return_counts=True)
    n = counts.to(reward.dtype)
    total = torch.zeros_like(n).index_add_(0, inv, reward)
    mean = total / n  # mean_g r
    sq = torch.zeros_like(n).index_add_(0, inv, (reward - mean[inv]) ** 2)
    std = torch.sqrt(sq / (n - 1).clamp(min=1))  # unbiased: Σ(r − mean)² / (n − 1)
    adv = reward - mean[inv]
    if scale_by_std:
        adv = adv / (std[inv] + eps)
    return torch.where(counts[inv] > 1, adv, torch.zeros_like(adv))


def forward_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Forward KL(teacher ‖ student) per position over full next-token distributions, teacher detached.

    ``teacher_logits``, ``student_logits``: [J, V] -> [J] (nats), in float32.
    """
    log_t = torch.log_softmax(teacher_logits.detach().float(), dim=-1)  # log p_T (stop-gradient)
    log_s = torch.log_softmax(student_logits.float(), dim=-1)  # log p_S
    return (log_t.exp() * (log_t - log_s)).sum(-1)  # KL = Σ_v p_T(v) (log p_T(v) − log p_S(v))
