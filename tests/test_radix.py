"""The shared-prefix schedule's parts: radix nodes from Euler ends, chunking and levels, and the
merged attention kernel against a plain softmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_cases import load_model, one_thread, random_batch
from memorywalker.attention import masks
from memorywalker.attention.prefix import attend
from memorywalker.engine import EngineConfig, run
from memorywalker.engine.radix import Item, items_of, radix_nodes, schedule


def euler_ends(parent: list[int]) -> np.ndarray:
    """tout of a DFS-ordered tree given each position's parent (-1 = root), by brute force."""
    n = len(parent)
    tout = np.arange(1, n + 1)
    for q in range(n):
        k = parent[q]
        while k >= 0:
            tout[k] = max(tout[k], q + 1)
            k = parent[k]
    return tout


def test_radix_nodes_of_a_small_forest():
    """Root A = positions 0-2; children B = 3-4 and C = 5; a second root D = 6-7.

    parent: 0←-1, 1←0, 2←1, 3←2, 4←3, 5←2, 6←-1, 7←6. Nodes (start, end, parent node):
    A (0, 3, -1), B (3, 5, 0), C (5, 6, 0), D (6, 8, -1).
    """
    tout = euler_ends([-1, 0, 1, 2, 3, 2, -1, 6])
    assert tout.tolist() == [6, 6, 6, 5, 5, 6, 8, 8]
    nodes = radix_nodes(tout)
    assert [(n.start, n.end, n.parent) for n in nodes] == [(0, 3, -1), (3, 5, 0), (5, 6, 0), (6, 8, -1)]


def test_chunks_and_levels():
    """Root R of 10 tokens, children a (5 tokens) and b (30); max_tokens 16.

    Items: R [0, 10) level 0; a [10, 15) level 1; b cut into [15, 31) level 1 and [31, 45) level 2
    (the second chunk's parent is the first). Forwards: level 0 {R}; level 1 {a, b0} = 21 > 16 tokens,
    so {a} then {b0}; level 2 {b1} — 4 forwards, each parent before its children.
    """
    parent = list(range(-1, 9)) + [9, 10, 11, 12, 13] + [9] + list(range(15, 44))
    nodes = radix_nodes(euler_ends(parent))
    assert [(n.start, len(n), n.parent) for n in nodes] == [(0, 10, -1), (10, 5, 0), (15, 30, 0)]
    items = items_of(nodes, 16)
    assert items == [Item(0, 10, -1, 0), Item(10, 5, 0, 1), Item(15, 16, 0, 1), Item(31, 14, 2, 2)]
    assert schedule(items, 16) == [[0], [1], [2], [3]]
    assert schedule(items, 64) == [[0], [1, 2], [3]]


def _reference_attention(q, k_self, v_self, ancestors, scale):
    """Plain softmax over [ancestors ; self] with a lower-right causal mask, GQA by repetition."""
    rep = q.shape[1] // k_self.shape[1]
    B = q.shape[0]
    keys = torch.cat([k.expand(B, -1, -1, -1) for k, _ in ancestors] + [k_self], dim=2).repeat_interleave(rep, 1)
    vals = torch.cat([v.expand(B, -1, -1, -1) for _, v in ancestors] + [v_self], dim=2).repeat_interleave(rep, 1)
    c, a = q.shape[2], keys.shape[2] - q.shape[2]
    scores = (q @ keys.transpose(-1, -2)) * scale
    allowed = torch.ones(c, a + c, dtype=torch.bool)
    allowed[:, a:] = torch.tril(torch.ones(c, c, dtype=torch.bool))
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ vals


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_merged_attention_equals_one_softmax(dtype, tol):
    """Blocks of 5, 9 and 700 keys + a causal chunk of 7 queries, 4 query heads over 2 kv heads, a batch
    of 2 rows sharing the ancestors: output and gradients of q, k, v (ancestors included) match a
    single softmax over the concatenated keys."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    q, ks, vs = rnd(2, 4, 7, 16), rnd(2, 2, 7, 16), rnd(2, 2, 7, 16)
    anc = [(rnd(1, 2, n, 16), rnd(1, 2, n, 16)) for n in (5, 9, 700)]
    leaves = [q, ks, vs] + [t for kv in anc for t in kv]
    out = attend(q, ks, vs, anc, 0.25)
    ref = _reference_attention(q, ks, vs, anc, 0.25)
    assert (out - ref).abs().max().item() <= tol
    w = torch.randn(out.shape, generator=g, dtype=dtype)
    got = torch.autograd.grad((out * w).sum(), leaves)
    want = torch.autograd.grad((ref * w).sum(), leaves)
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max().item() <= 10 * tol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernel path needs a CUDA device")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cuda_merged_attention_equals_one_softmax(dtype, tol):
    """The CUDA kernels (memory-efficient attention, padded log-sum-exp) merged the same way: output and
    gradients of q, k, v against a single fp64 softmax over the concatenated keys (37 queries: not a
    multiple of the kernel's 32-query log-sum-exp padding)."""
    g = torch.Generator().manual_seed(2)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    cpu = [rnd(1, 4, 37, 64), rnd(1, 2, 37, 64), rnd(1, 2, 37, 64)] + [rnd(1, 2, n, 64) for n in (5, 5, 300, 300)]
    dev = [t.to("cuda", dtype).requires_grad_() for t in cpu]
    ref_in = [t.clone().requires_grad_() for t in cpu]
    q, ks, vs, k1, v1, k2, v2 = dev
    out = attend(q, ks, vs, [(k1, v1), (k2, v2)], 0.125)
    rq, rks, rvs, rk1, rv1, rk2, rv2 = ref_in
    ref = _reference_attention(rq, rks, rvs, [(rk1, rv1), (rk2, rv2)], 0.125)
    assert (out.double().cpu() - ref).abs().max().item() <= tol
    w = rnd(*ref.shape)
    got = torch.autograd.grad((out.double() * w.to("cuda")).sum(), dev)
    want = torch.autograd.grad((ref * w).sum(), ref_in)
    for a, b in zip(got, want, strict=True):
        assert (a.double().cpu() - b).abs().max().item() <= 10 * tol


def test_radix_builds_no_dense_mask(kit, renderer, monkeypatch):
    """The radix method never calls the [L, L] mask builder (tree-mask does)."""
    def forbidden(tout):
        raise AssertionError("dense mask built")

    monkeypatch.setattr(masks, "dense_allowed", forbidden)
    model = load_model(kit[1])
    batch = random_batch(renderer)
    with one_thread():
        res = run(model, batch, EngineConfig(method="radix", attention="sdpa"))
    assert torch.isfinite(res.logprobs).all()
    with pytest.raises(AssertionError, match="dense mask built"):
        run(model, batch, EngineConfig(method="tree-mask", attention="sdpa"))
