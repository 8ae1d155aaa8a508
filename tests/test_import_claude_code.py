"""Claude Code sessions of the newer shapes (2.1.x), built by hand record by record as Claude Code
writes them: partial compaction (``compactMetadata.preservedMessages`` / ``preservedSegment``),
``microcompact_boundary``, ``type: "attachment"`` records, metadata record types, and a rewind.
No public fixture holds these shapes (see ../shared/fixtures/harness-logs/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memorywalker.importers import run_import
from memorywalker.importers.claude_code import CLEARED
from memorywalker.importers.claude_code.attachments import reminder
from memorywalker.records import check_trajectory
from memorywalker.render import Renderer
from memorywalker.tree import ConditioningTree

_T = iter(range(10_000))


def _ts() -> str:
    n = next(_T)
    return f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}.000Z"


def _base(uuid, parent, kind, **kw) -> dict:
    return {"parentUuid": parent, "isSidechain": False, "type": kind, "uuid": uuid, "timestamp": _ts(),
            "sessionId": "s1", "version": "2.1.165", **kw}


def user(uuid, parent, text, **kw) -> dict:
    return _base(uuid, parent, "user", message={"role": "user", "content": text}, **kw)


def result(uuid, parent, tool_use_id, text) -> dict:
    return _base(uuid, parent, "user", message={"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}]})


def asst(uuid, parent, msg_id, text=None, tool=None) -> dict:
    blocks = ([{"type": "text", "text": text}] if text else []) + (
        [{"type": "tool_use", "id": tool, "name": "Bash", "input": {"command": "ls"}}] if tool else [])
    return _base(uuid, parent, "assistant", requestId=f"req_{msg_id}", message={
        "id": msg_id, "type": "message", "role": "assistant", "model": "claude-x", "content": blocks,
        "stop_reason": "tool_use" if tool else "end_turn"})


def attachment(uuid, parent, att) -> dict:
    return _base(uuid, parent, "attachment", attachment=att)


def boundary(uuid, logical, **meta) -> dict:
    return _base(uuid, None, "system", subtype="compact_boundary", content="Conversation compacted",
                 logicalParentUuid=logical, level="info", compactMetadata={"trigger": "manual", "preTokens": 5000, **meta})


def _write(tmp: Path, rows: list[dict]) -> Path:
    path = tmp / "s1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _contexts(traj) -> list[list[str]]:
    return [c.context for c in traj.calls]


def _segments(tokenizer, traj) -> int:
    return len(ConditioningTree.build([Renderer(tokenizer).render(traj)]).segments(0))


def _counts_add_up(res) -> None:
    assert res.read == res.imported + sum(res.skipped.values()) + res.rejected


def _mixed_session() -> list[dict]:
    """A rewind, a micro-compaction and a partial compaction in one session.

    u1 → a1(t1) → r1 → a2(t2) → r2 → a3 → u2 → a4              (then the user rewinds to a3)
                                       a3 → u2b → at1 (nested_memory) → a5(t3) → r3 → at2 (hook_success,
    PostToolUse: not sent) → mc1 (microcompact_boundary clearing t1) → a6
    cb1 (compact_boundary, preservedMessages anchor s1: u2b at1 a5 r3 a6) → s1 (summary) →
    at3 (compact_file_reference, written with the compaction; parent s1) → u3 → at4 (plan_mode: unknown) → a7
    """
    return [
        user("u1", None, "fix the bug"),
        asst("a1", "u1", "m1", tool="t1"), result("r1", "a1", "t1", "contents of a.py"),
        asst("a2", "r1", "m2", "found it", tool="t2"), result("r2", "a2", "t2", "1 failed"),
        asst("a3", "r2", "m3", "fixed."),
        user("u2", "a3", "also add a test"), asst("a4", "u2", "m4", "ok"),
        {"type": "ai-title", "aiTitle": "Fix the bug", "sessionId": "s1"},
        user("u2b", "a3", "instead, add docs"),
        attachment("at1", "u2b", {"type": "nested_memory", "path": "/p/docs/CLAUDE.md",
                                  "content": {"path": "/p/docs/CLAUDE.md", "content": "docs use rst"}}),
        asst("a5", "at1", "m5", tool="t3"), result("r3", "a5", "t3", "docs built"),
        attachment("at2", "r3", {"type": "hook_success", "hookEvent": "PostToolUse", "hookName": "fmt",
                                 "content": "", "exitCode": 0}),
        _base("mc1", "at2", "system", subtype="microcompact_boundary", content="Context microcompacted",
              microcompactMetadata={"trigger": "auto", "preTokens": 4000, "tokensSaved": 900,
                                    "compactedToolIds": ["t1"], "clearedAttachmentUUIDs": []}),
        asst("a6", "mc1", "m6", "docs done"),
        boundary("cb1", "a6", preservedMessages={"anchorUuid": "s1", "uuids": ["u2b", "at1", "a5", "r3", "a6"]}),
        user("s1", "cb1", "This session is being continued. Summary: fixed the bug, wrote docs.",
             isCompactSummary=True, isVisibleInTranscriptOnly=True),
        attachment("at3", "s1", {"type": "compact_file_reference", "filename": "/p/a.py", "displayPath": "a.py"}),
        {"type": "last-prompt", "lastPrompt": "now lint", "sessionId": "s1"},
        user("u3", "at3", "now lint"),
        attachment("at4", "u3", {"type": "plan_mode", "reminderType": "full", "planFilePath": "/p/plan.md"}),
        asst("a7", "at4", "m7", "linted"),
    ]


def test_rewind_microcompact_partial_compaction(tmp_path, tokenizer):
    """Every call's context by hand (message ids = record uuids; a cleared result is ``<id>:cleared``):

    a1 [u1] · a2 [u1 a1 r1] · a3 [.. a2 r2] · a4 [.. a3 u2] · a5 (rewind) [.. a3 u2b at1] ·
    a6 (after mc1) [u1 a1 r1:cleared a2 r2 a3 u2b at1 a5 r3] · a7 (after cb1) [s1 u2b at1 a5 r3 a6 at3 u3]:
    the preserved messages stay, in order, after the summary; the compaction's own attachment follows them.
    Evictions: prune before a6 (r1 → placeholder), summarize before a7 (removed = the pre-compaction
    chain minus the preserved messages, as delivered: r1 already cleared; inserted = s1 and at3).
    Segments: a4→a5 (rewind), a5→a6 (micro), a6→a7 (compaction) each start one: 4.
    """
    res = run_import("claude-code", [_write(tmp_path, _mixed_session())])
    (traj,) = res.trajectories
    assert check_trajectory(traj) is None
    pre = ["u1", "a1", "r1", "a2", "r2", "a3"]
    assert _contexts(traj) == [
        ["u1"], ["u1", "a1", "r1"], ["u1", "a1", "r1", "a2", "r2"], [*pre, "u2"], [*pre, "u2b", "at1"],
        ["u1", "a1", "r1:cleared", "a2", "r2", "a3", "u2b", "at1", "a5", "r3"],
        ["s1", "u2b", "at1", "a5", "r3", "a6", "at3", "u3"]]
    assert [c.response for c in traj.calls] == ["a1", "a2", "a3", "a4", "a5", "a6", "a7"]
    prune, summ = traj.evictions
    assert (prune.kind, prune.before_call, prune.removed, prune.inserted) == ("prune", "call-5", ["r1"], ["r1:cleared"])
    assert (prune.trigger, prune.tokens_before) == ("auto", 4000)
    assert (summ.kind, summ.before_call) == ("summarize", "call-6")
    assert summ.removed == ["u1", "a1", "r1:cleared", "a2", "r2", "a3"]
    assert summ.inserted == ["s1", "at3"] and summ.tokens_before == 5000
    table = traj.message_table()
    assert table["r1:cleared"].content == CLEARED and table["r1:cleared"].tool_call_id == "t1"
    assert table["at1"].content == reminder("Contents of /p/docs/CLAUDE.md:\n\ndocs use rst")
    assert table["at3"].content == reminder(
        "Note: /p/a.py was read before the last conversation was summarized, but the contents are too large to "
        "include. Use Read tool if you need to access it.")
    assert table["at3"].is_artifact and not table["at1"].is_artifact and table["s1"].is_artifact
    assert _segments(tokenizer, traj) == 4
    # 23 records: 19 imported, ai-title + last-prompt + hook_success skipped, plan_mode rejected.
    assert res.read == 23 and res.imported == 19
    assert dict(res.skipped) == {"ai-title": 1, "last-prompt": 1, "attachment:hook_success": 1}
    assert [r.reason for r in res.rejects] == ["unknown_record_type"] and "plan_mode" in res.rejects[0].message
    _counts_add_up(res)


def _segment_session(shape: str) -> list[dict]:
    """Pre-compaction u1 → a1(t1) → r1 → a2 → u2 → a3(t2) → r2; a compaction keeping u2 a3 r2
    (``preservedSegment`` head u2, tail r2, anchor = the summary s); then u3 → a4.

    ``relinked``: the preserved records stay where they were (original parents), Claude Code relinks
    them on load. ``rewritten``: they are written again after the summary (same uuids, u2 → s).
    ``moved``: they exist only after the summary, u2 carrying ``logicalParentUuid`` a2.
    """
    head = [user("u1", None, "go"), asst("a1", "u1", "m1", tool="t1"), result("r1", "a1", "t1", "out1"),
            asst("a2", "r1", "m2", "step one done")]
    kept = [user("u2", "a2", "next step"), asst("a3", "u2", "m3", tool="t2"), result("r2", "a3", "t2", "out2")]
    cb = boundary("cb", "r2", preservedSegment={"headUuid": "u2", "anchorUuid": "s", "tailUuid": "r2"})
    s = user("s", "cb", "Summary: step one done.", isCompactSummary=True)
    tail = [user("u3", "r2", "and the last step"), asst("a4", "u3", "m4", "all done")]
    relinked_u2 = {**kept[0], "parentUuid": "s"}
    if shape == "relinked":
        return [*head, *kept, cb, s, *tail]
    if shape == "rewritten":
        return [*head, *kept, cb, s, relinked_u2, *kept[1:], *tail]
    return [*head, cb, s, {**relinked_u2, "logicalParentUuid": "a2"}, *kept[1:], *tail]


@pytest.mark.parametrize("shape", ["relinked", "rewritten", "moved"])
def test_partial_compaction_shapes(tmp_path, tokenizer, shape):
    """Whatever the file shape: a3 (its response lies in the preserved segment) keeps the context it
    was sampled in, [u1 a1 r1 a2 u2]; a4 sees [s u2 a3 r2 u3]; one summarize eviction removing
    exactly u1 a1 r1 a2 and inserting s; 2 segments."""
    res = run_import("claude-code", [_write(tmp_path, _segment_session(shape))])
    (traj,) = res.trajectories
    assert _contexts(traj) == [["u1"], ["u1", "a1", "r1"], ["u1", "a1", "r1", "a2", "u2"],
                               ["s", "u2", "a3", "r2", "u3"]]
    assert [c.response for c in traj.calls] == ["a1", "a2", "a3", "a4"]
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.removed, ev.inserted) == ("summarize", "call-3", ["u1", "a1", "r1", "a2"], ["s"])
    assert _segments(tokenizer, traj) == 2
    assert res.skipped.get("duplicate_uuid", 0) == (3 if shape == "rewritten" else 0)
    assert res.rejects == []
    _counts_add_up(res)


def test_preserved_segment_that_does_not_resolve(tmp_path):
    """A preservedSegment whose tail→head walk breaks is dropped, as Claude Code drops it: contexts
    after the boundary are [summary, new turns]; the failure is counted, nothing crashes."""
    rows = _segment_session("relinked")
    rows[5] = boundary("cb", "r2", preservedSegment={"headUuid": "nope", "anchorUuid": "s", "tailUuid": "r2"})
    rows[-2] = user("u3", "s", "and the last step")
    res = run_import("claude-code", [_write(tmp_path, rows)])
    (traj,) = res.trajectories
    assert traj.calls[-1].context == ["s", "u3"]
    assert res.notes["preserved_segment_unresolved"] == 1
    _counts_add_up(res)


def test_attachment_file_is_a_read_tool_pair(tmp_path):
    """A ``file`` attachment is sent as a Read tool use plus its result (Claude Code's
    createToolUseMessage/createToolResultMessage), both in the next call's context after the prompt."""
    rows = [user("u1", None, "look at @a.py"),
            attachment("f1", "u1", {"type": "file", "filename": "/p/a.py", "displayPath": "a.py",
                                    "content": {"type": "text", "file": {"filePath": "/p/a.py", "content": "x = 1"}}}),
            asst("a1", "f1", "m1", "a.py sets x")]
    res = run_import("claude-code", [_write(tmp_path, rows)])
    (traj,) = res.trajectories
    assert traj.calls[0].context == ["u1", "f1#0", "f1#1"]
    table = traj.message_table()
    (tc,) = table["f1#0"].tool_calls
    assert (table["f1#0"].role, tc.name, tc.arguments) == ("assistant", "Read", {"file_path": "/p/a.py"})
    assert (table["f1#1"].role, table["f1#1"].tool_call_id, table["f1#1"].content) == ("tool", tc.id, "x = 1")
    assert res.imported == 3 and res.rejects == []


