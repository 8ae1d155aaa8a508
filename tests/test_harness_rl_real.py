"""GRPO inside the real harnesses (``rl tasks=FILE harness=claude-code|codex|opencode``), offline.

Each harness runs one step of 1 task × 2 sessions, every session a real process under bubblewrap
(where installed) against the recipe's gateway, answered by the task's script (read the file, write
the number, done; the harness's own compaction request answered with a summary) and scored by the
weights being trained. Each session must pass its verifier, reach the harness's compaction (moved low
through its own setting) as a summarize branch, and be trained with the rollout logprobs equal to a
plain forward of those weights within 1e-5. scripts/harness_rl.py runs the sampled version (capture →
SFT → RL) with OpenCode.

Slow (about a minute each) and needs the harnesses (``.ci/run`` installs them; see
tests/test_gateway_harnesses.py).
"""

from __future__ import annotations

import json

import pytest

from conftest import load_script, require_harness
from memorywalker.gateway.harnesses import PINNED
from memorywalker.recipes.rl import RLConfig, train

pytestmark = pytest.mark.slow

harness_rl = load_script("harness_rl")


@pytest.mark.parametrize("harness", sorted(PINNED))
def test_a_grpo_step_inside_the_real_harness_trains_its_compacted_sessions_exactly(harness, kit, tmp_path):
    require_harness(harness)
    tasks = harness_rl.task_file(tmp_path)
    first = tasks.read_text().splitlines()[0]
    tasks.write_text(first + "\n")  # task "seven": read notes.txt, write 7 to answer.txt
    script = tmp_path / "script.yaml"
    script.write_text(harness_rl.script_for(harness, *harness_rl.TASKS[0][1:]))
    result = train(RLConfig(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(tmp_path / "run"),
                            tasks=str(tasks), harness=harness, script=str(script),
                            compact_at=harness_rl.COMPACT_AT[harness], prompts_per_step=1, group_size=2, steps=1,
                            max_new_tokens=256, deadline=300, served_model="kit"), progress=False)
    m = result.metrics[0]
    rows = [json.loads(x) for x in (tmp_path / "run" / "rollouts" / "step-0.sessions.jsonl").read_text().splitlines()]
    assert (m["sessions"], m["sessions_failed"], m["episodes"]) == (2, 0, 2), rows
    assert [r["reward"] for r in rows] == [1.0, 1.0]  # the harness ran the tools: the verifier found the answer
    assert all(r["branches"].get("summarize", 0) >= 1 for r in rows), rows  # its own compaction, as a branch
    assert m["compactions_per_session"] >= 1 and m["logprob_abs_diff"] <= 1e-5
    gap = harness_rl.reference_gap(kit[1], None, tmp_path / "run" / "rollouts" / "step-0.jsonl")
    assert gap["targets"] > 0 and gap["max"] <= 1e-5, gap
