"""Contexts from Claude Code's request log: the mixin :class:`RequestContexts` of
:class:`~memorywalker.importers.claude_code.trajectory.ChainTrajectory` that turns a resolved request
chain (:mod:`.requests`) into the call's exact message list."""

from __future__ import annotations

import json
from collections import Counter

from memorywalker.importers.base import as_text, content_text
from memorywalker.importers.claude_code.records import Rec, blocks
from memorywalker.importers.claude_code.requests import Resolved, as_blocks, digest
from memorywalker.records import ToolSchema


class RequestContexts:
    """The contexts of :class:`~memorywalker.importers.claude_code.trajectory.ChainTrajectory` read from the
    request log: a mixin over its index, builder and message table (split out to keep files small)."""

    # --- contexts from the request log (2.1.3xx) ----------------------------------------------------

    def _request(self, first: Rec) -> Resolved | None:
        """The logged request of a response: its exact messages, or None (no log, unknown, unresolved)."""
        ref = first.obj.get("requestRef")
        api = self.index.api
        if not api or not isinstance(ref, str):
            return None
        res = api.resolve(ref)
        if res is None or not res.complete:
            why = "is not in the input" if res is None else (
                f"names {sum(m is None for m in res.messages)} message(s) that no blob or record holds")
            self.result.reject(first.source, first.line, "missing_parent", f"line {first.line}: requestRef "
                               f"{ref!r}: the request chain {why}; context rebuilt from the parentUuid chain",
                               kept=True)
            self.result.notes["api_request_unresolved"] += 1
            return None
        self.result.notes[f"api_request_digest_{res.digest}"] += 1
        return res

    def _hash_maps(self) -> tuple[dict[str, str], dict[str, Rec]]:
        """hash -> response group key, hash -> user record (the messages written as records)."""
        if self._by_hash is None:
            groups = {digest({"role": "assistant", "content": [b for r in recs for b in blocks(r.obj)]}): key
                      for key, recs in self.index.groups.items()}
            users = {digest(as_blocks({"role": "user", "content": r.obj["message"].get("content")})): r
                     for r in self.index.by_uuid.values()
                     if r.obj.get("type") == "user" and isinstance(r.obj.get("message"), dict)}
            self._by_hash = (groups, users)
        return self._by_hash

    def _api_context(self, res: Resolved) -> list[str]:
        """Message ids of a logged request, as the gateway splits an Anthropic request: the system
        blocks as one system message; per user message, each tool_result a tool message and each run
        of text blocks one user message; ``role: "system"`` messages in place. Responses and user
        records keep their record ids; the rest share ids by content (:class:`ContentTable`)."""
        groups, users = self._hash_maps()
        ctx: list[str] = []
        seen: Counter = Counter()

        def add(fields: dict) -> None:
            key = json.dumps(fields, sort_keys=True, ensure_ascii=False)
            while True:
                mid = self.table.get(key, seen[key], fields)
                seen[key] += 1
                if mid not in ctx:
                    ctx.append(mid)
                    return

        def put(mid: str) -> bool:
            if mid in ctx:
                return False
            ctx.append(mid)
            self.record_ids.add(mid)
            return True

        system = "\n\n".join(as_text(b.get("text")) for b in res.system if b.get("type") == "text")
        if system:
            add({"role": "system", "content": system, "author": "system", "meta": {"system_prompt": True}})
        for h, m in zip(res.hashes, res.messages, strict=True):
            assert m is not None
            role, content = m.get("role"), as_blocks(m)["content"]
            content = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
            if role == "assistant" and h in groups and put(self._assistant(groups[h])[0]):
                continue
            if role == "user" and h in users:
                mids = [mid for mid, _ in self._user(users[h])]
                if not any(mid in ctx for mid in mids):
                    for mid in mids:
                        put(mid)
                    continue
            if role == "system":
                add({"role": "system", "content": "\n\n".join(as_text(b.get("text")) for b in content
                                                             if b.get("type") == "text"), "author": "system"})
            elif role == "assistant":
                texts = [as_text(b.get("text")) for b in content if b.get("type") == "text"]
                thinking = [as_text(b.get("thinking")) for b in content if b.get("type") == "thinking"]
                calls = [{"id": as_text(b.get("id")), "name": as_text(b.get("name")),
                          "arguments": b.get("input") if isinstance(b.get("input"), dict) else {}}
                         for b in content if b.get("type") == "tool_use"]
                add({"role": "assistant", "content": "\n\n".join(texts), "reasoning": "\n\n".join(thinking) or None,
                     "tool_calls": calls, "author": "model"})
            else:
                self._api_user(content, add, put)
        return ctx

    def _api_user(self, content: list[dict], add, put) -> None:
        texts: list[str] = []

        def flush() -> None:
            if texts:
                text = "\n\n".join(texts)
                add({"role": "user", "content": text, "author": self._author_of(text)})
                texts.clear()

        for b in content:
            if b.get("type") != "tool_result":
                texts.append("[image]" if b.get("type") == "image" else as_text(b.get("text")))
                continue
            flush()
            tu, text = as_text(b.get("tool_use_id")), content_text(b.get("content"))
            # the transcript's own message for this result, when it is the same text
            known = [mid for rec, _ in self.index.results.get(tu, [])[:1] for mid, t in self._user(rec)
                     if t == tu and self.message(mid).content == text]
            if not (known and put(known[0])):
                add({"role": "tool", "content": text, "tool_call_id": tu, "author": "environment",
                     "meta": {"is_error": True} if b.get("is_error") else {}})
        flush()

    def _tools(self, tools: list[dict]) -> list[str]:
        """Names of the tools a request offered; their schemas join the trajectory's tools."""
        have = {t.name for t in self.b.tools}
        names = []
        for t in tools:
            name = as_text(t.get("name"))
            if not name or name in names:
                continue
            names.append(name)
            if name not in have:
                schema = t.get("input_schema")
                self.b.tools.append(ToolSchema(name=name, description=as_text(t.get("description")),
                                               parameters=schema if isinstance(schema, dict) else {}))
                have.add(name)
        return names

    def _author_of(self, text: str) -> str:
        """harness (it carries a compaction summary), user (it carries a prompt) or system (reminders)."""
        for rec in self.index.by_uuid.values():
            o = rec.obj
            if o.get("type") != "user" or o.get("isMeta") or not isinstance(o.get("message"), dict):
                continue
            c = o["message"].get("content")
            if isinstance(c, str) and c.strip() and c.strip() in text:
                return "harness" if o.get("isCompactSummary") else "user"
        return "system"
