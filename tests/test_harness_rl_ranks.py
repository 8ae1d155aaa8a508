"""Harness RL on several training ranks (``torchrun --nproc-per-node 2 -m memorywalker rl tasks=...``),
against one process, with the small agent of tests/data/tiny_agent.py as the harness (real processes,
real gloo ranks; the real harnesses and a ``vllm serve`` fleet run the same loop in
tests/test_vllm_fleet.py):

* 2 ranks train what 1 rank trains: the same scripted sessions, the same losses, gradient norms and
  final weights to 1e-5, and one set of step records for the whole run;
* a rank SIGKILLed mid-step ends the job, and ``--resume`` continues from the last checkpoint without
  training that step's abandoned sessions (or any step) twice.

Each session's harness first writes its own base URL (``.../r/s{step}-t{task}-{sample}``) to
``session.txt`` and adds its tag to the prompt, and the verifier scores sample 0 of a task 1 and any
other 0.25: a group's rewards differ deterministically (advantages ±1 after the group's std, mean
reward 0.625) and its sessions' contexts differ, so their gradients do not cancel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memorywalker.recipes.rl import RLConfig, train
from memorywalker.records import read_trajectories
from memorywalker.samplers.http import free_port

# the session's tag into its prompt and session.txt: the sessions of a group see different contexts
AGENT = ("cmd:echo \"$MEMORYWALKER_BASE_URL\" > session.txt && "
         "MEMORYWALKER_PROMPT=\"$MEMORYWALKER_PROMPT (session ${MEMORYWALKER_BASE_URL##*/})\" "
         f"{sys.executable} {Path(__file__).parent / 'data' / 'tiny_agent.py'}")
VERIFIER = "grep -q -- '-0$' session.txt && echo 1 || echo 0.25"  # sample 0 of each task: 1; the others: 0.25
SCRIPT = """\
steps:
  - tool_calls: [{name: read_file, arguments: {path: notes.txt}}]
  - tool_calls: [{name: write_file, arguments: {path: answer.txt, content: "7"}}]
  - text: "Done."
