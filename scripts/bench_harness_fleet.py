"""Harness sessions per minute through the gateway: the in-process ``hf`` backend against a ``vllm serve``
fleet (``rollout_engine=vllm-server``'s), at several concurrencies, side by side in one run; and the
gateway's own share of each call on the fleet.

    # in the vLLM venv (.ci/run builds it), with the real harnesses installed
    MEMORYWALKER_HARNESS_BIN=~/.cache/memorywalker/harnesses/node_modules/.bin \\
        python scripts/bench_harness_fleet.py --model ~/.cache/memorywalker/models/smollm2-135m \\
        --harness opencode --concurrency 1,2,4,8 --sessions 8 --out runs/bench-harness-fleet

Each cell runs ``--sessions`` sessions of the task (OpenCode by default: a real harness process per
session, its real ~7K-token prompts) with ``--concurrency`` processes at once, through the same path as
``rl tasks=...`` (:func:`memorywalker.gateway.rollouts.run_sessions` against a
:class:`~memorywalker.gateway.core.Gateway`), and reports sessions per minute (wall clock), calls, and
per call the gateway's added latency: the round trip inside the gateway (``latency_s``) minus the
backend's own share (``sample_s``, a serial backend's queue included): rendering with the chat
template, tokenizing, parsing, journaling; the time a call waited behind another call of its own
session (``wait_s``: OpenCode sends its title call beside its first turn) is neither. ``hf`` samples in this process, one call at a time (the
model object a trainer would hold); ``vllm-server`` sends every call to ``--servers`` ``vllm serve``
processes started here (one session per server, all in flight). Default threads; the machine's CPUs
are shared by the harness processes, the gateway and the samplers, as in a run. Writes ``table.md``
and ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

CPU_ARGS = "--enforce-eager --kv-cache-memory-bytes 2147483648 --no-enable-chunked-prefill --max-num-batched-tokens 16384"


def cell(backend, renderer, args, harness: str, concurrency: int, out: Path, positions: int) -> dict:
    from memorywalker.gateway.core import Gateway
    from memorywalker.gateway.rollouts import SessionJob, run_sessions
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.gateway.tasks import HarnessTask
    from memorywalker.records import read_trajectories

    task = HarnessTask(id="bench", prompt="Read notes.txt and write the number in it to answer.txt.",
                       files={"notes.txt": "The number is 7.\n"}, verifier="[ -f answer.txt ] && grep -qx 7 answer.txt")
    shutil.rmtree(out, ignore_errors=True)  # a former run's journals and trajectories would be read as this one's
    gateway = Gateway(renderer, backend, out, model_name="bench", max_positions=positions,
                      max_new_tokens=args.max_new_tokens, harness=harness)
    jobs = [SessionJob(task, j, f"b{concurrency}-{j}") for j in range(args.sessions)]
    if hasattr(backend.policy, "start"):
        backend.policy.start(None)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mw-bench-") as tmp, BackgroundServer(gateway) as url:
        results = run_sessions(gateway, url, jobs, harness, model="bench", concurrency=concurrency,
                               deadline_s=args.deadline, workroot=Path(tmp))
    wall = time.perf_counter() - t0
    calls = [c for t in read_trajectories(out / "trajectories.jsonl") for c in t.calls] \
        if (out / "trajectories.jsonl").exists() else []
    journals = [json.loads(x) for p in sorted((out / "sessions").glob("*.jsonl.done")) for x in p.read_text().splitlines()]
    records = [r for r in journals if r.get("kind") == "call"]
    overhead = sorted(1000 * (r["latency_s"] - r["sample_s"] - r.get("wait_s", 0.0)) for r in records)
    waits = sorted(1000 * r.get("wait_s", 0.0) for r in records)
    sample = sorted(1000 * r["sample_s"] for r in records)
    failed = [r.failed for r in results if r.failed]
    return {"concurrency": concurrency, "sessions": len(results), "failed": len(failed),
            "failed_reasons": sorted({f.split(":")[0] for f in failed}), "wall_s": round(wall, 2),
            "sessions_per_min": round(60 * len(results) / wall, 2), "calls": len(records),
            "trajectory_calls": len(calls),
            "prompt_tokens_mean": round(statistics.fmean(len(r["context_tokens"]) for r in records)) if records else None,
            "response_tokens": sum(len(r["response_tokens"]) for r in records),
            "gateway_ms_p50": _q(overhead, 0.5), "gateway_ms_p95": _q(overhead, 0.95),
            "sample_ms_p50": _q(sample, 0.5), "sample_ms_p95": _q(sample, 0.95), "session_wait_ms_p95": _q(waits, 0.95)}


def _q(xs: list[float], q: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model dir (head_dim vLLM's CPU attention takes)")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--harness", default="opencode")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--sessions", type=int, default=8, help="sessions per cell")
    ap.add_argument("--backends", default="hf,vllm-server")
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--vllm-args", default=CPU_ARGS)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--deadline", type=float, default=600)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-harness-fleet"))
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from memorywalker.gateway.backends import FleetBackend, SamplerBackend
    from memorywalker.render import Renderer
    from memorywalker.samplers.hf import HFPolicy
    from memorywalker.samplers.vllm_server import ServerFleet, start_servers

    tok_dir = args.tokenizer or args.model
    renderer = Renderer(AutoTokenizer.from_pretrained(tok_dir))
    stop = sorted(renderer.eot_ids)
    config = json.loads((Path(args.model) / "config.json").read_text())
    positions = int(config.get("max_position_embeddings", 8192))
    levels = [int(x) for x in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    for name in args.backends.split(","):
        if name == "hf":
            policy = HFPolicy(args.model, tokenizer=renderer.tok, temperature=1.0, dtype="float32", stop_ids=stop,
                              max_new_tokens=args.max_new_tokens)
            backend, servers = SamplerBackend("hf", policy, concurrent=False), None
        elif name == "vllm-server":
            servers = start_servers(args.model, args.servers, log_dir=args.out / "vllm-serve", served_name="bench",
                                    tokenizer=tok_dir, max_model_len=positions, args=args.vllm_args)
            urls = servers.__enter__()
            backend = FleetBackend(ServerFleet(urls, model="bench", stop_ids=stop, max_new_tokens=args.max_new_tokens,
                                               timeout=args.deadline))
        else:
            raise SystemExit(f"unknown backend {name!r}: hf | vllm-server")
        try:
            for c in levels:
                row = {"backend": name, **cell(backend, renderer, args, args.harness, c, args.out / f"{name}-c{c}", positions)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            if servers is not None:
                servers.__exit__(None, None, None)

    lines = [f"Harness sessions per minute through the gateway ({args.harness}, {args.sessions} sessions per cell, "
             f"max_new_tokens {args.max_new_tokens}; {Path(args.model).name}; {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()})", "",
             "| backend | concurrency | sessions/min | vs hf | failed | calls | prompt tokens (mean) | "
             "gateway ms p50 / p95 | sampler ms p50 / p95 |", "|---|---|---|---|---|---|---|---|---|"]
    hf = {r["concurrency"]: r["sessions_per_min"] for r in rows if r["backend"] == "hf"}
    for r in rows:
        ratio = f"{r['sessions_per_min'] / hf[r['concurrency']]:.2f}×" if hf.get(r["concurrency"]) else "-"
        lines.append(f"| {r['backend']} | {r['concurrency']} | {r['sessions_per_min']} | {ratio} | {r['failed']} | "
                     f"{r['calls']} | {r['prompt_tokens_mean']} | {r['gateway_ms_p50']} / {r['gateway_ms_p95']} | "
                     f"{r['sample_ms_p50']} / {r['sample_ms_p95']} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
