"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): what Claude Code speaks.

Request → schema-v1 messages: ``system`` (a string or text blocks) is one system message; a user
message's text blocks become one user message each run of them, each ``tool_result`` block a ``tool``
message (in block order, so Claude Code's [tool_result, <system-reminder> text] stays in that order);
an assistant message's text, ``thinking`` and ``tool_use`` blocks become one assistant message.
``cache_control``, Claude Code's ``x-anthropic-billing-header`` system block and server tools
(``web_search_...``) are not delivered and are listed in ``Request.ignored``; ``role: "system"``
messages (Claude Code sends the date and deferred tools that way) are system messages in place.

Streaming follows the documented event sequence: ``message_start``, per content block
``content_block_start`` / ``content_block_delta`` (``text_delta`` or ``input_json_delta``) /
``content_block_stop``, ``message_delta`` (stop reason, output tokens), ``message_stop``.
https://docs.anthropic.com/en/api/messages-streaming
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from memorywalker.gateway.dialect import (
    BadRequest,
    Reply,
    Request,
    arguments_text,
    need,
    optional,
    sampling,
    text_of,
)
from memorywalker.records.schema import Message, ToolCall, ToolSchema

NAME = "anthropic"
BILLING = re.compile(r"x-anthropic-billing-header:[^\n]*\Z")
STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
# https://docs.anthropic.com/en/api/errors
ERROR_TYPE = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
              413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error",
              503: "overloaded_error", 504: "timeout_error"}


def parse(body: Any) -> Request:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = need(body, "model", str, "request")
    raw_messages = need(body, "messages", list, "request")
    ignored: list[str] = []
    messages: list[Message] = []
    system = body.get("system")
    if system:
        if isinstance(system, list):
            system = _uncached(system, ignored)
            # Claude Code's first system block is billing metadata whose digest changes with the
            # conversation; Anthropic's API takes it off the prompt, and so does the gateway.
            billing = [b for b in system if isinstance(b, dict) and BILLING.match(b.get("text") or "")]
            if billing:
                ignored.append("system: x-anthropic-billing-header block")
                system = [b for b in system if b not in billing]
        messages.append(Message(id="", role="system", content=text_of(system, where="system")))
    for i, m in enumerate(raw_messages):
        where = f"messages[{i}]"
        role = need(m, "role", str, where)
        if role not in ("user", "assistant", "system"):
            raise BadRequest(f"{where}.role: must be 'user', 'assistant' or 'system', got {role!r}")
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else need(m, "content", list, where)
        if role == "system":  # Claude Code sends some context (the date, deferred tools) as system messages
            messages.append(Message(id="", role="system", content=text_of(_uncached(blocks, ignored), where=where)))
            continue
        messages += _assistant(blocks, where) if role == "assistant" else _user(blocks, where, ignored)
    tools = []
    for i, t in enumerate(optional(body, "tools", list, "request", [])):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise BadRequest(f"{where}: expected an object")
        if "input_schema" not in t:  # a server tool (web search, code execution): not ours to run
            ignored.append(f"tool {t.get('name') or t.get('type')}")
            continue
        tools.append(ToolSchema(name=need(t, "name", str, where), description=optional(t, "description", str, where, ""),
                                parameters=need(t, "input_schema", dict, where)))
    return Request(NAME, model, messages, tools, stream=bool(body.get("stream")),
                   max_tokens=sampling(body, "max_tokens"), ignored=ignored)


def _uncached(blocks: list, ignored: list[str]) -> list:
    """Blocks without their ``cache_control`` (a prompt-caching hint, not text the model sees)."""
    if any(isinstance(b, dict) and "cache_control" in b for b in blocks) and "cache_control" not in ignored:
        ignored.append("cache_control")
    return [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b for b in blocks]


