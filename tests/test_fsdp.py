"""``parallel = "fsdp"`` on 2 gloo processes (CPU): FSDP2 steps equal the single-process step of the same
global batch for every exact method and both normalizations (SFT and RL); a run SIGKILLed after a
sharded checkpoint resumes to bitwise-identical weights; a 2-process sharded checkpoint resumes on one
process; ranks that disagree, or one that stops issuing collectives, fail with an error, not a hang.

All 2-process recipe runs share one spawn (module fixture): starting processes costs more than
the runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from memorywalker.engine import METHODS
from memorywalker.recipes import rl, sft
from memorywalker.records.io import write_trajectories
from memorywalker.train.checkpoint import verify_checkpoint
from ranks import spawn
from test_recipe_rl import even_token_share
from test_recipe_sft import episodes

EXACT = [name for name, m in METHODS.items() if m.exact]
NORMS = ["token", "trajectory"]
# AdamW's first step is lr·m̂/(√v̂ + ε); ε = 1 keeps the update linear in the gradient, so the
# comparison measures the gradient (fp32 summation order) instead of sign(g) on near-zero entries.
SFT = dict(steps=1, batch_size=4, lr=0.1, adam_eps=1.0)
RL = dict(steps=1, prompts_per_step=2, group_size=2, max_steps=2, max_new_tokens=8, budget=1024, lr=0.1, adam_eps=1.0)
RESUME = dict(batch_size=4, lr=0.05, adam_eps=1.0, save_every=1)  # 2 steps on 2 ranks, then 4 on 1


def sft_cfg(kit, run_dir, **kw):
    return sft.SFTConfig(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(run_dir), **kw)


def rl_cfg(kit, run_dir, **kw):
    return rl.RLConfig(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(run_dir), **kw)


def two_rank_cases(root: Path) -> list[tuple[str, object, dict]]:
    """(run dir, recipe, config kwargs) of every run the 2-process fixture makes."""
    cases = [(f"sft-{m}-{n}", sft, {**SFT, "method": m, "normalization": n}) for m in EXACT for n in NORMS]
    cases += [(f"rl-{m}-{n}", rl, {**RL, "method": m, "normalization": n}) for m in EXACT for n in NORMS]
    cases += [("sft-ckpt-radix-token", sft, {**SFT, "method": "radix", "activation_checkpointing": True}),
              ("sft-bf16-tree-mask-token", sft, {**SFT, "method": "tree-mask", "mixed_precision": "bfloat16"}),
              ("sft-resume-2-ranks", sft, {**RESUME, "steps": 2})]
    return cases


def _run(recipe, kit, run_dir, kw):
    if recipe is sft:
        return sft.train(sft_cfg(kit, run_dir, **kw), trajectories=episodes(4), progress=False)
    return rl.train(rl_cfg(kit, run_dir, **kw), reward_fn=even_token_share, progress=False)


def _worker(rank: int, world: int, kit, root: str) -> None:
    for name, recipe, kw in two_rank_cases(Path(root)):
        _run(recipe, kit, Path(root) / name, {**kw, "parallel": "fsdp"})


@pytest.fixture(scope="module")
def fsdp_runs(kit, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    spawn(_worker, kit, str(root), log_dir=root / "ranks")
    return root


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / "final" / "model.safetensors"))


def step_rel_diff(a: dict, b: dict, base: dict) -> tuple[float, float]:
    """max |Δa − Δb| / max |Δb| over every parameter (Δ = weights after − before), and max |Δb|."""
    biggest = max((b[k] - base[k]).abs().max().item() for k in base)
    diff = max((a[k] - b[k]).abs().max().item() for k in base)
    return diff / biggest, biggest


def last_metrics(run_dir) -> dict:
    return json.loads((Path(run_dir) / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.slow  # a 2-process spawn of every case: about 100 s on 2 cores
@pytest.mark.parametrize("recipe", ["sft", "rl"])
def test_fsdp_step_equals_the_single_process_step(kit, tmp_path, fsdp_runs, recipe):
    """For every exact method and both normalizations, one FSDP step on 2 ranks (each holding half of
    the global batch; RL: rolling out half of the tasks) moves every weight as the single-process
    step on the whole batch does, to 1e-5 of the largest move, with the same loss and gradient norm."""
    base = load_file(str(Path(kit[1]) / "model.safetensors"))
    torch.set_num_threads(1)
    for name, mod, kw in two_rank_cases(fsdp_runs):
        if not name.startswith(f"{recipe}-") or name.split("-")[1] in ("ckpt", "bf16", "resume"):
            continue
        ref = _run(mod, kit, tmp_path / name, kw).metrics[0]
        rel, biggest = step_rel_diff(weights(fsdp_runs / name), weights(tmp_path / name), base)
        assert biggest > 1e-3, name  # the step really moved the weights
        assert rel <= 1e-5, (name, rel)
        got = last_metrics(fsdp_runs / name)
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6), name  # GRPO on-policy: ~0
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5), name
        assert got["targets"] == ref["targets"], name
        if recipe == "rl":
            assert got["reward_mean"] == ref["reward_mean"] and got["episodes"] == 4, name


@pytest.mark.slow  # a 2-process spawn of every case: about 100 s on 2 cores
def test_activation_checkpointing_and_bf16_mixed_precision(kit, tmp_path, fsdp_runs):
    """Per-layer activation checkpointing recomputes the same function: the step equals the plain
    single-process one to 1e-5. bf16 mixed precision (bf16 compute, fp32 master weights and gradient
    reduction) gives a loss within 1 % of fp32's and a gradient norm within 5 %."""
    base = load_file(str(Path(kit[1]) / "model.safetensors"))
    torch.set_num_threads(1)
    ref = _run(sft, kit, tmp_path / "radix", {**SFT, "method": "radix"}).metrics[0]
    rel, _ = step_rel_diff(weights(fsdp_runs / "sft-ckpt-radix-token"), weights(tmp_path / "radix"), base)
    assert rel <= 1e-5, rel
    assert last_metrics(fsdp_runs / "sft-ckpt-radix-token")["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)

    ref = _run(sft, kit, tmp_path / "mask", {**SFT, "method": "tree-mask"}).metrics[0]
    got = last_metrics(fsdp_runs / "sft-bf16-tree-mask-token")
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-2)
    assert got["loss"] != ref["loss"]  # it really computed in bf16
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=5e-2)
    w = weights(fsdp_runs / "sft-bf16-tree-mask-token")
    assert all(v.dtype == torch.float32 for v in w.values())  # the export holds the fp32 master weights


