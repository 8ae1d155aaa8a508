"""Closed-loop evaluation: the interval math by hand, the validity split of a scripted episode, and
`memorywalker eval` on two tiny checkpoints whose report is recomputed from the saved episodes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from memorywalker.metrics.closed_loop import VALIDITY, summarize, trial_row
from memorywalker.metrics.stats import (
    bonferroni,
    cost_per_accepted,
    paired_bootstrap,
    paired_differences,
    wilson_interval,
    z_of,
)
from memorywalker.rollout import HarnessConfig, WebSearchEnv, run_episode
from memorywalker.samplers.base import PolicyOutput

# --- math ---------------------------------------------------------------------------------------------


def test_wilson_interval_by_hand():
    """7/10, z = 1.96: centre (0.7 + 0.19208)/1.38416 = 0.644492, half 1.96 sqrt(0.021 + 0.009604)/1.38416
    = 0.247719 -> (0.396773, 0.892211). 4/4: lower = n/(n + z^2) = 4/7.841600 = 0.510100, upper 1.
    0/5: lower 0, upper = z^2/(n + z^2) = 3.8416/8.8416 = 0.434492."""
    lo, hi = wilson_interval(7, 10, 1.96)
    assert lo == pytest.approx(0.396773, abs=1e-6) and hi == pytest.approx(0.892211, abs=1e-6)
    assert wilson_interval(4, 4, 1.96) == pytest.approx((0.510100, 1.0), abs=1e-6)
    assert wilson_interval(0, 5, 1.96) == pytest.approx((0.0, 0.434492), abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_bonferroni_and_its_quantile():
    """Four comparisons at 0.05 -> 0.0125 each, whose two-sided normal quantile is 2.4977 (> 1.96)."""
    assert bonferroni(0.05, 4) == 0.0125 and bonferroni(0.05, 1) == 0.05
    assert z_of(0.05) == pytest.approx(1.959964, abs=1e-6)
    assert z_of(0.0125) == pytest.approx(2.497705, abs=1e-5)
    with pytest.raises(ValueError):
        bonferroni(0.05, 0)


def test_paired_difference_on_a_tiny_table():
    """Tasks t1..t4, model accepted {1,0,1,1}, baseline {0,0,1,0}: diffs [1,0,0,1], mean 0.5. A resampled
    mean is k/4 with k ~ Binomial(4, 1/2): P(k=0) = P(k=4) = 1/16 = 6.25 % > 2.5 %, so the 95 % percentile
    interval is exactly [0, 1]; at the Bonferroni level for 2 comparisons too."""
    a = {"t1": 1.0, "t2": 0.0, "t3": 1.0, "t4": 1.0}
    b = {"t1": 0.0, "t2": 0.0, "t3": 1.0, "t4": 0.0}
    diffs = paired_differences(a, b)
    assert diffs == [1.0, 0.0, 0.0, 1.0]
    assert paired_bootstrap(diffs, seed=3) == (0.5, 0.0, 1.0)
    assert paired_bootstrap(diffs, alpha=bonferroni(0.05, 2), seed=3) == (0.5, 0.0, 1.0)
    # a slow reference: the same draws, one resample at a time
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 4, size=(2000, 4))
    means = sorted(sum(diffs[i] for i in row) / 4 for row in idx)
    ref = np.quantile(means, [0.1, 0.9])
    assert paired_bootstrap(diffs, alpha=0.2, resamples=2000, seed=7)[1:] == pytest.approx(tuple(ref))
    # the histogram of resampled means follows Binomial(4, 1/2) / 4
    assert np.mean(np.array(means) == 0.5) == pytest.approx(6 / 16, abs=0.03)
    with pytest.raises(ValueError, match="unpaired"):
        paired_differences(a, {"t1": 0.0})


def test_cost_per_accepted_counts_failed_spend():
    """1200 tokens over 3 trials, 2 accepted -> 600 per accepted; nothing accepted -> None (total kept)."""
    assert cost_per_accepted(1200, 2) == 600.0 and cost_per_accepted(1200, 0) is None
    row = {"accepted": False, "termination": "max_steps", "tokens": 1200, "turns": 4,
           "validity": dict.fromkeys(VALIDITY, 0), "sfa_followed": 0, "pre_errors": 0, "pre_total": 0}
    s = summarize([row], z=1.96)
    assert s["tokens_per_accepted"] is None and s["tokens_total"] == 1200 and s["turns_total"] == 4
    assert s["acceptance_ci"] == pytest.approx([0.0, 3.8416 / 4.8416])


# --- validity split of one scripted episode -----------------------------------------------------------


class Scripted:
    name = "scripted"

    def __init__(self, tok, texts):
        self.tok, self.texts, self.i = tok, texts, 0

    def start(self, task):
        pass

    def config(self):
        return {"name": self.name}

    def __call__(self, request):
        text, finish = self.texts[self.i]
        self.i += 1
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if finish == "stop":
            ids = ids + [self.tok.eos_token_id]
        return PolicyOutput(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason=finish)


def test_validity_sfa_and_pre_of_a_scripted_episode(tokenizer):
    """Nine proposals, one per class by construction:
    malformed x2 (no call; arguments not JSON), undeclared x1 (fly), schema x2 (key 'id' for 'page' = a
    PRE error; page 5 = a type error, not PRE), exec error x1 (no such page), truncated x1, valid x2.
    SFA: the exec-error call, the search and the answer follow the schema -> 3/9.
    PRE: declared calls with object arguments are #3 #4 #5 #7 #8; only #3 used a wrong name -> 1/5."""
    env = WebSearchEnv(world_seed=0)
    task = env.task("lookup", 0)
    entity = task.meta["program"]["steps"][0]["entity"]
    call = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'.format
    texts = [
        ("I will just think.", "stop"),
        (call("search", '{"query": }'), "stop"),
        (call("fly", '{"to": "moon"}'), "stop"),
        (call("open", '{"id": "x"}'), "stop"),
        (call("open", '{"page": 5}'), "stop"),
        (call("open", '{"page": "nowhere"}'), "stop"),
        ('<tool_call>\n{"name": "sea', "length"),
        (call("search", json.dumps({"query": entity})), "stop"),
        ("Note.\n" + call("answer", json.dumps({"text": task.answer})), "stop"),
    ]
    traj = run_episode(env, task, Scripted(tokenizer, texts), tokenizer, HarnessConfig("none", max_steps=12), seed=0)
    row = trial_row(traj)
    assert row["validity"] == {"valid": 2, "malformed_output": 2, "schema_violation": 2, "undeclared_tool": 1,
                               "truncated_proposal": 1, "tool_execution_error": 1}
    assert (row["sfa_followed"], row["pre_errors"], row["pre_total"]) == (3, 1, 5)
    assert row["accepted"] and row["turns"] == 9 and row["termination"] == "answered"
    assert row["tokens"] == sum(len(c.context_tokens) + len(c.response_tokens) for c in traj.calls)
    s = summarize([row], z=1.96)
    assert s["sfa"] == pytest.approx(3 / 9) and s["pre"] == pytest.approx(0.2)
    assert s["validity_rate"]["schema_violation"] == pytest.approx(2 / 9)
    assert s["tokens_per_accepted"] == row["tokens"] and s["turns_per_accepted"] == 9


