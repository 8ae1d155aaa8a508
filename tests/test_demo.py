"""The demo on a very small fixed-seed run: the qualitative relations the README reports.

What the run cannot show at this size (reward, how much SDCC training lowers eps_kl) is not asserted;
the relations below follow from how each method conditions the targets, not from training quality.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memorywalker.demo import METHODS, QUICK, results_table, run_demo

# A barely trained model answers malformed calls with short error observations, so the demo's own
# harness would rarely compress here; opencode at a tight budget compacts every episode.
TINY = replace(QUICK, hidden_size=64, num_layers=2, sft_episodes=8, sft_steps=6, rl_steps=1, rl_prompts=1,
               rl_group=2, eval_episodes=3, max_new_tokens=32, max_turns=4, suite="lookup", harness="opencode",
               budget=500)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    doc = run_demo(TINY, out, progress=False, log=lambda s: None)
    return out, doc


def test_outputs_are_written(demo):
    out, doc = demo
    saved = json.loads((out / "results.json").read_text())
    assert list(saved["methods"]) == list(METHODS)
    for r in saved["methods"].values():
        assert {"reward", "logprob_abs_diff", "logprob_abs_diff_heavy", "logprob_abs_diff_floor", "k3_kl",
                "logit_drift", "eps_kl", "tokens", "seconds"} <= set(r)
        assert 0.0 <= r["reward"] <= 1.0 and r["tokens"] > 0
    for name in ("gap_by_evictions.png", "reward.png", "gap_over_steps.png", "index.html"):
        assert (out / name).stat().st_size > 0
    assert all(m in results_table(doc) for m in METHODS)


def test_exact_methods_stay_at_the_floor(demo):
    _, doc = demo
    for m in ("logit-tree", "tree-mask"):
        r = doc["methods"][m]
        assert r["logprob_abs_diff"] < 1e-5 and r["logit_drift"] < 1e-5, m
        for view in ("logprob_abs_diff_by_branches", "logprob_abs_diff_by_evictions"):
            assert all(v is None or v < 1e-5 for v in r[view].values()), (m, view)


def test_dfs_gap_is_well_above_the_floor_and_grows_with_evictions(demo):
    _, doc = demo
    dfs = doc["methods"]["dfs"]
    assert dfs["logprob_abs_diff_floor"] < 1e-5  # before any branch dfs conditions like the rollout
    assert dfs["logprob_abs_diff"] > 1e-2
    assert dfs["logprob_abs_diff_heavy"] > dfs["logprob_abs_diff"]


def test_sdcc_is_below_dfs(demo):
    _, doc = demo
    assert doc["methods"]["sdcc"]["logprob_abs_diff"] < doc["methods"]["dfs"]["logprob_abs_diff"]
