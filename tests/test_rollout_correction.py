"""Rollout correction (objectives/rollout_correction.py): sequence-level TIS and masked importance
sampling against numbers worked out by hand, the engine's loss weighted by them, and the RL recipe
wiring (the trainer's recomputation of the collecting policy against shifted rollout records)."""

from __future__ import annotations

import math

import pytest
import torch

from memorywalker.objectives.rollout_correction import (
    level_log_ratio,
    masked_is_weight,
    rollout_corr_metrics,
    rollout_correction_weight,
    truncated_is_weight,
)

# Five targets: two episodes (sequence 0: targets 0-2 in calls 0, 0, 1; sequence 1: targets 3-4 in call 2).
OLD = torch.tensor([-1.0, -0.5, -2.0, -0.2, -3.0])
ROLLOUT = torch.tensor([-1.2, -0.5, -1.9, -0.2, -2.0])
CALL = torch.tensor([0, 0, 1, 2, 2])
SEQ = torch.tensor([0, 0, 0, 1, 1])


def test_log_ratio_at_each_level_by_hand():
    """log ρ_i = old − rollout = (0.2, 0, −0.1, 0, −1.0).
    call: call 0 → 0.2 + 0 = 0.2, call 1 → −0.1, call 2 → 0 − 1 = −1.0;
    sequence: episode 0 → 0.2 + 0 − 0.1 = 0.1, episode 1 → −1.0;
    geometric: episode 0 → 0.1 / 3 = 0.0333, episode 1 → −1.0 / 2 = −0.5."""
    expect = {"token": [0.2, 0.0, -0.1, 0.0, -1.0], "call": [0.2, 0.2, -0.1, -1.0, -1.0],
              "sequence": [0.1, 0.1, 0.1, -1.0, -1.0], "geometric": [0.1 / 3] * 3 + [-0.5] * 2}
    for level, want in expect.items():
        got = level_log_ratio(OLD, ROLLOUT, CALL, SEQ, level)
        assert torch.allclose(got, torch.tensor(want), atol=1e-6), level
    with pytest.raises(ValueError, match="valid: \\['call', 'geometric', 'sequence', 'token'\\]"):
        level_log_ratio(OLD, ROLLOUT, CALL, SEQ, "seq")


def test_sequence_tis_and_mis_by_hand():
    """Sequence-level TIS with C = 1.05: episode 0 ρ = e^0.1 = 1.1052 → min(1.1052, 1.05) = 1.05; episode 1
    ρ = e^−1 = 0.3679 (not capped from below). Sequence MIS with [0.5, 2]: episode 1 (0.3679 < 0.5) is
    dropped whole, episode 0 kept. Token MIS with [0.85, 1.2]: token 4 (ρ = 0.3679) dropped, token 0
    (e^0.2 = 1.2214 > 1.2) dropped, the others (1, e^−0.1 = 0.9048, 1) kept. Combined TIS·MIS at the
    sequence level: (1.05, 1.05, 1.05, 0, 0)."""
    w = truncated_is_weight(level_log_ratio(OLD, ROLLOUT, CALL, SEQ, "sequence"), 1.05)
    assert torch.allclose(w, torch.tensor([1.05, 1.05, 1.05, math.exp(-1), math.exp(-1)]), atol=1e-6)
    keep = masked_is_weight(level_log_ratio(OLD, ROLLOUT, CALL, SEQ, "sequence"), 0.5, 2.0)
    assert keep.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    keep = masked_is_weight(level_log_ratio(OLD, ROLLOUT, CALL, SEQ, "token"), 0.85, 1.2)
    assert keep.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    weight, stats = rollout_correction_weight(OLD, ROLLOUT, CALL, SEQ, rollout_is="sequence", rollout_is_threshold=1.05,
                                              rollout_rs="sequence", rollout_rs_threshold=(0.5, 2.0))
    assert torch.allclose(weight, torch.tensor([1.05, 1.05, 1.05, 0.0, 0.0]), atol=1e-6)
    assert stats["rollout_rs_masked"].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_unrecorded_logprobs_count_as_ratio_one():
    """A target without a rollout logprob (NaN) contributes log ρ = 0: episode 0's sequence log ρ is
    0.2 + 0 = 0.2 without its third token's −0.1, and its geometric mean is over the 2 compared tokens:
    0.2 / 2 = 0.1."""
    roll = ROLLOUT.clone()
    roll[2] = float("nan")
    assert torch.allclose(level_log_ratio(OLD, roll, CALL, SEQ, "sequence")[:3], torch.tensor([0.2] * 3), atol=1e-6)
    assert torch.allclose(level_log_ratio(OLD, roll, CALL, SEQ, "geometric")[:3], torch.tensor([0.1] * 3), atol=1e-6)


