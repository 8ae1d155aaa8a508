"""Codex CLI rollouts (``~/.codex/sessions/**/rollout-*.jsonl``) → trajectories.

The model history is replayed as Codex itself rebuilds it on resume: every ``response_item`` is
appended; a run of model output items (``reasoning``, assistant ``message``, ``function_call``,
``local_shell_call``, ``custom_tool_call``, ``web_search_call``) is one call, merged into one
assistant message, whose context is the history before the run. ``compacted`` replaces the history:
with ``replacement_history`` by exactly those items (items equal to earlier ones keep their ids, new
ones are harness artifacts); without it (older rollouts) by the initial context items, the earlier
real user messages that fit Codex's 20k-token budget (≈4 bytes per token, newest first) and the
summary as a user message. Each compaction is a white-box ``summarize`` eviction before the next
call. ``event_msg``, ``turn_context`` and ``world_state`` records are UI/bookkeeping and are skipped
(counted). Server-side compaction (``compacted`` with an empty ``message`` and a ``replacement_history``
ending in an encrypted ``compaction`` item) keeps that item in the history as an opaque harness
artifact: the model receives it, its text is unknown, so it is not trainable text.
"""

from __future__ import annotations

import json
from pathlib import Path

from memorywalker.importers import billed
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    as_list,
    as_text,
    carried,
    content_text,
    files_under,
    import_files,
    parse_arguments,
    read_jsonl,
)
from memorywalker.records import Lineage, Task, TrajectoryBuilder

FORMAT = "codex"
_OUTPUT = {"reasoning", "function_call", "local_shell_call", "custom_tool_call", "web_search_call"}
_RESULT = {"function_call_output", "custom_tool_call_output", "local_shell_call_output"}
_PREFIX_TAGS = ("<environment_context>", "<user_instructions>", "# AGENTS.md", "<INSTRUCTIONS>")
OPAQUE_COMPACTION = "[encrypted compaction item]"  # stands in for the opaque item in rendered contexts
USER_MESSAGE_BUDGET = 20_000  # codex compact::COMPACT_USER_MESSAGE_MAX_TOKENS


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    return import_files(files_under(paths), import_file)


def _is_output(item: dict) -> bool:
    return isinstance(item, dict) and (item.get("type") in _OUTPUT or (item.get("type") == "message"
                                                                     and item.get("role") == "assistant"))


def _key(item: dict) -> str:
    return json.dumps(item, sort_keys=True, ensure_ascii=False)


