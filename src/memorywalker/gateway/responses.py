"""OpenAI Responses (``POST /v1/responses``): what Codex CLI speaks.

Request → schema-v1 messages: ``instructions`` is a system message; ``input`` is a string (one user
message) or items — ``message`` (roles ``system``/``developer`` → system, ``user``, ``assistant``),
``function_call`` / ``custom_tool_call`` (merged into the assistant message before them, as one turn),
``function_call_output`` / ``custom_tool_call_output`` (tool messages), ``reasoning`` (the reasoning of
the next assistant turn, from its summary text). Server-side state (``previous_response_id``) is refused:
the gateway records what each call delivered, so every request must carry its whole input.

Streaming: ``response.created``, ``response.in_progress``, per output item ``response.output_item.added``
… ``response.output_item.done`` (text via ``response.content_part.added`` /
``response.output_text.delta`` / ``.done`` / ``response.content_part.done``; function calls via
``response.function_call_arguments.delta`` / ``.done``), ``response.completed``; every event carries a
``sequence_number``. https://platform.openai.com/docs/api-reference/responses-streaming
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

NAME = "responses"
TEXT_PARTS = ("input_text", "output_text", "text")
def parse(body: Any) -> Request:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("previous_response_id"):
        raise BadRequest("previous_response_id is not supported: the gateway keeps no server-side state; "
                         "send the whole input (store=false)")
    model = need(body, "model", str, "request")
    messages: list[Message] = []
    ignored: list[str] = []
    instructions = optional(body, "instructions", str, "request")
    if instructions:
        messages.append(Message(id="", role="system", content=instructions))
    raw = need(body, "input", (str, list), "request")
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw
    names: dict[str, str] = {}  # call_id -> tool name, for the outputs
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: expected an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            role = need(item, "role", str, where)
            if role not in ("system", "developer", "user", "assistant"):
                raise BadRequest(f"{where}.role: unknown role {role!r}")
            text = text_of(item.get("content"), where=f"{where}.content", kinds=TEXT_PARTS)
            if role == "assistant":
                _assistant(messages, reasoning).content += text
            else:
                messages.append(Message(id="", role="system" if role == "developer" else role, content=text,
                                        meta={"role": "developer"} if role == "developer" else {}))
        elif kind in ("function_call", "custom_tool_call"):
            call_id, name = need(item, "call_id", str, where), need(item, "name", str, where)
            args = (arguments_from_text(need(item, "arguments", str, where)) if kind == "function_call"
                    else need(item, "input", str, where))
            names[call_id] = name
            _assistant(messages, reasoning).tool_calls.append(ToolCall(id=call_id, name=name, arguments=args))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = need(item, "call_id", str, where)
            output = text_of(item.get("output"), where=f"{where}.output", kinds=TEXT_PARTS)
            messages.append(Message(id="", role="tool", content=output, tool_call_id=call_id, name=names.get(call_id)))
        elif kind == "reasoning":
            reasoning += [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
        else:
            raise BadRequest(f"{where}.type: unsupported input item {kind!r}")
    tools = []
    for i, t in enumerate(optional(body, "tools", list, "request", [])):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise BadRequest(f"{where}: expected an object")
        if t.get("type") != "function":
            ignored.append(f"tool {t.get('name') or t.get('type')} ({t.get('type')})")
            continue
        tools.append(ToolSchema(name=need(t, "name", str, where), description=optional(t, "description", str, where, ""),
                                parameters=optional(t, "parameters", dict, where) or {"type": "object", "properties": {}}))
    return Request(NAME, model, messages, tools, stream=bool(body.get("stream")),
                   max_tokens=sampling(body, "max_output_tokens"), ignored=ignored)


def _assistant(messages: list[Message], reasoning: list[str]) -> Message:
    """The assistant message this item belongs to: the last message when it is one (one turn), else a new one."""
    if messages and messages[-1].role == "assistant" and not reasoning:
        return messages[-1]
    m = Message(id="", role="assistant", content="", reasoning="\n".join(reasoning) or None)
    reasoning.clear()
    messages.append(m)
    return m


# --- answers ------------------------------------------------------------------------------------------

def _items(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:  # what the model sampled as reasoning: a reasoning item, summary = the text
        items.append({"type": "reasoning", "id": f"rs_{reply.id}", "status": "completed",
                      "summary": [{"type": "summary_text", "text": reply.reasoning}]})
    if reply.content or not reply.tool_calls:
        items.append({"type": "message", "id": f"msg_{reply.id}", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
    for k, tc in enumerate(reply.tool_calls):
        items.append({"type": "function_call", "id": f"fc_{reply.id}_{k}", "call_id": tc.id, "name": tc.name,
                      "arguments": arguments_text(tc.arguments), "status": "completed"})
    return items


def reply_json(reply: Reply, request: Request, *, status: str | None = None, output: list | None = None) -> dict[str, Any]:
    done = status is None
    status = status or ("incomplete" if reply.finish == "length" else "completed")
    return {
        "id": f"resp_{reply.id}", "object": "response", "created_at": int(time.time()), "status": status,
        "model": request.model, "output": _items(reply) if output is None else output,
        "incomplete_details": {"reason": "max_output_tokens"} if done and reply.finish == "length" else None,
        "error": None, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "store": False,
        "usage": {"input_tokens": reply.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": reply.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": reply.input_tokens + reply.output_tokens} if done else None,
    }


def reply_events(reply: Reply, request: Request, chunk: int = 64) -> Iterator[str]:
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **data}, ensure_ascii=False)}\n\n"

    yield event("response.created", response=reply_json(reply, request, status="in_progress", output=[]))
    yield event("response.in_progress", response=reply_json(reply, request, status="in_progress", output=[]))
    for index, item in enumerate(_items(reply)):
        if item["type"] == "reasoning":
            text = item["summary"][0]["text"]
            part = {"type": "summary_text", "text": ""}
            yield event("response.output_item.added", output_index=index, item=item | {"status": "in_progress",
                                                                                       "summary": []})
            yield event("response.reasoning_summary_part.added", item_id=item["id"], output_index=index,
                        summary_index=0, part=part)
            for k in range(0, len(text), chunk):
                yield event("response.reasoning_summary_text.delta", item_id=item["id"], output_index=index,
                            summary_index=0, delta=text[k:k + chunk])
            yield event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                        summary_index=0, text=text)
            yield event("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                        summary_index=0, part=item["summary"][0])
        elif item["type"] == "message":
            text = item["content"][0]["text"]
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.output_item.added", output_index=index, item=item | {"status": "in_progress", "content": []})
            yield event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=empty)
            for k in range(0, len(text), chunk):
                yield event("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                            delta=text[k:k + chunk], logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                        logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                        part=item["content"][0])
        else:
            args = item["arguments"]
            yield event("response.output_item.added", output_index=index,
                        item=item | {"status": "in_progress", "arguments": ""})
            for k in range(0, len(args), chunk):
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=args[k:k + chunk])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=args)
        yield event("response.output_item.done", output_index=index, item=item)
    final = reply_json(reply, request)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)


error_json = openai_error_json
