"""Newer on-disk forms of OpenCode, OpenHands and Codex, built by hand in the shapes the harnesses
write (checked against their sources): OpenCode 1.3 ``opencode.db`` (session as plain columns, rows
still in the WAL), OpenHands session folders, Codex ``world_state`` and server-side compaction."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from memorywalker.importers import run_import
from memorywalker.importers.codex import OPAQUE_COMPACTION
from memorywalker.importers.opencode import CLEARED, COMPACTION_TEXT
from memorywalker.render import Renderer
from memorywalker.tree import ConditioningTree
from test_import_synthetic import _codex_rollout, _opencode_session, _openhands_events


def _segments(tokenizer, traj) -> int:
    return len(ConditioningTree.build([Renderer(tokenizer).render(traj)]).segments(0))


def _counts_add_up(res) -> None:
    assert res.read == res.imported + sum(res.skipped.values()) + res.rejected


# --- opencode 1.3 -----------------------------------------------------------------------------------

_V13_SCHEMA = """
create table session (id text primary key, project_id text not null, workspace_id text, parent_id text,
  slug text not null, directory text not null, title text not null, version text not null, share_url text,
  summary_additions integer, summary_deletions integer, summary_files integer, summary_diffs text,
  revert text, permission text, time_created integer not null, time_updated integer not null,
  time_compacting integer, time_archived integer);
create table message (id text primary key, session_id text not null, time_created integer not null,
  time_updated integer not null, data text not null);
create table part (id text primary key, message_id text not null, session_id text not null,
  time_created integer not null, time_updated integer not null, data text not null);
