"""scripts/sdcc_sweep.py: its tables from a sweep document built by hand, and its refusal to reuse a
demo's GRPO result that its own SFT did not reproduce (the training itself is the demo's, tested in
test_demo.py)."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sdcc_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sdcc_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entry(rewards: list[float], rl: list[float] | None = None, steps: dict | None = None) -> dict:
    e = {"sft": {"rewards": {"claude-code": rewards}, "gap": {"claude-code": 0.0}}, "sft_seconds": 1.0}
    if rl is not None:
        e.update(rl={"rewards": {"claude-code": rl}, "gap": {"claude-code": 0.0}}, rl_seconds=1.0, rl_steps=steps)
    return e


def _steps(reward: list[float]) -> dict:
    return {"reward_mean": reward, "groups_with_signal": [1.0, 0.5], "logprob_abs_diff": [0.0, 0.0],
            "eps_kl_mean": [None, None]}


def _doc() -> dict:
    return {"config": {"variants": {"tree-mask": ["tree-mask", {}], "sdcc λ=0": ["sdcc", {}]}, "rl": ["tree-mask"]},
            "runs": {"0": {"results": {"tree-mask": _entry([1, 0], [1, 1], _steps([0.5, 0.7])),
                                       "sdcc λ=0": _entry([0, 0])}},
                     "1": {"results": {"tree-mask": _entry([1, 1], [1, 0], _steps([0.3, 0.1])),
                                       "sdcc λ=0": _entry([1, 0])}}}}


def test_sft_table_numbers(sweep):
    """tree-mask: seed means 0.5 and 1.0 -> 0.750 ± sd sqrt(2 * 0.25² / 1) = 0.354; sdcc λ=0: 0.0 and
    0.5 -> 0.250 ± 0.354. Paired diffs pooled over seeds: [0-1, 0-0, 1-1, 0-1] -> mean -0.500, every
    resampled mean in [-1, 0]. All-equal rewards [0, 0] have the interval [0.000, 0.000]."""
    text = sweep.table(_doc(), "sft")
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines() if line.startswith("| `")}
    assert "0.750 ± 0.354" in rows["tree-mask"] and rows["tree-mask"].endswith("| — |")
    assert "0.250 ± 0.354" in rows["sdcc λ=0"] and "0.000 [0.000, 0.000]" in rows["sdcc λ=0"]
    diff = rows["sdcc λ=0"].split(" | ")[-1].strip(" |")
    mean, interval = diff.split(" [")
    lo, hi = (float(x) for x in interval.rstrip("]").split(", "))
    assert float(mean) == -0.5 and -1.0 <= lo <= -0.5 <= hi <= 0.0
    assert text.startswith("Held-out reward after SFT under `claude-code` (2 tasks per seed")


def test_rl_tables_only_the_variants_that_ran_grpo(sweep):
    """After GRPO only tree-mask has results: seed means 1.0 and 0.5 -> 0.750 ± 0.354. Its steps: rollout
    reward (0.5+0.3)/2 = 0.400 at step 1, (0.7+0.1)/2 = 0.400 at step 2, min = max = 0.400; groups with
    variance 1.000 -> 0.500; eps_kl never measured (tree-mask has none) -> a dash."""
    doc = _doc()
    text = sweep.table(doc, "rl")
    assert "after GRPO" in text and "sdcc" not in text and "0.750 ± 0.354" in text
    steps = sweep.steps_table(doc)
    row = next(line for line in steps.splitlines() if line.startswith("| `tree-mask`"))
    assert row == ("| `tree-mask` | 0.400 → 0.400 (min 0.400, max 0.400) | 1.000 → 0.500 (min 0.500, max 1.000) "
                   "| 0.000 → 0.000 (min 0.000, max 0.000) | — |")
    del doc["runs"]["1"]["results"]["tree-mask"]["rl"]
    assert sweep.table(doc, "rl") == ""  # tree-mask must have GRPO on every seed to be the reference


def test_reused_grpo_refused_when_sft_differs(sweep, tmp_path, monkeypatch):
    """--prepared: a default-settings variant's GRPO comes from the demo's results.json only if this
    sweep's SFT of it gave the demo's per-task rewards; here the demo says [1, 0], the sweep [0, 0]."""
    import memorywalker.recipes.demo as demo

    prep_dir = tmp_path / "demo"
    seed_dir = prep_dir / "seed-0"
    (seed_dir / "warm" / "final").mkdir(parents=True)
    (seed_dir / "kit").mkdir()
    (seed_dir / "expert.jsonl").write_text("")
    from dataclasses import asdict, replace

    cfg = asdict(replace(demo.FULL, seed=0))
    evaluation = {"claude-code": {"rewards": [1, 0], "gap": 0.0}}
    (seed_dir / "results.json").write_text(json.dumps({
        "config": cfg, "warm_loss": 0.1,
        "methods": {"tree-mask": {"sft": evaluation, "rl": evaluation, "rl_steps": {}, "rl_seconds": 1.0}}}))
    calls = []

    def fake_map_jobs(jobs, workers):
        calls.extend(jobs)
        for _ in jobs:
            yield {"sft": {"claude-code": {"rewards": [0, 0], "gap": 0.0}}, "sft_seconds": 1.0}, "line"

    monkeypatch.setattr(demo, "map_jobs", fake_map_jobs)
    with pytest.raises(SystemExit, match="did not reproduce the demo's per-task rewards"):
        sweep.run([0], tmp_path / "out", 1, False, ["tree-mask"], ["tree-mask"], prep_dir)
    assert [j.rl for j in calls] == [False]  # reused: only its SFT ran


def test_merge_keeps_each_variant_once_and_refuses_different_runs(sweep):
    """Two sweeps of seeds 0 and 1: the second adds `sdcc λ=4` and repeats tree-mask (without GRPO);
    the merge lists the variants in VARIANTS order, keeps tree-mask's entry that has GRPO, and refuses a
    tree-mask whose SFT rewards differ (the runs are deterministic: not the same configuration)."""
    a = _doc()
    b = json.loads(json.dumps(a))
    b["config"] = {"variants": {"sdcc λ=4": ["sdcc", {}], "tree-mask": ["tree-mask", {}]}, "rl": []}
    for s in ("0", "1"):
        same = a["runs"][s]["results"]["tree-mask"]["sft"]["rewards"]["claude-code"]
        b["runs"][s]["results"] = {"tree-mask": _entry(same), "sdcc λ=4": _entry([0, 1])}
        a["runs"][s]["warm_loss"] = b["runs"][s]["warm_loss"] = 0.1
    for x in (a, b):
        x["config"]["quick"] = False
    merged = sweep.merge([b, a])
    assert list(merged["config"]["variants"]) == ["tree-mask", "sdcc λ=0", "sdcc λ=4"]
    assert merged["config"]["rl"] == ["tree-mask"] and "rl" in merged["runs"]["0"]["results"]["tree-mask"]
    assert "0.750 ± 0.354" in sweep.table(merged, "rl")
    b["runs"]["1"]["results"]["tree-mask"]["sft"]["rewards"]["claude-code"] = [0, 1]
    with pytest.raises(SystemExit, match="seed 1 tree-mask: the sweeps' SFT rewards differ"):
        sweep.merge([a, b])
