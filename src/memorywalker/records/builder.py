"""TrajectoryBuilder: assemble a schema-v1 trajectory message by message (importers, rollouts, tests).

>>> b = TrajectoryBuilder("ep-0")
>>> s = b.message("system", "You are terse.")
>>> u = b.message("user", "2+2?")
>>> a = b.message("assistant", "4")
>>> _ = b.call([s, u], a)
>>> traj = b.build()
>>> [c.context for c in traj.calls], traj.calls[0].response
([['m0', 'm1']], 'm2')
"""

from __future__ import annotations

from typing import Any

from memorywalker.records.schema import (
    Call,
    Eviction,
    Lineage,
    Message,
    Task,
    ToolCall,
    ToolSchema,
    Trajectory,
)
from memorywalker.records.validate import check_trajectory


class TrajectoryBuilder:
    def __init__(self, trajectory_id: str, *, task: Task | None = None, lineage: Lineage | None = None,
                 tools: list[ToolSchema] | None = None, meta: dict[str, Any] | None = None):
        self.id = trajectory_id
        self.task = task
        self.lineage = lineage or Lineage()
        self.tools = list(tools or [])
        self.meta = dict(meta or {})
        self.messages: list[Message] = []
        self.calls: list[Call] = []
        self.evictions: list[Eviction] = []
        self.reward: float | None = None
        self.outcome: dict[str, Any] = {}

    def message(self, role: str, content: str = "", *, id: str | None = None,
                tool_calls: list[ToolCall | dict] | None = None, **fields: Any) -> str:
        """Add a message; return its id (``m<N>`` unless given)."""
        mid = id if id is not None else f"m{len(self.messages)}"
        tcs = [tc if isinstance(tc, ToolCall) else ToolCall(**tc) for tc in tool_calls or []]
        self.messages.append(Message(id=mid, role=role, content=content, tool_calls=tcs, **fields))
        return mid

    def call(self, context: list[str], response: str, **fields: Any) -> str:
        """Add a call whose delivered context is ``context`` (message ids, in order); return its id."""
        cid = fields.pop("id", None) or f"call-{len(self.calls)}"
        self.calls.append(Call(id=cid, context=list(context), response=response, **fields))
        return cid

    def eviction(self, before_call: str, kind: str, removed: list[str], inserted: list[str] | None = None,
                 **fields: Any) -> None:
        self.evictions.append(Eviction(before_call=before_call, kind=kind, removed=list(removed),
                                       inserted=list(inserted or []), **fields))

    def build(self, *, check: bool = True, vocab_size: int | None = None) -> Trajectory:
        traj = Trajectory(id=self.id, task=self.task, messages=self.messages, calls=self.calls,
                          evictions=self.evictions, tools=self.tools, reward=self.reward,
                          outcome=self.outcome, lineage=self.lineage, meta=self.meta)
        if check:
            check_trajectory(traj, vocab_size=vocab_size)
        return traj
