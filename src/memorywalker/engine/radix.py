"""The shared-prefix schedule: every radix node forwarded once, its descendants attending to its cached
keys/values (with grad); one backward through the whole buffer.

A buffer (a tree, a forest, packed chains) is cut into radix nodes — maximal runs without branching, read
off the Euler ends: a node starts at position 0, or where ``tout`` changes (inside a node every token has
the subtree of its last token). A node longer than ``max_tokens`` is cut into chunks, each the parent
of the next. The schedule:

* an item (a node or chunk) can run once its parent has: items are grouped by level (distance from
  their root), and each level is packed into forwards of at most ``max_tokens`` tokens. Items of one
  forward are segments of one row: each attends to its own ancestors' cached keys/values and causally
  to itself, never to a neighbour (varlen packing, no padding, no mask). The children of one parent
  (GRPO rollouts after a shared prompt, a retried call, the branches after a prune, separate roots of a
  packed buffer) thus share one forward;
* attention is :func:`memorywalker.attention.prefix.attend`: all cached ancestor keys plus causal
  attention inside the segment, merged by log-sum-exp. No [L, L] mask exists anywhere; memory grows
  linearly in the tokens;
* position ids are the buffer's (tree depth, so a node continues RoPE from its parent's depth).

A chain (per-call row, segment, full view, rightmost path) is one node: a plain causal pass, chunked
when long. The head runs only at the positions that predict a target, a chunk of targets at a time
(:mod:`memorywalker.engine.head`); with ``checkpoint_chunks`` each forward's activations are recomputed
in the backward and only the cached keys/values stay.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from memorywalker.attention.masks import attention_implementation
from memorywalker.attention.prefix import PrefixKV, Segment, register
from memorywalker.engine.head import OutputHead, capture_hidden, check_head_logits, target_logprobs
from memorywalker.layout.buffers import Buffer


@dataclass(frozen=True)
class Node:
    start: int  # first buffer position
    end: int  # one past the last
    parent: int  # index of the parent node, -1 for a root

    def __len__(self) -> int:
        return self.end - self.start


def radix_nodes(tout: np.ndarray) -> list[Node]:
    """Radix nodes of a buffer in depth-first order, from its Euler ends (``k <= q < tout[k]``).

    >>> [(n.start, n.end, n.parent) for n in radix_nodes(np.array([5, 5, 3, 5, 5]))]
    [(0, 2, -1), (2, 3, 0), (3, 5, 0)]
    """
    n = len(tout)
    if n == 0:
        return []
    starts = np.flatnonzero(np.r_[True, tout[1:] != tout[:-1]])
    ends = np.r_[starts[1:], n]
    nodes: list[Node] = []
    open_: list[int] = []  # stack of nodes whose subtree contains the current position
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        while open_ and tout[nodes[open_[-1]].start] <= s:
            open_.pop()
        nodes.append(Node(s, e, open_[-1] if open_ else -1))
        open_.append(len(nodes) - 1)
    return nodes


@dataclass(frozen=True)
class Item:
    """A unit of the schedule: a radix node, or one chunk of a node longer than ``max_tokens``."""

    start: int
    length: int
    parent: int  # index of the parent item, -1 for a root
    level: int  # distance from its root


def items_of(nodes: list[Node], max_tokens: int) -> list[Item]:
    """Nodes cut into chunks of at most ``max_tokens``; parents come before children."""
    items: list[Item] = []
    last_item: dict[int, int] = {}  # node -> its last chunk (what its children continue from)
    for i, nd in enumerate(nodes):
        parent = last_item[nd.parent] if nd.parent >= 0 else -1
        for s in range(nd.start, nd.end, max_tokens):
            level = items[parent].level + 1 if parent >= 0 else 0
            items.append(Item(s, min(max_tokens, nd.end - s), parent, level))
            parent = len(items) - 1
        last_item[i] = parent
    return items


def schedule(items: list[Item], max_tokens: int) -> list[list[int]]:
    """Forwards in dependency order: each a list of item indices, at most ``max_tokens`` tokens, every
    item's parent in an earlier forward. Level by level, items in buffer order, filled sequentially."""
    by_level: dict[int, list[int]] = defaultdict(list)
    for i, it in enumerate(items):
        by_level[it.level].append(i)
    forwards: list[list[int]] = []
    for level in sorted(by_level):
        row: list[int] = []
        used = 0
        for i in by_level[level]:
            if row and used + items[i].length > max_tokens:
                forwards.append(row)
                row, used = [], 0
            row.append(i)
            used += items[i].length
        if row:
            forwards.append(row)
    return forwards


