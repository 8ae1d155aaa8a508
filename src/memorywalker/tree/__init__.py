"""ConditioningTree: token trie / forest of rendered calls, with Euler intervals and the targets table."""

from memorywalker.tree.segments import message_segments
from memorywalker.tree.tree import CallRow, ConditioningTree, Targets

__all__ = ["CallRow", "ConditioningTree", "Targets", "message_segments"]