def _user(blocks: list, where: str, ignored: list[str]) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []
    for j, b in enumerate(blocks):
        w = f"{where}.content[{j}]"
        kind = need(b, "type", str, w)
        if "cache_control" in b and "cache_control" not in ignored:
            ignored.append("cache_control")
        if kind == "text":
            texts.append(need(b, "text", str, w))
            continue
        if kind != "tool_result":
            raise BadRequest(f"{w}: unsupported content block {kind!r} (a text model takes text and tool_result)")
        if texts:
            out.append(Message(id="", role="user", content="\n\n".join(texts)))
            texts = []
        result = text_of(b.get("content"), where=f"{w}.content")
        out.append(Message(id="", role="tool", content=result, tool_call_id=need(b, "tool_use_id", str, w),
                           meta={"is_error": True} if b.get("is_error") else {}))
    if texts:
        out.append(Message(id="", role="user", content="\n\n".join(texts)))
    return out


def _assistant(blocks: list, where: str) -> list[Message]:
    texts, thinking, calls = [], [], []
    for j, b in enumerate(blocks):
        w = f"{where}.content[{j}]"
        kind = need(b, "type", str, w)
        if kind == "text":
            texts.append(need(b, "text", str, w))
        elif kind == "thinking":
            thinking.append(need(b, "thinking", str, w))
        elif kind == "redacted_thinking":
            continue  # encrypted; nothing a model here could have written
        elif kind == "tool_use":
            calls.append(ToolCall(id=need(b, "id", str, w), name=need(b, "name", str, w),
                                  arguments=need(b, "input", dict, w)))
        else:
            raise BadRequest(f"{w}: unsupported assistant block {kind!r}")
    return [Message(id="", role="assistant", content="".join(texts), reasoning="".join(thinking) or None,
                    tool_calls=calls)]


# --- answers ------------------------------------------------------------------------------------------

SIGNATURE = "memorywalker-unsigned"  # thinking blocks carry a signature; the gateway's are not verifiable


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": SIGNATURE})
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content})
    for tc in reply.tool_calls:
        # A tool_use input is an object; replies whose arguments are not one go back as text (Reply.parse_error).
        blocks.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": tc.arguments})
    return blocks


def _usage(reply: Reply) -> dict[str, int]:
    return {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def reply_json(reply: Reply, request: Request) -> dict[str, Any]:
    return {"id": f"msg_{reply.id}", "type": "message", "role": "assistant", "model": request.model,
            "content": _blocks(reply), "stop_reason": STOP[reply.finish], "stop_sequence": None,
            "usage": _usage(reply)}


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def reply_events(reply: Reply, request: Request, chunk: int = 64) -> Iterator[str]:
    start = reply_json(reply, request) | {"content": [], "stop_reason": None}
    start["usage"] = _usage(reply) | {"output_tokens": 1}
    yield _event("message_start", {"message": start})
    for index, block in enumerate(_blocks(reply)):
        if block["type"] == "thinking":
            yield _event("content_block_start", {"index": index, "content_block": {"type": "thinking", "thinking": "",
                                                                                   "signature": ""}})
            for k in range(0, len(block["thinking"]), chunk):
                yield _event("content_block_delta", {"index": index, "delta": {
                    "type": "thinking_delta", "thinking": block["thinking"][k:k + chunk]}})
            yield _event("content_block_delta", {"index": index, "delta": {"type": "signature_delta",
                                                                           "signature": block["signature"]}})
        elif block["type"] == "text":
            yield _event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
            for k in range(0, len(block["text"]), chunk):
                yield _event("content_block_delta", {"index": index,
                                                     "delta": {"type": "text_delta", "text": block["text"][k:k + chunk]}})
        else:
            yield _event("content_block_start", {"index": index, "content_block": block | {"input": {}}})
            partial = arguments_text(block["input"])
            for k in range(0, len(partial), chunk):
                yield _event("content_block_delta", {"index": index,
                                                     "delta": {"type": "input_json_delta", "partial_json": partial[k:k + chunk]}})
        yield _event("content_block_stop", {"index": index})
    yield _event("message_delta", {"delta": {"stop_reason": STOP[reply.finish], "stop_sequence": None},
                                   "usage": {"output_tokens": reply.output_tokens}})
    yield _event("message_stop", {})


def error_json(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPE.get(status, "api_error"), "message": message}}
