"""Anthropic ``MessageParam`` histories (Cline, Roo Code ``api_conversation_history.json``) as schema-v1
messages: a user message's ``tool_result`` blocks become tool messages (placed first, as the API needs
them), its other blocks one user message; an assistant message's text, ``thinking`` / ``reasoning``
and ``tool_use`` blocks one assistant message.

A harness that rewrites a stored message before sending it (Cline's context updates, a block dropped
after a truncation) sends another *version* of it: each distinct version gets its own ids
(``<index>``, then ``<index>@2``, ...), so contexts that share a version share ids and the tree branches
where a version changes.

>>> from memorywalker.records import TrajectoryBuilder
>>> t = HistoryTable(TrajectoryBuilder("t"), "m")
>>> t.ids(0, {"role": "user", "content": "hi"}), t.ids(0, {"role": "user", "content": "hi!"})
(['m0'], ['m0@2'])
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memorywalker.importers.base import ImportResult, content_text, read_json
from memorywalker.records import TrajectoryBuilder

HISTORY = "api_conversation_history.json"


def task_histories(paths: list[Path]) -> Iterator[tuple[Path, Path]]:
    """(task folder, its history file) for each input: a history file itself (its folder holds the other
    files), a task folder, or a folder of task folders (Cline's and Roo Code's ``tasks/``)."""
    for path in paths:
        if path.is_file():
            yield path.parent, path
            continue
        folders = [path] if (path / HISTORY).is_file() else sorted(p.parent for p in path.rglob(HISTORY))
        yield from ((folder, folder / HISTORY) for folder in folders)


def read_history(history_file: Path, result: ImportResult) -> list | None:
    """The MessageParam list of a history file, or None (rejected: unreadable, bad JSON, not a list)."""
    history = read_json(history_file, result)
    if history is not None and not isinstance(history, list):
        result.reject(history_file, None, "bad_format", f"{history_file.name}: not a list of messages")
        return None
    return history


def import_tasks(paths: list[Path], import_task: Callable[[Path, ImportResult, Path], None]) -> ImportResult:
    result = ImportResult()
    for folder, history_file in task_histories(paths):
        import_task(folder, result, history_file)
    return result


def blocks(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def split(msg: dict) -> list[dict]:
    """The schema-v1 message fields of one MessageParam (``role``, ``content``, optional ``tool_calls``,
    ``tool_call_id``, ``reasoning``)."""
    if msg.get("role") == "assistant":
        texts, reasoning, calls = [], [], []
        for b in blocks(msg.get("content")):
            kind = b.get("type")
            if kind == "text":
                texts.append(str(b.get("text", "")))
            elif kind == "thinking":
                reasoning.append(str(b.get("thinking", "")))
            elif kind == "reasoning" and isinstance(b.get("text"), str):
                reasoning.append(b["text"])
            elif kind == "tool_use":
                args = b.get("input")
                calls.append({"id": str(b.get("id")), "name": str(b.get("name", "")),
                              "arguments": args if isinstance(args, dict) else {}})
        out: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts), "tool_calls": calls}
        if reasoning:
            out["reasoning"] = "\n\n".join(reasoning)
        return [out]
    results, texts = [], []
    for b in blocks(msg.get("content")):
        if b.get("type") == "tool_result":
            results.append({"role": "tool", "content": content_text(b.get("content")),
                            "tool_call_id": str(b.get("tool_use_id"))})
        elif b.get("type") == "text":
            texts.append(str(b.get("text", "")))
        elif b.get("type") in ("image", "document"):
            texts.append(f"[{b['type']}]")
    return results + ([{"role": "user", "content": "\n\n".join(texts)}] if texts or not results else [])


class HistoryTable:
    """Message ids for (history index, message version)."""

    def __init__(self, builder: TrajectoryBuilder, prefix: str = ""):
        self.b, self.prefix = builder, prefix
        self.versions: dict[int, dict[str, list[str]]] = {}  # index -> version key -> message ids
        self.origin: dict[str, str] = {}  # renamed tool-call id -> the id it was stored with

    def ids(self, index: int, msg: dict, **meta: Any) -> list[str]:
        key = json.dumps({"role": msg.get("role"), "content": msg.get("content")}, sort_keys=True, default=str)
        known = self.versions.setdefault(index, {})
        if key not in known:
            base = f"{self.prefix}{index}" + (f"@{len(known) + 1}" if known else "")
            parts = split(msg)
            for p in parts if known else []:  # tool-call ids stay unique per trajectory: a new version renames them
                p["tool_calls"] = [{**tc, "id": f"{tc['id']}@{len(known) + 1}"} for tc in p.get("tool_calls", [])]
                self.origin.update({tc["id"]: tc["id"].rsplit("@", 1)[0] for tc in p["tool_calls"]})
            author = "model" if msg.get("role") == "assistant" else "user"
            if msg.get("isSummary") or msg.get("isTruncationMarker"):  # Roo Code's compression artifacts
                author = "harness"
                meta = {**meta, "is_summary": True} if msg.get("isSummary") else {**meta, "is_truncation_marker": True}
            known[key] = [self.b.message(p.pop("role"), p.pop("content"), id=base if len(parts) == 1 else f"{base}#{k}",
                                         author="environment" if "tool_call_id" in p and author != "harness" else author,
                                         meta={"history_index": index, **meta}, **p)
                          for k, p in enumerate(parts)]
        return known[key]

    def context(self, items: list[tuple[int, dict]], result: Any = None) -> list[str]:
        """Message ids of ``items`` in order, tool results whose call is not in the context left out."""
        out: list[str] = []
        issued: set[str] = set()
        table = {m.id: m for m in self.b.messages}
        current: dict[str, str] = {}  # stored tool-call id -> the id its latest version in this context uses
        for index, msg in items:
            if msg.get("role") == "user" and current and isinstance(msg.get("content"), list):
                msg = {**msg, "content": [{**x, "tool_use_id": current.get(x.get("tool_use_id"), x.get("tool_use_id"))}
                                          if isinstance(x, dict) and x.get("type") == "tool_result" else x
                                          for x in msg["content"]]}
            for mid in self.ids(index, msg):
                m = table.get(mid) or next(x for x in reversed(self.b.messages) if x.id == mid)
                table[mid] = m
                if m.role == "tool" and m.tool_call_id not in issued:
                    if result is not None:
                        result.notes["orphan_tool_results_dropped"] += 1
                    continue
                issued.update(tc.id for tc in m.tool_calls)
                current.update({self.origin.get(tc.id, tc.id): tc.id for tc in m.tool_calls})
                out.append(mid)
        return out
