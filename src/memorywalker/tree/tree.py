"""ConditioningTree: the token trie of every rendered call ``S_t`` of one or more trajectories.

Buffer layout (../DESIGN.md, "Exact definitions"): tokens are stored once, in depth-first order with
children in order of first insertion (chronological). For buffer position ``i``:

* ``parent[i]`` — the position whose logits predict token ``i`` (``-1`` for a root);
  ``parent[i] == i - 1`` except at the first token of a node;
* ``depth[i]`` — the position id (0 at each root), equal to the token's index inside every ``S_t``
  that contains it;
* ``tout[i]`` — end (exclusive) of the Euler interval of the subtree under ``i``: position ``k`` is an
  ancestor-or-self of ``q`` iff ``k <= q < tout[k]``.

Radix nodes (maximal runs without branching) are ``node[i]``, with ``node_tin``/``node_tout`` in buffer
positions, so the ancestor mask is ``k <= q and node_tin[node(k)] <= node_tin[node(q)] < node_tout[node(k)]``.
Several trajectories (a GRPO group) form a *forest* merged at identical prefixes; trajectories whose
first tokens differ are separate roots that never attend to each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memorywalker.render.types import RenderedTrajectory


@dataclass(frozen=True)
class CallRow:
    """One call placed in the tree."""

    trajectory: int  # index of the trajectory in the forest
    index: int  # index of the call in its trajectory
    call_id: str
    end: int  # buffer position of the last token of S_t
    length: int  # |S_t|
    prompt_len: int
    segment: int  # segment index inside its trajectory
    selected: bool
    reason: str | None
    junction: bool  # first call of a segment > 0: right after a branch (an eviction or a rewrite)


@dataclass(frozen=True)
class Targets:
    """The targets table: one row per supervised token (a buffer position may carry several rows)."""

    position: np.ndarray  # int64 [N] buffer position of the supervised token
    label: np.ndarray  # int64 [N] its token id
    call: np.ndarray  # int64 [N] row in ConditioningTree.calls
    trajectory: np.ndarray  # int64 [N]
    weight: np.ndarray  # float32 [N]
    rollout_logprob: np.ndarray  # float32 [N], NaN where not recorded
    advantage: np.ndarray  # float32 [N]

    def __len__(self) -> int:
        return len(self.position)


class ConditioningTree:
    """Build with :meth:`build` from rendered trajectories (one = a tree, several = a forest)."""

    def __init__(self, token_ids, parent, depth, tout, role, node, node_tin, node_tout, calls, targets, ids):
        self.token_ids: np.ndarray = token_ids
        self.parent: np.ndarray = parent
        self.depth: np.ndarray = depth
        self.tout: np.ndarray = tout
        self.role: np.ndarray = role
        self.node: np.ndarray = node
        self.node_tin: np.ndarray = node_tin
        self.node_tout: np.ndarray = node_tout
        self.calls: list[CallRow] = calls
        self.targets: Targets = targets
        self.trajectory_ids: list[str] = ids

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_roots(self) -> int:
        return int((self.parent < 0).sum())

    # --- construction -----------------------------------------------------------------------------

    @classmethod
    def build(cls, rendered: Sequence[RenderedTrajectory]) -> ConditioningTree:
        # Per-token trie. Node 0 is a virtual super-root; node n >= 1 holds one token.
        children: list[dict[int, int]] = [{}]
        tok: list[int] = [-1]
        role: list[int] = [-1]
        paths: list[tuple[int, int, list[int]]] = []  # (trajectory, call index, trie node per token)
        for ti, rt in enumerate(rendered):
            for rc in rt.calls:
                cur, path = 0, []
                for t, r in zip(rc.tokens, rc.roles, strict=True):
                    nxt = children[cur].get(t)
                    if nxt is None:
                        nxt = len(tok)
                        children[cur][t] = nxt
                        children.append({})
                        tok.append(t)
                        role.append(r)  # the first call to deliver a token labels it
                    path.append(nxt)
                    cur = nxt
                paths.append((ti, rc.index, path))

        # Depth-first order, children in insertion (chronological) order.
        n = len(tok) - 1
        pos = np.full(len(tok), -1, dtype=np.int64)
        token_ids = np.empty(n, dtype=np.int64)
        parent = np.empty(n, dtype=np.int64)
        depth = np.empty(n, dtype=np.int64)
        tout = np.empty(n, dtype=np.int64)
        roles = np.empty(n, dtype=np.int8)
        stack: list[tuple[int, int, int, bool]] = [(c, -1, 0, False) for c in reversed(children[0].values())]
        i = 0
        while stack:
            trie, par, d, done = stack.pop()
            if done:
                tout[pos[trie]] = i
                continue
            pos[trie] = i
            token_ids[i], parent[i], depth[i], roles[i] = tok[trie], par, d, role[trie]
            i += 1
            stack.append((trie, -1, 0, True))
            for c in reversed(children[trie].values()):
                stack.append((c, pos[trie], d + 1, False))

        # Radix nodes: a new node starts at a root or where the parent is not the previous position
        # or the previous position branches.
        branching = np.zeros(n, dtype=bool)
        nchild = np.zeros(n, dtype=np.int64)
        np.add.at(nchild, parent[parent >= 0], 1)
        branching[:] = nchild > 1
        starts = np.ones(n, dtype=bool)
        if n:
            starts[1:] = (parent[1:] != np.arange(n - 1)) | branching[:-1]
        node = np.cumsum(starts) - 1
        node_tin = np.flatnonzero(starts)
        node_tout = tout[node_tin]  # the subtree of a node's first token is the node's subtree

        calls, targets = cls._place_calls(rendered, paths, pos, token_ids, tout)
        return cls(token_ids, parent, depth, tout, roles, node, node_tin, node_tout, calls, targets,
                   [rt.id for rt in rendered])

    @staticmethod
    def _place_calls(rendered, paths, pos, token_ids, tout):
        calls: list[CallRow] = []
        cols: dict[str, list] = {k: [] for k in ("position", "call", "trajectory", "logprob")}
        prev_end: dict[int, int] = {}
        segment: dict[int, int] = {}
        for ti, ci, path in paths:
            rc = rendered[ti].calls[ci]
            end = int(pos[path[-1]]) if path else -1
            first = ti not in prev_end
            if not first:
                p = prev_end[ti]
                extends = p <= end < tout[p]  # S_{t-1} is a prefix (root path) of S_t
                if not extends:
                    segment[ti] += 1
            else:
                segment[ti] = 0
                extends = False
            prev_end[ti] = end
            row = CallRow(ti, ci, rc.call_id, end, len(rc.tokens), rc.prompt_len, segment[ti],
                          rc.selected and bool(rc.targets), rc.reason, junction=not first and not extends)
            for t, lp in zip(rc.targets, rc.target_logprobs, strict=True):
                cols["position"].append(pos[path[t]])
                cols["call"].append(len(calls))
                cols["trajectory"].append(ti)
                cols["logprob"].append(np.nan if lp is None else lp)
            calls.append(row)
        position = np.asarray(cols["position"], dtype=np.int64)
        m = len(position)
        targets = Targets(
            position=position,
            label=token_ids[position] if m else np.empty(0, dtype=np.int64),
            call=np.asarray(cols["call"], dtype=np.int64),
            trajectory=np.asarray(cols["trajectory"], dtype=np.int64),
            weight=np.ones(m, dtype=np.float32),
            rollout_logprob=np.asarray(cols["logprob"], dtype=np.float32),
            advantage=np.zeros(m, dtype=np.float32),
        )
        return calls, targets

    # --- queries ----------------------------------------------------------------------------------

    def is_ancestor(self, k: int, q: int) -> bool:
        """True iff position ``k`` is an ancestor-or-self of position ``q`` (``q`` may attend ``k``)."""
        return k <= q < self.tout[k]

    def ancestor_mask(self) -> np.ndarray:
        """Dense boolean [U, U] mask, ``mask[q, k]`` = q may attend k. O(U²): for tests and small trees."""
        idx = np.arange(len(self))
        k, q = idx[None, :], idx[:, None]
        return (k <= q) & (q < self.tout[None, :])

    def root_path(self, end: int) -> np.ndarray:
        """Buffer positions from the root to ``end`` (inclusive): the layout of one ``S_t``."""
        out = []
        while end >= 0:
            out.append(end)
            end = int(self.parent[end])
        return np.asarray(out[::-1], dtype=np.int64)

    def calls_of(self, trajectory: int) -> list[CallRow]:
        return [c for c in self.calls if c.trajectory == trajectory]

    def segments(self, trajectory: int) -> list[list[CallRow]]:
        """Calls of one trajectory grouped into segments (maximal prefix-extending runs)."""
        segs: list[list[CallRow]] = []
        for c in self.calls_of(trajectory):
            if c.segment == len(segs):
                segs.append([])
            segs[c.segment].append(c)
        return segs

    def junctions(self, trajectory: int) -> list[CallRow]:
        return [seg[0] for seg in self.segments(trajectory)[1:]]

