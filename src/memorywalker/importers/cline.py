"""Cline task folders (``<globalStorage>/saoudrizwan.claude-dev/tasks/<taskId>/``) → trajectories.

Follows cline/cline's VS Code extension as of 791d238 (``src/core/context/context-management/
ContextManager.ts``, ``src/core/task/message-state.ts``, ``src/core/storage/disk.ts``):

* ``api_conversation_history.json`` holds every Anthropic ``MessageParam`` ever sent, untruncated.
  Each assistant message is one call; the request it answered was built from the messages before it by
  ``getAndAlterTruncatedMessages``: the first user/assistant pair, then the messages after
  ``conversationHistoryDeletedRange`` (the first one kept loses its ``tool_result`` blocks when a range
  was cut), each with the latest of its ``context_history.json`` updates made before the request
  (the truncation notice that replaces the first assistant message, duplicate file reads replaced by
  a notice, the first user message replaced after a compaction).
* The range in force at a request is the one ``ui_messages.json`` records on the messages written while
  that response streamed (``conversationHistoryIndex`` = the index of the last history message then,
  ``conversationHistoryDeletedRange``); the request's time is its ``api_req_started`` message's ``ts``,
  whose JSON text also carries the billed tokens (``tokensIn + cacheWrites + cacheReads``).
* A range that grows between two calls is a ``truncate`` eviction (``summarize`` when the previous
  response called ``summarize_task`` / ``condense``: Cline's auto-condense); a message whose text an
  update changed is a ``placeholder`` eviction (the old version removed, the new one inserted).

Without ``ui_messages.json`` the ranges and request times are unknown: the full history is replayed
and every call is marked ``meta.deleted_range = "unknown"`` (its context may hold messages Cline had cut).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from memorywalker.errors import InputError
from memorywalker.importers import billed
from memorywalker.importers.anthropic_history import HISTORY, HistoryTable, blocks, import_tasks, read_history
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    carried,
    loads_deep_limited,
    read_json,
    role_message,
)
from memorywalker.records import Lineage, RecordError, Task, TrajectoryBuilder

FORMAT = "cline"
_SUMMARIZE_TOOLS = {"summarize_task", "condense"}


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    return import_tasks(paths, import_task)


def _ui_requests(ui: list) -> dict[int, dict[str, Any]]:
    """Per conversationHistoryIndex: the request's ts and billed info (its latest api_req_started) and the
    deleted range on the messages written while the response streamed."""
    out: dict[int, dict[str, Any]] = {}
    for m in ui:
        if not isinstance(m, dict) or not isinstance(m.get("conversationHistoryIndex"), int):
            continue
        slot = out.setdefault(m["conversationHistoryIndex"], {})
        rng = m.get("conversationHistoryDeletedRange")
        if m.get("say") == "api_req_started":
            slot["ts"] = m.get("ts")
            try:
                info = loads_deep_limited(m.get("text") or "{}")
            except (TypeError, json.JSONDecodeError, RecordError):  # no billed evidence: the call is unchecked
                info = {}
            slot["info"] = info if isinstance(info, dict) else {}
        elif isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, int) for x in rng):
            slot["range"] = tuple(rng)
        elif "range" not in slot:
            slot["range"] = None
    return out


def _updates(raw: Any, path: Path, result: ImportResult) -> dict[int, dict[int, list]]:
    """context_history.json: [[messageIndex, [editType, [[blockIndex, [[ts, type, [text], meta], ...]], ...]]], ...].

    Each item is a record: read, then skipped (used for updates, not as a message) or rejected whole as
    ``bad_format`` when any part of it is not that shape (none of its updates applied).
    """
    out: dict[int, dict[int, list]] = {}
    if raw is None:  # unreadable: read_json rejected the file
        return out
    if not isinstance(raw, list):
        result.reject(path, None, "bad_format", f"{path.name}: got a JSON {type(raw).__name__}, not a list of updates")
        return out
    for k, item in enumerate(raw):
        result.read += 1
        try:
            index, (_, inner) = item
            # parsed whole before any of it is applied: a bad block or change rejects the item
            parsed = {int(block): list(changes) for block, changes in inner}
            if not all(isinstance(c, list) and len(c) >= 3 for v in parsed.values() for c in v):
                raise InputError("a change is not [ts, type, [text], meta]")
            index = int(index)
        except (TypeError, ValueError) as e:
            result.reject(path, k, "bad_format", f"context_history item #{k} is not [messageIndex, [editType, "
                          f"[[blockIndex, [[ts, type, [text], meta], ...]], ...]]] ({e}); its updates are not applied",
                          detail=carried(item))
            continue
        result.skipped["context_history"] += 1
        for block, changes in parsed.items():
            out.setdefault(index, {})[block] = changes
    return out


def _altered(msg: dict, changes: dict[int, list], before: float | None) -> dict:
    """``msg`` with, per block, the latest text update made before the request (setTextInBlock)."""
    live = {k: [c for c in v if before is None or (isinstance(c[0], int | float) and c[0] < before)]
            for k, v in changes.items()}
    live = {k: v[-1] for k, v in live.items() if v and v[-1][1] == "text" and isinstance(v[-1][2], list) and v[-1][2]}
    if not live or not isinstance(msg.get("content"), list):
        return msg
    msg = copy.deepcopy(msg)
    for k, change in live.items():
        if k < len(msg["content"]) and isinstance(msg["content"][k], dict):
            b = msg["content"][k]
            if b.get("type") == "text":
                b["text"] = str(change[2][0])
            elif b.get("type") == "tool_result" and isinstance(b.get("content"), list) and b["content"] \
                    and isinstance(b["content"][0], dict) and b["content"][0].get("type") == "text":
                b["content"][0]["text"] = str(change[2][0])
    return msg


def import_task(folder: Path, result: ImportResult, history_file: Path | None = None) -> None:
    history_file = history_file or folder / HISTORY
    history = read_history(history_file, result)
    if history is None:
        return
    ui = read_json(folder / "ui_messages.json", result) if (folder / "ui_messages.json").exists() else None
    ctx_file = folder / "context_history.json"
    updates = _updates(read_json(ctx_file, result), ctx_file, result) if ctx_file.exists() else {}
    requests = _ui_requests(ui) if isinstance(ui, list) else None
    if ui is not None:
        result.read += 1
        result.skipped["ui_messages"] += 1  # read for ranges and times, not as messages
    b = TrajectoryBuilder(folder.name, task=Task(id=folder.name), lineage=Lineage(source=FORMAT, source_path=str(folder)))
    table = HistoryTable(b)
    good: list[tuple[int, dict]] = []
    rng_prev: tuple | None = None
    prev_ids: list[str] = []
    for i, msg in enumerate(history):
        if not role_message(result, history_file, i, msg, ("user", "assistant"), expected="a user/assistant MessageParam"):
            continue
        if msg["role"] == "assistant" and i > 0:
            slot = (requests or {}).get(i - 1, {})
            rng = slot.get("range") if requests is not None else None
            items = _request(history, good, rng, updates, slot.get("ts"))
            context = table.context(items, result)
            if context:
                info = slot.get("info") or {}
                prompt = sum(x for x in (info.get("tokensIn"), info.get("cacheWrites"), info.get("cacheReads"))
                             if isinstance(x, int | float) and not isinstance(x, bool))
                meta: dict[str, Any] = {"history_index": i, "billed_tokens": billed.billed(prompt, info.get("tokensOut"))}
                if requests is None:
                    meta["deleted_range"] = "unknown"
                (response,) = table.ids(i, msg)
                calls = b.messages[-1].tool_calls if b.messages[-1].id == response else []
                cid = b.call(context, response, finish_reason="tool_calls" if calls else "stop",
                             meta={k: v for k, v in meta.items() if v})
                _evict(b, cid, prev_ids, context, rng_prev, rng, history)
                prev_ids, rng_prev = [*context, response], rng
            else:
                result.notes["calls_without_context"] += 1
        good.append((i, msg))
    if requests is None and b.calls:
        result.notes["deleted_ranges_unknown"] += len(b.calls)
    billed.check_billed(b, result)
    result.finish(b, folder)


def _request(history: list, good: list[tuple[int, dict]], rng: tuple | None, updates: dict, ts: Any) -> list[tuple[int, dict]]:
    """getAndAlterTruncatedMessages for the request before the assistant message at ``len(good)``."""
    start = rng[1] + 1 if rng else 2
    items = [(i, m) for i, m in good if i < 2 or i >= start]
    out = []
    for k, (i, m) in enumerate(items):
        if k == 2 and start > 2 and m["role"] == "user" and isinstance(m.get("content"), list):
            m = {**m, "content": [x for x in m["content"] if not (isinstance(x, dict) and x.get("type") == "tool_result")]}
        out.append((i, _altered(m, updates.get(i, {}), ts if isinstance(ts, int | float) else None)))
    return out


def _evict(b: TrajectoryBuilder, cid: str, before: list[str], context: list[str], rng_prev, rng, history: list) -> None:
    """The eviction between the previous call's sequence ``before`` and this ``context``."""
    if not before or context[: len(before)] == before:
        return
    now, old = set(context), set(before)
    removed = [m for m in before if m not in now]
    inserted = [m for m in context if m not in old and "@" in m]  # new versions of messages already sent
    if rng != rng_prev:
        prev = next(m for m in reversed(b.messages) if m.id == before[-1])  # the previous response
        last = history[prev.meta["history_index"]]
        names = {x.get("name") for x in blocks(last.get("content")) if x.get("type") == "tool_use"}
        text = str(last.get("content")) if not names else ""
        kind = "summarize" if names & _SUMMARIZE_TOOLS or any(f"<{t}>" in text for t in _SUMMARIZE_TOOLS) else "truncate"
        b.eviction(cid, kind, removed, inserted, trigger="context_window",
                   meta={"deleted_range": list(rng) if rng else None})
    elif removed or inserted:
        b.eviction(cid, "placeholder", removed, inserted, trigger="context_update")
