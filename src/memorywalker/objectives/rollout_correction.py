"""Rollout correction: importance weights and masks for the rollout engine / trainer mismatch.

The rollout engine (vLLM, SGLang, our HF sampler in bf16...) computes π_rollout; the trainer's
recomputation of the same weights, π_old, differs by numerics, and by conditioning when the trainer does
not reproduce the contexts each call saw. PPO's ratio π_θ / π_old is unbiased only for samples of π_old,
so the loss of target ``i`` is re-weighted by the importance ratio ρ = π_old / π_rollout of its token or
of its whole sequence (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training", https://fengyao.notion.site/off-policy-rl; Liu, Li et al. 2025, "When speed kills stability",
https://richardli.xyz/rl-collapse; verl ``trainer/ppo/rollout_corr_helper.py``):

* **TIS** (truncated importance sampling, ``rollout_is``): weight ``min(ρ, C)``;
* **MIS** (masked importance sampling, ``rollout_rs``, verl's rejection sampling): weight 0 where ρ
  leaves ``[lo, hi]``, else 1 — a sample far off-policy is dropped rather than clipped.

ρ is taken at one of :data:`LEVELS`: ``token`` (each target its own), ``call`` (∏ over one response),
``sequence`` (∏ over every target of the episode: one sample of the policy, as verl's multi-turn
response mask) or ``geometric`` (the sequence's per-token geometric mean, exp(mean log ρ): no length
trap). Weights are detached: they change the measure, not the objective.

Why the trainer's *exact* tree logprobs matter here: π_old must be the trainer's probability of each
token *in the context the rollout engine sampled it in*. A trainer that conditions on another context
(``dfs`` after an eviction sees text that was evicted; ``rightmost`` sees summaries written later)
puts its conditioning error into log ρ — in the README's demo, dfs's mean |Δ logp| is 0.63 nats per
token on calls after 2+ branches, against ~6e-7 for the exact methods — so the correction would mask or
re-weight exactly the post-eviction tokens, for a mismatch the engine never had.

Targets whose ``old`` or ``rollout`` logprob is not finite (not recorded, lost by the method) count
as log ρ = 0 and are left out of the geometric mean's count. ``log_ratio`` is clamped to ±:data:`SAFETY_BOUND` before any exp (as verl).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from memorywalker.errors import InputError

SAFETY_BOUND = 20.0  # |log ρ| cap before exponentiation: exp(20) ≈ 4.9e8


def _token(log_ratio: torch.Tensor, valid: torch.Tensor, call: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
    return log_ratio  # log ρ_i


def _group_sum(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Σ of ``values`` [N] over each target's ``group`` [N] (int64), broadcast back to [N]."""
    uniq, inv = torch.unique(group, return_inverse=True)
    total = torch.zeros(len(uniq), dtype=values.dtype, device=values.device)
    return total.index_add(0, inv, values)[inv]


def _call(log_ratio: torch.Tensor, valid: torch.Tensor, call: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
    return _group_sum(log_ratio, call)  # log ∏_{i ∈ call} ρ_i


def _sequence(log_ratio: torch.Tensor, valid: torch.Tensor, call: torch.Tensor, sequence: torch.Tensor
              ) -> torch.Tensor:
    return _group_sum(log_ratio, sequence)  # log ∏_{i ∈ episode} ρ_i


def _geometric(log_ratio: torch.Tensor, valid: torch.Tensor, call: torch.Tensor, sequence: torch.Tensor
               ) -> torch.Tensor:
    n = _group_sum(valid.to(log_ratio.dtype), sequence).clamp(min=1)  # the episode's compared tokens
    return _group_sum(log_ratio, sequence) / n  # (1/|s|) Σ_{i ∈ s} log ρ_i


# level -> (log ρ per token [N] (0 where not compared), compared [N] bool, call [N], sequence [N])
#       -> the level's log ρ of each target [N]
LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": _token,
    "call": _call,
    "sequence": _sequence,
    "geometric": _geometric,
}


def level_log_ratio(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, call: torch.Tensor,
                    sequence: torch.Tensor, level: str) -> torch.Tensor:
    """log ρ of each target at ``level`` (one of :data:`LEVELS`), clamped to ±SAFETY_BOUND. [N] each.

    >>> old = torch.tensor([-1.0, -2.0, -0.5]); roll = torch.tensor([-1.5, -1.0, float("nan")])
    >>> level_log_ratio(old, roll, torch.tensor([0, 0, 1]), torch.tensor([0, 0, 0]), "sequence").tolist()
    [-0.5, -0.5, -0.5]
    """
    try:
        fn = LEVELS[level]
    except KeyError:
        raise InputError(f"unknown rollout correction level {level!r}; valid: {sorted(LEVELS)}") from None
    log_ratio = old_logprob.float() - rollout_logprob.float()  # log ρ_i = log π_old − log π_rollout
    valid = torch.isfinite(log_ratio)
    log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    return fn(log_ratio, valid, call, sequence).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def truncated_is_weight(log_ratio: torch.Tensor, threshold: float) -> torch.Tensor:
    """TIS: ``min(ρ, C)`` per target from the level's log ρ [N], detached.

    >>> truncated_is_weight(torch.tensor([math.log(0.5), 0.0, math.log(3.0)]), 2.0).tolist()
    [0.5, 1.0, 2.0]
    """
    return torch.exp(log_ratio.detach()).clamp(max=threshold)  # w = min(ρ, C)


