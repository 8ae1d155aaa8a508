"""Trajectory schema v1: one JSON object per line, one episode per object.

Vocabulary (../DESIGN.md): a :class:`Trajectory` holds a message table, the ordered :class:`Call` s
(each with the context *as delivered*, i.e. the message ids in the order they were sent), optional
white-box :class:`Eviction` s, a tool-schema table, the task, reward/outcome and lineage.

Example (abridged)::

    {"schema": "memorywalker.trajectory/v1", "id": "ep-0",
     "task": {"id": "q-17", "group": "q-17", "split": "train"},
     "messages": [{"id": "m0", "role": "system", "content": "You are ..."},
                  {"id": "m1", "role": "user", "content": "Who founded ...?"},
                  {"id": "m2", "role": "assistant", "content": "",
                   "tool_calls": [{"id": "c0", "name": "search", "arguments": {"query": "..."}}]}],
     "calls": [{"id": "call-0", "context": ["m0", "m1"], "response": "m2", "finish_reason": "tool_calls"}]}

Structural consistency (ids resolve, tool results follow their calls, token/logprob lengths agree)
is checked by :mod:`memorywalker.records.validate`, which turns every violation into a reason code.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = "memorywalker.trajectory/v1"

Role = Literal["system", "user", "assistant", "tool"]
# Who produced a message. ``harness`` marks compression artifacts (summaries, placeholders, memory
# keys, folded blocks): text the harness inserted that no model response or environment produced.
Author = Literal["system", "user", "model", "environment", "harness"]
FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "error", "unknown"]
# ``template-drift`` is a branch no compression made: an earlier response came back as text that renders
# to other token ids than were sampled (recorded by the gateway, which sees the ids).
EvictionKind = Literal["summarize", "prune", "truncate", "fold", "memory-offload", "placeholder", "other",
                       "template-drift"]
Split = Literal["train", "valid", "test"]
# What a call was for: the agent acting, or a harness-side call whose response is itself a
# compression artifact (a compaction summary the model was asked to write, a fold of recent steps).
Purpose = Literal["act", "summarize", "fold", "other"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ToolCall(_Strict):
    """One tool invocation inside an assistant message; ``id`` binds the tool result to it."""

    id: str
    name: str
    # Parsed JSON arguments; a string when the model emitted arguments that are not valid JSON.
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class Message(_Strict):
    id: str
    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    # Tool results only: the id of the tool call this message answers, and the tool's name.
    tool_call_id: str | None = None
    name: str | None = None
    author: Author | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_artifact(self) -> bool:
        return self.author == "harness"


class ToolSchema(_Strict):
    """One entry of the tool-schema table, in the OpenAI function format."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Call(_Strict):
    """One model invocation: the context exactly as delivered and the response it produced."""

    id: str
    context: list[str]
    response: str
    # Names of the tools offered to this call (a subset of the trajectory's tool table); None = all.
    tools: list[str] | None = None
    # Recorded token ids win over re-tokenization when present.
    context_tokens: list[int] | None = None
    response_tokens: list[int] | None = None
    # Per response token: log p(token | prefix) under the rollout engine, and optionally its top-k.
    rollout_logprobs: list[float] | None = None
    rollout_top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason = "stop"
    purpose: Purpose = "act"
    selected: bool = True
    reason: str | None = None  # why the call is not selected (refused proposal, truncated, ...)
    meta: dict[str, Any] = Field(default_factory=dict)


class Eviction(_Strict):
    """White-box record of one compression event, applied before call ``before_call``."""

    before_call: str
    kind: EvictionKind
    removed: list[str] = Field(default_factory=list)
    inserted: list[str] = Field(default_factory=list)
    trigger: str | None = None  # "auto" | "manual" | "budget" | ...
    tokens_before: int | None = None
    tokens_after: int | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class Task(_Strict):
    id: str
    group: str | None = None  # rollouts of one task group (GRPO) share a group id
    split: Split | None = None
    suite: str | None = None
    answer: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class Lineage(_Strict):
    """Where a trajectory came from: a parent trajectory (subagent, resumed session) and its source."""

    parent: str | None = None
    parent_call: str | None = None
    relation: str | None = None  # "subagent" | "compaction" | "resume" | "derived" | ...
    source: str | None = None  # importer name or "rollout"
    source_path: str | None = None
    transform: str | None = None  # derived records: the transform that made this one from ``parent``
    transform_version: str | None = None  # ... and its version


class Trajectory(_Strict):
    schema_: Literal["memorywalker.trajectory/v1"] = Field(default=SCHEMA_VERSION, alias="schema")
    id: str
    task: Task | None = None
    messages: list[Message]
    calls: list[Call]
    evictions: list[Eviction] = Field(default_factory=list)
    tools: list[ToolSchema] = Field(default_factory=list)
    reward: float | None = None
    outcome: dict[str, Any] = Field(default_factory=dict)
    lineage: Lineage = Field(default_factory=Lineage)
    meta: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def message_table(self) -> dict[str, Message]:
        return {m.id: m for m in self.messages}

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of one trajectory record (``memorywalker schema`` prints it)."""
    schema = Trajectory.model_json_schema(by_alias=True)
    schema["$id"] = SCHEMA_VERSION
    schema["title"] = "memorywalker trajectory v1"
    return schema