"""


def setup_run(tmp_path: Path) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": t, "prompt": f"Read notes.txt ({t}) and write the number to answer.txt.",
                                         "files": {"notes.txt": "The number is 7.\n"}, "verifier": VERIFIER}) + "\n"
                             for t in ("one", "two")))
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    return tasks, script


def keys(kit, tasks: Path, script: Path | None, run_dir: Path, **kw) -> dict:
    return {"model": str(kit[1]), "tokenizer": str(kit[0]), "run_dir": str(run_dir), "tasks": str(tasks),
            "harness": AGENT, "prompts_per_step": 2, "group_size": 2, "lr": 1e-2, "max_new_tokens": 24,
            "deadline": 60, "save_every": 1, "keep_checkpoints": 5, "seed": 3,
            **({"script": str(script)} if script else {}), **kw}


def torchrun(args: dict, *extra: str, env: dict | None = None, **popen) -> subprocess.Popen:
    """``torchrun --nproc-per-node 2 -m memorywalker rl key=value ...`` (gloo on this CPU)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "memorywalker", "rl", *extra, *(f"{k}={v}" for k, v in args.items())]
    return subprocess.Popen(cmd, env={**os.environ, **(env or {})}, start_new_session=True, **popen)


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_train_what_one_rank_trains_and_write_one_record_per_step(kit, tmp_path, parallel):
    """The same two steps of 2 tasks × 2 scripted sessions on 1 process and on 2 gloo ranks (each rank its
    task and its group; replicated or sharded): per step the same loss and gradient norm, the same final
    weights, and per step one ``step-N.sessions.jsonl`` of 4 rows — each session once, rank 0's task first."""
    tasks, script = setup_run(tmp_path)
    # adam_eps=1 keeps Adam's update smooth in the gradient: with 1e-8 a gradient entry near 0 takes a
    # full ±lr step whose sign a rounding difference decides (the FSDP equality tests do the same)
    same = dict(steps=2, lr=0.1, adam_eps=1.0)
    one = train(RLConfig(**keys(kit, tasks, script, tmp_path / "one", **same)), progress=False)
    p = torchrun(keys(kit, tasks, script, tmp_path / "two", parallel=parallel, **same), stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-3000:]
    two = metrics_of(tmp_path / "two")
    assert [m["step"] for m in two] == [0, 1]
    for a, b in zip(one.metrics, two, strict=True):
        assert a["grad_norm"] > 1e-3, "a vacuous comparison: the sessions of a group must pull apart"
        assert abs(a["loss"] - b["loss"]) <= 1e-5 and abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * a["grad_norm"], (a, b)
        assert (a["reward_mean"], b["reward_mean"], b["episodes"], b["sessions"]) == (0.625, 0.625, 4, 4)
    w1, w2 = (load_file(tmp_path / d / "final" / "model.safetensors") for d in ("one", "two"))
    moved = max((w1[k] - load_file(kit[1] / "model.safetensors")[k]).abs().max().item() for k in w1)
    assert moved > 1e-4 and max((w1[k] - w2[k]).abs().max().item() for k in w1) <= 1e-6
    for step in (0, 1):
        rows = [json.loads(x) for x in (tmp_path / "two" / "rollouts" / f"step-{step}.sessions.jsonl").read_text().splitlines()]
        assert [(r["tag"], r["rank"], r["reward"], r["failed"]) for r in rows] == [
            (f"s{step}-t0-0", 0, 1.0, None), (f"s{step}-t0-1", 0, 0.25, None),
            (f"s{step}-t1-0", 1, 1.0, None), (f"s{step}-t1-1", 1, 0.25, None)]
        trajs = read_trajectories(tmp_path / "two" / "rollouts" / f"step-{step}.jsonl")
        assert sorted(t.meta["rl"]["session"] for t in trajs) == sorted(r["tag"] for r in rows)
        assert {t.meta["rl"]["rank"] for t in trajs} == {0, 1}
        assert (tmp_path / "two" / "rollouts" / f"step-{step}" / "rank-1" / "trajectories.jsonl").exists()


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` (RANK in its environment) training ``run_dir``."""
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:  # not a process, or one that ended
            continue
        if f"run_dir={run_dir}".encode() in cmd and f"RANK={rank}".encode() in env and b"torch.distributed.run" not in cmd:
            return int(d.name)
    return None


def test_a_rank_killed_mid_step_ends_the_job_and_resume_trains_no_step_twice(kit, tmp_path):
    """Rank 1 SIGKILLed while step 1's sessions run: torchrun ends the job (non-zero). ``--resume``
    continues from the checkpoint after step 0 on 2 ranks: step 1's partial records move to
    rollouts/abandoned/, steps 1 and 2 are collected and trained once each, every trajectory id once."""
    tasks, _ = setup_run(tmp_path)
    run = tmp_path / "run"
    args = keys(kit, tasks, None, run, steps=3)
    p = torchrun(args, env={"TINY_AGENT_SLEEP": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journals = run / "rollouts" / "step-1" / "rank-1" / "sessions"
    deadline = time.monotonic() + 300
    while not (journals.exists() and any(journals.iterdir())):
        assert p.poll() is None and time.monotonic() < deadline, "the run ended before step 1 collected"
        time.sleep(0.2)
    pid = _rank_pid(run, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=300) != 0
    assert [m["step"] for m in metrics_of(run)] == [0]
    p = torchrun(args, "--resume", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-3000:]
    (abandoned,) = (run / "rollouts" / "abandoned").iterdir()
    assert abandoned.name.startswith("step-1-") and (abandoned / "step-1" / "rank-1" / "sessions").is_dir()
    assert [m["step"] for m in metrics_of(run)] == [0, 1, 2]
    ids = [t.id for s in (0, 1, 2) for t in read_trajectories(run / "rollouts" / f"step-{s}.jsonl")]
    assert len(ids) == len(set(ids)) == 12


@pytest.mark.skipif(torch.cuda.is_available(), reason="gloo CPU ranks")
def test_prompts_per_step_must_split_over_the_ranks(kit, tmp_path):
    """3 tasks a step cannot be split over 2 ranks: one line, exit 2, before any session runs."""
    tasks, script = setup_run(tmp_path)
    p = torchrun(keys(kit, tasks, script, tmp_path / "run", steps=1, prompts_per_step=3), stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=300)
    assert p.returncode != 0 and "prompts_per_step=3 must be divisible by world_size × grad_accum = 2 × 1" in out
    assert not (tmp_path / "run" / "rollouts").exists()


def test_the_gpu_scripts_multi_rank_form_runs_at_tiny_size_on_the_cpu(kit, tmp_path):
    """``scripts/gpu_harness_rl.py --device cpu --ranks 2``: the form a lent GPU node runs (torchrun ranks,
    ``rl tasks=``), here with gloo and the small agent; it writes a table of one step of 2 tasks × 2 sessions."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "gpu_harness_rl.py"), "--device", "cpu",
                        "--ranks", "2", "--engine", "hf", "--model", str(kit[1]), "--tokenizer", str(kit[0]),
                        "--harness", AGENT, "--dtype", "float32", "--steps", "1", "--group", "2", "--max-new-tokens", "24",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "exit 0" and [s["step"] for s in results["steps"]] == [0]
    assert results["steps"][0]["sessions"] == 4 and "| step | sessions |" in (out / "table.md").read_text()