def masked_is_weight(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """MIS: 1 where ``low ≤ ρ ≤ high``, else 0, per target from the level's log ρ [N].

    >>> masked_is_weight(torch.tensor([math.log(0.4), 0.0, math.log(2.5)]), 0.5, 2.0).tolist()
    [0.0, 1.0, 0.0]
    """
    keep = (log_ratio >= math.log(low)) & (log_ratio <= math.log(high))  # ρ ∈ [lo, hi], compared in log space
    return keep.to(log_ratio.dtype).detach()


def rollout_correction_weight(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, call: torch.Tensor,
                              sequence: torch.Tensor, *, rollout_is: str | None, rollout_is_threshold: float,
                              rollout_rs: str | None, rollout_rs_threshold: tuple[float, float]
                              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The weight [N] each target's PPO loss is multiplied by: TIS at level ``rollout_is`` (None: 1)
    times MIS at level ``rollout_rs`` (None: 1); and per-target stats ``rollout_is`` (the TIS weight) and
    ``rollout_rs_masked`` (1 where MIS dropped the target)."""
    ones = torch.ones_like(old_logprob, dtype=torch.float32)
    weight, stats = ones, {}
    if rollout_is is not None:
        w = truncated_is_weight(level_log_ratio(old_logprob, rollout_logprob, call, sequence, rollout_is),
                                rollout_is_threshold)
        weight, stats["rollout_is"] = weight * w, w
    if rollout_rs is not None:
        keep = masked_is_weight(level_log_ratio(old_logprob, rollout_logprob, call, sequence, rollout_rs),
                                *rollout_rs_threshold)
        weight, stats["rollout_rs_masked"] = weight * keep, 1.0 - keep
    return weight, stats


def rollout_corr_metrics(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, sequence: torch.Tensor,
                         *, threshold: float = 2.0) -> dict[str, torch.Tensor]:
    """Off-policy diagnostics under verl's names (prefix ``rollout_corr/``) over the targets where both
    logprobs are finite. ``sequence`` [N] groups targets into sampled sequences (episodes).

    * ``kl`` = mean(log π_rollout − log π_old) (k1 estimate of KL(π_rollout ‖ π_old)); ``k3_kl`` =
      mean(ρ − log ρ − 1); ``chi2_token`` = mean(ρ²) − 1; ``chi2_seq`` = mean over sequences of
      (∏ρ)² − 1;
    * ``training_ppl`` / ``rollout_ppl``: mean over sequences of exp(−mean logprob); ``log_ppl_abs_diff``:
      mean over sequences of |mean log π_rollout − mean log π_old|;
    * ``rollout_is_mean`` / ``_max`` / ``_min`` of the token ratio ρ; ``rollout_is_ratio_fraction_high``
      (ρ > C) / ``_low`` (ρ < 1/C); ``rollout_is_eff_sample_size`` = 1 / mean((w / mean w)²) of the
      weights clamped to [1/C, C];
    * ``rollout_corr/targets`` and ``rollout_corr/sequences``: what the means are over.

    Two tokens of one sequence, log ρ = (ln 2, 0): ρ = (2, 1): ``rollout_is_mean`` 1.5, ``chi2_token``
    (4 + 1)/2 − 1 = 1.5, ``chi2_seq`` 2² − 1 = 3, ``kl`` = −ln 2 / 2.

    >>> m = rollout_corr_metrics(torch.tensor([math.log(2.0), 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0, 0]))
    >>> [round(float(m[f"rollout_corr/{k}"]), 4) for k in ("rollout_is_mean", "chi2_token", "chi2_seq", "kl")]
    [1.5, 1.5, 3.0, -0.3466]
    """
    ok = torch.isfinite(old_logprob) & torch.isfinite(rollout_logprob)
    old, roll, seq = old_logprob[ok].float(), rollout_logprob[ok].float(), sequence[ok]
    if not len(old):
        return {}
    log_ratio = (old - roll).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # log ρ
    rho = torch.exp(log_ratio)
    uniq, inv = torch.unique(seq, return_inverse=True)
    s = len(uniq)
    count = torch.zeros(s, device=old.device).index_add(0, inv, torch.ones_like(old))

    def seq_mean(x: torch.Tensor) -> torch.Tensor:  # [N] -> [S] mean over each sequence's targets
        return torch.zeros(s, dtype=x.dtype, device=x.device).index_add(0, inv, x) / count

    seq_log_ratio = (seq_mean(log_ratio) * count).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # log ∏ρ per sequence
    clamped = rho.clamp(1.0 / threshold, threshold)
    normed = clamped / clamped.mean()
    m = {
        "kl": (roll - old).mean(),  # k1: E_rollout[log π_rollout − log π_old]
        "k3_kl": (rho - log_ratio - 1).mean(),  # E[ρ − log ρ − 1]
        "chi2_token": (rho**2).mean() - 1,  # E[ρ²] − 1
        "chi2_seq": torch.exp(2 * seq_log_ratio).mean() - 1,  # E_seq[(∏ρ)²] − 1
        "training_ppl": torch.exp(-seq_mean(old)).mean(),
        "rollout_ppl": torch.exp(-seq_mean(roll)).mean(),
        "log_ppl_abs_diff": (seq_mean(roll) - seq_mean(old)).abs().mean(),
        "rollout_is_mean": rho.mean(),
        "rollout_is_max": rho.max(),
        "rollout_is_min": rho.min(),
        "rollout_is_ratio_fraction_high": (rho > threshold).float().mean(),
        "rollout_is_ratio_fraction_low": (rho < 1.0 / threshold).float().mean(),
        "rollout_is_eff_sample_size": 1.0 / (normed**2).mean(),  # 1 / E[(w / E w)²]
        "targets": torch.tensor(float(len(old))),
        "sequences": torch.tensor(float(s)),
    }
    return {f"rollout_corr/{k}": v for k, v in m.items()}
