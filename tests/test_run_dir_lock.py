"""One process owns a run dir (issue 27, failure 2): a second ``sft`` (or a second ``--resume``) on the
same run dir while the first runs is refused with one line naming the owner; a lock left by a killed
run is taken over with a message; the first run's history stays whole."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.records.io import write_trajectories
from memorywalker.train.rundir import LOCK_NAME, RunDirInUse, RunDirLock

runner = CliRunner()


def sft_args(kit, data: Path, run: Path, *extra: str) -> list[str]:
    return ["sft", f"data={data}", f"model={kit[1]}", f"tokenizer={kit[0]}", f"run_dir={run}", "batch_size=2",
            "save_every=2", "lr=0.005", "--no-progress", *extra]


def start(kit, data: Path, run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "memorywalker.cli.main", *sft_args(kit, data, run, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_lock(run: Path, proc: subprocess.Popen, timeout: float = 120.0) -> dict:
    """The lock file's owner once ``proc`` holds it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            owner = json.loads((run / LOCK_NAME).read_text() or "null")
        except (OSError, ValueError):
            owner = None
        if owner and owner["pid"] == proc.pid:
            return owner
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    raise AssertionError("the run never took its lock")


def metric_steps(run: Path) -> list[int]:
    return [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    write_trajectories(path, [synthetic_trajectory(SyntheticSpec(turns=2, evictions=1, words=4, seed=i), f"e{i}")
                              for i in range(2)])
    return path


def test_a_second_sft_on_a_running_run_dir_is_refused_in_one_line(tmp_path, kit, data):
    """Old code: two sft into one run_dir both exited 0, metrics.jsonl held every step twice and
    config.json named one of them; two --resume at once duplicated steps. The first run is stopped
    (SIGSTOP) while it holds the lock, so the second surely runs while the first is alive: a fresh
    start and a resume are both refused with one line naming pid and host. The first then finishes:
    every step once. A process killed (SIGKILL) while holding the lock leaves a stale lock file that the
    next --resume takes over, saying whose it was; it completes the run, every step still once."""
    run = tmp_path / "run"
    first = start(kit, data, run, "steps=4")
    owner = wait_for_lock(run, first)
    assert owner["host"] == socket.gethostname() and owner["command"] == "memorywalker sft"
    os.kill(first.pid, signal.SIGSTOP)
    try:
        for extra in ([], ["--resume"]):
            res = runner.invoke(app, sft_args(kit, data, run, "steps=4", *extra))
            lines = [ln for ln in res.output.splitlines() if ln.strip()]
            assert res.exit_code == 2 and len(lines) == 1, res.output
            assert lines[0].startswith(f"memorywalker sft: error: run_dir {run} is in use by pid {first.pid} on host "
                                       f"{socket.gethostname()} (memorywalker sft, since ")
            assert lines[0].endswith("): wait for it to finish or choose another run_dir")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    assert metric_steps(run) == list(range(4))
    assert json.loads((run / "config.json").read_text())["steps"] == 4
    assert (run / LOCK_NAME).read_text() == ""  # released: no owner left to take over from

    holder = hold(run)  # a process that takes the lock and is killed with it (SIGKILL: no release)
    holder.kill()
    holder.wait()
    res = runner.invoke(app, sft_args(kit, data, run, "steps=6", "--resume"))
    assert res.exit_code == 0, res.output
    assert f"taking over the lock left by pid {holder.pid} on host {socket.gethostname()}" in res.output
    assert metric_steps(run) == list(range(6))


def test_the_lock_within_one_process_and_a_stale_owner(tmp_path, capsys):
    """A process cannot take a run dir twice (two threads, or a nested train()); a released lock is
    empty and can be taken again silently; an owner recorded by a process that no longer holds the
    lock (here: a host that does not exist) is named when its lock is taken over."""
    lock = RunDirLock.acquire(tmp_path / "run", "memorywalker sft")
    with pytest.raises(RunDirInUse, match=rf"is in use by this process \(pid {os.getpid()}, pid {os.getpid()} on host "):
        RunDirLock.acquire(tmp_path / "run")
    lock.release()
    assert (tmp_path / "run" / LOCK_NAME).read_text() == ""
    RunDirLock.acquire(tmp_path / "run").release()
    assert capsys.readouterr().err == ""
    (tmp_path / "run" / LOCK_NAME).write_text(json.dumps({"pid": 4242, "host": "gone.example", "command": "memorywalker rl",
                                                          "since": "2025-01-01T00:00:00+0000"}))
    RunDirLock.acquire(tmp_path / "run").release()
    assert capsys.readouterr().err.startswith(f"{tmp_path / 'run'}: taking over the lock left by pid 4242 on host "
                                              "gone.example (memorywalker rl, since 2025-01-01T00:00:00+0000)")


def hold(run: Path) -> subprocess.Popen:
    """A plain process (no model) that takes ``run``'s lock and keeps it until it is killed."""
    code = ("import time; from memorywalker.train.rundir import RunDirLock; "
            f"RunDirLock.acquire({str(run)!r}, 'holder'); print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_lock_held_by_another_live_process_names_it(tmp_path):
    """The same refusal from a plain process that holds the lock (no model involved)."""
    holder = hold(tmp_path / "run")
    try:
        with pytest.raises(RunDirInUse, match=rf"is in use by pid {holder.pid} on host .* \(holder, since "):
            RunDirLock.acquire(tmp_path / "run")
    finally:
        holder.kill()
        holder.wait()
    RunDirLock.acquire(tmp_path / "run").release()  # the kernel dropped the dead holder's lock
