"""Forwards over a layout: per-target log-probabilities and, where asked, the hidden states whose
distributions a KL term or a drift metric needs (never [targets, V] logits: :mod:`memorywalker.engine.head`).

:func:`forward_layout` is the one place a layout meets a model; the engine (training), ``gap`` and
``bench`` all go through it. Each buffer runs its method's schedule (``engine/methods.py``): the
shared-prefix ``radix`` schedule, or one masked forward (:func:`forward_masked`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from memorywalker.attention.masks import Backend, backend_of, pad_length
from memorywalker.engine.head import OutputHead, capture_hidden, check_head_logits, target_logprobs
from memorywalker.engine.methods import Method
from memorywalker.engine.radix import forward_radix
from memorywalker.layout.buffers import Buffer
from memorywalker.layout.layouts import Layout


def dtype_of(model) -> torch.dtype:
    return next(model.parameters()).dtype


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def forward_masked(model, buf: Buffer, labels: torch.Tensor, backend: Backend, temperature: float = 1.0,
                   head: OutputHead | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``model`` on ``buf`` in one forward under its explicit ancestor mask; return (log p(label)
    per buffer target [M] float32, hidden states at the buffer's KL positions [J, H] or None).

    ``labels`` int64 [M] are the target token ids (aligned to ``buf.target_row``). The head runs only at
    the positions that predict something, a chunk of them at a time (:mod:`memorywalker.engine.head`),
    in float32, of the logits divided by ``temperature`` (the distribution a sampler at that
    temperature drew from).
    """
    device = model_device(model)
    head = head or OutputHead.of(model)
    n = len(buf)
    L = pad_length(n, backend.multiple)
    ids = torch.zeros(1, L, dtype=torch.long)
    pos = torch.zeros(1, L, dtype=torch.long)
    tout = torch.arange(1, L + 1, dtype=torch.long)[None]  # padding: each pad token sees itself only
    ids[0, :n] = torch.from_numpy(buf.token_ids)
    pos[0, :n] = torch.from_numpy(buf.position_ids)
    tout[0, :n] = torch.from_numpy(buf.tout)
    keep, inv = np.unique(np.concatenate([buf.target_pred, buf.kl_pred]), return_inverse=True)
    tout = tout.to(device)
    with capture_hidden(model, head) as cap:
        out = model(
            input_ids=ids.to(device),
            position_ids=pos.to(device),  # tree depth / packed positions: with the explicit 4D mask below
            attention_mask=backend.build(tout, dtype_of(model)),
            logits_to_keep=torch.from_numpy(keep).to(device),
            use_cache=False,
        )
    hidden = cap.hidden[0]  # [P, H] at the predicting positions
    check_head_logits(head, hidden, out.logits)
    m = len(buf.target_pred)
    logprob = target_logprobs(head, hidden[torch.from_numpy(inv[:m]).to(device)], labels.to(device),
                              temperature=temperature)
    kl_hidden = hidden[torch.from_numpy(inv[m:]).to(device)] if len(buf.kl_pred) else None
    return logprob, kl_hidden


@dataclass
class BufferOutput:
    buffer: Buffer
    logprob: torch.Tensor  # float32 [M] log p(label) of the buffer's targets (aligned to buffer.target_row)
    kl_hidden: torch.Tensor | None  # [J, H] hidden states at the buffer's KL positions (the head's input)
    forwards: int  # model forwards this buffer took
    tokens: int  # tokens those forwards processed (a masked buffer: padded to the backend's multiple)


def forward_layout(model, layout: Layout, labels: torch.Tensor, method: Method, max_tokens: int,
                   backend: Backend | None = None, temperature: float = 1.0, checkpoint_chunks: bool = False
                   ) -> Iterator[BufferOutput]:
    """Run every buffer of ``layout`` under ``method``'s schedule, one at a time (the caller may
    backpropagate each before the next is built). ``labels`` int64 [N] are the batch targets' label ids;
    ``backend`` is the attention backend of the ``mask`` schedule (default: the model's); logprobs are
    of the logits divided by ``temperature``. ``checkpoint_chunks``: the radix schedule recomputes each
    forward's layers in the backward (:func:`memorywalker.engine.radix.forward_radix`)."""
    device = model_device(model)
    head = OutputHead.of(model)
    labels = labels.to(device)
    if method.schedule == "mask":
        backend = backend or backend_of(model)
    for buf in layout.buffers:
        rows = torch.from_numpy(buf.target_row).to(device)
        if method.schedule == "mask" and len(buf) <= max_tokens:
            lp, kl = forward_masked(model, buf, labels[rows], backend, temperature, head)
            yield BufferOutput(buf, lp, kl, 1, pad_length(len(buf), backend.multiple))
        else:  # the radix schedule; for "mask", a tree longer than max_tokens (never one dense buffer)
            lp, kl, stats = forward_radix(model, buf, labels[rows], max_tokens, temperature, head=head,
                                          checkpoint_chunks=checkpoint_chunks)
            yield BufferOutput(buf, lp, kl, stats["forwards"], stats["tokens"])
