"""What every wire dialect turns a request into, and what it turns back into its own JSON and SSE.

A dialect module (:mod:`.anthropic`, :mod:`.responses`, :mod:`.chat`) has four functions:

* ``parse(body) -> Request`` — the request as schema-v1 messages and tool schemas, or :class:`BadRequest`;
* ``reply_json(reply, request) -> dict`` — the non-streaming answer;
* ``reply_events(reply, request) -> Iterator[str]`` — the SSE stream the dialect's official SDK accepts;
* ``error_json(status, message) -> dict`` — the dialect's error shape (both OpenAI dialects share
  :func:`openai_error_json`).

Message ids are content addresses (:func:`message_id`): the same message sent in two calls of a
session gets the same id, so the calls' contexts share their prefix by id as well as by tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from memorywalker.errors import InputError
from memorywalker.records.schema import Message, ToolCall, ToolSchema

Finish = Literal["stop", "tool_calls", "length"]


class BadRequest(InputError):
    """A request the gateway cannot serve; ``status`` is the HTTP status its dialect answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    """One model call as the harness asked for it, in schema-v1 terms (ids assigned by :func:`assign_ids`)."""

    dialect: str
    model: str
    messages: list[Message]
    tools: list[ToolSchema]
    stream: bool = False
    max_tokens: int | None = None
    include_usage: bool = False  # chat: stream_options.include_usage
    ignored: list[str] = field(default_factory=list)  # what the request held that is not delivered (said, not hidden)


@dataclass
class Reply:
    """The response as the client receives it: text and/or tool calls, or text only when parsing failed."""

    content: str
    tool_calls: list[ToolCall]
    finish: Finish
    input_tokens: int
    output_tokens: int
    parse_error: str | None = None  # the sampled text did not parse as tool calls and goes back as text
    reasoning: str | None = None  # a sampled <think> block: a thinking block / reasoning item / reasoning_content
    id: str = field(default_factory=lambda: secrets.token_hex(12))


def text_of(parts: Any, *, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """The text of a string or a list of ``{"type": kind, "text": ...}`` parts, joined by blank lines.

    >>> text_of([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], where="x")
    'a\\n\\nb'
    """
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise BadRequest(f"{where}: content must be a string or a list of parts, not {type(parts).__name__}")
    texts = []
    for i, p in enumerate(parts):
        if not isinstance(p, dict) or p.get("type") not in kinds:
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise BadRequest(f"{where}[{i}]: unsupported content part {kind!r} (a text model takes {', '.join(kinds)})")
        texts.append(need(p, "text", str, f"{where}[{i}]"))
    return "\n\n".join(texts)


def need(obj: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]``, which must exist and be a ``kind``; otherwise a 400 naming the field."""
    if not isinstance(obj, dict):
        raise BadRequest(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise BadRequest(f"{where}.{key}: required")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
        names = "/".join(k.__name__ for k in _tuple(kind))
        raise BadRequest(f"{where}.{key}: expected {names}, got {type(value).__name__}")
    return value


def optional(obj: dict, key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    return need(obj, key, kind, where) if obj.get(key) is not None else default


def sampling(body: dict, *max_keys: str) -> int | None:
    """The request's response cap (the first of ``max_keys`` it gives), after checking the sampling
    parameters a client may send: a cap below 1, a negative or non-finite ``temperature`` and a ``top_p``
    outside (0, 1] are 400s, as the providers answer them (the gateway samples at its own temperature; a
    request's is checked, not used).

    >>> sampling({"max_tokens": 5, "temperature": 0.7}, "max_tokens")
    5
    >>> sampling({"max_tokens": 0}, "max_tokens")
    Traceback (most recent call last):
    ...
    memorywalker.gateway.dialect.BadRequest: request.max_tokens: must be at least 1, got 0
    """
    temperature = optional(body, "temperature", (int, float), "request")
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise BadRequest(f"request.temperature: must be a number ≥ 0, got {temperature}")
    top_p = optional(body, "top_p", (int, float), "request")
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise BadRequest(f"request.top_p: must be in (0, 1], got {top_p}")
    for key in max_keys:
        cap = optional(body, key, int, "request")
        if cap is not None:
            if cap < 1:
                raise BadRequest(f"request.{key}: must be at least 1, got {cap}")
            return cap
    return None


def _tuple(kind) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def arguments_text(arguments: dict[str, Any] | str) -> str:
    """Arguments as the JSON text the client receives: the sampled text itself for a raw string."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def message_id(m: Message, occurrence: int = 0) -> str:
    """A content address: role, content, reasoning, tool calls and tool-result binding (not author/meta).

    The ``occurrence``-th repeat of the same message inside one context gets its own id.
    """
    key = json.dumps([m.role, m.content, m.reasoning, [[t.id, t.name, t.arguments] for t in m.tool_calls],
                      m.tool_call_id, m.name], ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"m{digest}" if occurrence == 0 else f"m{digest}-{occurrence}"


def assign_ids(messages: list[Message]) -> list[Message]:
    """Give each message its content address (repeats within the list numbered by occurrence)."""
    seen: Counter[str] = Counter()
    for m in messages:
        base = message_id(m)
        m.id = message_id(m, seen[base])
        seen[base] += 1
    return messages


# OpenAI's error types by status (Chat Completions and Responses answer errors alike).
OPENAI_ERROR_TYPE = {400: "invalid_request_error", 413: "invalid_request_error", 404: "not_found_error",
                     500: "server_error", 502: "server_error", 504: "timeout"}


def openai_error_json(status: int, message: str) -> dict[str, Any]:
    """``{"error": {message, type, param, code}}``; a prompt over the model's positions is ``context_length_exceeded``."""
    return {"error": {"message": message, "type": OPENAI_ERROR_TYPE.get(status, "server_error"), "param": None,
                      "code": "context_length_exceeded" if message.startswith("prompt is too long") else None}}


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"
