"""Pi coding agent sessions (``~/.pi/agent/sessions/--<path>--/<timestamp>_<uuid>.jsonl``) → trajectories.

Follows badlogic/pi-mono [83378aa] ``packages/coding-agent``: ``docs/session.md`` (the format),
``src/core/session-manager.ts`` (``buildSessionContext``, the v1 → v2 → v3 migrations),
``src/core/messages.ts`` (``convertToLlm`` and its summary prefixes) and ``packages/ai/src/providers/
transform-messages.ts`` (what every provider call then does to the list).

* **Entries form a tree** through ``id`` / ``parentId`` (v1 files have neither: each entry hangs from the
  one before it, and a compaction's ``firstKeptEntryIndex`` counts file lines from the header).
* **Calls.** Every assistant message entry is one call. Its context is ``buildSessionContext`` with the
  leaf at its parent: the path from the root; with a ``compaction`` entry on it, the summary first,
  then the entries from ``firstKeptEntryId`` up to the compaction, then those after it. Message
  entries, ``custom_message`` and ``branch_summary`` entries are sent; settings, labels, ``custom``
  and ``session_info`` entries are not.
* **convertToLlm**: ``bashExecution`` → user text (``Ran `cmd```…), skipped when ``excludeFromContext``;
  ``custom`` → user; ``branchSummary`` / ``compactionSummary`` → user text inside their ``<summary>``
  prefixes (harness artifacts). **transformMessages**: errored or aborted assistant messages are not
  sent; a tool call left without a result gets ``No result provided`` when the next assistant or
  user message comes. Not replicated: Pi sends another model's thinking as text (here it stays
  ``reasoning``) and normalizes tool-call ids for some providers.
* **Evictions.** The first call under a new compaction is a ``summarize`` eviction (``tokensBefore``
  kept); a branch summary (``/tree`` with a summary of the abandoned branch) is a ``summarize``
  eviction with ``meta.branch_summary``. A plain branch is a rewind: the tree records it.
* **Billed tokens**: ``usage.input + cacheRead + cacheWrite`` per assistant message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memorywalker.importers import billed
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    as_list,
    carried,
    content_text,
    files_under,
    import_files,
    read_jsonl,
)
from memorywalker.records import Lineage, Task, TrajectoryBuilder

FORMAT = "pi"
COMPACTION_PREFIX = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
COMPACTION_SUFFIX = "\n</summary>"
BRANCH_PREFIX = "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n"
BRANCH_SUFFIX = "</summary>"
NO_RESULT = "No result provided"
_NOT_SENT = {"thinking_level_change", "model_change", "custom", "label", "session_info"}
_ROLES = {"user", "assistant", "toolResult", "bashExecution", "custom", "hookMessage", "branchSummary",
          "compactionSummary"}


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    return import_files(files_under(paths), import_file)


def bash_text(m: dict) -> str:
    """messages.ts ``bashExecutionToText``."""
    text = f"Ran `{m.get('command', '')}`\n"
    text += f"```\n{m['output']}\n```" if m.get("output") else "(no output)"
    if m.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif isinstance(m.get("exitCode"), int) and m["exitCode"] != 0:
        text += f"\n\nCommand exited with code {m['exitCode']}"
    if m.get("truncated") and m.get("fullOutputPath"):
        text += f"\n\n[Output truncated. Full output: {m['fullOutputPath']}]"
    return text


def read_entries(path: Path, result: ImportResult) -> tuple[dict, list[tuple[int, dict]]]:
    """(header, [(line, entry)]) with v1 entries given ids and parents as the v1 → v2 migration does."""
    header: dict = {}
    entries: list[tuple[int, dict]] = []
    lines: list[dict] = []  # every parsed line, header included (v1 firstKeptEntryIndex counts it)
    for line, obj in read_jsonl(path, result):
        lines.append(obj)
        if obj.get("type") == "session" and not header:
            header = obj
            result.skipped["session_header"] += 1
            continue
        entries.append((line, obj))
    version = header.get("version")
    version = int(version) if isinstance(version, str) and version.isdigit() else version  # a text column of rows
    if not isinstance(version, int) or isinstance(version, bool) or version < 2:  # v1: no version field
        prev = None
        for line, e in entries:
            e["id"], e["parentId"] = f"L{line}", prev
            prev = e["id"]
        for _, e in entries:
            k = e.get("firstKeptEntryIndex")
            if e.get("type") == "compaction" and isinstance(k, int) and 0 <= k < len(lines):
                e["firstKeptEntryId"] = lines[k].get("id")
    return header, entries


def import_file(path: Path, result: ImportResult) -> None:
    header, entries = read_entries(path, result)
    tid = str(header.get("id") or path.stem)
    parent = header.get("parentSession") or header.get("branchedFrom")
    b = TrajectoryBuilder(tid, task=Task(id=tid), lineage=Lineage(
        source=FORMAT, source_path=str(path), parent=str(parent) if parent else None,
        relation="fork" if parent else None), meta={k: header[k] for k in ("cwd", "version") if k in header})
    s = _Session(b, result)
    for line, e in entries:
        kind = e.get("type")
        if not isinstance(e.get("id"), str) or ("parentId" in e and not isinstance(e["parentId"], str | None)):
            result.reject(path, line, "missing_field", f"line {line}: entry without a string id", detail=carried(e))
            continue
        s.by_id[e["id"]] = e
        if kind == "message":
            m = e.get("message")
            role = m.get("role") if isinstance(m, dict) else None
            if role not in _ROLES:
                result.reject(path, line, "unknown_record_type" if isinstance(m, dict) else "missing_field",
                              f"line {line}: message role {role!r}; kept as a link of the entry tree", detail=carried(e))
                continue
            result.imported += 1
            if role == "assistant":
                s.call(e, path, line)
        elif kind in ("compaction", "branch_summary", "custom_message"):
            result.imported += 1
        elif kind in _NOT_SENT:
            result.skipped[kind] += 1
        else:
            result.reject(path, line, "unknown_record_type", f"line {line}: entry type {kind!r}; kept as a link "
                          "of the entry tree", detail=carried(e))
    billed.check_billed(b, result)
    result.finish(b, path)


class _Session:
    def __init__(self, b: TrajectoryBuilder, result: ImportResult):
        self.b, self.result = b, result
        self.by_id: dict[str, dict] = {}
        self.pos: dict[str, int] = {}  # message id -> index in the builder's table
        self.prev: tuple[list[str], str | None] | None = None  # previous call's S and its compaction

    def path(self, leaf: str | None) -> tuple[list[dict], bool]:
        """Entries from the root to ``leaf`` (and whether the walk was cut by a missing parent or a loop)."""
        out, seen, uid = [], set(), leaf
        while uid is not None:
            e = self.by_id.get(uid)
            if e is None or uid in seen:
                return out[::-1], True
            seen.add(uid)
            out.append(e)
            uid = e.get("parentId")
        return out[::-1], False

    def call(self, entry: dict, source: Path, line: int) -> None:
        msg = entry["message"]
        path, cut = self.path(entry.get("parentId"))
        compaction = next((e for e in reversed(path) if e.get("type") == "compaction"), None)
        sent = self.build_context(path, compaction)
        context = self.transform(sent)
        response = self.assistant(entry)
        if not context:
            self.result.notes["calls_without_context"] += 1
            return
        fields: dict[str, Any] = {}
        stop = msg.get("stopReason")
        if stop in ("error", "aborted"):
            fields.update(selected=False, reason=f"{stop}: {msg.get('errorMessage') or 'the request failed'}")
        elif cut:
            self.result.reject(source, line, "missing_parent", f"line {line}: the entry tree behind this response "
                               "is cut (a parent is missing or the links loop)", kept=True)
            fields.update(selected=False, reason="context_gap: a parent entry is missing")
        usage = msg.get("usage") if isinstance(msg.get("usage"), dict) else {}
        prompt = sum(v for v in (usage.get("input"), usage.get("cacheRead"), usage.get("cacheWrite"))
                     if isinstance(v, int | float) and not isinstance(v, bool))
        reasoned = any(isinstance(c, dict) and c.get("type") == "thinking" for c in as_list(msg.get("content")))
        model = f"{msg.get('provider')}/{msg.get('model')}"
        meta = {"entry_id": entry["id"], "billed_tokens": None if fields else billed.billed(
            prompt, 0 if reasoned else usage.get("output"), model, usage.get("cacheRead"))}
        finish = {"toolUse": "tool_calls", "length": "length", "error": "error", "aborted": "error"}.get(stop, "stop")
        cid = self.b.call(context, response, finish_reason=finish, meta={k: v for k, v in meta.items() if v}, **fields)
        self.evict(cid, context, compaction, path)
        self.prev = ([*context, response], compaction["id"] if compaction else None)

    def build_context(self, path: list[dict], compaction: dict | None) -> list[dict]:
        """buildSessionContext: the entries whose messages are sent, in order."""
        if compaction is None:
            return [e for e in path if self.sendable(e)]
        at = path.index(compaction)
        kept, found = [], False
        for e in path[:at]:
            found = found or e.get("id") == compaction.get("firstKeptEntryId")
            if found and self.sendable(e):
                kept.append(e)
        return [compaction, *kept, *[e for e in path[at + 1:] if self.sendable(e)]]

    @staticmethod
    def sendable(e: dict) -> bool:
        kind = e.get("type")
        if kind == "message":
            return isinstance(e.get("message"), dict) and e["message"].get("role") in _ROLES
        return kind == "custom_message" or (kind == "branch_summary" and bool(e.get("summary")))

    def transform(self, entries: list[dict]) -> list[str]:
        """convertToLlm, then transformMessages: errored/aborted assistants are not sent; a tool call left
        without a result gets a synthetic one when the next assistant or user message comes."""
        out: list[str] = []
        pending: list = []  # tool calls of the last assistant message
        answered: set[str] = set()
        issued: set[str] = set()
        for e in entries:
            m = e.get("message") if e.get("type") == "message" else {}
            role = m.get("role")
            if role == "bashExecution" and m.get("excludeFromContext"):
                continue
            llm = role if role in ("assistant", "toolResult") else "user"
            if llm != "toolResult" and pending:
                out += [self.no_result(tc) for tc in pending if tc.id not in answered]
                pending, answered = [], set()
            if llm == "assistant":
                if m.get("stopReason") in ("error", "aborted"):
                    continue
                mid = self.assistant(e)
                pending = list(self.b.messages[self.pos[mid]].tool_calls)
                issued |= {tc.id for tc in pending}
                out.append(mid)
            elif llm == "toolResult":
                if str(m.get("toolCallId")) not in issued:
                    self.result.notes["orphan_tool_results_dropped"] += 1  # its call was compacted away
                    continue
                answered.add(str(m.get("toolCallId")))
                out.append(self.plain(e))
            else:
                out.append(self.plain(e))
        return out

    def no_result(self, tc) -> str:
        mid = f"{tc.id}:no-result"
        if mid not in self.pos:
            self.add(self.b.message("tool", NO_RESULT, id=mid, tool_call_id=tc.id, name=tc.name, author="system",
                                    meta={"synthetic": True, "is_error": True}))
        return mid

    def add(self, mid: str) -> str:
        self.pos[mid] = len(self.b.messages) - 1
        return mid

    def assistant(self, e: dict) -> str:
        """The assistant message of an entry. Pi sends another model's thinking as text; here it stays
        ``reasoning`` (one message per entry), counted as ``cross_model_thinking``."""
        if e["id"] in self.pos:
            return e["id"]
        texts, thinking, calls = [], [], []
        content = e["message"].get("content")
        for c in content if isinstance(content, list) else []:
            if not isinstance(c, dict):
                continue
            if c.get("type") == "text":
                texts.append(str(c.get("text", "")))
            elif c.get("type") == "thinking" and not c.get("redacted"):
                thinking.append(str(c.get("thinking", "")))
            elif c.get("type") == "toolCall":
                args = c.get("arguments")
                calls.append({"id": str(c.get("id")), "name": str(c.get("name", "")),
                              "arguments": args if isinstance(args, dict) else {}})
        return self.add(self.b.message("assistant", "\n\n".join(texts), id=e["id"], tool_calls=calls,
                                       reasoning="\n\n".join(thinking) or None, author="model",
                                       meta={"model": e["message"].get("model")}))

    def plain(self, e: dict) -> str:
        if e["id"] in self.pos:
            return e["id"]
        kind, m = e.get("type"), e.get("message") or {}
        role = m.get("role")
        fields: dict[str, Any] = {"author": "user", "meta": {}}
        if kind == "compaction" or role == "compactionSummary":
            text = COMPACTION_PREFIX + str(e.get("summary", m.get("summary", ""))) + COMPACTION_SUFFIX
            fields.update(author="harness", meta={"compaction_summary": True, "tokens_before": e.get("tokensBefore")})
        elif kind == "branch_summary" or role == "branchSummary":
            text = BRANCH_PREFIX + str(e.get("summary", m.get("summary", ""))) + BRANCH_SUFFIX
            fields.update(author="harness", meta={"branch_summary": True, "from_id": e.get("fromId", m.get("fromId"))})
        elif kind == "custom_message" or role in ("custom", "hookMessage"):
            text = content_text(e.get("content") if kind == "custom_message" else m.get("content"))
            fields.update(author="system", meta={"custom_type": e.get("customType", m.get("customType"))})
        elif role == "bashExecution":
            text = bash_text(m)
        elif role == "toolResult":
            name = m.get("toolName")
            return self.add(self.b.message("tool", content_text(m.get("content")), id=e["id"],
                                           tool_call_id=str(m.get("toolCallId")), name=name if isinstance(name, str) else None,
                                           author="environment", meta={"is_error": True} if m.get("isError") else {}))
        else:
            text = content_text(m.get("content"))
        return self.add(self.b.message("user", text, id=e["id"], **fields))

    def evict(self, cid: str, context: list[str], compaction: dict | None, path: list[dict]) -> None:
        if self.prev is None:
            return
        before, prev_compaction = self.prev
        now = set(context)
        table = {m.id: m for m in self.b.messages}
        new = [m for m in context if m not in set(before)]
        if compaction is not None and compaction["id"] != prev_compaction:
            self.b.eviction(cid, "summarize", [m for m in before if m not in now], [compaction["id"]],
                            trigger="compaction", tokens_before=compaction.get("tokensBefore")
                            if isinstance(compaction.get("tokensBefore"), int) else None,
                            meta={"compaction_entry": compaction["id"]})
            self.result.notes["compactions"] += 1
        elif any(table[m].meta.get("branch_summary") for m in new):
            self.b.eviction(cid, "summarize", [m for m in before if m not in now],
                            [m for m in new if table[m].meta.get("branch_summary")], trigger="branch",
                            meta={"branch_summary": True})
            self.result.notes["branch_summaries"] += 1
