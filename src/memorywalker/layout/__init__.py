"""Layouts: from trees and forests to the buffers a method runs on (token ids, position ids, the
attention pattern as Euler intervals, and targets with the position that predicts each one)."""

from memorywalker.layout.batch import Batch
from memorywalker.layout.buffers import Buffer, Piece, one_per_buffer, pack
from memorywalker.layout.fullview import FullView, build_full_view, full_view_messages
from memorywalker.layout.methods import LAYOUTS, Layout, build_layout, full_views

__all__ = [
    "LAYOUTS",
    "Batch",
    "Buffer",
    "FullView",
    "Layout",
    "Piece",
    "build_full_view",
    "build_layout",
    "full_view_messages",
    "full_views",
    "one_per_buffer",
    "pack",
]