def _rewind_then_partial_compaction() -> list[dict]:
    """The shape of claude-code-log's test/test_data/dag_compact_after_rewind_preserved.jsonl
    [daaain/claude-code-log be3a5a4]: u1 → a1, a first attempt b1u → b1a, a rewind to a1 with b2u → b2a
    → b2u2; a partial compaction cb (preservedSegment head b2a, anchor cs, tail b2a2; preservedMessages
    [b2a, b2u2, b2a2]; logicalParentUuid b2a2) whose preserved response b2a2 exists only after the
    summary cs, hanging from it; then p1u → p1a."""
    rows = [user("u1", None, "Start"), asst("a1", "u1", "m_a1", "Ready"),
            user("b1u", "a1", "First attempt"), asst("b1a", "b1u", "m_b1a", "First answer"),
            user("b2u", "a1", "Second attempt"), asst("b2a", "b2u", "m_b2a", "Second answer"),
            user("b2u2", "b2a", "Keep going"),
            boundary("cb", "b2a2", trigger="auto", preTokens=150000,
                     preservedSegment={"headUuid": "b2a", "anchorUuid": "cs", "tailUuid": "b2a2"},
                     preservedMessages={"anchorUuid": "cs", "uuids": ["b2a", "b2u2", "b2a2"]}),
            user("cs", "cb", "This session is being continued from a previous conversation. Summary: a plan.",
                 isCompactSummary=True),
            asst("b2a2", "cs", "m_b2a2", "Kept going"),
            user("p1u", "b2a2", "After compaction"), asst("p1a", "p1u", "m_p1a", "Final answer")]
    rows[9]["timestamp"] = rows[6]["timestamp"].replace(".000Z", ".500Z")  # sampled before the boundary
    return rows


