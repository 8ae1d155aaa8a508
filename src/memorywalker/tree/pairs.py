"""Preference pairs of trajectories: admission at an identical conditioning context, and the scored set.

A pair (chosen, rejected) is admitted only when both records branch from an identical conditioning
context: their first ``k`` calls deliver identical sequences ``S_t``, and call ``k`` of each has the
identical context (prompt tokens) — the records differ first inside the response of call ``k``, at
token ``branch_token``. Everything before that point conditions both sides identically, so in the
pair's conditioning tree (a forest of the two records, merged at identical prefixes) the branch is one
node with two children.

The **scored set** of each side is

* ``divergent`` (default): the targets after the branch — the targets of call ``k`` at positions
  ``>= branch_token`` and every target of the later calls;
* ``whole``: every target of the record. The shared targets before the branch carry the same logprob
  on both sides, so they cancel in the DPO margin (and in its gradient).

>>> from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group   # doctest: +SKIP
>>> w, l = [renderer.render(t) for t in synthetic_group(SyntheticSpec(turns=2, evictions=0), "g", 2)]  # doctest: +SKIP
>>> admit_pair(w, l).branch_call                                                # doctest: +SKIP
0
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import numpy as np

from memorywalker.errors import InputError
from memorywalker.render.types import RenderedTrajectory

ScoredSet = Literal["divergent", "whole"]
SCORED_SETS = ("divergent", "whole")


class PairRejected(InputError):
    """A pair that cannot be trained; the message says why."""


@dataclass(frozen=True)
class AdmittedPair:
    chosen: RenderedTrajectory
    rejected: RenderedTrajectory
    branch_call: int  # index of the first call whose S_t differs (identical context, different response)
    branch_token: int  # first token index inside that call's S_t where the two differ (>= prompt_len)
    scored: ScoredSet
    chosen_scored: dict[int, list[int]]  # call index -> target positions (into S_t) scored on the chosen side
    rejected_scored: dict[int, list[int]]

    @property
    def id(self) -> str:
        return f"{self.chosen.id}>{self.rejected.id}"

    def scored_of(self, side: int) -> dict[int, list[int]]:
        return self.chosen_scored if side == 0 else self.rejected_scored

    def num_scored(self, side: int) -> int:
        return sum(len(v) for v in self.scored_of(side).values())


def _first_diff(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def _scored(rt: RenderedTrajectory, branch_call: int, branch_token: int, scored: ScoredSet) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for rc in rt.calls:
        if scored == "whole" or rc.index > branch_call:
            keep = list(rc.targets)
        elif rc.index == branch_call:
            keep = [t for t in rc.targets if t >= branch_token]
        else:
            keep = []
        if keep:
            out[rc.index] = keep
    return out


def admit_pair(chosen: RenderedTrajectory, rejected: RenderedTrajectory, scored: ScoredSet = "divergent"
               ) -> AdmittedPair:
    """The admitted pair with its branch point and scored sets; raises :class:`PairRejected` with the
    reason when the records do not branch from an identical conditioning context."""
    if scored not in SCORED_SETS:
        raise InputError(f"unknown scored set {scored!r}; valid: {list(SCORED_SETS)}")
    cw, cl = chosen.calls, rejected.calls
    k = 0
    while k < min(len(cw), len(cl)) and cw[k].tokens == cl[k].tokens:
        k += 1
    if k == len(cw) and k == len(cl):
        raise PairRejected(f"{chosen.id} and {rejected.id} deliver identical calls: nothing to prefer")
    if k == len(cw) or k == len(cl):
        short = chosen.id if k == len(cw) else rejected.id
        raise PairRejected(f"no branch: every call of {short} is also a call of the other record "
                           f"(they differ only in calls after call {k - 1})")
    a, b = cw[k], cl[k]
    ctx_a, ctx_b = a.tokens[:a.prompt_len], b.tokens[:b.prompt_len]
    if ctx_a != ctx_b:
        j = _first_diff(ctx_a, ctx_b)
        raise PairRejected(f"contexts differ before the branch: call {k} ({a.call_id} of {chosen.id}, "
                           f"{b.call_id} of {rejected.id}) delivers different contexts from token {j}, "
                           "so the records do not branch from an identical conditioning context")
    branch = _first_diff(a.tokens, b.tokens)  # >= prompt_len: the contexts are identical
    pair = AdmittedPair(chosen, rejected, k, branch, scored,
                        _scored(chosen, k, branch, scored), _scored(rejected, k, branch, scored))
    for side, name in ((0, chosen.id), (1, rejected.id)):
        if not pair.num_scored(side):
            raise PairRejected(f"{name} has no selected target after the branch (call {k}, token {branch})")
    return pair


def scored_targets(batch, pairs: list[AdmittedPair]) -> tuple[np.ndarray, np.ndarray]:
    """For a batch built as ``Batch.from_groups([[p.chosen, p.rejected] for p in pairs])``: per batch
    target, whether it is scored (bool [N]) and its sequence id ``2·pair + side`` (int64 [N], side
    0 = chosen, 1 = rejected). A target is located by its call and its depth (= index inside ``S_t``)."""
    tg = batch.targets
    scored = np.zeros(len(tg), dtype=bool)
    seq = np.zeros(len(tg), dtype=np.int64)
    for r in range(len(tg)):
        tree_i = int(batch.target_tree[r])
        row = batch.calls[int(tg.call[r])]
        side = row.trajectory  # local to the pair's forest: 0 chosen, 1 rejected
        token = int(batch.trees[tree_i].depth[tg.position[r]])
        seq[r] = 2 * tree_i + side
        scored[r] = token in pairs[tree_i].scored_of(side).get(row.index, ())
    return scored, seq


# --- pair sources: a pairs file, or a preference rule over rollouts of one task -----------------------


def read_pairs(path) -> list[tuple[str, str]]:
    """``(chosen_id, rejected_id)`` per line of a JSONL file of ``{"chosen": ID, "rejected": ID}``.
    A malformed line raises ``InputError`` naming the file and the line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append((str(row["chosen"]), str(row["rejected"])))
            except (ValueError, KeyError, TypeError, RecursionError) as e:
                raise InputError(f"{path}:{n}: a pair is {{\"chosen\": ID, \"rejected\": ID}} ({e})") from None
    return out


