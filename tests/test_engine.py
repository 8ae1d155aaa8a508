"""Engine exactness and baselines on random trees, on two tiny architectures (llama, qwen2).

The exactness contract (DESIGN.md): fp32 per-target logprobs of ``logit-tree`` and ``tree-mask`` are
within 1e-5 of ``per-call`` and parameter gradients within 1e-4 relative; ``dfs`` and ``rightmost``
match ``per-call`` without evictions and differ with them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from engine_cases import grads, load_model, max_rel_grad_diff, no_eviction_batch, one_thread, random_batch
from memorywalker.engine import METHODS, OBJECTIVES, EngineConfig, run


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch_model(request, kit, qwen2_kit):
    model_dir = kit[1] if request.param == "llama" else qwen2_kit[1]
    return request.param, load_model(model_dir)


def _run(model, batch, **cfg):
    model.zero_grad(set_to_none=True)
    with one_thread():
        res = run(model, batch, EngineConfig(**cfg))
    return res, grads(model)


def test_random_trees_cover_the_hard_cases(renderer):
    """The fixture is what the contract is about: ≥ 5 evictions in one tree, a branch right at a
    response start, a forest sharing its prompt, positions carrying several targets."""
    batch = random_batch(renderer)
    junctions = [sum(c.junction for c in t.calls) for t in batch.trees]
    assert junctions[0] >= 5
    long = batch.trees[0]
    at_response_start = []
    for c in long.calls:
        if c.junction:
            prev = long.calls[long.calls.index(c) - 1]
            a, b = long.root_path(c.end), long.root_path(prev.end)
            common = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
            at_response_start.append(common == c.prompt_len == prev.prompt_len)
    assert any(at_response_start)
    forest = batch.trees[1]
    assert len(forest.trajectory_ids) == 3 and forest.num_roots == 1
    assert len(forest.targets.position) > len(np.unique(forest.targets.position))


def test_exact_methods_match_per_call(arch_model, renderer):
    arch, model = arch_model
    batch = random_batch(renderer, seed=1)
    ref, g_ref = _run(model, batch, method="per-call")
    assert torch.isfinite(ref.logprobs).all()
    for method in ("logit-tree", "tree-mask"):
        res, g = _run(model, batch, method=method, max_tokens=1400)
        diff = (res.logprobs - ref.logprobs).abs().max().item()
        assert diff <= 1e-5, (arch, method, diff)
        assert max_rel_grad_diff(g, g_ref) <= 1e-4, (arch, method)
        assert torch.allclose(res.loss, ref.loss, rtol=1e-5, atol=0)
    tm, _ = _run(model, batch, method="tree-mask", max_tokens=1400)
    assert tm.metrics["forwards"] < len(batch.trees)  # several trees shared a buffer
    lt, _ = _run(model, batch, method="logit-tree")
    segments = {(batch.call_tree[i], c.trajectory, c.segment) for i, c in enumerate(batch.calls)}
    assert lt.metrics["forwards"] == lt.metrics["backwards"] == len(segments)  # K + 1 per trajectory
    assert ref.metrics["forwards"] == sum(c.selected for c in batch.calls)
    assert tm.metrics["tokens"] == sum(len(t) for t in batch.trees) < lt.metrics["tokens"] < ref.metrics["tokens"]


def test_naive_baselines_exact_without_evictions_and_wrong_with_them(arch_model, renderer):
    arch, model = arch_model
    plain = no_eviction_batch(renderer)
    ref, g_ref = _run(model, plain, method="per-call")
    for method in ("dfs", "rightmost"):
        res, g = _run(model, plain, method=method)
        assert (res.logprobs - ref.logprobs).abs().max().item() <= 1e-5, (arch, method)
        assert max_rel_grad_diff(g, g_ref) <= 1e-4
        assert res.metrics["lost_targets"] == 0

    evicted = random_batch(renderer, seed=2)
    ref, g_ref = _run(model, evicted, method="per-call")
    dfs, g_dfs = _run(model, evicted, method="dfs")
    assert (dfs.logprobs - ref.logprobs).abs().max().item() > 1e-2
    assert max_rel_grad_diff(g_dfs, g_ref) > 1e-3
    rm, g_rm = _run(model, evicted, method="rightmost")
    lost = rm.layout.lost
    assert lost.sum() > 0 and rm.metrics["lost_targets"] == lost.sum()
    assert torch.isnan(rm.logprobs[torch.from_numpy(lost)]).all()
    kept = torch.from_numpy(~lost)
    # Targets found in S_T after a compression are conditioned on text written after them.
    assert (rm.logprobs[kept] - ref.logprobs[kept]).abs().max().item() > 1e-2
    # ... while targets on the final path itself are exact.
    last_calls = {max(i for i, c in enumerate(evicted.calls) if (evicted.call_tree[i], c.trajectory) == k)
                  for k in {(evicted.call_tree[i], c.trajectory) for i, c in enumerate(evicted.calls)}}
    on_last = torch.from_numpy(np.isin(evicted.targets.call, list(last_calls)))
    assert (rm.logprobs[on_last] - ref.logprobs[on_last]).abs().max().item() <= 1e-5


def test_eager_and_sdpa_backends_agree(kit, renderer):
    """The same logprobs and gradients under either mask; the model's own implementation (sdpa) is
    restored after a run under another one."""
    model = load_model(kit[1])
    batch = random_batch(renderer, seed=3)
    sdpa, g_sdpa = _run(model, batch, method="tree-mask", attention="sdpa", max_tokens=1400)
    eager, g_eager = _run(model, batch, method="tree-mask", attention="eager", max_tokens=1400)
    assert model.config._attn_implementation == "sdpa"
    assert (eager.logprobs - sdpa.logprobs).abs().max().item() <= 1e-5
    assert max_rel_grad_diff(g_eager, g_sdpa) <= 1e-4


def test_unknown_names_list_the_valid_ones(kit, renderer):
    model = load_model(kit[1])
    batch = no_eviction_batch(renderer)
    with pytest.raises(ValueError, match=r"unknown method 'tree'.*logit-tree.*radix.*tree-mask"):
        run(model, batch, EngineConfig(method="tree"))
    with pytest.raises(ValueError, match=r"unknown objective 'dpo'.*grpo.*nll.*ppo"):
        run(model, batch, EngineConfig(objective="dpo"))
    with pytest.raises(ValueError, match=r"unknown normalization 'seq'.*trajectory"):
        run(model, batch, EngineConfig(normalization="seq"))
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'.*eager.*flex.*sdpa"):
        run(model, batch, EngineConfig(method="tree-mask", attention="flash"))
    assert set(METHODS) == {"per-call", "logit-tree", "radix", "tree-mask", "dfs", "rightmost", "sdcc"}
    assert set(OBJECTIVES) == {"nll", "ppo", "grpo", "weighted"}


def test_eval_mode_leaves_no_gradient(kit, renderer):
    model = load_model(kit[1])
    batch = no_eviction_batch(renderer)
    model.zero_grad(set_to_none=True)
    with one_thread():
        res = run(model, batch, EngineConfig(method="tree-mask"), backward=False)
    assert all(p.grad is None for p in model.parameters())
    assert res.metrics["backwards"] == 0 and res.metrics["forwards"] == 1
    # token-normalized NLL is the mean negative logprob over targets
    assert torch.allclose(res.loss, -res.logprobs.mean(), rtol=1e-6)


def test_tokenizer_fixture_matches_models(kit):
    """The engine tests' renderer and models come from one kit (same vocabulary)."""
    tok = AutoTokenizer.from_pretrained(kit[0])
    assert load_model(kit[1]).config.vocab_size == len(tok)


