"""What ``memorywalker inspect`` reports: the cost and the supervision of each training method.

Per trajectory (its own :class:`ConditioningTree`) and in total:

* ``calls`` T, ``evictions`` K (white-box records), ``segments`` (K+1 when every branch is an eviction);
* ``unique_tokens`` U — tokens of the tree, what ``tree-mask`` processes;
* ``per_call_tokens`` P — Σ_t |S_t|, what ``per-call`` processes;
* ``logit_tree_tokens`` L — Σ over segments of the segment's longest |S_t|, what ``logit-tree`` processes;
* ``tokens_by_role`` over the U tree tokens and ``observation_share`` = tool tokens / U;
* ``targets`` (rows of the targets table), ``target_positions`` (distinct buffer positions) and
  ``target_share`` = target_positions / U;
* ``dilution`` = causal prediction terms / target_positions, where an unmasked loss over the tree
  buffer has U − roots prediction terms (every token but a root's first is predicted);
* ``rightmost_lost_targets`` — targets of selected calls whose response tokens are not found in the
  final call's sequence, so the rightmost-path baseline never trains them (its layout's own rule);
* ``zero_target_calls`` by reason.

Occupancy for ``max_length`` N over all trees: ``padded`` = Σ U_i / (rows · N) with one tree per row;
``packed`` = Σ U_i / (bins · N) with first-fit-decreasing bins of capacity N; trees longer than N fit
neither and are counted in ``overlong``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import binpacking

from memorywalker.layout.batch import Batch
from memorywalker.layout.layouts import rightmost_layout
from memorywalker.render.types import ROLES, RenderedTrajectory
from memorywalker.tree.tree import ConditioningTree


@dataclass
class TreeStats:
    id: str
    calls: int = 0
    evictions: int = 0
    segments: int = 0
    unique_tokens: int = 0
    per_call_tokens: int = 0
    logit_tree_tokens: int = 0
    roots: int = 0
    tokens_by_role: dict[str, int] = field(default_factory=dict)
    targets: int = 0
    target_positions: int = 0
    rightmost_lost_targets: int = 0
    zero_target_calls: dict[str, int] = field(default_factory=dict)

    # --- derived ratios (None when the denominator is 0) ---
    @property
    def p_over_u(self) -> float | None:
        return _ratio(self.per_call_tokens, self.unique_tokens)

    @property
    def l_over_u(self) -> float | None:
        return _ratio(self.logit_tree_tokens, self.unique_tokens)

    @property
    def observation_share(self) -> float | None:
        return _ratio(self.tokens_by_role.get("tool", 0), self.unique_tokens)

    @property
    def target_share(self) -> float | None:
        return _ratio(self.target_positions, self.unique_tokens)

    @property
    def dilution(self) -> float | None:
        return _ratio(self.unique_tokens - self.roots, self.target_positions)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(p_over_u=self.p_over_u, l_over_u=self.l_over_u, observation_share=self.observation_share,
                 target_share=self.target_share, dilution=self.dilution)
        return d

    def add(self, other: TreeStats) -> None:
        for k in ("calls", "evictions", "segments", "unique_tokens", "per_call_tokens", "logit_tree_tokens",
                  "roots", "targets", "target_positions", "rightmost_lost_targets"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.tokens_by_role = dict(Counter(self.tokens_by_role) + Counter(other.tokens_by_role))
        self.zero_target_calls = dict(Counter(self.zero_target_calls) + Counter(other.zero_target_calls))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def tree_stats(rendered: RenderedTrajectory, tree: ConditioningTree | None = None) -> TreeStats:
    """Statistics of one trajectory's own tree (built here unless given)."""
    tree = tree or ConditioningTree.build([rendered])
    traj = rendered.trajectory
    segments = tree.segments(0)
    by_role = Counter(ROLES[r] for r in tree.role.tolist())
    positions = set(tree.targets.position.tolist())

    # The same rule the `rightmost` method trains with (a response is kept where its tokens are found
    # in the final S_T), so inspect and the engine never disagree on what the baseline loses.
    lost = int(rightmost_layout(Batch.from_trees([tree]), max_tokens=len(tree)).lost.sum())

    return TreeStats(
        id=traj.id,
        calls=len(traj.calls),
        evictions=len(traj.evictions),
        segments=len(segments),
        unique_tokens=len(tree),
        per_call_tokens=sum(len(rc.tokens) for rc in rendered.calls),
        logit_tree_tokens=sum(max(c.length for c in seg) for seg in segments),
        roots=tree.num_roots,
        tokens_by_role={r: by_role[r] for r in ROLES if by_role[r]},
        targets=len(tree.targets),
        target_positions=len(positions),
        rightmost_lost_targets=lost,
        zero_target_calls=dict(Counter(reason for _, reason in rendered.zero_target_calls)),
    )


@dataclass
class Occupancy:
    max_length: int
    trees: int
    overlong: int
    padded_rows: int
    packed_bins: int
    padded: float | None
    packed: float | None


def occupancy(sizes: Iterable[int], max_length: int) -> Occupancy:
    """Padded (one tree per row) vs first-fit-decreasing packed occupancy of rows of ``max_length``."""
    sizes = list(sizes)
    fit = [s for s in sizes if s <= max_length]
    used = sum(fit)
    bins = binpacking.to_constant_volume(dict(enumerate(fit)), max_length) if fit else []
    n_bins = sum(1 for b in bins if b)
    return Occupancy(
        max_length=max_length,
        trees=len(sizes),
        overlong=len(sizes) - len(fit),
        padded_rows=len(fit),
        packed_bins=n_bins,
        padded=_ratio(used, len(fit) * max_length),
        packed=_ratio(used, n_bins * max_length),
    )
