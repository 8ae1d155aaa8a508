"""Claude Code session records: reading them, the parentUuid index, and the relinks a compaction makes.

Every record is counted once (imported, skipped under its kind, or rejected with its reason); a record
of an unknown type or an attachment whose text is unknown is still a link of the parentUuid chain, and
what it carried is kept in its reject's ``detail``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from memorywalker.importers.base import ImportResult, as_text, carried, read_jsonl, str_list
from memorywalker.importers.claude_code import attachments, requests

CONVERSATION = {"user", "assistant"}
# Record types that are written for the UI or bookkeeping and never reach the model.
NOT_SENT = {"progress", "file-history-snapshot", "queue-operation", "summary", "custom-title", "tag",
            "agent-name", "pr-link", "last-prompt", "ai-title", "mode", "agent-color", "agent-setting",
            "permission-mode", "worktree-state",
            # 2.1.3xx bookkeeping: the requests' messages are known exactly (api-request) and hold none of these
            "atis-latch", "tools-used", "cost-state"}
CLEARED = "[Old tool result content cleared]"  # Claude Code TIME_BASED_MC_CLEARED_MESSAGE
STOP = {"tool_use": "tool_calls", "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
        "refusal": "content_filter", "pause_turn": "stop"}


@dataclass
class Rec:
    obj: dict
    source: Path
    line: int
    order: float  # global file order (main file first, then subagent files); preserved copies move before their boundary

    @property
    def uuid(self) -> str | None:
        return self.obj.get("uuid")

    @property
    def parent(self) -> str | None:
        return self.obj.get("parentUuid")


@dataclass
class Index:
    by_uuid: dict[str, Rec] = field(default_factory=dict)
    results: dict[str, list[tuple[Rec, int]]] = field(default_factory=lambda: defaultdict(list))
    groups: dict[str, list[Rec]] = field(default_factory=lambda: defaultdict(list))
    missing: set[str] = field(default_factory=set)  # uuids whose parent is absent
    orig_parent: dict[str, str | None] = field(default_factory=dict)  # preserved uuid -> pre-compaction parent
    boundaries: list[tuple[float, dict[str, str]]] = field(default_factory=list)  # (order, relinks) per compact_boundary
    artifacts: set[str] = field(default_factory=set)  # uuids of records a compaction wrote (summary, attachments)
    microcompacts: dict[str, Rec] = field(default_factory=dict)
    api: requests.RequestLog = field(default_factory=requests.RequestLog)  # api-request chain (2.1.3xx)

    def parent(self, rec: Rec, relink: dict[str, str]) -> str | None:
        if rec.uuid in relink:
            return relink[rec.uuid]
        return self.orig_parent.get(rec.uuid, rec.parent) if rec.uuid else rec.parent

    def relinks_at(self, order: float) -> dict[str, str]:
        """The chain relinks in force for a call at ``order``: those of the newest compact_boundary before it."""
        i = bisect_left([o for o, _ in self.boundaries], order)
        return self.boundaries[i - 1][1] if i else {}

    def add(self, rec: Rec) -> None:
        if rec.uuid:
            self.by_uuid[rec.uuid] = rec
        o = rec.obj
        if o.get("type") == "assistant":
            self.groups[group_key(o)].append(rec)
        elif o.get("type") == "user":
            content = (o.get("message") or {}).get("content")
            for k, block in enumerate(content if isinstance(content, list) else []):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    self.results[block.get("tool_use_id")].append((rec, k))


def group_key(obj: dict) -> str:
    m = obj.get("message") or {}
    return m.get("id") or obj.get("requestId") or obj.get("uuid") or ""



def read_file(f: Path, index: Index, result: ImportResult, order: int) -> tuple[list[Rec], int]:
    """The conversation records of one file, indexed; returns them and the next global order."""
    recs = []
    for line, obj in read_jsonl(f, result):
        kind = obj.get("type")
        bad = next((k for k in ("uuid", "parentUuid", "logicalParentUuid") if not isinstance(obj.get(k), str | None)), None)
        if bad is not None:
            result.reject(f, line, "wrong_type", f"line {line}: {bad} is not text", detail=carried(obj))
            continue
        if kind in CONVERSATION or kind in ("system", "attachment"):
            if kind in CONVERSATION and not isinstance(obj.get("message"), dict):
                result.reject(f, line, "missing_field", f"line {line}: {kind} record without a message")
                continue
            if kind == "attachment" and not isinstance(obj.get("attachment"), dict):
                result.reject(f, line, "missing_field", f"line {line}: attachment record without an attachment")
                continue
            if obj.get("uuid") and obj["uuid"] in index.by_uuid:
                # A record written again (partial compaction re-writes the preserved messages):
                # the first copy holds the original parent, order and timestamp.
                result.skipped["duplicate_uuid"] += 1
                continue
            rec = Rec(obj, f, line, order)
            order += 1
            index.add(rec)
            recs.append(rec)
            if kind == "system" and obj.get("subtype") not in ("compact_boundary", "microcompact_boundary"):
                result.skipped[f"system:{obj.get('subtype')}"] += 1
            elif kind == "attachment":
                a_kind = obj["attachment"].get("type")
                sent = attachments.render(obj["attachment"])
                if sent is None:
                    result.reject(f, line, "unknown_record_type",
                                  f"line {line}: attachment type {a_kind!r}: what Claude Code sends for it is not "
                                  "known; kept as a link of the parentUuid chain", detail=carried(obj["attachment"]))
                elif not sent:
                    result.skipped[f"attachment:{a_kind}"] += 1
                else:
                    result.imported += 1
            else:
                result.imported += 1
                if obj.get("subtype") == "microcompact_boundary" and obj.get("uuid"):
                    index.microcompacts[obj["uuid"]] = rec
        elif kind in requests.KINDS:
            why = index.api.add(obj)
            if why is None:
                result.imported += 1
            else:
                result.reject(f, line, "missing_field", f"line {line}: {why}", detail=carried(obj))
        elif kind in NOT_SENT:
            result.skipped[kind] += 1
            if obj.get("uuid"):  # still a link of the parentUuid chain
                index.by_uuid[obj["uuid"]] = Rec(obj, f, line, order)
                order += 1
        else:
            result.reject(f, line, "unknown_record_type", f"line {line}: record type {kind!r}"
                          + ("; kept as a link of the parentUuid chain" if obj.get("uuid") else ""), detail=carried(obj))
            if obj.get("uuid"):
                index.by_uuid[obj["uuid"]] = Rec(obj, f, line, order)
                order += 1
    return recs, order


def index_request_messages(index: Index) -> None:
    """Let the request log find the messages written as records (responses, user records) by hash."""
    if not index.api:
        return
    for recs in index.groups.values():
        index.api.add_message({"role": "assistant", "content": [b for r in recs for b in blocks(r.obj)]})
    for rec in index.by_uuid.values():
        if rec.obj.get("type") == "user" and isinstance(rec.obj.get("message"), dict):
            index.api.add_message({"role": "user", "content": rec.obj["message"].get("content")})


def reject_orphan_results(per_file: dict[Path, list[Rec]], index: Index, result: ImportResult) -> None:
    """Tool results whose ``tool_use_id`` matches no tool_use of the input never reach a context: a
    record of nothing else is rejected (``orphan_tool_result``, not imported); a record with more in
    it is kept with that warning. (A result whose tool_use is in the input but not in a call's
    context - compacted away - is left out of that context only: ``orphan_tool_results_dropped``.)"""
    issued = {as_text(b.get("id")) for recs in index.groups.values() for rec in recs for b in blocks(rec.obj)
              if b.get("type") in ("tool_use", "server_tool_use")}
    for f, recs in per_file.items():
        for rec in recs:
            content = rec.obj["message"].get("content") if rec.obj.get("type") == "user" else None
            if not isinstance(content, list):
                continue
            orphans = [as_text(b.get("tool_use_id")) for b in content if isinstance(b, dict)
                       and b.get("type") == "tool_result" and as_text(b.get("tool_use_id")) not in issued]
            if not orphans:
                continue
            whole = len(orphans) == len(content)  # nothing else in the record reaches the model
            result.imported -= whole
            result.reject(f, rec.line, "orphan_tool_result", f"line {rec.line}: tool result for "
                          f"{', '.join(map(repr, orphans))}, which no tool_use in the input issued; left out",
                          kept=not whole)


def blocks(obj: dict) -> list[dict]:
    """The content blocks of a record's message (a string content is one text block)."""
    content = (obj.get("message") or {}).get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def resolve_compactions(recs: list[Rec], index: Index, result: ImportResult) -> None:
    """Per compact_boundary of one file: its preserved messages, the relinks Claude Code applies on
    load, and the records the compaction wrote (summary, re-attached files, ...)."""
    for k, b in enumerate(recs):
        o = b.obj
        if o.get("type") != "system" or o.get("subtype") != "compact_boundary":
            continue
        meta = o.get("compactMetadata")
        preserved, anchor = preserved_of(meta if isinstance(meta, dict) else {}, index, result)
        for r in recs[k + 1:]:  # the records written with the compaction, up to the next real message
            ro = r.obj
            if r.uuid in preserved:
                continue
            if ro.get("type") == "assistant" or (
                    ro.get("type") == "user" and not ro.get("isCompactSummary") and not ro.get("isMeta")):
                break
            index.artifacts.add(r.uuid)
        relink: dict[str, str] = {}
        if preserved:
            for i, u in enumerate(preserved):
                rec = index.by_uuid[u]
                first_parent = rec.obj.get("logicalParentUuid") or rec.parent
                if first_parent not in (anchor, b.uuid):  # written with its pre-compaction parent
                    index.orig_parent[u] = first_parent
                elif i:
                    index.orig_parent[u] = preserved[i - 1]
                relink[u] = preserved[i - 1] if i else anchor
            tail = preserved[-1]
            for r in recs[k + 1:]:
                if r.parent == anchor and r.uuid not in relink:
                    relink[r.uuid] = tail
            # Preserved records written after the boundary were sampled before it.
            late = [index.by_uuid[u] for u in preserved if index.by_uuid[u].order > b.order]
            for i, rec in enumerate(late):
                rec.order = b.order - 1 + (i + 1) / (len(late) + 1)
            result.notes["preserved_messages"] += len(preserved)
        index.boundaries.append((b.order, relink))
    index.boundaries.sort(key=lambda x: x[0])


