"""RL whose rollouts are sessions of a harness process through the gateway (``rl tasks=FILE harness=...``),
with a small agent of our own (tests/data/tiny_agent.py, the ``openai`` SDK over Chat Completions) as
the harness: the task file's rejects, the rollout logprobs against a plain forward of the weights that
sampled them (the sync), failures kept with their reasons, and ``kill -9`` resumed without training a
step's rollouts twice. The real harnesses run the same loop in tests/test_gateway_harnesses.py (slow)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from conftest import load_script
from memorywalker.gateway.tasks import read_tasks, verify
from memorywalker.recipes.rl import RLConfig, train
from memorywalker.records import read_trajectories

AGENT = f"cmd:{sys.executable} {Path(__file__).parent / 'data' / 'tiny_agent.py'}"
# a score in [0, 1) that differs between replies: every group has reward variance, so every step updates
CRC = f"{sys.executable} -c \"import zlib; print(zlib.crc32(open('reply.txt', 'rb').read()) / 2**32)\""
SCRIPT = """\
steps:
  - tool_calls: [{name: read_file, arguments: {path: notes.txt}}]
  - tool_calls: [{name: write_file, arguments: {path: answer.txt, content: "7"}}]
  - text: "Done."
"""


def write_tasks(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(kit, tmp_path, tasks, **kw) -> RLConfig:
    base = dict(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(tmp_path / "run"), tasks=str(tasks),
                harness=AGENT, prompts_per_step=2, group_size=2, steps=1, lr=1e-2, max_new_tokens=24,
                deadline=60, save_every=1, keep_checkpoints=5)
    return RLConfig(**{**base, **kw})


def plain_gap(model_dir: str, weights: Path | None, records: Path) -> tuple[float, int]:
    """Max |log p − rollout log p| over the step's trained calls, each from a plain ``model(input_ids)``
    forward of ``weights`` (the model dir's own when None) at T = 1 (scripts/harness_rl.py's
    ``reference_gap``, no engine code); and how many targets."""
    gap = load_script("harness_rl").reference_gap(model_dir, weights, records)
    return (gap["max"] if gap["targets"] else 0.0), gap["targets"]


def test_a_task_file_keeps_the_good_lines_and_sets_each_bad_one_aside_with_its_reason(tmp_path):
    """9 lines: 1 blank (skipped), 3 good (one copies a file by path), 5 bad — 3 + 5 = the 8 non-blank."""
    (tmp_path / "big.txt").write_text("data\n")
    lines = [
        json.dumps({"id": "a", "prompt": "p", "verifier": "true", "files": {"x/notes.txt": "hi"}}),
        "{not json",
        json.dumps({"prompt": "p", "verifier": "true", "files": {"big.txt": {"path": "big.txt"}}, "deadline": 5}),
        "",
        json.dumps({"id": "c", "verifier": "true"}),
        json.dumps({"id": "d", "prompt": "p", "verifier": "true", "files": {"../escape": "x"}}),
        json.dumps({"id": "a", "prompt": "p", "verifier": "true"}),
        json.dumps({"id": "e", "prompt": "p", "verifier": "true", "deadline": -1, "extra": 1}),
        json.dumps({"id": "f", "prompt": "p", "verifier": "true", "deadline": 0}),
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    tasks, rejected = read_tasks(path)
    assert [t.id for t in tasks] == ["a", "task-3"]
    assert tasks[0].files == {"x/notes.txt": "hi"} and tasks[1].files == {"big.txt": "data\n"}
    assert tasks[1].deadline_s == 5.0 and tasks[0].deadline_s is None
    assert [(r.line, r.reason.split(":")[0].split(" (")[0]) for r in rejected] == [
        (2, "not JSON"), (5, "'prompt' must be a non-empty string"),
        (6, "file name '../escape' must be a relative path inside the workdir"), (7, "duplicate id 'a'"),
        (8, "unknown field(s) ['extra']; a task has ['deadline', 'files', 'id', 'meta', 'prompt', 'verifier']"),
        (9, "'deadline' must be a positive number of seconds, not 0")]
    assert len(tasks) + len(rejected) == sum(1 for x in lines if x.strip())
    path.write_text("{}\n")
    with pytest.raises(ValueError, match=r"no usable task \(line 1: 'prompt' must be"):
        read_tasks(path)


def test_a_verifier_that_fails_is_a_reason_never_a_reward_of_zero(tmp_path):
    """exit 0 → 1.0 (or the score printed last), exit 1 → 0.0; a timeout, a signal, another status or a
    score outside [0, 1] → no reward and a reason."""
    assert verify("echo checking; echo 0.75", tmp_path).reward == 0.75
    assert verify("echo all good", tmp_path).reward == 1.0 and verify("exit 1", tmp_path).reward == 0.0
    assert verify("sleep 5", tmp_path, timeout_s=0.3).error == "the verifier ran past its timeout of 0.3 s"
    assert verify("kill -9 $$", tmp_path).error == "the verifier was killed by signal 9"
    v = verify("echo 'no such tool' >&2; exit 127", tmp_path)
    assert (v.reward, v.error) == (None, "the verifier exited 127: no such tool")
    assert verify("echo 1.5", tmp_path).error == "the verifier printed 1.5: a score is a number in [0, 1]"


def test_rollout_logprobs_are_the_forward_of_the_weights_that_sampled_them_step_after_step(kit, tmp_path):
    """2 steps × 2 tasks × 2 sessions sampled from the kit model through the gateway by a harness
    process. Each step's rollout logprobs equal a plain forward of the weights the step started from
    (step 0: the kit's; step 1: the checkpoint after step 0's update) within 1e-5 — and not of the
    weights before the update (so the sync, not luck, makes them equal)."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        {"id": "one", "prompt": "Say something.", "verifier": CRC},
        {"id": "two", "prompt": "Say something else.", "verifier": CRC}])
    result = train(config(kit, tmp_path, tasks, steps=2), progress=False)
    run = tmp_path / "run"
    assert [m["sessions"] for m in result.metrics] == [4, 4]
    assert [m["sessions_failed"] for m in result.metrics] == [0, 0]
    assert all(m["groups_with_signal"] == 1.0 and m["logprob_abs_diff"] < 1e-5 for m in result.metrics)
    gap0, n0 = plain_gap(kit[1], None, run / "rollouts" / "step-0.jsonl")
    gap1, n1 = plain_gap(kit[1], run / "checkpoints" / "step-000001", run / "rollouts" / "step-1.jsonl")
    stale, _ = plain_gap(kit[1], None, run / "rollouts" / "step-1.jsonl")
    assert n0 > 0 and n1 > 0 and gap0 <= 1e-5 and gap1 <= 1e-5, (gap0, gap1)
    assert stale > 1e-3, stale  # step 1 did not sample from the weights before the update
    # every session is one trained trajectory, none twice; the sessions file has a row per session
    ids = [t.id for s in (0, 1) for t in read_trajectories(run / "rollouts" / f"step-{s}.jsonl")]
    assert len(ids) == len(set(ids)) == 8
    rows = [json.loads(x) for s in (0, 1) for x in (run / "rollouts" / f"step-{s}.sessions.jsonl").read_text().splitlines()]
    assert sorted((r["task"], r["sample"]) for r in rows) == sorted([("one", 0), ("one", 1), ("two", 0), ("two", 1)] * 2)
    assert all(0 <= r["reward"] < 1 and r["failed"] is None for r in rows)


