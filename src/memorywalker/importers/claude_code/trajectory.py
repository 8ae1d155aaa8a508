"""One Claude Code trajectory built from the records of one chain family: messages, contexts, calls.

A call's context is the request Claude Code logged for it (``requestRef`` → ``api-request`` chain,
:mod:`.requests`) when the log has one, else the parentUuid chain walked back from its response's first
record (see the package docstring); its billed prompt (``message.usage``: input + cache creation + cache read tokens) is checked
against the call before it in the same segment (:mod:`memorywalker.importers.billed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memorywalker.importers import billed
from memorywalker.importers.base import ImportResult, as_text, content_text, opt_int, opt_str
from memorywalker.importers.claude_code import attachments, micro
from memorywalker.importers.claude_code.records import STOP, Index, Rec, blocks, group_key
from memorywalker.importers.claude_code.request_contexts import RequestContexts
from memorywalker.records import Lineage, Task, TrajectoryBuilder
from memorywalker.records.blackbox import ContentTable


class ChainTrajectory(RequestContexts):
    """Builds one trajectory from the conversation records of one chain family."""

    def __init__(self, traj_id: str, source: Path, index: Index, result: ImportResult, lineage: Lineage):
        self.b = TrajectoryBuilder(traj_id, task=Task(id=traj_id), lineage=lineage)
        self.source, self.index, self.result = source, index, result
        self.msg_ids: dict[str, list] = {}  # record uuid -> (message id, tool call id) pairs
        self.resp_ids: dict[str, list[str]] = {}  # response group key -> [its assistant message id]
        self.call_of_tool_use: dict[str, str] = {}
        self.boundary_of_call: dict[str, str | None] = {}
        self.pending_summaries: list[tuple[str, Rec]] = []  # (timestamp, response record)
        self.summary_call_ids: list[tuple[str, str]] = []
        self.msg_uuid: dict[str, str] = {}  # message id -> uuid of the record it came from
        self.placeholders: dict[str, str] = {}  # cleared tool message id -> its placeholder
        self.delivered: set[str] = set()
        self.evicted: set[str] = set()
        self.micro_above: dict[str, list[Rec]] = {}  # call id -> microcompact boundaries its chain descends from
        self.table = ContentTable(self.b)  # messages of logged requests that are not records as written
        self.record_ids: set[str] = set()  # message ids that come from conversation records
        self._by_hash: tuple[dict[str, str], dict[str, Rec]] | None = None

    # --- messages ---------------------------------------------------------------------------------

    def _assistant(self, key: str) -> list[str]:
        if key in self.resp_ids:
            return self.resp_ids[key]
        recs = self.index.groups[key]
        texts, thinking, tool_calls = [], [], []
        for rec in recs:
            for block in blocks(rec.obj):
                kind = block.get("type")
                if kind == "text":
                    texts.append(as_text(block.get("text")))
                elif kind == "thinking":
                    thinking.append(as_text(block.get("thinking")))
                    self.result.notes["thinking_blocks"] += 1
                elif kind == "redacted_thinking":
                    self.result.notes["redacted_thinking_blocks"] += 1
                elif kind in ("tool_use", "server_tool_use"):
                    args = block.get("input")
                    tool_calls.append({"id": as_text(block.get("id")), "name": as_text(block.get("name")),
                                       "arguments": args if isinstance(args, dict) else {}})
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
        self.resp_ids[key] = [mid]
        return self.resp_ids[key]

    def _user(self, rec: Rec) -> list[tuple[str, str | None]]:
        """(message id, tool_use_id or None) of a user record's messages."""
        if rec.uuid in self.msg_ids:
            return self.msg_ids[rec.uuid]
        o = rec.obj
        content = o["message"].get("content")
        out: list[tuple[str, str | None]] = []
        texts = []
        blocks = content if isinstance(content, list) else [{"type": "text", "text": as_text(content)}]
        n_results = sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result")
        for k, block in enumerate(blocks):
            if not isinstance(block, dict):
                texts.append(str(block))
            elif block.get("type") == "tool_result":
                is_error = bool(block.get("is_error"))
                self.result.notes["tool_results_is_error"] += is_error
                mid = self.b.message("tool", content_text(block.get("content")),
                                     id=rec.uuid if n_results == 1 else f"{rec.uuid}#{k}",
                                     tool_call_id=as_text(block.get("tool_use_id")), author="environment",
                                     meta={"is_error": True} if is_error else {})
                out.append((mid, as_text(block.get("tool_use_id"))))
            elif block.get("type") == "image":
                self.result.notes["images"] += 1
                texts.append("[image]")
            else:
                texts.append(as_text(block.get("text")))
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

    def _attachment(self, rec: Rec) -> list[tuple[str, str | None]]:
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
            if att.get("type") in attachments.INFERRED_TEXT:
                meta["inferred_text"] = attachments.INFERRED_TEXT[att["type"]]
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

    def _chain(self, start: str | None, at: float, own: str | None = None) -> tuple[list[Rec], Rec | None, str | None]:
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

    def _context(self, chain: list[Rec], before: int) -> list[str]:
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

    def message(self, mid: str):
        return self.b.messages[self._pos(mid)]

    def _micro(self, context: list[str], start: str | None) -> tuple[list[str], list]:
        boundaries = micro.above(self.index, start) if self.index.microcompacts else []
        return (*micro.apply(self, context, boundaries), boundaries)

    # --- calls ------------------------------------------------------------------------------------

    def summarization_calls(self, recs: list[Rec]) -> None:
        """Queue the compaction-summary responses of an ``agent-acompact-*`` file."""
        for rec in recs:
            if rec.obj.get("type") == "assistant" and self.index.groups[group_key(rec.obj)][0] is rec:
                self.pending_summaries.append((rec.obj.get("timestamp") or "", rec))

    def add_calls(self, recs: list[Rec]) -> None:
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

    def _call(self, first: Rec, summarization: bool = False) -> None:
        key = group_key(first.obj)
        # A preserved response re-written after a partial compaction hangs from the summary there; it
        # was sampled before it, from its parent in the preserved segment.
        start = self.index.orig_parent.get(first.uuid, first.parent)
        chain, boundary, gap = self._chain(start, at=first.order, own=key)
        logged = self._request(first)
        if logged is not None:  # the exact messages of the request, from the log itself
            context, cleared, boundaries, gap = self._api_context(logged), [], [], None
        else:
            context, cleared, boundaries = self._micro(self._context(chain, before=first.order), start)
        if not context:
            self.result.notes["calls_without_context"] += 1
            return
        (response,) = self._assistant(key)
        msg = self.b.messages[self._pos(response)]
        stop = msg.meta.get("stop_reason")
        finish = STOP.get(stop, "tool_calls" if msg.tool_calls else ("stop" if stop is None else "unknown"))
        meta: dict[str, Any] = {"request_id": first.obj.get("requestId"), "message_id": first.obj["message"].get("id"),
                                "billed_tokens": None if msg.meta.get("synthetic") else self._billed(key, msg)}
        fields: dict[str, Any] = {}
        if logged is not None:
            meta.update(context_source="api-request", request_ref=first.obj.get("requestRef"),
                        request_digest=logged.digest)
            if logged.tools:
                fields["tools"] = self._tools(logged.tools)
            if logged.digest == "mismatch":
                fields.update(selected=False, reason="request_digest_mismatch: the logged messages do not "
                              "hash to the request's requestDigest")
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
        self.micro_above[cid] = boundaries
        for tc in msg.tool_calls:
            self.call_of_tool_use[tc.id] = cid
        if not summarization:
            self._maybe_evict(cid, boundary, context, exact=logged is not None)
            self.boundary_of_call[cid] = boundary.uuid if boundary else None
        micro.record_evictions(self, cid, cleared)
        self.delivered.update([*context, response])

    def _maybe_evict(self, cid: str, boundary: Rec | None, context: list[str], exact: bool = False) -> None:
        prev = next((c for c in reversed(self.b.calls[:-1]) if c.id in self.boundary_of_call), None)
        if boundary is None or prev is None or self.boundary_of_call[prev.id] == boundary.uuid:
            return
        o = boundary.obj
        meta_c = o.get("compactMetadata") if isinstance(o.get("compactMetadata"), dict) else {}
        logical = o.get("logicalParentUuid")
        meta: dict[str, Any] = {"boundary_uuid": boundary.uuid, "logical_parent": logical}
        if exact and not prev.meta.get("context_source") == "api-request":
            exact = False
        if exact:
            # Both contexts are logged requests: before = the previous request, its response and the
            # results of that response's tool calls (the compaction runs after the tool round).
            before = [*prev.context, prev.response]
            for tc in self.message(prev.response).tool_calls:
                for rec, _ in self.index.results.get(tc.id, [])[:1]:
                    before += [mid for mid, t in self._user(rec) if t == tc.id]
            was = set(before)
            now = set(context)
            inserted = [m for m in context if m not in was and m not in self.record_ids]
            self.b.eviction(cid, "summarize", [m for m in before if m not in now], inserted,
                            trigger=opt_str(meta_c.get("trigger")), tokens_before=opt_int(meta_c.get("preTokens")),
                            meta={**meta, "from": "api-request"})
            self.result.notes["compactions"] += 1
            return
        if logical and logical in self.index.by_uuid:
            pre_chain, _, _ = self._chain(logical, at=boundary.order)
            before, _, _ = self._micro(self._context(pre_chain, before=boundary.order), logical)
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
                        trigger=opt_str(meta_c.get("trigger")), tokens_before=opt_int(meta_c.get("preTokens")), meta=meta)
        self.result.notes["compactions"] += 1

    def _billed(self, key: str, msg) -> dict | None:
        """Billed prompt = input + cache creation + cache read tokens of the response's ``message.usage``
        (every record of one response repeats it). Claude Code writes each record while streaming, so
        ``output_tokens`` is a running count: the largest one is a lower bound on the response."""
        recs = self.index.groups[key]
        usage = recs[0].obj["message"].get("usage")
        if not isinstance(usage, dict):
            return None
        parts = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
        prompt = sum(p for p in parts if isinstance(p, int) and not isinstance(p, bool))
        out = [(r.obj["message"].get("usage") or {}).get("output_tokens") for r in recs]
        response = 0 if msg.reasoning else max((o for o in out if isinstance(o, int) and not isinstance(o, bool)), default=0)
        return billed.billed(prompt, response, msg.meta.get("model"), usage.get("cache_read_input_tokens"))

    def finish(self):
        billed.check_billed(self.b, self.result, micro.drop_hint(self))
        return self.result.finish(self.b, self.source)
