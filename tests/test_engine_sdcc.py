"""SDCC: one backward, eps_kl = 0 without evictions, and training on the KL lowers eps_kl."""

from __future__ import annotations

import torch

from engine_cases import load_model, no_eviction_batch, one_thread, random_batch
from memorywalker.engine import EngineConfig, run


def _count_backwards(model) -> list[int]:
    """A hook on the output embedding's weight fires once per backward pass that reaches it."""
    count = [0]
    model.get_output_embeddings().weight.register_hook(lambda g: count.__setitem__(0, count[0] + 1))
    return count


def test_sdcc_runs_exactly_one_backward(kit, renderer):
    model = load_model(kit[1])
    count = _count_backwards(model)
    batch = random_batch(renderer, seed=4)
    with one_thread():
        res = run(model, batch, EngineConfig(method="sdcc", sdcc_lambda=1.0))
    assert count[0] == 1 and res.metrics["backwards"] == 1
    n_students = sum(c.junction for c in batch.calls)
    assert res.metrics["students"] == n_students == len(res.eps_kl) >= 5
    views = sum(len(t.trajectory_ids) for t in batch.trees)
    # One full view per trajectory, one sequence per abandoned attempt (the retry's first try), K students.
    abandoned = sum(len(rt.full_view.abandoned) for g in batch.rendered for rt in g)
    assert abandoned == 1
    assert res.metrics["forwards"] == views + abandoned + n_students
    assert res.metrics["unmatched_calls"] == 0 and res.metrics["lost_targets"] == 0
    assert (res.eps_kl > 0).all()
    assert torch.allclose(res.metrics["tv_bound"], torch.sqrt(res.eps_kl.mean() / 2))
    assert res.metrics["eps_kl_max"] == res.eps_kl.max()
    # The hook counts every backward: logit-tree runs one per segment.
    count[0] = 0
    model.zero_grad()
    with one_thread():
        lt = run(model, batch, EngineConfig(method="logit-tree"))
    assert count[0] == lt.metrics["backwards"] > 1


def test_sdcc_without_evictions_is_per_call(kit, renderer):
    """No eviction: no junction, so eps_kl is exactly 0; distilling every call anyway gives KL ≈ 0,
    and the full view's logprobs are the per-call ones (the full view is what every call saw)."""
    model = load_model(kit[1])
    batch = no_eviction_batch(renderer)
    with one_thread():
        res = run(model, batch, EngineConfig(method="sdcc"))
        ref = run(model, batch, EngineConfig(method="per-call"), backward=False)
        every = run(model, batch, EngineConfig(method="sdcc", sdcc_students="all"), backward=False)
    assert res.metrics["students"] == 0 and res.metrics["eps_kl_mean"] == 0 and res.metrics["eps_kl_max"] == 0
    assert (res.logprobs - ref.logprobs).abs().max().item() <= 1e-5
    assert every.metrics["students"] == sum(c.selected for c in batch.calls)
    assert every.eps_kl.max().item() <= 1e-6


def test_optimizer_steps_lower_eps_kl(kit, renderer):
    """Five Adam steps on SDCC's loss (λ = 10) lower eps_kl at every step and by more than half.

    The tiny random model is near-uniform (eps_kl ~ 1e-5, lost in the noise of the main loss), so its
    output layer is scaled by 10 first: sharper distributions whose conditioning matters.
    """
    model = load_model(kit[1])
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(10.0)
    batch = random_batch(renderer, seed=5)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    cfg = EngineConfig(method="sdcc", sdcc_lambda=10.0)
    history = []
    with one_thread():
        for _ in range(5):
            opt.zero_grad()
            res = run(model, batch, cfg)
            history.append(res.metrics["eps_kl_mean"].item())
            opt.step()
        history.append(run(model, batch, cfg, backward=False).metrics["eps_kl_mean"].item())
    assert all(b < a for a, b in zip(history, history[1:], strict=False)), history
    assert history[-1] < 0.5 * history[0], history
