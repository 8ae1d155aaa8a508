"""The older SWE-agent format (calls reconstructed from ``history``) and orphan Claude Code subagents.

Expected numbers are recounted from the fixture files by independent code in each test.
"""

from __future__ import annotations

import json
import shutil

import yaml

from memorywalker.importers import run_import

OLDER = "test-repo-i1__older_format"
SESSION = "ae4a77f8-aedd-4bc1-888f-c94edc91af04"


def _counts_add_up(result) -> None:
    assert result.read == result.imported + sum(result.skipped.values()) + result.rejected


def test_older_swe_agent_format_imports_one_call_per_step(harness_logs):
    """5 steps, 5 assistant entries in history: 5 calls; call k's context is the history before the
    k-th assistant entry (role + content), its response that entry; the run config states no history
    processors, so contexts only grow (one segment, no eviction)."""
    path = harness_logs / "swe-agent" / f"{OLDER}.traj"
    data = json.loads(path.read_text())
    config = yaml.safe_load((harness_logs / "swe-agent" / f"{OLDER}.args.yaml").read_text())
    assert config["agent"]["config"]["history_processors"] == []
    history = data["history"]
    assistant = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    assert len(assistant) == len(data["trajectory"]) == 5

    result = run_import("swe-agent", [path])
    assert result.rejects == []
    _counts_add_up(result)
    (traj,) = result.trajectories
    assert len(traj.calls) == 5
    assert traj.meta["reconstructed"] == "history" and traj.meta["history_processors"] == []
    table = traj.message_table()
    for call, i in zip(traj.calls, assistant, strict=True):
        assert [(table[m].role, table[m].content) for m in call.context] == [(m["role"], m["content"]) for m in history[:i]]
        assert table[call.response].content == history[i]["content"]
    # The step's own record agrees: its thought and action are in the response.
    for call, step in zip(traj.calls, data["trajectory"], strict=True):
        assert step["action"].strip() in table[call.response].content
    assert traj.evictions == []


def test_older_swe_agent_format_applies_last_n_observations(harness_logs, tmp_path):
    """With ``last_n_observations: n=2`` in the run config, call k (k observations after the instance
    template) sees observations 1..k-2 elided to "Old environment output: (L lines omitted)", L = the
    observation's line count; each new elision is an inferred placeholder eviction."""
    src = harness_logs / "swe-agent"
    shutil.copy(src / f"{OLDER}.traj", tmp_path / f"{OLDER}.traj")
    config = yaml.safe_load((src / f"{OLDER}.args.yaml").read_text())
    config["agent"]["config"]["history_processors"] = [{"type": "last_n_observations", "n": 2}]
    (tmp_path / f"{OLDER}.args.yaml").write_text(yaml.safe_dump(config))
    history = json.loads((src / f"{OLDER}.traj").read_text())["history"]
    observations = [m for m in history if m["role"] == "user" and not m.get("is_demo")]

    (traj,) = run_import("swe-agent", [tmp_path / f"{OLDER}.traj"]).trajectories
    assert traj.meta["history_processors"] == ["last_n_observations"]
    table = traj.message_table()
    for k, call in enumerate(traj.calls):
        seen = [table[m] for m in call.context if table[m].role == "user" and not table[m].content.startswith("Here is a demonstration")]
        elided = [m.content for m in seen if m.content.startswith("Old environment output")]
        n_elided = max(0, (k + 1) - 2 - 1)  # k+1 observations; keep the first and the last 2
        assert elided == [f"Old environment output: ({len(o['content'].splitlines())} lines omitted)"
                          for o in observations[1: 1 + n_elided]]
        assert all(table[m].author == "harness" for m in call.context if table[m].content.startswith("Old environment"))
    # Calls 3 and 4 each elide one more observation: two branch points.
    assert [ev.before_call for ev in traj.evictions] == ["call-3", "call-4"]
    assert all(ev.kind == "placeholder" and len(ev.removed) == 1 and len(ev.inserted) == 1 for ev in traj.evictions)


def test_unknown_history_processor_rejects_the_file(harness_logs, tmp_path):
    src = harness_logs / "swe-agent"
    shutil.copy(src / f"{OLDER}.traj", tmp_path / f"{OLDER}.traj")
    (tmp_path / "args.yaml").write_text(yaml.safe_dump({"agent": {"history_processors": [{"type": "closed_window"}]}}))
    result = run_import("swe-agent", [tmp_path / f"{OLDER}.traj"])
    assert result.trajectories == []
    assert [(r.reason, "closed_window" in r.message) for r in result.rejects] == [("bad_format", True)]


def test_orphan_subagent_is_imported_with_a_warning(harness_logs, tmp_path):
    """Only ``<session>/subagents/`` is there: the Task subagent becomes its own trajectory (calls =
    distinct message.id of its assistant records) with an ``orphan_subagent`` warning; the compaction's
    summarization call is dropped with its reason, not silently."""
    shutil.copytree(harness_logs / "claude-code" / SESSION, tmp_path / SESSION)
    agent = tmp_path / SESSION / "subagents" / "agent-aac57f5.jsonl"
    records = [json.loads(x) for x in agent.read_text().splitlines() if x.strip()]
    n_calls = len({r["message"]["id"] for r in records if r.get("type") == "assistant"})

    for paths in ([tmp_path], [tmp_path / SESSION / "subagents"], [agent]):
        result = run_import("claude-code", paths)
        _counts_add_up(result)
        (traj,) = result.trajectories
        assert traj.id == f"{SESSION}/agent-aac57f5" and len(traj.calls) == n_calls == 3
        assert traj.lineage.parent == SESSION and traj.lineage.relation == "subagent" and traj.lineage.parent_call is None
        c = result.counts()
        assert c["warnings_by_reason"] == {"orphan_subagent": 1}
        expected_dropped = {} if paths == [agent] else {"missing_parent": 1}  # agent-acompact-*
        assert c["dropped_by_reason"] == expected_dropped


def test_subagent_with_its_session_is_not_an_orphan(harness_logs):
    result = run_import("claude-code", [harness_logs / "claude-code" / f"{SESSION}.jsonl"])
    assert "orphan_subagent" not in result.counts()["warnings_by_reason"]
    assert {t.id for t in result.trajectories} == {SESSION, f"{SESSION}/agent-aac57f5"}
