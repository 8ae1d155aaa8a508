"""Pi coding agent sessions, built by hand in the shapes of badlogic/pi-mono [83378aa]
packages/coding-agent/docs/session.md (entry types, v1/v2/v3), checked against its
src/core/session-manager.ts ``buildSessionContext``, src/core/messages.ts ``convertToLlm`` and
packages/ai/src/providers/transform-messages.ts ``transformMessages``."""

from __future__ import annotations

import json
from pathlib import Path

from memorywalker.importers import run_import
from memorywalker.importers.pi import (
    BRANCH_PREFIX,
    BRANCH_SUFFIX,
    COMPACTION_PREFIX,
    COMPACTION_SUFFIX,
    NO_RESULT,
)
from memorywalker.records import check_trajectory
from memorywalker.render import Renderer
from memorywalker.tree import ConditioningTree


def _segments(tokenizer, traj) -> int:
    return len(ConditioningTree.build([Renderer(tokenizer).render(traj)]).segments(0))


def _counts_add_up(res) -> None:
    assert res.read == res.imported + sum(res.skipped.values()) + res.rejected


def _e(eid, parent, kind, **kw) -> dict:
    return {"type": kind, "id": eid, "parentId": parent, "timestamp": "2026-03-01T10:00:00.000Z", **kw}


def _msg(eid, parent, role, **kw) -> dict:
    return _e(eid, parent, "message", message={"role": role, **kw})


def _asst(eid, parent, content, prompt, out=30, stop="stop", **kw) -> dict:
    usage = {"input": 10, "output": out, "cacheRead": prompt - 10, "cacheWrite": 0, "totalTokens": prompt + out,
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}
    return _msg(eid, parent, "assistant", content=content, api="anthropic-messages", provider="anthropic",
                model="claude-sonnet-4-5", usage=usage, stopReason=stop, timestamp=0, **kw)


def _text(t):
    return [{"type": "text", "text": t}]


def _v3_session() -> list[dict]:
    """e1 user → e2 (read tc1) → e3 result → e4 thinking_level_change → e5 → e6 bashExecution → e7
    custom_message → e8 user → e9 (bash tc2, never answered) → e10 user → e11 (error) → e12 user → e13 →
    e14 compaction (firstKeptEntryId e8) → e15 user → e16; then /tree back to e5 with a summary:
    e17 branch_summary → e18 user → e19."""
    return [
        {"type": "session", "version": 3, "id": "pi-s1", "timestamp": "2026-03-01T10:00:00.000Z", "cwd": "/w"},
        _msg("e1", None, "user", content="fix the bug", timestamp=0),
        _asst("e2", "e1", [*_text("looking"), {"type": "toolCall", "id": "tc1", "name": "read",
                                               "arguments": {"path": "a.py"}}], 1000, out=20, stop="toolUse"),
        _msg("e3", "e2", "toolResult", toolCallId="tc1", toolName="read", content=_text("x = 1"), isError=False,
             timestamp=0),
        _e("e4", "e3", "thinking_level_change", thinkingLevel="high"),
        _asst("e5", "e4", _text("found it"), 1100),
        _msg("e6", "e5", "bashExecution", command="ls", output="a.py", exitCode=0, cancelled=False,
             truncated=False, timestamp=0),
        _e("e7", "e6", "custom_message", customType="ext", content="injected context", display=True),
        _msg("e8", "e7", "user", content=_text("now test"), timestamp=0),
        _asst("e9", "e8", [{"type": "toolCall", "id": "tc2", "name": "bash", "arguments": {"command": "pytest"}}],
              1300, stop="toolUse"),
        _msg("e10", "e9", "user", content="stop, different idea", timestamp=0),
        _asst("e11", "e10", [], 0, out=0, stop="error", errorMessage="overloaded"),
        _msg("e12", "e11", "user", content="retry", timestamp=0),
        _asst("e13", "e12", _text("ok"), 1450),
        _e("e14", "e13", "compaction", summary="Fixed the bug; tests pending.", firstKeptEntryId="e8",
           tokensBefore=1500),
        _msg("e15", "e14", "user", content="continue", timestamp=0),
        _asst("e16", "e15", _text("continuing"), 600),
        _e("e17", "e5", "branch_summary", fromId="e16", summary="Tried tests; abandoned."),
        _msg("e18", "e17", "user", content="document it instead", timestamp=0),
        _asst("e19", "e18", _text("docs"), 1200),
    ]


