"""``memorywalker bench engines`` on a small synthetic batch: the documented JSON and its numbers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine_cases import one_thread
from memorywalker.cli.main import app
from memorywalker.engine import METHODS

KEYS = {"method", "exact", "forwards", "backwards", "tokens", "tokens_per_tree", "time_per_tree_s", "times_s",
        "peak_memory_mib", "memory_kind", "max_abs_logprob_diff", "lost_targets", "extrapolated"}


@pytest.fixture()
def cache(kit, kit_cache, monkeypatch):
    monkeypatch.setenv("MEMORYWALKER_CACHE", str(kit_cache))  # reuse the session's kit build
    return kit_cache


def test_bench_engines_json(cache):
    args = ["bench", "engines", "--turns", "4", "--evictions", "2", "--words", "5", "--trajectories", "2",
            "--repeats", "2", "--json", "-"]
    with one_thread():
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert {"config", "device", "model", "trees", "targets", "unique_tokens", "per_call_tokens", "calls",
            "reference_calls", "rows"} <= set(out)
    rows = {r["method"]: r for r in out["rows"]}
    assert list(rows) == [*METHODS, "plain-causal"]  # the registry's order
    for r in rows.values():
        assert set(r) == KEYS and len(r["times_s"]) == 2 and r["time_per_tree_s"] > 0 and not r["extrapolated"]
    for m in ("per-call", "logit-tree", "radix", "tree-mask"):  # vs plain model(input_ids) per call
        assert rows[m]["max_abs_logprob_diff"] <= 1e-5
    assert rows["dfs"]["max_abs_logprob_diff"] > 1e-3 and rows["rightmost"]["lost_targets"] > 0
    U = out["unique_tokens"]
    assert rows["radix"]["tokens"] == rows["tree-mask"]["tokens"] == rows["dfs"]["tokens"] == U
    assert rows["plain-causal"]["tokens"] == U
    assert rows["per-call"]["tokens"] == out["per_call_tokens"] > rows["logit-tree"]["tokens"] > U
    assert rows["tree-mask"]["forwards"] == rows["tree-mask"]["backwards"] == 1  # both trees in one buffer
    assert rows["radix"]["backwards"] == 1 < rows["radix"]["forwards"]  # one forward per level of the trees
    assert rows["logit-tree"]["forwards"] == 2 * (2 + 1)  # K + 1 segments per tree
    # sdcc: both full views in one forward, then its students read off the two trees as radix runs them
    assert rows["sdcc"]["backwards"] == 1 and rows["sdcc"]["forwards"] == 1 + rows["radix"]["forwards"]
    assert rows["sdcc"]["tokens"] > U
    assert rows["per-call"]["forwards"] == 2 * 4 == out["calls"] == out["reference_calls"]


def test_bench_samples_per_call_and_extrapolates(cache):
    """--sample-calls 3 of 8 calls: the reference and per-call cover 3 calls; per-call's time, passes and
    tokens are scaled to all 8 (time × 8/3) and the row says so."""
    args = ["bench", "engines", "--turns", "4", "--evictions", "2", "--words", "5", "--trajectories", "2",
            "--repeats", "1", "--sample-calls", "3", "--methods", "per-call,radix", "--no-plain-causal", "--json", "-"]
    with one_thread():
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    rows = {r["method"]: r for r in out["rows"]}
    assert list(rows) == ["per-call", "radix"] and out["reference_calls"] == 3 and out["calls"] == 8
    assert rows["per-call"]["extrapolated"] and not rows["radix"]["extrapolated"]
    assert rows["per-call"]["forwards"] == 8 and rows["per-call"]["tokens"] == out["per_call_tokens"]
    assert rows["per-call"]["max_abs_logprob_diff"] <= 1e-5 and rows["radix"]["max_abs_logprob_diff"] <= 1e-5


def test_bench_rejects_unknown_methods(cache):
    res = CliRunner().invoke(app, ["bench", "engines", "--methods", "radix,bfs"])
    assert res.exit_code != 0
    assert "bfs" in res.output and "logit-tree" in res.output


def test_bench_on_imported_trajectories(cache, harness_logs, tmp_path):
    """--data on a real (tool-heavy) Claude Code session cut to its first 3 of 4 calls: U and P are the tree's, the radix
    row is exact against plain per-call forwards on the 2 sampled calls, and per-call is extrapolated."""
    from memorywalker.importers import run_import
    from memorywalker.records import write_trajectories

    data = tmp_path / "cc.jsonl"
    write_trajectories(data, run_import("claude-code", [harness_logs / "claude-code" / "tool_heavy.jsonl"]).trajectories)
    args = ["bench", "engines", "--data", str(data), "--max-calls", "3", "--sample-calls", "2", "--repeats", "1",
            "--warmup", "0", "--methods", "per-call,radix", "--no-plain-causal", "--json", "-"]
    with one_thread():
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    rows = {r["method"]: r for r in out["rows"]}
    assert out["calls"] == 3 and out["reference_calls"] == 2 and out["config"]["max_calls"] == 3
    assert rows["radix"]["tokens"] == out["unique_tokens"] < out["per_call_tokens"] == rows["per-call"]["tokens"]
    assert rows["per-call"]["extrapolated"] and rows["radix"]["max_abs_logprob_diff"] <= 1e-5
