"""A micro-batch: the trees (or GRPO forests) one engine call trains on, and their targets table.

The batch targets table is the concatenation of every tree's :class:`~memorywalker.tree.Targets`,
with ``call`` and ``trajectory`` renumbered to be unique inside the batch. Every method returns
per-target values aligned to it, whatever buffers it computed them in.

>>> batch = Batch.from_groups([[rendered_a], [rendered_b, rendered_c]])   # doctest: +SKIP
>>> len(batch.trees), batch.num_trajectories, len(batch.targets)          # doctest: +SKIP
(2, 3, 412)

A trainer that already holds token ids builds the same batch without records (:class:`TokenCall`): each
call is its delivered sequence ``S_t`` and where its response starts. A compaction is simply a call
whose ids do not extend the previous call's:

>>> calls = [TokenCall([1, 2, 3, 4], 3), TokenCall([1, 2, 3, 4, 5, 6], 5), TokenCall([1, 9, 7], 2)]
>>> b = Batch.from_token_ids([calls])
>>> len(b.trees[0]), len(b.targets), [c.segment for c in b.calls]      # 1 2 3 4 5 6 + 9 7; three targets
(8, 3, [0, 0, 1])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memorywalker.errors import InputError
from memorywalker.records.schema import Trajectory
from memorywalker.render.types import ROLE_ID, RenderedCall, RenderedTrajectory
from memorywalker.tree.tree import CallRow, ConditioningTree, Targets


@dataclass(frozen=True)
class TokenCall:
    """One model call as a trainer holds it: the delivered token ids ``S_t`` (context then response)."""

    token_ids: Sequence[int]
    response_start: int  # token_ids[response_start:] is the response
    targets: Sequence[int] | None = None  # trained positions in token_ids; default: the whole response
    rollout_logprobs: Sequence[float] | None = None  # the sampler's logprob of each target, when recorded

    def rendered(self, index: int) -> RenderedCall:
        ids = [int(t) for t in self.token_ids]
        if not 0 < self.response_start <= len(ids):
            raise InputError(f"call {index}: response_start {self.response_start} outside 1..{len(ids)}")
        targets = list(range(self.response_start, len(ids))) if self.targets is None else [int(t) for t in self.targets]
        if any(not 0 < t < len(ids) for t in targets):
            raise InputError(f"call {index}: a target position is outside 1..{len(ids) - 1} (position 0 has no context)")
        lps = [None] * len(targets) if self.rollout_logprobs is None else [float(x) for x in self.rollout_logprobs]
        if len(lps) != len(targets):
            raise InputError(f"call {index}: {len(lps)} rollout logprobs for {len(targets)} targets")
        roles = [ROLE_ID["context"]] * self.response_start + [ROLE_ID["assistant"]] * (len(ids) - self.response_start)
        return RenderedCall(index, f"call-{index}", ids, roles, self.response_start, targets, lps, bool(targets),
                            None if targets else "no_targets", span_method="recorded")


@dataclass
class Batch:
    trees: list[ConditioningTree]
    targets: Targets  # batch table: call/trajectory are batch-global ids
    target_tree: np.ndarray  # int64 [N] tree of each target
    calls: list[CallRow]  # batch-global call rows (tree order), ``targets.call`` indexes this list
    call_tree: np.ndarray  # int64 [C] tree of each call
    call_offset: np.ndarray  # int64 [len(trees)] first global call row of each tree
    trajectory_offset: np.ndarray  # int64 [len(trees)] first global trajectory id of each tree
    reward: np.ndarray  # float32 [T] reward per trajectory, NaN where absent
    group: np.ndarray  # int64 [T] tree (GRPO group) of each trajectory
    rendered: list[list[RenderedTrajectory]] | None = None  # per tree; sdcc reads their full views
    old_logprob: np.ndarray | None = None  # float32 [N]: logprobs of the policy before this update

    @property
    def num_trajectories(self) -> int:
        return len(self.reward)

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    @property
    def evictions(self) -> np.ndarray:
        """int64 [T]: branch points per trajectory (its segments minus one)."""
        out = np.zeros(self.num_trajectories, dtype=np.int64)
        for tree_i, tree in enumerate(self.trees):
            for c in tree.calls:
                t = self.trajectory_offset[tree_i] + c.trajectory
                out[t] = max(out[t], c.segment)
        return out

    # --- construction -----------------------------------------------------------------------------

    @classmethod
    def from_groups(cls, groups: Sequence[Sequence[RenderedTrajectory]]) -> Batch:
        """One tree per group: a single trajectory, or the rollouts of one task merged into a forest.

        For ``sdcc`` render them with ``full_view=True``.
        """
        trees = [ConditioningTree.build(list(g)) for g in groups]
        rewards = [[np.nan if rt.trajectory.reward is None else rt.trajectory.reward for rt in g] for g in groups]
        return cls.from_trees(trees, rewards=rewards, rendered=[list(g) for g in groups])

    @classmethod
    def from_token_ids(cls, episodes: Sequence[Sequence[TokenCall]], *, rewards: Sequence[float] | None = None,
                       groups: Sequence[Sequence[int]] | None = None, ids: Sequence[str] | None = None) -> Batch:
        """A batch from token ids: ``episodes[i]`` is one trajectory's calls in order. ``groups`` (lists
        of episode indices) merge episodes into one forest each (a GRPO group; default: one tree per
        episode); ``rewards`` [len(episodes)] for GRPO; ``ids`` name the trajectories."""
        ids = list(ids) if ids is not None else [f"episode-{i}" for i in range(len(episodes))]
        rendered = []
        for i, calls in enumerate(episodes):
            reward = None if rewards is None else float(rewards[i])
            traj = Trajectory(id=ids[i], messages=[], calls=[], reward=reward)
            rendered.append(RenderedTrajectory(traj, [c.rendered(k) for k, c in enumerate(calls)]))
        groups = [[i] for i in range(len(episodes))] if groups is None else groups
        return cls.from_groups([[rendered[i] for i in g] for g in groups])

    @classmethod
    def from_trees(cls, trees: Sequence[ConditioningTree], *, rewards: Sequence[Sequence[float]] | None = None,
                   rendered=None) -> Batch:
        trees = list(trees)
        n_traj = np.array([len(t.trajectory_ids) for t in trees], dtype=np.int64)
        n_call = np.array([len(t.calls) for t in trees], dtype=np.int64)
        traj_off = np.concatenate([[0], np.cumsum(n_traj)[:-1]]).astype(np.int64)
        call_off = np.concatenate([[0], np.cumsum(n_call)[:-1]]).astype(np.int64)
        cols = {k: [] for k in ("position", "label", "call", "trajectory", "weight", "rollout_logprob", "advantage")}
        tree_col = []
        for i, t in enumerate(trees):
            tg = t.targets
            cols["position"].append(tg.position)
            cols["label"].append(tg.label)
            cols["call"].append(tg.call + call_off[i])
            cols["trajectory"].append(tg.trajectory + traj_off[i])
            cols["weight"].append(tg.weight)
            cols["rollout_logprob"].append(tg.rollout_logprob)
            cols["advantage"].append(tg.advantage)
            tree_col.append(np.full(len(tg), i, dtype=np.int64))
        dtypes = {"weight": np.float32, "rollout_logprob": np.float32, "advantage": np.float32}
        cat = {k: np.concatenate(v).astype(dtypes.get(k, np.int64)) if v else np.empty(0, dtypes.get(k, np.int64))
               for k, v in cols.items()}
        if rewards is None:
            reward = np.full(int(n_traj.sum()), np.nan, dtype=np.float32)
        else:
            reward = np.asarray([r for g in rewards for r in g], dtype=np.float32)
        return cls(
            trees=trees,
            targets=Targets(**cat),
            target_tree=np.concatenate(tree_col) if tree_col else np.empty(0, np.int64),
            calls=[c for t in trees for c in t.calls],
            call_tree=np.repeat(np.arange(len(trees)), n_call),
            call_offset=call_off,
            trajectory_offset=traj_off,
            reward=reward,
            group=np.repeat(np.arange(len(trees)), n_traj),
            rendered=rendered,
        )

    def split(self, tree_groups: Sequence[Sequence[int]]) -> list[Batch]:
        """Micro-batches holding the given trees, with their target rows (weights, advantages, old
        logprobs as set on this batch). Trees are never split: a tree's targets stay together."""
        out = []
        for idx in tree_groups:
            idx = list(idx)
            rewards = [self.reward[self.group == i].tolist() for i in idx]
            rendered = [self.rendered[i] for i in idx] if self.rendered is not None else None
            sub = Batch.from_trees([self.trees[i] for i in idx], rewards=rewards, rendered=rendered)
            rows = np.concatenate([np.flatnonzero(self.target_tree == i) for i in idx]) if idx else np.empty(0, np.int64)
            sub.targets.weight[:] = self.targets.weight[rows]
            sub.targets.rollout_logprob[:] = self.targets.rollout_logprob[rows]
            sub.targets.advantage[:] = self.targets.advantage[rows]
            if self.old_logprob is not None:
                sub.old_logprob = self.old_logprob[rows]
            out.append(sub)
        return out
