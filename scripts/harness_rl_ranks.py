"""GRPO inside real OpenCode on 2 gloo training ranks with a ``vllm serve`` the recipe starts, on the CPU:
scripted sessions, then the model's own; writes each run's per-step table.

    # in the vLLM venv (.ci/run builds it), with the real harnesses installed
    MEMORYWALKER_HARNESS_BIN=~/.cache/memorywalker/harnesses/node_modules/.bin \\
        python scripts/harness_rl_ranks.py --out runs/harness-rl-ranks

A kit Llama (head_dim 64, which vLLM's CPU attention takes; 32,768 positions for OpenCode's prompts of
the kit tokenizer) serves two tasks (scripts/harness_rl.py's "seven", twice under two ids) × 2 sessions
per step, one task per rank:

1. **scripted**: the sessions play scripts/harness_rl.py's OpenCode script (read, write, done; its
   compaction at ``COMPACT_AT`` answered with a summary), each response scored by the server (``script=``
   with ``rollout_engine=vllm-server``);
2. **sampled**: the model's own sessions, sampled by the server (a random model: what is measured is
   the loop, not the agent); the verifier scores sample 0 of a task 1 and the others 0.25 so that the
   weights move, and the rollout logprobs of step 1 are checked against a plain forward of the weights
   after step 0's update (checkpoint step 1) and of the weights before it.

``torchrun --nproc-per-node 2 -m memorywalker rl ... rollout_engine=vllm-server vllm_serve=1`` each
time; ``table.md`` and ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

CPU_ARGS = "--enforce-eager --kv-cache-memory-bytes 1073741824 --no-enable-chunked-prefill --max-num-batched-tokens 32768"
KEYS = ["step", "sessions", "sessions_failed", "reward_mean", "calls_per_session", "compactions_per_session",
        "logprob_abs_diff", "loss", "grad_norm", "weight_sync_seconds", "sync_max_abs_diff", "harness_seconds", "seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/harness-rl-ranks"))
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()

    import harness_rl
    from harness_sessions import COMPACT_AT

    from memorywalker.modelkit.build import build_model, build_tokenizer

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out / "tok")
    model = build_model(out / "model", tok, hidden_size=128, num_heads=2, num_kv_heads=1, max_positions=32768)
    seven = json.loads(harness_rl.task_file(out).read_text().splitlines()[0])
    by_tag = "grep -q -- '-0/v1' opencode.json && echo 1 || echo 0.25"  # the session's own tag, in its config
    tasks = {"scripted": [seven, {**seven, "id": "seven-b"}],
             "sampled": [{**seven, "verifier": by_tag}, {**seven, "id": "seven-b", "verifier": by_tag}]}
    script = out / "script.yaml"
    script.write_text(harness_rl.script_for("opencode", *harness_rl.TASKS[0][1:]))
    report: dict = {}
    for name, rows in tasks.items():
        path = out / f"tasks-{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        run = out / f"run-{name}"
        keys = {"model": model, "tokenizer": tok, "run_dir": run, "tasks": path, "harness": "opencode",
                "served_model": "kit", "rollout_engine": "vllm-server", "vllm_serve": 1, "vllm_serve_args": CPU_ARGS,
                "vllm_max_model_len": 32768, "prompts_per_step": 2, "group_size": 2, "concurrency": 2,
                "steps": args.steps, "save_every": 1, "keep_checkpoints": args.steps + 1, "deadline": 300,
                "compact_at": COMPACT_AT["opencode"]}
        keys |= {"script": script, "max_new_tokens": 256} if name == "scripted" else {"max_new_tokens": 16, "lr": 1e-2}
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "memorywalker", "rl",
               *(f"{k}={v}" for k, v in keys.items())]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{name}: rl exited {p.returncode}: {p.stderr[-3000:]}")
        metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        entry = {"wall_s": round(time.monotonic() - t0, 1), "steps": [{k: m.get(k) for k in KEYS} for m in metrics]}
        if name == "sampled":
            gap = harness_rl.reference_gap
            entry["step1_vs_updated_weights"] = gap(model, run / "checkpoints" / "step-000001", run / "rollouts" / "step-1.jsonl")
            entry["step1_vs_initial_weights"] = gap(model, None, run / "rollouts" / "step-1.jsonl")
        report[name] = entry
        print(name, json.dumps(entry), flush=True)
    lines = []
    for name, entry in report.items():
        lines += [f"**{name}** ({entry['wall_s']} s in all)", "", "| " + " | ".join(KEYS) + " |", "|" + "---|" * len(KEYS)]
        lines += ["| " + " | ".join(f"{s[k]:.3g}" if isinstance(s[k], float) else str(s[k]) for k in KEYS) + " |"
                  for s in entry["steps"]]
        for key in ("step1_vs_updated_weights", "step1_vs_initial_weights"):
            if key in entry:
                g = entry[key]
                lines.append(f"\n{key}: {g['targets']} targets, max |Δ logp| {g['max']:.3g}, mean {g['mean']:.3g}")
        lines.append("")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
