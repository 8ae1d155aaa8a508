"""Attention masks: the three backends agree, and a token only reaches its tree descendants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_cases import grads, load_model, max_rel_grad_diff, one_thread, random_batch
from memorywalker.attention import FLEX_BLOCK, dense_allowed, eager_mask, flex_mask, get_backend, sdpa_mask
from memorywalker.attention.masks import block_classes
from memorywalker.engine import EngineConfig, layout_for, run


@pytest.fixture(scope="module")
def packed(renderer):
    """A buffer holding two trees (the GRPO forest and the short episode)."""
    batch = random_batch(renderer, seed=21).split([[1, 2]])[0]
    (buf,) = layout_for(batch, EngineConfig(method="tree-mask")).buffers
    return batch, buf


def test_dense_masks_are_the_ancestor_mask(packed):
    batch, buf = packed
    tout = torch.from_numpy(buf.tout)[None]
    allowed = dense_allowed(tout)[0].numpy()
    np.testing.assert_array_equal(allowed, buf.attention_mask())
    n = len(batch.trees[0])
    np.testing.assert_array_equal(allowed[:n, :n], batch.trees[0].ancestor_mask())
    assert not allowed[n:, :n].any() and not allowed[:n, n:].any()  # the two trees never meet
    assert sdpa_mask(tout, torch.float32).dtype == torch.bool
    em = eager_mask(tout, torch.bfloat16)
    assert em.dtype == torch.bfloat16 and em.shape == (1, 1, len(buf), len(buf))
    assert set(em.unique().tolist()) == {0.0, torch.finfo(torch.bfloat16).min}
    assert torch.equal(em[0, 0] == 0, torch.from_numpy(allowed))


def test_flex_block_mask_matches_and_skips_blocks(packed):
    _, buf = packed
    L = -(-len(buf) // FLEX_BLOCK) * FLEX_BLOCK
    tout = torch.arange(1, L + 1)[None]
    tout[0, :len(buf)] = torch.from_numpy(buf.tout)
    bm = flex_mask(tout, torch.float32)
    q = torch.arange(L)[:, None].expand(L, L)
    k = torch.arange(L)[None, :].expand(L, L)
    zero = torch.zeros((), dtype=torch.long)
    evaluated = bm.mask_mod(zero, zero, q, k)
    assert torch.equal(evaluated, dense_allowed(tout)[0])
    assert bm.sparsity() > 0  # blocks above the diagonal and between the trees are skipped
    with pytest.raises(ValueError, match="multiple of 128"):
        flex_mask(torch.arange(1, 41)[None], torch.float32)


def _chain_then_branches(n_prefix: int, branches: list[int], roots: int = 1) -> torch.Tensor:
    """Euler ends of ``roots`` trees, each a prefix of ``n_prefix`` tokens then sibling branches."""
    tout = []
    for _ in range(roots):
        base = len(tout)
        size = n_prefix + sum(branches)
        tout += [base + size] * n_prefix
        at = base + n_prefix
        for b in branches:
            tout += [at + b] * b
            at += b
    return torch.tensor(tout)[None]


@pytest.mark.parametrize("shape", [(512, [], 1), (200, [150, 300, 118], 1), (60, [70, 90], 4), (640, [], 1)])
def test_block_classes_are_exact(shape):
    """Built from per-block min/max of the Euler ends, each 128 x 128 block is full exactly when every
    pair in it is allowed and skipped exactly when none is (brute force over the dense ancestor mask);
    the BlockMask visits the same blocks as torch's create_block_mask over the same mask_mod.

    A chain of 512 tokens: 4 blocks, 6 full (below the diagonal), 4 partial (the diagonal), 6 empty."""
    from torch.nn.attention.flex_attention import create_block_mask

    tout = _chain_then_branches(*shape)
    L = tout.shape[1]
    pad = -(-L // FLEX_BLOCK) * FLEX_BLOCK
    tout = torch.cat([tout, torch.arange(L + 1, pad + 1)[None]], 1)  # padding sees itself only
    partial, full = block_classes(tout, FLEX_BLOCK)
    dense = dense_allowed(tout)[0].view(pad // 128, 128, pad // 128, 128).transpose(1, 2)  # [nQ, nK, 128, 128]
    assert torch.equal(full[0], dense.all(-1).all(-1))
    assert torch.equal(partial[0] | full[0], dense.any(-1).any(-1))
    if shape == (512, [], 1):
        assert (int(full.sum()), int(partial.sum())) == (6, 4)
    ours = flex_mask(tout, torch.float32)
    theirs = create_block_mask(lambda b, h, q, k: (k <= q) & (q < tout[b, k]), 1, None, pad, pad, device="cpu")
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    assert ours.sparsity() == theirs.sparsity()


def test_a_boolean_mask_is_wrong_for_eager_attention(kit, packed):
    """Why eager gets the additive mask: eager ADDS the mask to the scores, so a bool mask (0/1)
    blocks nothing and the logits differ from SDPA's."""
    _, buf = packed
    model = load_model(kit[1], attn="eager")
    ids = torch.from_numpy(buf.token_ids)[None]
    pos = torch.from_numpy(buf.position_ids)[None]
    tout = torch.from_numpy(buf.tout)[None]
    with torch.no_grad(), one_thread():
        right = model(input_ids=ids, position_ids=pos, attention_mask=eager_mask(tout, torch.float32)).logits
        wrong = model(input_ids=ids, position_ids=pos, attention_mask=sdpa_mask(tout, torch.float32)).logits
        model.set_attn_implementation("sdpa")
        sdpa = model(input_ids=ids, position_ids=pos, attention_mask=sdpa_mask(tout, torch.float32)).logits
    assert (right - sdpa).abs().max().item() <= 1e-5
    assert (wrong - sdpa).abs().max().item() > 1e-2


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_perturbing_a_token_changes_only_its_descendants(kit, packed, backend):
    """Changing token i changes the logits of exactly its Euler interval [i, tout[i]): its own node's
    later tokens and every branch below it, never a sibling branch or the other tree."""
    batch, buf = packed
    model = load_model(kit[1], attn=get_backend(backend).hf_implementation)
    ids = torch.from_numpy(buf.token_ids)[None]
    pos = torch.from_numpy(buf.position_ids)[None]
    mask = get_backend(backend).build(torch.from_numpy(buf.tout)[None], torch.float32)
    rng = np.random.default_rng(0)
    forest = batch.trees[0]
    branch_starts = forest.node_tin[1:4]  # first tokens of nodes right after a branch
    picks = [*rng.choice(len(buf), size=4, replace=False), *branch_starts, 0, len(forest), len(buf) - 1]
    with torch.no_grad(), one_thread():
        base = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits[0]
        for i in picks:
            other = ids.clone()
            other[0, i] = (other[0, i] + 7) % model.config.vocab_size
            out = model(input_ids=other, position_ids=pos, attention_mask=mask).logits[0]
            changed = (out - base).abs().amax(-1) > 1e-6
            descendants = np.zeros(len(buf), dtype=bool)
            descendants[i:buf.tout[i]] = True  # Euler interval of i: itself and its subtree
            np.testing.assert_array_equal(changed.numpy(), descendants, err_msg=f"token {i}")


