"""OpenCode sessions → trajectories, from ``opencode export`` JSON, the JSON storage tree
(``storage/session/<project>/<id>.json``, ``storage/message/<session>/<id>.json``,
``storage/part/<message>/<id>.json``) or the SQLite ``opencode.db`` (v1.2+: ``session``,
``message`` and ``part`` tables with a ``data`` JSON column).

Messages are converted as OpenCode's ``toModelMessages`` does: user text and file parts; a
``compaction`` part is sent as "What did we do so far?"; assistant text, reasoning and tool parts
(a completed tool is a tool call plus its output, an errored one its error, an unfinished one
"[Tool execution was interrupted]"). Each ``step-start`` of an assistant message opens one model
call. The context of a call follows ``filterCompacted``: it starts at the newest compaction request
whose summary (assistant ``summary: true``) finished before the call; that is a ``summarize``
eviction (inserted: the request and the summary, both harness artifacts). A tool output pruned at
time ``state.time.compacted`` is sent as "[Old tool result content cleared]" to every later call:
a ``placeholder`` eviction. The system prompt is not stored, so contexts start with the first
stored message.

**The summary call** (the assistant message with ``summary: true`` answering a compaction request): for
a session of OpenCode 1.18 or later (``session.version``), as OpenCode sends it: no tools, the
compaction agent's prompt and the flattened conversation (:mod:`memorywalker.importers.opencode_summary`);
older sessions keep the structured history, unchecked (``meta.summary_context`` says which).

**The tools** are not stored either: ``--tools`` (:mod:`memorywalker.importers.tools`) gives them, else
``meta.tools`` says they are unknown.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from memorywalker.importers import billed
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    carried,
    loads_deep_limited,
    read_json,
    wrong_key_field,
)
from memorywalker.importers.opencode_summary import (
    CLEARED,
    FLATTENED_SINCE,
    SUMMARY_SYSTEM,
    flatten,
    summary_prompt,
    version,
)
from memorywalker.importers.tools import ToolSet
from memorywalker.records import Lineage, RecordError, Task, TrajectoryBuilder

FORMAT = "opencode"
INTERRUPTED = "[Tool execution was interrupted]"
COMPACTION_TEXT = "What did we do so far?"
def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    result = _import_paths(paths)
    given: ToolSet | None = (options or ImportOptions()).tools
    for traj in result.trajectories:
        if given is None:
            traj.meta["tools"] = "unknown: OpenCode's database does not store the tool schemas it sent (--tools FILE|NAME)"
            result.notes["tools_unknown"] += 1
            continue
        traj.tools = list(given.tools)
        traj.meta["tools"] = f"given: {given.source}"
        called = {tc.name for m in traj.messages for tc in m.tool_calls}
        for name in sorted(called - given.names):
            result.notes[f"tool_called_not_in_tools:{name}"] += 1
    return result


def _import_paths(paths: list[Path]) -> ImportResult:
    result = ImportResult()
    for path in paths:
        if path.is_dir() and (path / "storage").is_dir():
            path = path / "storage"
        if path.is_dir():
            for s in sorted((path / "session").glob("*/*.json")):
                info = read_json(s, result)
                if info is None:
                    continue
                msgs = []
                for mf in sorted((path / "message" / info["id"]).glob("*.json")):
                    mi = read_json(mf, result)
                    if mi is not None:
                        parts = [p for pf in sorted((path / "part" / mi["id"]).glob("*.json"))
                                 if (p := read_json(pf, result)) is not None]
                        msgs.append({"info": mi, "parts": parts})
                import_session(info, msgs, s, result)
        elif path.suffix == ".db":
            _import_db(path, result)
        else:
            data = read_json(path, result)
            if data is None:
                continue
            if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
                result.reject(path, None, "bad_format", f"{path.name}: not an `opencode export` document")
                continue
            import_session(data.get("info") or {"id": path.stem}, data["messages"], path, result)
    return result


def _import_db(path: Path, result: ImportResult) -> None:
    """Read ``opencode.db`` from a private copy (with its ``-wal``), so the live database and its WAL
    are never touched and rows not yet checkpointed are still read."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        try:
            for suffix in ("", "-wal"):
                if Path(f"{path}{suffix}").exists():
                    shutil.copyfile(f"{path}{suffix}", f"{copy}{suffix}")
            con = sqlite3.connect(f"file:{copy}", uri=True)
            _read_db(con, path, result)
            con.close()
        except (OSError, sqlite3.Error) as e:
            result.reject(path, None, "unreadable_file", f"{path.name}: {e}")


