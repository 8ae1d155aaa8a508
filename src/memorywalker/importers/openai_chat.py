"""Proxy logs of chat-completions traffic → trajectories (the black-box case).

Input: JSONL, one request/response pair per line, as logging proxies write them:
``{"request": {"messages": [...], "tools": [...]}, "response": {"choices": [{"message": ...,
"finish_reason": ...}]}}`` (``body`` wrappers and a top-level ``messages``/``choices`` pair are
accepted too). Pairs are grouped into trajectories by ``session_id`` / ``trajectory_id`` /
``metadata.session_id`` (default: one trajectory per file). The tree is built from the requests
alone: equal messages share ids; a request that does not extend the previous call's sequence is an
inferred eviction of kind ``other``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from memorywalker.importers.base import (
    ContentTable,
    ImportOptions,
    ImportResult,
    content_text,
    infer_evictions,
    parse_arguments,
    read_jsonl,
)
from memorywalker.records import Lineage, Task, ToolSchema, TrajectoryBuilder

FORMAT = "openai-chat"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}
_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length",
           "content_filter": "content_filter"}


def to_fields(m: dict) -> dict[str, Any]:
    """Builder fields of one chat-completions message (also used by the SWE-agent importer)."""
    role = _ROLES.get(m.get("role"), "user")
    out: dict[str, Any] = {"role": role, "content": content_text(m.get("content"))}
    calls = m.get("tool_calls") or []
    if m.get("function_call"):
        calls = [{"id": m.get("id") or "fc", "function": m["function_call"]}]
    if calls:
        out["tool_calls"] = [{"id": tc.get("id") or f"tc{i}", "name": (tc.get("function") or {}).get("name", ""),
                              "arguments": parse_arguments((tc.get("function") or {}).get("arguments"))}
                             for i, tc in enumerate(calls)]
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if reasoning and role == "assistant":
        out["reasoning"] = reasoning if isinstance(reasoning, str) else json.dumps(reasoning)
    if role == "tool":
        ids = m.get("tool_call_ids") or []
        out["tool_call_id"] = m.get("tool_call_id") or (ids[0] if ids else m.get("name") or "")
        if m.get("name"):
            out["name"] = m["name"]
    return out


def _unwrap(obj: dict) -> tuple[dict | None, dict | None]:
    req = obj.get("request", obj)
    resp = obj.get("response", obj)
    req = req.get("body", req) if isinstance(req, dict) else None
    resp = resp.get("body", resp) if isinstance(resp, dict) else None
    return req, resp


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    result = ImportResult()
    for path in paths:
        for f in sorted(path.glob("*.jsonl")) if path.is_dir() else [path]:
            import_file(f, result)
    return result


def import_file(path: Path, result: ImportResult) -> None:
    groups: dict[str, list[tuple[int, dict, dict]]] = defaultdict(list)
    for line, obj in read_jsonl(path, result):
        req, resp = _unwrap(obj)
        if not req or not isinstance(req.get("messages"), list) or not req["messages"]:
            result.reject(path, line, "missing_field", f"line {line}: no request messages")
            continue
        choices = (resp or {}).get("choices")
        if not choices or not isinstance(choices[0], dict) or "message" not in choices[0]:
            result.reject(path, line, "missing_field", f"line {line}: no response choice")
            continue
        meta = obj.get("metadata") or req.get("metadata") or {}
        key = obj.get("session_id") or obj.get("trajectory_id") or meta.get("session_id") or path.stem
        groups[str(key)].append((line, req, choices[0]))
    for key, pairs in groups.items():
        b = TrajectoryBuilder(key, task=Task(id=key), lineage=Lineage(source=FORMAT, source_path=str(path)))
        table = ContentTable(b)
        tools: dict[str, ToolSchema] = {}
        for line, req, choice in pairs:
            for t in req.get("tools") or []:
                fn = t.get("function", t)
                if fn.get("name") and fn["name"] not in tools:
                    tools[fn["name"]] = ToolSchema(name=fn["name"], description=fn.get("description") or "",
                                                   parameters=fn.get("parameters") or {"type": "object", "properties": {}})
            msgs = [to_fields(m) for m in req["messages"]]
            resp = to_fields({**choice["message"], "role": "assistant"})
            ids = table.context([*msgs, resp])
            names = [(t.get("function", t)).get("name") for t in req.get("tools") or []]
            b.call(ids[:-1], ids[-1], finish_reason=_FINISH.get(choice.get("finish_reason"), "unknown"),
                   tools=names or None, meta={"line": line, "model": req.get("model")})
            result.imported += 1
        b.tools = list(tools.values())
        infer_evictions(b, "other")
        result.finish(b, path)
