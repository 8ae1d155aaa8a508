"""Proxy logs of chat-completions traffic → trajectories (the black-box case).

Input: JSONL, one request/response pair per line, as logging proxies write them (or a JSON file of one
conversation, ``{"messages": [...]}``: :func:`import_document`):
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
    ImportOptions,
    ImportResult,
    as_list,
    as_text,
    content_text,
    import_files,
    loads_deep_limited,
    parse_arguments,
    read_jsonl,
    str_list,
)
from memorywalker.records import Lineage, RecordError, Task, ToolSchema, TrajectoryBuilder
from memorywalker.records.blackbox import ContentTable, infer_evictions

FORMAT = "openai-chat"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}
_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length",
           "content_filter": "content_filter"}


def to_fields(m: dict) -> dict[str, Any]:
    """Builder fields of one chat-completions message (also used by the SWE-agent importer)."""
    if not isinstance(m, dict):
        return {"role": "user", "content": as_text(m)}
    role = _ROLES.get(m.get("role"), "user")
    out: dict[str, Any] = {"role": role, "content": content_text(m.get("content"))}
    calls = [tc for tc in as_list(m.get("tool_calls")) if isinstance(tc, dict)]
    if isinstance(m.get("function_call"), dict):
        calls = [{"id": m.get("id") or "fc", "function": m["function_call"]}]
    if calls:
        fns = [tc.get("function") if isinstance(tc.get("function"), dict) else {} for tc in calls]
        out["tool_calls"] = [{"id": as_text(tc.get("id")) or f"tc{i}", "name": as_text(fn.get("name")),
                              "arguments": parse_arguments(fn.get("arguments"))}
                             for i, (tc, fn) in enumerate(zip(calls, fns, strict=True))]
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if reasoning and role == "assistant":
        out["reasoning"] = as_text(reasoning)
    if role == "tool":
        ids = str_list(m.get("tool_call_ids"))
        out["tool_call_id"] = as_text(m.get("tool_call_id")) or (ids[0] if ids else as_text(m.get("name")))
        if isinstance(m.get("name"), str) and m["name"]:
            out["name"] = m["name"]
    return out


def _tool_schema(t: Any) -> ToolSchema | None:
    fn = t.get("function", t) if isinstance(t, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        return None
    params = fn.get("parameters")
    return ToolSchema(name=fn["name"], description=as_text(fn.get("description")),
                      parameters=params if isinstance(params, dict) else {"type": "object", "properties": {}})


def _unwrap(obj: dict) -> tuple[dict | None, dict | None]:
    req = obj.get("request", obj)
    resp = obj.get("response", obj)
    req = req.get("body", req) if isinstance(req, dict) else None
    resp = resp.get("body", resp) if isinstance(resp, dict) else None
    return req, resp


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    # a folder's own *.jsonl files, not its subfolders'
    return import_files((f for path in paths for f in (sorted(path.glob("*.jsonl")) if path.is_dir() else [path])),
                        import_file)


def is_mini_swe_agent(document: Any) -> bool:
    """A mini-swe-agent trajectory (``trajectory_format: mini-swe-agent-…``: :mod:`.mini_swe_agent` imports it)."""
    return isinstance(document, dict) and str(document.get("trajectory_format", "")).startswith("mini-swe-agent")


def whole_document(path: Path) -> Any:
    """The file as one JSON document when it is one spread over several lines (a JSON file, not JSON
    Lines); None otherwise (a JSON Lines file, or one that does not parse as a whole). Only the first
    non-empty line is read of a file where that line is a JSON value on its own (JSON Lines, the usual case)."""
    try:
        with path.open(encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
            try:
                json.loads(first)
                return None  # a line that is a value by itself: JSON Lines
            except ValueError:
                rest = f.read()
        return loads_deep_limited(first + rest) if rest.strip() else None
    except (OSError, UnicodeDecodeError, ValueError, RecordError, RecursionError):
        return None


def import_file(path: Path, result: ImportResult) -> None:
    document = whole_document(path)
    if document is not None:
        import_document(path, document, result)
        return
    groups: dict[str, list[tuple[int, dict, dict]]] = defaultdict(list)
    for line, obj in read_jsonl(path, result):
        req, resp = _unwrap(obj)
        if not req or not isinstance(req.get("messages"), list) or not req["messages"]:
            result.reject(path, line, "missing_field", f"line {line}: no request messages")
            continue
        choices = (resp or {}).get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
                or not isinstance(choices[0].get("message"), dict):
            result.reject(path, line, "missing_field", f"line {line}: no response choice")
            continue
        meta = next((x for x in (obj.get("metadata"), req.get("metadata")) if isinstance(x, dict)), {})
        key = obj.get("session_id") or obj.get("trajectory_id") or meta.get("session_id") or path.stem
        groups[str(key)].append((line, req, choices[0]))
    for key, pairs in groups.items():
        b = TrajectoryBuilder(key, task=Task(id=key), lineage=Lineage(source=FORMAT, source_path=str(path)))
        table = ContentTable(b)
        tools: dict[str, ToolSchema] = {}
        for line, req, choice in pairs:
            offered = [x for x in map(_tool_schema, as_list(req.get("tools"))) if x is not None]
            for t in offered:
                tools.setdefault(t.name, t)
            msgs = [to_fields(m) for m in req["messages"]]
            resp = to_fields({**choice["message"], "role": "assistant"})
            ids = table.context([*msgs, resp])
            names = list(dict.fromkeys(t.name for t in offered))
            finish = choice.get("finish_reason")
            b.call(ids[:-1], ids[-1], finish_reason=_FINISH.get(finish if isinstance(finish, str) else None, "unknown"),
                   tools=names or None, meta={"line": line, "model": req.get("model")})
            result.imported += 1
        b.tools = list(tools.values())
        infer_evictions(b, "other")
        result.finish(b, path)


def import_document(path: Path, document: Any, result: ImportResult) -> None:
    """A JSON file holding one conversation (``{"messages": [...], "tools": [...]}`` or a bare message
    list): each assistant message is a call whose context is every message before it (one path, black
    box). A mini-swe-agent trajectory, or any other document, is rejected in one line naming the cause."""
    if is_mini_swe_agent(document):
        result.reject(path, None, "bad_format", f"{path.name}: a mini-swe-agent trajectory, not chat-completions "
                      "logs: `memorywalker import mini-swe-agent`")
        return
    messages = document.get("messages") if isinstance(document, dict) else document
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        result.reject(path, None, "bad_format", f"{path.name}: one JSON document, not JSON Lines (one "
                      "request/response pair per line), and not a conversation (a 'messages' list of objects)")
        return
    b = TrajectoryBuilder(path.stem, task=Task(id=path.stem), lineage=Lineage(source=FORMAT, source_path=str(path)),
                          meta={"document": "one conversation: each call's context is every message before it"})
    tools = [x for x in map(_tool_schema, as_list(document.get("tools") if isinstance(document, dict) else None))
             if x is not None]
    table = ContentTable(b)
    fields = [to_fields(m) for m in messages]
    for i, f in enumerate(fields):
        if f["role"] == "assistant":
            ids = table.context(fields[: i + 1])
            b.call(ids[:-1], ids[-1], finish_reason="tool_calls" if f.get("tool_calls") else "stop",
                   tools=[t.name for t in tools] or None, meta={"message": i})
    b.tools = tools
    result.read += 1  # the document, as one record (a file rejected above is a file-level reject)
    result.imported += 1
    result.finish(b, path)
