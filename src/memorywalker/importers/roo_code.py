"""Roo Code task folders (``<globalStorage>/rooveterinaryinc.roo-cline/tasks/<taskId>/``) → trajectories.

Follows RooCodeInc/Roo-Code [cb83656]: ``src/core/condense/index.ts`` (``summarizeConversation``,
``getEffectiveApiHistory``, ``getMessagesSinceLastSummary``), ``src/core/context-management/index.ts``
(``truncateConversation``) and ``src/core/task/Task.ts`` (``attemptApiRequest``).

* ``api_conversation_history.json`` keeps every message; condensing and truncation are
  *non-destructive*: a condense appends a summary (``isSummary``, ``condenseId``) and tags every earlier
  message ``condenseParent``; a sliding-window truncation inserts a marker (``isTruncationMarker``,
  ``truncationId``, the text ``[Sliding window truncation: N messages hidden to reduce context]``) at
  the first kept message and tags the hidden ones ``truncationParent``.
* Each assistant message is one call. Its request was ``getEffectiveApiHistory`` of the history before
  it, with only the summaries and markers that existed then: a summary (appended at the end) exists for
  every later message; a marker (inserted mid-history) from the time of its ``sliding_window_truncation``
  message in ``ui_messages.json`` (without one, for every response after it in the file:
  ``meta.truncation_time = "inferred"``, which is wrong for kept responses written before it). From the newest summary on; tool results whose call was condensed away dropped;
  messages a truncation hid dropped.
* A newly existing summary is a ``summarize`` eviction (inserted: the summary), a new marker a
  ``truncate`` eviction (inserted: the marker).
* Not replicated: ``mergeConsecutiveApiMessages`` (consecutive user messages are one API message; here
  they stay separate messages in order), image blocks a model cannot read (sent as text placeholders).
* Billed tokens: the ``api_req_started`` ui message before each response (``tokensIn`` is the total
  input in current Roo; older versions left the cache out - a file whose ``tokensIn`` is ever below
  ``cacheReads + cacheWrites`` is read the old way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memorywalker.importers import billed
from memorywalker.importers.anthropic_history import HISTORY, HistoryTable, import_tasks, read_history
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    loads_deep_limited,
    read_json,
    role_message,
)
from memorywalker.records import Lineage, RecordError, Task, TrajectoryBuilder

FORMAT = "roo-code"


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    return import_tasks(paths, import_task)


def _ts(x: Any) -> float | None:
    return x if isinstance(x, int | float) and not isinstance(x, bool) else None


def effective_history(items: list[tuple[int, dict]], summaries: set[str], markers: set[str]) -> list[tuple[int, dict]]:
    """getEffectiveApiHistory over ``items`` (index, message) counting only the summaries / truncation
    markers named in ``summaries`` / ``markers`` as existing."""
    last = max((k for k, (_, m) in enumerate(items) if m.get("isSummary") and m.get("condenseId") in summaries),
               default=None)
    if last is None:
        return [(i, m) for i, m in items if not (m.get("condenseParent") in summaries and m.get("condenseParent"))
                and not (m.get("truncationParent") in markers and m.get("truncationParent"))
                and not (m.get("isTruncationMarker") and m.get("truncationId") not in markers)]
    tail = items[last:]
    uses = {b.get("id") for _, m in tail if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_use"}
    out = []
    for i, m in tail:
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            kept = [b for b in m["content"] if not (isinstance(b, dict) and b.get("type") == "tool_result"
                                                   and b.get("tool_use_id") not in uses)]
            if not kept:
                continue
            m = {**m, "content": kept} if len(kept) != len(m["content"]) else m
        if (m.get("truncationParent") and m.get("truncationParent") in markers) or (
                m.get("isTruncationMarker") and m.get("truncationId") not in markers):
            continue
        out.append((i, m))
    return out


def _ui(folder: Path, result: ImportResult) -> tuple[dict[str, float], list[tuple[float, dict]]] | None:
    """(truncationId → time of its sliding_window_truncation message, [(ts, api_req_started info)])."""
    path = folder / "ui_messages.json"
    ui = read_json(path, result) if path.exists() else None
    if not isinstance(ui, list):
        return None
    result.read += 1
    result.skipped["ui_messages"] += 1  # read for times and billed tokens
    truncations, requests = {}, []
    for m in ui:
        if not isinstance(m, dict) or _ts(m.get("ts")) is None:
            continue
        if m.get("say") == "sliding_window_truncation" and isinstance(m.get("contextTruncation"), dict):
            truncations[str(m["contextTruncation"].get("truncationId"))] = m["ts"]
        elif m.get("say") == "api_req_started":
            try:
                info = loads_deep_limited(m.get("text") or "{}")
            except (TypeError, json.JSONDecodeError, RecordError):  # no billed evidence: the call is unchecked
                info = {}
            requests.append((m["ts"], info if isinstance(info, dict) else {}))
    return truncations, requests


def _prompt(info: dict, old_style: bool) -> Any:
    nums = [info.get(k) if isinstance(info.get(k), int | float) else 0 for k in ("tokensIn", "cacheReads", "cacheWrites")]
    return nums[0] + nums[1] + nums[2] if old_style else info.get("tokensIn")


def import_task(folder: Path, result: ImportResult, history_file: Path | None = None) -> None:
    history_file = history_file or folder / HISTORY
    history = read_history(history_file, result)
    if history is None:
        return
    ui = _ui(folder, result)
    truncated_at, requests = ui if ui else ({}, [])
    old_style = any(isinstance(i.get("tokensIn"), int | float) and i["tokensIn"] < sum(
        i.get(k) if isinstance(i.get(k), int | float) else 0 for k in ("cacheReads", "cacheWrites")) for _, i in requests)
    b = TrajectoryBuilder(folder.name, task=Task(id=folder.name), lineage=Lineage(source=FORMAT, source_path=str(folder)))
    table = HistoryTable(b)
    good: list[tuple[int, dict]] = []
    prev: tuple[list[str], set, set] | None = None
    last_ts = None
    for i, msg in enumerate(history):
        if not role_message(result, history_file, i, msg, ("user", "assistant"), expected="a user/assistant message"):
            continue
        if msg["role"] == "assistant" and good:
            t = _ts(msg.get("ts"))
            summaries = {str(m["condenseId"]) for _, m in good if m.get("isSummary") and m.get("condenseId")}
            markers, inferred = set(), False
            for _, m in good:
                tid = m.get("truncationId")
                if m.get("isTruncationMarker") and tid:
                    when = truncated_at.get(str(tid))
                    if when is None:  # no ui event for it: assumed before every later response
                        markers.add(str(tid))
                        inferred = True
                    elif t is not None and when < t:
                        markers.add(str(tid))
            items = effective_history(good, summaries, markers)
            context = table.context(items, result)
            if context:
                info = next((x for ts, x in reversed(requests) if t is not None and ts < t
                             and (last_ts is None or ts > last_ts)), None)
                meta: dict[str, Any] = {"history_index": i}
                if info is not None:
                    meta["billed_tokens"] = billed.billed(_prompt(info, old_style), info.get("tokensOut"))
                if inferred:
                    meta["truncation_time"] = "inferred"
                (response,) = table.ids(i, msg)
                calls = next(m for m in reversed(b.messages) if m.id == response).tool_calls
                cid = b.call(context, response, finish_reason="tool_calls" if calls else "stop",
                             meta={k: v for k, v in meta.items() if v})
                if prev is not None:
                    _evict(b, cid, prev, context, summaries, markers)
                prev = ([*context, response], summaries, markers)
            else:
                result.notes["calls_without_context"] += 1
            last_ts = t if t is not None else last_ts
        good.append((i, msg))
    billed.check_billed(b, result)
    result.finish(b, folder)


def _evict(b: TrajectoryBuilder, cid: str, prev: tuple, context: list[str], summaries: set, markers: set) -> None:
    before, old_summaries, old_markers = prev
    if context[: len(before)] == before:
        return
    removed = [m for m in before if m not in set(context)]
    new_ids = {m.id: m for m in b.messages}
    fresh = [m for m in context if m not in set(before)]
    if summaries - old_summaries:
        inserted = [m for m in fresh if new_ids[m].meta.get("is_summary")]
        b.eviction(cid, "summarize", removed, inserted, trigger="condense",
                   meta={"condense_ids": sorted(summaries - old_summaries)})
    elif markers - old_markers:
        inserted = [m for m in fresh if new_ids[m].meta.get("is_truncation_marker")]
        b.eviction(cid, "truncate", removed, inserted, trigger="sliding_window",
                   meta={"truncation_ids": sorted(markers - old_markers)})
