"""Attention masks for trees and packed buffers: dense bool (sdpa), additive float (eager), BlockMask (flex)."""

from memorywalker.attention.masks import (
    BACKENDS,
    FLEX_BLOCK,
    Backend,
    backend_of,
    dense_allowed,
    eager_mask,
    flex_mask,
    get_backend,
    pad_length,
    sdpa_mask,
    use_backend,
)

__all__ = [
    "BACKENDS",
    "FLEX_BLOCK",
    "Backend",
    "backend_of",
    "dense_allowed",
    "eager_mask",
    "flex_mask",
    "get_backend",
    "pad_length",
    "sdpa_mask",
    "use_backend",
]