def tool_calls(traj) -> int:
    """Tool calls the trajectory's responses made.

    >>> from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
    >>> tool_calls(synthetic_trajectory(SyntheticSpec(turns=3, evictions=0), "t"))
    2
    """
    table = traj.message_table()
    return sum(len(table[c.response].tool_calls or []) for c in traj.calls)


def _solved(traj) -> bool:
    return traj.reward is not None and traj.reward >= 1.0


# rule(a, b) -> True when a is preferred over b. One lookup per choice.
PREFERENCE_RULES = {
    "reward": lambda a, b: (a.reward or 0.0) > (b.reward or 0.0),
    "fewer-tool-calls": lambda a, b: _solved(a) and _solved(b) and tool_calls(a) < tool_calls(b),
    "solved-then-fewer-tool-calls": lambda a, b: (_solved(a) and not _solved(b)) or (
        _solved(a) and _solved(b) and tool_calls(a) < tool_calls(b)),
}


def rule_pairs(trajectories, rule: str, *, max_pairs_per_task: int | None = None) -> list[tuple[str, str]]:
    """``(chosen_id, rejected_id)`` for every ordered pair of rollouts of one task (``task.group`` or
    ``task.id``) that ``rule`` (a name in :data:`PREFERENCE_RULES`) orders; in record order."""
    try:
        prefer = PREFERENCE_RULES[rule]
    except KeyError:
        raise InputError(f"unknown preference rule {rule!r}; valid: {list(PREFERENCE_RULES)}") from None
    groups: dict[str, list] = {}
    for t in trajectories:
        key = t.task.group or t.task.id if t.task is not None else None
        if key is not None:
            groups.setdefault(key, []).append(t)
    out = []
    for members in groups.values():
        found = []
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                if prefer(a, b):
                    found.append((a.id, b.id))
                elif prefer(b, a):
                    found.append((b.id, a.id))
        out += found[:max_pairs_per_task]
    return out
