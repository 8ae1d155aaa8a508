"""ConditioningTree: trie layout, Euler intervals, segments, targets and inspect statistics."""

from __future__ import annotations

import random

import numpy as np
import pytest

from memorywalker.metrics.tree_stats import occupancy, tree_stats
from memorywalker.records import TrajectoryBuilder
from memorywalker.render import ROLE_ID, RenderedCall, RenderedTrajectory, Renderer
from memorywalker.tree import ConditioningTree

SYS, USR, AST, TOOL, ART = (ROLE_ID[r] for r in ("system", "user", "assistant", "tool", "artifact"))


def rendered_from_tokens(tid, seqs, prompt_lens, roles=None, traj=None):
    """A RenderedTrajectory with explicit S_t (bypassing the tokenizer); targets = the response part."""
    if traj is None:
        b = TrajectoryBuilder(tid)
        s = b.message("system", "s")
        for _ in seqs:
            b.call([s], b.message("assistant", "a"))
        traj = b.build()
    calls = []
    for i, (seq, pl) in enumerate(zip(seqs, prompt_lens, strict=True)):
        calls.append(RenderedCall(index=i, call_id=traj.calls[i].id, tokens=list(seq),
                                  roles=list(roles[i]) if roles else [SYS] * len(seq), prompt_len=pl,
                                  targets=list(range(pl, len(seq))), target_logprobs=[None] * (len(seq) - pl),
                                  selected=True))
    return RenderedTrajectory(traj, calls)


def hand_trajectory():
    """Four calls, one summarize eviction before call 2 (messages mirror the token layout below)."""
    b = TrajectoryBuilder("hand")
    m0, m1 = b.message("system", "s"), b.message("user", "u")
    a0 = b.message("assistant", "a0")
    b.call([m0, m1], a0)
    a1 = b.message("assistant", "a1")
    b.call([m0, m1, a0], a1)
    summ = b.message("user", "summary", author="harness")
    a2 = b.message("assistant", "a2")
    b.call([m0, m1, summ], a2)
    a3 = b.message("assistant", "a3")
    b.call([m0, m1, summ, a2], a3)
    b.eviction("call-2", "summarize", removed=[a0, a1], inserted=[summ])
    traj = b.build()
    seqs = [
        [1, 2, 3, 4, 10, 11],
        [1, 2, 3, 4, 10, 11, 5, 6, 12, 13, 14],
        [1, 2, 3, 4, 7, 15, 16],
        [1, 2, 3, 4, 7, 15, 16, 8, 17],
    ]
    roles = [
        [SYS, SYS, USR, USR, AST, AST],
        [SYS, SYS, USR, USR, AST, AST, TOOL, TOOL, AST, AST, AST],
        [SYS, SYS, USR, USR, ART, AST, AST],
        [SYS, SYS, USR, USR, ART, AST, AST, TOOL, AST],
    ]
    return rendered_from_tokens("hand", seqs, [4, 8, 5, 8], roles, traj)


def test_hand_derived_statistics():
    """Tokens: shared [1,2,3,4]; branch A 10,11,5,6,12,13,14 (7); branch B 7,15,16,8,17 (5).

    U = 4 + 7 + 5 = 16; P = 6 + 11 + 7 + 9 = 33; segments {0,1},{2,3} → L = 11 + 9 = 20;
    P/U = 2.0625, L/U = 1.25. Roles over U: system 2, user 2, assistant 5 + 3 = 8, tool 3 (5,6,8),
    artifact 1 → observation share 3/16. Targets 2 + 3 + 2 + 1 = 8 distinct positions → share 8/16;
    dilution = (U − 1 root) / 8 = 1.875. The final call's context holds a2 but not a0, a1, so the
    rightmost path loses 2 + 3 = 5 targets.
    """
    st = tree_stats(hand_trajectory())
    assert (st.calls, st.evictions, st.segments) == (4, 1, 2)
    assert (st.unique_tokens, st.per_call_tokens, st.logit_tree_tokens) == (16, 33, 20)
    assert st.p_over_u == pytest.approx(2.0625) and st.l_over_u == pytest.approx(1.25)
    assert st.tokens_by_role == {"system": 2, "user": 2, "assistant": 8, "tool": 3, "artifact": 1}
    assert st.observation_share == pytest.approx(3 / 16)
    assert (st.targets, st.target_positions) == (8, 8)
    assert st.target_share == pytest.approx(0.5) and st.dilution == pytest.approx(1.875)
    assert st.rightmost_lost_targets == 5