def _read_db(con: sqlite3.Connection, path: Path, result: ImportResult) -> None:
    """v1.2: ``session.data`` holds the session info; v1.3: the session is columns (``parent_id``,
    ``title``, ``time_created``, ``time_compacting``, ``revert``, ...). In both, ``message.data`` and
    ``part.data`` are the MessageV2 info / part without their id columns."""
    columns = {row[1] for row in con.execute("pragma table_info(session)")}
    msg_columns = {row[1] for row in con.execute("pragma table_info(message)")}
    order = "time_created, id" if "time_created" in msg_columns else "id"
    if "data" in columns:
        sessions = [(sid, data) for sid, data in con.execute("select id, data from session order by id")]
    else:
        con.row_factory = sqlite3.Row
        sessions = [(r["id"], _session_info(dict(r))) for r in con.execute("select * from session order by id")]
        con.row_factory = None
    for sid, sdata in sessions:
        if isinstance(sdata, str) or sdata is None:
            try:
                sdata = loads_deep_limited(sdata or "{}")
            except (json.JSONDecodeError, RecordError) as e:
                result.read += 1
                result.reject(path, None, e.code if isinstance(e, RecordError) else "bad_json", f"session {sid}: {e}")
                continue
        msgs: list[Any] = []
        for mid, mdata in con.execute(f"select id, data from message where session_id = ? order by {order}", (sid,)):
            try:
                info = {"id": mid, "sessionID": sid, **loads_deep_limited(mdata)}
                parts = [{"id": pid, "messageID": mid, "sessionID": sid, **loads_deep_limited(d)} for pid, d in
                         con.execute("select id, data from part where message_id = ? order by id", (mid,))]
            except RecordError as e:
                msgs.append((e.code, f"message {mid}: {e.message}"))
                continue
            except (json.JSONDecodeError, TypeError) as e:
                msgs.append(("bad_json", f"message {mid}: data is not a JSON object ({e})"))
                continue
            msgs.append({"info": info, "parts": parts})
        import_session({"id": sid, **sdata}, msgs, path, result)


def _session_info(row: dict) -> dict:
    """A v1.3 session row as the session info fields the importer reads."""
    info = {"id": row["id"], "title": row.get("title"), "parentID": row.get("parent_id"), "version": row.get("version"),
            "time": {k: row.get(f"time_{k}") for k in ("created", "updated", "compacting")}}
    return {k: v for k, v in info.items() if v is not None}


def _time(x: Any) -> float:
    t = x.get("time") if isinstance(x, dict) else None
    t = t if isinstance(t, dict) else {}
    v = t.get("created") or t.get("start") or 0
    return v if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _dicts(parts: list) -> list[dict]:
    return [p for p in parts if isinstance(p, dict)]


