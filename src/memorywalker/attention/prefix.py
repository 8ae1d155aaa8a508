"""Attention against cached ancestors: the kernel of the shared-prefix (``radix``) schedule.

A chunk of a radix node attends to every key of its ancestors (all visible: they lie on its root path)
and causally to itself. No [L, L] mask is ever built:

    out = softmax([q·K_anc ; q·K_self + causal]) · [V_anc ; V_self]

is computed as one attention per key block — each ancestor block with no mask, the chunk itself with
``is_causal`` (queries and keys of equal length, so SDPA's top-left alignment is the right one) — and the
blocks are merged by their log-sum-exp, as FlashAttention merges its tiles and ring attention its
shards (Liu et al. 2023, https://arxiv.org/abs/2310.01889):

    lse = log Σ_b exp(lse_b),    out = Σ_b exp(lse_b − lse) · out_b

The backward runs the FlashAttention backward of each block with the *merged* output and log-sum-exp,
which gives exactly the gradient of the attention over the union of blocks (the softmax rows are
normalized by the merged ``lse``; ``D = rowsum(dO ∘ O)`` uses the merged ``O``).

On CPU the blocks run ATen's flash kernel (``_scaled_dot_product_flash_attention_for_cpu``): memory is
O(chunk · block), never [heads, L, L]. Elsewhere (CUDA, MPS) one SDPA call over the concatenated keys
with a [chunk, ancestors + chunk] mask is used, which CUDA's memory-efficient kernel runs without
materializing the scores.

Hugging Face models reach it through the attention interface: :func:`prefix_attention` is registered
under :data:`IMPLEMENTATION`, and the model forward receives the segments of its row and the cached
blocks as the keyword ``prefix_kv`` (a :class:`PrefixKV`), which transformers passes down to every
attention layer. Segments packed in one row never attend to each other (varlen packing without a mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


class _MergedFlash(torch.autograd.Function):
    """Attention of ``q`` over [ancestor blocks..., self (causal)], merged by log-sum-exp (CPU flash)."""

    @staticmethod
    def forward(ctx, scale: float, n_rep: int, q: torch.Tensor, *kv: torch.Tensor):
        B = q.shape[0]
        blocks = [(kv[i], kv[i + 1]) for i in range(0, len(kv), 2)]  # last one is the chunk itself
        acc = torch.promote_types(q.dtype, torch.float32)  # merge in at least fp32
        outs, lses = [], []
        for i, (k, v) in enumerate(blocks):
            causal = i == len(blocks) - 1
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, _rep(k, n_rep, B), _rep(v, n_rep, B), 0.0, causal, scale=scale)
            outs.append(o.to(acc))
            lses.append(lse.to(acc))  # [B, H, c]
        lse = torch.logsumexp(torch.stack(lses), dim=0)  # merged normalizer
        out = sum(o * torch.exp(l_b - lse)[..., None] for o, l_b in zip(outs, lses, strict=True))
        out = out.to(q.dtype)
        ctx.scale, ctx.n_rep = scale, n_rep
        ctx.save_for_backward(q, out, lse, *kv)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, out, lse, *kv = ctx.saved_tensors
        B = q.shape[0]
        grad_out = grad_out.contiguous()
        dq = torch.zeros_like(q, dtype=torch.promote_types(q.dtype, torch.float32))
        dkv = []
        n = len(kv) // 2
        for i in range(n):
            k, v = kv[2 * i], kv[2 * i + 1]
            causal = i == n - 1
            # The merged out/lse make each block's P = exp(q·k·scale − lse) its share of the full softmax.
            g_q, g_k, g_v = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out, q, _rep(k, ctx.n_rep, B), _rep(v, ctx.n_rep, B), out, lse, 0.0, causal, scale=ctx.scale)
            dq += g_q
            dkv += [_unrep(g_k, ctx.n_rep, k.shape[0]).to(k.dtype), _unrep(g_v, ctx.n_rep, v.shape[0]).to(v.dtype)]
        return None, None, dq.to(q.dtype), *dkv


def _masked_sdpa(q, k_self, v_self, ancestors, scale: float, n_rep: int) -> torch.Tensor:
    """Any device: one SDPA over [ancestors ; self] with a [c, A + c] mask (all ancestors, causal self)."""
    B, c = q.shape[0], q.shape[2]
    if not ancestors:  # a root segment: plain causal attention (flash / memory-efficient kernels, no mask)
        return torch.nn.functional.scaled_dot_product_attention(
            q, _rep(k_self, n_rep, B), _rep(v_self, n_rep, B), is_causal=True, scale=scale)
    keys = torch.cat([_rep(k, n_rep, B) for k, _ in ancestors] + [_rep(k_self, n_rep, B)], dim=2)
    values = torch.cat([_rep(v, n_rep, B) for _, v in ancestors] + [_rep(v_self, n_rep, B)], dim=2)
    a = keys.shape[2] - c
    idx = torch.arange(c, device=q.device)
    mask = torch.ones(c, a + c, dtype=torch.bool, device=q.device)
    mask[:, a:] = idx[None, :] <= idx[:, None]
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)


def attend(q: torch.Tensor, k_self: torch.Tensor, v_self: torch.Tensor,
           ancestors: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """q [B, H, c, d], k/v_self [B, Hkv, c, d], ancestor blocks [1, Hkv, n_b, d] -> out [B, H, c, d]."""
    n_rep = q.shape[1] // k_self.shape[1]
    if q.device.type == "cpu":
        flat = [t for kv in ancestors for t in kv] + [k_self, v_self]
        return _MergedFlash.apply(scale, n_rep, q.contiguous(), *flat)
    return _masked_sdpa(q, k_self, v_self, ancestors, scale, n_rep)


# Ancestor blocks shorter than this are concatenated into runs of at most this many keys: one kernel
# call per run instead of one per small radix node. Longer blocks are attended in place (no copy).
COALESCE_KEYS = 2048


def coalesce(blocks: list[tuple[torch.Tensor, torch.Tensor]], limit: int = COALESCE_KEYS
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Concatenate runs of short (key, value) blocks (differentiably) into blocks of at most ``limit`` keys."""
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    run: list[tuple[torch.Tensor, torch.Tensor]] = []
    size = 0

    def flush():
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append((torch.cat([k for k, _ in run], dim=2), torch.cat([v for _, v in run], dim=2)))

    for k, v in blocks:
        n = k.shape[2]
        if n >= limit or size + n > limit:
            flush()
            run, size = [], 0
        if n >= limit:
            out.append((k, v))
        else:
            run.append((k, v))
            size += n
    flush()
    return out


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
        raise ValueError("the radix schedule supports full causal attention without soft-capping; "
                         f"{type(module).__name__} uses a sliding window or soft-capping")
    if dropout:
        raise ValueError("attention dropout is not supported by the radix schedule (set attention_dropout=0)")
    layer = module.layer_idx
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    outs = []
    for seg in ctx.segments:
        cols = slice(seg.start, seg.start + seg.length)
        ancestors = coalesce([ctx.blocks[i][layer] for i in seg.ancestors])
        outs.append(attend(query[:, :, cols], key[:, :, cols], value[:, :, cols], ancestors, scale))
    ctx.new[layer] = (key, value)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # [1, H, L, d]
    return out.transpose(1, 2), None


def register() -> str:
    """Register :func:`prefix_attention` with transformers (idempotent); return its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, prefix_attention)
    return IMPLEMENTATION