def test_grpo_objective_through_the_engine(kit, renderer):
    """A group of 3 rollouts with rewards (1, 0, 0): A = (1.1547, −0.57735, −0.57735) (see
    test_objectives). On-policy (ratio 1) the token-normalized loss is −Σ_i A_traj(i) / N.
    With rollout logprobs 2× less likely than the policy's (ρ = 2, ε = 0.2) the loss is
    −Σ min(2A, 1.2A) / N: clipped to 1.2A where A > 0, 2A where A < 0."""
    from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group
    from memorywalker.layout import Batch

    group = synthetic_group(SyntheticSpec(turns=3, evictions=1, words=5, seed=30), "g", 3)
    for t, r in zip(group, (1.0, 0.0, 0.0), strict=True):
        t.reward = r
    batch = Batch.from_groups([[renderer.render(t) for t in group]])
    model = load_model(kit[1])
    traj = batch.targets.trajectory
    adv = np.array([2 / 3, -1 / 3, -1 / 3]) / np.sqrt(1 / 3)
    with one_thread():
        on = run(model, batch, EngineConfig(method="tree-mask", objective="grpo"), backward=False)
    assert on.loss.item() == pytest.approx(-adv[traj].mean(), rel=1e-4)
    assert on.metrics["mean_ratio"].item() == pytest.approx(1.0)

    batch.targets.rollout_logprob[:] = on.logprobs.numpy() - np.log(2.0)
    with one_thread():
        off = run(model, batch, EngineConfig(method="tree-mask", objective="grpo"), backward=False)
    a = adv[traj]
    assert off.loss.item() == pytest.approx(-np.minimum(2 * a, 1.2 * a).mean(), rel=1e-4)
    assert off.metrics["mean_clipped"].item() == pytest.approx((a > 0).mean())
    assert off.metrics["logprob_abs_diff"].item() == pytest.approx(np.log(2.0), rel=1e-5)


