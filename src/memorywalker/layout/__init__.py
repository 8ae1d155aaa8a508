"""Layouts: from trees and forests to the buffers a method runs on (token ids, position ids, the
attention pattern as Euler intervals, and targets with the position that predicts each one)."""

from memorywalker.layout.batch import Batch
from memorywalker.layout.buffers import Buffer, Piece, one_per_buffer, pack
from memorywalker.layout.layouts import (
    Layout,
    dfs_layout,
    full_views,
    logit_tree_layout,
    per_call_layout,
    rightmost_layout,
    sdcc_layout,
    tree_layout,
)

__all__ = [
    "Batch",
    "Buffer",
    "Layout",
    "Piece",
    "dfs_layout",
    "full_views",
    "logit_tree_layout",
    "one_per_buffer",
    "pack",
    "per_call_layout",
    "rightmost_layout",
    "sdcc_layout",
    "tree_layout",
]
