"""Codex CLI rollouts (``~/.codex/sessions/**/rollout-*.jsonl``) → trajectories, each call's context as
Codex sent it (checked against gateway captures of Codex 0.169.0: docs/importers.md).

The model history is replayed as Codex itself rebuilds it on resume: every ``response_item`` is
appended; a run of model output items (``reasoning``, assistant ``message``, ``function_call``,
``local_shell_call``, ``custom_tool_call``, ``web_search_call``) is one call, merged into one
assistant message, whose context is the history before the run. ``compacted`` replaces the history:
with ``replacement_history`` by exactly those items (items equal to earlier ones keep their ids, new
ones are harness artifacts); without it (older rollouts) by the initial context items, the earlier
real user messages that fit Codex's 20k-token budget (≈4 bytes per token, newest first) and the
summary as a user message. The base instructions (``session_meta.base_instructions``, sent as the
request's instructions) stay first after a compaction. Each compaction is a white-box ``summarize``
eviction before the next call.

**The compaction's own call.** Codex asks the model for the summary with the history and its
compaction prompt (:data:`COMPACT_PROMPT`) as a last user message, offering no tools; the answer is the
summary (``compacted.message`` is :data:`SUMMARY_PREFIX`, a newline, and the summary). That call is
imported with ``purpose: "summarize"``: its response is the rollout's answer (0.169.0 records it as an
assistant message just before ``compacted``) or, where the rollout holds none, the summary taken from
``compacted.message`` (``meta.response_from``). The prompt itself is not in the rollout; the one the
pinned Codex sends is used, and ``meta.compaction_prompt`` says so (a ``compact_prompt`` set in
``config.toml`` is not recorded anywhere in the rollout).

**The system prompt.** Codex sends ``base_instructions`` without its "## Planning" and "## `update_plan`"
sections when it offers no ``update_plan`` tool (seen on every call of a fresh 0.169.0 session). The
rule is applied when the tools are known (``--tools``) or the rollout calls ``update_plan``; otherwise the
text is kept whole and ``meta.system_prompt_rule`` says the rule was not decided.

**The tools.** A rollout does not record the tool schemas Codex offered. ``--tools FILE|NAME``
(:mod:`memorywalker.importers.tools`) gives them; without it ``meta.tools`` says they are unknown and the
contexts lack them.

``event_msg``, ``turn_context``, ``world_state``, ``token_usage_record`` and
``inter_agent_communication_metadata`` records are UI/bookkeeping and are skipped (counted), except
an ``event_msg`` ``thread_rolled_back``: the user took back the last ``num_turns`` turns, and Codex
drops them from the history (the next call branches off an earlier context). Only the fields the
replay reads must be scalars; the rest of a record (a ``local_shell_call``'s ``action``, a subagent's
``source``, a compaction's metadata) is data.

Server-side compaction (``compacted`` with an empty ``message`` and a ``replacement_history`` ending in
an encrypted ``compaction`` item) keeps that item in the history as an opaque harness artifact: the
model receives it, its text is unknown, so it is not trainable text; the provider made the summary, so
there is no summary call to import (counted ``summary_calls_not_in_log:server-side``).
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
from memorywalker.importers.codex_sent import (
    COMPACT_PROMPT,
    PROMPT_SOURCE,
    SUMMARY_PREFIX,
    system_prompt_rule,
)
from memorywalker.importers.tools import ToolSet
from memorywalker.records import Lineage, Task, TrajectoryBuilder

FORMAT = "codex"
_BOOKKEEPING = ("event_msg", "turn_context", "world_state", "token_usage_record", "inter_agent_communication_metadata")
_VOLATILE = ("id", "status", "internal_chat_message_metadata_passthrough", "timestamp")
_OUTPUT = {"reasoning", "function_call", "local_shell_call", "custom_tool_call", "web_search_call"}
_RESULT = {"function_call_output", "custom_tool_call_output", "local_shell_call_output"}
_PREFIX_TAGS = ("<environment_context>", "<user_instructions>", "# AGENTS.md", "<INSTRUCTIONS>")
_HARNESS_TAGS = ("<turn_aborted>",)  # user-role messages Codex writes itself (not a user turn)
OPAQUE_COMPACTION = "[encrypted compaction item]"  # stands in for the opaque item in rendered contexts
USER_MESSAGE_BUDGET = 20_000  # codex compact::COMPACT_USER_MESSAGE_MAX_TOKENS
def wrong_field(obj: dict) -> str | None:
    """The first field the replay reads that is not a scalar (the rest of a record is data), or None."""
    if isinstance(obj.get("type"), dict | list):
        return "type"
    payload = obj.get("payload")
    if isinstance(payload, dict):
        for k in ("type", "role", "call_id", "name"):
            if isinstance(payload.get(k), dict | list):
                return f"payload.{k}"
    return None


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    tools = (options or ImportOptions()).tools
    return import_files(files_under(paths), lambda path, result: import_file(path, result, tools))


def _is_output(item: dict) -> bool:
    kind = item.get("type") if isinstance(item, dict) else None
    return isinstance(kind, str) and (kind in _OUTPUT or (kind == "message" and item.get("role") == "assistant"))


def _key(item: dict) -> str:
    """What an item says, without the ids and metadata Codex renews when it copies it into a
    ``replacement_history``."""
    return json.dumps({k: v for k, v in item.items() if k not in _VOLATILE}, sort_keys=True, ensure_ascii=False)


class _Replay:
    def __init__(self, b: TrajectoryBuilder, result: ImportResult):
        self.b, self.result = b, result
        self.history: list[str] = []  # message ids of the model history
        self.by_key: dict[str, list[str]] = {}  # item key -> the messages made from items saying that
        self.run: list[dict] = []  # pending model output items
        self.pending: tuple | None = None
        self.instructions: str | None = None  # the base instructions' message (sent before the history)
        self.initial: list[str] = []  # initial-context message ids
        self.issued: set[str] = set()
        self.called: set[str] = set()  # names of the tools the model called
        self.awaiting: str | None = None  # the call whose token_count has not come yet
        self.last_total: object = None  # total_token_usage of the latest token_count (repeats carry the same)
        self.model: str | None = None
        self.unclaimed: dict | None = None  # billed count of a request no call awaited (a compaction's, in old rollouts)
        self.since_compaction = 0  # index of the first call after the latest compaction

    def message(self, item: dict, author: str | None = None) -> str | None:
        kind = item.get("type")
        if not isinstance(kind, str):  # an item nested in a compaction whose type is not text
            self.result.notes["items_without_type"] += 1
            return None
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("system", "user", "assistant"):
                return None
            text = content_text(item.get("content"))
            if author is None:
                author = ("system" if role == "system" or text.startswith(_PREFIX_TAGS)
                          else "harness" if text.startswith(_HARNESS_TAGS) else "user")
            meta = {"compaction_summary": True} if role == "user" and text.startswith(SUMMARY_PREFIX) else {}
            mid = self.b.message(role, text, author=author, **({"meta": meta} if meta else {}))
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
        self.by_key.setdefault(_key(item), []).append(mid)
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
            self.by_key.setdefault(_key(it), []).append(mid)
        self.issued.update(c["id"] for c in calls)
        self.called.update(c["name"] for c in calls)
        self.discard_unclaimed()
        if self.history:
            cid = self.b.call(list(self.history), mid, finish_reason="tool_calls" if calls else "stop")
            self.awaiting = cid
            self.evict(cid)
        else:
            self.result.notes["responses_without_context"] += 1
        self.history.append(mid)
        self.run = []

    def evict(self, cid: str) -> None:
        """Record the pending compaction as an eviction before call ``cid``."""
        if self.pending:
            removed, inserted, meta = self.pending
            self.b.eviction(cid, "summarize", removed, inserted, trigger=meta.pop("trigger", None), meta=meta)
            self.pending = None

    def item(self, item: dict) -> None:
        if not isinstance(item, dict):
            self.result.notes["items_not_objects"] += 1
            return
        if _is_output(item):
            self.run.append(item)
            return
        self.flush()
        mid = self.message(item)
        if mid:
            self.history.append(mid)
            if not self.b.calls and self.b.messages[-1].author == "system":
                self.initial.append(mid)  # instructions / environment context before the first call

    def rollback(self, turns: object) -> None:
        """``thread_rolled_back``: the user took back the last ``turns`` user turns (Codex drops each from
        its user message on, and replays the drop on resume). The next call's context is a prefix of an
        earlier one plus what follows: a branch the tree records, not an eviction."""
        self.flush()
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
            self.result.notes["rollbacks_unreadable"] += 1
            return
        table = {m.id: m for m in self.b.messages}
        starts = [i for i, mid in enumerate(self.history) if table[mid].role == "user" and table[mid].author == "user"]
        if not starts:
            self.result.notes["rollbacks_without_user_turns"] += 1
            return
        self.history = self.history[:starts[-min(turns, len(starts))]]
        self.awaiting = None
        self.result.notes["rollbacks"] += 1

    def token_count(self, payload: dict) -> None:
        """``event_msg`` / ``token_count``: Codex sends one when a sampling request completes (its
        ``info.last_token_usage``), and repeats the latest one on other occasions (same
        ``total_token_usage``). A new one ends the current run of output items and is that call's billed
        count; one no call awaits is kept for the compaction's summary call that may follow (rollouts
        without the summary's answer record the compaction's count just before ``compacted``)."""
        info = payload.get("info")
        if not isinstance(info, dict) or info.get("total_token_usage") == self.last_total:
            return
        self.last_total = info.get("total_token_usage")
        self.flush()
        last = info.get("last_token_usage") if isinstance(info.get("last_token_usage"), dict) else {}
        out, reasoning = last.get("output_tokens"), last.get("reasoning_output_tokens")
        visible = out - reasoning if isinstance(out, int) and isinstance(reasoning, int) else out
        # input_tokens includes the cached part (cached_input_tokens is a subset of it); output_tokens
        # includes the reasoning, which later calls of the turn receive back and the next turn does not.
        b = billed.billed(last.get("input_tokens"), visible, self.model, reasoning=reasoning)
        if self.awaiting is None:
            self.discard_unclaimed()
            self.unclaimed = b or {}
            return
        call = next(c for c in reversed(self.b.calls) if c.id == self.awaiting)
        if b:
            call.meta["billed_tokens"] = b
        self.awaiting = None

    def discard_unclaimed(self) -> None:
        if self.unclaimed is not None:
            self.result.notes["token_counts_unattributed"] += 1
            self.unclaimed = None

    def summary_call(self, message: str) -> None:
        """Import the request that produced ``compacted.message``'s summary as a ``summarize`` call: the
        history and Codex's compaction prompt, answered by the summary (module docstring)."""
        summary = message[len(SUMMARY_PREFIX):].lstrip("\n") if message.startswith(SUMMARY_PREFIX) else message
        if not summary.strip():
            self.result.notes["compaction_without_summary"] += 1
            return
        table = {m.id: m for m in self.b.messages}
        last = self.b.calls[-1] if len(self.b.calls) > self.since_compaction else None
        answered = (last is not None and self.history and self.history[-1] == last.response
                    and table[last.response].content.strip() == summary.strip() and not table[last.response].tool_calls)
        if answered:  # the rollout holds the answer as an assistant message (0.169.0): that call is the summary's
            self.history.pop()
            call, source = last, "rollout"
        else:
            response = self.b.message("assistant", summary, author="model")
            self.b.call(list(self.history), response)
            call, source = self.b.calls[-1], "compacted.message"
            self.evict(call.id)
            if self.unclaimed:  # the count Codex recorded for the compaction's request, just before
                call.meta["billed_tokens"] = self.unclaimed
            self.unclaimed = None
        prompt = self.b.message("user", COMPACT_PROMPT, author="harness", meta={"compaction_prompt": True})
        call.context = [*call.context, prompt]
        call.purpose, call.finish_reason, call.tools = "summarize", "stop", []
        call.meta.update(compaction_prompt=PROMPT_SOURCE, response_from=source)
        self.awaiting = None
        self.result.notes[f"summary_calls_from:{source}"] += 1

    def compacted(self, payload: dict) -> None:
        self.flush()
        message = payload.get("message")
        if isinstance(message, str) and message:  # a local compaction (a server-side one has no text)
            self.summary_call(message)
        else:
            self.result.notes["summary_calls_not_in_log:server-side"] += 1
        self.awaiting = None
        before = list(self.history)
        lead = [self.instructions] if self.instructions else []  # sent as the request's instructions
        if isinstance(payload.get("replacement_history"), list):
            new, used, current = list(lead), set(lead), set(before)
            for it in payload["replacement_history"]:
                if not isinstance(it, dict):
                    self.result.notes["items_not_objects"] += 1
                    continue
                # An item saying what an earlier one said is that message (Codex renews ids and metadata): one
                # of the history first, then any earlier one.
                same = [m for m in self.by_key.get(_key(it), []) if m not in used]
                mid = next((m for m in same if m in current), same[0] if same else None)
                if mid is None and _is_output(it):  # an output item Codex kept but we never saw: a harness artifact
                    mid = self.b.message("assistant", content_text(it.get("content")), author="harness")
                elif mid is None:
                    mid = self.message(it, author="harness")
                if mid:
                    new.append(mid)
                    used.add(mid)
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
        self.since_compaction = len(self.b.calls)
        self.result.notes["compactions"] += 1

    def finish(self, tools: ToolSet | None) -> None:
        """The system-prompt rule and the tool schemas, once the whole rollout is read (module docstring)."""
        meta = self.b.meta
        if tools is not None:
            self.b.tools = list(tools.tools)
            meta["tools"] = f"given: {tools.source}"
            for name in sorted(self.called - tools.names):
                self.result.notes[f"tool_called_not_in_tools:{name}"] += 1
        else:
            meta["tools"] = "unknown: the rollout does not record the tool schemas Codex sent (--tools FILE|NAME)"
            self.result.notes["tools_unknown"] += 1
        if self.instructions is None:
            meta["system_prompt_rule"] = "not needed: the rollout holds no base instructions"
            return
        m = next(m for m in self.b.messages if m.id == self.instructions)
        m.content, meta["system_prompt_rule"] = system_prompt_rule(m.content, tools, self.called)
        if meta["system_prompt_rule"].startswith("undecided"):
            self.result.notes["system_prompt_rule_undecided"] += 1


