"""Derived records keep their parent, transform and split."""

from __future__ import annotations

import pytest

from memorywalker.records import Task, TrajectoryBuilder, derive


def _traj(split="train"):
    b = TrajectoryBuilder("ep-7")
    b.call([b.message("user", "find it")], b.message("assistant", "found"))
    b.task = Task(id="q-7", split=split)
    return b.build()


def test_derived_record_lineage_and_split():
    child = derive(_traj(), "rename-tools", "2", index=3)
    assert child.id == "ep-7/rename-tools-3" and child.task.split == "train"
    assert (child.lineage.parent, child.lineage.relation) == ("ep-7", "derived")
    assert (child.lineage.transform, child.lineage.transform_version) == ("rename-tools", "2")
    with pytest.raises(ValueError, match="never cross splits"):
        derive(_traj(), "x", "1", task=Task(id="q-7", split="test"))
