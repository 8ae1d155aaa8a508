"""The GPU check (scripts/gpu_check.py) at its tiny size on the CPU, so the command a lent GPU runs
keeps working between draws: its files, their structure and their numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memorywalker.bench.gpu_check import PLANS, Budget, best_candidates, methods

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, harness_logs):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MEMORYWALKER_FIXTURES": str(harness_logs.parent)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(out), "--tiny"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(out / "gpu_check.json") in proc.stdout  # it says where the files went
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_tiny_run_measures_every_method_exactly(tiny_run):
    """Every case x dtype has a measured row per method (nothing skipped at this size), positive time,
    tokens/s (U / time) and peak memory; the exact methods match plain per-call forwards within 1e-5 in
    fp32 (DESIGN.md's contract) and 1e-2 in bf16; dfs, which lets turns after the eviction see what
    was evicted, is off by more than the tolerance on every synthetic tree (each has one eviction)."""
    result, _ = tiny_run
    assert result["violations"] == [] and not result["tests"]["failed"]
    assert result["tree_mask_attention"].startswith("sdpa")  # flex has no backward on CPU
    cases = result["cases"]
    assert [(c["name"].split()[0], c["dtype"]) for c in cases] == [
        (n, d) for d in ("float32", "bfloat16") for n in ("synthetic", "synthetic", "claude-code")]
    for c in cases:
        rows = {r["method"]: r for r in c["rows"]}
        assert list(rows) == [*methods(), "plain-causal"] and "dfs" in rows
        assert all("skipped" not in r for r in rows.values())
        tol = 1e-5 if c["dtype"] == "float32" else 1e-2
        for m in [*best_candidates(), "per-call"]:
            assert rows[m]["max_abs_logprob_diff"] <= tol, (c["name"], c["dtype"], m)
        if c["name"].startswith("synthetic"):
            assert rows["dfs"]["max_abs_logprob_diff"] > tol
            assert rows["per-call"]["tokens"] == c["per_call_tokens"] > 2 * c["unique_tokens"]
        for r in rows.values():
            assert r["time_per_tree_s"] > 0 and r["peak_memory_mib"] > 0
            assert r["tokens_per_s"] == pytest.approx(c["unique_tokens"] / r["time_per_tree_s"])
        assert c["ratios"]["best_exact"] in best_candidates()
        assert all(v > 0 for k, v in c["ratios"].items() if k != "best_exact")


def test_tiny_trees_are_the_plans(tiny_run):
    """The synthetic trees are calibrated to the plan: U within 10 % of the size asked, P/U rising with
    the ratio asked; the fixture is the session's first 3 calls."""
    result, md = tiny_run
    plan = PLANS["tiny"]
    synthetic = [c for c in result["cases"] if c["name"].startswith("synthetic") and c["dtype"] == "float32"]
    assert all(abs(c["unique_tokens"] - plan.sizes[0]) <= 0.1 * plan.sizes[0] for c in synthetic)
    assert synthetic[0]["p_over_u"] < synthetic[1]["p_over_u"]
    fixture = next(c for c in result["cases"] if c["name"].startswith("claude-code"))
    assert fixture["calls"] == 3 and fixture["tree"].startswith("3 calls")
    assert md.count("| synthetic") >= 4 * 6 and "Exactness violations: 0" in md


def test_budget_skips_what_would_overrun():
    """A method whose cost on the previous case, scaled by (U ratio)^1.5, exceeds the case's share is
    skipped with the reason; past the deadline everything is."""
    budget = Budget(seconds=100.0, cases=2)
    budget.cost[("float32", "per-call")] = (1000, 40.0)  # 40 s at U = 1000
    skip = budget.case("float32", 4000)  # predicted 40 * 4^1.5 = 320 s > 50 s share
    assert skip("radix", []) is None
    assert skip("per-call", [{"method": "radix"}]).startswith("budget (predicted 320 s")
    assert Budget(seconds=0.0, cases=1).case("float32", 10)("radix", []).startswith("budget")