def import_file(path: Path, result: ImportResult, tools: ToolSet | None = None) -> None:
    b = None
    replay = None
    for line, obj in read_jsonl(path, result, check=wrong_field):
        kind, payload = obj.get("type"), obj.get("payload")
        if b is None:
            meta = payload if kind == "session_meta" and isinstance(payload, dict) else {}
            tid = str(meta.get("id") or path.stem)
            b = TrajectoryBuilder(tid, task=Task(id=tid), lineage=Lineage(source=FORMAT, source_path=str(path)),
                                  meta={k: meta[k] for k in ("cli_version", "originator", "model_provider")
                                        if isinstance(meta.get(k), str)})
            replay = _Replay(b, result)
        if not isinstance(payload, dict):
            result.reject(path, line, "missing_field", f"line {line}: record without an object payload")
            continue
        if kind == "session_meta":
            result.imported += 1
            dynamic = payload.get("dynamic_tools")
            if isinstance(dynamic, list) and dynamic:  # the app's tools, some loaded on demand: not in the table
                b.meta["dynamic_tools"] = [str(t.get("name")) for t in dynamic if isinstance(t, dict)]
            base = payload.get("base_instructions")
            text = base.get("text") if isinstance(base, dict) else base
            if isinstance(text, str) and text and replay.instructions is None:
                replay.instructions = b.message("system", text, author="system")
                replay.history.append(replay.instructions)
                replay.initial.append(replay.instructions)
        elif kind == "response_item":
            result.imported += 1
            replay.item(payload)
        elif kind == "compacted":
            result.imported += 1
            replay.compacted(payload)
        elif kind in _BOOKKEEPING:
            # Not replayed into the model history on resume (only response_item and compacted are).
            result.skipped[kind] += 1
            if kind == "event_msg" and payload.get("type") == "token_count":
                replay.token_count(payload)
            elif kind == "event_msg" and payload.get("type") == "thread_rolled_back":
                replay.rollback(payload.get("num_turns"))
            elif kind == "turn_context" and isinstance(payload.get("model"), str):
                replay.model = payload["model"]
        else:
            result.reject(path, line, "unknown_record_type", f"line {line}: record type {kind!r}", detail=carried(obj))
    if b is None:
        result.reject(path, None, "no_calls", f"{path.name}: no records")
        return
    replay.flush()
    replay.discard_unclaimed()
    replay.finish(tools)
    billed.check_billed(b, result)
    result.finish(b, path)
