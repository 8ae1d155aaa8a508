"""Train/rollout gap metrics (DESIGN.md, "Metrics"), per target token. Names follow the RL frameworks.

``logp_train`` is what the trainer computes for a target, ``logp_rollout`` what the rollout engine
recorded when it sampled it; ``ρ = p_train / p_rollout``. Targets without a recorded logprob (NaN)
are skipped. Every function returns a scalar tensor (NaN when nothing is comparable); callers sync.
"""

from __future__ import annotations

import torch


def _valid(logp_train: torch.Tensor, logp_rollout: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(logp_train) & torch.isfinite(logp_rollout)


def _mean(x: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    return torch.where(ok, x, torch.zeros_like(x)).sum() / ok.sum()  # NaN (0/0) when nothing is valid


def logprob_abs_diff(logp_train: torch.Tensor, logp_rollout: torch.Tensor) -> torch.Tensor:
    """mean |log p_train − log p_rollout| over targets [N] -> scalar."""
    ok = _valid(logp_train, logp_rollout)
    return _mean((logp_train - logp_rollout).abs(), ok)


def k3_kl(logp_train: torch.Tensor, logp_rollout: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(rollout ‖ train) from rollout samples: E[ρ − log ρ − 1] (Schulman's k3). [N] -> scalar."""
    ok = _valid(logp_train, logp_rollout)
    log_rho = torch.where(ok, logp_train - logp_rollout, torch.zeros_like(logp_train))  # log ρ
    return _mean(torch.exp(log_rho) - log_rho - 1, ok)  # ρ − log ρ − 1 ≥ 0


def chi2_token(logp_train: torch.Tensor, logp_rollout: torch.Tensor) -> torch.Tensor:
    """Per-token chi-square: E[ρ²] − 1. [N] -> scalar."""
    ok = _valid(logp_train, logp_rollout)
    log_rho = torch.where(ok, logp_train - logp_rollout, torch.zeros_like(logp_train))
    return _mean(torch.exp(2 * log_rho), ok) - 1  # E[ρ²] − 1


def log_ppl_abs_diff(logp_train: torch.Tensor, logp_rollout: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
    """mean over sequences of |log PPL_train − log PPL_rollout|, log PPL = −mean token logprob.

    ``sequence`` int64 [N] (e.g. the call of each target) -> scalar.
    """
    ok = _valid(logp_train, logp_rollout)
    uniq, inv = torch.unique(sequence, return_inverse=True)
    z = torch.zeros(len(uniq), dtype=logp_train.dtype, device=logp_train.device)
    diff = torch.where(ok, logp_train - logp_rollout, torch.zeros_like(logp_train))
    n = z.clone().index_add_(0, inv, ok.to(z.dtype))
    per_seq = z.clone().index_add_(0, inv, diff) / n.clamp(min=1)  # log PPL_rollout − log PPL_train
    has = n > 0
    return _mean(per_seq.abs(), has)


def mean_total_variation(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """Logit drift: mean over positions of TV(p_a, p_b) = ½ Σ_v |p_a(v) − p_b(v)|. [J, V] x2 -> scalar."""
    p = torch.softmax(logits_a.float(), -1)
    q = torch.softmax(logits_b.float(), -1)
    return 0.5 * (p - q).abs().sum(-1).mean()


def gap_metrics(logp_train: torch.Tensor, logp_rollout: torch.Tensor, sequence: torch.Tensor) -> dict[str, torch.Tensor]:
    """All per-token gap metrics at once, as scalar tensors."""
    return {
        "logprob_abs_diff": logprob_abs_diff(logp_train, logp_rollout),
        "k3_kl": k3_kl(logp_train, logp_rollout),
        "chi2_token": chi2_token(logp_train, logp_rollout),
        "log_ppl_abs_diff": log_ppl_abs_diff(logp_train, logp_rollout, sequence),
    }