def preserved_of(meta: dict, index: Index, result: ImportResult) -> tuple[list[str], str | None]:
    """(preserved uuids oldest first, anchor uuid); ``preservedMessages`` wins over ``preservedSegment``."""
    listed = meta.get("preservedMessages")
    if isinstance(listed, dict) and str_list(listed.get("uuids")):
        named = list(dict.fromkeys(str_list(listed["uuids"])))
        uuids = [u for u in named if u in index.by_uuid]
        if len(uuids) < len(named):
            result.notes["preserved_messages_missing"] += len(named) - len(uuids)
        return uuids, listed.get("anchorUuid")
    seg = meta.get("preservedSegment")
    if not isinstance(seg, dict):
        return [], None
    walk, uid, seen = [], seg.get("tailUuid"), set()
    while uid and uid in index.by_uuid and uid not in seen:
        seen.add(uid)
        walk.append(uid)
        if uid == seg.get("headUuid"):
            return walk[::-1], seg.get("anchorUuid")
        rec = index.by_uuid[uid]
        uid = rec.obj.get("logicalParentUuid") or rec.parent
    result.notes["preserved_segment_unresolved"] += 1  # Claude Code then drops the segment too
    return [], None


def root_of(rec: Rec, index: Index) -> str:
    seen = set()
    while rec.parent and rec.parent in index.by_uuid and rec.uuid not in seen:
        seen.add(rec.uuid)
        rec = index.by_uuid[rec.parent]
    return rec.uuid or ""