"""


def _v13_db(path: Path) -> sqlite3.Connection:
    """ses_1 (the shared hand-built session) and ses_2 (user, a row whose data is not JSON, assistant);
    ``data`` holds the info/part without the id columns, as OpenCode 1.3 stores it. The writer stays
    open in WAL mode, so every row is still in ``opencode.db-wal``."""
    con = sqlite3.connect(path)
    con.execute("pragma journal_mode=wal")
    con.execute("pragma wal_autocheckpoint=0")
    con.executescript(_V13_SCHEMA)
    info, msgs = _opencode_session()
    second = [{"info": {"id": "msg_a", "role": "user", "time": {"created": 1}},
               "parts": [{"id": "prt_a", "type": "text", "text": "hello"}]},
              {"info": {"id": "msg_b"}, "parts": [], "raw": "{not json"},
              {"info": {"id": "msg_c", "role": "assistant", "parentID": "msg_a", "time": {"created": 3}},
               "parts": [{"id": "prt_c", "type": "text", "text": "hi"}]}]
    for sid, title, rows in (("ses_1", info["title"], msgs), ("ses_2", "second", second)):
        con.execute("insert into session (id, project_id, slug, directory, title, version, time_created, "
                    "time_updated) values (?, 'p', 'slug', '/w', ?, '1.3.2', 1, 2)", (sid, title))
        for n, m in enumerate(rows):
            mid = m["info"]["id"]
            data = m.get("raw") or json.dumps({k: v for k, v in m["info"].items() if k not in ("id", "sessionID")})
            con.execute("insert into message values (?, ?, ?, ?, ?)", (mid, sid, n, n, data))
            for p in m["parts"]:
                pdata = {k: v for k, v in p.items() if k not in ("id", "messageID", "sessionID")}
                con.execute("insert into part values (?, ?, ?, ?, ?, ?)", (p["id"], mid, sid, n, n, json.dumps(pdata)))
    con.commit()
    return con


def test_opencode_13_database_in_wal(tmp_path, tokenizer):
    """Contexts of ses_1 by hand (ids: user/assistant message ids, tool result ``<msg>:<call>``):
    msg_02 [msg_01] · msg_03 [msg_01 msg_02 msg_02:call_1] · msg_05 (output pruned at t=50)
    [msg_01 msg_02 msg_02:call_1:cleared msg_03 msg_04] · summary msg_07 [.. msg_05 msg_06] ·
    msg_09 [msg_06 msg_07 msg_08]; a placeholder and a summarize eviction, 3 segments. ses_2: the
    bad row is rejected as bad_json, its neighbours make one call. The database and its WAL are
    byte-identical after the import."""
    db = tmp_path / "opencode.db"
    writer = _v13_db(db)
    wal = Path(f"{db}-wal")
    before = (db.read_bytes(), wal.read_bytes())
    assert wal.stat().st_size > 0
    res = run_import("opencode", [db])
    assert (db.read_bytes(), wal.read_bytes()) == before
    writer.close()
    one, two = res.trajectories
    assert [c.context for c in one.calls] == [
        ["msg_01"], ["msg_01", "msg_02", "msg_02:call_1"],
        ["msg_01", "msg_02", "msg_02:call_1:cleared", "msg_03", "msg_04"],
        ["msg_01", "msg_02", "msg_02:call_1:cleared", "msg_03", "msg_04", "msg_05", "msg_06"],
        ["msg_06", "msg_07", "msg_08"]]
    table = one.message_table()
    assert (table["msg_02:call_1:cleared"].content, table["msg_06"].content) == (CLEARED, COMPACTION_TEXT)
    ph, summ = one.evictions
    assert (ph.kind, ph.before_call, ph.removed, ph.inserted) == ("placeholder", "call-2", ["msg_02:call_1"],
                                                                  ["msg_02:call_1:cleared"])
    assert (summ.kind, summ.before_call, summ.inserted) == ("summarize", "call-4", ["msg_06", "msg_07"])
    assert summ.removed == ["msg_01", "msg_02", "msg_02:call_1:cleared", "msg_03", "msg_04", "msg_05"]
    assert one.meta["title"] == "demo" and _segments(tokenizer, one) == 3
    assert [c.context for c in two.calls] == [["msg_a"]]
    assert [(r.reason, r.line) for r in res.rejects] == [("bad_json", 1)]
    assert res.read == 12 and res.imported == 11
    _counts_add_up(res)


# --- openhands session folders ----------------------------------------------------------------------

def test_openhands_session_folder(tmp_path, tokenizer):
    """sessions/<sid>/events/<id>.json as OpenHands' file store writes them, a cache page 0-4 that
    repeats events 0-4 (event 3's own file is missing: the page supplies it), metadata.json. Same
    contexts as the exported list: 4 calls, the condensation (range form) a summarize eviction
    removing e1-e4 before the third call, 2 segments."""
    events = _openhands_events(range_form=True)
    sid = tmp_path / "sessions" / "4f2a9c"
    (sid / "events").mkdir(parents=True)
    (sid / "event_cache").mkdir()
    for e in events:
        if e["id"] != 3:
            (sid / "events" / f"{e['id']}.json").write_text(json.dumps(e))
    (sid / "event_cache" / "0-5.json").write_text(json.dumps(events[:5]))
    (sid / "metadata.json").write_text(json.dumps({"conversation_id": "4f2a9c", "title": "list files"}))
    (sid / "agent_state.pkl").write_bytes(b"\x80\x04N.")
    for path in (tmp_path / "sessions", sid):
        res = run_import("openhands", [path])
        (traj,) = res.trajectories
        assert traj.id == "4f2a9c" and traj.meta["title"] == "list files"
        assert [c.context for c in traj.calls] == [
            ["e0"], ["e0", "e1", "e2"], ["e0", "e5-summary"], ["e0", "e5-summary", "e6", "e7"]]
        (ev,) = traj.evictions
        assert (ev.kind, ev.before_call, ev.removed, ev.inserted) == (
            "summarize", "call-2", ["e1", "e2", "e3", "e4"], ["e5-summary"])
        assert _segments(tokenizer, traj) == 2
        # 9 events + 4 cached copies + metadata.json
        assert res.read == 14 and dict(res.skipped) == {"event_cache_copy": 4, "metadata": 1}
        assert res.notes["events_from_cache"] == 1 and res.rejects == []
        _counts_add_up(res)


def test_openhands_session_folder_bad_event_file(tmp_path):
    """A cut event file is one rejected record; the other events still make their calls."""
    events = _openhands_events(range_form=False)
    sid = tmp_path / "abc"
    (sid / "events").mkdir(parents=True)
    for e in events:
        (sid / "events" / f"{e['id']}.json").write_text(json.dumps(e))
    (sid / "events" / "7.json").write_text('{"id": 7, "source": "ag')
    res = run_import("openhands", [sid])
    (traj,) = res.trajectories
    assert len(traj.calls) == 4 and [r.reason for r in res.rejects] == ["bad_json"]
    _counts_add_up(res)


# --- codex ------------------------------------------------------------------------------------------

def test_codex_world_state_and_server_side_compaction(tmp_path, tokenizer):
    """A ``world_state`` record is skipped (counted); a ``compacted`` record with an empty message and
    a replacement_history ending in an encrypted ``compaction`` item leaves [environment, user
    message, opaque item] + the new user turn as the next context; the eviction removes the two
    responses and the tool output and inserts the opaque item (a harness artifact)."""
    rows = _codex_rollout(replacement=False)
    k = next(i for i, r in enumerate(rows) if r["type"] == "compacted")
    rows[k] = {"type": "compacted", "payload": {"message": "", "replacement_history": [
        rows[1]["payload"], rows[2]["payload"], {"type": "compaction", "encrypted_content": "gAAAAB" + "x" * 40}]}}
    rows.insert(k, {"type": "world_state", "payload": {"cwd": "/w", "git": {"branch": "main"}}})
    path = tmp_path / "rollout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_import("codex", [path])
    (traj,) = res.trajectories
    table = traj.message_table()
    c0, c1, c2 = traj.calls
    env, task = c0.context
    assert c1.context == [env, task, c0.response, c1.context[3]] and table[c1.context[3]].role == "tool"
    opaque = c2.context[2]
    assert c2.context[:2] == [env, task] and table[c2.context[3]].content == "continue"
    assert table[opaque].content == OPAQUE_COMPACTION and table[opaque].is_artifact
    assert table[opaque].meta == {"opaque": "compaction", "encrypted_chars": 46}
    (ev,) = traj.evictions
    assert (ev.before_call, ev.removed, ev.inserted) == (c2.id, [c0.response, c1.context[3], c1.response], [opaque])
    assert res.skipped["world_state"] == 1 and res.rejects == []
    assert _segments(tokenizer, traj) == 2
    _counts_add_up(res)


# --- openhands: parallel tool calls, a reused tool-call id, offsets that count silent events -------

def _openhands_parallel_and_reused() -> list[dict]:
    """One response R1 with two tool calls (toolu_51, toolu_52) executed one at a time (CodeActAgent
    pops its pending_actions: action, observation, action, observation); a later response R2 that
    reuses the id toolu_51; a condensation forgetting events 4-7 with its summary at offset 3 (an
    offset into the events of state.history, where the recall pair counts though it makes no message)."""
    def resp(rid, calls, prompt, completion):
        return {"id": rid, "model": "claude-x", "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
                "choices": [{"message": {"role": "assistant", "content": f"{rid} text", "tool_calls": [
                    {"id": c, "type": "function", "function": {"name": "execute_bash", "arguments": json.dumps({"command": c})}}
                    for c in calls]}}]}

    def act(eid, r, call):
        return {"id": eid, "source": "agent", "action": "run", "args": {"command": call},
                "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": call, "model_response": r}}

    def obs(eid, call, text):
        return {"id": eid, "source": "agent", "observation": "run", "content": text,
                "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": call}}

    r1, r2, r3 = (resp("R1", ["toolu_51", "toolu_52"], 2000, 100), resp("R2", ["toolu_51"], 2600, 50),
                  resp("R3", ["toolu_53"], 1500, 20))
    return [
        {"id": 0, "source": "agent", "action": "system", "args": {"content": "You are OpenHands agent.", "tools": []}},
        {"id": 1, "source": "user", "action": "message", "args": {"content": "fix the tests"}},
        {"id": 2, "source": "user", "action": "recall", "args": {"query": "fix the tests"}},
        {"id": 3, "source": "environment", "observation": "recall", "content": "", "extras": {}},
        act(4, r1, "toolu_51"), obs(5, "toolu_51", "a.py b.py"), act(6, r1, "toolu_52"), obs(7, "toolu_52", "1 failed"),
        act(8, r2, "toolu_51"), obs(9, "toolu_51", "edited"),
        {"id": 10, "source": "agent", "action": "condensation",
         "args": {"forgotten_events_start_id": 4, "forgotten_events_end_id": 7, "summary": "listed, ran tests",
                  "summary_offset": 3}},
        act(11, r3, "toolu_53"), obs(12, "toolu_53", "passed"),
        {"id": 13, "source": "agent", "action": "message", "args": {"content": "done"}},
    ]


@pytest.mark.parametrize("form", ["session_folder", "event_list"])
def test_openhands_parallel_calls_and_a_reused_id(tmp_path, tokenizer, form):
    """Contexts by hand, as ConversationMemory.process_events builds them (openhands/memory/
    conversation_memory.py [156d068] lines 106-154: a tool-calling response is held in
    pending_tool_call_action_messages until every tool call has a result, then emitted with its results
    in tool-call order) over View.from_events (openhands/memory/view.py: forgotten events and the
    condensation itself dropped, the summary inserted at summary_offset of the kept events):

    call-0 (R1) [e0 e1] · call-1 (R2) [e0 e1 e4 e5 e7] · call-2 (R3) [e0 e1 e10-summary e8 e9]
    (kept events 0 1 2 ⟨summary⟩ 3 8 9; the recall pair makes no message) · call-3 (text) [.. e11 e12].
    R1's second action (event 6) is the same model call. R2's toolu_51 is renamed toolu_51#2 and e9
    answers it. One summarize eviction before call-2 removing e4 e5 e7, inserting the summary; 2
    segments. Billed: 2600 ≥ 2000 + 100 - 64 → call-1 verified; call-2 a junction, call-3 no usage."""
    events = _openhands_parallel_and_reused()
    if form == "session_folder":
        path = tmp_path / "sessions" / "s1"
        (path / "events").mkdir(parents=True)
        for e in events:
            (path / "events" / f"{e['id']}.json").write_text(json.dumps(e))
    else:
        path = tmp_path / "s1.json"
        path.write_text(json.dumps(events))
    res = run_import("openhands", [path])
    (traj,) = res.trajectories
    assert [c.context for c in traj.calls] == [
        ["e0", "e1"], ["e0", "e1", "e4", "e5", "e7"], ["e0", "e1", "e10-summary", "e8", "e9"],
        ["e0", "e1", "e10-summary", "e8", "e9", "e11", "e12"]]
    assert [c.response for c in traj.calls] == ["e4", "e8", "e11", "e13"]
    table = traj.message_table()
    assert [tc.id for tc in table["e4"].tool_calls] == ["toolu_51", "toolu_52"]
    assert [tc.id for tc in table["e8"].tool_calls] == ["toolu_51#2"] and table["e9"].tool_call_id == "toolu_51#2"
    assert (table["e0"].role, table["e0"].content) == ("system", "You are OpenHands agent.")
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.removed, ev.inserted) == ("summarize", "call-2", ["e4", "e5", "e7"],
                                                                  ["e10-summary"])
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "unchecked", "unchecked"]
    assert res.notes["tool_call_ids_renamed"] == 1 and res.rejects == []
    assert res.read == 14 and dict(res.skipped) == {"action:recall": 1, "observation:recall": 1}
    assert _segments(tokenizer, traj) == 2
    _counts_add_up(res)


# --- opencode 1.3: a message with no parts, per-step billed tokens, compaction with a kept tail ------

def _oc_session(tail: bool) -> list[dict]:
    """ses_3 in MessageV2 shapes: u1; a1 with two steps (a tool call, then text), each step-finish
    carrying its tokens; a2, an assistant message with no parts at all (what crashed the importer);
    u2 → a3; the compaction request u3 (``tail_start_id`` u2 when ``tail``) → summary a4 → u4 → a5."""
    def part(mid, pid, **kw):
        return {"id": pid, "messageID": mid, "sessionID": "ses_3", **kw}

    def tokens(inp, out, read=0):
        return {"input": inp, "output": out, "reasoning": 0, "cache": {"read": read, "write": 0}}

    def asst(mid, parent, t, parts, **kw):
        return {"info": {"id": mid, "sessionID": "ses_3", "role": "assistant", "parentID": parent, "time": {"created": t},
                         "modelID": "m", "providerID": "p", "mode": "build", "finish": "stop", **kw}, "parts": parts}

    def usr(mid, t, parts):
        return {"info": {"id": mid, "sessionID": "ses_3", "role": "user", "time": {"created": t}}, "parts": parts}

    tool = part("msg_a1", "prt_03", type="tool", callID="call_1", tool="bash", state={
        "status": "completed", "input": {"command": "ls"}, "output": "a b", "title": "ls", "metadata": {},
        "time": {"start": 3, "end": 4}})
    compaction = {"type": "compaction", "auto": True, **({"tail_start_id": "msg_u2"} if tail else {})}
    return [
        usr("msg_u1", 1, [part("msg_u1", "prt_01", type="text", text="list files")]),
        asst("msg_a1", "msg_u1", 2, [part("msg_a1", "prt_02", type="step-start"), tool,
                                     part("msg_a1", "prt_04", type="step-finish", reason="tool-calls", cost=0,
                                          tokens=tokens(1000, 40, 9000)),
                                     part("msg_a1", "prt_05", type="step-start"),
                                     part("msg_a1", "prt_06", type="text", text="two files"),
                                     part("msg_a1", "prt_07", type="step-finish", reason="stop", cost=0,
                                          tokens=tokens(100, 10, 9990))], tokens=tokens(100, 10, 9990)),
        asst("msg_a2", "msg_u1", 5, []),
        usr("msg_u2", 10, [part("msg_u2", "prt_10", type="text", text="which ones?")]),
        asst("msg_a3", "msg_u2", 11, [part("msg_a3", "prt_11", type="text", text="a and b")],
             tokens=tokens(120, 8, 10050)),
        usr("msg_u3", 20, [part("msg_u3", "prt_20", **compaction)]),
        asst("msg_a4", "msg_u3", 21, [part("msg_a4", "prt_21", type="text", text="Summary: listed a and b.")],
             summary=True, tokens=tokens(10300, 30)),
        usr("msg_u4", 30, [part("msg_u4", "prt_30", type="text", text="count them")]),
        asst("msg_a5", "msg_u4", 31, [part("msg_a5", "prt_31", type="text", text="2")], tokens=tokens(400, 2)),
    ]


def test_opencode_13_message_without_parts(tmp_path):
    """OpenCode 1.3 database (rows still in the WAL) whose session holds an assistant message with no
    parts: toModelMessagesEffect skips it (``if (msg.parts.length === 0) continue``,
    packages/opencode/src/session/message-v2.ts [anomalyco/opencode 007a940]), so it is skipped
    (``message_without_parts``) - no crash, no call. Calls by hand:
    a1:0 [u1] · a1:1 [u1 a1:0 a1:0:call_1] · a3 [.. a1:1 u2] · summary a4 [.. a3 u3] · a5 [u3 a4 u4].
    Billed prompt = input + cache read + cache write per step-finish: 10,000 → 10,090 (≥ 10,000 + 40
    - 64) → 10,170 (≥ 10,090 + 10 - 64): a1:1 and a3 verified; the summary call (a harness call with
    its own prompt) and a5 (after the compaction) unchecked."""
    db = tmp_path / "opencode.db"
    con = sqlite3.connect(db)
    con.execute("pragma journal_mode=wal")
    con.execute("pragma wal_autocheckpoint=0")
    con.executescript(_V13_SCHEMA)
    con.execute("insert into session (id, project_id, slug, directory, title, version, time_created, time_updated) "
                "values ('ses_3', 'p', 's', '/w', 'three', '1.3.4', 1, 2)")
    for n, m in enumerate(_oc_session(tail=False)):
        data = {k: v for k, v in m["info"].items() if k not in ("id", "sessionID")}
        con.execute("insert into message values (?, 'ses_3', ?, ?, ?)", (m["info"]["id"], n, n, json.dumps(data)))
        for p in m["parts"]:
            pdata = {k: v for k, v in p.items() if k not in ("id", "messageID", "sessionID")}
            con.execute("insert into part values (?, ?, 'ses_3', ?, ?, ?)", (p["id"], m["info"]["id"], n, n, json.dumps(pdata)))
    con.commit()
    assert Path(f"{db}-wal").stat().st_size > 0
    res = run_import("opencode", [db])
    con.close()
    (traj,) = res.trajectories
    pre = ["msg_u1", "msg_a1:0", "msg_a1:0:call_1", "msg_a1:1", "msg_u2"]
    assert [c.context for c in traj.calls] == [
        ["msg_u1"], ["msg_u1", "msg_a1:0", "msg_a1:0:call_1"], pre, [*pre, "msg_a3", "msg_u3"],
        ["msg_u3", "msg_a4", "msg_u4"]]
    assert [c.purpose for c in traj.calls] == ["act", "act", "act", "summarize", "act"]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified", "unchecked", "unchecked"]
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.inserted) == ("summarize", "call-4", ["msg_u3", "msg_a4"])
    assert res.skipped["message_without_parts"] == 1 and res.rejects == []
    assert res.read == 9 and res.imported == 8
    _counts_add_up(res)


def test_opencode_compaction_keeps_its_tail(tmp_path, tokenizer):
    """A compaction part with ``tail_start_id`` keeps the messages from it up to the request after
    the summary: filterCompacted returns [compaction request, summary, ...retained tail..., later]
    (packages/opencode/src/session/message-v2.ts [anomalyco/opencode 007a940], the reorder after
    ``result.reverse()``). a5 sees [u3 a4 u2 a3 u4]; the eviction removes what the tail does not keep
    (u1 and a1's steps and result); 2 segments."""
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"info": {"id": "ses_3"}, "messages": _oc_session(tail=True)}))
    res = run_import("opencode", [path])
    (traj,) = res.trajectories
    assert traj.calls[-1].context == ["msg_u3", "msg_a4", "msg_u2", "msg_a3", "msg_u4"]
    (ev,) = traj.evictions
    assert ev.removed == ["msg_u1", "msg_a1:0", "msg_a1:0:call_1", "msg_a1:1"]
    assert ev.inserted == ["msg_u3", "msg_a4"]
    assert _segments(tokenizer, traj) == 2
    _counts_add_up(res)


