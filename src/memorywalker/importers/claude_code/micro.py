"""Claude Code micro-compaction (``system`` / ``microcompact_boundary``): cleared tool results.

A boundary's ``microcompactMetadata {trigger, preTokens, tokensSaved, compactedToolIds,
clearedAttachmentUUIDs}`` names what it cleared for every call whose chain descends from it: each
listed tool result is sent as ``[Old tool result content cleared]`` (Claude Code's
``TIME_BASED_MC_CLEARED_MESSAGE``) and each listed attachment is left out. A boundary that names
nothing (2.1.x writes ``compactedToolIds: []`` when the results were deleted through the API's cache
editing) changes nothing in the replay; the billed-token check then finds the drop and
:func:`drop_hint` attributes the inferred eviction to the boundary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memorywalker.importers.base import opt_int, opt_str, str_list
from memorywalker.importers.claude_code.records import CLEARED, Rec
from memorywalker.records import Call

if TYPE_CHECKING:
    from memorywalker.importers.claude_code.records import Index
    from memorywalker.importers.claude_code.trajectory import ChainTrajectory


def above(index: Index, start: str | None) -> list[Rec]:
    """microcompact_boundary records the chain up to ``start`` descends from, oldest first (through
    earlier compactions via their ``logicalParentUuid``)."""
    out: list[Rec] = []
    uid, seen = start, set()
    while uid and uid not in seen:
        seen.add(uid)
        rec = index.by_uuid.get(uid)
        if rec is None:
            break
        o = rec.obj
        if o.get("type") == "system" and o.get("subtype") == "microcompact_boundary":
            out.append(rec)
        if o.get("type") == "system" and o.get("subtype") == "compact_boundary":
            uid = o.get("logicalParentUuid")
            continue
        uid = index.parent(rec, {})
    return out[::-1]


def apply(t: ChainTrajectory, context: list[str], boundaries: list[Rec]) -> tuple[list[str], list[tuple[Rec, list]]]:
    """``context`` with the tool results cleared by ``boundaries`` replaced by the placeholder (and
    cleared attachments left out); plus, per boundary that names something, (boundary,
    [(removed message, placeholder or None)])."""
    events = []
    for mb in boundaries:
        md = mb.obj.get("microcompactMetadata") if isinstance(mb.obj.get("microcompactMetadata"), dict) else {}
        tool_ids = set(str_list(md.get("compactedToolIds")))
        attached = set(str_list(md.get("clearedAttachmentUUIDs")))
        if not tool_ids and not attached:
            continue
        out, pairs = [], []
        for mid in context:
            m = t.message(mid)
            if m.role == "tool" and m.tool_call_id in tool_ids and not m.meta.get("cleared_by"):
                ph = placeholder(t, m, mb)
                out.append(ph)
                pairs.append((mid, ph))
            elif t.msg_uuid.get(mid) in attached:
                pairs.append((mid, None))
            else:
                out.append(mid)
        context = out
        events.append((mb, pairs))
    return context, events


def placeholder(t: ChainTrajectory, m, boundary: Rec) -> str:
    if m.id not in t.placeholders:
        meta: dict[str, Any] = {"cleared_by": boundary.uuid, "inferred_text": True}
        saved = t.source.with_suffix("") / "tool-results"
        hits = sorted(saved.glob(f"{m.tool_call_id}*")) if saved.is_dir() else []
        if hits:
            meta["full_result_file"] = str(hits[0])
        t.placeholders[m.id] = t.b.message("tool", CLEARED, id=f"{m.id}:cleared", tool_call_id=m.tool_call_id,
                                           author="harness", meta=meta)
    return t.placeholders[m.id]


def record_evictions(t: ChainTrajectory, cid: str, cleared: list[tuple[Rec, list]]) -> None:
    """One ``prune`` eviction per micro-compaction, before the first call that no longer sees what an
    earlier call saw."""
    for mb, pairs in cleared:
        new = [(r, i) for r, i in pairs if r in t.delivered and r not in t.evicted]
        t.result.notes["cleared_before_delivery"] += sum(1 for r, _ in pairs if r not in t.delivered and r not in t.evicted)
        t.evicted.update(r for r, _ in pairs if r not in t.delivered)
        if not new:
            continue
        t.evicted.update(r for r, _ in new)
        md = mb.obj.get("microcompactMetadata") if isinstance(mb.obj.get("microcompactMetadata"), dict) else {}
        t.b.eviction(cid, "prune", [r for r, _ in new], [i for _, i in new if i is not None],
                     trigger=opt_str(md.get("trigger")), tokens_before=opt_int(md.get("preTokens")),
                     meta={"microcompact_boundary": mb.uuid, "tokens_saved": md.get("tokensSaved"),
                           "placeholder_text_inferred": True})
        t.result.notes["microcompactions"] += 1


def drop_hint(t: ChainTrajectory):
    """The billed-token hint: a drop between two calls that a micro-compaction without ids lies between
    is that micro-compaction (``prune``, its trigger and token counts); anything else is ``other``."""
    def hint(prev: Call, call: Call) -> dict[str, Any]:
        seen = {mb.uuid for mb in t.micro_above.get(prev.id, ())}
        new = [mb for mb in t.micro_above.get(call.id, ()) if mb.uuid not in seen]
        if not new:
            return {}
        md = new[-1].obj.get("microcompactMetadata") if isinstance(new[-1].obj.get("microcompactMetadata"), dict) else {}
        md = md if isinstance(md, dict) else {}
        t.result.notes["microcompactions_inferred"] += 1
        return {"kind": "prune", "trigger": opt_str(md.get("trigger")), "tokens_before": opt_int(md.get("preTokens")),
                "meta": {"microcompact_boundary": new[-1].uuid, "tokens_saved": md.get("tokensSaved"),
                         "removed_unknown": "the boundary names no tool result or attachment"}}
    return hint