@pytest.mark.slow  # a 2-process spawn of every case: about 100 s on 2 cores
def test_sharded_checkpoint_is_sealed_and_resumes_on_one_process(kit, tmp_path, fsdp_runs):
    """The 2-rank run wrote DCP checkpoints (one shard file per rank) sealed by a verifying manifest;
    resuming it on 1 process for 2 more steps ends where 4 single-process steps end (1e-5 of the
    total move) and reads the data position from the checkpoint."""
    two = fsdp_runs / "sft-resume-2-ranks"
    ckpt = two / "checkpoints" / "step-000002"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["format"] == "dcp"
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "rng.pt", "state.json"} <= set(manifest["files"])
    assert verify_checkpoint(ckpt) is None
    torch.set_num_threads(1)
    resumed = sft.train(sft_cfg(kit, two, **RESUME, steps=4, parallel="fsdp", resume=True), trajectories=episodes(4),
                        progress=False)
    assert [m["step"] for m in resumed.metrics] == [2, 3]
    whole = sft.train(sft_cfg(kit, tmp_path / "whole", **RESUME, steps=4), trajectories=episodes(4), progress=False)
    base = load_file(str(Path(kit[1]) / "model.safetensors"))
    rel, biggest = step_rel_diff(weights(two), weights(tmp_path / "whole"), base)
    assert biggest > 1e-3 and rel <= 1e-5, rel
    assert resumed.metrics[-1]["loss"] == pytest.approx(whole.metrics[-1]["loss"], rel=1e-5)


# --- SIGKILL after a sharded checkpoint, resume on 2 ranks ---------------------------------------------

def _torchrun(data: Path, run_dir: Path, kit, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "memorywalker.recipes.sft", f"data={data}", f"run_dir={run_dir}", f"model={kit[1]}",
            f"tokenizer={kit[0]}", "parallel=fsdp", "steps=6", "batch_size=4", "lr=5e-3", "save_every=2",
            "--no-progress", *extra]


@pytest.mark.slow  # a 2-process spawn of every case: about 100 s on 2 cores
def test_sigkill_after_a_sharded_checkpoint_then_resume_is_bitwise_identical(kit, tmp_path):
    data = tmp_path / "data.jsonl"
    write_trajectories(data, episodes(6))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(_torchrun(data, tmp_path / "whole", kit), check=True, env=env, capture_output=True)

    killed = tmp_path / "killed"
    # A session of its own: the SIGKILL goes to torchrun and both ranks (the group we started).
    proc = subprocess.Popen(_torchrun(data, killed, kit), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 180
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "final").exists()  # it really died mid-run
    interrupted_at = latest.read_text().strip()
    assert interrupted_at != "step-000006"

    subprocess.run([*_torchrun(data, killed, kit), "--resume"], check=True, env=env, capture_output=True)
    a, b = weights(tmp_path / "whole"), weights(killed)
    assert set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a), interrupted_at
    steps = [json.loads(ln)["step"] for ln in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(6))


# --- disagreement and stalls fail instead of hanging ----------------------------------------------------

def _stall_worker(rank: int, world: int, out: str) -> None:
    from memorywalker.train.fsdp import CollectiveError, check_agreement, collective_guard

    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    seen = {}
    try:
        check_agreement(micro_batches=2 + rank, step=7)
    except CollectiveError as e:
        seen["agreement"] = str(e)
    t0 = time.time()
    if rank == 0:  # rank 1 stops issuing collectives (a crashed or diverged peer)
        try:
            with collective_guard("step 7", 3):
                dist.all_reduce(torch.ones(1))
        except CollectiveError as e:
            seen["stall"] = str(e)
        seen["waited"] = time.time() - t0
    else:
        time.sleep(4)
    torch.save(seen, Path(out) / f"rank{rank}.pt")


def test_disagreeing_or_stalled_ranks_fail_with_a_named_cause(tmp_path):
    spawn(_stall_worker, str(tmp_path), log_dir=tmp_path)
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for seen in (r0, r1):
        assert "ranks disagree on micro_batches from 2 to 3" in seen["agreement"]
        assert "step" not in seen["agreement"].split("(")[0]  # step agreed
    assert "collective_timeout=3s" in r0["stall"] and "step 7" in r0["stall"]
    assert r0["waited"] < 30
