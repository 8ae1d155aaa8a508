"""The shipped example logs (``examples/harness-logs/``) import as examples/README.md says they do.

OpenCode 1.18.33's database: one trajectory of 6 calls (5 act, OpenCode's own compaction call), its
compaction a ``summarize`` eviction, and no system prompt (its database does not store the one it sent),
which the record says (``meta.system_prompt``) and the counts total. Codex 0.169.0's rollout, compacting
after each of its 4 tool calls: 9 calls with ``base_instructions`` as the system prompt, of which the
billed-token check leaves 8 ``context_unverified``, and its 4 compactions inferred as ``other`` evictions
(what the Codex importer does not yet rebuild: docs/importers.md). When the importer learns Codex's
compaction, this test is where the new numbers go.
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
    assert not any(m.role == "system" for m in traj.messages)
    assert result.counts()["system_prompt_absent"] == 1 and not result.rejects


def test_the_codex_example_holds_its_system_prompt_and_its_compactions_are_not_rebuilt_yet():
    result = run_import("codex", [LOGS / "codex"])
    (traj,) = result.trajectories
    c = result.counts()
    assert traj.meta["system_prompt"] == "recorded" and c["system_prompt_absent"] == 0
    assert (c["calls"], c["calls_selected"], c["unselected_by_reason"]) == (9, 1, {"context_unverified": 8})
    assert (c["evictions"], c["evictions_inferred"]) == ({"other": 4}, 4)
