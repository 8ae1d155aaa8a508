"""Importers on small hand-built inputs in each harness's documented shape (no fixture exists for
OpenCode, Qwen-Agent, proxy logs, or for Codex/OpenHands compaction), plus redaction and bad input."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from memorywalker.importers import IMPORTERS, ImportOptions, get_importer, run_import
from memorywalker.importers.opencode import CLEARED, COMPACTION_TEXT
from memorywalker.records import check_trajectory
from memorywalker.render import Renderer
from memorywalker.tree import ConditioningTree


def _segments(tokenizer, traj) -> int:
    return len(ConditioningTree.build([Renderer(tokenizer).render(traj)]).segments(0))


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- opencode ---------------------------------------------------------------------------------------

def _opencode_session() -> tuple[dict, list[dict]]:
    """Shapes of sst/opencode MessageV2: user/assistant infos, text/tool/step/compaction parts.

    Calls: a1 (tool call; output pruned at t=50), a2 (t=40, sees the output), a3 (t=60, sees the
    placeholder), the summary (after compaction request msg_06), a5.
    """
    def text(mid, pid, t):
        return {"id": pid, "messageID": mid, "sessionID": "ses_1", "type": "text", "text": t}

    def tool(mid, pid, call, out, compacted=None):
        t = {"start": 3, "end": 4, **({"compacted": compacted} if compacted else {})}
        return {"id": pid, "messageID": mid, "sessionID": "ses_1", "type": "tool", "callID": call, "tool": "bash",
                "state": {"status": "completed", "input": {"command": "ls"}, "output": out, "title": "ls",
                          "metadata": {}, "time": t}}

    def step(mid, pid, kind):
        return {"id": pid, "messageID": mid, "sessionID": "ses_1", "type": kind}

    def asst(mid, parent, created, **kw):
        return {"id": mid, "sessionID": "ses_1", "role": "assistant", "parentID": parent, "time": {"created": created},
                "modelID": "m", "providerID": "p", "mode": "build", "finish": "stop", **kw}

    msgs = [
        {"info": {"id": "msg_01", "sessionID": "ses_1", "role": "user", "time": {"created": 1}},
         "parts": [text("msg_01", "prt_01", "list files")]},
        {"info": asst("msg_02", "msg_01", 2),
         "parts": [step("msg_02", "prt_02", "step-start"), tool("msg_02", "prt_03", "call_1", "a\nb", compacted=50),
                   step("msg_02", "prt_04", "step-finish")]},
        {"info": asst("msg_03", "msg_01", 40),
         "parts": [step("msg_03", "prt_05", "step-start"), text("msg_03", "prt_06", "two files"),
                   step("msg_03", "prt_07", "step-finish")]},
        {"info": {"id": "msg_04", "sessionID": "ses_1", "role": "user", "time": {"created": 55}},
         "parts": [text("msg_04", "prt_12", "which ones?")]},
        {"info": asst("msg_05", "msg_04", 60), "parts": [text("msg_05", "prt_13", "a and b")]},
        {"info": {"id": "msg_06", "sessionID": "ses_1", "role": "user", "time": {"created": 70}},
         "parts": [{"id": "prt_08", "messageID": "msg_06", "sessionID": "ses_1", "type": "compaction", "auto": True}]},
        {"info": asst("msg_07", "msg_06", 71, summary=True),
         "parts": [text("msg_07", "prt_09", "Summary: listed files a and b.")]},
        {"info": {"id": "msg_08", "sessionID": "ses_1", "role": "user", "time": {"created": 80}},
         "parts": [text("msg_08", "prt_10", "now count them")]},
        {"info": asst("msg_09", "msg_08", 81), "parts": [text("msg_09", "prt_11", "2")]},
    ]
    return {"id": "ses_1", "title": "demo", "time": {"created": 1}}, msgs


def _opencode_forms(tmp: Path) -> dict[str, Path]:
    info, msgs = _opencode_session()
    export = tmp / "export.json"
    export.write_text(json.dumps({"info": info, "messages": msgs}))
    storage = tmp / "storage"
    (storage / "session" / "proj").mkdir(parents=True)
    (storage / "session" / "proj" / "ses_1.json").write_text(json.dumps(info))
    for m in msgs:
        d = storage / "message" / "ses_1"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{m['info']['id']}.json").write_text(json.dumps(m["info"]))
        pd = storage / "part" / m["info"]["id"]
        pd.mkdir(parents=True, exist_ok=True)
        for p in m["parts"]:
            (pd / f"{p['id']}.json").write_text(json.dumps(p))
    db = tmp / "opencode.db"
    con = sqlite3.connect(db)
    con.execute("create table session (id text primary key, data text)")
    con.execute("create table message (id text primary key, session_id text, time_created int, data text)")
    con.execute("create table part (id text primary key, message_id text, session_id text, data text)")
    con.execute("insert into session values (?, ?)", ("ses_1", json.dumps(info)))
    for m in msgs:
        con.execute("insert into message values (?, ?, ?, ?)", (m["info"]["id"], "ses_1", 0, json.dumps(m["info"])))
        for p in m["parts"]:
            con.execute("insert into part values (?, ?, ?, ?)", (p["id"], m["info"]["id"], "ses_1", json.dumps(p)))
    con.commit()
    con.close()
    return {"export": export, "storage": tmp, "sqlite": db}


@pytest.mark.parametrize("form", ["export", "storage", "sqlite"])
def test_opencode_forms(tmp_path, tokenizer, form):
    """5 assistant messages → 5 calls; evictions: the pruned output (placeholder: delivered to the
    call at t=40, cleared for the call at t=60) and the compaction (summarize, before the call after
    the summary): K=2 → 3 segments."""
    path = _opencode_forms(tmp_path)[form]
    result = run_import("opencode", [path])
    assert result.rejects == []
    (traj,) = result.trajectories
    table = traj.message_table()
    assert len(traj.calls) == 5
    assert [(e.kind, e.before_call) for e in traj.evictions] == [("placeholder", "call-2"), ("summarize", "call-4")]
    assert table[traj.evictions[0].inserted[0]].content == CLEARED
    last = traj.calls[-1]
    assert [table[m].content for m in last.context[:2]] == [COMPACTION_TEXT, "Summary: listed files a and b."]
    assert all(table[m].is_artifact for m in last.context[:2])
    assert _segments(tokenizer, traj) == 3


# --- codex ------------------------------------------------------------------------------------------

def _codex_rollout(replacement: bool) -> list[dict]:
    def item(payload):
        return {"timestamp": "2025-01-01T00:00:00Z", "type": "response_item", "payload": payload}

    def msg(role, text):
        kind = "output_text" if role == "assistant" else "input_text"
        return item({"type": "message", "role": role, "content": [{"type": kind, "text": text}]})

    rows = [
        {"type": "session_meta", "payload": {"id": "sess-1", "cli_version": "0.77.0", "instructions": ""}},
        msg("user", "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"),
        msg("user", "fix the bug"),
        {"type": "turn_context", "payload": {"model": "gpt-5"}},
        item({"type": "reasoning", "summary": [{"type": "summary_text", "text": "look first"}], "content": None}),
        item({"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}", "call_id": "c1"}),
        item({"type": "function_call_output", "call_id": "c1", "output": "main.py"}),
        msg("assistant", "Found main.py"),
        {"type": "event_msg", "payload": {"type": "token_count"}},
    ]
    summary = "User asked to fix a bug; main.py exists."
    compacted = {"message": summary}
    if replacement:
        compacted["replacement_history"] = [rows[1]["payload"], rows[2]["payload"],
                                            {"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": "SUMMARY: " + summary}]}]
    rows += [{"type": "compacted", "payload": compacted}, msg("user", "continue"), msg("assistant", "Done.")]
    return rows


@pytest.mark.parametrize("replacement", [True, False])
def test_codex_compaction(tmp_path, tokenizer, replacement):
    """2 model-output runs before the compaction, the compaction's summary call (its answer taken from
    ``compacted.message``: this rollout holds no answer item), 1 run after → 4 calls, 1 summarize
    eviction before the last, 2 segments; the summary call's context is the history and Codex's
    compaction prompt; the post-compaction context keeps the initial context and user message, then the
    summary."""
    path = _write_jsonl(tmp_path / "rollout.jsonl", _codex_rollout(replacement))
    result = run_import("codex", [path])
    assert result.rejects == []
    (traj,) = result.trajectories
    table = traj.message_table()
    assert [c.purpose for c in traj.calls] == ["act", "act", "summarize", "act"]
    assert [(e.kind, e.before_call) for e in traj.evictions] == [("summarize", "call-3")]
    summary = traj.calls[2]
    assert summary.context[:-1] == [*traj.calls[1].context, traj.calls[1].response]
    assert table[summary.context[-1]].content.startswith("You are performing a CONTEXT CHECKPOINT COMPACTION")
    assert table[summary.response].content == "User asked to fix a bug; main.py exists."
    assert summary.meta["response_from"] == "compacted.message" and summary.tools == []
    ctx = [table[m] for m in traj.calls[3].context]
    assert [m.content for m in ctx[:2]] == [table[traj.calls[0].context[0]].content, "fix the bug"]
    assert ctx[2].is_artifact and "main.py exists" in ctx[2].content
    assert traj.evictions[0].inserted == [ctx[2].id]
    assert table[traj.calls[0].response].reasoning == "look first"
    assert _segments(tokenizer, traj) == 2


# --- openhands condensation -------------------------------------------------------------------------

def _openhands_events(range_form: bool) -> list[dict]:
    def act(eid, call, name, text):
        resp = {"id": f"resp-{eid}", "choices": [{"message": {"role": "assistant", "content": text, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": name, "arguments": "{\"command\": \"ls\"}"}}]}}]}
        return {"id": eid, "source": "agent", "action": "run", "message": text, "args": {"command": "ls"},
                "tool_call_metadata": {"function_name": name, "tool_call_id": call, "model_response": resp}}

    def obs(eid, cause, call, content):
        return {"id": eid, "source": "agent", "observation": "run", "cause": cause, "content": content,
                "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": call}}

    cond = {"summary": "Earlier: listed files twice.", "summary_offset": 1}
    cond.update({"forgotten_events_start_id": 1, "forgotten_events_end_id": 4} if range_form
                else {"forgotten_event_ids": [1, 2, 3, 4]})
    return [
        {"id": 0, "source": "user", "action": "message", "args": {"content": "list files"}, "message": "list files"},
        act(1, "t1", "execute_bash", "first"), obs(2, 1, "t1", "a b"),
        act(3, "t2", "execute_bash", "second"), obs(4, 3, "t2", "a b"),
        {"id": 5, "source": "agent", "action": "condensation", "args": cond},
        act(6, "t3", "execute_bash", "third"), obs(7, 6, "t3", "a b"),
        {"id": 8, "source": "agent", "action": "message", "args": {"content": "done"}, "message": "done"},
    ]


@pytest.mark.parametrize("range_form", [False, True])
def test_openhands_condensation(tmp_path, tokenizer, range_form):
    """4 responses; the condensation forgets events 1-4 and puts the summary at offset 1 (after the
    user message): 1 summarize eviction before the third response, 2 segments."""
    path = tmp_path / "events.json"
    path.write_text(json.dumps(_openhands_events(range_form)))
    result = run_import("openhands", [path])
    assert result.rejects == []
    (traj,) = result.trajectories
    table = traj.message_table()
    assert len(traj.calls) == 4
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.removed) == ("summarize", "call-2", ["e1", "e2", "e3", "e4"])
    assert [table[m].content for m in traj.calls[2].context] == ["list files", "Earlier: listed files twice."]
    assert _segments(tokenizer, traj) == 2


# --- qwen-agent -------------------------------------------------------------------------------------

def test_qwen_agent_truncation_replay(tmp_path, tokenizer):
    """Default count = utf-8 bytes // 4: system 17 B → 4, user 400 B → 100, function 8 B → 2, the
    assistant texts 0. A finished turn costs 100 + 0 + 2 + 0 = 102. Budget 250, newest turn first:
    calls 0-1 see turn a; call 2: 4 + 100 (b) + 102 (a) = 206 ≤ 250 → a, b; call 3: 4 + 102 + 102 =
    208 → a, b; call 4: 4 + 100 (c) + 102 (b) = 206, + 102 (a) = 308 > 250 → b, c; call 5: 208 → b, c.
    One truncate eviction (before call 4), 2 segments. Without a budget: no eviction."""
    u = ["a" * 400, "b" * 400, "c" * 400]
    msgs = [{"role": "system", "content": "sys msg here ok a"}]
    for i, text in enumerate(u):
        msgs += [{"role": "user", "content": text},
                 {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}},
                 {"role": "function", "name": "f", "content": "r" * 8},
                 {"role": "assistant", "content": f"ok{i}"}]
    path = tmp_path / "q.json"
    path.write_text(json.dumps(msgs))
    full = run_import("qwen-agent", [path]).trajectories[0]
    assert len(full.calls) == 6 and full.evictions == []
    result = run_import("qwen-agent", [path], ImportOptions(max_input_tokens=250))
    (traj,) = result.trajectories
    table = traj.message_table()
    kept = [[table[m].content[:1] for m in c.context if table[m].role == "user"] for c in traj.calls]
    assert kept == [["a"], ["a"], ["a", "b"], ["a", "b"], ["b", "c"], ["b", "c"]]
    assert traj.evictions[0].before_call == "call-4"
    assert [e.kind for e in traj.evictions] == ["truncate"]
    assert _segments(tokenizer, traj) == 2


# --- openai-chat proxy logs -------------------------------------------------------------------------

def test_openai_chat_black_box(tmp_path, tokenizer):
    """Three request/response pairs; the third request drops the first exchange (client-side
    trimming): the tree is built from requests alone → 1 inferred eviction, 2 segments."""
    sys_, u1 = {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}
    a1 = {"role": "assistant", "content": "hello"}
    u2, a2 = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}
    u3 = {"role": "user", "content": "3+3?"}
    rows = [{"request": {"model": "m", "messages": req}, "response": {"choices": [{"message": resp, "finish_reason": "stop"}]}}
            for req, resp in [([sys_, u1], a1), ([sys_, u1, a1, u2], a2), ([sys_, u2, a2, u3], {"role": "assistant", "content": "6"})]]
    result = run_import("openai-chat", [_write_jsonl(tmp_path / "log.jsonl", rows)])
    (traj,) = result.trajectories
    assert len(traj.calls) == 3 and traj.calls[1].context[:2] == traj.calls[0].context
    assert [e.meta["inferred"] for e in traj.evictions] == [True]
    assert _segments(tokenizer, traj) == 2


# --- redaction --------------------------------------------------------------------------------------

SECRETS = ["sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx", "ghp_0123456789abcdefghijABCDEFGHIJ", "AKIAIOSFODNN7EXAMPLE",
           "alice.smith@example.org", "/home/alice", "/Users/bob", "hunter2hunter2"]


def test_redaction_removes_planted_secrets(tmp_path):
    """Every planted secret is gone from the whole output; the same secret → the same placeholder
    in every call (checked on the two contexts that contain the first request)."""
    text = (f"key {SECRETS[0]} token {SECRETS[1]} aws {SECRETS[2]} mail {SECRETS[3]} "
            f"cd {SECRETS[4]}/proj && ls {SECRETS[5]}/x; password={SECRETS[6]}")
    u1 = {"role": "user", "content": text}
    a1 = {"role": "assistant", "content": f"noted {SECRETS[3]}",
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "sh", "arguments": json.dumps({"cmd": f"cat {SECRETS[4]}/.env"})}}]}
    t1 = {"role": "tool", "tool_call_id": "c1", "content": f"OPENAI_API_KEY={SECRETS[0]}"}
    rows = [{"request": {"messages": [u1]}, "response": {"choices": [{"message": a1}]}},
            {"request": {"messages": [u1, a1, t1]}, "response": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}}]
    result = run_import("openai-chat", [_write_jsonl(tmp_path / "log.jsonl", rows)], ImportOptions(redact=True))
    out = json.dumps([t.to_json_dict() for t in result.trajectories])
    for s in SECRETS:
        assert s not in out
    (traj,) = result.trajectories
    table = traj.message_table()
    first = table[traj.calls[0].context[0]].content
    assert table[traj.calls[1].context[0]].content == first
    assert first.count("<API_KEY_1>") == 1 and "<EMAIL_1>" in first and "<HOME_1>/proj" in first
    assert table[traj.calls[1].context[-1]].content == "OPENAI_API_KEY=<API_KEY_1>"
    assert table[traj.calls[0].response].tool_calls[0].arguments == {"cmd": "cat <HOME_1>/.env"}


# --- bad input --------------------------------------------------------------------------------------

def _cc_record(uuid, parent, kind, content, mid=None):
    r = {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s1", "timestamp": f"2025-01-01T00:00:0{uuid[-1]}Z",
         "message": {"role": kind, "content": content}}
    if mid:
        r["message"]["id"] = mid
    return r


def test_bad_input_claude_code(tmp_path):
    """Good records u1→a1→u2→a2 kept (2 calls); a record type 'weird' → unknown_record_type; a
    record whose parentUuid is absent → missing_parent and its call unselected; a cut last line →
    truncated_line. read = imported + skipped + rejected."""
    rows = [_cc_record("u1", None, "user", "hi"), _cc_record("a1", "u1", "assistant", [{"type": "text", "text": "yo"}], "m1"),
            {"type": "weird", "uuid": "w1"}, _cc_record("u2", "a1", "user", "more"),
            _cc_record("a2", "u2", "assistant", [{"type": "text", "text": "ok"}], "m2"),
            _cc_record("u3", "gone", "user", "lost"), _cc_record("a3", "u3", "assistant", [{"type": "text", "text": "?"}], "m3")]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"type": "user", "uuid": "u4", "mess')
    result = run_import("claude-code", [path])
    assert sorted(r.reason for r in result.rejects) == ["missing_parent", "truncated_line", "unknown_record_type"]
    assert result.read == len(rows) + 1 == result.imported + sum(result.skipped.values()) + result.rejected
    (traj,) = result.trajectories
    assert len(traj.calls) == 3 and [c.selected for c in traj.calls] == [True, True, False]
    assert "context_gap" in traj.calls[2].reason


def _pi_lines() -> str:
    rows = [{"type": "session", "version": 3, "id": "p1", "timestamp": "t", "cwd": "/"},
            {"type": "message", "id": "e1", "parentId": None, "message": {"role": "user", "content": "hi"}},
            {"type": "message", "id": "e2", "parentId": "e1", "message": {"role": "assistant", "stopReason": "stop",
                                                                          "content": [{"type": "text", "text": "yo"}]}},
            {"type": "hologram", "id": "e3", "parentId": "e2"}]
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("fmt", sorted(IMPORTERS))
def test_bad_input_every_format(tmp_path, fmt):
    """Each format: a truncated file / unknown record / missing parent yields a clear reason, never a crash."""
    cases = {
        "codex": ("r.jsonl", "".join(json.dumps(r) + "\n" for r in _codex_rollout(True)) +
                  json.dumps({"type": "mystery", "payload": {}}) + "\n" + '{"type": "resp'),
        "openai-chat": ("l.jsonl", json.dumps({"request": {"messages": [{"role": "user", "content": "x"}]},
                                               "response": {"choices": [{"message": {"role": "assistant", "content": "y"}}]}})
                        + "\n" + json.dumps({"request": {}}) + "\n" + '{"request": {"mess'),
        "openhands": ("e.json", json.dumps([*_openhands_events(False), {"id": 9, "source": "agent"}])),
        "qwen-agent": ("q.jsonl", json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})
                       + "\n" + json.dumps({"messages": [{"role": "alien"}]}) + "\n" + '[{"role": "us'),
        "swe-agent": ("t.traj", json.dumps({"trajectory": [{"messages": [{"role": "system", "content": "s"},
                                                                         {"role": "user", "content": "u"},
                                                                         {"role": "assistant", "content": "a"}]},
                                                           {"response": "no messages"}]})),
        "opencode": ("x.json", json.dumps({"info": {"id": "s"}, "messages": [*_opencode_session()[1], {"info": {"role": "robot"}, "parts": []}]})),
        "claude-code": ("c.jsonl", json.dumps(_cc_record("u1", None, "user", "hi")) + "\n" +
                        json.dumps(_cc_record("a1", "u1", "assistant", [{"type": "text", "text": "yo"}], "m1")) + "\n{\"type"),
        "pi": ("p.jsonl", _pi_lines() + '{"type": "mess'),
        "hf-traces": ("d.jsonl", _pi_lines() + '{"type": "mess'),
        "cline": ("api_conversation_history.json", json.dumps([
            {"role": "user", "content": "fix"}, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "robot", "content": "?"}])),
        "roo-code": ("api_conversation_history.json", json.dumps([
            {"role": "user", "content": "fix", "ts": 1}, {"role": "assistant", "content": "ok", "ts": 2}, 7])),
        "mini-swe-agent": ("t.traj.json", json.dumps({"trajectory_format": "mini-swe-agent-1.1", "info": {}, "messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
            {"role": "hologram", "content": "?"}, {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}]})),
        "gemini-cli": ("session-1.json", json.dumps({"sessionId": "g", "projectHash": "h", "messages": [
            {"id": "u1", "type": "user", "content": "hi"}, {"id": "g1", "type": "gemini", "content": "yo"},
            {"id": "z1", "type": "hologram", "content": "?"}]})),
    }
    name, text = cases[fmt]
    path = tmp_path / name
    path.write_text(text)
    result = get_importer(fmt)([path], ImportOptions())
    assert result.rejects, fmt
    assert all(r.reason and r.message for r in result.rejects)
    assert result.trajectories and all(check_trajectory(t) is None for t in result.trajectories)
    assert result.read == result.imported + sum(result.skipped.values()) + result.rejected
    truncated = (tmp_path / f"cut-{name}")
    truncated.write_text(text[: len(text) // 2])
    cut = get_importer(fmt)([truncated], ImportOptions())  # a file cut in half never crashes
    assert cut.rejects or cut.trajectories


def test_unknown_format_lists_valid_names():
    with pytest.raises(ValueError, match="valid formats: claude-code, cline, codex"):
        get_importer("nope")


def test_cli_import_writes_output_and_rejects(tmp_path, harness_logs):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["import", "openhands", str(harness_logs / "openhands"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "calls" in res.output and (tmp_path / "out.rejects.jsonl").exists()
    assert len(out.read_text().splitlines()) == 2
