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

from memorywalker.importers import billed
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    as_list,
    as_text,
    carried,
    loads_deep_limited,
    opt_str,
    parse_arguments,
    read_json,
    read_jsonl,
    wrong_key_field,
)
from memorywalker.records import Lineage, RecordError, Task, TrajectoryBuilder

FORMAT = "openhands"
# Not in state.history (StateTracker.agent_history_filter): never in the view, never counted in offsets.
_NOT_IN_HISTORY = {"null", "change_agent_state", "agent_state_changed"}
# In the view but rendered by templates not in the log (microagent knowledge) or not at all.
_SILENT_OBS = {"recall", "agent_condensation"}


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
    """The recorded model response of an action (None without one, or with no string id to group by)."""
    meta = event.get("tool_call_metadata")
    resp = meta.get("model_response") if isinstance(meta, dict) else None
    return resp if isinstance(resp, dict) and isinstance(resp.get("id"), str) else None


def _choice(resp: dict | None) -> dict:
    choices = as_list((resp or {}).get("choices"))
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else {}


class _Replay:
    """The view of one event stream and the messages ConversationMemory makes of it.

    ``history`` holds the events of ``state.history`` (all but null / agent-state events and hidden
    ones) in order; the view at a call is ``View.from_events(history)``: forgotten events dropped, the
    newest summary inserted at its ``summary_offset`` (an offset into *events*, so events that make no
    message still count). ``process_events`` then emits each tool-calling response only once all its
    tool calls have observations - the assistant message, then its results in tool-call order.
    """

    def __init__(self, b: TrajectoryBuilder, result: ImportResult):
        self.b, self.result = b, result
        self.history: list[dict] = []
        self.forgotten: set[int] = set()
        self.summary: tuple[int, str] | None = None  # (offset, message id) of the newest condensation summary
        self.responses: dict[str, dict] = {}  # model_response id -> {"mid", "calls": [tool call ids]}
        self.results: dict[int, tuple[str, str]] = {}  # observation event id -> (tool call id, message id)
        self.messages: dict[int, str] = {}  # event id -> message id (plain messages)
        self.current: dict[str, str] = {}  # tool call id as recorded -> id in the trajectory (renamed repeats)
        self.uses: dict[str, int] = {}
        self.rewritten: dict[str, str] = {}  # finish text message -> the response it stands for

    def tool_call_ids(self, calls: list[dict]) -> list[dict]:
        """A tool call id an earlier response already used is renamed ``id#2``, ``id#3``, ... (counted):
        schema v1 needs ids unique per trajectory; observations bind to the newest use, as
        ConversationMemory pops each result once its response is emitted."""
        out = []
        for tc in calls:
            n = self.uses.get(tc["id"], 0) + 1
            self.uses[tc["id"]] = n
            new = tc["id"] if n == 1 else f"{tc['id']}#{n}"
            if n > 1:
                self.result.notes["tool_call_ids_renamed"] += 1
            self.current[tc["id"]] = new
            out.append({**tc, "id": new})
        return out

    def view(self) -> list[dict | str]:
        kept: list[dict | str] = [e for e in self.history if e["id"] not in self.forgotten]
        if self.summary is not None:
            kept.insert(self.summary[0], self.summary[1])
        return kept

    def context(self) -> list[str]:
        """ConversationMemory.process_events over the view (message ids)."""
        out: list[str] = []
        results: dict[str, str] = {}  # tool call id -> result message id
        pending: dict[str, list[str]] = {}  # response id -> its tool call ids, waiting for results
        for e in self.view():
            if isinstance(e, str):  # the condensation summary
                out.append(e)
                continue
            resp = _response_of(e)
            if e.get("action") and resp and e.get("source") == "agent" and resp.get("id") in self.responses:
                r = self.responses[resp["id"]]
                if r["calls"]:
                    pending[resp["id"]] = r["calls"]
                else:
                    out.append(r["mid"])
            elif e["id"] in self.results:
                tcid, mid = self.results[e["id"]]
                results[tcid] = mid
            elif e["id"] in self.messages:
                out.append(self.messages[e["id"]])
            for rid, calls in list(pending.items()):
                if all(c in results for c in calls):
                    out.append(self.responses[rid]["mid"])
                    out += [results.pop(c) for c in calls]
                    del pending[rid]
        return out