def test_failed_trials_are_counted_not_dropped(tokenizer, tmp_path):
    """An endpoint that times out on one task of three: 3 trials, that one a failure (termination
    'error'); the expert solves the other two -> 2/3 accepted, Wilson(2, 3)."""
    from memorywalker.eval.evaluate import Candidate, EvalConfig, evaluate
    from memorywalker.rollout import ExpertPolicy
    from memorywalker.samplers.openai import EndpointError

    class Flaky(ExpertPolicy):
        def start(self, task):
            super().start(task)
            self.fail = task.id == self.bad

        def __call__(self, request):
            if self.fail:
                raise EndpointError("http://x/v1/completions: no answer within 1 s (timed out)")
            return super().__call__(request)

    cfg = EvalConfig(suites=("lookup",), n=3, split="test", max_steps=8, resamples=200)
    env = WebSearchEnv(0)
    from memorywalker.rollout import plan

    pol = Flaky()
    pol.bad = plan(env, "lookup", 3, seed=0, harness="none", split="test")[1].task.id
    report = evaluate(cfg, Candidate("model", pol, tokenizer, {}), tmp_path)
    s = report["models"]["model"]["suites"]["lookup"]
    assert (s["trials"], s["accepted"]) == (3, 2) and s["terminations"] == {"answered": 2, "error": 1}
    assert s["acceptance_ci"] == pytest.approx(list(wilson_interval(2, 3)))
    assert len((tmp_path / "model-lookup.jsonl").read_text().splitlines()) == 2  # the finished episodes