# --- opencode 1.3: a user message names its model as an object (issue 34) ---------------------------

def _v13_user(mid, sid, t, text, model):
    """MessageV2.User as 1.3 writes it (packages/opencode/src/session/message-v2.ts): ``agent``,
    ``model: {providerID, modelID}``, optional ``tools`` and ``summary``."""
    return {"info": {"id": mid, "sessionID": sid, "role": "user", "time": {"created": t}, "agent": "build",
                     "model": model, "tools": {"bash": True}},
            "parts": [{"id": f"prt_{mid}", "messageID": mid, "sessionID": sid, "type": "text", "text": text}]}


def _v13_assistant(mid, sid, parent, t, text, inp, read):
    """MessageV2.Assistant: ``providerID`` / ``modelID`` as its own fields, ``path``, ``tokens``."""
    tokens = {"input": inp, "output": 12, "reasoning": 0, "cache": {"read": read, "write": 0}}
    return {"info": {"id": mid, "sessionID": sid, "role": "assistant", "parentID": parent, "time": {"created": t},
                     "providerID": "local-llama", "modelID": "Qwen_Qwen3.5-9B-Q8_0.gguf", "mode": "build",
                     "agent": "build", "path": {"cwd": "/w", "root": "/w"}, "cost": 0, "tokens": tokens,
                     "finish": "stop"},
            "parts": [{"id": f"prt_{mid}_t", "messageID": mid, "sessionID": sid, "type": "text", "text": text},
                      {"id": f"prt_{mid}_f", "messageID": mid, "sessionID": sid, "type": "step-finish",
                       "reason": "stop", "cost": 0, "tokens": tokens}]}


