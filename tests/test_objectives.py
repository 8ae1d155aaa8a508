"""Objectives against hand-derived numbers (the arithmetic is in each docstring)."""

from __future__ import annotations

import math

import pytest
import torch

from memorywalker.objectives import (
    aggregate,
    behaviour_logprob,
    chi2_token,
    forward_kl,
    gap_metrics,
    grpo_advantages,
    k3_kl,
    log_ppl_abs_diff,
    logprob_abs_diff,
    mean_total_variation,
    nll,
    normalize,
    ppo_clip,
    reduce_denominator,
)

LN2 = math.log(2.0)


def test_ppo_clip_hand_derived():
    """ε = 0.2, ratios ρ = exp(logp − old):

    ρ=1.5, A=+2: min(3.0, 1.2·2=2.4) = 2.4 → ℓ = −2.4, clipped, ∂ℓ/∂logp = 0
    ρ=0.5, A=+2: min(1.0, 0.8·2=1.6) = 1.0 → ℓ = −1.0, ∂ℓ/∂logp = −ρA = −1.0
    ρ=0.5, A=−1: min(−0.5, 0.8·−1=−0.8) = −0.8 → ℓ = +0.8, clipped, ∂ℓ/∂logp = 0
    ρ=1.5, A=−1: min(−1.5, 1.2·−1=−1.2) = −1.5 → ℓ = +1.5, ∂ℓ/∂logp = −ρA = +1.5
    """
    old = torch.tensor([-1.0, -1.0, -2.0, -2.0])
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5])
    logp = (old + ratio.log()).requires_grad_()
    adv = torch.tensor([2.0, 2.0, -1.0, -1.0])
    loss, stats = ppo_clip(logp, old, adv)
    torch.testing.assert_close(loss, torch.tensor([-2.4, -1.0, 0.8, 1.5]))
    torch.testing.assert_close(stats["clipped"], torch.tensor([1.0, 0.0, 1.0, 0.0]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -1.0, 0.0, 1.5]))


def test_ppo_clip_higher_and_truncated_importance_sampling():
    """clip_high = 0.28: ρ=1.5, A=2 → min(3.0, 1.28·2=2.56) → ℓ = −2.56.
    TIS cap 2: p_old/p_rollout = 3 → weight min(3, 2) = 2 → ℓ = 2·(−2.56) = −5.12; a target with no
    rollout logprob (NaN) keeps weight 1; p_old/p_rollout = 0.5 → weight 0.5."""
    old = torch.tensor([-1.0, -1.0, -1.0])
    logp = old + math.log(1.5)
    adv = torch.tensor([2.0, 2.0, 2.0])
    rollout = torch.tensor([-1.0 - math.log(3.0), float("nan"), -1.0 + LN2])
    loss, stats = ppo_clip(logp, old, adv, clip_high=0.28, rollout_logprob=rollout, tis_cap=2.0)
    torch.testing.assert_close(loss, torch.tensor([-5.12, -2.56, -1.28]))
    torch.testing.assert_close(stats["tis_weight"], torch.tensor([2.0, 1.0, 0.5]))


def test_behaviour_logprob_prefers_old_then_rollout_then_current():
    cur = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    old = torch.tensor([-0.5, float("nan"), float("nan")])
    rollout = torch.tensor([-0.7, -0.8, float("nan")])
    base = behaviour_logprob(cur, old, rollout)
    torch.testing.assert_close(base, torch.tensor([-0.5, -0.8, -3.0]))
    assert not base.requires_grad  # the ratio's denominator is a constant


def test_grpo_advantages_hand_derived():
    """Group 0 rewards (1, 0, 0): mean 1/3, unbiased std = sqrt(((2/3)² + 2(1/3)²)/2) = sqrt(1/3);
    A = (2/3)/sqrt(1/3) = 1.1547, (−1/3)/sqrt(1/3) = −0.57735. Group 1 has one rollout: A = 0.
    Without the std (Dr. GRPO): 2/3, −1/3."""
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0])
    group = torch.tensor([0, 0, 0, 1])
    s = math.sqrt(1 / 3)
    torch.testing.assert_close(grpo_advantages(reward, group, eps=0.0),
                               torch.tensor([(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s, 0.0]))
    torch.testing.assert_close(grpo_advantages(reward, group, scale_by_std=False),
                               torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0]))
    # equal rewards: zero advantage, not NaN
    torch.testing.assert_close(grpo_advantages(torch.ones(3), torch.zeros(3, dtype=torch.long)), torch.zeros(3))


