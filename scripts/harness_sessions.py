"""Real harness sessions through the gateway, and the gap of each method on what they delivered.

    MEMORYWALKER_HARNESS_BIN=.../node_modules/.bin python scripts/harness_sessions.py --out runs/harness

Runs Claude Code, Codex CLI and OpenCode (the pinned npm versions) once each on the shipped scripted
session (read a file, run a command, write a file, show it, answer) with each harness's own
auto-compaction moved low, served by a kit Llama with 65,536 positions, and writes ``table.md`` and
``results.json``: per harness the calls, tool calls, branches by kind, and per method the mean
|logp_train − logp_rollout| overall, before any branch and after one, with the targets it trains.
Every number comes from this run. (The test ``tests/test_gateway_harnesses.py`` checks the same.)
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from pathlib import Path

PROMPT = "Read notes.txt, list the files, write out.txt, then show it."
COMPACT_AT = {"claude-code": 30250, "codex": 16000, "opencode": 17080}
METHODS = ["radix", "tree-mask", "logit-tree", "dfs", "rightmost"]


def main() -> None:
    import torch

    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.harnesses import PINNED, capture
    from memorywalker.metrics.gap import gap_report
    from memorywalker.modelkit.build import build_model, build_tokenizer
    from memorywalker.render import Renderer
    from memorywalker.train.model import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/harness-sessions"))
    ap.add_argument("--harness", action="append", choices=sorted(PINNED))
    args = ap.parse_args()
    out = args.out
    kit = out / "kit"
    if not (kit / "model" / "config.json").exists():
        build_model(kit / "model", build_tokenizer(kit / "tok"), max_positions=65536)
    lm, tok = load_model(str(kit / "model"), str(kit / "tok"), dtype="float32", device=torch.device("cpu"))
    results = {}
    for harness in args.harness or sorted(PINNED):
        script = resources.files("memorywalker.data").joinpath(f"harness-scripts/{harness}.yaml")
        gw = build_gateway(str(kit / "model"), f"scripted:{script}", out / harness, tokenizer=str(kit / "tok"),
                           harness=harness)
        t0 = time.monotonic()
        s = capture(harness, PROMPT, gw, files={"notes.txt": "hello\n"}, deadline_s=300,
                    compact_tokens=COMPACT_AT[harness])
        seconds = time.monotonic() - t0
        (traj,) = [t for t in s.trajectories if t.lineage.relation != "side"]
        table = traj.message_table()
        report = gap_report(lm, Renderer(tok), [traj], METHODS, drift=False)
        results[harness] = {
            "version": PINNED[harness], "exit": s.run.returncode, "seconds": round(seconds, 1),
            "calls": len(traj.calls), "side_calls": sum(len(t.calls) for t in s.trajectories) - len(traj.calls),
            "tool_calls": sum(len(table[c.response].tool_calls) for c in traj.calls),
            "summarization_calls": sum(c.purpose == "summarize" for c in traj.calls),
            "prompt_tokens": [len(c.context_tokens) for c in traj.calls], "branches": traj.meta["branches"],
            "gap": {m: {"targets": r["overall"]["targets"], "overall": r["overall"]["logprob_abs_diff"],
                        "floor": r["floor"]["logprob_abs_diff"],
                        "after": max((r["by_branches"][b]["logprob_abs_diff"] or 0) for b in ("1", "2", "3+"))}
                    for m, r in report.items()},
        }
        print(harness, json.dumps(results[harness]["branches"]), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "table.md").write_text(render(results))
    print(render(results))


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2e}" if x < 1e-3 else f"{x:.4f}"


def render(results: dict) -> str:
    lines = ["| harness | calls (+ side) | tool calls | compaction calls | branches | prompt tokens | seconds |",
             "|---|---|---|---|---|---|---|"]
    for h, r in results.items():
        branches = ", ".join(f"{k} {v}" for k, v in sorted(r["branches"].items()))
        lines.append(f"| {h} ({r['version'].rsplit('@', 1)[1]}) | {r['calls']} (+ {r['side_calls']}) | {r['tool_calls']} "
                     f"| {r['summarization_calls']} | {branches} | {min(r['prompt_tokens']):,}–{max(r['prompt_tokens']):,} "
                     f"| {r['seconds']} |")
    lines += ["", "mean |logp_train − logp_rollout| per target (targets trained), overall / before any branch / "
              "worst bucket after one:", "",
              "| method | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for m in METHODS:
        cells = [f"{fmt(r['gap'][m]['overall'])} / {fmt(r['gap'][m]['floor'])} / {fmt(r['gap'][m]['after'])} "
                 f"({r['gap'][m]['targets']})" for r in results.values()]
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