def test_opencode_13_user_model_object(tmp_path):
    """The reported 1.3.10 database imported nothing: every user message (``model`` an object) was
    rejected ``wrong_type`` and its assistant then had no history. Here ses_m: u1 → a1 → u2 → a2 with
    the issue's model object; ses_x: u1 whose ``model.providerID`` is a list → rejected
    "info.model.providerID is not text", its assistant kept as ``missing_parent``, the session
    ``no_calls``. ses_m calls by hand: a1 [u1], a2 [u1 a1 u2]; billed prompt input + cache read:
    a1 = 200 + 1,800 = 2,000, a2 = 40 + 2,000 = 2,040 >= 2,000 + 12 - 64 → verified. Read 6 = imported
    5 + rejected 1."""
    model = {"providerID": "local-llama", "modelID": "Qwen_Qwen3.5-9B-Q8_0.gguf"}
    good = [_v13_user("msg_u1", "ses_m", 1, "hi", model),
            _v13_assistant("msg_a1", "ses_m", "msg_u1", 2, "hello", 200, 1800),
            _v13_user("msg_u2", "ses_m", 3, "list files", model),
            _v13_assistant("msg_a2", "ses_m", "msg_u2", 4, "a b", 40, 2000)]
    bad = [_v13_user("msg_x1", "ses_x", 1, "hi", {"providerID": ["local-llama"], "modelID": "q"}),
           _v13_assistant("msg_x2", "ses_x", "msg_x1", 2, "hello", 10, 0)]
    db = tmp_path / "opencode.db"
    con = sqlite3.connect(db)
    con.executescript(_V13_SCHEMA)
    for sid, rows in (("ses_m", good), ("ses_x", bad)):
        con.execute("insert into session (id, project_id, slug, directory, title, version, time_created, "
                    "time_updated) values (?, 'p', 's', '/w', 't', '1.3.10', 1, 2)", (sid,))
        for n, m in enumerate(rows):
            data = {k: v for k, v in m["info"].items() if k not in ("id", "sessionID")}
            con.execute("insert into message values (?, ?, ?, ?, ?)", (m["info"]["id"], sid, n, n, json.dumps(data)))
            for p in m["parts"]:
                pdata = {k: v for k, v in p.items() if k not in ("id", "messageID", "sessionID")}
                con.execute("insert into part values (?, ?, ?, ?, ?, ?)", (p["id"], m["info"]["id"], sid, n, n,
                                                                         json.dumps(pdata)))
    con.commit()
    con.close()
    res = run_import("opencode", [db])
    (traj,) = res.trajectories
    assert [c.context for c in traj.calls] == [["msg_u1"], ["msg_u1", "msg_a1", "msg_u2"]]
    assert [c.meta["billed_tokens"]["prompt"] for c in traj.calls] == [2000, 2040]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified"]
    assert traj.calls[0].meta["billed_tokens"]["model"] == "local-llama/Qwen_Qwen3.5-9B-Q8_0.gguf"
    assert [(r.reason, r.line, r.message) for r in res.rejects] == [
        ("wrong_type", 0, "message #0: info.model.providerID is not text"),
        ("missing_parent", 1, "message msg_x2: an assistant message with no history"),
        ("no_calls", None, "trajectory 'ses_x' has no model call")]
    assert res.read == 6 and res.imported == 5 and res.rejected == 1
    _counts_add_up(res)


