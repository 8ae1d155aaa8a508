"""Layouts: packing, label alignment by tree parent, forests, the full view, lost targets."""

from __future__ import annotations

import numpy as np
import pytest

from engine_cases import no_eviction_batch, random_batch, random_groups
from memorywalker.engine import get_method
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.layout import (
    Batch,
    Piece,
    dfs_layout,
    logit_tree_layout,
    pack,
    per_call_layout,
    rightmost_layout,
    sdcc_layout,
    tree_layout,
)
from memorywalker.render import ROLE_ID
from memorywalker.render.fullview import full_view_messages


@pytest.fixture(scope="module")
def batch(renderer):
    return random_batch(renderer, seed=11)


def test_pack_first_fit_decreasing_within_max_tokens():
    rng = np.random.default_rng(0)
    sizes = rng.integers(5, 60, size=30)
    pieces = [Piece.chain(np.full(n, i), target_row=np.array([i]), target_pred=np.array([n - 2])) for i, n in enumerate(sizes)]
    buffers = pack(pieces, max_tokens=100)
    assert all(len(b) <= 100 for b in buffers)
    assert sorted(r for b in buffers for r in b.target_row) == list(range(30))  # each piece exactly once
    assert len(buffers) <= int(np.ceil(sizes.sum() / 100)) + 2  # near the volume bound
    for b in buffers:  # pieces of one buffer never attend to each other; positions restart per piece
        mask = b.attention_mask()
        owner = b.token_ids  # each piece's tokens carry the piece id
        assert not (mask & (owner[:, None] != owner[None, :])).any()
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        assert (b.position_ids[starts] == 0).all()
    big = pack([Piece.chain(np.zeros(150, dtype=np.int64)), pieces[0]], max_tokens=100)
    assert sorted(len(b) for b in big) == [sizes[0], 150]  # an oversized piece gets a buffer alone


def test_tree_mask_buffer_is_the_ancestor_mask_and_labels_follow_parents(batch):
    layout = tree_layout(batch, 1400)
    assert len(layout.buffers) < len(batch.trees)  # several trees share a buffer
    offset = 0
    tree_at = {}
    for buf in layout.buffers:
        start = 0
        mask = buf.attention_mask()
        for i, tree in enumerate(batch.trees):
            n = len(tree)
            if start + n <= len(buf) and np.array_equal(buf.token_ids[start:start + n], tree.token_ids) and i not in tree_at:
                tree_at[i] = (buf, start)
                np.testing.assert_array_equal(mask[start:start + n, start:start + n], tree.ancestor_mask())
                np.testing.assert_array_equal(buf.position_ids[start:start + n], tree.depth)
                start += n
        offset += len(buf)
    assert len(tree_at) == len(batch.trees)
    # Every target is predicted from the buffer position of its tree parent, whose token is the
    # token before it in its own call's S_t.
    for buf in layout.buffers:
        for row, pred in zip(buf.target_row, buf.target_pred, strict=True):
            i = batch.target_tree[row]
            tree = batch.trees[i]
            _, start = tree_at[i]
            p = batch.targets.position[row]
            assert pred == start + tree.parent[p]
            s_t = tree.token_ids[tree.root_path(batch.calls[batch.targets.call[row]].end)]
            assert buf.token_ids[pred] == s_t[tree.depth[p] - 1]
            assert s_t[tree.depth[p]] == batch.targets.label[row]


def test_forest_computes_a_shared_prompt_once(renderer):
    groups = random_groups(renderer, seed=12)
    forest = Batch.from_groups([groups[1]]).trees[0]
    singles = [Batch.from_groups([[rt]]).trees[0] for rt in groups[1]]
    assert forest.num_roots == 1
    assert len(forest) < sum(len(t) for t in singles)
    shared = len(singles[0]) + len(singles[1]) - len(Batch.from_groups([groups[1][:2]]).trees[0])
    assert shared > 20  # system prompt + task (+ the shared words) stored once
    pos, counts = np.unique(forest.targets.position, return_counts=True)
    multi = pos[counts > 1]
    assert len(multi) > 0  # positions carrying targets of several rollouts
    rows = np.flatnonzero(forest.targets.position == multi[0])
    assert len(set(forest.targets.trajectory[rows])) == len(rows)


