"""GRPO inside a real harness with a real instruct model on one GPU, within a time budget; writes its table.

    MEMORYWALKER_HARNESS_BIN=.../node_modules/.bin python scripts/gpu_harness_rl.py \\
        --model /models/Qwen2.5-0.5B-Instruct --harness opencode --compact-at 9000 --out runs/gpu-harness-rl

The tasks are scripts/harness_rl.py's two (read a file, write the number in it to another; a verifier
checks it) unless ``--tasks FILE`` gives others. Each step samples ``--group`` sessions per task from the
weights being trained (``--engine hf``: the model object itself; ``vllm``: an in-process engine synced
after every update), verifies them, and takes a GRPO step on the exact trees (``radix``). Steps stop
when the next one would pass ``--budget`` seconds (default 480: 8 minutes). ``table.md`` and
``results.json`` get, per step: sessions, failed ones and why, reward, calls and compactions per
session, the trainer's mean |Δ logp| against the rollout logprobs, and seconds.

Without a GPU it prints why and exits 0 (CI and CPU machines skip it). The model must be a local Hugging
Face directory whose chat template renders tools (Qwen2.5 / Qwen3 instruct do); its positions must hold
the harness's prompts (docs/harness-rl.md: which prompts fit which model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a local Hugging Face instruct model directory")
    ap.add_argument("--harness", default="opencode", help="claude-code | codex | opencode | cmd:COMMAND")
    ap.add_argument("--tasks", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("runs/gpu-harness-rl"))
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
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

    if not torch.cuda.is_available():
        print("gpu_harness_rl: no GPU here (torch.cuda.is_available() is False): skipped")
        return 0
    import harness_rl

    from memorywalker.recipes.rl import RLConfig, train

    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks or harness_rl.task_file(args.out)
    n_tasks = sum(1 for line in Path(tasks).read_text().splitlines() if line.strip())
    history: list[dict] = []
    step = 0
    while step < args.steps:
        elapsed = time.monotonic() - started
        per_step = max((h["seconds"] for h in history), default=0.0)
        if history and elapsed + per_step > args.budget:
            break
        result = train(RLConfig(model=args.model, run_dir=str(args.out / "run"), tasks=str(tasks), harness=args.harness,
                                rollout_engine=args.engine, dtype=args.dtype, device="cuda", prompts_per_step=min(2, n_tasks),
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


if __name__ == "__main__":
    sys.exit(main())
