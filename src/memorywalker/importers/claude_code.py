"""Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``) → trajectories.

* **Calls.** One call per model response. Claude Code writes one record per content block, so the
  records sharing ``message.id`` (or ``requestId``) are one response; their text, thinking and
  tool_use blocks are merged into one assistant message.
* **Contexts.** The context of a call is the ``parentUuid`` chain the model saw, walked back from
  the response's first record to the newest ``compact_boundary`` (whose ``parentUuid`` is null).
  Parallel tool uses branch that chain (each result hangs off its own tool_use record), so the
  results of every tool_use of an assistant message are placed right after it, as the API
  requires, whatever branch they were written on.
* **Compaction.** Each ``compact_boundary`` is a white-box ``summarize`` eviction before the first
  call after it: ``trigger`` and ``preTokens`` kept, removed = the pre-compaction chain (found
  through ``logicalParentUuid``), inserted = the ``isCompactSummary`` message (author ``harness``).
  The summarization call in ``subagents/agent-acompact-*.jsonl`` is a call whose context is the
  pre-compaction chain plus its own prompt.
* **Partial compaction** (2.1.x): a boundary whose ``compactMetadata`` carries ``preservedMessages``
  (``anchorUuid``, ``uuids``) or ``preservedSegment`` (``headUuid``, ``anchorUuid``, ``tailUuid``) kept
  those messages after the summary. Calls after the boundary walk the chain as Claude Code relinks it
  on load (head → anchor, the anchor's other children → tail); calls whose response is a preserved
  message keep the pre-compaction chain they were sampled in.
* **Micro-compaction.** A ``microcompact_boundary`` clears the tool results it lists
  (``compactedToolIds``) for every call that descends from it: each is sent as
  "[Old tool result content cleared]" (a ``prune`` eviction inserting that placeholder).
* **Attachments.** ``type: "attachment"`` records become the messages Claude Code sends for them
  (see :mod:`memorywalker.importers.claude_code_attachments`).
* **Subagents.** ``subagents/agent-<id>.jsonl`` (Task tool) and, in older versions, ``isSidechain``
  chains inside the session file become their own trajectories linked by lineage.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memorywalker.importers import claude_code_attachments as attachments
from memorywalker.importers.base import ImportOptions, ImportResult, content_text, read_jsonl
from memorywalker.records import Lineage, Task, TrajectoryBuilder

FORMAT = "claude-code"

_CONVERSATION = {"user", "assistant"}
# Record types that are written for the UI or bookkeeping and never reach the model.
_NOT_SENT = {"progress", "file-history-snapshot", "queue-operation", "summary", "custom-title", "tag",
             "agent-name", "pr-link", "last-prompt", "ai-title", "mode", "agent-color", "agent-setting",
             "permission-mode", "worktree-state"}
CLEARED = "[Old tool result content cleared]"  # Claude Code TIME_BASED_MC_CLEARED_MESSAGE
_STOP = {"tool_use": "tool_calls", "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
         "refusal": "content_filter", "pause_turn": "stop"}


@dataclass
class _Rec:
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
class _Index:
    by_uuid: dict[str, _Rec] = field(default_factory=dict)
    results: dict[str, list[tuple[_Rec, int]]] = field(default_factory=lambda: defaultdict(list))
    groups: dict[str, list[_Rec]] = field(default_factory=lambda: defaultdict(list))
    missing: set[str] = field(default_factory=set)  # uuids whose parent is absent
    orig_parent: dict[str, str | None] = field(default_factory=dict)  # preserved uuid -> pre-compaction parent
    boundaries: list[tuple[float, dict[str, str]]] = field(default_factory=list)  # (order, relinks) per compact_boundary
    artifacts: set[str] = field(default_factory=set)  # uuids of records a compaction wrote (summary, attachments)
    microcompacts: dict[str, _Rec] = field(default_factory=dict)

    def parent(self, rec: _Rec, relink: dict[str, str]) -> str | None:
        if rec.uuid in relink:
            return relink[rec.uuid]
        return self.orig_parent.get(rec.uuid, rec.parent) if rec.uuid else rec.parent

    def relinks_at(self, order: float) -> dict[str, str]:
        """The chain relinks in force for a call at ``order``: those of the newest compact_boundary before it."""
        i = bisect_left([o for o, _ in self.boundaries], order)
        return self.boundaries[i - 1][1] if i else {}

    def add(self, rec: _Rec) -> None:
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


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    result = ImportResult()
    for path in paths:
        if path.is_dir():
            files = sorted(path.glob("*.jsonl"))
            # Subagent transcripts whose session file is not there are imported on their own.
            orphans = sorted(f for f in path.glob("*/subagents/agent-*.jsonl")
                             if not (path / f"{f.parent.parent.name}.jsonl").exists())
            if path.name == "subagents":
                files, orphans = [], sorted(path.glob("agent-*.jsonl"))
        else:
            files, orphans = ([], [path]) if path.parent.name == "subagents" else ([path], [])
        for f in files:
            result.add(import_session(f))
        for f in orphans:
            result.add(import_orphan_subagent(f))
    return result


def import_orphan_subagent(path: Path) -> ImportResult:
    """A ``<session>/subagents/agent-<id>.jsonl`` imported without its session file, with a warning.

    A Task subagent's chain starts at its own prompt, so its calls are complete; only the link to the
    spawning call is unknown (``lineage.parent`` names the session, ``parent_call`` is None). A
    compaction's summarization call (``agent-acompact-*``) is rejected: its context is the session's
    pre-compaction chain, which is in the missing file.
    """
    result = ImportResult()
    index = _Index()
    session_id = path.parent.parent.name
    session_file = path.parent.parent.with_suffix(".jsonl")
    why = "is not in the input" if session_file.exists() else "does not exist"
    recs, _ = _read_file(path, index, result, 0)
    if path.name.startswith("agent-acompact"):
        result.reject(path, None, "missing_parent", f"{path.name}: a compaction's summarization call; its "
                      f"context is in the session file {session_file.name}, which {why}")
        return result
    _resolve_compactions(recs, index, result)
    for rec in recs:
        if rec.parent and rec.parent not in index.by_uuid:
            index.missing.add(rec.uuid)
            result.reject(path, rec.line, "missing_parent",
                          f"line {rec.line}: parentUuid {rec.parent!r} is not in the input; the context behind it is cut",
                          kept=True)
    agent_id = path.stem.removeprefix("agent-")
    sub = _Trajectory(f"{session_id}/agent-{agent_id}", path, index, result, lineage=Lineage(
        parent=session_id, relation="subagent", source=FORMAT, source_path=str(path)))
    sub.add_calls(recs)
    if sub.finish() is not None:
        result.reject(path, None, "orphan_subagent", f"{path.name}: imported on its own; the session file "
                      f"{session_file.name} {why}, so the call that spawned it is unknown", kept=True)
        result.notes["subagents_orphan"] += 1
    return result


def import_session(path: Path) -> ImportResult:
    """One session file plus its ``<session>/subagents/*.jsonl``."""
    result = ImportResult()
    index = _Index()
    main: list[_Rec] = []
    order = 0
    sub_dir = path.with_suffix("") / "subagents"
    sub_files = sorted(sub_dir.glob("*.jsonl")) if sub_dir.is_dir() else []
    per_file: dict[Path, list[_Rec]] = {}
    for f in [path, *sub_files]:
        per_file[f], order = _read_file(f, index, result, order)
    main = per_file.get(path, [])
    for recs in per_file.values():
        _resolve_compactions(recs, index, result)
    _reject_orphan_results(per_file, index, result)
    for f, recs in per_file.items():
        for rec in recs:
            p = rec.parent
            if p and p not in index.by_uuid:
                index.missing.add(rec.uuid)
                result.reject(f, rec.line, "missing_parent",
                              f"line {rec.line}: parentUuid {p!r} is not in the input; the context behind it is cut",
                              kept=True)

    session_id = next((r.obj.get("sessionId") for r in main if r.obj.get("sessionId")), path.stem)
    main_chain = [r for r in main if not r.obj.get("isSidechain")]
    trajectory = _Trajectory(session_id, path, index, result, lineage=Lineage(source=FORMAT, source_path=str(path)))
    for f in sub_files:
        if f.name.startswith("agent-acompact"):
            trajectory.summarization_calls(per_file[f])
    trajectory.add_calls(main_chain)
    traj = trajectory.finish()

    # Task subagents: subagents/agent-<id>.jsonl, linked through toolUseResult.agentId.
    spawned = _spawning_calls(trajectory, main_chain)
    for f in sub_files:
        if f.name.startswith("agent-acompact"):
            continue
        agent_id = f.stem.removeprefix("agent-")
        parent_call = spawned.get(agent_id)
        sub = _Trajectory(f"{session_id}/agent-{agent_id}", f, index, result, lineage=Lineage(
            parent=traj.id if traj else None, parent_call=parent_call, relation="subagent",
            source=FORMAT, source_path=str(f)))
        sub.add_calls(per_file[f])
        sub.finish()
        result.notes["subagents_linked" if parent_call else "subagents_unlinked"] += 1

    # Older versions keep Task subagents inline as isSidechain chains.
    side = [r for r in main if r.obj.get("isSidechain")]
    roots: dict[str, list[_Rec]] = defaultdict(list)
    for rec in side:
        roots[_root_of(rec, index)].append(rec)
    prompts = _task_prompts(trajectory, main_chain)
    for root, recs in roots.items():
        first_user = next((r for r in recs if r.obj.get("type") == "user"), None)
        prompt = content_text((first_user.obj.get("message") or {}).get("content")) if first_user else ""
        parent_call = prompts.get(prompt.strip())
        sub = _Trajectory(f"{session_id}/sidechain-{root[:8]}", path, index, result, lineage=Lineage(
            parent=traj.id if traj else None, parent_call=parent_call, relation="subagent",
            source=FORMAT, source_path=str(path)))
        sub.add_calls(recs)
        sub.finish()
        result.notes["sidechain_subagents"] += 1
    return result


def _read_file(f: Path, index: _Index, result: ImportResult, order: int) -> tuple[list[_Rec], int]:
    """The conversation records of one file, indexed; returns them and the next global order."""
    recs = []
    for line, obj in read_jsonl(f, result):
        kind = obj.get("type")
        if kind in _CONVERSATION or kind in ("system", "attachment"):
            if kind in _CONVERSATION and not isinstance(obj.get("message"), dict):
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
            rec = _Rec(obj, f, line, order)
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
                                  f"line {line}: attachment type {a_kind!r}: what Claude Code sends for it is not known")
                elif not sent:
                    result.skipped[f"attachment:{a_kind}"] += 1
                else:
                    result.imported += 1
            else:
                result.imported += 1
                if obj.get("subtype") == "microcompact_boundary" and obj.get("uuid"):
                    index.microcompacts[obj["uuid"]] = rec
        elif kind in _NOT_SENT:
            result.skipped[kind] += 1
            if obj.get("uuid"):  # still a link of the parentUuid chain
                index.by_uuid[obj["uuid"]] = _Rec(obj, f, line, order)
                order += 1
        else:
            result.reject(f, line, "unknown_record_type", f"line {line}: record type {kind!r}")
            if obj.get("uuid"):
                index.by_uuid[obj["uuid"]] = _Rec(obj, f, line, order)
                order += 1
    return recs, order


def _reject_orphan_results(per_file: dict[Path, list[_Rec]], index: _Index, result: ImportResult) -> None:
    """Tool results whose ``tool_use_id`` matches no tool_use of the input never reach a context: a
    record of nothing else is rejected (``orphan_tool_result``, not imported); a record with more in
    it is kept with that warning."""
    issued = {b.get("id") for recs in index.groups.values() for rec in recs for b in _blocks(rec.obj)
              if b.get("type") in ("tool_use", "server_tool_use")}
    for f, recs in per_file.items():
        for rec in recs:
            if rec.obj.get("type") != "user" or not isinstance(rec.obj["message"].get("content"), list):
                continue
            blocks = _blocks(rec.obj)
            orphans = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"
                       and b.get("tool_use_id") not in issued]
            if not orphans:
                continue
            whole = len(orphans) == len(blocks)
            result.imported -= whole
            result.reject(f, rec.line, "orphan_tool_result", f"line {rec.line}: tool result for "
                          f"{', '.join(map(repr, orphans))}, which no tool_use in the input issued; left out",
                          kept=not whole)


def _resolve_compactions(recs: list[_Rec], index: _Index, result: ImportResult) -> None:
    """Per compact_boundary of one file: its preserved messages, the relinks Claude Code applies on
    load, and the records the compaction wrote (summary, re-attached files, ...)."""
    for k, b in enumerate(recs):
        o = b.obj
        if o.get("type") != "system" or o.get("subtype") != "compact_boundary":
            continue
        preserved, anchor = _preserved(o.get("compactMetadata") or {}, index, result)
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


def _preserved(meta: dict, index: _Index, result: ImportResult) -> tuple[list[str], str | None]:
    """(preserved uuids oldest first, anchor uuid); ``preservedMessages`` wins over ``preservedSegment``."""
    listed = meta.get("preservedMessages")
    if isinstance(listed, dict) and listed.get("uuids"):
        uuids = [u for u in listed["uuids"] if u in index.by_uuid]
        if len(uuids) < len(listed["uuids"]):
            result.notes["preserved_messages_missing"] += len(listed["uuids"]) - len(uuids)
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


def _root_of(rec: _Rec, index: _Index) -> str:
    seen = set()
    while rec.parent and rec.parent in index.by_uuid and rec.uuid not in seen:
        seen.add(rec.uuid)
        rec = index.by_uuid[rec.parent]
    return rec.uuid or ""


def _spawning_calls(t: _Trajectory, recs: list[_Rec]) -> dict[str, str]:
    """agentId -> id of the call whose Task tool_use the agent answered."""
    out = {}
    for rec in recs:
        tur = rec.obj.get("toolUseResult")
        if rec.obj.get("type") != "user" or not isinstance(tur, dict) or "agentId" not in tur:
            continue
        for block in (rec.obj.get("message") or {}).get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                call = t.call_of_tool_use.get(block.get("tool_use_id"))
                if call:
                    out[str(tur["agentId"])] = call
    return out


def _task_prompts(t: _Trajectory, recs: list[_Rec]) -> dict[str, str]:
    out = {}
    for rec in recs:
        if rec.obj.get("type") != "assistant":
            continue
        for block in (rec.obj.get("message") or {}).get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "Task":
                prompt = str((block.get("input") or {}).get("prompt", "")).strip()
                if prompt and block.get("id") in t.call_of_tool_use:
                    out[prompt] = t.call_of_tool_use[block["id"]]
    return out


class _Trajectory:
    """Builds one trajectory from the conversation records of one chain family."""

    def __init__(self, traj_id: str, source: Path, index: _Index, result: ImportResult, lineage: Lineage):
        self.b = TrajectoryBuilder(traj_id, task=Task(id=traj_id), lineage=lineage)
        self.source, self.index, self.result = source, index, result
        self.msg_ids: dict[str, list[str]] = {}  # record uuid / group key -> message ids
        self.call_of_tool_use: dict[str, str] = {}
        self.boundary_of_call: dict[str, str | None] = {}
        self.pending_summaries: list[tuple[str, _Rec]] = []  # (timestamp, response record)
        self.summary_call_ids: list[tuple[str, str]] = []
        self.msg_uuid: dict[str, str] = {}  # message id -> uuid of the record it came from
        self.placeholders: dict[str, str] = {}  # cleared tool message id -> its placeholder
        self.delivered: set[str] = set()
        self.evicted: set[str] = set()

    # --- messages ---------------------------------------------------------------------------------

    def _assistant(self, key: str) -> list[str]:
        if key in self.msg_ids:
            return self.msg_ids[key]
        recs = self.index.groups[key]
        texts, thinking, tool_calls = [], [], []
        for rec in recs:
            for block in _blocks(rec.obj):
                kind = block.get("type")
                if kind == "text":
                    texts.append(block.get("text", ""))
                elif kind == "thinking":
                    thinking.append(block.get("thinking", ""))
                    self.result.notes["thinking_blocks"] += 1
                elif kind == "redacted_thinking":
                    self.result.notes["redacted_thinking_blocks"] += 1
                elif kind in ("tool_use", "server_tool_use"):
                    tool_calls.append({"id": block.get("id"), "name": block.get("name", ""),
                                       "arguments": block.get("input") or {}})
                else:
                    self.result.notes[f"assistant_block:{kind}"] += 1
        first = recs[0].obj
        stop = next((r.obj["message"].get("stop_reason") for r in reversed(recs) if r.obj["message"].get("stop_reason")), None)
        meta = {"uuids": [r.uuid for r in recs], "model": first["message"].get("model"),
                "stop_reason": stop, "timestamp": first.get("timestamp")}
        if first.get("isApiErrorMessage") or first["message"].get("model") == "<synthetic>":
            meta["synthetic"] = True
        mid = self.b.message("assistant", "\n\n".join(texts), id=recs[0].uuid or key,
                             reasoning="\n\n".join(thinking) or None, tool_calls=tool_calls,
                             author="model", meta={k: v for k, v in meta.items() if v is not None})
        self.msg_ids[key] = [mid]
        return self.msg_ids[key]

    def _user(self, rec: _Rec) -> list[tuple[str, str | None]]:
        """(message id, tool_use_id or None) of a user record's messages."""
        if rec.uuid in self.msg_ids:
            return self.msg_ids[rec.uuid]
        o = rec.obj
        content = o["message"].get("content")
        out: list[tuple[str, str | None]] = []
        texts = []
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        n_results = sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result")
        for k, block in enumerate(blocks):
            if not isinstance(block, dict):
                texts.append(str(block))
            elif block.get("type") == "tool_result":
                is_error = bool(block.get("is_error"))
                self.result.notes["tool_results_is_error"] += is_error
                mid = self.b.message("tool", content_text(block.get("content")),
                                     id=rec.uuid if n_results == 1 else f"{rec.uuid}#{k}",
                                     tool_call_id=block.get("tool_use_id"), author="environment",
                                     meta={"is_error": True} if is_error else {})
                out.append((mid, block.get("tool_use_id")))
            elif block.get("type") == "image":
                self.result.notes["images"] += 1
                texts.append("[image]")
            else:
                texts.append(block.get("text", ""))
        if texts and (n_results == 0 or any(t.strip() for t in texts)):
            meta: dict[str, Any] = {"timestamp": o.get("timestamp")}
            if o.get("isCompactSummary"):
                author = "harness"
                meta["compact_summary"] = True
            elif o.get("isMeta"):
                author = "system"  # a harness reminder, not a compression artifact
                meta["is_meta"] = True
                self.result.notes["is_meta_messages"] += 1
            else:
                author = "user"
            mid = self.b.message("user", "\n\n".join(texts), id=rec.uuid if not out else f"{rec.uuid}#text",
                                 author=author, meta=meta)
            out.append((mid, None))
        self.msg_ids[rec.uuid] = out
        return out

    def _attachment(self, rec: _Rec) -> list[tuple[str, str | None]]:
        """(message id, tool call id it issues or None) of an attachment record's messages."""
        if rec.uuid in self.msg_ids:
            return self.msg_ids[rec.uuid]
        att = rec.obj["attachment"]
        sent = attachments.render(att) or []
        artifact = rec.uuid in self.index.artifacts
        out: list[tuple[str, str | None]] = []
        call_id = f"attachment-{rec.uuid}"
        for k, m in enumerate(sent):
            meta = {"attachment": att.get("type"), "uuid": rec.uuid, "timestamp": rec.obj.get("timestamp")}
            if artifact:
                meta["compaction_artifact"] = True
            fields: dict[str, Any] = {}
            if m.get("tool_calls"):
                fields["tool_calls"] = [{"id": call_id, **tc} for tc in m["tool_calls"]]
            if m["role"] == "tool":
                fields.update(tool_call_id=call_id, name=m.get("name"))
            mid = self.b.message(m["role"], m["content"], id=rec.uuid if len(sent) == 1 else f"{rec.uuid}#{k}",
                                 author="harness" if artifact else "system", meta=meta, **fields)
            out.append((mid, call_id if m.get("tool_calls") else None))
            self.msg_uuid[mid] = rec.uuid
        self.result.notes["attachment_messages"] += len(out)
        self.msg_ids[rec.uuid] = out
        return out

    # --- contexts ---------------------------------------------------------------------------------

    def _chain(self, start: str | None, at: float, own: str | None = None) -> tuple[list[_Rec], _Rec | None, str | None]:
        """Records from the chain root (or newest compact_boundary) to ``start``, oldest first, as the
        chain stood for a call at order ``at`` (with the relinks of the compaction before it), and why
        the chain is incomplete (None when it is whole): ``context_gap`` (a parent is missing) or
        ``parent_cycle`` (the parentUuid links loop, or lead back to the response ``own`` itself; the
        chain is cut where the loop closes)."""
        chain, boundary, gap, seen = [], None, None, set()
        relink = self.index.relinks_at(at)
        uid = start
        while uid:
            rec = self.index.by_uuid.get(uid)
            if rec is None:
                gap = "context_gap"
                break
            if uid in seen or (own is not None and rec.obj.get("type") == "assistant" and group_key(rec.obj) == own):
                gap = "parent_cycle"
                break
            seen.add(uid)
            if rec.obj.get("type") == "system" and rec.obj.get("subtype") == "compact_boundary":
                boundary = rec
                break
            chain.append(rec)
            if rec.uuid in self.index.missing and rec.uuid not in relink:
                gap = gap or "context_gap"
            uid = self.index.parent(rec, relink)
        chain.reverse()
        return chain, boundary, gap

    def _context(self, chain: list[_Rec], before: int) -> list[str]:
        """Message ids of a chain as the API saw them; tool results follow their tool_use message."""
        ctx: list[str] = []
        placed: set[str] = set()
        issued: set[str] = set()

        def put(mid: str) -> None:
            if mid not in placed:
                placed.add(mid)
                ctx.append(mid)

        for rec in chain:
            kind = rec.obj.get("type")
            if kind == "assistant":
                key = group_key(rec.obj)
                (mid,) = self._assistant(key)
                if mid in placed:
                    continue
                put(mid)
                for tc in self.b.messages[self._pos(mid)].tool_calls:
                    issued.add(tc.id)
                    hits = [h for h in self.index.results.get(tc.id, []) if h[0].order < before]
                    if not hits:
                        continue
                    res_rec = hits[0][0]
                    for rid, tu in self._user(res_rec):
                        if tu == tc.id:
                            put(rid)
            elif kind == "attachment":
                for mid, tu in self._attachment(rec):
                    if tu is not None:
                        issued.add(tu)
                    put(mid)
            elif kind == "user":
                for mid, tu in self._user(rec):
                    if mid in placed:
                        continue
                    if tu is not None and tu not in issued:
                        self.result.notes["orphan_tool_results_dropped"] += 1
                        continue
                    put(mid)
        return ctx

    def _pos(self, mid: str) -> int:
        if not hasattr(self, "_positions") or mid not in self._positions:
            self._positions = {m.id: i for i, m in enumerate(self.b.messages)}
        return self._positions[mid]

    # --- calls ------------------------------------------------------------------------------------

    def summarization_calls(self, recs: list[_Rec]) -> None:
        """Queue the compaction-summary responses of an ``agent-acompact-*`` file."""
        for rec in recs:
            if rec.obj.get("type") == "assistant" and self.index.groups[group_key(rec.obj)][0] is rec:
                self.pending_summaries.append((rec.obj.get("timestamp") or "", rec))

    def add_calls(self, recs: list[_Rec]) -> None:
        firsts = [r for r in recs if r.obj.get("type") == "assistant" and self.index.groups[group_key(r.obj)][0] is r]
        firsts.sort(key=lambda r: r.order)  # preserved responses re-written after a boundary go back in place
        summaries = sorted(self.pending_summaries, key=lambda x: x[0])
        for rec in firsts:
            ts = rec.obj.get("timestamp") or ""
            while summaries and summaries[0][0] and ts and summaries[0][0] <= ts:
                self._call(summaries.pop(0)[1], summarization=True)
            self._call(rec)
        for _, s in summaries:
            self._call(s, summarization=True)

    def _call(self, first: _Rec, summarization: bool = False) -> None:
        key = group_key(first.obj)
        chain, boundary, gap = self._chain(first.parent, at=first.order, own=key)
        context, cleared = self._micro(self._context(chain, before=first.order), first.parent)
        if not context:
            self.result.notes["calls_without_context"] += 1
            return
        (response,) = self._assistant(key)
        msg = self.b.messages[self._pos(response)]
        stop = msg.meta.get("stop_reason")
        finish = _STOP.get(stop, "tool_calls" if msg.tool_calls else ("stop" if stop is None else "unknown"))
        meta: dict[str, Any] = {"request_id": first.obj.get("requestId"), "message_id": first.obj["message"].get("id")}
        fields: dict[str, Any] = {}
        if summarization:
            fields["purpose"] = "summarize"
        if gap == "parent_cycle":
            self.result.reject(first.source, first.line, "parent_cycle", f"line {first.line}: the parentUuid chain "
                               "behind this response loops; its context is cut where the loop closes", kept=True)
            fields.update(selected=False, reason="parent_cycle: the parentUuid chain loops; context cut at the loop")
        elif gap:
            fields.update(selected=False, reason="context_gap: a parent record is missing")
        if msg.meta.get("synthetic"):
            fields.update(selected=False, reason="synthetic response written by the harness")
        cid = self.b.call(context, response, finish_reason=finish, meta={k: v for k, v in meta.items() if v},
                          **fields)
        for tc in msg.tool_calls:
            self.call_of_tool_use[tc.id] = cid
        if not summarization:
            self._maybe_evict(cid, boundary, context)
            self.boundary_of_call[cid] = boundary.uuid if boundary else None
        self._micro_evictions(cid, cleared)
        self.delivered.update([*context, response])

    # --- micro-compaction ---------------------------------------------------------------------------

    def _microcompacts_above(self, start: str | None) -> list[_Rec]:
        """microcompact_boundary records the chain up to ``start`` descends from, oldest first
        (through earlier compactions via their ``logicalParentUuid``)."""
        out: list[_Rec] = []
        uid, seen = start, set()
        while uid and uid not in seen:
            seen.add(uid)
            rec = self.index.by_uuid.get(uid)
            if rec is None:
                break
            o = rec.obj
            if o.get("type") == "system" and o.get("subtype") == "microcompact_boundary":
                out.append(rec)
            if o.get("type") == "system" and o.get("subtype") == "compact_boundary":
                uid = o.get("logicalParentUuid")
                continue
            uid = self.index.parent(rec, {})
        return out[::-1]

    def _micro(self, context: list[str], start: str | None) -> tuple[list[str], list[tuple[_Rec, list]]]:
        """``context`` with the tool results cleared by micro-compactions above ``start`` replaced by the
        placeholder (and cleared attachments left out); plus (boundary, [(removed, placeholder or None)])."""
        if not self.index.microcompacts or not context:
            return context, []
        events = []
        for mb in self._microcompacts_above(start):
            md = mb.obj.get("microcompactMetadata") or {}
            tool_ids = set(md.get("compactedToolIds") or [])
            attached = set(md.get("clearedAttachmentUUIDs") or [])
            if not tool_ids and not attached:
                continue
            out, pairs = [], []
            for mid in context:
                m = self.b.messages[self._pos(mid)]
                if m.role == "tool" and m.tool_call_id in tool_ids and not m.meta.get("cleared_by"):
                    ph = self._placeholder(m, mb)
                    out.append(ph)
                    pairs.append((mid, ph))
                elif self.msg_uuid.get(mid) in attached:
                    pairs.append((mid, None))
                else:
                    out.append(mid)
            context = out
            events.append((mb, pairs))
        return context, events

    def _placeholder(self, m, boundary: _Rec) -> str:
        if m.id not in self.placeholders:
            meta: dict[str, Any] = {"cleared_by": boundary.uuid, "inferred_text": True}
            saved = self.source.with_suffix("") / "tool-results"
            hits = sorted(saved.glob(f"{m.tool_call_id}*")) if saved.is_dir() else []
            if hits:
                meta["full_result_file"] = str(hits[0])
            self.placeholders[m.id] = self.b.message("tool", CLEARED, id=f"{m.id}:cleared", tool_call_id=m.tool_call_id,
                                                     author="harness", meta=meta)
        return self.placeholders[m.id]

    def _micro_evictions(self, cid: str, cleared: list[tuple[_Rec, list]]) -> None:
        """One ``prune`` eviction per micro-compaction, before the first call that no longer sees what an
        earlier call saw."""
        for mb, pairs in cleared:
            new = [(r, i) for r, i in pairs if r in self.delivered and r not in self.evicted]
            self.result.notes["cleared_before_delivery"] += sum(
                1 for r, _ in pairs if r not in self.delivered and r not in self.evicted)
            self.evicted.update(r for r, _ in pairs if r not in self.delivered)
            if not new:
                continue
            self.evicted.update(r for r, _ in new)
            md = mb.obj.get("microcompactMetadata") or {}
            self.b.eviction(cid, "prune", [r for r, _ in new], [i for _, i in new if i is not None],
                            trigger=md.get("trigger"), tokens_before=md.get("preTokens"),
                            meta={"microcompact_boundary": mb.uuid, "tokens_saved": md.get("tokensSaved"),
                                  "placeholder_text_inferred": True})
            self.result.notes["microcompactions"] += 1

    def _maybe_evict(self, cid: str, boundary: _Rec | None, context: list[str]) -> None:
        prev = next((c for c in reversed(self.b.calls[:-1]) if c.id in self.boundary_of_call), None)
        if boundary is None or prev is None or self.boundary_of_call[prev.id] == boundary.uuid:
            return
        o = boundary.obj
        meta_c = o.get("compactMetadata") or {}
        logical = o.get("logicalParentUuid")
        meta: dict[str, Any] = {"boundary_uuid": boundary.uuid, "logical_parent": logical}
        if logical and logical in self.index.by_uuid:
            pre_chain, _, _ = self._chain(logical, at=boundary.order)
            before, _ = self._micro(self._context(pre_chain, before=boundary.order), logical)
        else:
            # Dangling logicalParentUuid: what the previous call delivered is the best record.
            meta["dangling_logical_parent"] = True
            self.result.notes["dangling_logical_parent"] += 1
            before = [*prev.context, prev.response]
        now = set(context)
        table = {m.id: m for m in self.b.messages}
        was = set(before)
        inserted = [m for m in context if m not in was and (table[m].meta.get("compact_summary")
                                                             or table[m].meta.get("compaction_artifact"))]
        self.b.eviction(cid, "summarize", [m for m in before if m not in now], inserted,
                        trigger=meta_c.get("trigger"), tokens_before=meta_c.get("preTokens"), meta=meta)
        self.result.notes["compactions"] += 1

    def finish(self):
        return self.result.finish(self.b, self.source)


def _blocks(obj: dict) -> list[dict]:
    content = (obj.get("message") or {}).get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]
