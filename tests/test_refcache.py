"""Reference log-probability cache: cached sums equal a live reference forward, and every keyed input
(weights, adapter config, tokenizer, template, tokens, scored indices, attention/position/truncation
settings, dtype) invalidates it."""

from __future__ import annotations

import copy

import pytest
import torch

from engine_cases import load_model, one_thread
from memorywalker.engine import EngineConfig
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group
from memorywalker.train.refcache import RefCache, pair_side_calls, ref_settings, reference_sums, side_key
from memorywalker.tree.pairs import admit_pair


@pytest.fixture(scope="module")
def setup(kit, renderer, tokenizer):
    model = load_model(kit[1])
    model.eval()
    pairs = [admit_pair(*[renderer.render(t) for t in synthetic_group(
        SyntheticSpec(turns=3, evictions=1, words=5, seed=s), f"rc{s}", 2)]) for s in (0, 1)]
    return model, tokenizer, pairs


def _settings(model, tokenizer, **kw):
    base = dict(method="radix", attention=None, max_tokens=8192, truncated="exclude")
    return ref_settings(model, tokenizer, **{**base, **kw})


def live_sum(model, rt, scored) -> float:
    """Plain model(input_ids) forward per scored call (no engine code)."""
    total = 0.0
    for rc in rt.calls:
        if rc.index in scored:
            logp = torch.log_softmax(model(input_ids=torch.tensor([rc.tokens])).logits[0].float(), -1)
            idx = torch.tensor(scored[rc.index])
            total += logp[idx - 1, torch.tensor(rc.tokens)[idx]].double().sum().item()
    return total


def test_cached_sums_equal_a_live_reference_forward(setup, tmp_path):
    """The first call computes every side (misses), the second reads them all from the file (hits)
    without running the model; both equal plain per-call forwards within 1e-4."""
    model, tokenizer, pairs = setup
    settings = _settings(model, tokenizer)
    engine = EngineConfig(method="radix")
    with one_thread(), torch.no_grad():
        first = reference_sums(model, pairs, settings, RefCache(tmp_path / "ref.json"), engine)
        cache = RefCache(tmp_path / "ref.json")

        class Exploding(torch.nn.Module):
            def forward(self, *a, **k):
                raise AssertionError("the cache should have answered")

        second = reference_sums(Exploding(), pairs, settings, cache, engine)
        live = torch.tensor([[live_sum(model, p.chosen, p.chosen_scored), live_sum(model, p.rejected, p.rejected_scored)]
                             for p in pairs], dtype=torch.float64)
    assert (cache.hits, cache.misses) == (4, 0)
    assert torch.equal(first, second)
    assert (second - live).abs().max().item() <= 1e-4 * live.abs().max().item()
    assert live.abs().min().item() > 1.0  # real sums, not zeros


def test_each_keyed_input_invalidates_the_cache(setup, renderer):
    model, tokenizer, pairs = setup
    base = _settings(model, tokenizer)
    calls = pair_side_calls(pairs[0], 0)
    key = side_key(base, calls)
    assert side_key(_settings(model, tokenizer), calls) == key  # deterministic

    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        next(perturbed.parameters()).view(-1)[0] += 1e-3
    tok2 = copy.deepcopy(tokenizer)
    tok2.chat_template = tokenizer.chat_template + " "
    tok3 = copy.deepcopy(tokenizer)
    tok3.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    changed = {
        "weights": side_key(_settings(perturbed, tokenizer), calls),
        "dtype": side_key(_settings(copy.deepcopy(model).to(torch.float64), tokenizer), calls),
        "adapter": side_key(_settings(model, tokenizer, adapter={"kind": "lora", "rank": 4}), calls),
        "template": side_key(_settings(model, tok2), calls),
        "tokenizer": side_key(_settings(model, tok3), calls),
        "method": side_key(_settings(model, tokenizer, method="tree-mask"), calls),
        "attention": side_key(_settings(model, tokenizer, attention="eager"), calls),
        "max_tokens": side_key(_settings(model, tokenizer, max_tokens=64), calls),
        "truncation": side_key(_settings(model, tokenizer, truncated="prefix"), calls),
        "positions": side_key({**base, "positions": "buffer"}, calls),
        "tokens": side_key(base, [(t[:-1] + [t[-1] + 1], s) for t, s in calls]),
        "scored indices": side_key(base, pair_side_calls(admit_pair(pairs[0].chosen, pairs[0].rejected, "whole"), 0)),
    }
    for what, k in changed.items():
        assert k != key, what
    assert len(set(changed.values())) == len(changed)
    cache = RefCache()
    cache.put(key, [-3.0, 4])
    assert cache.get(key) == [-3.0, 4.0]
    assert all(cache.get(k) is None for k in changed.values())
