"""Derived records: a trajectory made from another one by a data transform (augmentation, distillation,
DAgger relabelling, compiled QA, ...).

A derived record keeps its parent's id in ``lineage.parent``, names the transform and its version, and
keeps the parent's split (``task.split``): a derived record never crosses splits.

>>> from memorywalker.records import TrajectoryBuilder
>>> b = TrajectoryBuilder("ep-1"); _ = b.call([b.message("user", "hi")], b.message("assistant", "hello"))
>>> child = derive(b.build(), "strip-guidance", "1", index=0)
>>> child.id, child.lineage.parent, child.lineage.relation, child.lineage.transform
('ep-1/strip-guidance-0', 'ep-1', 'derived', 'strip-guidance')
"""

from __future__ import annotations

from typing import Any

from memorywalker.records.schema import Trajectory


def derive(parent: Trajectory, transform: str, version: str, *, index: int = 0, **update: Any) -> Trajectory:
    """A copy of ``parent`` with ``update`` applied (pydantic ``model_copy`` fields), id
    ``{parent.id}/{transform}-{index}``, lineage pointing at the parent, the parent's task (so its split)."""
    task = update.get("task")
    if task is not None and parent.task is not None and task.split != parent.task.split:
        raise ValueError(f"derived record of {parent.id!r} would move from split {parent.task.split!r} "
                         f"to {task.split!r}: derived records never cross splits")
    lineage = parent.lineage.model_copy(update={
        "parent": parent.id, "relation": "derived", "transform": transform, "transform_version": version,
    })
    return parent.model_copy(deep=True, update={"id": f"{parent.id}/{transform}-{index}", "lineage": lineage,
                                                **update})