def import_events(events: list[Any], path: Path, result: ImportResult, counted: bool = False,
                  meta: dict | None = None) -> None:
    b = TrajectoryBuilder(path.stem, task=Task(id=path.stem), lineage=Lineage(source=FORMAT, source_path=str(path)),
                          meta=meta)
    replay = _Replay(b, result)
    pending = None  # condensation waiting for the next call: (kind, event id, removed message ids)
    for k, e in enumerate(events):
        if not counted:
            result.read += 1
        if not isinstance(e, dict) or not isinstance(e.get("id"), int) or isinstance(e.get("id"), bool):
            result.reject(path, k, "not_an_object" if not isinstance(e, dict) else "missing_field",
                          f"event #{k} is not an event with an integer id", detail=carried(e))
            continue
        bad = wrong_key_field(e)
        if bad is not None:
            result.reject(path, k, "wrong_type", f"event #{k}: {bad} is not text", detail=carried(e))
            continue
        eid, action, obs = e["id"], e.get("action"), e.get("observation")
        if action is None and obs is None:
            result.reject(path, k, "unknown_record_type", f"event {eid} is neither an action nor an observation",
                          detail=carried(e))
            continue
        if action in _NOT_IN_HISTORY or obs in _NOT_IN_HISTORY or e.get("hidden"):
            result.skipped[f"{'action' if action else 'observation'}:{action or obs}"] += 1
            continue
        replay.history.append(e)
        if action in ("condensation", "condensation_request"):
            replay.forgotten.add(eid)  # View.from_events forgets the condensation events themselves
            if action == "condensation_request":
                result.skipped["action:condensation_request"] += 1
                continue
            pending = _condense(replay, e, pending)
            result.imported += 1
            continue
        resp = _response_of(e)
        if action is not None and e.get("source") == "agent" and (resp or action == "message"):
            result.imported += 1
            if resp and resp.get("id") in replay.responses:
                continue  # another tool call of the same response: one model call
            pending = _call(replay, e, resp, path, k, pending)
            continue
        mid = _message(replay, e)
        if mid is None:
            result.skipped[f"{'action' if action else 'observation'}:{action or obs}"] += 1
        else:
            result.imported += 1
    _finish(b, result, path)


def _condense(replay: _Replay, e: dict, pending):
    """Apply a condensation to the view; the eviction (for the next call) removes the messages it made
    leave the view and inserts the summary."""
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    before = replay.context()
    forgotten = {i for i in as_list(args.get("forgotten_event_ids")) if isinstance(i, int)}
    lo, hi = args.get("forgotten_events_start_id"), args.get("forgotten_events_end_id")
    if isinstance(lo, int) and isinstance(hi, int):
        forgotten |= set(range(lo, hi + 1))
    replay.forgotten |= forgotten
    kind = "prune"
    if isinstance(args.get("summary"), str):
        sid = replay.b.message("user", args["summary"], id=f"e{e['id']}-summary", author="harness",
                               meta={"condensation_event": e["id"]})
        offset = args.get("summary_offset")
        replay.summary = (offset if isinstance(offset, int) and offset >= 0 else 0, sid)
        kind = "summarize"
    after = set(replay.context())
    removed = [m for m in before if m not in after]
    if pending is not None:  # two condensations before one call: one eviction
        removed = pending[2] + [m for m in removed if m not in pending[2]]
        kind = "summarize" if "summarize" in (kind, pending[0]) else kind
    return kind, e["id"], removed


