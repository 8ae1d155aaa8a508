"""Pieces and buffers: what one model forward sees, and first-fit-decreasing packing.

A :class:`Piece` is one independent attention unit: a conditioning tree, one call's ``S_t``, a segment's
longest path, a full view. Its attention pattern is stored as Euler ends: position ``k`` is visible to
query ``q`` iff ``k <= q < tout[k]`` (a chain has ``tout[k] = n`` for every ``k``, i.e. a causal mask;
a tree has the ancestor mask). A :class:`Buffer` concatenates pieces with offsets, so pieces in one
buffer never attend to each other (their intervals are disjoint) and position ids restart at each piece.

Targets travel with the piece as (batch target row, position whose logits predict it, label): the
predicting position is the token's parent in the tree, not ``i - 1`` (DESIGN.md, label alignment).
``kl_row``/``kl_pred`` mark positions whose full next-token distribution is needed (SDCC).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import binpacking
import numpy as np

_I64 = np.int64


def _empty() -> np.ndarray:
    return np.empty(0, dtype=_I64)


@dataclass
class Piece:
    token_ids: np.ndarray  # int64 [n]
    position_ids: np.ndarray  # int64 [n] depth in the tree (0 at the root)
    tout: np.ndarray  # int64 [n] local Euler end: k visible to q iff k <= q < tout[k]
    target_row: np.ndarray = field(default_factory=_empty)  # int64 [m] row in the batch targets table
    target_pred: np.ndarray = field(default_factory=_empty)  # int64 [m] local position predicting it
    kl_row: np.ndarray = field(default_factory=_empty)  # int64 [j] row in the KL pairing table (sdcc)
    kl_pred: np.ndarray = field(default_factory=_empty)  # int64 [j] local position of that distribution

    def __len__(self) -> int:
        return len(self.token_ids)

    @classmethod
    def chain(cls, token_ids: np.ndarray, **targets) -> Piece:
        """A plain causal sequence (positions 0..n-1)."""
        n = len(token_ids)
        return cls(np.asarray(token_ids, dtype=_I64), np.arange(n, dtype=_I64), np.full(n, n, dtype=_I64), **targets)


@dataclass
class Buffer:
    """One forward's inputs: pieces concatenated (length ``L`` = the sum of their lengths)."""

    token_ids: np.ndarray  # int64 [L]
    position_ids: np.ndarray  # int64 [L]
    tout: np.ndarray  # int64 [L] buffer Euler ends
    target_row: np.ndarray  # int64 [M]
    target_pred: np.ndarray  # int64 [M] buffer position whose logits predict the target
    kl_row: np.ndarray  # int64 [J]
    kl_pred: np.ndarray  # int64 [J]
    pieces: int

    def __len__(self) -> int:
        return len(self.token_ids)

    @classmethod
    def concat(cls, pieces: Sequence[Piece]) -> Buffer:
        offsets = np.cumsum([0, *[len(p) for p in pieces]])[:-1]

        def cat(name: str, shift: bool) -> np.ndarray:
            parts = [getattr(p, name) + (o if shift else 0) for p, o in zip(pieces, offsets, strict=True)]
            return np.concatenate(parts).astype(_I64) if parts else _empty()

        return cls(
            token_ids=cat("token_ids", False),
            position_ids=cat("position_ids", False),
            tout=cat("tout", True),
            target_row=cat("target_row", False),
            target_pred=cat("target_pred", True),
            kl_row=cat("kl_row", False),
            kl_pred=cat("kl_pred", True),
            pieces=len(pieces),
        )

    def attention_mask(self) -> np.ndarray:
        """Dense boolean [L, L], ``mask[q, k]`` = q may attend k. O(L²): for tests and small buffers."""
        idx = np.arange(len(self))
        return (idx[None, :] <= idx[:, None]) & (idx[:, None] < self.tout[None, :])


def pack(pieces: Sequence[Piece], max_tokens: int) -> list[Buffer]:
    """Pack pieces into buffers of at most ``max_tokens`` tokens, largest first.

    Decreasing-size bin packing by ``binpacking.to_constant_volume`` (each piece goes to the
    least-loaded open buffer it fits in; a new buffer opens when none fits). A piece longer than
    ``max_tokens`` cannot be split without changing what its tokens see, so it gets a buffer of its own.
    """
    if not pieces:
        return []
    sizes = {i: len(p) for i, p in enumerate(pieces)}
    bins = binpacking.to_constant_volume(sizes, max_tokens)
    # Keep the pieces of a buffer in input order: deterministic and easy to read in a debugger.
    return [Buffer.concat([pieces[i] for i in sorted(b)]) for b in bins if b]


def one_per_buffer(pieces: Sequence[Piece]) -> list[Buffer]:
    return [Buffer.concat([p]) for p in pieces]