def test_hand_tree_layout_and_segments():
    """DFS order: [1,2,3,4,10,11,5,6,12,13,14, 7,15,16,8,17]; token 7 (position 11) hangs off
    position 3; its subtree ends at 16; the prefix's subtree covers everything."""
    tree = ConditioningTree.build([hand_trajectory()])
    assert tree.token_ids.tolist() == [1, 2, 3, 4, 10, 11, 5, 6, 12, 13, 14, 7, 15, 16, 8, 17]
    assert tree.parent.tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 11, 12, 13, 14]
    assert tree.depth.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 4, 5, 6, 7, 8]
    assert tree.tout[3] == 16 and tree.tout[4] == 11 and tree.tout[11] == 16
    assert tree.node_tin.tolist() == [0, 4, 11] and tree.node_tout.tolist() == [16, 11, 16]
    assert [(c.segment, c.junction, c.end) for c in tree.calls] == [(0, False, 5), (0, False, 10),
                                                                     (1, True, 13), (1, False, 15)]
    assert [c.call_id for c in tree.junctions(0)] == ["call-2"]
    # Targets: the label is the token at the position; the logit comes from parent(position).
    t = tree.targets
    assert t.position.tolist() == [4, 5, 8, 9, 10, 12, 13, 15]
    assert t.label.tolist() == [10, 11, 12, 13, 14, 15, 16, 17]
    assert tree.parent[t.position].tolist() == [3, 4, 7, 8, 9, 11, 12, 14]