# --- end to end: two tiny checkpoints through the CLI ---------------------------------------------------


@pytest.fixture(scope="module")
def two_checkpoints(kit, tmp_path_factory):
    """The kit model and a copy with every weight perturbed (seeded)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("ckpt") / "perturbed"
    model = AutoModelForCausalLM.from_pretrained(kit[1])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(kit[1]).save_pretrained(out)
    return kit[1], out


def _recompute(lines: list[dict]) -> dict:
    """The report's numbers from raw episode JSON, without memorywalker's metrics code."""
    act = [c for t in lines for c in t["calls"] if c.get("purpose", "act") == "act"]
    msgs = {m["id"]: m for t in lines for m in t["messages"]}
    no_call = [c for c in act if not msgs[c["response"]].get("tool_calls")]
    return {
        "trials": len(lines),
        "accepted": sum(t.get("reward") == 1.0 for t in lines),
        "tokens": sum(len(c["context_tokens"]) + len(c["response_tokens"]) for t in lines for c in t["calls"]),
        "turns": len(act),
        "truncated": sum(c["finish_reason"] == "length" for c in no_call),
        "malformed_no_call": sum(c["finish_reason"] != "length" for c in no_call),
    }


def test_eval_cli_two_checkpoints_report_is_recomputed_from_episodes(two_checkpoints, tmp_path, tokenizer):
    """Fixed seed, 2 suites x 3 test tasks, 2 act calls each: every number of report.json is recomputed
    from the saved episodes; the paired intervals are at the Bonferroni level 0.05/2; the pins are the
    weights/tokenizer/template hashes recomputed here."""
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from memorywalker.cli.main import app
    from memorywalker.train.refcache import template_hash, tokenizer_hash, weights_hash

    a, b = two_checkpoints
    out = tmp_path / "eval"
    args = ["eval", "--model", str(a), "--baseline", str(b), "--suites", "lookup,bridge", "--n", "3",
            "--max-steps", "2", "--max-new-tokens", "16", "--seed", "0", "--resamples", "500",
            "--no-progress", "-o", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "paired: model - baseline" in res.output and "97.50% = Bonferroni 0.05/2" in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["temperature"] == 0.0 and report["compressor"]["max_steps"] == 2
    p = report["paired"]
    assert (p["comparisons"], p["alpha_each"]) == (2, 0.025)
    z = z_of(0.05)
    for label, path in (("model", a), ("baseline", b)):
        mod = report["models"][label]
        pins = mod["pins"]
        assert pins["weights_hash"] == weights_hash(AutoModelForCausalLM.from_pretrained(path))
        assert pins["tokenizer_hash"] == tokenizer_hash(tokenizer)
        assert pins["template_hash"] == template_hash(tokenizer)
        assert mod["decoding"]["max_new_tokens"] == 16 and mod["decoding"]["temperature"] == 0.0
        for suite in ("lookup", "bridge"):
            lines = [json.loads(x) for x in (out / f"{label}-{suite}.jsonl").read_text().splitlines()]
            r, s = _recompute(lines), mod["suites"][suite]
            assert (s["trials"], s["accepted"], s["tokens_total"], s["turns_total"]) == \
                (3, r["accepted"], r["tokens"], r["turns"])
            assert r["trials"] == 3 and r["turns"] <= 6
            assert s["validity"]["truncated_proposal"] == r["truncated"]
            assert s["validity"]["malformed_output"] >= r["malformed_no_call"]
            assert sum(s["validity"].values()) == s["proposals"] == r["turns"]
            lo, hi = s["acceptance_ci"]
            k, n = r["accepted"], 3
            centre = (k / n + z * z / (2 * n)) / (1 + z * z / n)
            half = z * math.sqrt(k / n * (1 - k / n) / n + z * z / (4 * n * n)) / (1 + z * z / n)
            assert (lo, hi) == pytest.approx((max(0, centre - half), min(1, centre + half)))
            if r["accepted"] == 0:
                assert s["tokens_per_accepted"] is None and "0 accepted, total" in res.output
    assert report["models"]["model"]["pins"]["weights_hash"] != report["models"]["baseline"]["pins"]["weights_hash"]
    for suite in ("lookup", "bridge"):
        acc, tokens = {}, {}
        for label in ("model", "baseline"):
            lines = [json.loads(x) for x in (out / f"{label}-{suite}.jsonl").read_text().splitlines()]
            acc[label] = {t["task"]["id"]: float(t.get("reward") == 1.0) for t in lines}
            tokens[label] = {t["task"]["id"]: _recompute([t])["tokens"] for t in lines}
        assert acc["model"].keys() == acc["baseline"].keys()  # the same tasks (and seeds) on both sides
        diffs = [acc["model"][t] - acc["baseline"][t] for t in sorted(acc["model"])]
        c = p["suites"][suite]
        assert c["tasks"] == 3 and c["difference"] == pytest.approx(sum(diffs) / 3)
        assert c["ci"][0] <= c["difference"] <= c["ci"][1]
        # cost is paired too: the tokens each episode spent, model minus baseline, on the same task and seed
        t = p["secondary"]["tokens"][suite]
        assert (t["tasks"], t["seeds"]) == (3, 3)
        assert t["difference"] == pytest.approx(sum(tokens["model"][k] - tokens["baseline"][k] for k in tokens["model"]) / 3)
        assert t["ci"][0] <= t["difference"] <= t["ci"][1]
        assert p["secondary"]["turns"][suite]["difference"] == 0.0  # 2 act calls each, both sides
    # the fixed-seed run itself, pinned: greedy 16-token responses of random weights never close a tool
    # call, so every proposal is truncated, nothing is accepted, and the paired difference is 0 [0, 0]
    pinned = {(label, suite): (s["accepted"], s["turns_total"], s["validity"]["truncated_proposal"], s["tokens_total"])
              for label, mod in report["models"].items() for suite, s in mod["suites"].items()}
    assert pinned == {("model", "lookup"): (0, 6, 6, 3046), ("model", "bridge"): (0, 6, 6, 3088),
                      ("baseline", "lookup"): (0, 6, 6, 3063), ("baseline", "bridge"): (0, 6, 6, 3115)}
    assert [p["suites"][s]["ci"] for s in ("lookup", "bridge")] == [[0.0, 0.0], [0.0, 0.0]]


def test_eval_against_the_expert_pins_a_paired_difference(two_checkpoints, tmp_path):
    """The tiny random model accepts nothing; the expert solves all 4 lookup tasks: paired difference
    exactly -1 with interval [-1, -1]; the expert's acceptance interval is Wilson(4, 4) = (0.5101, 1)."""
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    out = tmp_path / "eval"
    res = CliRunner().invoke(app, ["eval", "--model", str(two_checkpoints[0]), "--baseline", "expert",
                                   "--suite", "lookup", "--n", "4", "--max-steps", "4", "--max-new-tokens", "12",
                                   "--resamples", "200", "--json", "--no-progress", "-o", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    m, e = report["models"]["model"]["suites"]["lookup"], report["models"]["baseline"]["suites"]["lookup"]
    assert (m["accepted"], e["accepted"], e["trials"]) == (0, 4, 4)
    assert e["acceptance_ci"] == pytest.approx([0.510100, 1.0], abs=1e-4)
    assert m["tokens_per_accepted"] is None and m["tokens_total"] > 0
    assert e["validity"]["valid"] == e["proposals"] and e["sfa"] == 1.0 and e["pre"] == 0.0
    c = report["paired"]["suites"]["lookup"]
    assert (c["difference"], c["ci"], c["significant"]) == (-1.0, [-1.0, -1.0], True)
    # the expert's proposals are all valid: the model's malformed share minus 0, per task
    share = {}
    for line in (out / "model-lookup.jsonl").read_text().splitlines():
        t = json.loads(line)
        share[t["task"]["id"]] = _recompute([t])["malformed_no_call"] / _recompute([t])["turns"]
    mal = report["paired"]["secondary"]["malformed"]["lookup"]
    assert mal["difference"] == pytest.approx(sum(share.values()) / 4)


def test_several_seeds_per_task_are_paired_by_seed_and_resampled_within_the_task(two_checkpoints, tmp_path):
    """--samples 2: each task is played with two seeds, the same two for model and baseline; the paired
    test pairs them by seed (2 tasks x 2 seeds = 4 pairs) and its estimate is the mean of the per-task means."""
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    out = tmp_path / "eval"
    res = CliRunner().invoke(app, ["eval", "--model", str(two_checkpoints[0]), "--baseline", "expert",
                                   "--suite", "lookup", "--n", "2", "--samples", "2", "--max-steps", "3",
                                   "--max-new-tokens", "12", "--resamples", "200", "--no-progress", "-o", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    tokens = {}
    for label in ("model", "baseline"):
        for line in (out / f"{label}-lookup.jsonl").read_text().splitlines():
            t = json.loads(line)
            tokens[label, t["task"]["id"], t["meta"]["sample"]] = _recompute([t])["tokens"]
    keys = sorted({k[1:] for k in tokens})
    assert len(keys) == 4 and {s for _, s in keys} == {0, 1}
    c = report["paired"]["secondary"]["tokens"]["lookup"]
    assert (c["tasks"], c["seeds"]) == (2, 4)
    assert c["difference"] == pytest.approx(sum(tokens[("model", *k)] - tokens[("baseline", *k)] for k in keys) / 4)
    assert "tokens" in res.output and "seeds" in res.output


def test_eval_cli_errors_are_one_line(tmp_path):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    for args, needle in ((["--model", "expert", "--suite", "nope"], "unknown suite 'nope'"),
                         (["--model", str(tmp_path / "missing"), "--suite", "lookup"], "No such model directory"),
                         (["--model", "expert", "--suite", "lookup", "--world-size", "x=1"], "--world-size")):
        res = CliRunner().invoke(app, ["eval", *args, "-o", str(tmp_path / "o")])
        assert res.exit_code == 2, res.output
        assert needle in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_trained_suites_come_from_the_run_manifest(tmp_path):
    """A run's final/ next to a training manifest whose config names suite 'bridge' -> ['bridge'] (so
    lookup is held out); a directory without one -> None (unknown)."""
    from memorywalker.eval.evaluate import _trained_suites

    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "run" / "training_manifest.json").write_text(json.dumps({"config": {"suite": "bridge"}}))
    (tmp_path / "other").mkdir()
    assert _trained_suites(tmp_path / "run" / "final") == ["bridge"]
    assert _trained_suites(tmp_path / "other") is None