def test_grpo_without_reward_variance_skips_the_backward(kit, renderer):
    """Rewards (1, 1, 1): every advantage is 0, so the PPO loss −min(ρA, clip(ρ)A) and its gradient are
    exactly 0 — the engine runs the forwards (logprobs, gap metrics) and no backward, leaving no
    gradient (what optimizer_step reads as zeros). SDCC's KL term does not vanish: it still backpropagates.
    Rewards (1, 0, 0) backpropagate as usual."""
    from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group
    from memorywalker.layout import Batch

    def batch_with(rewards):
        group = synthetic_group(SyntheticSpec(turns=3, evictions=1, words=5, seed=30), "g", 3)
        for t, r in zip(group, rewards, strict=True):
            t.reward = r
        return Batch.from_groups([[renderer.render(t, full_view=True) for t in group]])

    model = load_model(kit[1])
    flat, varied = batch_with((1.0, 1.0, 1.0)), batch_with((1.0, 0.0, 0.0))
    with one_thread():
        model.zero_grad(set_to_none=True)
        skipped = run(model, flat, EngineConfig(method="radix", objective="grpo"))
        assert all(p.grad is None for p in model.parameters())
        evaluated = run(model, flat, EngineConfig(method="radix", objective="grpo"), backward=False)
        sdcc = run(model, flat, EngineConfig(method="sdcc", objective="grpo"))
        assert sdcc.metrics["backwards"] == 1 and any(p.grad is not None for p in model.parameters())
        model.zero_grad(set_to_none=True)
        trained = run(model, varied, EngineConfig(method="radix", objective="grpo"))
    assert skipped.metrics["backwards"] == 0 and skipped.metrics["forwards"] == evaluated.metrics["forwards"] > 0
    assert skipped.loss.item() == 0.0 and torch.equal(skipped.logprobs, evaluated.logprobs)
    assert trained.metrics["backwards"] == 1 and any(p.grad is not None and p.grad.abs().sum() > 0
                                                     for p in model.parameters())
