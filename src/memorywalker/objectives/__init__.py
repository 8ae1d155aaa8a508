"""Objectives as pure tensor functions: per-target losses, declared normalization, gap metrics."""

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

__all__ = [
    "NORMALIZATIONS",
    "aggregate",
    "behaviour_logprob",
    "chi2_token",
    "forward_kl",
    "gap_metrics",
    "grpo_advantages",
    "k3_kl",
    "log_ppl_abs_diff",
    "logprob_abs_diff",
    "mean_total_variation",
    "nll",
    "normalize",
    "ppo_clip",
    "reduce_denominator",
]
