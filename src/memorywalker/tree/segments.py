"""Segments at message level: what the tree's segments are without a tokenizer.

A call extends the previous one when its context starts with the previous call's context and
response (same message ids, same order). Where the tokens render the same messages the same way this
is exactly :meth:`ConditioningTree.segments`; it is what ``export`` and ``view`` report when no
tokenizer is given.
"""

from __future__ import annotations

from memorywalker.records.schema import Trajectory


def message_segments(traj: Trajectory) -> list[int]:
    """Segment index of each call (0 for the first; +1 wherever a call does not extend the previous).

    >>> from memorywalker.records import TrajectoryBuilder
    >>> b = TrajectoryBuilder("t"); s = b.message("system", "s"); u = b.message("user", "u")
    >>> a0 = b.message("assistant", "a0"); a1 = b.message("assistant", "a1"); a2 = b.message("assistant", "a2")
    >>> _ = b.call([s, u], a0); _ = b.call([s, u, a0], a1); _ = b.call([s, u], a2)
    >>> message_segments(b.build(check=False))
    [0, 0, 1]
    """
    out: list[int] = []
    for i, call in enumerate(traj.calls):
        if i == 0:
            out.append(0)
            continue
        prev = traj.calls[i - 1]
        before = [*prev.context, prev.response]
        out.append(out[-1] + (call.context[: len(before)] != before))
    return out
