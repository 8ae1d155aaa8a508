"""OpenAI Chat Completions (``POST /v1/chat/completions``): what OpenCode (``@ai-sdk/openai-compatible``) speaks.

Request → schema-v1 messages one to one (``developer`` → system; content parts joined); assistant
``tool_calls`` keep their ids and their ``arguments`` text. Streaming: ``chat.completion.chunk`` objects
— the role, content deltas, tool-call deltas (``index``, ``id``, name, arguments), a last chunk with the
``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks for one — then ``[DONE]``.
https://platform.openai.com/docs/api-reference/chat-streaming
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from memorywalker.gateway.dialect import (
    BadRequest,
    Reply,
    Request,
    arguments_text,
    need,
    openai_error_json,
    optional,
    sampling,
    text_of,
)
from memorywalker.records.schema import Message, ToolCall, ToolSchema
from memorywalker.render.toolcalls import arguments_from_text

NAME = "chat"
def parse(body: Any) -> Request:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = need(body, "model", str, "request")
    messages: list[Message] = []
    for i, m in enumerate(need(body, "messages", list, "request")):
        where = f"messages[{i}]"
        role = need(m, "role", str, where)
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise BadRequest(f"{where}.role: unknown role {role!r}")
        content = text_of(m.get("content"), where=f"{where}.content")
        if role == "tool":
            messages.append(Message(id="", role="tool", content=content, tool_call_id=need(m, "tool_call_id", str, where),
                                    name=optional(m, "name", str, where)))
            continue
        calls = []
        for j, tc in enumerate(optional(m, "tool_calls", list, where, []) if role == "assistant" else []):
            w = f"{where}.tool_calls[{j}]"
            fn = need(tc, "function", dict, w)
            calls.append(ToolCall(id=need(tc, "id", str, w), name=need(fn, "name", str, f"{w}.function"),
                                  arguments=arguments_from_text(need(fn, "arguments", str, f"{w}.function"))))
        reasoning = optional(m, "reasoning_content", str, where) if role == "assistant" else None
        messages.append(Message(id="", role="system" if role == "developer" else role, content=content,
                                reasoning=reasoning or None, tool_calls=calls,
                                meta={"role": "developer"} if role == "developer" else {}))
    tools, ignored = [], []
    for i, t in enumerate(optional(body, "tools", list, "request", [])):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            ignored.append(f"tool {t.get('type') if isinstance(t, dict) else t!r}")
            continue
        fn = need(t, "function", dict, where)
        tools.append(ToolSchema(name=need(fn, "name", str, f"{where}.function"),
                                description=optional(fn, "description", str, f"{where}.function", ""),
                                parameters=optional(fn, "parameters", dict, f"{where}.function")
                                or {"type": "object", "properties": {}}))
    max_tokens = sampling(body, "max_completion_tokens", "max_tokens")
    usage = optional(body, "stream_options", dict, "request", {}).get("include_usage", False)
    return Request(NAME, model, messages, tools, stream=bool(body.get("stream")), max_tokens=max_tokens,
                   include_usage=bool(usage), ignored=ignored)


# --- answers ------------------------------------------------------------------------------------------

FINISH = {"stop": "stop", "tool_calls": "tool_calls", "length": "length"}


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [{"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": arguments_text(tc.arguments)}}
            for tc in reply.tool_calls]


def _usage(reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens}


def reply_json(reply: Reply, request: Request) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content if reply.content or not reply.tool_calls else None}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply)
    return {"id": f"chatcmpl-{reply.id}", "object": "chat.completion", "created": int(time.time()),
            "model": request.model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                                 "finish_reason": FINISH[reply.finish]}],
            "usage": _usage(reply)}


def reply_events(reply: Reply, request: Request, chunk: int = 64) -> Iterator[str]:
    created = int(time.time())

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body = {"id": f"chatcmpl-{reply.id}", "object": "chat.completion.chunk", "created": created,
                "model": request.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                     "finish_reason": finish}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    yield event({"role": "assistant", "content": ""})
    for k in range(0, len(reply.reasoning or ""), chunk):
        yield event({"reasoning_content": reply.reasoning[k:k + chunk]})
    for k in range(0, len(reply.content), chunk):
        yield event({"content": reply.content[k:k + chunk]})
    for index, tc in enumerate(_tool_calls(reply)):
        args = tc["function"]["arguments"]
        yield event({"tool_calls": [{"index": index, "id": tc["id"], "type": "function",
                                     "function": {"name": tc["function"]["name"], "arguments": ""}}]})
        for k in range(0, len(args), chunk):
            yield event({"tool_calls": [{"index": index, "function": {"arguments": args[k:k + chunk]}}]})
    yield event({}, FINISH[reply.finish])
    if request.include_usage:
        usage = {"id": f"chatcmpl-{reply.id}", "object": "chat.completion.chunk", "created": created,
                 "model": request.model, "choices": [], "usage": _usage(reply)}
        yield f"data: {json.dumps(usage)}\n\n"
    yield "data: [DONE]\n\n"


error_json = openai_error_json