def test_failed_sessions_are_kept_with_their_reason_and_left_out_of_the_group(kit, tmp_path):
    """Task ``ok`` (scripted: read, write 7, done) passes; ``hang``'s harness never ends and is killed at
    its 3 s deadline; ``broken``'s verifier exits 2. 3 tasks × 2 = 6 sessions, 4 failed, 2 trained."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        {"id": "ok", "prompt": "Write the number.", "files": {"notes.txt": "7"},
         "verifier": "[ -f answer.txt ] && grep -qx 7 answer.txt"},
        {"id": "hang", "prompt": "HANG", "verifier": "true", "deadline": 3},
        {"id": "broken", "prompt": "Write the number.", "files": {"notes.txt": "7"}, "verifier": "exit 2"}])
    (tmp_path / "script.yaml").write_text(SCRIPT)
    result = train(config(kit, tmp_path, tasks, prompts_per_step=3, script=str(tmp_path / "script.yaml"),
                          max_new_tokens=128), progress=False)
    m = result.metrics[0]
    assert (m["sessions"], m["sessions_failed"], m["episodes"]) == (6, 4, 2)
    assert m["failed_reasons"] == {"deadline": 2, "the verifier exited 2": 2} and m["reward_mean"] == 1.0
    rows = [json.loads(x) for x in (tmp_path / "run" / "rollouts" / "step-0.sessions.jsonl").read_text().splitlines()]
    by_task = {r["task"]: r for r in rows}
    killed = re.match(r"deadline: the harness was killed after (\d+) s", by_task["hang"]["failed"])
    assert killed and int(killed[1]) >= 3, by_task["hang"]["failed"]  # 3 s, or more on a loaded machine
    assert by_task["hang"]["returncode"] is None and by_task["hang"]["calls"] == 0
    assert by_task["broken"]["calls"] == 3 and by_task["broken"]["reward"] is None
    trained = {t.meta["rl"]["task"]: (t.meta["rl"]["trained"], t.reward) for t in
               read_trajectories(tmp_path / "run" / "rollouts" / "step-0.jsonl")}
    assert trained == {"ok": (True, 1.0), "broken": (False, None)}  # kept in the records, out of the group


def test_kill_9_mid_step_resumes_from_the_checkpoint_and_collects_that_step_anew(kit, tmp_path):
    """A run killed (SIGKILL) while step 1's sessions run resumes from the checkpoint after step 0: step
    1's partial records move to rollouts/abandoned/, step 1 is collected again, and each step is
    logged and trained once."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "one", "prompt": "Say something.", "verifier": CRC},
                                                   {"id": "two", "prompt": "Say more.", "verifier": CRC}])
    code = textwrap.dedent(f"""
        from memorywalker.recipes.rl import RLConfig, train
        train(RLConfig(model={str(kit[1])!r}, tokenizer={str(kit[0])!r}, run_dir={str(tmp_path / 'run')!r},
                       tasks={str(tasks)!r}, harness={AGENT!r}, prompts_per_step=2, group_size=2, steps=3,
                       lr=1e-2, max_new_tokens=24, deadline=60, save_every=1, keep_checkpoints=5), progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TINY_AGENT_SLEEP": "1"},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journals = tmp_path / "run" / "rollouts" / "step-1" / "sessions"
    deadline = time.monotonic() + 240
    while not (journals.exists() and any(journals.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before step 1 collected"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    result = train(config(kit, tmp_path, tasks, steps=3, resume=True), progress=False)
    run = tmp_path / "run"
    (abandoned,) = (run / "rollouts" / "abandoned").iterdir()
    assert abandoned.name.startswith("step-1-") and (abandoned / "step-1" / "sessions").is_dir()
    assert [m["step"] for m in result.metrics] == [1, 2]
    logged = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0, 1, 2]
    ids = [t.id for s in (0, 1, 2) for t in read_trajectories(run / "rollouts" / f"step-{s}.jsonl")]
    assert len(ids) == len(set(ids)) == 12


def test_the_gpu_script_skips_cleanly_without_a_gpu():
    """CPU machines (CI) run it as a no-op that says why, exit status 0."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would run")
    script = Path(__file__).parents[1] / "scripts" / "gpu_harness_rl.py"
    p = subprocess.run([sys.executable, str(script), "--model", "/nonexistent"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "no GPU here" in p.stdout and "skipped" in p.stdout, p.stdout + p.stderr


def test_the_sandbox_sees_this_machines_files_read_only_and_writes_only_its_workdir_and_home(tmp_path):
    """Under bubblewrap a session reads any file here (a script under /tmp: this test's tmp_path), writes its
    workdir (at the fixed path), its HOME and $TMPDIR, and nothing else (/tmp and the script's folder are
    read-only)."""
    from memorywalker.gateway.harnesses import SANDBOX_WORK, sandbox_available, workspace

    if sandbox_available() is None:
        pytest.skip("bubblewrap is not installed")
    (tmp_path / "script.sh").write_text("echo from-script\n")
    ws = workspace(tmp_path / "work", sandbox=True)
    argv, cwd = ws.wrap(["bash", "-c", f"bash {tmp_path}/script.sh; pwd; echo a > here.txt; touch ~/h $TMPDIR/t && "
                                       f"echo written; touch /tmp/escape {tmp_path}/escape 2>/dev/null || echo refused"])
    p = subprocess.run(argv, cwd=cwd, env=ws.env({}), capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["from-script", str(SANDBOX_WORK), "written", "refused"], p.stderr
    assert (ws.workdir / "here.txt").read_text() == "a\n" and (ws.home / "h").exists()
    assert not (tmp_path / "escape").exists() and not Path("/tmp/escape").exists()
