"""The shipped example logs (``examples/harness-logs/``) import as examples/README.md says they do.

OpenCode 1.18.33's database: one trajectory of 6 calls (5 act, OpenCode's own compaction call), its
compaction a ``summarize`` eviction, and no system prompt (its database does not store the one it sent),
which the record says (``meta.system_prompt``) and the counts total. Codex 0.169.0's rollout, compacting
after each of its 4 tool calls: 9 calls, act and summary alternating (5 act, 4 summarize, each summary's
answer the rollout's assistant message before ``compacted``), 4 ``summarize`` evictions from the
``compacted`` records and none inferred, every call selected; without ``--tools`` the tools are unknown
and the system-prompt rule undecided (the instructions kept whole); with ``--tools codex-0.169.0``, the
7 tools Codex 0.169.0 offered and the instructions without the planning sections.
"""

from __future__ import annotations

from pathlib import Path

from memorywalker.importers import run_import

LOGS = Path(__file__).resolve().parents[1] / "examples" / "harness-logs"


def test_the_opencode_example_compacted_once_and_says_its_system_prompt_is_not_in_the_log():
    result = run_import("opencode", [LOGS / "opencode" / "opencode.db"])
    (traj,) = result.trajectories
    assert [c.purpose for c in traj.calls].count("act") == 5 and len(traj.calls) == 6
    assert [e.kind for e in traj.evictions] == ["summarize"]
    assert traj.meta["system_prompt"] == "absent" and "does not store" in traj.meta["system_prompt_note"]
    table = traj.message_table()
    act = [c for c in traj.calls if c.purpose == "act"]
    assert not any(table[m].role == "system" for c in act for m in c.context)
    (summary,) = [c for c in traj.calls if c.purpose == "summarize"]  # as OpenCode 1.18 sends it: flattened
    system, prompt = (table[m] for m in summary.context)
    assert system.content.startswith("You are a context summarization agent") and summary.tools == []
    assert prompt.content.startswith("Here is the conversation so far:\n\n<conversation>\n[User]: ")
    assert result.counts()["system_prompt_absent"] == 1 and not result.rejects


def test_the_codex_example_imports_each_compaction_as_its_summary_call_and_a_summarize_eviction():
    result = run_import("codex", [LOGS / "codex"])
    (traj,) = result.trajectories
    c = result.counts()
    assert traj.meta["system_prompt"] == "recorded" and c["system_prompt_absent"] == 0
    assert [call.purpose for call in traj.calls] == ["act", "summarize"] * 4 + ["act"]
    assert (c["calls"], c["calls_selected"], c["unselected_by_reason"]) == (9, 9, {})
    assert (c["evictions"], c["evictions_inferred"], c["rejected"]) == ({"summarize": 4}, 0, 0)
    assert [e.before_call for e in traj.evictions] == ["call-2", "call-4", "call-6", "call-8"]
    assert traj.meta["tools"].startswith("unknown") and traj.meta["system_prompt_rule"].startswith("undecided")
    assert c["notes"]["summary_calls_from:rollout"] == 4


def test_the_codex_example_with_the_pinned_tool_set_gets_the_instructions_codex_sent():
    """16,979 characters: ``base_instructions`` (20,751) without "## Planning" and "## `update_plan`", as
    the gateway received them from Codex 0.169.0 (docs/importers.md)."""
    from memorywalker.importers import ImportOptions
    from memorywalker.importers.tools import load_tool_set

    (traj,) = run_import("codex", [LOGS / "codex"], ImportOptions(tools=load_tool_set("codex-0.169.0"))).trajectories
    system = traj.messages[0]
    assert system.role == "system" and len(system.content) == 16_979
    assert "## Planning" not in system.content and "## Task execution" in system.content
    assert [t.name for t in traj.tools] == ["exec_command", "write_stdin", "request_user_input", "view_image",
                                            "get_goal", "create_goal", "update_goal"]
    assert [call.tools for call in traj.calls if call.purpose == "summarize"] == [[]] * 4