def forward_radix(model, buf: Buffer, labels: torch.Tensor, max_tokens: int, temperature: float = 1.0, *,
                  head: OutputHead | None = None, checkpoint_chunks: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, int]]:
    """Run ``model`` over ``buf`` with the shared-prefix schedule.

    Returns (log p(label) per buffer target [M] float32, hidden states at the buffer's KL positions
    [J, H] or None, {"forwards", "tokens"}). ``labels`` int64 [M] align with ``buf.target_row``; logprobs
    are of the logits divided by ``temperature``, computed a chunk of targets at a time
    (:mod:`memorywalker.engine.head`).

    ``checkpoint_chunks``: each forward runs under a non-reentrant activation checkpoint. What it
    leaves behind for later forwards — its keys/values, the hidden states at its predicting positions —
    stays; everything else is recomputed in the backward, one forward at a time. Peak memory for a
    chain of U tokens is then about U x (K/V bytes per token, all layers) + one forward's activations.
    """
    device = next(model.parameters()).device
    head = head or OutputHead.of(model)
    config = _unwrap(model).config
    items = items_of(radix_nodes(buf.tout), max_tokens)
    forwards = schedule(items, max_tokens)
    n_layers = config.num_hidden_layers
    blocks: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = [None] * len(items)  # item -> per layer (k, v)
    ancestors: list[list[int]] = []  # item -> its ancestor items, root first
    for it in items:
        ancestors.append([] if it.parent < 0 else ancestors[it.parent] + [it.parent])
    preds = np.concatenate([buf.target_pred, buf.kl_pred])
    m = len(buf.target_pred)
    pred_order = np.argsort(preds, kind="stable")
    sorted_preds = preds[pred_order]
    picked: list[torch.Tensor] = []  # hidden states of predicting positions, forward by forward
    order: list[np.ndarray] = []  # which entries of ``preds`` each forward's hidden states answer
    impl = register()
    for row in forwards:
        segments, cols, entries, offset = [], [], [], 0
        for i in row:
            it = items[i]
            segments.append(Segment(offset, it.length, ancestors[i]))
            lo, hi = np.searchsorted(sorted_preds, [it.start, it.start + it.length])
            e = pred_order[lo:hi]  # predictions made inside this item
            entries.append(e)
            cols.append(preds[e] - it.start + offset)
            offset += it.length
        positions = np.concatenate([np.arange(items[i].start, items[i].start + items[i].length) for i in row])
        ids = torch.from_numpy(buf.token_ids[positions])[None].to(device)
        pos = torch.from_numpy(buf.position_ids[positions])[None].to(device)
        entries_a, cols_a = np.concatenate(entries), np.concatenate(cols)
        keep, col_idx = np.unique(cols_a, return_inverse=True)
        keep_t = torch.from_numpy(keep if len(keep) else np.zeros(1, np.int64)).to(device)

        def forward(ids=ids, pos=pos, keep_t=keep_t, segments=segments):
            # The prefix kernel and the head capture are entered here, so a checkpoint's recomputation in
            # the backward replays exactly these operations.
            with attention_implementation(config, impl), capture_hidden(model, head) as cap:
                ctx = PrefixKV(segments, blocks)
                out = model(input_ids=ids, position_ids=pos, prefix_kv=ctx, use_cache=False, logits_to_keep=keep_t)
            return cap.hidden[0], out.logits, [ctx.new[la] for la in range(n_layers)]

        if checkpoint_chunks and torch.is_grad_enabled():
            hidden, native, new = checkpoint(forward, use_reentrant=False)
        else:
            hidden, native, new = forward()
        if len(entries_a):
            picked.append(hidden[torch.from_numpy(col_idx).to(device)])
            order.append(entries_a)
        for seg, i in zip(segments, row, strict=True):
            cols_i = slice(seg.start, seg.start + seg.length)
            blocks[i] = [(k[:, :, cols_i], v[:, :, cols_i]) for k, v in new]
        check_head_logits(head, hidden, native)
    if picked:
        hidden = torch.cat(picked)  # [P, H] forward by forward
        inv = np.empty(len(preds), dtype=np.int64)
        inv[np.concatenate(order)] = np.arange(len(hidden))
    else:
        hidden = torch.zeros(0, 1, device=device)
        inv = np.zeros(0, dtype=np.int64)
    logprob = target_logprobs(head, hidden[torch.from_numpy(inv[:m]).to(device)], labels.to(device),
                              temperature=temperature)
    kl_hidden = hidden[torch.from_numpy(inv[m:]).to(device)] if len(buf.kl_pred) else None
    return logprob, kl_hidden, {"forwards": len(forwards), "tokens": len(buf)}


def _unwrap(model):
    return getattr(model, "module", model)
