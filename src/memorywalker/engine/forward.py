"""One model forward over one buffer: per-target log-probabilities and, where asked, full logits."""

from __future__ import annotations

import numpy as np
import torch

from memorywalker.attention.masks import Backend, pad_length
from memorywalker.layout.buffers import Buffer


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def forward_buffer(model, buf: Buffer, labels: torch.Tensor, backend: Backend
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``model`` on ``buf``; return (log p(label) per buffer target [M] float32, logits at the
    buffer's KL positions [J, V] or None).

    ``labels`` int64 [M] are the target token ids (aligned to ``buf.target_row``). Logits are computed
    only at the positions that predict something (``logits_to_keep``), the softmax in float32.
    """
    device, dtype = model_device(model), model_dtype(model)
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
    out = model(
        input_ids=ids.to(device),
        position_ids=pos.to(device),  # tree depth / packed positions: with the explicit 4D mask below
        attention_mask=backend.build(tout, dtype),
        logits_to_keep=torch.from_numpy(keep).to(device),
        use_cache=False,
    )
    logits = out.logits[0]  # [P, V]
    m = len(buf.target_pred)
    t_idx = torch.from_numpy(inv[:m]).to(device)
    lse = torch.logsumexp(logits.float(), dim=-1)  # [P]
    logprob = logits[t_idx, labels.to(device)].float() - lse[t_idx]  # log p(y) = z_y − logsumexp(z)
    kl_logits = logits[torch.from_numpy(inv[m:]).to(device)] if len(buf.kl_pred) else None
    return logprob, kl_logits
