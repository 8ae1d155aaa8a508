"""What every sampler speaks: a :class:`PolicyRequest` in (the rendered context as token ids, exactly as
delivered), a :class:`PolicyOutput` out (sampled token ids with their logprobs, or a scripted message), and
the :class:`Policy` protocol between them.

Every sampler receives a :class:`PolicyRequest` whose ``prompt_ids`` are exactly the rendered context
the harness records as the call's ``context_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from memorywalker.records.schema import Message, Task


@dataclass
class PolicyRequest:
    prompt_ids: list[int]  # the rendered context, exactly as delivered
    messages: list[Message]  # the same context as messages
    tools: list[str]  # names of the tools offered
    purpose: str  # "act" | "summarize" | "fold"
    call_index: int
    seed: int  # per-call sampling seed
    max_new_tokens: int | None = None  # this call's limit (None: the sampler's own)


@dataclass
class PolicyOutput:
    """Either a structured ``message`` (scripted policies) or sampled ``token_ids`` (model backends)."""

    message: Message | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str = "stop"  # "stop" | "length"
    meta: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def start(self, task: Task) -> None:
        """A new episode begins (reset per-episode state such as the KV cache)."""

    def __call__(self, request: PolicyRequest) -> PolicyOutput: ...

    def config(self) -> dict[str, Any]: ...