def random_trajectory(rng, tid, n_calls=6, vocab=6):
    """Calls that mostly extend the previous S_t and sometimes branch (an eviction) at a random depth."""
    seqs, prompt_lens = [], []
    cur = [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
    for _ in range(n_calls):
        if seqs and rng.random() < 0.4:
            cur = cur[: rng.randint(1, len(cur))] + [rng.randrange(vocab)]  # branch somewhere
        else:
            cur = cur + [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
        resp = [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
        seqs.append(cur + resp)
        prompt_lens.append(len(cur))
        cur = cur + resp
    return rendered_from_tokens(tid, seqs, prompt_lens)


def brute_force_ancestors(parent):
    n = len(parent)
    mask = np.zeros((n, n), dtype=bool)
    for q in range(n):
        k = q
        while k >= 0:
            mask[q, k] = True
            k = parent[k]
    return mask


@pytest.mark.parametrize("seed", range(30))
def test_euler_ancestor_test_equals_brute_force_walk(seed):
    rng = random.Random(seed)
    forest = [random_trajectory(rng, f"t{i}") for i in range(rng.randint(1, 3))]
    tree = ConditioningTree.build(forest)
    brute = brute_force_ancestors(tree.parent.tolist())
    assert (tree.ancestor_mask() == brute).all()
    # The radix-node form of the same test (DESIGN.md) agrees.
    n = len(tree)
    k, q = np.meshgrid(np.arange(n), np.arange(n))
    nk, nq = tree.node[k], tree.node[q]
    node_form = (k <= q) & (tree.node_tin[nk] <= tree.node_tin[nq]) & (tree.node_tin[nq] < tree.node_tout[nk])
    assert (node_form == brute).all()
    # Position id = depth; parent(i) = i − 1 except at the first token of a node.
    assert (tree.depth[tree.parent >= 0] == tree.depth[tree.parent[tree.parent >= 0]] + 1).all()
    not_first = np.ones(n, dtype=bool)
    not_first[tree.node_tin] = False
    assert (tree.parent[not_first] == np.arange(n)[not_first] - 1).all()


@pytest.mark.parametrize("seed", range(30))
def test_every_call_sequence_is_a_root_path(seed):
    rng = random.Random(100 + seed)
    forest = [random_trajectory(rng, f"t{i}") for i in range(rng.randint(1, 3))]
    tree = ConditioningTree.build(forest)
    for row in tree.calls:
        rc = forest[row.trajectory].calls[row.index]
        path = tree.root_path(row.end)
        assert tree.token_ids[path].tolist() == rc.tokens
        assert tree.depth[path].tolist() == list(range(len(rc.tokens)))
    # Each target sits on its call's path at the same index as in S_t.
    for pos, call in zip(tree.targets.position, tree.targets.call, strict=True):
        row = tree.calls[call]
        assert pos in set(tree.root_path(row.end).tolist())


def test_segments_follow_prefix_extension():
    """Segment boundaries are exactly where S_{t-1} is not a prefix of S_t."""
    rng = random.Random(7)
    for _ in range(20):
        rt = random_trajectory(rng, "t", n_calls=8)
        tree = ConditioningTree.build([rt])
        expect, seg = [0], 0
        for a, b in zip(rt.calls, rt.calls[1:], strict=False):
            seg += b.tokens[: len(a.tokens)] != a.tokens
            expect.append(seg)
        assert [c.segment for c in tree.calls] == expect


def test_forest_merges_identical_prefixes_and_separates_roots():
    """GRPO group: two rollouts share the prompt [1,2,3]; a third starts with 9 (own root).

    U = 3 shared + 2 + 2 + 3 = 10; the shared prompt is stored once; positions carry targets of
    their own trajectory only.
    """
    a = rendered_from_tokens("a", [[1, 2, 3, 4, 5]], [3])
    b = rendered_from_tokens("b", [[1, 2, 3, 6, 7]], [3])
    c = rendered_from_tokens("c", [[9, 2, 3]], [2])
    tree = ConditioningTree.build([a, b, c])
    assert len(tree) == 10 and tree.num_roots == 2
    assert tree.token_ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 9, 2, 3]
    assert not tree.ancestor_mask()[7:, :7].any()  # the third tree never sees the first two
    assert tree.targets.trajectory.tolist() == [0, 0, 1, 1, 2]


def test_identical_responses_in_a_group_share_positions_with_several_targets():
    a = rendered_from_tokens("a", [[1, 2, 3, 4]], [2])
    b = rendered_from_tokens("b", [[1, 2, 3, 4]], [2])
    tree = ConditioningTree.build([a, b])
    assert len(tree) == 4
    assert tree.targets.position.tolist() == [2, 3, 2, 3]
    assert tree.targets.trajectory.tolist() == [0, 0, 1, 1]


def test_occupancy_padded_vs_packed():
    """Trees of 16, 16, 10, 30 and 40 tokens in rows of 32: 40 is overlong. Padded: 72 / (4·32) =
    0.5625. FFD: [30] [16 16] [10] → 3 bins → 72 / 96 = 0.75."""
    occ = occupancy([16, 16, 10, 30, 40], 32)
    assert (occ.trees, occ.overlong, occ.padded_rows, occ.packed_bins) == (5, 1, 4, 3)
    assert occ.padded == pytest.approx(0.5625) and occ.packed == pytest.approx(0.75)


def test_real_rendering_builds_a_consistent_tree(tokenizer):
    """The bundled example: every S_t is a root path and segments = evictions + 1."""
    from memorywalker.cli.records_cmd import _example_path
    from memorywalker.records import read_trajectories

    renderer = Renderer(tokenizer)
    for traj in read_trajectories(_example_path()):
        rt = renderer.render(traj)
        tree = ConditioningTree.build([rt])
        for row, rc in zip(tree.calls, rt.calls, strict=True):
            assert tree.token_ids[tree.root_path(row.end)].tolist() == rc.tokens
        assert len(tree.segments(0)) == len(traj.evictions) + 1