class _Session:
    """The history of one session as ``toModelMessages(filterCompacted(...))`` sends it to each call."""

    def __init__(self, info: dict, source: Path, result: ImportResult):
        info = info if isinstance(info, dict) else {}
        tid = str(info.get("id") or source.stem)
        self.b = TrajectoryBuilder(tid, task=Task(id=tid), lineage=Lineage(
            source=FORMAT, source_path=str(source), parent=info.get("parentID"),
            relation="subagent" if info.get("parentID") else None),
            meta={"system_prompt": "absent", "system_prompt_note": "OpenCode's database does not store the system "
                  "prompt it sent", **({"title": info["title"]} if info.get("title") else {})})
        self.info, self.source, self.result = info, source, result
        self.history: list[tuple[str, float | None, str | None]] = []  # (message id, pruned-at time, placeholder)
        self.first_entry: dict[str, int] = {}  # OpenCode message id -> its first index in history
        self.view: tuple[int, int, list] = (0, 0, [])  # (start, end of the summary, retained tail entries)
        self.compaction_users: dict[str, tuple[int, str | None]] = {}  # request id -> (index, tail_start_id)
        self.seen_placeholders: set[str] = set()
        self.delivered: set[str] = set()
        self.boundary: tuple[list[str], list[str]] | None = None
        # The summary call's view: OpenCode messages since the last compaction (requests and summaries left
        # out), and the last summary's text.
        version_ = version(info.get("version"))
        self.flattened = version_ is not None and version_ >= FLATTENED_SINCE
        self.window: list[tuple[dict, list[dict]]] = []
        self.prior: str | None = None
        self.requests: dict[str, dict] = {}  # compaction request id -> its compaction part

    def user(self, mi: dict, parts: list[dict]) -> None:
        texts = []
        for p in parts:
            kind = p.get("type")
            if kind == "text" and not p.get("ignored"):
                texts.append(str(p.get("text", "")))
            elif kind == "file":
                texts.append(f"[file: {p.get('filename') or p.get('url', '')}]")
            elif kind == "compaction":
                texts.append(COMPACTION_TEXT)
            elif kind == "subtask":
                texts.append("The following tool was executed by the user")
            else:
                self.result.notes[f"user_part_not_sent:{kind}"] += 1
        request = next((p for p in parts if p.get("type") == "compaction"), None)
        if request is None:
            self.window.append((mi, parts))
        else:
            self.requests[mi["id"]] = request
        mid = self.b.message("user", "\n\n".join(texts), id=str(mi["id"]), author="harness" if request else "user",
                             meta={"compaction_request": True} if request else {})
        self.first_entry[mi["id"]] = len(self.history)
        if request is not None:
            tail = request.get("tail_start_id")
            self.compaction_users[mi["id"]] = (len(self.history), tail if isinstance(tail, str) else None)
        self.history.append((mid, None, None))

    def context(self, now: float) -> tuple[list[str], list[tuple[str, str]]]:
        """The delivered context at time ``now``, and the pruned outputs first cleared for it."""
        start, head_end, tail = self.view
        entries = self.history[start:head_end] + tail + self.history[head_end:] if head_end else self.history[start:]
        context, newly = [], []
        for mid, pruned, ph in entries:
            if pruned is not None and now and now >= pruned:
                context.append(ph)
                if ph not in self.seen_placeholders:
                    self.seen_placeholders.add(ph)
                    if mid in self.delivered:
                        newly.append((mid, ph))
                    else:  # pruned before any call saw it: no branch, no eviction
                        self.result.notes["pruned_before_delivery"] += 1
            else:
                context.append(mid)
        return context, newly

    def assistant(self, mi: dict, parts: list[dict], k: int) -> None:
        if not mi.get("summary"):
            self.window.append((mi, parts))  # failed ones too: the summary call's flattening does not skip them
        err = mi.get("error")
        aborted = isinstance(err, dict) and err.get("name") == "MessageAbortedError"
        if err and not (aborted and any(p.get("type") not in ("step-start", "reasoning") for p in parts)):
            self.result.notes["failed_assistant_messages"] += 1  # toModelMessages skips it
            return
        steps: list[list[dict]] = [[]]
        for p in parts:
            if p.get("type") == "step-start" and steps[-1]:
                steps.append([])
            steps[-1].append(p)
        self.first_entry[mi["id"]] = len(self.history)
        for n, step in enumerate(steps):
            self.step(mi, step, mi["id"] if len(steps) == 1 else f"{mi['id']}:{n}", k, aborted,
                      usage=mi.get("tokens") if len(steps) == 1 else None)

    def step(self, mi: dict, step: list[dict], step_id: str, k: int, aborted: bool, usage: Any) -> None:
        texts, reasoning, calls, results = [], [], [], []
        for p in step:
            kind = p.get("type")
            if kind == "text":
                texts.append(str(p.get("text", "")))
            elif kind == "reasoning":
                reasoning.append(str(p.get("text", "")))
            elif kind == "tool":
                st = p.get("state") if isinstance(p.get("state"), dict) else {}
                call_id = str(p.get("callID"))
                calls.append({"id": call_id, "name": str(p.get("tool", "")),
                              "arguments": st.get("input") if isinstance(st.get("input"), dict) else {}})
                status = st.get("status")
                out = st.get("output", "") if status == "completed" else (
                    st.get("error", "") if status == "error" else INTERRUPTED)
                pruned = (st.get("time") or {}).get("compacted") if isinstance(st.get("time"), dict) else None
                results.append((call_id, p.get("tool"), out, pruned if isinstance(pruned, int | float) else None))
            elif kind == "step-finish":
                usage = p.get("tokens", usage)
            elif kind != "step-start":
                self.result.notes[f"assistant_part_not_sent:{kind}"] += 1
        if not (texts or reasoning or calls):
            self.result.notes["steps_without_output"] += 1  # nothing sent back: toModelMessages drops it
            return
        summary = bool(mi.get("summary"))
        resp = self.b.message("assistant", "\n\n".join(texts), id=step_id, reasoning="\n\n".join(reasoning) or None,
                              tool_calls=calls, author="harness" if summary else "model",
                              meta={"summary": True} if summary else {})
        context, newly = self.context(_time(step[0]) or _time(mi))
        if not context:
            self.result.reject(self.source, k, "missing_parent", f"message {mi['id']}: an assistant message with no "
                               "history", kept=True)
            return
        fields: dict[str, Any] = {"purpose": "summarize", "meta": {"summary_call": True}} if summary else {"meta": {}}
        if aborted:
            fields.update(selected=False, reason="aborted: the response was cut off (MessageAbortedError)")
        fields["meta"]["billed_tokens"] = _billed(usage, bool(reasoning), mi)
        history = context
        if summary:
            context = self.summary_context(mi, _time(step[0]) or _time(mi), fields)
            if self.flattened:  # the history's newly cleared outputs reach the next act call, not this one
                self.seen_placeholders -= {ph for _, ph in newly}
                newly = []
        cid = self.b.call(context, resp, finish_reason="tool_calls" if calls else "stop", **fields)
        if self.boundary is not None:
            removed, inserted = self.boundary
            self.b.eviction(cid, "summarize", [m for m in removed if m not in set(context)], inserted,
                            trigger="auto" if self.info.get("auto") else None)
            self.boundary = None
        if newly:
            self.b.eviction(cid, "placeholder", [m for m, _ in newly], [p for _, p in newly], trigger="prune")
        self.delivered.update(history)
        self.history.append((resp, None, None))
        for call_id, tool, out, pruned in results:
            rid = self.b.message("tool", str(out), id=f"{step_id}:{call_id}", tool_call_id=call_id,
                                 name=str(tool) if tool is not None else None, author="environment")
            ph = self.b.message("tool", CLEARED, id=f"{rid}:cleared", tool_call_id=call_id,
                                name=str(tool) if tool is not None else None, author="harness") if pruned else None
            self.history.append((rid, pruned, ph))
        if summary and mi.get("finish") and not mi.get("error") and mi.get("parentID") in self.compaction_users:
            self.compact(history, resp, *self.compaction_users[mi["parentID"]])
            self.prior = "\n\n".join(t for t in (str(p.get("text", "")).strip() for p in step
                                                  if p.get("type") == "text") if t).strip() or None

    def summary_context(self, mi: dict, now: float, fields: dict[str, Any]) -> list[str]:
        """The summary call's context as OpenCode 1.18 sends it (module docstring); older sessions: the
        structured history, as before."""
        if not self.flattened:
            fields["meta"]["summary_context"] = "structured history (a session older than OpenCode 1.18: not checked)"
            return self.context(now)[0]
        request = self.requests.get(mi.get("parentID"), {})
        tail = request.get("tail_start_id")
        ids = [m.get("id") for m, _ in self.window]
        head = self.window[:ids.index(tail)] if isinstance(tail, str) and tail in ids else self.window
        blocks = [b for b in (flatten(m, parts, now) for m, parts in head) if b]
        n = len(self.b.calls)
        system = self.b.message("system", SUMMARY_SYSTEM, id=f"summary-system-{n}", author="harness",
                                meta={"opencode_summary_system": "assumed: the built-in compaction agent's prompt"})
        prompt = self.b.message("user", summary_prompt(blocks, self.prior), id=f"summary-prompt-{n}", author="harness",
                                meta={"opencode_summary_prompt": True})
        fields["tools"] = []
        fields["meta"]["summary_context"] = "flattened (OpenCode 1.18)"
        return [system, prompt]

    def compact(self, context: list[str], resp: str, start: int, tail_start: str | None) -> None:
        """filterCompacted: later calls see [request, summary, ...] - with ``tail_start_id``, the
        messages from it up to the request follow the summary ([request, summary, tail..., after])."""
        tail_idx = self.first_entry.get(tail_start) if tail_start else None
        tail = self.history[tail_idx:start] if tail_idx is not None and tail_idx < start else []
        if tail_start and tail_idx is None:
            self.result.notes["compaction_tail_not_found"] += 1
        self.view = (start, len(self.history), tail)
        self.boundary = (list(context), [self.history[start][0], resp])
        ids = [m.get("id") for m, _ in self.window]  # the summary call after this one sees the tail and what follows
        self.window = self.window[ids.index(tail_start):] if tail_start in ids else []


