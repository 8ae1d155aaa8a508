"""Objectives as pure tensor functions: per-target losses, declared normalization, gap metrics, rollout
correction (TIS / masked IS weights of the rollout engine mismatch)."""

from memorywalker.objectives.losses import behaviour_logprob, forward_kl, grpo_advantages, nll, ppo_clip
from memorywalker.objectives.metrics import (
    chi2_token,
    gap_metrics,
    k3_kl,
    log_ppl_abs_diff,
    logprob_abs_diff,
    mean_total_variation,
)
from memorywalker.objectives.normalize import NORMALIZATIONS, aggregate, normalize, reduce_denominator
from memorywalker.objectives.rollout_correction import (
    LEVELS,
    level_log_ratio,
    masked_is_weight,
    rollout_corr_metrics,
    rollout_correction_weight,
    truncated_is_weight,
)

__all__ = [
    "LEVELS",
    "NORMALIZATIONS",
    "aggregate",
    "behaviour_logprob",
    "chi2_token",
    "forward_kl",
    "gap_metrics",
    "grpo_advantages",
    "k3_kl",
    "level_log_ratio",
    "log_ppl_abs_diff",
    "logprob_abs_diff",
    "masked_is_weight",
    "mean_total_variation",
    "nll",
    "normalize",
    "ppo_clip",
    "reduce_denominator",
    "rollout_corr_metrics",
    "rollout_correction_weight",
    "truncated_is_weight",
]