def test_rollout_corr_metrics_by_hand():
    """Token ρ = (e^0.2, 1, e^−0.1, 1, e^−1) = (1.2214, 1, 0.9048, 1, 0.3679):
    rollout_is_mean = 4.4941 / 5 = 0.8988; max 1.2214; min 0.3679; with C = 2 fraction_low (ρ < 0.5) = 1/5.
    kl = mean(rollout − old) = −(0.2 + 0 − 0.1 + 0 − 1.0) / 5 = 0.18. chi2_token = mean(ρ²) − 1 =
    (1.4918 + 1 + 0.8187 + 1 + 0.1353) / 5 − 1 = −0.1109. chi2_seq = ((e^0.1)² + (e^−1)²) / 2 − 1 =
    (1.2214 + 0.1353) / 2 − 1 = −0.3216. log_ppl_abs_diff: episode 0 |−(0.1)/3| = 0.0333, episode 1
    |1.0/2| = 0.5 → 0.2667."""
    m = rollout_corr_metrics(OLD, ROLLOUT, SEQ, threshold=2.0)
    want = {"rollout_is_mean": 0.89883, "rollout_is_max": math.exp(0.2), "rollout_is_min": math.exp(-1),
            "rollout_is_ratio_fraction_low": 0.2, "rollout_is_ratio_fraction_high": 0.0, "kl": 0.18,
            "chi2_token": -0.11088, "chi2_seq": -0.32164, "log_ppl_abs_diff": 0.26667, "targets": 5, "sequences": 2}
    for k, v in want.items():
        assert abs(float(m[f"rollout_corr/{k}"]) - v) < 1e-4, k


