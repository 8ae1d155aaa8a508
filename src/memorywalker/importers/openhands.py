"""OpenHands event lists / event streams → trajectories.

Input: a JSON list of serialized events (``trajs_*.json``, ``/api/.../events`` output), a JSONL
event stream, a directory of ``<id>.json`` event files, or OpenHands' session folders as its file
store writes them (``sessions/<sid>/events/<id>.json``, ``event_cache/<start>-<end>.json`` pages
that repeat those events, ``metadata.json``); a folder of such session folders imports each.
One call per model response: actions
sharing ``tool_call_metadata.model_response.id`` are one response (parallel tool calls), an agent
``message`` action without metadata is a text response. The context of a call is the *view* at
that moment, replayed as OpenHands' ``View.from_events`` does: condensation actions drop the
forgotten events (``forgotten_event_ids`` or ``forgotten_events_start_id..end_id``) and insert the
most recent summary at ``summary_offset``; each condensation is a white-box eviction (``summarize``
with a summary, ``prune`` without). Messages are built from event content (action = the recorded
model response; observation = its ``content`` as a tool result); the system prompt and OpenHands'
observation templates are not in the events, so those parts of the text are approximations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    loads_deep_limited,
    parse_arguments,
    read_json,
    read_jsonl,
)
from memorywalker.records import Lineage, RecordError, Task, TrajectoryBuilder

FORMAT = "openhands"
_SKIP_ACTIONS = {"change_agent_state", "condensation_request", "recall", "null", "system"}
_SKIP_OBS = {"agent_state_changed", "null", "recall", "agent_condensation"}


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    result = ImportResult()
    for path in paths:
        if path.is_dir() and (path / "events").is_dir():
            import_session_dir(path, result)
            continue
        sessions = sorted(d for d in path.iterdir() if (d / "events").is_dir()) if path.is_dir() else []
        if sessions:
            for d in sessions:
                import_session_dir(d, result)
            continue
        files = sorted(path.glob("*.json"), key=lambda p: (len(p.stem), p.stem)) if path.is_dir() else []
        if files and all(f.stem.isdigit() for f in files):  # an event store: one event per <id>.json
            events = [e for f in files if (e := read_json(f, result)) is not None]
            import_events(events, path, result)
        elif path.is_dir():
            result.add(import_paths(files))
        elif path.suffix == ".jsonl":
            import_events([obj for _, obj in read_jsonl(path, result)], path, result, counted=True)
        else:
            data = read_json(path, result)
            if data is None:
                continue
            if isinstance(data, dict):
                data = data.get("events") or data.get("history") or []
            if not isinstance(data, list):
                result.reject(path, None, "bad_format", f"{path.name}: not a list of events")
                continue
            import_events(data, path, result)
    return result


def import_session_dir(folder: Path, result: ImportResult) -> None:
    """One ``sessions/<sid>/`` folder: the event files, plus any event a cache page holds whose own
    file is missing (a page repeats events that have files: those copies are skipped, counted)."""
    events: dict[int, Any] = {}
    for f in (folder / "events").glob("*.json"):
        try:
            e = loads_deep_limited(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecordError) as err:
            result.read += 1  # one event per file: a bad file is one rejected record
            result.reject(f, 0, err.code if isinstance(err, RecordError) else "bad_json", f"{f.name}: {err}")
            continue
        if f.stem.isdigit():
            events[int(f.stem)] = e
        else:
            result.read += 1
            result.reject(f, 0, "bad_format", f"{f.name}: event files are named <id>.json")
    pages = sorted((folder / "event_cache").glob("*.json")) if (folder / "event_cache").is_dir() else []
    for page in pages:
        data = read_json(page, result)
        for e in data if isinstance(data, list) else []:
            if isinstance(e, dict) and isinstance(e.get("id"), int) and e["id"] not in events:
                events[e["id"]] = e  # its own file is missing: the page is the only copy
                result.notes["events_from_cache"] += 1
            else:
                result.read += 1
                result.skipped["event_cache_copy"] += 1
    meta = read_json(folder / "metadata.json", result) if (folder / "metadata.json").exists() else None
    if meta is not None:
        result.read += 1
        result.skipped["metadata"] += 1
    import_events([events[k] for k in sorted(events)], folder, result,
                  meta={"title": meta.get("title")} if isinstance(meta, dict) and meta.get("title") else None)


def _response_of(event: dict) -> dict | None:
    return ((event.get("tool_call_metadata") or {}).get("model_response")) or None


def import_events(events: list[Any], path: Path, result: ImportResult, counted: bool = False,
                  meta: dict | None = None) -> None:
    b = TrajectoryBuilder(path.stem, task=Task(id=path.stem), lineage=Lineage(source=FORMAT, source_path=str(path)),
                          meta=meta)
    view: list[tuple[int, str]] = []  # (event id, message id) currently visible, in order
    summary: tuple[int, str] | None = None  # (offset, message id) of the newest condensation summary
    pending = None  # eviction waiting for the next call
    last_resp: str | None = None  # model_response id of the newest assistant message
    known: set[str] = set()
    for k, e in enumerate(events):
        if not counted:
            result.read += 1
        if not isinstance(e, dict) or "id" not in e:
            result.reject(path, k, "not_an_object" if not isinstance(e, dict) else "missing_field",
                          f"event #{k} is not an event with an id")
            continue
        eid, action, obs = e["id"], e.get("action"), e.get("observation")
        if action == "condensation":
            args = e.get("args") or {}
            forgotten = set(args.get("forgotten_event_ids") or [])
            if args.get("forgotten_events_start_id") is not None:
                forgotten |= set(range(args["forgotten_events_start_id"], args["forgotten_events_end_id"] + 1))
            removed = [m for i, m in view if i in forgotten]
            view = [(i, m) for i, m in view if i not in forgotten]
            inserted = []
            if args.get("summary") is not None:
                sid = b.message("user", args["summary"], id=f"e{eid}-summary", author="harness",
                                meta={"condensation_event": eid})
                summary = (int(args.get("summary_offset") or 0), sid)
                inserted = [sid]
            pending = ("summarize" if inserted else "prune", removed, inserted, eid)
            result.imported += 1
            continue
        if action is None and obs is None:
            result.reject(path, k, "unknown_record_type", f"event {eid} is neither an action nor an observation")
            continue
        if action in _SKIP_ACTIONS or obs in _SKIP_OBS or e.get("source") == "environment":
            result.skipped[f"{'action' if action else 'observation'}:{action or obs}"] += 1
            continue
        resp = _response_of(e)
        if action is not None and e.get("source") == "agent" and (resp or action == "message"):
            rid = (resp or {}).get("id") or f"event-{eid}"
            result.imported += 1
            if rid == last_resp:
                continue  # another tool call of the same response
            choice = ((resp or {}).get("choices") or [{}])[0].get("message") or {}
            tool_calls = [{"id": tc.get("id"), "name": (tc.get("function") or {}).get("name", ""),
                           "arguments": parse_arguments((tc.get("function") or {}).get("arguments"))}
                          for tc in choice.get("tool_calls") or []]
            text = choice.get("content") if resp else (e.get("args") or {}).get("content", e.get("message", ""))
            mid = b.message("assistant", text or "", id=f"e{eid}", tool_calls=tool_calls, author="model",
                            reasoning=choice.get("reasoning_content"), meta={"event_id": eid})
            context = _visible(view, summary)
            if not context:
                result.reject(path, k, "missing_parent", f"event {eid}: a response with no prior event", kept=True)
                continue
            cid = b.call(context, mid, finish_reason="tool_calls" if tool_calls else "stop",
                         meta={"model_response_id": rid})
            if pending:
                kind, removed, inserted, ceid = pending
                b.eviction(cid, kind, removed, inserted, trigger="condenser", meta={"condensation_event": ceid})
                pending = None
            known.update(tc["id"] for tc in tool_calls)
            view.append((eid, mid))
            last_resp = rid
            continue
        # User messages and observations become context messages.
        result.imported += 1
        if action == "message":
            mid = b.message("user", (e.get("args") or {}).get("content", e.get("message", "")), id=f"e{eid}",
                            author="user")
        else:
            tcid = (e.get("tool_call_metadata") or {}).get("tool_call_id")
            if not tcid or tcid not in known:
                result.notes["observations_without_tool_call"] += 1
                mid = b.message("user", str(e.get("content", e.get("message", ""))), id=f"e{eid}", author="environment")
            else:
                mid = b.message("tool", str(e.get("content", "")), id=f"e{eid}", tool_call_id=tcid,
                                name=(e.get("tool_call_metadata") or {}).get("function_name"), author="environment")
        view.append((eid, mid))
        last_resp = None
    result.finish(b, path)


def _visible(view: list[tuple[int, str]], summary: tuple[int, str] | None) -> list[str]:
    ids = [m for _, m in view]
    if summary:
        offset, sid = summary
        ids = ids[:offset] + [sid] + ids[offset:]
    return ids