def test_forward_kl_hand_derived():
    """Teacher logits (0, ln 3) → p = (1/4, 3/4); student (0, 0) → q = (1/2, 1/2).
    KL(p‖q) = 1/4·ln(1/2) + 3/4·ln(3/2) = 0.130812; ∂KL/∂student logits = q − p = (1/4, −1/4);
    the teacher gets no gradient."""
    teacher = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    student = torch.zeros(1, 2, requires_grad=True)
    kl = forward_kl(teacher, student)
    torch.testing.assert_close(kl, torch.tensor([0.25 * math.log(0.5) + 0.75 * math.log(1.5)]))
    kl.sum().backward()
    torch.testing.assert_close(student.grad, torch.tensor([[0.25, -0.25]]))
    assert teacher.grad is None
    torch.testing.assert_close(forward_kl(student, student), torch.zeros(1))
    torch.testing.assert_close(mean_total_variation(teacher, student), torch.tensor(0.25))  # ½(1/4 + 1/4)


def test_nll():
    torch.testing.assert_close(nll(torch.tensor([-0.5, -2.0])), torch.tensor([0.5, 2.0]))


CALL = torch.tensor([0, 0, 1, 2, 2])
TRAJ = torch.tensor([0, 0, 0, 1, 1])
W = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
LOSS = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])


@pytest.mark.parametrize(("mode", "expected"), [
    ("token", (1 + 2 + 3 + 4) / 4),  # Σ wℓ / Σ w
    ("call", ((1 + 2) / 2 + 3 + 4) / 3),  # calls {0,1}, {2}, {3,(4 has weight 0)}
    ("trajectory", ((1 + 2 + 3) / 3 + 4) / 2),  # mean of per-trajectory means
    ("sequence", (1 + 2 + 3 + 4) / 3),  # sums per sequence, averaged over the 3 sequences
])
def test_normalization_hand_derived(mode, expected):
    coef, den = normalize(W, CALL, TRAJ, mode)
    assert aggregate(LOSS, coef, den).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token", "trajectory"])
def test_normalization_is_invariant_to_micro_batches(mode):
    """Split the 5 targets into micro-batches {traj 0} and {traj 1}: with the summed denominator the
    micro-batch losses add up to the one-pass loss (per-trajectory coefficients are local)."""
    coef, den = normalize(W, CALL, TRAJ, mode)
    whole = aggregate(LOSS, coef, den)
    parts = [normalize(W[m], CALL[m], TRAJ[m], mode) for m in (TRAJ == 0, TRAJ == 1)]
    total = reduce_denominator([d for _, d in parts])
    split = sum(aggregate(LOSS[m], c, total) for (c, _), m in zip(parts, (TRAJ == 0, TRAJ == 1), strict=True))
    torch.testing.assert_close(split, whole)
    wrong = sum(aggregate(LOSS[m], c, d) for (c, d), m in zip(parts, (TRAJ == 0, TRAJ == 1), strict=True)) / 2
    if mode == "token":  # per-micro-batch means, averaged: (2 + 4)/2 = 3 ≠ 2.5
        assert wrong.item() == pytest.approx(3.0)


def test_gap_metrics_hand_derived():
    """ρ = p_train/p_rollout = 2 and 1/2 (a NaN rollout is skipped):
    |Δlogp| = ln 2 both; k3 = mean(ρ − ln ρ − 1) = ((2 − ln2 − 1) + (½ + ln2 − 1))/2 = 0.25;
    χ² = mean(ρ²) − 1 = (4 + ¼)/2 − 1 = 1.125;
    log-PPL per sequence: seq 0 has Δ = (+ln2, −ln2) → 0, seq 1 has ln2 → mean |·| = ln2 / 2."""
    train = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.5), -1.0])
    rollout = torch.tensor([math.log(0.25), math.log(0.5), math.log(0.25), float("nan")])
    seq = torch.tensor([0, 0, 1, 1])
    sub_t, sub_r = train[:2], rollout[:2]
    assert logprob_abs_diff(train, rollout).item() == pytest.approx(LN2)
    assert k3_kl(sub_t, sub_r).item() == pytest.approx(0.25)
    assert chi2_token(sub_t, sub_r).item() == pytest.approx(1.125)
    assert log_ppl_abs_diff(train, rollout, seq).item() == pytest.approx(LN2 / 2)
    m = gap_metrics(train, rollout, seq)
    assert set(m) == {"logprob_abs_diff", "k3_kl", "chi2_token", "log_ppl_abs_diff"}
    assert torch.isnan(k3_kl(train[3:], rollout[3:]))  # nothing comparable