def _billed(tokens: Any, has_reasoning: bool, mi: dict) -> dict | None:
    """Step ``tokens``: input excludes the cached parts (getUsage), so the prompt is input + cache read
    + cache write; the response is the output tokens (0 when the step reasoned). ``tokens.reasoning``
    is what a later user turn may drop from the prompt (the Responses API does, and so do chat
    templates that strip earlier turns' thinking, e.g. Qwen3's): billed.py's new-turn rule."""
    if not isinstance(tokens, dict):
        return None
    cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
    parts = [tokens.get("input"), cache.get("read"), cache.get("write")]
    prompt = sum(x for x in parts if isinstance(x, int | float) and not isinstance(x, bool))
    model = f"{mi.get('providerID')}/{mi.get('modelID')}" if mi.get("modelID") else None
    return billed.billed(prompt, 0 if has_reasoning else tokens.get("output"), model, reasoning=tokens.get("reasoning"))


def _wrong_field(entry: dict, mi: dict) -> str | None:
    """:func:`wrong_key_field` of a message, except a user message's ``model``: MessageV2.User (1.3)
    names the model it was sent to as an object ``{providerID, modelID}`` (the assistant keeps them as
    its own fields), so there the two ids must be text and the object itself is not a wrong type."""
    model = mi.get("model")
    if mi.get("role") == "user" and isinstance(model, dict):
        for key in ("providerID", "modelID"):
            if not isinstance(model.get(key), str):
                return f"info.model.{key}"
        entry = {**entry, "info": {k: v for k, v in mi.items() if k != "model"}}
    return wrong_key_field(entry)


