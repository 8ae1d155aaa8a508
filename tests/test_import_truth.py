"""The Claude Code importer checked against the gateway's capture of the same session.

Fixture ``tests/data/claude_code_truth/``: one real Claude Code 2.1.328 session (scripted model,
three auto-compactions) run through the gateway with

    memorywalker harness run claude-code --prompt "Read notes.txt, list the files, write out.txt, then show it." \\
        --model KIT/model --tokenizer KIT/tok --out OUT \\
        --backend scripted:src/memorywalker/data/harness-scripts/claude-code.yaml \\
        --file notes.txt=notes.txt --compact-at 30250

``session.jsonl`` is Claude Code's own log of it (the repeated ``api-request-shape`` records - same
``shapeHash`` - kept once; the ``prompt_snapshot`` attachments' payloads, never sent, stripped);
``trajectories.jsonl`` is the gateway's record (token ids and tool schemas stripped). The capture
holds 8 calls: 5 act calls and 3 compaction summaries; the log holds the 5 act calls' requests and
no summary request.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from memorywalker.importers import run_import

DATA = Path(__file__).parent / "data" / "claude_code_truth"
LOG = DATA / "session.jsonl"
ROOT = Path(__file__).resolve().parents[1]


def _truth():
    spec = importlib.util.spec_from_file_location("importer_truth", ROOT / "scripts" / "importer_truth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _import(path: Path = LOG):
    res = run_import("claude-code", [path])
    (traj,) = res.trajectories
    return res, traj


def test_every_act_call_equals_the_capture():
    """5 captured act calls ↔ 5 imported calls, in order: all equal, system prompt included. The 3
    captured summaries have no imported call (the log has no summary request)."""
    row = _truth().compare("claude-code", DATA, LOG)
    acts = [c for c in row["calls"] if c["purpose"] == "act"]
    assert [c["equal"] for c in acts] == [True] * 5
    assert [c["captured"] for c in acts] == ["call-0", "call-1", "call-3", "call-5", "call-7"]
    assert [c["imported"] for c in acts] == [f"call-{k}" for k in range(5)]
    summaries = [c for c in row["calls"] if c["purpose"] == "summarize"]
    assert [c["difference"][0] for c in summaries] == ["not_imported"] * 3
    assert row["imported"] == {"act": 5}
    # what remains rejected: attachments whose rendering the old path does not know (4 x 7 types + 4
    # more prompt snapshots); the request-log records and the bookkeeping types are not rejected.
    assert row["rejects_by_reason"] == {"unknown_record_type": 32}


def test_request_digest_recomputed_for_every_call():
    res, traj = _import()
    assert [c.meta["request_digest"] for c in traj.calls] == ["match"] * 5
    assert [c.meta["context_source"] for c in traj.calls] == ["api-request"] * 5
    assert res.notes["api_request_digest_match"] == 5
    counts = res.counts()
    assert counts["skipped_by_kind"] == {"atis-latch": 12, "cost-state": 1, "last-prompt": 11,
                                         "queue-operation": 2, "tools-used": 3}
    assert counts["evictions"] == {"summarize": 3}


def test_post_compaction_contexts_are_the_logged_requests():
    """The first call after the first compaction is [system prompt, summary (user), date (system),
    the kept Bash round, the re-attached reads (user), deferred tools (system)]; after the second
    compaction the summary sits at the end of a merged user turn (as Claude Code sent it), and the
    call after the third compaction sees exactly the same messages as the one after the second."""
    _, traj = _import()
    m = {x.id: x for x in traj.messages}
    c2 = [m[i] for i in traj.calls[2].context]
    assert [(x.role, x.author) for x in c2] == [
        ("system", "system"), ("user", "harness"), ("system", "system"), ("assistant", "model"),
        ("tool", "environment"), ("user", "system"), ("system", "system")]
    assert c2[0].content.startswith("You are a Claude agent, built on Anthropic's Claude Agent SDK.")
    assert c2[1].content.startswith("This session is being continued from a previous conversation")
    assert c2[2].content == "Today's date is 2026-12-06."
    assert [(tc.name, tc.arguments) for tc in c2[3].tool_calls] == [("Bash", {"command": "ls -1",
                                                                             "description": "List files"})]
    assert (c2[4].content, c2[4].tool_call_id) == ("notes.txt", "toolu_d882adb02fe76fbf549c9f21")
    assert c2[5].content.startswith("<system-reminder>\nCalled the Read tool with the following input")
    assert c2[6].content.startswith("The following deferred tools are now available via ToolSearch.")
    c3 = [m[i] for i in traj.calls[3].context]
    assert [(x.role, x.author) for x in c3] == [("system", "system"), ("user", "system"), ("user", "harness"),
                                               ("system", "system")]
    assert "This session is being continued from a previous conversation" in c3[2].content
    assert traj.calls[4].context == traj.calls[3].context
    # the third compaction removed only the call-3 response and its tool result
    third = traj.evictions[2]
    assert third.before_call == "call-4" and third.inserted == []
    assert [m[i].role for i in third.removed] == ["assistant", "tool"]


def test_tampered_blob_fails_the_digest(tmp_path):
    """One character changed in the blob of the first post-compaction request: that call's digest no
    longer matches and it is left unselected; the other 4 still match."""
    lines = LOG.read_text().splitlines()
    for k, line in enumerate(lines):
        o = json.loads(line)
        if o["type"] == "api-request-blob" and o["message"].get("content") == "Today's date is 2026-12-06.":
            o["message"]["content"] = "Today's date is 2026-12-07."
            lines[k] = json.dumps(o)
            break
    else:
        raise AssertionError("the date blob is not in the fixture")
    path = tmp_path / LOG.name
    path.write_text("\n".join(lines) + "\n")
    _, traj = _import(path)
    assert [c.meta["request_digest"] for c in traj.calls] == ["match", "match", "mismatch", "match", "match"]
    assert [c.selected for c in traj.calls] == [True, True, False, True, True]
    assert traj.calls[2].reason.startswith("request_digest_mismatch")


def test_without_the_request_log_the_old_path_differs(tmp_path):
    """The same log without its api-request records: contexts come from the parentUuid chain again,
    and no call equals the capture (no system prompt; the compaction summary and the re-attached
    files are placed and rendered otherwise) - the state before the request chain was read."""
    lines = [line for line in LOG.read_text().splitlines()
             if not json.loads(line)["type"].startswith("api-request")]
    d = tmp_path / "case"
    d.mkdir()
    (d / LOG.name).write_text("\n".join(lines) + "\n")
    (d / "trajectories.jsonl").write_text((DATA / "trajectories.jsonl").read_text())
    row = _truth().compare("claude-code", d, d / LOG.name)
    acts = [c for c in row["calls"] if c["purpose"] == "act"]
    assert len(acts) == 5 and not any(c["equal"] for c in acts)
    assert not any(c["equal_without_system"] for c in acts)
