"""Attention against cached ancestors: the kernel of the shared-prefix (``radix``) schedule.

A chunk of a radix node attends to every key of its ancestors (all visible: they lie on its root path)
and causally to itself. No [L, L] mask is ever built:

    out = softmax([q·K_anc ; q·K_self + causal]) · [V_anc ; V_self]

is computed as two attentions — the ancestors' cached blocks concatenated into one block with no mask,
the chunk itself with ``is_causal`` (queries and keys of equal length, so the top-left alignment of the
CPU kernel and the bottom-right one of CUDA's agree) — merged by their log-sum-exp, as FlashAttention
merges its tiles and ring attention its shards (Liu et al. 2023, https://arxiv.org/abs/2310.01889):

    lse = log(exp(lse_anc) + exp(lse_self)),    out = exp(lse_anc − lse) · out_anc + exp(lse_self − lse) · out_self

The backward runs the kernel's backward of each block with the *merged* output and log-sum-exp, which
gives exactly the gradient of the attention over the union of blocks (the softmax rows are normalized
by the merged ``lse``; ``D = rowsum(dO ∘ O)`` uses the merged ``O``). The concatenation of the ancestor
blocks is not saved for the backward (it would hold a second copy of the whole root path per chunk):
the blocks are saved as they are and concatenated again.

The two blocks run the device's attention kernels that return and accept the log-sum-exp
(:data:`KERNELS`): ATen's CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``, any
float dtype) and, on CUDA, the memory-efficient kernel (``_scaled_dot_product_efficient_attention``:
fp32, fp16 and bf16; its log-sum-exp is padded to a multiple of 32 queries). Memory is O(chunk · keys)
in neither: both tile the scores, never [heads, L, L]. The CUDA path has tests that skip without CUDA
and has not run (no GPU was available for this work).

Hugging Face models reach it through the attention interface: :func:`prefix_attention` is registered
under :data:`IMPLEMENTATION`, and the model forward receives the segments of its row and the cached
blocks as the keyword ``prefix_kv`` (a :class:`PrefixKV`), which transformers passes down to every
attention layer. Segments packed in one row never attend to each other (varlen packing without a mask).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from memorywalker.errors import InputError

IMPLEMENTATION = "memorywalker_prefix"


@dataclass
class Segment:
    """A run of the forward's (single) row that attends causally to itself and to ``ancestors``."""

    start: int  # first column in the row
    length: int
    ancestors: list[int]  # indices into PrefixKV.blocks of the cached blocks it sees (root first)


class PrefixKV:
    """What one forward attends to and what it leaves behind.

    The forward's row packs several segments (radix nodes, or chunks of a long one); each attends to
    its own cached ancestors and causally to itself, never to another segment. ``blocks[i][layer]`` is
    a cached (key, value) pair [1, kv_heads, n_i, head_dim] (after RoPE, with grad). The forward fills
    ``new[layer]`` with its row's (key, value) [1, kv_heads, L, head_dim].

    A plain class, not a dataclass: wrappers that rebuild a module's keyword arguments (FSDP2 walks
    dataclasses in them to hook tensors that need grad) would hand each layer a copy, and the keys and
    values a layer writes into ``new`` would never reach the caller.
    """

    def __init__(self, segments: list[Segment], blocks: list[list[tuple[torch.Tensor, torch.Tensor]]],
                 new: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None):
        self.segments = segments
        self.blocks = blocks
        self.new = {} if new is None else new


def _rep(x: torch.Tensor, n_rep: int, batch: int) -> torch.Tensor:
    """[b, kv_heads, n, d] -> [batch, kv_heads * n_rep, n, d] (GQA heads repeated, batch broadcast)."""
    b, h, n, d = x.shape
    x = x.expand(batch, h, n, d)
    if n_rep > 1:
        x = x[:, :, None].expand(batch, h, n_rep, n, d).reshape(batch, h * n_rep, n, d)
    return x.contiguous()


def _unrep(g: torch.Tensor, n_rep: int, batch: int) -> torch.Tensor:
    """Adjoint of :func:`_rep`: sum the gradient over repeated heads and (for shared blocks) the batch."""
    B, H, n, d = g.shape
    if n_rep > 1:
        g = g.view(B, H // n_rep, n_rep, n, d).sum(2)
    return g.sum(0, keepdim=True) if batch == 1 and B > 1 else g


@dataclass(frozen=True)
class Kernel:
    """A device's attention kernel that returns the log-sum-exp and a backward that accepts it.

    ``forward(q, k, v, causal, scale) -> (out [B, H, c, d], lse float32 [B, H, c])``;
    ``backward(grad_out, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)`` with the merged out/lse.
    """

    forward: Callable
    backward: Callable


def _cpu_forward(q, k, v, causal: bool, scale: float):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _cpu_backward(grad_out, q, k, v, out, lse, causal: bool, scale: float):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, causal, scale=scale)


