"""A full disk or a refused write is the environment, not a bug (issue 27, failure 8): one line naming
the file, exit 2, nothing half-written left behind, the previous file kept.

Two ways to make writes fail: RLIMIT_FSIZE in a child process (any Linux, no privileges: a write past
the limit fails with EFBIG, "File too large", once SIGXFSZ is ignored), and a real full disk, a tiny
tmpfs, where the test may mount one (root); each failure path is the same OSError either way."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.fileio import as_os_error, atomic_write
from memorywalker.records.io import write_trajectories

runner = CliRunner()


def episodes(n: int) -> list:
    return [synthetic_trajectory(SyntheticSpec(turns=2, evictions=1, words=4, seed=i), f"e{i}") for i in range(n)]


def limited(max_bytes: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return preexec


def one_line(out: str, prog: str) -> str:
    """The error line (progress bars of the model load aside), from ``prog: error: `` on: a child
    process started with ``python -m`` names itself ``python -m memorywalker.cli.main sft``."""
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith(("Loading weights", "Writing model"))]
    errors = [ln for ln in lines if f" {prog}: error: " in ln]
    assert len(errors) == 1 and lines[-1] == errors[0], out
    assert "Traceback" not in out and "a bug" not in out, out
    return "memorywalker " + errors[0][errors[0].index(f"{prog}: error: "):]


def test_a_checkpoint_that_cannot_be_written_is_one_line_exit_2(tmp_path, kit):
    """Old code: "SafetensorError ... (a bug?)", exit 1. The kit model's weights are 0.7 MB; files may
    hold 300 KB: the checkpoint's model.safetensors fails, the error names it, the temporary folder is
    gone, the run dir keeps what it had (config.json, metrics.jsonl)."""
    data = tmp_path / "data.jsonl"
    write_trajectories(data, episodes(2))
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "sft", f"data={data}", f"model={kit[1]}",
                          f"tokenizer={kit[0]}", f"run_dir={run}", "steps=1", "batch_size=2", "--no-progress"],
                         capture_output=True, text=True, preexec_fn=limited(300_000), timeout=300)
    line = one_line(res.stdout + res.stderr, "sft")
    assert res.returncode == 2
    assert line.startswith(f"memorywalker sft: error: {run}/checkpoints/.tmp-step-000001-")
    assert line.endswith("/model.safetensors: File too large")
    assert list((run / "checkpoints").iterdir()) == []  # the temporary folder was removed
    assert json.loads((run / "metrics.jsonl").read_text())["step"] == 0


def test_an_import_that_cannot_be_written_keeps_the_previous_output(tmp_path):
    """Old code: "[Errno 28]" without the path, and a partial output file. The output (~60 KB) may not
    pass 20 KB: one line naming it, exit 2, the previous output unchanged, no temporary file left."""
    rows = []
    for i in range(40):
        rows += [{"type": "user", "uuid": f"u{i}", "parentUuid": f"a{i - 1}" if i else None, "sessionId": "s",
                  "message": {"role": "user", "content": f"question {i} " + "words " * 200}},
                 {"type": "assistant", "uuid": f"a{i}", "parentUuid": f"u{i}", "sessionId": "s",
                  "message": {"id": f"m{i}", "role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]}}]
    log = tmp_path / "s.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    res = subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "import", "claude-code", str(log), "-o", str(out)],
                         capture_output=True, text=True, preexec_fn=limited(20_000), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert one_line(res.stdout + res.stderr, "import") == f"memorywalker import: error: {out}: File too large"
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.rejects.jsonl", "s.jsonl"]


def test_atomic_write_keeps_the_previous_file_on_failure(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(path) as f:
        f.write("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_library_errors_that_wrap_a_system_error_name_the_path():
    from safetensors import SafetensorError

    e = as_os_error(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
                    "ckpt/model.safetensors")
    assert isinstance(e, OSError) and (e.errno, e.filename) == (28, "ckpt/model.safetensors")


# --- a real full disk ----------------------------------------------------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    """Mount a tmpfs of the requested size at tmp_path/disk (root only; skipped where not allowed)."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk-{size}"
        where.mkdir()
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode != 0:
            pytest.skip("this machine does not allow mounting a tmpfs")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:  # lazily: the failed run may still hold a file open there (its metrics.jsonl)
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.parametrize("size, file", [("256k", "model.safetensors"), ("1m", "optimizer.pt")])
def test_a_checkpoint_on_a_full_disk(tiny_disk, tmp_path, kit, size, file):
    """ENOSPC while writing the weights (safetensors' SafetensorError) or the optimizer state
    (torch.save's "unexpected pos" RuntimeError): both become "FILE: No space left on device", exit 2,
    and the temporary checkpoint folder is removed (its space given back)."""
    disk = tiny_disk(size)
    data = tmp_path / "data.jsonl"
    write_trajectories(data, episodes(2))
    run = disk / "run"
    res = runner.invoke(app, ["sft", f"data={data}", f"model={kit[1]}", f"tokenizer={kit[0]}", f"run_dir={run}",
                              "steps=1", "batch_size=2", "--no-progress"])
    assert res.exit_code == 2, res.output
    line = one_line(res.output, "sft")
    assert line.startswith(f"memorywalker sft: error: {run}/checkpoints/.tmp-step-000001-")
    assert line.endswith(f"/{file}: No space left on device")
    assert list((run / "checkpoints").iterdir()) == []


def test_an_import_on_a_full_disk(tiny_disk, tmp_path):
    disk = tiny_disk("64k")
    out = disk / "out.jsonl"
    out.write_text("previous\n")
    write_trajectories(tmp_path / "big.jsonl", episodes(1))
    rows = [{"type": "user", "uuid": "u", "parentUuid": None, "sessionId": "s",
             "message": {"role": "user", "content": "words " * 40000}},
            {"type": "assistant", "uuid": "a", "parentUuid": "u", "sessionId": "s",
             "message": {"id": "m", "role": "assistant", "content": [{"type": "text", "text": "ok"}]}}]
    log = tmp_path / "s.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["import", "claude-code", str(log), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert one_line(res.output, "import") == f"memorywalker import: error: {out}: No space left on device"
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in disk.iterdir()) == ["out.jsonl", "out.rejects.jsonl"]