def _write(tmp: Path, rows: list[dict], name="2026-03-01T10-00-00-000Z_pi-s1.jsonl") -> Path:
    path = tmp / "--w--" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pi_tree_compaction_branch_summary(tmp_path, tokenizer):
    """Contexts by hand (message ids = entry ids):
    call-0 e2 [e1] · call-1 e5 [e1 e2 e3] (the thinking-level entry is not sent) · call-2 e9
    [e1 e2 e3 e5 e6 e7 e8] · call-3 e11 [.. e8 e9 tc2:no-result e10] (transformMessages answers the
    orphaned tc2 when the user message comes; e11 errored: unselected) · call-4 e13 [.. e10 e12]
    (the errored e11 is not sent) · call-5 e16 [e14 e8 e9 tc2:no-result e10 e12 e13 e15]
    (buildSessionContext: summary, entries from firstKeptEntryId to the compaction, then after it) ·
    call-6 e19 [e1 e2 e3 e5 e17 e18] (the branch from e5 with its summary).
    Evictions: summarize before call-5 (removed what the compaction did not keep: e1 e2 e3 e5 e6 e7;
    inserted e14; tokens_before 1500), summarize before call-6 (branch summary e17). Segments: call-4
    leaves call-3's path (the errored response is not resent), call-5 and call-6 are evictions: 4.
    Billed (input + cacheRead + cacheWrite): 1100 ≥ 1000 + 20 - 64, 1300 ≥ 1100 + 30 - 64, call-4
    1450 ≥ 1300 + 30 - 64 (its prefix parent is call-2), call-6 1200 ≥ 1100 + 30 - 64 (parent call-1):
    verified; call-0, the errored call-3 and the junction call-5 unchecked."""
    res = run_import("pi", [_write(tmp_path, _v3_session())])
    (traj,) = res.trajectories
    assert check_trajectory(traj) is None
    pre = ["e1", "e2", "e3", "e5", "e6", "e7", "e8"]
    assert [c.context for c in traj.calls] == [
        ["e1"], ["e1", "e2", "e3"], pre, [*pre, "e9", "tc2:no-result", "e10"],
        [*pre, "e9", "tc2:no-result", "e10", "e12"],
        ["e14", "e8", "e9", "tc2:no-result", "e10", "e12", "e13", "e15"],
        ["e1", "e2", "e3", "e5", "e17", "e18"]]
    assert [c.response for c in traj.calls] == ["e2", "e5", "e9", "e11", "e13", "e16", "e19"]
    assert [c.selected for c in traj.calls] == [True, True, True, False, True, True, True]
    assert traj.calls[3].reason == "error: overloaded"
    table = traj.message_table()
    assert table["e14"].content == COMPACTION_PREFIX + "Fixed the bug; tests pending." + COMPACTION_SUFFIX
    assert table["e17"].content == BRANCH_PREFIX + "Tried tests; abandoned." + BRANCH_SUFFIX
    assert table["e6"].content == "Ran `ls`\n```\na.py\n```" and table["e7"].content == "injected context"
    assert (table["tc2:no-result"].content, table["tc2:no-result"].tool_call_id) == (NO_RESULT, "tc2")
    assert table["e14"].is_artifact and table["e17"].is_artifact
    comp, branch = traj.evictions
    assert (comp.kind, comp.before_call, comp.removed, comp.inserted, comp.tokens_before) == (
        "summarize", "call-5", ["e1", "e2", "e3", "e5", "e6", "e7"], ["e14"], 1500)
    assert (branch.kind, branch.before_call, branch.inserted, branch.meta) == (
        "summarize", "call-6", ["e17"], {"branch_summary": True})
    assert [c.meta["context_check"] for c in traj.calls] == [
        "unchecked", "verified", "verified", "unchecked", "verified", "unchecked", "verified"]
    assert _segments(tokenizer, traj) == 4
    assert res.read == 20 and dict(res.skipped) == {"session_header": 1, "thinking_level_change": 1}
    assert res.rejects == []
    _counts_add_up(res)


def test_pi_v1_session_is_migrated(tmp_path):
    """A v1 file (no version, no ids): each entry hangs from the one before it (migrateV1ToV2), and the
    compaction's firstKeptEntryIndex 4 counts file lines from the header (line 5, the second user
    message). Ids are ``L<line>``: a3 sees [L7 L5 L6 L8]; the eviction removes L2 L3 L4."""
    rows = [{"type": "session", "id": "v1", "timestamp": "2025-11-20T10:00:00.000Z", "cwd": "/w"},
            {"type": "message", "message": {"role": "user", "content": _text("go")}},
            {"type": "message", "message": _asst("x", None, [{"type": "toolCall", "id": "t1", "name": "ls",
                                                              "arguments": {}}], 500, stop="toolUse")["message"]},
            {"type": "message", "message": {"role": "toolResult", "toolCallId": "t1", "toolName": "ls",
                                            "content": _text("a b"), "isError": False}},
            {"type": "message", "message": {"role": "user", "content": _text("next")}},
            {"type": "message", "message": _asst("x", None, _text("done"), 600)["message"]},
            {"type": "compaction", "summary": "listed files", "firstKeptEntryIndex": 4, "tokensBefore": 700},
            {"type": "message", "message": {"role": "user", "content": _text("more")}},
            {"type": "message", "message": _asst("x", None, _text("ok"), 300)["message"]}]
    res = run_import("pi", [_write(tmp_path, rows, "old.jsonl")])
    (traj,) = res.trajectories
    assert [c.context for c in traj.calls] == [["L2"], ["L2", "L3", "L4", "L5"], ["L7", "L5", "L6", "L8"]]
    (ev,) = traj.evictions
    assert (ev.before_call, ev.removed, ev.inserted, ev.tokens_before) == ("call-2", ["L2", "L3", "L4"], ["L7"], 700)
    _counts_add_up(res)


def test_pi_unknown_entry_is_a_tree_link(tmp_path):
    """An entry type Pi does not have is rejected (with what it carried) but stays a link of the tree:
    the response under it still sees the prompt above it."""
    rows = [{"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"},
            _msg("e1", None, "user", content="hi", timestamp=0), _e("e2", "e1", "hologram", beam=7),
            _asst("e3", "e2", _text("hello"), 100)]
    res = run_import("pi", [_write(tmp_path, rows)])
    (traj,) = res.trajectories
    assert traj.calls[0].context == ["e1"]
    (rej,) = res.rejects
    assert rej.reason == "unknown_record_type" and json.loads(rej.detail)["beam"] == 7
    _counts_add_up(res)
