"""Gemini CLI session recordings and saved chats, built by hand in the shapes of google-gemini/gemini-cli
[5411f11] packages/core/src/services/chatRecordingTypes.ts (MessageRecord, TokensSummary, the JSONL
records), chatRecordingService.ts (loadConversationRecord: $rewindTo, repeated ids) and
packages/cli/src/ui/hooks/useGeminiStream.ts (the "Context compressed from X% to Y%." info message)."""

from __future__ import annotations

import json

from memorywalker.importers import run_import
from memorywalker.importers.gemini_cli import ACK, OPAQUE_SUMMARY


def _counts_add_up(res) -> None:
    assert res.read == res.imported + sum(res.skipped.values()) + res.rejected


def _msg(mid, kind, content, **kw):
    return {"id": mid, "timestamp": "2026-08-01T10:00:00.000Z", "type": kind, "content": content, **kw}


def _gem(mid, text, prompt, out=20, calls=()):
    return _msg(mid, "gemini", text, model="gemini-2.5-pro", thoughts=[],
                toolCalls=[{"id": c, "name": "run_shell_command", "args": {"command": "ls"}, "status": "success",
                            "timestamp": "t"} for c in calls],
                tokens={"input": prompt, "output": out, "cached": 0, "thoughts": 0, "tool": 0, "total": prompt + out})


def _fr(mid, call, out):
    return _msg(mid, "user", [{"functionResponse": {"id": call, "name": "run_shell_command", "response": {"output": out}}}])


def test_gemini_recording_compression_and_rewind(tmp_path):
    """g1 [u1] · g2 [u1 g1 r1] · (a rewind to u3b's point: u3 and g3 leave the history) · g3b
    [u1 g1 r1 g2 u3b] · compression (info) · g4 [summary stand-in, ack, u4]: a summarize eviction,
    g4 unselected - its kept history is not recorded. A repeated record id (g2 written twice) keeps the
    later record. Billed: 1100 ≥ 1000 + 20 - 64 (g2), 1250 ≥ 1100 + 20 - 64 (g3b, prefix parent g2)."""
    rows = [{"sessionId": "gs1", "projectHash": "h", "startTime": "t", "lastUpdated": "t", "kind": "main"},
            _msg("u1", "user", [{"text": "list files"}]),
            _gem("g1", "", 1000, calls=["c1"]), _fr("r1", "c1", "a.py"),
            _gem("g2", "one file (draft)", 1100), _gem("g2", "one file", 1100),
            _msg("u3", "user", "delete it"), _gem("g3", "deleted", 1200),
            {"$rewindTo": "u3"},
            _msg("u3b", "user", "rename it instead"), _gem("g3b", "renamed", 1250),
            _msg("i1", "info", "Context compressed from 71% to 18%."),
            _msg("u4", "user", "and now?"), _gem("g4", "done", 300),
            {"$set": {"summary": "file chores"}}]
    path = tmp_path / "chats" / "session-2026-08-01T10-00-gs1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_import("gemini-cli", [tmp_path])
    (traj,) = res.trajectories
    assert [c.response for c in traj.calls] == ["g1", "g2", "g3", "g3b", "g4"]
    assert [c.context for c in traj.calls] == [
        ["u1"], ["u1", "g1", "r1"], ["u1", "g1", "r1", "g2", "u3"], ["u1", "g1", "r1", "g2", "u3b"],
        ["i1:summary", "i1:ack", "u4"]]
    table = traj.message_table()
    assert table["g2"].content == "one file" and table["r1"].tool_call_id == "c1"
    assert (table["i1:summary"].content, table["i1:ack"].content) == (OPAQUE_SUMMARY, ACK)
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.inserted) == ("summarize", "call-4", ["i1:summary", "i1:ack"])
    assert [c.selected for c in traj.calls] == [True, True, True, True, False]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified", "verified", "unchecked"]
    assert res.skipped["replaced_record"] == 1 and res.notes["rewinds"] == 1 and res.rejects == []
    _counts_add_up(res)


def test_gemini_saved_chat(tmp_path):
    """/chat save: {"history": Content[]}: each model content is a call on the contents before it;
    function calls and their functionResponse parts pair by name when the call has no id."""
    history = [{"role": "user", "parts": [{"text": "list files"}]},
               {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]},
               {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a.py"}}}]},
               {"role": "model", "parts": [{"text": "one file"}]}]
    path = tmp_path / "checkpoint-mytag.json"
    path.write_text(json.dumps({"history": history, "authType": "oauth-personal"}))
    res = run_import("gemini-cli", [path])
    (traj,) = res.trajectories
    assert [c.context for c in traj.calls] == [["c0"], ["c0", "c1", "c2#0"]]
    assert traj.message_table()["c2#0"].tool_call_id == "c1:call0"
    _counts_add_up(res)