class _Replay:
    def __init__(self, b: TrajectoryBuilder, result: ImportResult):
        self.b, self.result = b, result
        self.history: list[str] = []  # message ids of the model history
        self.by_key: dict[str, str] = {}  # item json -> message id (for replacement_history)
        self.run: list[dict] = []  # pending model output items
        self.pending: tuple | None = None
        self.initial: list[str] = []  # initial-context message ids
        self.issued: set[str] = set()
        self.awaiting: str | None = None  # the call whose token_count has not come yet
        self.last_total: object = None  # total_token_usage of the latest token_count (repeats carry the same)
        self.model: str | None = None

    def message(self, item: dict, author: str | None = None) -> str | None:
        kind, key = item.get("type"), _key(item)
        if key in self.by_key:
            return self.by_key[key]
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("system", "user", "assistant"):
                return None
            text = content_text(item.get("content"))
            if author is None:
                author = "system" if role == "system" or text.startswith(_PREFIX_TAGS) else "user"
            mid = self.b.message(role, text, author=author)
        elif kind in ("compaction", "compaction_summary"):
            # Server-side compaction: an encrypted item the model receives back; its text is opaque.
            enc = str(item.get("encrypted_content") or "")
            mid = self.b.message("user", OPAQUE_COMPACTION, author="harness",
                                 meta={"opaque": kind, "encrypted_chars": len(enc)})
            self.result.notes["opaque_compaction_items"] += 1
        elif kind in _RESULT:
            out = item.get("output")
            text = out.get("content", json.dumps(out)) if isinstance(out, dict) else str(out or "")
            if item.get("call_id") not in self.issued:
                self.result.notes["orphan_tool_results_dropped"] += 1
                return None
            mid = self.b.message("tool", text, tool_call_id=item.get("call_id"), author=author or "environment")
        else:
            self.result.notes[f"item_not_sent:{kind}"] += 1
            return None
        self.by_key[key] = mid
        return mid

    def flush(self) -> None:
        if not self.run:
            return
        texts, reasoning, calls = [], [], []
        for it in self.run:
            kind = it.get("type")
            if kind == "message":
                texts.append(content_text(it.get("content")))
            elif kind == "reasoning":
                reasoning += [as_text(s.get("text")) for s in as_list(it.get("summary")) if isinstance(s, dict)]
                reasoning += [as_text(c.get("text")) for c in as_list(it.get("content")) if isinstance(c, dict)]
                self.result.notes["reasoning_items"] += 1
            elif kind == "function_call":
                calls.append({"id": as_text(it.get("call_id")), "name": as_text(it.get("name")),
                              "arguments": parse_arguments(it.get("arguments"))})
            elif kind == "custom_tool_call":
                calls.append({"id": as_text(it.get("call_id")), "name": as_text(it.get("name")),
                              "arguments": parse_arguments(it.get("input", ""))})
            elif kind == "local_shell_call":
                action = it.get("action")
                calls.append({"id": as_text(it.get("call_id") or it.get("id")), "name": "local_shell",
                              "arguments": action if isinstance(action, dict) else {}})
            else:
                self.result.notes[f"output_item:{kind}"] += 1
        mid = self.b.message("assistant", "\n\n".join(texts), reasoning="\n\n".join(r for r in reasoning if r) or None,
                             tool_calls=calls, author="model")
        for it in self.run:
            self.by_key[_key(it)] = mid
        self.issued.update(c["id"] for c in calls)
        if self.history:
            cid = self.b.call(list(self.history), mid, finish_reason="tool_calls" if calls else "stop")
            self.awaiting = cid
            if self.pending:
                removed, inserted, meta = self.pending
                self.b.eviction(cid, "summarize", removed, inserted, trigger=meta.pop("trigger", None), meta=meta)
                self.pending = None
        else:
            self.result.notes["responses_without_context"] += 1
        self.history.append(mid)
        self.run = []

    def item(self, item: dict) -> None:
        if not isinstance(item, dict):
            self.result.notes["items_not_objects"] += 1
            return
        if _is_output(item):
            self.run.append(item)
            return
        self.flush()
        mid = self.message(item)
        if mid and mid not in self.history:
            self.history.append(mid)
            if not self.b.calls and self.b.messages[-1].author == "system":
                self.initial.append(mid)  # instructions / environment context before the first call

    def token_count(self, payload: dict) -> None:
        """``event_msg`` / ``token_count``: Codex sends one when a sampling request completes (its
        ``info.last_token_usage``), and repeats the latest one on other occasions (same
        ``total_token_usage``). A new one ends the current run of output items and is that call's billed
        count; one no call awaits belongs to a request that is not a call here (a compaction's)."""
        info = payload.get("info")
        if not isinstance(info, dict) or info.get("total_token_usage") == self.last_total:
            return
        self.last_total = info.get("total_token_usage")
        self.flush()
        last = info.get("last_token_usage") if isinstance(info.get("last_token_usage"), dict) else {}
        if self.awaiting is None:
            self.result.notes["token_counts_unattributed"] += 1
            return
        call = next(c for c in reversed(self.b.calls) if c.id == self.awaiting)
        out, reasoning = last.get("output_tokens"), last.get("reasoning_output_tokens")
        visible = out - reasoning if isinstance(out, int) and isinstance(reasoning, int) else out
        # input_tokens includes the cached part (cached_input_tokens is a subset of it); output_tokens
        # includes the reasoning, which later calls of the turn receive back and the next turn does not.
        b = billed.billed(last.get("input_tokens"), visible, self.model, reasoning=reasoning)
        if b:
            call.meta["billed_tokens"] = b
        self.awaiting = None

    def compacted(self, payload: dict) -> None:
        self.flush()
        self.awaiting = None
        before = list(self.history)
        if isinstance(payload.get("replacement_history"), list):
            new = []
            for it in payload["replacement_history"]:
                if not isinstance(it, dict):
                    self.result.notes["items_not_objects"] += 1
                    continue
                if _is_output(it):
                    key = _key(it)
                    mid = self.by_key.get(key)
                    if mid is None:  # an output item Codex kept but we never saw: a harness artifact
                        mid = self.b.message("assistant", content_text(it.get("content")), author="harness")
                        self.by_key[key] = mid
                else:
                    mid = self.message(it, author="harness")
                if mid and mid not in new:
                    new.append(mid)
            source = "replacement_history"
        else:
            table = {m.id: m for m in self.b.messages}
            users = [m for m in before if table[m].role == "user" and table[m].author == "user"]
            kept, budget = [], USER_MESSAGE_BUDGET
            for m in reversed(users):
                cost = (len(table[m].content.encode()) + 3) // 4
                if cost > budget:
                    break
                kept.append(m)
                budget -= cost
            summary = self.b.message("user", str(payload.get("message", "")), author="harness",
                                     meta={"compaction_summary": True})
            new = [m for m in before if m in self.initial] + kept[::-1] + [summary]
            source = "rebuilt"
        self.history = new
        now = set(new)
        self.pending = ([m for m in before if m not in now], [m for m in new if m not in set(before)],
                        {"trigger": "auto", "history_source": source})
        self.result.notes["compactions"] += 1


def import_file(path: Path, result: ImportResult) -> None:
    b = None
    replay = None
    for line, obj in read_jsonl(path, result):
        kind, payload = obj.get("type"), obj.get("payload")
        if b is None:
            meta = payload if kind == "session_meta" and isinstance(payload, dict) else {}
            tid = str(meta.get("id") or path.stem)
            b = TrajectoryBuilder(tid, task=Task(id=tid), lineage=Lineage(source=FORMAT, source_path=str(path)),
                                  meta={k: meta[k] for k in ("cli_version", "originator", "model_provider") if k in meta})
            replay = _Replay(b, result)
        if not isinstance(payload, dict):
            result.reject(path, line, "missing_field", f"line {line}: record without an object payload")
            continue
        if kind == "session_meta":
            result.imported += 1
            base = payload.get("base_instructions")
            text = base.get("text") if isinstance(base, dict) else base
            if text:
                replay.history.append(b.message("system", text, author="system"))
                replay.initial.append(replay.history[-1])
        elif kind == "response_item":
            result.imported += 1
            replay.item(payload)
        elif kind == "compacted":
            result.imported += 1
            replay.compacted(payload)
        elif kind in ("event_msg", "turn_context", "world_state"):
            # Not replayed into the model history on resume (only response_item and compacted are).
            result.skipped[kind] += 1
            if kind == "event_msg" and payload.get("type") == "token_count":
                replay.token_count(payload)
            elif kind == "turn_context" and isinstance(payload.get("model"), str):
                replay.model = payload["model"]
        else:
            result.reject(path, line, "unknown_record_type", f"line {line}: record type {kind!r}", detail=carried(obj))
    if b is None:
        result.reject(path, None, "no_calls", f"{path.name}: no records")
        return
    replay.flush()
    billed.check_billed(b, result)
    result.finish(b, path)


