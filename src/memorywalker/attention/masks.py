"""Attention masks from Euler intervals, in the form each Hugging Face attention backend expects.

A buffer's attention pattern is ``tout`` [B, L]: key ``k`` is visible to query ``q`` iff
``k <= q < tout[b, k]`` (the ancestor mask of DESIGN.md; chains are causal; pieces packed in one buffer
have disjoint intervals so they never see each other; padding has ``tout[k] = k + 1``, itself only).

The mask is always passed explicitly as 4D, with the tree/packed position ids: transformers returns a
4D mask (tensor or BlockMask) untouched (``masking_utils._preprocess_mask_arguments``), whereas with
no mask it would read position-id resets as packed documents and build a block-causal mask — which is
not the ancestor mask.

* ``sdpa``  — dense bool [B, 1, L, L], True = attend (``torch.nn.functional.scaled_dot_product_attention``).
* ``eager`` — additive float [B, 1, L, L]: 0 = attend, ``finfo(dtype).min`` = blocked. Eager attention
  *adds* the mask to the scores (``attn_weights + attention_mask``); a bool mask there would add 0/1 and
  silently attend everywhere.
* ``flex``  — a FlexAttention ``BlockMask`` built block-sparse from per-block statistics of the Euler
  ends (full / partial / empty per 128 × 128 block, never L × L); its ``mask_mod`` evaluates the
  interval test inside partial blocks. Training needs CUDA: FlexAttention has no CPU backward; the CPU
  forward is supported and tested.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask

from memorywalker.errors import InputError

# FlexAttention's sparse block size. Buffers are padded to a multiple of it: with torch 2.13 the
# compiled CPU kernel returned wrong outputs for a length of 40 (correct at 128 and 256).
FLEX_BLOCK = 128


def dense_allowed(tout: torch.Tensor) -> torch.Tensor:
    """bool [B, L, L], ``allowed[b, q, k] = k <= q < tout[b, k]``."""
    L = tout.shape[-1]
    idx = torch.arange(L, device=tout.device)
    q, k = idx[:, None], idx[None, :]
    return (k <= q) & (q < tout[:, None, :])


def sdpa_mask(tout: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [B, 1, L, L] for SDPA (True = attend)."""
    return dense_allowed(tout)[:, None]


def eager_mask(tout: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float [B, 1, L, L] of ``dtype``: 0 where attending, the dtype's minimum elsewhere.

    Eager attention computes ``softmax(QK^T * scale + mask)``: the mask is ADDED, so it must be this
    additive float, not bool (a bool would be added as 0/1 and block nothing).
    """
    blocked = torch.zeros(tout.shape[0], 1, tout.shape[1], tout.shape[1], dtype=dtype, device=tout.device)
    return blocked.masked_fill_(~dense_allowed(tout)[:, None], torch.finfo(dtype).min)


def block_classes(tout: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Classify every (query block, key block) pair of ``tout`` [B, L] (L a multiple of ``block``) from
    per-block statistics of the Euler ends, without touching L × L. Returns bool [B, nQ, nK] ``partial``
    and ``full``; every other pair is empty.

    With query block ``i`` = [q0, q1) and key block ``j`` = [k0, k1), ``allowed(q, k) = k <= q < tout[k]``:

    * empty  — ``j > i`` (every key after every query), or ``max tout[Kj] <= q0`` (no key's subtree
      reaches the block: for ``j <= i`` a key k with ``tout[k] > q0`` is seen by ``q = max(k, q0)``);
    * full   — ``j < i`` and ``min tout[Kj] >= q1`` (every key precedes and covers every query);
    * partial otherwise (the diagonal, a block where some subtrees end).
    """
    B, L = tout.shape
    n = L // block
    blocks = tout.view(B, n, block)
    tmax, tmin = blocks.amax(-1), blocks.amin(-1)  # [B, nK]
    idx = torch.arange(n, device=tout.device)
    q0 = (idx * block)[None, :, None]  # [1, nQ, 1]
    q1 = q0 + block
    lower = idx[None, None, :] <= idx[None, :, None]  # j <= i
    strictly = idx[None, None, :] < idx[None, :, None]  # j < i
    reaches = tmax[:, None, :] > q0  # some key of j is an ancestor of some query of i
    full = strictly & (tmin[:, None, :] >= q1)
    partial = lower & reaches & ~full
    return partial, full


def _indices(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [B, nQ, nK] -> (count [B, 1, nQ], column indices [B, 1, nQ, nK]: selected first, in order)."""
    count = sel.sum(-1, dtype=torch.int32)
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count[:, None], order[:, None]


def flex_mask(tout: torch.Tensor, dtype: torch.dtype):
    """FlexAttention ``BlockMask`` with ``mask_mod(b, h, q, k) = k <= q < tout[b, k]``, built block-sparse
    straight from the Euler ends (:func:`block_classes`): full blocks skip the mask_mod, empty blocks are
    never visited, and nothing of size L × L is materialized (the block tables are (L/128)²).
    """
    B, L = tout.shape
    if L % FLEX_BLOCK:
        raise ValueError(f"flex buffers must be padded to a multiple of {FLEX_BLOCK} (got {L}); use pad_length")

    def ancestor(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < tout[b, kv_idx])

    partial, full = block_classes(tout, FLEX_BLOCK)
    kv_num, kv_idx = _indices(partial)
    full_num, full_idx = _indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=FLEX_BLOCK, mask_mod=ancestor,
                                    seq_lengths=(L, L))


@dataclass(frozen=True)
class Backend:
    name: str
    hf_implementation: str  # value of config._attn_implementation the mask is built for
    build: Callable[[torch.Tensor, torch.dtype], object]  # (tout [B, L], dtype) -> mask
    multiple: int = 1  # buffers are padded to a multiple of this


BACKENDS: dict[str, Backend] = {
    "sdpa": Backend("sdpa", "sdpa", sdpa_mask),
    "eager": Backend("eager", "eager", eager_mask),
    "flex": Backend("flex", "flex_attention", flex_mask, FLEX_BLOCK),
}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise InputError(f"unknown attention backend {name!r}; valid: {sorted(BACKENDS)}") from None


def backend_of(model) -> Backend:
    """The backend matching the model's current ``config._attn_implementation``."""
    impl = _unwrap(model).config._attn_implementation
    for b in BACKENDS.values():
        if b.hf_implementation == impl:
            return b
    raise InputError(f"model attention implementation {impl!r} takes no custom 4D mask here; "
                     f"use one of {[b.hf_implementation for b in BACKENDS.values()]}")


@contextmanager
def use_backend(model, name: str | None):
    """Run a block with the model on the attention implementation ``name``'s mask is built for (None: the
    model's own); yield the backend. The model's implementation is restored on exit, never changed
    silently for the caller."""
    if name is None:
        yield backend_of(model)
        return
    backend = get_backend(name)
    inner = _unwrap(model)
    saved = inner.config._attn_implementation
    if saved != backend.hf_implementation:
        inner.set_attn_implementation(backend.hf_implementation)
    try:
        yield backend
    finally:
        if inner.config._attn_implementation != saved:
            inner.set_attn_implementation(saved)


@contextmanager
def attention_implementation(config, impl: str):
    """Run a block with ``config._attn_implementation = impl``, restoring the previous one after."""
    saved = config._attn_implementation
    config._attn_implementation = impl
    try:
        yield
    finally:
        config._attn_implementation = saved


def pad_length(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


def _unwrap(model):
    return getattr(model, "module", model)  # DistributedDataParallel / FSDP wrappers
