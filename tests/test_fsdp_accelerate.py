"""The shipped ``accelerate launch`` FSDP config runs: ``accelerate launch --config_file
configs/accelerate_fsdp.yaml -m memorywalker sft ... parallel=fsdp`` trains 2 steps on 2 CPU processes
and gives the losses, gradient norms and final weights of the same run under ``torchrun``, and of one
process; without ``parallel=fsdp`` the config is refused in one line.

Each launch starts 2 Python processes (about 15 s apart from the model's import), so the file is
slow-marked and run by ``.ci/run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.records.io import write_trajectories
from memorywalker.samplers.http import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "accelerate_fsdp.yaml"
CALLS = [2, 9, 4, 12]  # trees of different sizes: the ranks run different numbers of passes


def _sft_args(kit, data: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["-m", "memorywalker", "sft", "--no-progress", f"model={kit[1]}", f"tokenizer={kit[0]}",
            f"data={data}", f"run_dir={run_dir}", "steps=2", "batch_size=4", "lr=0.1", "adam_eps=1.0", *extra]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(kit, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("accelerate")
    write_trajectories(root / "data.jsonl", [
        synthetic_trajectory(SyntheticSpec(turns=n, evictions=n // 4 or 1, words=6, seed=i), f"ep-{i}")
        for i, n in enumerate(CALLS)])
    launches = {
        "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
                       "--main_process_port", str(free_port())],
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                     "--master-port", str(free_port())],
        "one": [sys.executable],
    }
    for name, launch in launches.items():
        extra = () if name == "one" else ("parallel=fsdp",)
        done = _run([*launch, *_sft_args(kit, root / "data.jsonl", root / name, *extra)])
        assert done.returncode == 0, f"{name}:\n{done.stderr[-3000:]}"
        (root / f"{name}.stdout").write_text(done.stdout)
    return root


@pytest.mark.slow
def test_accelerate_fsdp_config_equals_torchrun_and_one_process(runs):
    """Both launchers ran 2 sharded ranks (a DCP checkpoint, empty passes on the rank with the smaller
    trees) and logged the same losses and gradient norms (the same computation: bitwise, checked to
    1e-6); one process on the whole batch gives them to 1e-5, and the final weights agree to 1e-5 of the
    largest."""
    acc, tr, one = (_metrics(runs / n) for n in ("accelerate", "torchrun", "one"))
    assert len(acc) == len(tr) == len(one) == 2
    for a, t, o in zip(acc, tr, one, strict=True):
        assert a["empty_forwards"] > 0 and t["empty_forwards"] == a["empty_forwards"]  # 2 ranks, uneven trees
        for key in ("loss", "grad_norm"):
            assert a[key] == pytest.approx(t[key], rel=1e-6) and a[key] == pytest.approx(o[key], rel=1e-5), key
    for name in ("accelerate", "torchrun"):
        summary = [ln for ln in (runs / f"{name}.stdout").read_text().splitlines() if ln.startswith("sft: 2 steps")]
        assert len(summary) == 1, summary  # printed by rank 0 only
        manifest = json.loads(next((runs / name / "checkpoints").glob("step-*/manifest.json")).read_text())
        assert manifest["format"] == "dcp", name
    wa, wt, wo = (load_file(str(runs / n / "final" / "model.safetensors")) for n in ("accelerate", "torchrun", "one"))
    assert set(wa) == set(wt) == set(wo)
    biggest = max(v.abs().max().item() for v in wo.values())
    for k in wa:
        assert torch.equal(wa[k], wt[k]), k
        assert (wa[k] - wo[k]).abs().max().item() <= 1e-5 * biggest, k


@pytest.mark.slow
def test_accelerate_fsdp_config_without_parallel_fsdp_is_refused_in_one_line(kit, runs, tmp_path):
    """The recipe shards the model itself: under the FSDP config without ``parallel=fsdp`` each rank stops
    with one line naming the fix (the CLI's exit 2), no traceback through memorywalker's code (the
    launcher prints its own, of the failed child)."""
    done = _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
                 "--main_process_port", str(free_port()), *_sft_args(kit, runs / "data.jsonl", tmp_path / "run")])
    assert done.returncode != 0
    line = ("python -m memorywalker sft: error: accelerate launched this run with an FSDP config, but "
            "parallel='ddp': pass parallel=fsdp (the recipe shards the model itself)")
    assert done.stderr.splitlines().count(line) == 2, done.stderr[-2000:]  # one per rank
    assert "memorywalker/" not in "".join(ln for ln in done.stderr.splitlines(True) if ln.lstrip().startswith("File "))
