"""Capture → SFT → RL inside a real harness, offline on the CPU: the whole pipeline with a kit model, or a
real model served with a tool template.

    MEMORYWALKER_HARNESS_BIN=.../node_modules/.bin python scripts/harness_rl.py --out runs/harness-rl
    MEMORYWALKER_HARNESS_BIN=... python scripts/harness_rl.py --model smollm2-135m --chat-template chatml \
        --harness codex --compact-at 6700 --filler-lines 40 --tasks 1 --sft-steps 8 --sft-lr 2e-4 --out runs/harness-rl-smollm2

1. **Capture.** Each task of a 2-task file runs once in the real harness (OpenCode by default) against
   the gateway with a scripted backend (read the task's file, write the answer, say done; the
   harness's compaction request answered with a summary), its auto-compaction moved low so the read
   pushes the session past it. The model scores every scripted response: by default a kit Llama of 65,536
   positions; ``--model`` a real one (SmolLM2-135M: 8,192 positions, a 49,152-token vocabulary, served under
   ``--chat-template chatml`` because its own template renders no tools; Codex's first prompt is 6,381 of
   its positions, so the task's file is short and the compaction point sits between that and the window).
2. **SFT.** The kit model is trained (``radix``, exact) on the captured main lines until it emits the
   task's tool calls: after training, every captured act call's response is decoded greedily from its
   recorded context and compared with the scripted one (``emitted_calls``).
3. **RL.** ``memorywalker rl`` with ``tasks=`` and ``harness=``: 2 GRPO steps of 2 tasks × 2 sessions, each
   session a real harness process sampling from the weights being trained, through the gateway.
4. **Check**, independently of the engine: each step's rollout logprobs against a plain ``model(input_ids)``
   forward per call of the weights that sampled them (the SFT model for step 0, the RL checkpoint
   after step 0 for step 1): the max |Δ| must be at the fp32 floor, which proves the weight sync.

Writes ``results.json`` and ``table.md`` under ``--out``. The reward may stay low: a 2-layer model of
hidden 64 copies what it was shown, and two GRPO steps move nothing measurable; the check is the pipeline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness_sessions import COMPACT_AT  # noqa: E402 — where each harness compacts for the kit tokenizer

TASKS = [("seven", "notes.txt", "answer.txt", "7"), ("nine", "data.txt", "result.txt", "9")]


def task_file(out: Path, tasks=TASKS, filler_lines: int = 150) -> Path:
    filler = "".join(f"line {i}: nothing to see here\n" for i in range(filler_lines))
    rows = [{"id": tid, "prompt": f"Read {src} and write the number in it to {dst}.",
             "files": {src: filler + f"The number is {n}.\n"}, "verifier": f"[ -f {dst} ] && grep -qx {n} {dst}", "deadline": 600}
            for tid, src, dst, n in tasks]
    path = out / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def script_for(harness: str, src: str, dst: str, n: str) -> str:
    """The scripted session of one task: read, write, done; the harness's compaction request answered
    with a summary (matched by each harness's own summarization prompt)."""
    summary = f"Objective: write the number in {src} to {dst}. Read {src}: the number is {n}."
    if harness == "codex":
        steps = [f'{{name: exec_command, arguments: {{cmd: "cat {src}"}}}}',
                 f'{{name: exec_command, arguments: {{cmd: "echo {n} > {dst}"}}}}']
        match = '{last_user: "CONTEXT CHECKPOINT COMPACTION"}'
    elif harness == "claude-code":
        steps = [f'{{name: Read, arguments: {{file_path: "{{cwd}}/{src}"}}}}',
                 f'{{name: Write, arguments: {{file_path: "{{cwd}}/{dst}", content: "{n}\\n"}}}}']
        match = '{last_user: "CRITICAL: Respond with TEXT ONLY"}'
        summary = f"<summary>{summary}</summary>"
    else:
        steps = [f'{{name: read, arguments: {{filePath: "{{cwd}}/{src}"}}}}',
                 f'{{name: write, arguments: {{filePath: "{{cwd}}/{dst}", content: "{n}\\n"}}}}']
        match = '{system: "You are a context summarization agent"}'
    return "\n".join(["steps:", *(f"  - tool_calls: [{s}]" for s in steps), '  - text: "Done."', "rules:",
                      f"  - match: {match}", f'    text: "{summary}"', ""])


def capture(out: Path, harness: str, model: str, tok: str | None, tasks_path: Path, bin_dir: str | None,
            compact_at: int, chat_template: str | None):
    """One scripted session per task through the gateway; the main lines and the session rows."""
    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.harnesses import sandbox_available
    from memorywalker.gateway.rollouts import SessionJob, run_sessions
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.gateway.tasks import read_tasks

    tasks, _ = read_tasks(tasks_path)
    mains, rows = [], []
    for task, (_, src, dst, n) in zip(tasks, TASKS, strict=False):
        script = out / f"script-{task.id}.yaml"
        script.write_text(script_for(harness, src, dst, n))
        gw = build_gateway(model, f"scripted:{script}", out / "capture" / task.id, tokenizer=tok, harness=harness,
                           chat_template=chat_template)
        with BackgroundServer(gw) as url:
            (r,) = run_sessions(gw, url, [SessionJob(task, 0, f"capture-{task.id}")], harness, model="kit",
                                deadline_s=600, compact_tokens=compact_at, bin_dir=bin_dir,
                                sandbox=sandbox_available() is not None, workroot=out / "capture" / "work")
        if r.main is None:
            raise RuntimeError(f"capture of {task.id} made no call: {r.failed}: {r.harness_output[-500:]}")
        mains.append(r.main)
        rows.append(r.row())
    return mains, rows


def emitted_calls(model_dir: Path, trajectories) -> tuple[int, int]:
    """(act calls whose greedy response equals the recorded one, act calls): does the model emit them?"""
    from memorywalker.samplers.hf import HFPolicy

    policy = HFPolicy(str(model_dir), tokenizer=None, temperature=0.0, max_new_tokens=256)
    hits = total = 0
    for t in trajectories:
        for c in t.calls:
            if c.purpose != "act":
                continue
            policy.start(None)
            got = policy.generate(c.context_tokens, seed=0, max_new_tokens=len(c.response_tokens) + 8).token_ids
            hits += got == list(c.response_tokens)
            total += 1
    return hits, total


def reference_gap(model_dir: str | Path, weights_dir: Path | None, records: Path, temperature: float = 1.0) -> dict:
    """Max and mean |logp − rollout logp| over every trained call of a step's records, from a plain
    ``model(input_ids)`` forward per call of ``model_dir``'s model with ``weights_dir``'s checkpoint weights
    (its own when None). The tests' reference too: it shares no code with the engine it checks."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from memorywalker.records import read_trajectories

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if weights_dir is not None:
        model.load_state_dict(load_file(str(weights_dir / "model.safetensors")), strict=False)
    diffs = []
    for t in read_trajectories(records):
        if not t.meta["rl"]["trained"]:
            continue
        for c in t.calls:
            if not c.response_tokens or c.rollout_logprobs is None:
                continue
            ids = torch.tensor([list(c.context_tokens) + list(c.response_tokens)])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float() / temperature
            pos = torch.arange(len(c.context_tokens) - 1, ids.shape[1] - 1)
            logp = torch.log_softmax(logits[pos], -1).gather(1, ids[0, pos + 1].unsqueeze(1)).squeeze(1)
            diffs += (logp - torch.tensor(c.rollout_logprobs)).abs().tolist()
    return {"targets": len(diffs), "max": max(diffs, default=None), "mean": sum(diffs) / len(diffs) if diffs else None}


def main() -> None:
    from transformers import AutoTokenizer

    from memorywalker.modelkit.build import build_model, build_tokenizer
    from memorywalker.recipes.rl import RLConfig
    from memorywalker.recipes.rl import train as rl_train
    from memorywalker.recipes.sft import SFTConfig
    from memorywalker.recipes.sft import train as sft_train
    from memorywalker.train.model import resolve_dirs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/harness-rl"))
    ap.add_argument("--harness", default="opencode", choices=sorted(COMPACT_AT))
    ap.add_argument("--model", default=None, help="a model dir or packaged name (default: a kit Llama of 65,536 positions)")
    ap.add_argument("--chat-template", default=None, help="serve and train under this template (FILE or shipped NAME)")
    ap.add_argument("--compact-at", type=int, default=None, help="the harness's compaction point in prompt tokens "
                    "(default: the kit tokenizer's, scripts/harness_sessions.py)")
    ap.add_argument("--filler-lines", type=int, default=150, help="lines before the number in the task's file")
    ap.add_argument("--tasks", type=int, default=2, choices=range(1, len(TASKS) + 1), help="tasks (GRPO groups per step)")
    ap.add_argument("--sft-steps", type=int, default=120)
    ap.add_argument("--sft-lr", type=float, default=1e-2)
    ap.add_argument("--rl-steps", type=int, default=2)
    ap.add_argument("--rl-lr", type=float, default=1e-4)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--bin", default=None, help="the harness binary's dir (default: $MEMORYWALKER_HARNESS_BIN, PATH)")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        kit = out / "kit"
        if not (kit / "model" / "config.json").exists():
            build_model(kit / "model", build_tokenizer(kit / "tok"), max_positions=65536)
        model_dir, tok_dir, served = kit / "model", kit / "tok", "kit"
    else:
        model_dir, tok_dir = resolve_dirs(args.model)
        served = Path(args.model).name
    compact_at = args.compact_at or COMPACT_AT[args.harness]
    tasks = TASKS[:args.tasks]
    times = {}

    t0 = time.monotonic()
    tasks_path = task_file(out, tasks, args.filler_lines)
    mains, capture_rows = capture(out, args.harness, str(model_dir), str(tok_dir), tasks_path, args.bin, compact_at,
                                  args.chat_template)
    times["capture"] = time.monotonic() - t0

    t0 = time.monotonic()
    sft = sft_train(SFTConfig(model=str(model_dir), tokenizer=str(tok_dir), run_dir=str(out / "sft"),
                              method="radix", steps=args.sft_steps, batch_size=len(mains), lr=args.sft_lr,
                              save_every=args.sft_steps, chat_template=args.chat_template),
                    trajectories=mains, progress=False)
    times["sft"] = time.monotonic() - t0
    hits, total = emitted_calls(sft.final_dir, mains)

    t0 = time.monotonic()
    rl = rl_train(RLConfig(model=str(sft.final_dir), tokenizer=str(tok_dir), run_dir=str(out / "rl"),
                           tasks=str(tasks_path), harness=args.harness, compact_at=compact_at,
                           harness_bin=args.bin, prompts_per_step=len(tasks), group_size=args.group,
                           steps=args.rl_steps, lr=args.rl_lr, max_new_tokens=args.max_new_tokens, save_every=1,
                           keep_checkpoints=args.rl_steps + 1, deadline=600, served_model=served,
                           chat_template=args.chat_template), progress=False)
    times["rl"] = time.monotonic() - t0

    steps = []
    for m in rl.metrics:
        step = m["step"]
        weights = sft.final_dir if step == 0 else out / "rl" / "checkpoints" / f"step-{step:06d}"
        sessions = [json.loads(x) for x in (out / "rl" / "rollouts" / f"step-{step}.sessions.jsonl").read_text().splitlines()]
        steps.append({"step": step, "sessions": len(sessions), "failed": m["sessions_failed"],
                      "failed_reasons": m["failed_reasons"], "reward_mean": m["reward_mean"],
                      "calls_per_session": m["calls_per_session"], "compactions_per_session": m["compactions_per_session"],
                      "branches": [s["branches"] for s in sessions], "trainer_gap_mean": m.get("logprob_abs_diff"),
                      "reference_gap": reference_gap(model_dir, weights, out / "rl" / "rollouts" / f"step-{step}.jsonl"),
                      "trajectory_ids": [i for s in sessions for i in s["trajectories"]]})
    ids = [i for s in steps for i in s["trajectory_ids"]]
    results = {"harness": args.harness, "model": served, "chat_template": args.chat_template,
               "vocabulary": len(AutoTokenizer.from_pretrained(tok_dir)), "compact_at": compact_at, "capture": capture_rows, "sft_steps": args.sft_steps,
               "sft_loss_last": sft.metrics[-1]["loss"], "emitted_calls": [hits, total], "steps": steps,
               "unique_trajectories": len(set(ids)) == len(ids), "seconds": {k: round(v, 1) for k, v in times.items()}}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = ["| step | sessions | failed | reward | calls/session | compactions/session | rollout vs plain forward, max abs diff (mean) |",
             "|---|---|---|---|---|---|---|"]
    for s in steps:
        g = s["reference_gap"]
        gap = f"{g['max']:.1e} ({g['mean']:.1e}) over {g['targets']} targets" if g["targets"] else "no trained call"
        lines.append(f"| {s['step']} | {s['sessions']} | {s['failed']} | {s['reward_mean']} | {s['calls_per_session']:.1f} | "
                     f"{s['compactions_per_session']:.1f} | {gap} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"SFT: {args.sft_steps} steps, last loss {results['sft_loss_last']:.4f}; greedy emits {hits}/{total} "
          f"captured act calls exactly; seconds {results['seconds']}")


if __name__ == "__main__":
    main()