def test_engine_loss_is_weighted_by_the_correction(kit, tokenizer):
    """One GRPO group of two recorded episodes, rewards (1, 0): mean 0.5, unbiased std
    sqrt((0.5² + 0.5²) / 1) = 0.7071, so A = (+0.7071, −0.7071) (eps 1e-6 aside). π_old is the trainer's own
    logprobs, so ρ_PPO = π_θ / π_old = 1 and each target's loss is −A. Episode 1's rollout records are
    shifted +1 nat per token: its ρ = π_old / π_rollout = e^−1 per token, outside [0.5, 2], so sequence MIS
    drops it whole. Token normalization over all N targets: plain loss = (−A₀ n₀ − A₁ n₁) / N, MIS loss
    = −A₀ n₀ / N, and the masked share is n₁ / N."""
    from transformers import AutoModelForCausalLM

    from memorywalker.engine import Batch, EngineConfig, loss, run
    from memorywalker.render import Renderer, RenderOptions
    from memorywalker.rollout import HarnessConfig, VaultEnv, run_episode
    from memorywalker.samplers.hf import HFPolicy

    renderer = Renderer(tokenizer, RenderOptions(truncated="prefix"))  # length-cut responses are targets (RL)

    model = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    env = VaultEnv(0)
    policy = HFPolicy.from_model(model, tokenizer, max_new_tokens=6)
    trajs = [run_episode(env, env.task("recall-2", 0), policy, tokenizer, HarnessConfig("none", max_steps=2),
                         seed=s, episode_id=f"e{s}") for s in (1, 2)]
    trajs[0].reward, trajs[1].reward = 1.0, 0.0
    for c in trajs[1].calls:
        c.rollout_logprobs = [lp + 1.0 for lp in c.rollout_logprobs]
    batch = Batch.from_groups([[renderer.render(t) for t in trajs]])
    batch.old_logprob = run(model, batch, EngineConfig(method="radix", objective="grpo"),
                            backward=False).logprobs.numpy()
    plain = run(model, batch, EngineConfig(method="radix", objective="grpo"), backward=False)
    mis = run(model, batch, EngineConfig(method="radix", objective="grpo", rollout_rs="sequence"), backward=False)
    n = len(batch.targets)
    n0, n1 = int((batch.targets.trajectory == 0).sum()), int((batch.targets.trajectory == 1).sum())
    assert n0 > 0 and n1 > 0
    a0 = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert float(plain.loss) == pytest.approx((-a0 * n0 + a0 * n1) / n, rel=1e-5, abs=1e-6)
    assert float(mis.loss) == pytest.approx(-a0 * n0 / n, rel=1e-5)
    assert float(mis.metrics["mean_rollout_rs_masked"]) == pytest.approx(n1 / n)
    assert float(mis.metrics["rollout_corr/rollout_is_min"]) == pytest.approx(math.exp(-1), rel=1e-5)
    # the public differentiable API weighs the same way, with π_old as an argument instead of on the batch
    old, batch.old_logprob = batch.old_logprob, None
    api = loss(model, batch, EngineConfig(method="radix", objective="grpo", rollout_rs="sequence"), old_logprobs=old)
    assert float(api.loss) == pytest.approx(-a0 * n0 / n, rel=1e-5)
    assert float(api.stats["rollout_rs_masked"].nansum()) == n1
    with pytest.raises(ValueError, match="need old logprobs"):
        run(model, batch, EngineConfig(method="radix", objective="grpo", rollout_is="token"))
    with pytest.raises(ValueError, match="need old logprobs"):
        loss(model, batch, EngineConfig(method="radix", objective="grpo", rollout_is="token"))


def test_rl_recipe_corrects_by_the_recomputed_collecting_policy(kit, tmp_path):
    """The RL recipe with a sampler whose records are off by a known amount (test_recipe_rl's
    ``shifted_sampler``: every rollout logprob moved by ``shift``). π_old is recomputed by the trainer, so
    log ρ = −shift on every compared token. Records 0.3 too high: the geometric ρ of every episode is
    e^−0.3 = 0.7408, so geometric TIS weighs every target by 0.7408 and geometric MIS over [0.5, 2] keeps
    all (masked share 0). Records 1.0 too low: each episode's ∏ρ = e^(n·1.0) > 2 for any n ≥ 1, so sequence
    MIS drops every target (masked share 1) and the loss is exactly 0."""
    from memorywalker.recipes.rl import train
    from test_recipe_rl import config, shifted_sampler

    m = train(config(kit, tmp_path / "geo", rollout_is="geometric", rollout_rs="geometric"),
              reward_fn=shifted_sampler(0.3), progress=False).metrics[0]
    assert abs(m["mean_rollout_is"] - math.exp(-0.3)) < 1e-4 and m["mean_rollout_rs_masked"] == 0.0
    assert abs(m["rollout_corr/kl"] - 0.3) < 1e-4 and abs(m["mean_ratio"] - 1.0) < 1e-6
    m = train(config(kit, tmp_path / "seq", rollout_rs="sequence"), reward_fn=shifted_sampler(-1.0),
              progress=False).metrics[0]
    assert m["mean_rollout_rs_masked"] == 1.0 and m["loss"] == 0.0
    assert abs(m["rollout_corr/rollout_is_min"] - math.e) < 1e-3 and m["rollout_corr/rollout_is_ratio_fraction_high"] == 1.0
