"""Gemini CLI session recordings and saved chats (``~/.gemini/tmp/<project>/chats/session-*.json[l]``,
``checkpoint-<tag>.json``) → trajectories.

Follows google-gemini/gemini-cli [5411f11]: ``packages/core/src/services/chatRecordingService.ts`` /
``chatRecordingTypes.ts`` (the recording), ``packages/core/src/context/chatCompressionService.ts`` (chat
compression), ``packages/cli/src/ui/hooks/useGeminiStream.ts`` (what the recording says about it) and
``packages/core/src/core/logger.ts`` (``/chat save`` checkpoints).

* **Recording.** A ``ConversationRecord`` (``.json``) or its JSONL form: metadata lines, message records
  (a repeated ``id`` replaces the earlier record in place), ``{"$rewindTo": id}`` (the conversation
  continues from before that message: a branch) and ``{"$set": …}``. ``user`` messages (text, or
  ``functionResponse`` parts: tool results), ``gemini`` messages (text, ``thoughts`` as reasoning,
  ``toolCalls``; older files carry the results in ``toolCalls[].result``) reach the model; ``info``,
  ``warning`` and ``error`` messages do not.
* **Calls.** Each ``gemini`` message is one call whose context is the conversation before it.
* **Compression.** ``tryCompressChat`` replaces the history by ``[user: <state_snapshot> summary,
  model: "Got it. Thanks for the additional context!", …the last ~30% of the history]``; the recording
  only writes an ``info`` message "Context compressed from X% to Y%." - not the summary, not where the
  kept part starts. The next call gets a ``summarize`` eviction whose inserted summary is an opaque
  stand-in (``meta.opaque``), and every call from there on is unselected (``context_unverified``):
  its context is known only from the compression on (stand-in, acknowledgement, later messages).
  A compression with no ``info`` message shows as a drop in the billed prompt (``tokens.input``) and
  becomes an inferred eviction (:mod:`memorywalker.importers.billed`).
* **Saved chats** (``{"history": Content[]}`` or a bare ``Content[]``; ``/restore`` checkpoints'
  ``clientHistory``): each ``model`` content is a call on the contents before it. A history that starts
  with a compression summary is unselected past it (which responses came after the compression is not
  recorded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memorywalker.importers import billed
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    as_list,
    carried,
    read_json,
    read_jsonl,
    role_message,
    wrong_key_field,
)
from memorywalker.records import Lineage, Task, TrajectoryBuilder

FORMAT = "gemini-cli"
ACK = "Got it. Thanks for the additional context!"  # chatCompressionService: the model turn after the summary
OPAQUE_SUMMARY = "[compressed history: the <state_snapshot> summary is not in the session file]"
_COMPRESSED = ("Context compressed from", "Chat history compressed from")
UNVERIFIED = ("context_unverified: Gemini CLI compressed the history before this call; the summary and where "
              "the kept part starts are not recorded")


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    result = ImportResult()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.suffix in (".json", ".jsonl") and (
            p.name.startswith(("session-", "checkpoint")) or p.parent.name == "checkpoints")) if path.is_dir() else [path]
        for f in files:
            import_file(f, result)
    return result


def _parts(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"text": content}]
    if isinstance(content, dict):
        return [content]
    return [p if isinstance(p, dict) else {"text": str(p)} for p in content] if isinstance(content, list) else []


def _text(parts: list[dict]) -> str:
    return "".join(str(p["text"]) for p in parts if isinstance(p.get("text"), str) and not p.get("thought"))


def import_file(path: Path, result: ImportResult) -> None:
    if path.suffix == ".jsonl":
        records = [obj for _, obj in read_jsonl(path, result)]
        counted = True
    else:
        data = read_json(path, result)
        if data is None:
            return
        if isinstance(data, list) or (isinstance(data, dict) and ("history" in data or "clientHistory" in data)):
            _import_history(path, data, result)
            return
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            result.reject(path, None, "bad_format", f"{path.name}: not a Gemini CLI session or saved chat")
            return
        records = [{k: v for k, v in data.items() if k != "messages"}, *data["messages"]]
        counted = False
    _Recording(path, result).replay(records, counted)


class _Recording:
    def __init__(self, path: Path, result: ImportResult):
        self.path, self.result = path, result
        self.b: TrajectoryBuilder | None = None
        self.history: list[str] = []  # message ids the model would see next
        self.pending: list[dict] = []  # tool calls of the last gemini message, not yet answered
        self.compressed: str | None = None  # the info message id of the newest compression
        self.prev: list[str] | None = None

    def builder(self, meta: dict) -> TrajectoryBuilder:
        if self.b is None:
            tid = str(meta.get("sessionId") or self.path.stem)
            self.b = TrajectoryBuilder(tid, task=Task(id=tid), lineage=Lineage(source=FORMAT, source_path=str(self.path)),
                                       meta={k: meta[k] for k in ("projectHash", "kind") if isinstance(meta.get(k), str)})
        return self.b

    def replay(self, records: list[Any], counted: bool) -> None:
        latest: dict[str, int] = {}  # message id -> its last record (a repeated id replaces the record)
        for k, r in enumerate(records):
            if isinstance(r, dict) and isinstance(r.get("id"), str) and "type" in r:
                latest[r["id"]] = k
        order: list[str] = []
        for k, r in enumerate(records):
            if not counted:
                self.result.read += 1
            if not isinstance(r, dict):
                self.result.reject(self.path, k, "not_an_object", f"record #{k} is not an object", detail=carried(r))
                continue
            if not counted and wrong_key_field(r) is not None:
                self.result.reject(self.path, k, "wrong_type", f"record #{k}: {wrong_key_field(r)} is not text",
                                   detail=carried(r))
                continue
            if isinstance(r.get("$rewindTo"), str):
                self.result.imported += 1
                self.rewind(r["$rewindTo"], order)
            elif isinstance(r.get("id"), str) and "type" in r:
                if latest[r["id"]] != k:
                    self.result.skipped["replaced_record"] += 1
                    continue
                self.message(r, k, order)
            elif "$set" in r or isinstance(r.get("sessionId"), str):
                self.builder(r)
                self.result.skipped["metadata"] += 1
            else:
                self.result.reject(self.path, k, "unknown_record_type", f"record #{k}: not a message, rewind or "
                                   "metadata record", detail=carried(r))
        if self.b is None:
            self.result.reject(self.path, None, "no_calls", f"{self.path.name}: no messages")
            return
        billed.check_billed(self.b, self.result)
        self.result.finish(self.b, self.path)

    def rewind(self, target: str, order: list[str]) -> None:
        """The conversation continues from before ``target``: the messages from it on leave the history."""
        cut = next((i for i, rid in enumerate(order) if rid == target), 0)
        keep = set(order[:cut])
        del order[cut:]
        self.history = [m for m in self.history if self.b is None or self.b.messages[self.pos(m)].meta.get("record") in keep]
        self.pending = []
        self.result.notes["rewinds"] += 1

    def pos(self, mid: str) -> int:
        return next(i for i in range(len(self.b.messages) - 1, -1, -1) if self.b.messages[i].id == mid)

    def message(self, r: dict, k: int, order: list[str]) -> None:
        b, kind, parts = self.builder({}), r.get("type"), _parts(r.get("content"))
        rid = r["id"]
        order.append(rid)
        if kind in ("info", "warning", "error"):
            self.result.skipped[f"message:{kind}"] += 1
            if kind == "info" and _text(parts).startswith(_COMPRESSED):
                self.compress(rid)
            return
        if kind not in ("user", "gemini"):
            self.result.reject(self.path, k, "unknown_record_type", f"record #{k}: message type {kind!r}", detail=carried(r))
            return
        self.result.imported += 1
        if kind == "user":
            responses = [p["functionResponse"] for p in parts if isinstance(p.get("functionResponse"), dict)]
            for n, fr in enumerate(responses):
                self.tool_result(f"{rid}#{n}" if len(responses) > 1 else rid, fr.get("id"), fr.get("name"),
                                 json.dumps(fr.get("response"), ensure_ascii=False), rid)
            if not responses:
                self.history.append(b.message("user", _text(parts), id=rid, author="user", meta={"record": rid}))
            return
        calls = [{"id": str(tc.get("id")), "name": str(tc.get("name", "")),
                  "arguments": tc.get("args") if isinstance(tc.get("args"), dict) else {}}
                 for tc in as_list(r.get("toolCalls")) if isinstance(tc, dict)]
        thoughts = [f"{t.get('subject', '')}: {t.get('description', '')}".strip(": ") for t in as_list(r.get("thoughts"))
                    if isinstance(t, dict)]
        mid = b.message("assistant", _text(parts), id=rid, tool_calls=calls, reasoning="\n\n".join(thoughts) or None,
                        author="model", meta={"record": rid, "model": r.get("model")})
        self.call(mid, r, calls)
        self.history.append(mid)
        self.pending = list(calls)
        for tc in as_list(r.get("toolCalls")):  # older recordings: results kept on the call, no user message
            if isinstance(tc, dict) and tc.get("result") is not None:
                res = tc["result"]
                fr = next((p["functionResponse"] for p in _parts(res) if isinstance(p.get("functionResponse"), dict)), None)
                text = json.dumps(fr.get("response"), ensure_ascii=False) if fr else _text(_parts(res))
                self.tool_result(f"{rid}:{tc.get('id')}", tc.get("id"), tc.get("name"), text, rid)

    def tool_result(self, mid: str, call_id: Any, name: Any, text: str, record: str) -> None:
        call = next((c for c in self.pending if call_id and c["id"] == str(call_id)), None) or \
            next((c for c in self.pending if c["name"] == name), None)
        if call is None:
            self.result.notes["orphan_tool_results_dropped"] += 1
            return
        self.pending.remove(call)
        self.history.append(self.b.message("tool", text, id=mid, tool_call_id=call["id"], name=call["name"],
                                           author="environment", meta={"record": record}))

    def compress(self, info_id: str) -> None:
        b = self.builder({})
        summary = b.message("user", OPAQUE_SUMMARY, id=f"{info_id}:summary", author="harness",
                            meta={"opaque": "gemini-cli compression summary", "record": info_id})
        ack = b.message("assistant", ACK, id=f"{info_id}:ack", author="harness", meta={"record": info_id})
        self.history = [summary, ack]
        self.pending = []
        self.compressed = info_id
        self.result.notes["compressions"] += 1

    def call(self, mid: str, r: dict, calls: list) -> None:
        if not self.history:
            self.result.notes["calls_without_context"] += 1
            return
        tokens = r.get("tokens") if isinstance(r.get("tokens"), dict) else {}
        fields: dict[str, Any] = {"meta": {"billed_tokens": billed.billed(tokens.get("input"), tokens.get("output"),
                                                                          r.get("model"), tokens.get("cached"))}}
        if self.compressed:
            fields.update(selected=False, reason=UNVERIFIED)
        fields["meta"] = {k: v for k, v in fields["meta"].items() if v}
        cid = self.b.call(list(self.history), mid, finish_reason="tool_calls" if calls else "stop", **fields)
        if self.prev is not None and self.history[:2] != self.prev[:2] and self.compressed \
                and self.history[0] == f"{self.compressed}:summary":
            self.b.eviction(cid, "summarize", [m for m in self.prev if m not in set(self.history)], self.history[:2],
                            trigger="auto", meta={"compression_info": self.compressed, "summary_opaque": True})
        self.prev = [*self.history, mid]


def _import_history(path: Path, data: Any, result: ImportResult) -> None:
    """A saved chat: Content[] (``history``, ``clientHistory`` or the bare list)."""
    contents = data if isinstance(data, list) else data.get("history") or data.get("clientHistory")
    if not isinstance(contents, list):
        result.reject(path, None, "bad_format", f"{path.name}: its history is not a list of contents")
        return
    b = TrajectoryBuilder(path.stem, task=Task(id=path.stem), lineage=Lineage(source=FORMAT, source_path=str(path)))
    history: list[str] = []
    pending: list[dict] = []
    compressed = False
    for k, c in enumerate(contents):
        if not role_message(result, path, k, c, ("user", "model"), noun="content", expected="{role: user|model, parts}"):
            continue
        parts = _parts(c.get("parts"))
        if c["role"] == "user":
            responses = [p["functionResponse"] for p in parts if isinstance(p.get("functionResponse"), dict)]
            for n, fr in enumerate(responses):
                call = next((x for x in pending if fr.get("id") and x["id"] == str(fr["id"])), None) or \
                    next((x for x in pending if x["name"] == fr.get("name")), None)
                if call is None:
                    result.notes["orphan_tool_results_dropped"] += 1
                    continue
                pending.remove(call)
                history.append(b.message("tool", json.dumps(fr.get("response"), ensure_ascii=False), id=f"c{k}#{n}",
                                         tool_call_id=call["id"], name=call["name"], author="environment"))
            if not responses:
                text = _text(parts)
                snapshot = k == 0 and "<state_snapshot>" in text
                compressed = compressed or snapshot
                history.append(b.message("user", text, id=f"c{k}", author="harness" if snapshot else "user"))
            continue
        calls = [{"id": str(p["functionCall"].get("id") or f"c{k}:call{n}"), "name": str(p["functionCall"].get("name", "")),
                  "arguments": p["functionCall"].get("args") if isinstance(p["functionCall"].get("args"), dict) else {}}
                 for n, p in enumerate(parts) if isinstance(p.get("functionCall"), dict)]
        thought = "".join(str(p.get("text", "")) for p in parts if p.get("thought"))
        is_ack = compressed and k == 1 and _text(parts) == ACK
        mid = b.message("assistant", _text(parts), id=f"c{k}", tool_calls=calls, reasoning=thought or None,
                        author="harness" if is_ack else "model")
        if history and not is_ack:
            fields = {"selected": False, "reason": UNVERIFIED} if compressed else {}
            b.call(list(history), mid, finish_reason="tool_calls" if calls else "stop", **fields)
        history.append(mid)
        pending = calls
    result.finish(b, path)