def test_preserved_response_after_rewind_keeps_its_pre_compaction_chain(tmp_path, tokenizer):
    """b2a2 was sampled before the compaction, after b2u2: its context is the pre-compaction chain up
    to its parent in the preserved segment, [u1 a1 b2u b2a b2u2] - not [cs] (a summary written after
    it). claude-code-log's test_dag_compact_after_rewind.py pins the live branch as
    [b2u b2a b2u2 cb cs b2a2 p1u p1a]; after the boundary Claude Code relinks the segment under the
    anchor, so p1a sees [cs b2a b2u2 b2a2 p1u]. One summarize eviction before p1a removes the
    pre-compaction messages not preserved (u1 a1 b2u) and inserts cs. Segments: the rewind (b2a's
    context leaves b1a's path) and the compaction each start one: 3."""
    res = run_import("claude-code", [_write(tmp_path, _rewind_then_partial_compaction())])
    (traj,) = res.trajectories
    assert _contexts(traj) == [["u1"], ["u1", "a1", "b1u"], ["u1", "a1", "b2u"], ["u1", "a1", "b2u", "b2a", "b2u2"],
                               ["cs", "b2a", "b2u2", "b2a2", "p1u"]]
    assert [c.response for c in traj.calls] == ["a1", "b1a", "b2a", "b2a2", "p1a"]
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.removed, ev.inserted) == ("summarize", "call-4", ["u1", "a1", "b2u"], ["cs"])
    assert ev.tokens_before == 150000 and ev.trigger == "auto"
    assert _segments(tokenizer, traj) == 3
    assert res.rejects == [] and res.notes["preserved_messages"] == 3
    _counts_add_up(res)


