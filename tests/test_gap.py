"""`memorywalker gap`: each method's trainer logprobs against recorded rollout logprobs."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from memorywalker.metrics.gap import evictions_before_calls, gap_report
from memorywalker.records import TrajectoryWriter
from memorywalker.render import Renderer
from memorywalker.rollout import ExpertPolicy, HarnessConfig, WebSearchEnv, rollout


@pytest.fixture(scope="module")
def recorded(kit, tokenizer):
    """Expert episodes under opencode pruning, with rollout logprobs from a plain causal forward of
    each call's own S_t — an independent reference of what a rollout engine records."""
    model = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    env = WebSearchEnv()
    trajs, _ = rollout(env, ExpertPolicy(), tokenizer, HarnessConfig(name="opencode", budget=700),
                       suite="lookup", n=2, seed=0)
    assert sum(len(t.evictions) for t in trajs) >= 2
    renderer = Renderer(tokenizer)
    out = []
    for traj in trajs:
        rt = renderer.render(traj)
        calls = []
        for call, rc in zip(traj.calls, rt.calls, strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([rc.tokens])).logits[0].float()
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(rc.tokens[1:])[:, None])[:, 0]
            calls.append(call.model_copy(update={
                "context_tokens": rc.tokens[: rc.prompt_len], "response_tokens": rc.tokens[rc.prompt_len:],
                "rollout_logprobs": lp[rc.prompt_len - 1:].tolist()}))
        out.append(traj.model_copy(update={"calls": calls}))
    return model, out


def test_exact_methods_sit_at_the_floor_and_dfs_does_not(recorded, tokenizer):
    model, trajs = recorded
    rep = gap_report(model, Renderer(tokenizer), trajs, ["per-call", "logit-tree", "tree-mask", "dfs"])
    for m in ("per-call", "logit-tree", "tree-mask"):
        assert rep[m]["overall"]["logprob_abs_diff"] < 1e-5, m
        assert rep[m]["overall"]["logit_drift"] < 1e-5, m
    dfs = rep["dfs"]
    # Before any eviction dfs conditions like the rollout did; after one it sees evicted raw text.
    assert dfs["floor"]["logprob_abs_diff"] < 1e-5
    post = [dfs["by_evictions"][b] for b in ("1", "2", "3+") if dfs["by_evictions"][b]["targets"]]
    assert post and all(r["logprob_abs_diff"] > 1e-3 for r in post)
    assert dfs["overall"]["logit_drift"] > 1e-4
    # Every target is counted once per method, split across buckets without loss.
    for m in rep.values():
        assert sum(r["targets"] for r in m["by_evictions"].values()) == m["overall"]["targets"]
        assert m["floor"]["targets"] == m["by_evictions"]["0"]["targets"]


def test_evictions_before_calls_counts_records_in_order(recorded):
    _, trajs = recorded
    for t in trajs:
        k = evictions_before_calls(t)
        assert k[0] == 0 and k[-1] == len(t.evictions) and k == sorted(k)


def test_gap_command_json(recorded, kit, tmp_path):
    from memorywalker.cli.main import app

    _, trajs = recorded
    data = tmp_path / "rec.jsonl"
    with TrajectoryWriter(data) as w:
        for t in trajs:
            w.write(t)
    res = CliRunner().invoke(app, ["gap", "--model", str(kit[1]), "--data", str(data), "--json",
                                   "--method", "tree-mask", "--method", "dfs", "--no-drift"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["trajectories_with_logprobs"] == 2 and set(out["methods"]) == {"tree-mask", "dfs"}
    assert out["methods"]["tree-mask"]["overall"]["logprob_abs_diff"] < 1e-5
    bad = CliRunner().invoke(app, ["gap", "--model", str(kit[1]), "--data", str(data), "--method", "nope"])
    assert bad.exit_code != 0 and "valid" in bad.output