def _call(replay: _Replay, e: dict, resp: dict | None, path: Path, k: int, pending):
    """One model response: its assistant message (with all its tool calls) and the call whose context is
    the view before it."""
    b, eid = replay.b, e["id"]
    choice = _choice(resp)
    fns = [(tc, tc.get("function") if isinstance(tc.get("function"), dict) else {})
           for tc in as_list(choice.get("tool_calls")) if isinstance(tc, dict)]
    raw = [{"id": str(tc.get("id")), "name": as_text(fn.get("name")), "arguments": parse_arguments(fn.get("arguments"))}
           for tc, fn in fns]
    tool_calls = replay.tool_call_ids(raw)
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    text = choice.get("content") if resp else args.get("content", e.get("message", ""))
    reasoning = choice.get("reasoning_content")
    text = text if isinstance(text, str) else ""
    mid = b.message("assistant", text, id=f"e{eid}", tool_calls=tool_calls, author="model",
                    reasoning=reasoning if isinstance(reasoning, str) else None, meta={"event_id": eid})
    context = replay.context()
    if e.get("action") == "finish":
        # ConversationMemory sends a finish as its thought text, without the tool call.
        thought = str(args.get("thought") or "")
        said = f"{thought}\n{text}" if thought and text and thought != text else (thought or text)
        replay.messages[eid] = b.message("assistant", said, id=f"e{eid}:finish", author="model",
                                         meta={"event_id": eid, "finish_as_text": True})
        replay.rewritten[replay.messages[eid]] = mid
    elif resp:
        replay.responses[resp.get("id")] = {"mid": mid, "calls": [tc["id"] for tc in tool_calls]}
    else:
        replay.messages[eid] = mid
    if not context:
        replay.result.reject(path, k, "missing_parent", f"event {eid}: a response with no prior event", kept=True)
        return pending
    usage = (resp or {}).get("usage") if isinstance((resp or {}).get("usage"), dict) else {}
    cid = b.call(context, mid, finish_reason="tool_calls" if tool_calls else "stop",
                 meta={k2: v for k2, v in {"model_response_id": (resp or {}).get("id") or f"event-{eid}",
                       "billed_tokens": billed.billed(usage.get("prompt_tokens"),
                                                      0 if reasoning else usage.get("completion_tokens"),
                                                      (resp or {}).get("model"))}.items() if v})
    prev = b.calls[-2] if len(b.calls) > 1 else None
    before = [*prev.context, prev.response] if prev else []
    now = set(context)
    if pending is not None:
        kind, ceid, removed = pending
        inserted = [m for m in context if m not in set(before) and m.endswith("-summary")]
        b.eviction(cid, kind, [m for m in removed if m not in now], inserted, trigger="condenser",
                   meta={"condensation_event": ceid})
        return None
    swapped = [(replay.rewritten[m], m) for m in context if m in replay.rewritten and replay.rewritten[m] in before]
    if swapped:  # the previous finish response, sent back as text: the tree branches there
        b.eviction(cid, "other", [r for r, _ in swapped], [t for _, t in swapped],
                   meta={"finish_as_text": True})
    return None


def _message(replay: _Replay, e: dict) -> str | None:
    """The message of a user action or an observation (None: the event makes none)."""
    b, eid, action = replay.b, e["id"], e.get("action")
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    meta = e.get("tool_call_metadata") if isinstance(e.get("tool_call_metadata"), dict) else {}
    name = opt_str(meta.get("function_name"))
    if action == "system":
        mid = b.message("system", str(args.get("content", "")), id=f"e{eid}", author="system")
    elif action == "message":
        mid = b.message("user", str(args.get("content", e.get("message", ""))), id=f"e{eid}", author="user")
    elif action == "run" and e.get("source") == "user":
        mid = b.message("user", f"User executed the command:\n{args.get('command', '')}", id=f"e{eid}", author="user")
    elif action is not None or e.get("observation") in _SILENT_OBS or e.get("source") == "environment":
        return None  # in the view (it counts for summary offsets) but makes no message here
    elif meta.get("tool_call_id") in replay.current:
        tcid = replay.current[meta["tool_call_id"]]
        mid = b.message("tool", as_text(e.get("content")), id=f"e{eid}", tool_call_id=tcid, name=name,
                        author="environment")
        replay.results[eid] = (tcid, mid)
        return mid
    else:
        replay.result.notes["observations_without_tool_call"] += 1
        mid = b.message("user", str(e.get("content", e.get("message", ""))), id=f"e{eid}", author="environment")
    replay.messages[eid] = mid
    return mid


def _finish(b: TrajectoryBuilder, result: ImportResult, path: Path) -> None:
    billed.check_billed(b, result)
    result.finish(b, path)