def _cuda_forward(q, k, v, causal: bool, scale: float):
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, causal, scale=scale)
    return out, lse[..., :q.shape[2]]  # the kernel pads the log-sum-exp to a multiple of 32 queries


def _cuda_backward(grad_out, q, k, v, out, lse, causal: bool, scale: float):
    c = q.shape[2]
    padded = lse.new_zeros(*lse.shape[:-1], -(-c // 32) * 32)  # the layout the kernel wrote
    padded[..., :c] = lse
    seed = offset = torch.zeros((), dtype=torch.int64, device=q.device)  # no dropout: unused
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, padded.contiguous(), seed, offset, 0.0, [True, True, True, False], causal,
        scale=scale)
    return dq, dk, dv


KERNELS: dict[str, Kernel] = {"cpu": Kernel(_cpu_forward, _cpu_backward), "cuda": Kernel(_cuda_forward, _cuda_backward)}


def kernel_for(device: torch.device) -> Kernel:
    try:
        return KERNELS[device.type]
    except KeyError:
        raise InputError(f"the radix schedule has no attention kernel for {device.type!r}; "
                         f"supported: {sorted(KERNELS)}") from None


class _MergedAttention(torch.autograd.Function):
    """Attention of ``q`` over [ancestor blocks (concatenated, no mask) ; self (causal)], merged by
    log-sum-exp. ``kv`` = k_self, v_self, then each ancestor block's k, v (root first)."""

    @staticmethod
    def forward(ctx, scale: float, n_rep: int, kernel: Kernel, q: torch.Tensor, *kv: torch.Tensor):
        B = q.shape[0]
        k_self, v_self, anc = kv[0], kv[1], kv[2:]
        o_self, l_self = kernel.forward(q, _rep(k_self, n_rep, B), _rep(v_self, n_rep, B), True, scale)
        if anc:
            k_anc, v_anc = _cat_blocks(anc)
            o_anc, l_anc = kernel.forward(q, _rep(k_anc, n_rep, B), _rep(v_anc, n_rep, B), False, scale)
            acc = torch.promote_types(q.dtype, torch.float32)  # merge in at least fp32
            l_anc, l_self = l_anc.to(acc), l_self.to(acc)
            lse = torch.logaddexp(l_anc, l_self)  # merged normalizer
            out = (o_anc.to(acc) * torch.exp(l_anc - lse)[..., None]
                   + o_self.to(acc) * torch.exp(l_self - lse)[..., None]).to(q.dtype)
        else:
            out, lse = o_self, l_self
        ctx.scale, ctx.n_rep, ctx.kernel = scale, n_rep, kernel
        ctx.save_for_backward(q, out, lse, *kv)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, out, lse, k_self, v_self, *anc = ctx.saved_tensors
        B, n_rep, kernel, scale = q.shape[0], ctx.n_rep, ctx.kernel, ctx.scale
        grad_out = grad_out.contiguous()
        # The merged out/lse make each block's P = exp(q·k·scale − lse) its share of the full softmax.
        dq, dk, dv = kernel.backward(grad_out, q, _rep(k_self, n_rep, B), _rep(v_self, n_rep, B), out, lse, True, scale)
        grads = [_unrep(dk, n_rep, k_self.shape[0]).to(k_self.dtype), _unrep(dv, n_rep, v_self.shape[0]).to(v_self.dtype)]
        if anc:
            k_anc, v_anc = _cat_blocks(anc)
            dq_a, dk_a, dv_a = kernel.backward(grad_out, q, _rep(k_anc, n_rep, B), _rep(v_anc, n_rep, B), out, lse,
                                               False, scale)
            dq = dq.to(torch.promote_types(q.dtype, torch.float32)) + dq_a
            dk_a, dv_a = _unrep(dk_a, n_rep, k_anc.shape[0]), _unrep(dv_a, n_rep, v_anc.shape[0])
            sizes = [anc[i].shape[2] for i in range(0, len(anc), 2)]
            for dk_b, dv_b, k_b in zip(dk_a.split(sizes, 2), dv_a.split(sizes, 2), anc[0::2], strict=True):
                grads += [dk_b.to(k_b.dtype), dv_b.to(k_b.dtype)]
        return None, None, None, dq.to(q.dtype), *grads


def _cat_blocks(anc) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) of the ancestor blocks concatenated along the keys (a flat list k0, v0, k1, v1, ...)."""
    if len(anc) == 2:
        return anc[0], anc[1]
    return torch.cat(anc[0::2], dim=2), torch.cat(anc[1::2], dim=2)


def attend(q: torch.Tensor, k_self: torch.Tensor, v_self: torch.Tensor,
           ancestors: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """q [B, H, c, d], k/v_self [B, Hkv, c, d], ancestor blocks [1, Hkv, n_b, d] -> out [B, H, c, d]."""
    n_rep = q.shape[1] // k_self.shape[1]
    flat = [t for kv in ancestors for t in kv]
    return _MergedAttention.apply(scale, n_rep, kernel_for(q.device), q.contiguous(), k_self, v_self, *flat)


def prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Hugging Face attention-interface function (registered as :data:`IMPLEMENTATION`).

    ``query`` [1, H, L, d], ``key``/``value`` [1, Hkv, L, d] (after RoPE); returns ([1, L, H, d], None).
    Each segment of ``prefix_kv`` attends to its ancestors' cached blocks and causally to itself.
    """
    ctx: PrefixKV | None = kwargs.get("prefix_kv")
    if ctx is None:
        raise ValueError(f"attention {IMPLEMENTATION!r} runs inside memorywalker's radix schedule only "
                         "(the forward needs prefix_kv=PrefixKV(...))")
    if attention_mask is not None:
        raise ValueError("the radix schedule builds no mask; got one from the model")
    if getattr(module, "sliding_window", None) or kwargs.get("softcap") is not None:
        raise InputError("the radix schedule supports full causal attention without soft-capping; "
                         f"{type(module).__name__} uses a sliding window or soft-capping")
    if dropout:
        raise InputError("attention dropout is not supported by the radix schedule (set attention_dropout=0)")
    layer = module.layer_idx
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    outs: list[torch.Tensor | None] = [None] * len(ctx.segments)
    for group in sibling_groups(ctx.segments):
        segs = [ctx.segments[i] for i in group]
        ancestors = [ctx.blocks[i][layer] for i in segs[0].ancestors]
        if len(segs) == 1:
            cols = slice(segs[0].start, segs[0].start + segs[0].length)
            outs[group[0]] = attend(query[:, :, cols], key[:, :, cols], value[:, :, cols], ancestors, scale)
            continue
        # Siblings (the same ancestors): one batched call, each right-padded to the longest. Under the causal
        # self block a real query never sees the padding after it; the padded queries' rows are dropped.
        width = max(s.length for s in segs)
        q, k, v = (_padded_batch(t, segs, width) for t in (query, key, value))
        out = attend(q, k, v, ancestors, scale)  # [n, H, width, d]
        for j, (i, s) in enumerate(zip(group, segs, strict=True)):
            outs[i] = out[j:j + 1, :, :s.length]
    ctx.new[layer] = (key, value)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # [1, H, L, d]
    return out.transpose(1, 2), None


