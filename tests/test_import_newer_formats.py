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
