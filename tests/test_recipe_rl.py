"""The RL recipe on the offline web-search world: one GRPO step moves every parameter, the exact
method's ratios start at 1 (the trainer reproduces the sampler's logprobs), and a resumed run collects
and trains exactly what an uninterrupted one does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from memorywalker.recipes.rl import RLConfig, train
from test_recipe_dpo import check_manifest


def even_token_share(traj) -> float:
    """A stand-in reward with variance inside every group (the untrained kit model never answers, so
    the environment's exact-match reward is 0 for all): the share of even token ids it sampled."""
    ids = [t for c in traj.calls for t in (c.response_tokens or [])]
    return sum(t % 2 == 0 for t in ids) / max(1, len(ids))


def config(kit, run_dir, **kw) -> RLConfig:
    base = dict(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(run_dir), prompts_per_step=1, group_size=2,
                max_steps=2, max_new_tokens=8, budget=1024, lr=1e-3, steps=1)
    return RLConfig(**{**base, **kw})


def test_one_grpo_step_changes_every_parameter_and_starts_at_ratio_one(kit, tmp_path):
    before = load_file(str(Path(kit[1]) / "model.safetensors"))
    result = train(config(kit, tmp_path), reward_fn=even_token_share, progress=False)
    after = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert [k for k in before if torch.equal(before[k], after[k])] == []
    m = result.metrics[0]
    assert m["episodes"] == 2 and m["groups_with_signal"] == 1.0 and m["reward_std"] > 0
    # the default method (radix) is exact: the trainer's logprobs are the sampler's, so ρ = 1, no clipping.
    assert m["logprob_abs_diff"] < 1e-4 and m["mean_clipped"] == 0.0
    for key in ("reward_mean", "loss", "tokens", "seconds", "rollout_seconds", "k3_kl", "evictions_mean"):
        assert key in m
    # the run directory's training manifest: every hash recomputed from the files; the 2 episodes listed
    manifest = check_manifest(tmp_path, kit, inputs=[])
    assert manifest["method"] == "radix" and len(manifest["records"]) == 2


def test_resumed_rl_run_matches_an_uninterrupted_one(kit, tmp_path):
    whole = train(config(kit, tmp_path / "whole", steps=2), reward_fn=even_token_share, progress=False)
    train(config(kit, tmp_path / "parts", steps=1), reward_fn=even_token_share, progress=False)
    parts = train(config(kit, tmp_path / "parts", steps=2, resume=True), reward_fn=even_token_share, progress=False)
    a = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "parts" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert parts.metrics[0]["reward_mean"] == whole.metrics[1]["reward_mean"]


def shifted_sampler(shift: float):
    """A reward function that also makes the sampler's records disagree with the collecting policy by a
    known amount: every recorded rollout logprob moves by ``shift`` (the reward hook sees each episode
    before it is rendered into the batch)."""
    def reward(traj) -> float:
        for c in traj.calls:
            if c.rollout_logprobs is not None:
                c.rollout_logprobs = [lp + shift for lp in c.rollout_logprobs]
        return even_token_share(traj)
    return reward


def test_tis_cap_weighs_by_old_over_rollout_and_ratio_is_against_the_collecting_policy(kit, tmp_path):
    """With ``tis_cap`` the trainer recomputes the collecting policy once per step (π_old). For the exact
    method the first epoch's π_θ = π_old, so ρ = 1 exactly, whatever the sampler recorded; the TIS weight
    is min(π_old / π_rollout, C) = min(exp(−shift), C): exp(−0.3) = 0.7408 for records 0.3 too high, and
    min(exp(1), 2) = 2 for records 1.0 too low. Without the recomputation the weight was exp(0) = 1."""
    high = train(config(kit, tmp_path / "high", tis_cap=2.0), reward_fn=shifted_sampler(0.3), progress=False)
    m = high.metrics[0]
    assert abs(m["mean_ratio"] - 1.0) < 1e-6 and m["mean_clipped"] == 0.0
    assert abs(m["mean_tis_weight"] - torch.exp(torch.tensor(-0.3)).item()) < 1e-3
    assert abs(m["logprob_abs_diff"] - 0.3) < 1e-3  # the gap to the records is still logged against them
    low = train(config(kit, tmp_path / "low", tis_cap=2.0), reward_fn=shifted_sampler(-1.0), progress=False)
    assert abs(low.metrics[0]["mean_tis_weight"] - 2.0) < 1e-6 and abs(low.metrics[0]["mean_ratio"] - 1.0) < 1e-6


def test_rl_at_a_temperature_starts_at_ratio_one(kit, tmp_path):
    """At T = 0.7 the sampler records log softmax(logits / 0.7) and the trainer divides its logits by 0.7
    too, so for the exact method the first step's ratio is 1 and nothing is clipped. (Before, the trainer
    was untempered: |Δ logp| would be the gap between the two distributions, far above 1e-4.)"""
    m = train(config(kit, tmp_path, temperature=0.7), reward_fn=even_token_share, progress=False).metrics[0]
    assert m["logprob_abs_diff"] < 1e-4 and abs(m["mean_ratio"] - 1.0) < 1e-4 and m["mean_clipped"] == 0.0
    with pytest.raises(ValidationError, match="must be > 0"):
        RLConfig(temperature=0.0)


def test_a_split_with_no_tasks_fails_in_one_line_instead_of_looping(kit, tmp_path):
    """An environment whose every task is in ``train``, asked for ``split=test``: collection gives up
    past 1000 x (prompts_per_step + 1) = 2000 suite indices (the runner's guard, shared: 2001 looked at)
    and stops with one line naming the split and suite. Before, rl's own task loop searched forever; an alarm
    after 30 s turns such a hang into a failure."""
    import signal

    from memorywalker.rollout import WebSearchEnv

    class AllTrain(WebSearchEnv):
        def task(self, suite, index):
            return super().task(suite, index).model_copy(update={"split": "train"})

    def hung(signum, frame):
        raise TimeoutError("collection still looking for a task after 30 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        with pytest.raises(ValueError) as err:
            train(config(kit, tmp_path, split="test"), env=AllTrain(), progress=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    message = str(err.value)
    assert "\n" not in message and "split 'test'" in message and "suite 'lookup'" in message, message
    assert "looked at 2001 tasks" in message, message