def sibling_groups(segments: list[Segment]) -> list[list[int]]:
    """Segments of a row grouped by their ancestor list, in order of first appearance. Siblings run as
    one batch when padding them to the longest wastes at most half the work; others one by one.

    >>> segs = [Segment(0, 4, [0]), Segment(4, 3, [0]), Segment(7, 9, [1]), Segment(16, 1, [0])]
    >>> sibling_groups(segs)   # [0] holds lengths 4, 3, 1: 8 of 12 padded tokens used; [1] alone
    [[0, 1, 3], [2]]
    """
    by_ancestors: dict[tuple[int, ...], list[int]] = {}
    for i, seg in enumerate(segments):
        by_ancestors.setdefault(tuple(seg.ancestors), []).append(i)
    groups: list[list[int]] = []
    for idx in by_ancestors.values():
        lengths = [segments[i].length for i in idx]
        if len(idx) > 1 and 2 * sum(lengths) >= len(idx) * max(lengths):
            groups.append(idx)
        else:
            groups += [[i] for i in idx]
    return groups


def _padded_batch(x: torch.Tensor, segs: list[Segment], width: int) -> torch.Tensor:
    """[1, h, L, d] row -> [len(segs), h, width, d]: each segment's columns, zero-padded at the end."""
    return torch.cat([torch.nn.functional.pad(x[:, :, s.start:s.start + s.length], (0, 0, 0, width - s.length))
                      for s in segs], dim=0)


def register() -> str:
    """Register :func:`prefix_attention` with transformers (idempotent); return its name."""
    from transformers import AttentionInterface  # lazy: transformers (~3 s) only when radix registers it

    AttentionInterface.register(IMPLEMENTATION, prefix_attention)
    return IMPLEMENTATION
