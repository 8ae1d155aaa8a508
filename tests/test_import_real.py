"""Importers on the real harness logs in ../shared/fixtures/harness-logs (SOURCES.md there).

Every expected number is recounted from the files by a few lines of independent code in the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memorywalker.importers import run_import
from memorywalker.records import check_trajectory
from memorywalker.render import Renderer
from memorywalker.tree import ConditioningTree

SESSION = "ae4a77f8-aedd-4bc1-888f-c94edc91af04"


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _segments(tokenizer, traj) -> int:
    tree = ConditioningTree.build([Renderer(tokenizer).render(traj)])
    return len(tree.segments(0))


def _message_segments(traj) -> int:
    """Message-level segment count: a call extends the previous one iff it starts with its S."""
    n = 1
    for prev, call in zip(traj.calls, traj.calls[1:], strict=False):
        before = [*prev.context, prev.response]
        n += call.context[: len(before)] != before
    return n


def _counts_add_up(result) -> None:
    assert result.read == result.imported + sum(result.skipped.values()) + result.rejected


# --- claude code ------------------------------------------------------------------------------------

def test_claude_code_compacted_session(harness_logs, tokenizer):
    """calls = distinct message.id of main-chain assistant records + those of agent-acompact-*;
    evictions = number of compact_boundary records (1, manual, preTokens from the record)."""
    root = harness_logs / "claude-code"
    main = _lines(root / f"{SESSION}.jsonl")
    compact = _lines(root / SESSION / "subagents" / "agent-acompact-946d2b.jsonl")
    agent = _lines(root / SESSION / "subagents" / "agent-aac57f5.jsonl")
    n_main = len({r["message"]["id"] for r in main if r.get("type") == "assistant" and not r.get("isSidechain")})
    n_compact = len({r["message"]["id"] for r in compact if r.get("type") == "assistant"})
    n_agent = len({r["message"]["id"] for r in agent if r.get("type") == "assistant"})
    boundaries = [r for r in main if r.get("subtype") == "compact_boundary"]
    summary = next(r for r in main if r.get("isCompactSummary"))

    result = run_import("claude-code", [root / f"{SESSION}.jsonl"])
    assert result.rejects == []
    _counts_add_up(result)
    assert result.read == len(main) + len(compact) + len(agent)
    traj, sub = result.trajectories
    assert len(traj.calls) == n_main + n_compact
    assert len(sub.calls) == n_agent
    assert [(e.kind, e.trigger, e.tokens_before) for e in traj.evictions] == [
        ("summarize", b["compactMetadata"]["trigger"], b["compactMetadata"]["preTokens"]) for b in boundaries]
    for t in (traj, sub):
        check_trajectory(t)  # no tool result orphaned, every id resolves

    table = traj.message_table()
    ev = traj.evictions[0]
    junction = [c.id for c in traj.calls].index(ev.before_call)
    for call in traj.calls[junction:]:  # every post-compaction context starts with the summary
        first = table[call.context[0]]
        assert first.content == summary["message"]["content"] and first.author == "harness"
    assert ev.inserted == [traj.calls[junction].context[0]]
    # The summarization call: pre-compaction chain + its own prompt, answered by the summary text.
    summ = traj.calls[junction - 1]
    assert summ.purpose == "summarize"
    assert table[summ.context[-1]].content == compact[0]["message"]["content"]
    assert set(ev.removed) <= set(summ.context) | {summ.response}
    # Subagent lineage: the call that issued the Task tool_use.
    task_ids = {b["id"] for r in main if r.get("type") == "assistant" for b in r["message"]["content"]
                if isinstance(b, dict) and b.get("name") == "Task"}
    parent = next(c for c in traj.calls if c.id == sub.lineage.parent_call)
    assert {tc.id for tc in table[parent.response].tool_calls} & task_ids
    assert _message_segments(traj) == len(traj.evictions) + 1
    assert _segments(tokenizer, traj) == len(traj.evictions) + 1  # through the tree
    # parallel tool uses: every tool_use of every context has its result placed right after it
    for call in traj.calls:
        ctx = [table[m] for m in call.context]
        for i, m in enumerate(ctx[:-1]):
            if m.tool_calls and i + len(m.tool_calls) < len(ctx):
                following = {x.tool_call_id for x in ctx[i + 1: i + 1 + len(m.tool_calls)]}
                assert following == {tc.id for tc in m.tool_calls}


@pytest.mark.parametrize("name", ["short.jsonl", "tool_heavy.jsonl", "subagent.jsonl",
                                  "ccviewer_1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl",
                                  "ccviewer_5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"])
def test_claude_code_uncompacted(harness_logs, tokenizer, name):
    """calls = distinct message.id over assistant records (main chain and sidechains);
    no compaction → no eviction → one segment per trajectory in the ConditioningTree."""
    path = harness_logs / "claude-code" / name
    recs = _lines(path)
    result = run_import("claude-code", [path])
    assert result.rejects == []
    _counts_add_up(result)
    assert result.read == len(recs)
    assert sum(len(t.calls) for t in result.trajectories) == len(
        {r["message"]["id"] for r in recs if r.get("type") == "assistant"})
    n_chains = 1 + len({r["uuid"] for r in recs if r.get("isSidechain") and r.get("parentUuid") is None})
    assert len(result.trajectories) == n_chains
    for t in result.trajectories:
        check_trajectory(t)
        assert t.evictions == []
        assert _segments(tokenizer, t) == 1


def test_claude_code_project_directory(harness_logs):
    """A directory imports every session .jsonl in it: the 8 files there (7 sessions + compacted)."""
    root = harness_logs / "claude-code"
    result = run_import("claude-code", [root])
    assert result.rejects == []
    assert {t.lineage.source_path for t in result.trajectories if t.lineage.parent is None} == {
        str(p) for p in root.glob("*.jsonl")}


# --- swe-agent --------------------------------------------------------------------------------------

def test_swe_agent_contexts_are_the_recorded_messages(harness_logs, tokenizer):
    """Step i's recorded messages are what step i+1 was sent; step 0 was sent messages[:2].
    Junctions = calls whose context is not context_{i-1} + response_{i-1} (elided observations)."""
    path = next((harness_logs / "swe-agent").glob("*.traj"))
    steps = json.loads(path.read_text())["trajectory"]
    result = run_import("swe-agent", [path])
    assert result.rejects == []
    (traj,) = result.trajectories
    table = traj.message_table()
    assert len(traj.calls) == len(steps)

    def plain(ids):
        return [(table[m].role, table[m].content) for m in ids]

    sent = [steps[0]["messages"][:2]] + [s["messages"] for s in steps[:-1]]
    for call, msgs in zip(traj.calls, sent, strict=True):
        assert plain(call.context) == [(m["role"], m["content"]) for m in msgs]
    junctions = sum(sent[i][: len(sent[i - 1]) + 1] != [*sent[i - 1], steps[i - 1]["messages"][-2]]
                    for i in range(1, len(sent)))
    assert junctions == 7
    assert [e.kind for e in traj.evictions] == ["placeholder"] * junctions
    assert _segments(tokenizer, traj) == junctions + 1

    # The tree branches where the elision starts: call 6 leaves call 5's path at the elided message.
    rendered = Renderer(tokenizer).render(traj)
    tree = ConditioningTree.build([rendered])
    first = next(i for i, c in enumerate(tree.calls) if c.junction)
    a, b = tree.root_path(tree.calls[first - 1].end), tree.root_path(tree.calls[first].end)
    split = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert tree.role[b[split]] == 4  # ROLE_ID["artifact"]: the placeholder text
    assert "Old environment output" in table[traj.evictions[0].inserted[0]].content


# --- openhands, codex -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["trajs_basic.json", "trajs_basic_gui_mode.json"])
def test_openhands_fixture(harness_logs, tokenizer, name):
    """calls = distinct model_response ids of agent actions + agent message actions without one."""
    path = harness_logs / "openhands" / name
    events = json.loads(path.read_text())
    responses = {e["tool_call_metadata"]["model_response"]["id"] for e in events
                 if e.get("source") == "agent" and e.get("action") and e.get("tool_call_metadata")}
    texts = [e for e in events if e.get("source") == "agent" and e.get("action") == "message"
             and not e.get("tool_call_metadata")]
    result = run_import("openhands", [path])
    assert result.rejects == []
    _counts_add_up(result)
    (traj,) = result.trajectories
    assert len(traj.calls) == len(responses) + len(texts)
    assert traj.evictions == [] and _segments(tokenizer, traj) == 1


def test_codex_fixture_has_no_model_output(harness_logs):
    """The sample rollout holds 0 model output items (no assistant message, reasoning or
    function_call), so its one trajectory is rejected as no_calls — the only, explained reject."""
    path = harness_logs / "codex" / "simonw_sample_codex_session.jsonl"
    recs = _lines(path)
    outputs = [r for r in recs if r["type"] == "response_item" and (
        r["payload"].get("role") == "assistant" or r["payload"]["type"] != "message")]
    assert outputs == []
    result = run_import("codex", [path])
    _counts_add_up(result)
    assert result.read == len(recs)
    assert [r.reason for r in result.rejects] == ["no_calls"]
    assert result.skipped["turn_context"] == sum(r["type"] == "turn_context" for r in recs)