def test_opencode_new_turn_drops_the_steps_reasoning(tmp_path):
    """Issue 34's new-turn rule on OpenCode's step ``tokens.reasoning`` (a reasoning model behind a
    chat template that strips earlier turns' thinking, like the issue's Qwen3.5, or the Responses API):
    u1 → a1 (step 0: reasoning + a tool call, billed 100 + 1,900 cache read = 2,000, reasoning 280;
    step 1: reasoning + text, 2,030, reasoning 120; R = 0 for both, they reasoned) → u2 → a2 (1,790).
    a1:1: 2,030 >= 2,000 + 0 - 64. a2 starts a turn: the prompt of a1:1 held step 0's 280 reasoning
    tokens, so a2 needs >= 2,030 + 0 - 280 - 64 = 1,686 (the growth rule alone wanted 1,966): verified,
    no eviction."""
    def tok(inp, read, out, reasoning):
        return {"input": inp, "output": out, "reasoning": reasoning, "cache": {"read": read, "write": 0}}

    def part(mid, n, **kw):
        return {"id": f"prt_{mid}_{n}", "messageID": mid, "sessionID": "ses_r", **kw}

    model = {"providerID": "local-llama", "modelID": "Qwen_Qwen3.5-9B-Q8_0.gguf"}
    u1, u2 = (_v13_user(m, "ses_r", t, text, model) for m, t, text in (("msg_u1", 1, "fix"), ("msg_u2", 5, "thanks")))
    a1 = {"info": {**_v13_assistant("msg_a1", "ses_r", "msg_u1", 2, "", 0, 0)["info"], "tokens": tok(130, 1900, 150, 120)},
          "parts": [part("msg_a1", 0, type="step-start"), part("msg_a1", 1, type="reasoning", text="look", time={"start": 2}),
                    part("msg_a1", 2, type="tool", callID="call_1", tool="bash", state={
                        "status": "completed", "input": {"command": "ls"}, "output": "a", "title": "ls",
                        "metadata": {}, "time": {"start": 2, "end": 3}}),
                    part("msg_a1", 3, type="step-finish", reason="tool-calls", cost=0, tokens=tok(100, 1900, 300, 280)),
                    part("msg_a1", 4, type="step-start"), part("msg_a1", 5, type="reasoning", text="done", time={"start": 3}),
                    part("msg_a1", 6, type="text", text="fixed"),
                    part("msg_a1", 7, type="step-finish", reason="stop", cost=0, tokens=tok(130, 1900, 150, 120))]}
    a2 = _v13_assistant("msg_a2", "ses_r", "msg_u2", 6, "you're welcome", 90, 1700)
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"info": {"id": "ses_r"}, "messages": [u1, a1, u2, a2]}))
    res = run_import("opencode", [path])
    (traj,) = res.trajectories
    assert [c.meta["billed_tokens"]["prompt"] for c in traj.calls] == [2000, 2030, 1790]
    assert [c.meta["billed_tokens"]["reasoning"] for c in traj.calls] == [280, 120, 0]
    assert traj.calls[2].context == ["msg_u1", "msg_a1:0", "msg_a1:0:call_1", "msg_a1:1", "msg_u2"]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified"]
    assert traj.evictions == [] and all(c.selected for c in traj.calls) and res.rejects == []
    _counts_add_up(res)
