"""The methods: how per-target log-probabilities are conditioned (DESIGN.md), one object each, one registry.

A :class:`Method` declares everything the engine, ``gap``, ``bench``, ``inspect``, the recipes, the demo
and the CLI need to know about it: its layout (which tokens each forward sees, where each target is
predicted from), its forward schedule, its backward schedule, its extra loss term and its exactness
class. Nothing else in the code lists method names.

Schedules (how one buffer of a layout is run, :func:`memorywalker.engine.forward.forward_layout`):

* ``radix`` — the shared-prefix schedule (:mod:`memorywalker.engine.radix`): every radix node once,
  descendants attending to its cached keys/values, long nodes in chunks of ``max_tokens``. A chain is
  one node, so per-call rows, segments, full views and the naive baselines are plain causal passes;
  no [L, L] mask is ever built.
* ``mask`` — one forward per packed buffer under the explicit ancestor mask of the model's attention
  backend (``sdpa`` dense bool, ``eager`` additive, ``flex`` a block-sparse BlockMask). A buffer
  longer than ``max_tokens`` (one tree that does not fit) runs the ``radix`` schedule instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memorywalker.errors import InputError
from memorywalker.layout.layouts import (
    Layout,
    dfs_layout,
    logit_tree_layout,
    per_call_layout,
    rightmost_layout,
    sdcc_layout,
    tree_layout,
)

if TYPE_CHECKING:
    from memorywalker.engine.config import EngineConfig

REFERENCE, EXACT, BOUNDED, NAIVE = "exact (reference)", "exact", "bounded (KL)", "naive"
SCHEDULES = ("radix", "mask")


def _no_options(cfg: EngineConfig) -> dict:
    return {}


@dataclass(frozen=True)
class Method:
    name: str
    layout: Callable[..., Layout]  # (batch, max_tokens, **layout_options(cfg)) -> Layout
    schedule: str  # one of SCHEDULES
    exactness: str  # REFERENCE | EXACT | BOUNDED | NAIVE
    summary: str  # one line: what its forwards see
    backward: str = "each"  # "each": one backward per buffer (memory) | "once": one for the micro-batch
    kl: bool = False  # SDCC: λ · mean KL(teacher ‖ student) is added to the loss
    full_view: bool = False  # trains on the uncompressed transcript: render with full_view=True
    layout_options: Callable[[EngineConfig], dict] = field(default=_no_options)

    @property
    def exact(self) -> bool:
        return self.exactness in (REFERENCE, EXACT)

    def build_layout(self, batch, cfg: EngineConfig) -> Layout:
        return self.layout(batch, cfg.max_tokens, **self.layout_options(cfg))


def _sdcc_options(cfg: EngineConfig) -> dict:
    return {"students": cfg.sdcc_students, "compressed_main": cfg.sdcc_compressed_main}


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("per-call", per_call_layout, "radix", REFERENCE,
           "one causal forward per model call over its own S_t"),
    Method("logit-tree", logit_tree_layout, "radix", EXACT,
           "one causal forward per segment, over the segment's longest S_t"),
    Method("radix", tree_layout, "radix", EXACT,
           "each radix node of the tree forwarded once; descendants attend to its cached keys/values"),
    Method("tree-mask", tree_layout, "mask", EXACT,
           "trees packed in one forward under the ancestor mask (position id = depth)"),
    Method("sdcc", sdcc_layout, "radix", BOUNDED,
           "full view for the main loss; each junction's S_t read off its tree (radix), KL(teacher || student)",
           backward="once", kl=True, full_view=True, layout_options=_sdcc_options),
    Method("dfs", dfs_layout, "radix", NAIVE,
           "the trie's tokens in depth-first order as one causal sequence"),
    Method("rightmost", rightmost_layout, "radix", NAIVE,
           "each trajectory's final S_T, assistant-only loss on what it still holds"),
)}
assert all(m.schedule in SCHEDULES for m in METHODS.values())


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}; valid: {list(METHODS)}") from None


def method_names(*, reference: bool = True) -> list[str]:
    """Registry order; ``reference=False`` leaves out the per-call reference (what gap/demo compare)."""
    return [m.name for m in METHODS.values() if reference or m.exactness != REFERENCE]


def parse_methods(text: str, *, reference: bool = True) -> tuple[str, ...]:
    """Comma-separated method names (a CLI option) in their order, without repeats; ``InputError`` naming
    the unknown ones. ``reference=False`` refuses the per-call reference."""
    valid = method_names(reference=reference)
    chosen = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in chosen if m not in valid]
    if not chosen or unknown:
        raise InputError(f"unknown methods {unknown}; valid: {valid}")
    return chosen


def needs_full_view(methods) -> bool:
    """Whether any of ``methods`` (names) trains on the full view (render with ``full_view=True``)."""
    return any(get_method(m).full_view for m in methods)
