"""Exactness against an independent reference: a plain ``model(input_ids)`` forward on each call's ``S_t``.

The reference uses nothing of the engine — no buffer, layout, mask, position ids or label helper: for
each call it runs the Hugging Face model on ``rendered_call.tokens`` with its default positions and its
own causal attention and reads log p(S_t[i] | S_t[:i]) = log_softmax(logits[i - 1])[S_t[i]] at the call's
targets. Its loss is the token-normalized NLL Σ −log p / N over every target of the batch, whose
gradient is compared with the engine's. Targets are matched by order: the batch targets table lists
groups, then trajectories, then calls, then each call's targets, as they were rendered.

Cases: a GRPO forest (rollouts merged at a shared prompt, positions carrying several targets), several
trees packed in one buffer, a tree chunked because it exceeds ``max_tokens``, a tree with a retried call
(a branch right at a response start), on both kit architectures (Llama, Qwen2).
"""

from __future__ import annotations

import pytest
import torch

from engine_cases import grads, load_model, max_rel_grad_diff, one_thread
from memorywalker.engine import METHODS, EngineConfig, run
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
from memorywalker.layout import Batch

EXACT = [m.name for m in METHODS.values() if m.exact]


def plain_reference(model, groups) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-target logprobs [N] (batch order) and the gradient of Σ −logp / N, one plain forward per call."""
    model.zero_grad(set_to_none=True)
    logps = []
    for group in groups:
        for rt in group:
            for rc in rt.calls:
                if not rc.targets:
                    continue
                logits = model(input_ids=torch.tensor([rc.tokens])).logits[0].float()
                logp = torch.log_softmax(logits, dim=-1)
                idx = torch.tensor(rc.targets)
                logps.append(logp[idx - 1, torch.tensor(rc.tokens)[idx]])
    logp = torch.cat(logps)
    (-logp.sum() / len(logp)).backward()
    return logp.detach(), grads(model)


def cases(renderer) -> dict[str, list]:
    def render(ts):
        return [renderer.render(t) for t in ts]

    grpo = synthetic_group(SyntheticSpec(turns=4, evictions=2, words=5, seed=3), "grpo", 4)
    retry = synthetic_trajectory(SyntheticSpec(turns=6, evictions=2, words=5, retries=1, seed=4), "retry")
    trees = [synthetic_trajectory(SyntheticSpec(turns=4, evictions=1, words=6, seed=s), f"t{s}") for s in range(3)]
    return {
        "grpo-forest": [render(grpo)],
        "retries": [render([retry])],
        "packed-trees": [render([t]) for t in trees],
    }


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch_setup(request, kit_cache):
    from transformers import AutoTokenizer

    from memorywalker.modelkit import default_kit
    from memorywalker.render import Renderer

    tok_dir, model_dir = default_kit(kit_cache, arch=request.param)
    renderer = Renderer(AutoTokenizer.from_pretrained(tok_dir))
    model = load_model(model_dir)
    with one_thread():
        refs = {}
        for name, groups in cases(renderer).items():
            refs[name] = (groups, *plain_reference(model, groups))
    return model, refs


@pytest.mark.parametrize("case", ["grpo-forest", "retries", "packed-trees"])
@pytest.mark.parametrize("max_tokens", [8192, 48], ids=["whole", "chunked"])
@pytest.mark.parametrize("method", EXACT)
def test_exact_methods_equal_plain_per_call_forwards(arch_setup, case, max_tokens, method):
    """logprobs within 1e-5 and parameter gradients within 1e-4 relative of the plain reference. With
    max_tokens=48 every tree (and every S_t longer than 48) is longer than a forward: the radix
    schedule runs it in chunks against its cached prefix, for every exact method."""
    model, refs = arch_setup
    groups, ref_logp, ref_grads = refs[case]
    batch = Batch.from_groups(groups)
    if max_tokens == 48:
        assert max(len(t) for t in batch.trees) > 48
    model.zero_grad(set_to_none=True)
    with one_thread():
        res = run(model, batch, EngineConfig(method=method, max_tokens=max_tokens, attention="sdpa"))
    assert len(res.logprobs) == len(ref_logp)
    assert (res.logprobs - ref_logp).abs().max().item() <= 1e-5
    assert max_rel_grad_diff(grads(model), ref_grads) <= 1e-4


def test_the_reference_is_not_vacuous(arch_setup):
    """The naive dfs conditioning differs from the reference on targets after an eviction (so a test
    above would catch an engine that conditions wrongly), and the reference gradient is not zero."""
    model, refs = arch_setup
    groups, ref_logp, ref_grads = refs["retries"]
    with one_thread():
        res = run(model, Batch.from_groups(groups), EngineConfig(method="dfs"), backward=False)
    assert (res.logprobs - ref_logp).abs().max().item() > 1e-3
    assert sum(g.norm().item() for g in ref_grads) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_radix_on_cuda_equals_plain_per_call(kit, renderer, dtype, tol):
    """The radix schedule on CUDA (the memory-efficient kernel's log-sum-exp merge, attention/prefix.py),
    fp32 and bf16, whole and chunked, against plain per-call forwards of the same model in the same dtype."""
    model = load_model(kit[1]).to("cuda", dtype)
    groups = list(cases(renderer).values())[0]
    model.zero_grad(set_to_none=True)
    logps = []
    for group in groups:
        for rt in group:
            for rc in rt.calls:
                if rc.targets:
                    logits = model(input_ids=torch.tensor([rc.tokens], device="cuda")).logits[0].float()
                    idx = torch.tensor(rc.targets, device="cuda")
                    logps.append(torch.log_softmax(logits, -1)[idx - 1, torch.tensor(rc.tokens, device="cuda")[idx]])
    ref = torch.cat(logps)
    (-ref.sum() / len(ref)).backward()
    ref_grads = [g.float().cpu() for g in grads(model)]
    for max_tokens in (8192, 48):
        model.zero_grad(set_to_none=True)
        res = run(model, Batch.from_groups(groups), EngineConfig(method="radix", max_tokens=max_tokens))
        assert (res.logprobs - ref.detach()).abs().max().item() <= tol
        assert max_rel_grad_diff([g.float().cpu() for g in grads(model)], ref_grads) <= (1e-3 if dtype == torch.float32 else 1e-1)
