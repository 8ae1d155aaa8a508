"""``memorywalker bench engines`` on a small synthetic batch: the documented JSON and its numbers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine_cases import one_thread
from memorywalker.cli.main import app

KEYS = {"method", "exact", "forwards", "backwards", "tokens", "tokens_per_tree", "time_per_tree_s", "times_s",
        "peak_memory_mib", "memory_kind", "max_abs_logprob_diff", "lost_targets"}


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
    assert {"config", "device", "model", "trees", "targets", "unique_tokens", "rows"} <= set(out)
    rows = {r["method"]: r for r in out["rows"]}
    assert list(rows) == ["per-call", "logit-tree", "tree-mask", "sdcc", "dfs", "rightmost", "plain-causal"]
    for r in rows.values():
        assert set(r) == KEYS and len(r["times_s"]) == 2 and r["time_per_tree_s"] > 0
    assert rows["per-call"]["max_abs_logprob_diff"] == 0.0
    assert rows["logit-tree"]["max_abs_logprob_diff"] <= 1e-5 and rows["tree-mask"]["max_abs_logprob_diff"] <= 1e-5
    assert rows["dfs"]["max_abs_logprob_diff"] > 1e-3 and rows["rightmost"]["lost_targets"] > 0
    U = out["unique_tokens"]
    assert rows["tree-mask"]["tokens"] == rows["dfs"]["tokens"] == rows["plain-causal"]["tokens"] == U
    assert rows["per-call"]["tokens"] > rows["logit-tree"]["tokens"] > U
    assert rows["tree-mask"]["forwards"] == rows["tree-mask"]["backwards"] == 1  # both trees in one buffer
    assert rows["logit-tree"]["forwards"] == 2 * (2 + 1)  # K + 1 segments per tree
    assert rows["sdcc"]["backwards"] == 1 and rows["sdcc"]["forwards"] == 2 + 2 * 2  # full views + students
    assert rows["per-call"]["forwards"] == 2 * 4


def test_bench_rejects_unknown_methods(cache):
    res = CliRunner().invoke(app, ["bench", "engines", "--methods", "tree-mask,bfs"])
    assert res.exit_code != 0
    assert "bfs" in res.output and "logit-tree" in res.output