def test_flex_forward_equals_sdpa_on_cpu(kit, renderer):
    """FlexAttention through transformers' flex_attention integration (compiled on CPU, forward only;
    its backward needs CUDA, see test_flex_backward_equals_sdpa_on_cuda)."""
    model = load_model(kit[1])
    batch = random_batch(renderer, seed=22).split([[1, 2]])[0]
    with one_thread():
        sdpa = run(model, batch, EngineConfig(method="tree-mask", attention="sdpa"), backward=False)
        flex = run(model, batch, EngineConfig(method="tree-mask", attention="flex"), backward=False)
    assert model.config._attn_implementation == "sdpa"  # restored after the flex run
    assert torch.isfinite(flex.logprobs).all()
    assert (flex.logprobs - sdpa.logprobs).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="no backward on CPU"):
        run(model, batch, EngineConfig(method="tree-mask", attention="flex"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA")
def test_flex_backward_equals_sdpa_on_cuda(kit, renderer):
    model = load_model(kit[1]).cuda()
    batch = random_batch(renderer, seed=23)
    res = {}
    for backend in ("sdpa", "flex"):
        model.zero_grad(set_to_none=True)
        out = run(model, batch, EngineConfig(method="tree-mask", attention=backend, max_tokens=1400))
        res[backend] = (out.logprobs.cpu(), [g.cpu() for g in grads(model)])
    assert (res["flex"][0] - res["sdpa"][0]).abs().max().item() <= 1e-4
    assert max_rel_grad_diff(res["flex"][1], res["sdpa"][1]) <= 1e-3
