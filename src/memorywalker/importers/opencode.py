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
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from memorywalker.importers.base import ImportOptions, ImportResult, loads_deep_limited, read_json
from memorywalker.records import Lineage, RecordError, Task, TrajectoryBuilder

FORMAT = "opencode"
CLEARED = "[Old tool result content cleared]"
INTERRUPTED = "[Tool execution was interrupted]"
COMPACTION_TEXT = "What did we do so far?"


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
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
                result.read += 1
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
                result.reject(path, None, "bad_json", f"session {sid}: {e}")
                continue
        msgs: list[Any] = []
        for mid, mdata in con.execute(f"select id, data from message where session_id = ? order by {order}", (sid,)):
            try:
                info = {"id": mid, "sessionID": sid, **loads_deep_limited(mdata)}
                parts = [{"id": pid, "messageID": mid, "sessionID": sid, **loads_deep_limited(d)} for pid, d in
                         con.execute("select id, data from part where message_id = ? order by id", (mid,))]
            except (json.JSONDecodeError, TypeError, RecordError) as e:
                msgs.append(f"message {mid}: data is not a JSON object ({e})")
                continue
            msgs.append({"info": info, "parts": parts})
        import_session({"id": sid, **sdata}, msgs, path, result)


def _session_info(row: dict) -> dict:
    """A v1.3 session row as the session info fields the importer reads."""
    info = {"id": row["id"], "title": row.get("title"), "parentID": row.get("parent_id"),
            "time": {k: row.get(f"time_{k}") for k in ("created", "updated", "compacting")}}
    return {k: v for k, v in info.items() if v is not None}


def _time(x: dict) -> float:
    t = x.get("time") or {}
    return t.get("created") or t.get("start") or 0


def import_session(info: dict, messages: list[Any], source: Path, result: ImportResult) -> None:
    tid = str(info.get("id") or source.stem)
    b = TrajectoryBuilder(tid, task=Task(id=tid), lineage=Lineage(
        source=FORMAT, source_path=str(source), parent=info.get("parentID"),
        relation="subagent" if info.get("parentID") else None), meta={"title": info.get("title")} if info.get("title") else {})
    history: list[tuple[str, float | None, str | None]] = []  # (message id, pruned-at time, placeholder id)
    start = 0  # index in history where the current view starts
    compaction_users: dict[str, int] = {}  # user message id -> index in history
    seen_placeholders: set[str] = set()
    delivered: set[str] = set()
    boundary = None
    for k, entry in enumerate(messages):
        result.read += 1
        if isinstance(entry, str):  # a database row whose JSON did not parse
            result.reject(source, k, "bad_json", entry)
            continue
        mi = entry.get("info") if isinstance(entry, dict) else None
        parts = entry.get("parts") if isinstance(entry, dict) else None
        if not isinstance(mi, dict) or not isinstance(parts, list) or mi.get("role") not in ("user", "assistant"):
            result.reject(source, k, "bad_format" if isinstance(entry, dict) else "not_an_object",
                          f"message #{k} is not {{info: {{role: user|assistant}}, parts: [...]}}")
            continue
        result.imported += 1
        if mi["role"] == "user":
            texts = []
            for p in parts:
                kind = p.get("type")
                if kind == "text" and not p.get("ignored"):
                    texts.append(p.get("text", ""))
                elif kind == "file":
                    texts.append(f"[file: {p.get('filename') or p.get('url', '')}]")
                elif kind == "compaction":
                    texts.append(COMPACTION_TEXT)
                elif kind == "subtask":
                    texts.append("The following tool was executed by the user")
                else:
                    result.notes[f"user_part_not_sent:{kind}"] += 1
            is_compaction = any(p.get("type") == "compaction" for p in parts)
            mid = b.message("user", "\n\n".join(texts), id=mi["id"], author="harness" if is_compaction else "user",
                            meta={"compaction_request": True} if is_compaction else {})
            if is_compaction:
                compaction_users[mi["id"]] = len(history)
            history.append((mid, None, None))
            continue
        if mi.get("error") and not any(p.get("type") in ("text", "tool", "reasoning") for p in parts):
            result.notes["failed_assistant_messages"] += 1
            continue
        # Split into steps: each step-start opens one model call.
        steps: list[list[dict]] = [[]]
        for p in parts:
            if p.get("type") == "step-start" and steps[-1]:
                steps.append([])
            steps[-1].append(p)
        for n, step in enumerate(steps):
            texts, reasoning, calls, results = [], [], [], []
            for p in step:
                kind = p.get("type")
                if kind == "text" and not p.get("synthetic_hidden"):
                    texts.append(p.get("text", ""))
                elif kind == "reasoning":
                    reasoning.append(p.get("text", ""))
                elif kind == "tool":
                    st = p.get("state") or {}
                    calls.append({"id": p.get("callID"), "name": p.get("tool", ""), "arguments": st.get("input") or {}})
                    status = st.get("status")
                    out = st.get("output", "") if status == "completed" else (
                        st.get("error", "") if status == "error" else INTERRUPTED)
                    results.append((p.get("callID"), p.get("tool"), out, (st.get("time") or {}).get("compacted")))
                elif kind not in ("step-start", "step-finish"):
                    result.notes[f"assistant_part_not_sent:{kind}"] += 1
            step_id = mi["id"] if len(steps) == 1 else f"{mi['id']}:{n}"
            summary = bool(mi.get("summary"))
            resp = b.message("assistant", "\n\n".join(texts), id=step_id, reasoning="\n\n".join(reasoning) or None,
                             tool_calls=calls, author="harness" if summary else "model",
                             meta={"summary": True} if summary else {})
            now = _time(step[0]) or _time(mi)
            context, newly = [], []
            for mid, pruned, ph in history[start:]:
                if pruned is not None and now and now >= pruned:
                    context.append(ph)
                    if ph not in seen_placeholders:
                        seen_placeholders.add(ph)
                        if mid in delivered:  # pruned before any call saw it: no branch, no eviction
                            newly.append((mid, ph))
                        else:
                            result.notes["pruned_before_delivery"] += 1
                else:
                    context.append(mid)
            if not context:
                result.reject(source, k, "missing_parent", f"message {mi['id']}: an assistant message with no history", kept=True)
                continue
            cid = b.call(context, resp, finish_reason="tool_calls" if calls else "stop",
                         meta={"summary_call": True} if summary else {})
            if boundary is not None:
                removed, inserted = boundary
                b.eviction(cid, "summarize", removed, inserted, trigger="auto" if info.get("auto") else None)
                boundary = None
            if newly:
                b.eviction(cid, "placeholder", [m for m, _ in newly], [p for _, p in newly], trigger="prune")
            delivered.update(context)
            history.append((resp, None, None))
            for call_id, tool, out, pruned in results:
                rid = b.message("tool", str(out), id=f"{step_id}:{call_id}", tool_call_id=call_id, name=tool,
                                author="environment")
                ph = None
                if pruned:
                    ph = b.message("tool", CLEARED, id=f"{rid}:cleared", tool_call_id=call_id, name=tool, author="harness")
                history.append((rid, pruned, ph))
            if summary and mi.get("finish") and mi.get("parentID") in compaction_users:
                old = [c for c in context]
                start = compaction_users[mi["parentID"]]
                new_view = {m for m, _, _ in history[start:]}
                boundary = ([m for m in old if m not in new_view], [history[start][0], resp])
    result.finish(b, source)
