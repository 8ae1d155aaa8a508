"""The public, differentiable API (engine/logprobs.py): logprobs() and loss() against run(), a custom
loss through the graph, a batch built from token ids without records, and the model's attention
implementation left as it was."""

from __future__ import annotations

import pytest
import torch

from engine_cases import grads, load_model, max_rel_grad_diff, one_thread, random_groups
from memorywalker.engine import METHODS, Denominators, EngineConfig, TokenCall, logprobs, loss, run
from memorywalker.layout import Batch

COMPARED = [m.name for m in METHODS.values() if m.exact] + ["sdcc"]


@pytest.fixture(scope="module")
def setup(kit, renderer):
    return load_model(kit[1]), Batch.from_groups(random_groups(renderer, seed=7))


@pytest.mark.parametrize("method", COMPARED)
def test_loss_equals_run(setup, method):
    """logprobs() gives run()'s logprobs, and loss().loss.backward() accumulates run()'s gradient, within
    1e-6 (relative for gradients), with max_tokens 48 so trees are chunked."""
    model, batch = setup
    cfg = EngineConfig(method=method, max_tokens=48, attention="sdpa")
    with one_thread():
        model.zero_grad(set_to_none=True)
        res = run(model, batch, cfg)
        g_run = grads(model)
        model.zero_grad(set_to_none=True)
        out = loss(model, batch, cfg)
        out.loss.backward()
        g_api = grads(model)
        with torch.no_grad():
            lp = logprobs(model, batch, cfg)
    finite = torch.isfinite(res.logprobs)
    assert torch.equal(finite, torch.isfinite(lp.values)) and finite.any()
    assert (res.logprobs[finite] - lp.values[finite]).abs().max().item() <= 1e-6
    assert (res.logprobs[finite] - out.logprobs.values.detach()[finite]).abs().max().item() <= 1e-6
    assert abs(res.loss.item() - out.loss.item()) <= 1e-6
    assert max_rel_grad_diff(g_api, g_run) <= 1e-6
    assert not lp.values.requires_grad  # under no_grad nothing is kept for a backward


def test_a_custom_loss_through_the_graph(setup):
    """L = Σ_i logp_i² through logprobs(): its gradient Σ 2 logp_i ∇logp_i equals run() with the
    'weighted' objective (ℓ_i = −c_i logp_i) at c_i = −2 logp_i and denominator 1 (radix, 1e-6)."""
    model, batch = setup
    cfg = EngineConfig(method="radix", max_tokens=48)
    with one_thread():
        model.zero_grad(set_to_none=True)
        lp = logprobs(model, batch, cfg)
        (lp.values ** 2).sum().backward()
        g_api = grads(model)
        model.zero_grad(set_to_none=True)
        one = torch.ones((), dtype=torch.float64)
        run(model, batch, EngineConfig(method="radix", max_tokens=48, objective="weighted"),
            advantages=-2 * lp.values.detach(), denominators=Denominators(loss=one, kl=one))
        g_run = grads(model)
    assert max_rel_grad_diff(g_api, g_run) <= 1e-6
    assert batch.targets.advantage.any() == False  # noqa: E712 -- the batch was not mutated


def test_per_target_inputs_are_arguments(setup):
    """weights=0 on every target of one trajectory gives the gradient of a batch whose table says so; the
    batch's own weights are untouched."""
    model, batch = setup
    w = batch.targets.weight.copy()
    w[batch.targets.trajectory == 0] = 0.0
    cfg = EngineConfig(method="radix")
    with one_thread():
        model.zero_grad(set_to_none=True)
        run(model, batch, cfg, weights=w)
        g_arg = grads(model)
        saved = batch.targets.weight.copy()
        batch.targets.weight[:] = w
        model.zero_grad(set_to_none=True)
        run(model, batch, cfg)
        g_table = grads(model)
        batch.targets.weight[:] = saved
    assert max_rel_grad_diff(g_arg, g_table) <= 1e-6
    assert (batch.targets.weight == 1).all()


def test_a_batch_from_token_ids(setup, renderer):
    """The same episodes given as token ids and response starts (no records): the same tree, targets
    and logprobs as the rendered batch, and equal to a plain model(input_ids=S_t) forward per call."""
    model, _ = setup
    groups = random_groups(renderer, seed=8)
    episodes = [[TokenCall(rc.tokens, rc.prompt_len, rc.targets) for rc in rt.calls] for g in groups for rt in g]
    sizes = [len(g) for g in groups]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    from_ids = Batch.from_token_ids(episodes, groups=[list(range(s, s + k)) for s, k in zip(starts, sizes, strict=True)])
    from_records = Batch.from_groups(groups)
    assert [len(t) for t in from_ids.trees] == [len(t) for t in from_records.trees]
    assert (from_ids.targets.label == from_records.targets.label).all()
    cfg = EngineConfig(method="radix", max_tokens=48)
    with one_thread(), torch.no_grad():
        a = logprobs(model, from_ids, cfg).values
        b = logprobs(model, from_records, cfg).values
        plain = []
        for ep in episodes:
            for c in ep:
                lg = torch.log_softmax(model(input_ids=torch.tensor([c.token_ids])).logits[0].float(), -1)
                idx = torch.tensor(c.targets)
                plain.append(lg[idx - 1, torch.tensor(c.token_ids)[idx]])
    assert (a - b).abs().max().item() <= 1e-6
    assert (a - torch.cat(plain)).abs().max().item() <= 1e-5


def test_token_calls_are_checked():
    with pytest.raises(ValueError, match="response_start 0"):
        TokenCall([1, 2], 0).rendered(0)
    with pytest.raises(ValueError, match="2 rollout logprobs for 1 targets"):
        TokenCall([1, 2, 3], 2, rollout_logprobs=[-0.1, -0.2]).rendered(0)


def test_the_attention_implementation_is_restored(setup):
    """A masked method under another attention implementation switches the model only inside the call."""
    model, batch = setup
    assert model.config._attn_implementation == "sdpa"
    with one_thread():
        lp = logprobs(model, batch, EngineConfig(method="tree-mask", attention="eager"))
        assert model.config._attn_implementation == "sdpa"
        lp.values[torch.isfinite(lp.values)].sum().backward()  # the graph outlives the switch
    assert model.config._attn_implementation == "sdpa"
