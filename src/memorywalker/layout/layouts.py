"""Layouts: which tokens each forward sees, where each target's logits come from, and which targets a
layout cannot supervise (DESIGN.md, "Exact definitions"). Methods pick one (``engine/methods.py``).

=====================  =========================================================  ===================
layout                 pieces                                                     buffers
=====================  =========================================================  ===================
``per_call_layout``    each call's ``S_t`` (root path of its last token), causal  one per call
``logit_tree_layout``  each segment's longest path (its last call's ``S_t``)      one per segment
``tree_layout``        the whole tree, ancestor pattern, position id = depth      packed to max_tokens
``dfs_layout``         the tree's tokens in DFS order, causal, positions 0..n-1   packed to max_tokens
``rightmost_layout``   each trajectory's last ``S_T``, causal; targets found in   packed to max_tokens
``sdcc_layout``        full views (main loss), then each tree (its junctions'      packed to max_tokens
                       ``S_t`` are root paths in it: the KL students)
=====================  =========================================================  ===================

In every exact layout the target at tree position ``p`` is predicted from the position holding its
tree parent; ``dfs_layout`` shifts labels inside the buffer (``p - 1``) as a naive pipeline does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memorywalker.errors import InputError
from memorywalker.layout.batch import Batch
from memorywalker.layout.buffers import Buffer, Piece, one_per_buffer, pack
from memorywalker.render.fullview import FullView, find_run
from memorywalker.render.types import ROLE_ID


@dataclass
class Layout:
    buffers: list[Buffer]  # one forward each, in this order
    weight: np.ndarray  # float32 [N] target weights the method trains with (0 where a target is lost)
    lost: np.ndarray  # bool [N] targets the method cannot supervise
    teacher_buffers: int = 0  # sdcc: buffers[:teacher_buffers] are full views, the rest students
    kl_call: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # int64 [J] batch call per KL row
    unmatched_calls: list[int] = field(default_factory=list)  # sdcc: batch calls missing from the full view

    @property
    def tokens(self) -> int:
        return int(sum(len(b) for b in self.buffers))


def _rows_by_call(batch: Batch) -> dict[int, np.ndarray]:
    calls = batch.targets.call
    order = np.argsort(calls, kind="stable")
    bounds = np.flatnonzero(np.diff(calls[order])) + 1
    return {int(calls[g[0]]): g for g in np.split(order, bounds) if len(g)}


def _layout(batch: Batch, buffers: list[Buffer], lost: np.ndarray | None = None, **kw) -> Layout:
    lost = np.zeros(len(batch.targets), dtype=bool) if lost is None else lost
    weight = np.where(lost, 0.0, batch.targets.weight).astype(np.float32)
    return Layout(buffers, weight, lost, **kw)


def per_call_layout(batch: Batch, max_tokens: int) -> Layout:
    """One causal forward per call over its own ``S_t`` (the reference)."""
    pos = batch.targets.position
    pieces = []
    for c, rows in _rows_by_call(batch).items():
        tree = batch.trees[batch.call_tree[c]]
        path = tree.root_path(batch.calls[c].end)
        pieces.append(Piece.chain(tree.token_ids[path], target_row=rows, target_pred=tree.depth[pos[rows]] - 1))
    return _layout(batch, one_per_buffer(pieces))


def logit_tree_layout(batch: Batch, max_tokens: int) -> Layout:
    """One causal forward per segment, over its last (longest) call's ``S_t``: each earlier call of the
    segment is a prefix of it, so its targets are read off the same forward."""
    pos = batch.targets.position
    by_call = _rows_by_call(batch)
    segments: dict[tuple[int, int, int], list[int]] = {}  # (tree, trajectory, segment) -> batch calls
    for g, c in enumerate(batch.calls):
        segments.setdefault((int(batch.call_tree[g]), c.trajectory, c.segment), []).append(g)
    pieces = []
    for (i, _, _), gcalls in segments.items():
        rows = [by_call[g] for g in gcalls if g in by_call]
        if not rows:
            continue
        rows = np.concatenate(rows)
        tree = batch.trees[i]
        path = tree.root_path(batch.calls[gcalls[-1]].end)
        pieces.append(Piece.chain(tree.token_ids[path], target_row=rows, target_pred=tree.depth[pos[rows]] - 1))
    return _layout(batch, one_per_buffer(pieces))


def _trajectory_calls(batch: Batch, i: int) -> list[list[int]]:
    """Batch call rows of each trajectory of tree ``i``, in call order."""
    tree = batch.trees[i]
    out: list[list[int]] = [[] for _ in tree.trajectory_ids]
    for j, c in enumerate(tree.calls):
        out[c.trajectory].append(int(batch.call_offset[i]) + j)
    return out


def _tree_piece(tree, **targets) -> Piece:
    """The whole tree as one piece: ancestor pattern (Euler ends), position id = depth."""
    return Piece(tree.token_ids, tree.depth, tree.tout, **targets)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _tree_rows(batch: Batch, i: int) -> np.ndarray:
    return np.flatnonzero(batch.target_tree == i)


def tree_layout(batch: Batch, max_tokens: int) -> Layout:
    """Each tree once, ancestor mask, position id = depth; trees packed into buffers of ``max_tokens``."""
    pos = batch.targets.position
    pieces = []
    for i, tree in enumerate(batch.trees):
        rows = _tree_rows(batch, i)
        pieces.append(_tree_piece(tree, target_row=rows, target_pred=tree.parent[pos[rows]]))
    return _layout(batch, pack(pieces, max_tokens))


def dfs_layout(batch: Batch, max_tokens: int) -> Layout:
    """Naive depth-first replay: the trie's tokens in DFS order under a plain causal mask, positions
    0..n-1, each label predicted by the previous buffer position. After a branch, tokens see the
    sibling branch (content the deployed model no longer saw)."""
    pos = batch.targets.position
    pieces = []
    for i, tree in enumerate(batch.trees):
        rows = _tree_rows(batch, i)
        pieces.append(Piece.chain(tree.token_ids, target_row=rows, target_pred=pos[rows] - 1))
    return _layout(batch, pack(pieces, max_tokens))


def rightmost_layout(batch: Batch, max_tokens: int) -> Layout:
    """Naive final-context training: each trajectory's last ``S_T`` with assistant-only loss.

    A call's response is supervised where it is found in ``S_T``: at its own tree positions when they
    lie on the final path, else as the same token run inside an assistant span of ``S_T`` (a response
    kept after a compression, now conditioned on what was written after it). Responses that are not
    in ``S_T`` (evicted) are lost.
    """
    pos = batch.targets.position
    by_call = _rows_by_call(batch)
    lost = np.zeros(len(batch.targets), dtype=bool)
    pieces = []
    for i, tree in enumerate(batch.trees):
        for gcalls in _trajectory_calls(batch, i):
            end = batch.calls[gcalls[-1]].end
            path = tree.root_path(end)
            assistant = tree.role[path] == ROLE_ID["assistant"]
            tokens = tree.token_ids[path]
            rows_all, preds, cursor = [], [], 0
            for g in gcalls:
                rows = by_call.get(g)
                if rows is None:
                    continue
                p = pos[rows]
                if np.all((p <= end) & (end < tree.tout[p])):  # on the final path: same positions
                    rows_all.append(rows)
                    preds.append(tree.depth[p] - 1)
                    continue
                run = tree.token_ids[p]
                hit = find_run(tokens[cursor:], run, assistant[cursor:])
                start = None if hit is None else cursor + hit
                if start is None:
                    start = find_run(tokens, run, assistant)
                if start is None or start == 0:
                    lost[rows] = True
                    continue
                rows_all.append(rows)
                preds.append(start + np.arange(len(rows)) - 1)
                cursor = start + len(rows)
            if rows_all:
                pieces.append(Piece.chain(tokens, target_row=np.concatenate(rows_all),
                                          target_pred=np.concatenate(preds)))
    return _layout(batch, pack(pieces, max_tokens), lost)


def full_views(batch: Batch) -> list[list[FullView]]:
    """The full view of every trajectory (per tree), built when it was rendered."""
    if batch.rendered is None or any(rt.full_view is None for g in batch.rendered for rt in g):
        raise ValueError("sdcc trains on the full view: render with renderer.render(traj, full_view=True) "
                         "and build the batch with Batch.from_groups")
    return [[rt.full_view for rt in g] for g in batch.rendered]


def sdcc_layout(batch: Batch, max_tokens: int, students: str = "junctions", compressed_main: bool = False) -> Layout:
    """Full views carry the main targets and the teacher rows; the students are the same response
    tokens of each junction call (``students="all"``: of each selected call) on its compressed ``S_t``.

    A call's ``S_t`` is the root path of its last token in the conditioning tree, so the students of
    one tree are read off one piece: the tree itself, each KL row predicted from its token's tree parent
    (as ``tree_layout`` predicts targets). The radix schedule runs a shared prefix once for all the
    students below it; each student's distribution is the one a forward over its own ``S_t`` gives (the
    exactness of the tree, tests/test_exact_reference.py). Full views and trees are packed into
    buffers of ``max_tokens`` (full views first: ``teacher_buffers``).

    KL pairing row ``k`` is the same response token in a full view (teacher) and in a student. A
    harness-side call (``purpose`` summarize/fold) has no place in the uncompressed history: its main
    loss is taken on its own ``S_t`` (read off the tree too) and it has no student. An abandoned call (a
    retry's first attempt) is not in the full view either: its teacher is its own sequence, the full
    view up to its context.

    ``compressed_main``: a student call's main loss is taken on its own compressed ``S_t`` (read off the
    tree, as the exact methods condition it) instead of the full view; its KL rows stay. The other calls
    keep the full view.
    """
    if students not in ("junctions", "all"):
        raise InputError(f"unknown students {students!r}; valid: ['all', 'junctions']")
    pos = batch.targets.position
    by_call = _rows_by_call(batch)
    views = full_views(batch)
    lost = np.zeros(len(batch.targets), dtype=bool)
    teachers, tree_pieces, kl_call, unmatched = [], [], [], []
    for i, tree in enumerate(batch.trees):
        student_rows, student_preds = [], []  # KL rows of this tree's students, their predicting positions
        tree_rows, tree_preds = [], []  # main-loss targets conditioned on their own S_t (harness calls)
        for view, gcalls in zip(views[i], _trajectory_calls(batch, i), strict=True):
            # teacher sequence -> (token ids, target rows, preds, kl rows, kl preds); -1 = the full view
            chains: dict[int, tuple[np.ndarray, list, list, list, list]] = {}
            for g in gcalls:
                c = batch.calls[g]
                rows = by_call.get(g)
                if rows is None:
                    continue
                if c.index in view.harness_calls:
                    # No uncompressed counterpart: the main loss conditions it on its own S_t, read off
                    # the tree like the students.
                    tree_rows.append(rows)
                    tree_preds.append(tree.parent[pos[rows]])
                    continue
                key, (ids, start) = ((c.index, view.abandoned[c.index]) if c.index in view.abandoned
                                     else (-1, (view.token_ids, view.response_start.get(c.index))))
                if start is None:
                    lost[rows] = True
                    unmatched.append(g)
                    continue
                _, rows_all, preds, kl_rows, kl_preds = chains.setdefault(key, (ids, [], [], [], []))
                pred = start + tree.depth[pos[rows]] - c.prompt_len - 1  # chain: parent = previous token
                student = c.junction or students == "all"
                if student and compressed_main:  # main loss on the context the call was delivered with
                    tree_rows.append(rows)
                    tree_preds.append(tree.parent[pos[rows]])
                else:
                    rows_all.append(rows)
                    preds.append(pred)
                if student:
                    k = len(kl_call) + np.arange(len(rows))
                    kl_call.extend([g] * len(rows))
                    kl_rows.append(k)
                    kl_preds.append(pred)
                    student_rows.append(k)
                    student_preds.append(tree.parent[pos[rows]])
            for ids, rows_all, preds, kl_rows, kl_preds in chains.values():
                kl = dict(kl_row=_cat(kl_rows), kl_pred=_cat(kl_preds)) if kl_rows else {}
                teachers.append(Piece.chain(ids, target_row=_cat(rows_all), target_pred=_cat(preds), **kl))
        if student_rows or tree_rows:
            tree_pieces.append(_tree_piece(tree, target_row=_cat(tree_rows), target_pred=_cat(tree_preds),
                                           kl_row=_cat(student_rows), kl_pred=_cat(student_preds)))
    teacher_buffers = pack(teachers, max_tokens)
    buffers = teacher_buffers + pack(tree_pieces, max_tokens)
    return _layout(batch, buffers, lost, teacher_buffers=len(teacher_buffers),
                   kl_call=np.asarray(kl_call, dtype=np.int64), unmatched_calls=unmatched)
