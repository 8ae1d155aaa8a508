"""The SFT recipe: every parameter learns, the loss falls on a memorizable set, gradient accumulation
and 2-process data parallelism give the update of one pass, and a SIGKILLed run resumes bitwise."""

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

from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.recipes.sft import SFTConfig, train
from memorywalker.records.io import write_trajectories
from ranks import spawn


def episodes(n: int, words: int = 6) -> list:
    """Short synthetic agent episodes (3 calls, 1 eviction each: two segments per tree)."""
    return [synthetic_trajectory(SyntheticSpec(turns=3, evictions=1, words=words, seed=i), f"ep-{i}") for i in range(n)]


def config(kit, run_dir, **kw) -> SFTConfig:
    return SFTConfig(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(run_dir), **kw)


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / "final" / "model.safetensors"))


@pytest.mark.parametrize("method", ["tree-mask", "sdcc"])
def test_every_parameter_changes_after_one_step(kit, tmp_path, method, capsys):
    before = load_file(str(Path(kit[1]) / "model.safetensors"))
    result = train(config(kit, tmp_path, method=method, steps=1, batch_size=2, lr=1e-3), trajectories=episodes(2),
                   progress=False)
    n = sum(len(t.calls) for t in episodes(2))
    assert f"sft: calls left out: none of {n}" in capsys.readouterr().out  # every call of the expert's trains
    after = weights(tmp_path)
    assert set(after) == set(before)
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []
    assert result.steps == 1 and len(result.metrics) == 1 and result.metrics[0]["targets"] > 0


def test_loss_falls_on_a_memorizable_set(kit, tmp_path):
    """Two episodes, full batch, lr 3e-3: eight steps of plain memorization. The curve is pinned (1 %)
    and must fall every step, by more than a quarter overall."""
    result = train(config(kit, tmp_path, steps=8, batch_size=2, lr=3e-3), trajectories=episodes(2), progress=False)
    curve = [m["loss"] for m in result.metrics]
    assert all(b < a for a, b in zip(curve, curve[1:], strict=False)), curve
    assert curve[-1] < 0.75 * curve[0], curve
    assert curve == pytest.approx(PINNED_CURVE, rel=1e-2)
    # metrics.jsonl holds the same rows, one per step
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 8


PINNED_CURVE = [6.6749, 6.3833, 6.0673, 5.7281, 5.4622, 5.2408, 4.9685, 4.7212]


def test_until_ends_the_run_at_the_first_checkpoint_it_accepts(kit, tmp_path):
    """steps=6, save_every=2, ``until`` true from step 4: it is asked at steps 2 and 4, the run ends at 4
    (4 metric rows, ``steps`` 4 in the result and in final/), and the final weights are bitwise those of a
    run of steps=4 (the lr is constant after warmup, so stopping early is that run)."""
    asked = []

    def until(model, step):
        asked.append(step)
        return step >= 4

    result = train(config(kit, tmp_path / "until", steps=6, save_every=2, batch_size=2, lr=1e-3),
                   trajectories=episodes(4), progress=False, until=until)
    assert asked == [2, 4] and result.steps == 4 and len(result.metrics) == 4
    assert json.loads((tmp_path / "until" / "final" / "memorywalker.json").read_text())["steps"] == 4
    train(config(kit, tmp_path / "four", steps=4, save_every=2, batch_size=2, lr=1e-3), trajectories=episodes(4),
          progress=False)
    a, b = weights(tmp_path / "until"), weights(tmp_path / "four")
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- same update: 1 micro-batch, 2 micro-batches, 2 data-parallel ranks ---------------------------------

SAME_UPDATE = dict(steps=1, batch_size=4, lr=1e-2, adam_eps=1e-4)


def _dp_worker(rank: int, world: int, kit, run_dir: str, normalization: str) -> None:
    train(config(kit, run_dir, **SAME_UPDATE, normalization=normalization), trajectories=episodes(4), progress=False)


@pytest.mark.parametrize("normalization", ["token", "trajectory"])
def test_grad_accumulation_and_data_parallel_give_the_same_update(kit, tmp_path, normalization):
    """One step on 4 episodes of unequal length (so token and trajectory normalization differ) as one
    micro-batch, as 2 micro-batches, and as 2 gloo ranks × 1 micro-batch: the same gradient norm (1e-5)
    and the same weights after the step (1e-4 of the step). AdamW's first step is lr·g/(|g| + ε): with
    the default ε = 1e-8 it would turn summation-order noise in near-zero gradient entries into
    sign flips, so these runs use ε = 1e-4 (the comparison of updates stays linear in g there)."""
    data = episodes(4)
    base = load_file(str(Path(kit[1]) / "model.safetensors"))
    one = train(config(kit, tmp_path / "one", **SAME_UPDATE, normalization=normalization),
                trajectories=data, progress=False)
    two = train(config(kit, tmp_path / "accum", **SAME_UPDATE, grad_accum=2, normalization=normalization),
                trajectories=data, progress=False)
    spawn(_dp_worker, kit, str(tmp_path / "dp"), normalization, log_dir=tmp_path / "ranks")

    ref = weights(tmp_path / "one")
    biggest = max((ref[k] - base[k]).abs().max().item() for k in base)
    assert biggest > 5e-3  # the step moved the weights by about lr
    for other in ("accum", "dp"):
        w = weights(tmp_path / other)
        diff = max(((w[k] - base[k]) - (ref[k] - base[k])).abs().max().item() for k in base)
        assert diff <= 1e-4 * biggest, (other, diff)
    dp = json.loads((tmp_path / "dp" / "metrics.jsonl").read_text())
    for m in (two.metrics[0], dp):
        assert m["loss"] == pytest.approx(one.metrics[0]["loss"], rel=1e-6)
        assert m["grad_norm"] == pytest.approx(one.metrics[0]["grad_norm"], rel=1e-5)
        assert m["targets"] == one.metrics[0]["targets"]


# --- kill -9 and resume -------------------------------------------------------------------------------

def _sft_cmd(data: Path, run_dir: Path, kit, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memorywalker.recipes.sft", f"data={data}", f"run_dir={run_dir}", f"model={kit[1]}",
            f"tokenizer={kit[0]}", "steps=12", "batch_size=2", "lr=5e-3", "save_every=3", "--no-progress", *extra]


def test_sigkill_then_resume_is_bitwise_identical(kit, tmp_path):
    data = tmp_path / "data.jsonl"
    write_trajectories(data, episodes(5))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    subprocess.run(_sft_cmd(data, tmp_path / "whole", kit), check=True, env=env, capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_sft_cmd(data, killed, kit), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (killed / "final").exists()  # it really died mid-run
    interrupted_at = latest.read_text().strip()
    assert interrupted_at != "step-000012"

    subprocess.run([*_sft_cmd(data, killed, kit), "--resume"], check=True, env=env, capture_output=True)
    a, b = weights(tmp_path / "whole"), weights(killed)
    assert set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a), interrupted_at
    # every step is logged exactly once across the kill
    steps = [int(ln.split('"step": ')[1].split(",")[0]) for ln in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(12))


def test_fresh_start_into_a_used_run_dir_is_refused(kit, tmp_path):
    train(config(kit, tmp_path, steps=1, batch_size=1), trajectories=episodes(1), progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        train(config(kit, tmp_path, steps=2, batch_size=1), trajectories=episodes(1), progress=False)
    result = train(config(kit, tmp_path, steps=2, batch_size=1, resume=True), trajectories=episodes(1), progress=False)
    assert [m["step"] for m in result.metrics] == [1]
