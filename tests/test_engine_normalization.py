"""Normalization is declared and invariant: micro-batching (here) and data parallelism
(test_engine_ddp.py) give the gradient of one pass; a trajectory split into more segments gains no
weight under ``trajectory``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_cases import grads, load_model, max_rel_grad_diff, one_thread, random_batch
from memorywalker.engine import EngineConfig, layout_for, run, step_denominators
from memorywalker.objectives import normalize


@pytest.fixture(scope="module")
def model(kit):
    return load_model(kit[1])


@pytest.mark.parametrize("normalization", ["token", "trajectory", "call"])
@pytest.mark.parametrize("method", ["tree-mask", "logit-tree"])
def test_micro_batches_give_the_one_pass_gradient(model, renderer, normalization, method):
    batch = random_batch(renderer, seed=6)
    cfg = EngineConfig(method=method, normalization=normalization)
    model.zero_grad(set_to_none=True)
    with one_thread():
        whole = run(model, batch, cfg)
    g_whole = grads(model)

    micro = batch.split([[1], [0, 2]])
    dens = step_denominators(micro, cfg)
    model.zero_grad(set_to_none=True)
    with one_thread():
        parts = [run(model, mb, cfg, denominators=dens) for mb in micro]
    assert max_rel_grad_diff(grads(model), g_whole) <= 1e-5
    assert torch.allclose(sum(p.loss for p in parts), whole.loss, rtol=1e-5)

    # Without the step denominator each micro-batch is its own mean: a different (wrong) gradient.
    model.zero_grad(set_to_none=True)
    with one_thread():
        for mb in micro:
            run(model, mb, cfg)
    assert max_rel_grad_diff(grads(model), g_whole) > 1e-2


def test_trajectory_normalization_weighs_every_episode_equally(model, renderer):
    """Under ``trajectory`` the loss is the mean over episodes of each episode's mean NLL:
    L = (1/T) Σ_t (1/n_t) Σ_{i ∈ t} −log p_i, however many segments or calls the episode has."""
    batch = random_batch(renderer, seed=7)
    traj = batch.targets.trajectory
    segments = batch.evictions + 1
    assert segments.max() >= 6 and segments.min() == 1  # very different segment counts
    with one_thread():
        ref = run(model, batch, EngineConfig(method="per-call"), backward=False)
        lt = run(model, batch, EngineConfig(method="logit-tree", normalization="trajectory"), backward=False)
    nll = -ref.logprobs.double().numpy()
    expected = np.mean([nll[traj == t].mean() for t in range(batch.num_trajectories)])
    assert abs(lt.loss.item() - expected) <= 1e-5 * expected

    # Each trajectory's coefficients sum to 1 (a weight of 1/T after division) for every method's
    # layout, whether it runs the episode as 1 tree, K+1 segments or one pass per call.
    for method in ("per-call", "logit-tree", "tree-mask"):
        layout = layout_for(batch, EngineConfig(method=method))
        coef, den = normalize(torch.from_numpy(layout.weight), torch.from_numpy(batch.targets.call),
                              torch.from_numpy(traj), "trajectory")
        mass = np.bincount(traj, weights=coef.numpy()) / den.item()
        np.testing.assert_allclose(mass, 1.0 / batch.num_trajectories, rtol=1e-6)
    # Under ``token`` the long, many-segment episode weighs by its number of targets instead.
    coef, den = normalize(torch.from_numpy(batch.targets.weight), torch.from_numpy(batch.targets.call),
                          torch.from_numpy(traj), "token")
    mass = np.bincount(traj, weights=coef.numpy()) / den.item()
    assert mass[0] > 2.0 / batch.num_trajectories


def test_splitting_an_episode_into_more_segments_gains_no_weight(renderer, model):
    """A 6-call episode run without compression (1 segment) or with 4 (5 segments: 6 passes of
    logit-tree in the batch) carries the same total weight under ``trajectory``: 1/T."""
    from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
    from memorywalker.layout import Batch

    flat = synthetic_trajectory(SyntheticSpec(turns=6, evictions=0, words=5, seed=9), "ep")
    split = synthetic_trajectory(SyntheticSpec(turns=6, evictions=4, words=5, seed=9), "ep")
    other = synthetic_trajectory(SyntheticSpec(turns=2, evictions=0, words=5, seed=10), "other")
    for ep, k in ((flat, 0), (split, 4)):
        batch = Batch.from_groups([[renderer.render(ep)], [renderer.render(other)]])
        assert batch.evictions[0] == k
        layout = layout_for(batch, EngineConfig(method="logit-tree"))
        assert len(layout.buffers) == k + 2
        coef, den = normalize(torch.from_numpy(layout.weight), torch.from_numpy(batch.targets.call),
                              torch.from_numpy(batch.targets.trajectory), "trajectory")
        mass = np.bincount(batch.targets.trajectory, weights=coef.numpy()) / den.item()
        np.testing.assert_allclose(mass, [0.5, 0.5], rtol=1e-6)


@pytest.mark.parametrize("split", [[[0], [1, 2]], [[0, 1], [2]]])
def test_logged_step_metrics_equal_the_whole_steps_for_any_micro_batching(model, renderer, split):
    """One step run as one micro-batch (grad_accum 1) or as two of unequal size (grad_accum 2) logs the
    same numbers: each micro-batch's mean weighs by its count (targets compared with the rollout, targets
    trained, sdcc students), *_max take the max, tv_bound = sqrt(eps_kl_mean / 2) of the step's mean.
    Hand example: means 0.1 over 1 target and 0.5 over 3 give (0.1 + 3·0.5) / 4 = 0.4, not 0.3 (the
    equal-weight average the reducer used to log). The trees here have very different target counts."""
    from memorywalker.train.step import reduce_step_metrics

    batch = random_batch(renderer, seed=4)
    n = len(batch.targets)
    batch.targets.rollout_logprob[:] = -1.0 - 0.25 * (np.arange(n) % 5)  # a sampler the trainer disagrees with
    batch.targets.advantage[:] = np.where(np.arange(n) % 3 == 0, 1.0, -0.5)
    cfg = EngineConfig(method="sdcc", objective="ppo", tis_cap=2.0)
    with one_thread():
        whole = reduce_step_metrics([run(model, batch, cfg, backward=False).metrics])
        micro = batch.split(split)
        dens = step_denominators(micro, cfg)
        parts = reduce_step_metrics([run(model, mb, cfg, backward=False, denominators=dens).metrics for mb in micro])
    keys = ("logprob_abs_diff", "k3_kl", "chi2_token", "log_ppl_abs_diff", "eps_kl_mean", "eps_kl_max", "tv_bound",
            "tv_bound_max", "mean_ratio", "mean_clipped", "mean_tis_weight", "loss", "targets", "processed_tokens")
    for key in keys:
        assert abs(whole[key] - parts[key]) <= 1e-6 * max(1.0, abs(whole[key])), (key, whole[key], parts[key])
    assert whole["logprob_abs_diff"] > 0.1 and whole["eps_kl_mean"] > 0 and 0 < whole["mean_clipped"] < 1