def test_companion_intro_and_auto_mode_attachments_are_sent(tmp_path):
    """companion_intro and auto_mode (2.1.x) are rendered as normalizeAttachmentForAPI does (each one
    isMeta user message in <system-reminder>), marked ``inferred_text`` (the wording of one version);
    neither is rejected. An attachment type still unknown is rejected, kept as a chain link (the call
    after it still sees the prompt before it), and what it carried is in the reject's detail."""
    rows = [user("u1", None, "go"),
            attachment("c1", "u1", {"type": "companion_intro", "name": "Chiseler", "species": "rabbit"}),
            attachment("m1", "c1", {"type": "auto_mode", "reminderType": "sparse"}),
            attachment("x1", "m1", {"type": "brand_new_kind", "payload": {"k": 1}}),
            asst("a1", "x1", "m1", "ok")]
    res = run_import("claude-code", [_write(tmp_path, rows)])
    (traj,) = res.trajectories
    assert traj.calls[0].context == ["u1", "c1", "m1"]
    table = traj.message_table()
    assert table["c1"].content.startswith(reminder("# Companion\n\nA small rabbit named Chiseler sits")[:-20])
    assert "You're not Chiseler — it's a separate watcher." in table["c1"].content
    assert table["m1"].content == reminder("Auto mode still active (see full instructions earlier in conversation). "
                                           "Execute autonomously, minimize interruptions, prefer action over planning.")
    assert table["c1"].meta["inferred_text"] and table["m1"].author == "system"
    (rej,) = res.rejects
    assert rej.reason == "unknown_record_type" and "brand_new_kind" in rej.message and "chain" in rej.message
    assert json.loads(rej.detail) == {"type": "brand_new_kind", "payload": {"k": 1}}
    assert res.read == 5 and res.imported == 4
    _counts_add_up(res)


def test_cli_debug_shows_what_unknown_records_carried(tmp_path):
    """`memorywalker --debug import` prints each unknown record's reject with what it carried; without
    --debug only the counts; the rejects file holds the detail either way."""
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    rows = [user("u1", None, "go"), _base("z1", "u1", "hologram", payload={"beam": 7}), asst("a1", "z1", "m1", "ok")]
    path = _write(tmp_path, rows)
    out = tmp_path / "o.jsonl"
    plain = CliRunner().invoke(app, ["import", "claude-code", str(path), "-o", str(out)])
    debug = CliRunner().invoke(app, ["--debug", "import", "claude-code", str(path), "-o", str(out)])
    assert plain.exit_code == debug.exit_code == 0, debug.output
    assert "carried:" not in plain.output and "rejects: unknown_record_type" in plain.output
    assert "carried:" in debug.output and '"beam":7' in debug.output
    (rej,) = [json.loads(x) for x in (tmp_path / "o.rejects.jsonl").read_text().splitlines()]
    assert rej["reason"] == "unknown_record_type" and json.loads(rej["detail"])["payload"] == {"beam": 7}
    # the unknown record is still a chain link: a1's context reaches u1 through it
    (traj,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert traj["calls"][0]["context"] == ["u1"]
