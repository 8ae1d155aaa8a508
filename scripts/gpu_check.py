"""The GPU check: one prepared command for a lent GPU's minutes (issue 54; format in docs/benchmarks.md).

    PYTHONPATH=src python scripts/gpu_check.py --out gpu-check                 # ~8 min on one H100
    PYTHONPATH=src python scripts/gpu_check.py --out /tmp/gc --tiny            # the same code, tiny, any device

Runs the ``gpu``-marked tests (pytest -m gpu), then every method of ``bench engines`` forward + backward
on a random model of a real shape (fp32, then the same weights in bf16) over synthetic trees and a real
Claude Code session from the shared fixtures, under one time budget (a method that would overrun is a
row "skipped: budget", one that runs out of CUDA memory "skipped: out of memory"). Writes
``gpu_check.json`` and ``gpu_check.md`` to ``--out`` and prints where. Reads nothing from the network.
Exits 1 on a failing test or an exact method beyond its tolerance; skips are not failures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("MEMORYWALKER_FIXTURES", ROOT.parent / "shared" / "fixtures")) / "harness-logs"


def gpu_tests(out: Path) -> dict:
    """Outcome of every ``gpu``-marked test (passed / failed / skipped, with the skip or failure message)."""
    xml = out / "gpu-tests.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={xml}", str(ROOT / "tests")], cwd=ROOT, capture_output=True, text=True)
    tests = []
    for case in ET.parse(xml).getroot().iter("testcase") if xml.exists() else ():
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"skipped": "skipped"}.get(child.tag, "failed")
                message = (child.get("message") or "")[:300]
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "skipped")}
    failed = proc.returncode not in (0, 5) or counts["failed"] > 0  # 5: nothing collected
    return {"returncode": proc.returncode, "tests": tests, "failed": failed,
            "summary": f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
                       + ("" if tests else f" (pytest exit {proc.returncode}: {proc.stdout[-300:]})")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--tiny", action="store_true", help="the tiny plan (kit model, ~1K-token trees): CI, any device")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for the benchmark part (default: the plan's)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--no-tests", action="store_true", help="skip the pytest -m gpu step")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from memorywalker.bench import gpu_check as plans
    from memorywalker.bench.engines import _first_calls, bench_groups, model_shape
    from memorywalker.bench.gpu_check import PLANS, Budget, markdown, ratios, synthetic_tree
    from memorywalker.bench.gpu_check import violations as exactness_violations
    from memorywalker.bench.shapes import random_model
    from memorywalker.importers import run_import
    from memorywalker.layout import Batch
    from memorywalker.modelkit import default_kit
    from memorywalker.render import Renderer

    # --- setup: the plan, the device, the tests
    started = time.monotonic()
    plan = PLANS["tiny" if args.tiny else "full"]
    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                       else ("cpu" if args.device == "auto" else args.device))
    attention = "flex" if dev.type == "cuda" else "sdpa"  # FlexAttention has no backward on CPU
    args.out.mkdir(parents=True, exist_ok=True)
    tests = ({"returncode": None, "tests": [], "failed": False, "summary": "not run (--no-tests)"}
             if args.no_tests else gpu_tests(args.out))
    print(f"gpu tests: {tests['summary']}", flush=True)

    # --- the trees: synthetic (U x P/U), then the fixture session
    tok_dir, kit_model = default_kit()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    renderer = Renderer(tok)
    trees = []
    turns = {ratio: plans.turns_for(renderer, ratio) for ratio in plan.ratios}  # P/U barely depends on U
    for unique in plan.sizes:
        for ratio in plan.ratios:
            rt, words = synthetic_tree(renderer, unique, turns[ratio])
            trees.append((f"synthetic U~{unique} P/U~{ratio:g}", [[rt]], plan.sample_calls,
                          f"{turns[ratio]} calls, 1 eviction, {words} words per message"))
    session = FIXTURES / "claude-code" / plan.fixture
    if session.exists():
        traj = max(run_import("claude-code", [session]).trajectories, key=lambda t: len(t.calls))
        traj = _first_calls(traj, plan.fixture_calls)
        trees.append((f"claude-code {plan.fixture}", [[renderer.render(traj)]], plan.sample_calls and 4,
                      f"{len(traj.calls)} calls, {len(traj.evictions)} evictions"))
    else:
        trees.append((f"claude-code {plan.fixture}", None, None, f"skipped: fixture not found at {session}"))

    prepare_s = time.monotonic() - started
    print(f"{len(trees)} trees ready in {prepare_s:.0f} s", flush=True)

    # --- the model: built once from the shape's config, fp32 first, then the same weights in bf16
    model = random_model(plan.shape, tok, seed=0, kit_model_dir=kit_model, **plan.fields).to(dev)
    budget = Budget(plan.budget_s if args.budget_s is None else args.budget_s, cases=len(trees) * len(plan.dtypes))
    cases = []
    for dtype in plan.dtypes:
        model = model.to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
        for name, groups, sample, what in trees:
            case = {"name": name, "dtype": dtype, "tree": what}
            if groups is None or time.monotonic() >= budget.deadline:  # no tree, or no time for its reference
                budget.cases_left -= 1
                cases.append({**case, "skipped": what.removeprefix("skipped: ") if groups is None else "budget"})
                continue
            unique = len(Batch.from_groups(groups).trees[0])
            res = bench_groups(model, groups, methods=plans.methods(), attention=attention, max_tokens=plan.max_tokens,
                               repeats=plan.repeats, warmup=plan.warmup, seed=0, sample_calls=sample,
                               checkpoint_chunks=unique > plan.checkpoint_above, skip=budget.case(dtype, unique))
            for r in res["rows"]:
                if "skipped" not in r:
                    r["tokens_per_s"] = res["unique_tokens"] / res["trees"] / r["time_per_tree_s"]
                if r["method"] == "tree-mask" and unique > plan.max_tokens:
                    r["fallback"] = f"U > max_tokens {plan.max_tokens}: ran the radix schedule"
            case.update(res, p_over_u=round(res["per_call_tokens"] / res["unique_tokens"], 1),
                        checkpoint_chunks=unique > plan.checkpoint_above, ratios=ratios(res["rows"]))
            cases.append(case)
            done = [f"{r['method']} {1000 * r['time_per_tree_s']:.0f} ms" if "skipped" not in r
                    else f"{r['method']} skipped" for r in res["rows"]]
            print(f"{name} {dtype}: U = {unique}, " + ", ".join(done), flush=True)

    # --- the files
    result = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
        "plan": "tiny" if args.tiny else "full",
        "device": str(dev) if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "model": f"random {plan.shape}" + (f" {plan.fields}" if plan.fields else ""),
        "model_shape": model_shape(model),
        "tree_mask_attention": attention + ("" if dev.type == "cuda" else " (flex has no backward on CPU)"),
        "max_tokens": plan.max_tokens,
        "tolerance": plan.tolerance,
        "tests": tests,
        "prepare_s": round(prepare_s, 1),  # building the trees (rendering), on the host's CPU
        "total_s": round(time.monotonic() - started, 1),
        "cases": cases,
    }
    result["violations"] = [v for c in cases if "rows" in c for v in exactness_violations(c, plan.tolerance)]
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=2))
    (args.out / "gpu_check.md").write_text(markdown(result))
    print(f"wrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'}")
    for v in result["violations"]:
        print(f"exactness violation: {v}")
    return 1 if tests["failed"] or result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