def test_method_token_counts_and_passes(batch):
    per_call = per_call_layout(batch, 8192)
    logit_tree = logit_tree_layout(batch, 8192)
    tree = tree_layout(batch, 100_000)
    assert per_call.tokens == sum(c.length for c in batch.calls if c.selected)  # Σ |S_t|
    assert tree.tokens == sum(len(t) for t in batch.trees) and len(tree.buffers) == 1  # unique tokens
    assert tree.tokens < logit_tree.tokens < per_call.tokens
    assert len(logit_tree.buffers) == sum(int(k) + 1 for k in batch.evictions)  # K + 1 per trajectory
    for lay in (per_call, logit_tree, tree):  # every target exactly once
        rows = np.concatenate([b.target_row for b in lay.buffers])
        assert sorted(rows) == list(range(len(batch.targets)))


def test_dfs_shifts_labels_inside_the_buffer(batch):
    """dfs: the tree's DFS buffer under a causal mask, positions 0..n-1, label i predicted by i − 1."""
    one = batch.split([[0]])[0]
    (buf,) = dfs_layout(one, 100_000).buffers
    np.testing.assert_array_equal(buf.position_ids, np.arange(len(buf)))
    assert (buf.tout == len(buf)).all()  # causal
    (tree,) = tree_layout(one, 100_000).buffers
    np.testing.assert_array_equal(buf.token_ids, tree.token_ids)
    np.testing.assert_array_equal(buf.target_pred, one.targets.position - 1)
    moved = buf.target_pred != tree.target_pred  # first token of a node after a branch
    assert moved.any() and (buf.target_pred[~moved] == tree.target_pred[~moved]).all()


def test_rightmost_loses_evicted_responses_only(renderer, batch):
    lay = rightmost_layout(batch, 100_000)
    assert lay.lost.any() and (lay.weight[lay.lost] == 0).all()
    # A lost target's response does not appear in its trajectory's final S_T; a kept one does.
    for tree_i, tree in enumerate(batch.trees):
        for ti in range(len(tree.trajectory_ids)):
            last = [c for c in tree.calls if c.trajectory == ti][-1]
            final = tree.token_ids[tree.root_path(last.end)].tolist()
            rows = np.flatnonzero((batch.target_tree == tree_i) & (batch.targets.trajectory == batch.trajectory_offset[tree_i] + ti))
            for call in np.unique(batch.targets.call[rows]):
                r = rows[batch.targets.call[rows] == call]
                run = batch.targets.label[r].tolist()
                found = any(final[i:i + len(run)] == run for i in range(len(final) - len(run) + 1))
                assert found != lay.lost[r].all()
    plain = rightmost_layout(no_eviction_batch(renderer), 8192)
    assert not plain.lost.any()


def test_full_view_is_uncompressed_and_chronological(renderer):
    traj = synthetic_trajectory(SyntheticSpec(turns=6, evictions=3, words=5, seed=13), "fv")
    msgs = full_view_messages(traj)
    ids = [m.id for m in msgs]
    assert len(ids) == len(set(ids))
    assert not any(m.is_artifact for m in msgs)
    removed = {mid for ev in traj.evictions for mid in ev.removed}
    assert removed - {m.id for m in traj.messages if m.is_artifact} <= set(ids)  # evicted raw content is back
    responses = [c.response for c in traj.calls]
    assert [i for i in ids if i in responses] == responses  # each response once, in order
    batch = Batch.from_groups([[renderer.render(traj, full_view=True)]])
    lay = sdcc_layout(batch, 8192)
    assert not lay.lost.any() and not lay.unmatched_calls
    view = lay.buffers[0]
    for row, pred in zip(view.target_row, view.target_pred, strict=True):
        assert view.token_ids[pred + 1] == batch.targets.label[row]
    assert ROLE_ID["artifact"] not in set(renderer.render_messages(msgs, None)[1])


def test_unknown_method_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown method 'bfs'; valid: \['per-call', 'logit-tree', 'radix'"):
        get_method("bfs")