def import_session(info: dict, messages: list[Any], source: Path, result: ImportResult) -> None:
    s = _Session(info, source, result)
    for k, entry in enumerate(messages):
        result.read += 1
        if isinstance(entry, tuple):  # a database row whose JSON did not parse: (reason, message)
            result.reject(source, k, *entry)
            continue
        mi = entry.get("info") if isinstance(entry, dict) else None
        parts = entry.get("parts") if isinstance(entry, dict) else None
        if not isinstance(mi, dict) or not isinstance(parts, list) or mi.get("role") not in ("user", "assistant") \
                or not isinstance(mi.get("id"), str):
            result.reject(source, k, "bad_format" if isinstance(entry, dict) else "not_an_object",
                          f"message #{k} is not {{info: {{id, role: user|assistant}}, parts: [...]}}",
                          detail=carried(entry))
            continue
        bad = _wrong_field(entry, mi)
        if bad is not None:
            result.reject(source, k, "wrong_type", f"message #{k}: {bad} is not text", detail=carried(entry))
            continue
        parts = _dicts(parts)
        if not parts:  # toModelMessages: `if (msg.parts.length === 0) continue`
            result.skipped["message_without_parts"] += 1
            continue
        result.imported += 1
        if mi["role"] == "user":
            s.user(mi, parts)
        else:
            s.assistant(mi, parts, k)
    billed.check_billed(s.b, result)
    result.finish(s.b, source)
