"""`memorywalker gap`: each method's trainer logprobs against recorded rollout logprobs."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from engine_cases import with_rollout_logprobs
from memorywalker.metrics.gap import evictions_before_calls, gap_report
from memorywalker.records import TrajectoryBuilder, TrajectoryWriter
from memorywalker.render import Renderer, RenderOptions
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
    return model, [with_rollout_logprobs(model, renderer, t) for t in trajs]


def test_exact_methods_sit_at_the_floor_and_dfs_does_not(recorded, tokenizer):
    model, trajs = recorded
    rep = gap_report(model, Renderer(tokenizer), trajs, ["per-call", "logit-tree", "tree-mask", "dfs"])
    for m in ("per-call", "logit-tree", "tree-mask"):
        assert rep[m]["overall"]["logprob_abs_diff"] < 1e-5, m
        assert rep[m]["overall"]["logit_drift"] < 1e-5, m
    dfs = rep["dfs"]
    # Before any branch dfs conditions like the rollout did; after one it sees evicted raw text.
    assert dfs["floor"]["logprob_abs_diff"] < 1e-5
    for view in ("by_branches", "by_evictions"):  # every branch here is a recorded eviction
        post = [dfs[view][b] for b in ("1", "2", "3+") if dfs[view][b]["targets"]]
        assert post and all(r["logprob_abs_diff"] > 1e-3 for r in post), view
    assert dfs["overall"]["logit_drift"] > 1e-4
    # Every target is counted once per method, split across buckets without loss.
    for m in rep.values():
        for view in ("by_branches", "by_evictions"):
            assert sum(r["targets"] for r in m[view].values()) == m["overall"]["targets"], view
        assert m["floor"]["targets"] == m["by_branches"]["0"]["targets"]
        assert m["heavy"]["targets"] == m["by_branches"]["2"]["targets"] + m["by_branches"]["3+"]["targets"]


def test_a_retry_without_an_eviction_record_is_bucketed_by_branches(recorded, tokenizer):
    """One retry and no eviction record (issue 10 c)::

        call-0  [s, u]          -> a0 (search)        segment 0
        call-1  [s, u, a0, t0]  -> bad                segment 0 (S_1 extends S_0)
        call-2  [s, u, a0, t0]  -> a1 (search)        segment 1 (the retry: S_2 branches from S_1 at the
                                                                 response start)
        call-3  [.., a1, t1]    -> a2                 segment 1 (S_3 extends S_2)

    With n_i the targets of call i: floor = by_branches["0"] = n0 + n1, by_branches["1"] = n2 + n3,
    "2" = "3+" = heavy = 0; no eviction was recorded, so by_evictions["0"] = n0 + n1 + n2 + n3.
    dfs puts ``bad`` before the retry in its one causal sequence, so calls 2 and 3 see it (> 1e-3),
    while calls 0 and 1 are conditioned as sampled (the floor, ~1e-7 here); counting evictions put the
    retry's targets in dfs's floor too.
    """
    model = recorded[0]
    renderer = Renderer(tokenizer)
    b = TrajectoryBuilder("retry")
    s, u = b.message("system", "sys"), b.message("user", "Who founded Alder Works?")
    a0 = b.message("assistant", "Let me search.",
                   tool_calls=[{"id": "tc0", "name": "search", "arguments": {"query": "alder works"}}])
    t0 = b.message("tool", "Search results: Alder Works, a mill.", tool_call_id="tc0", name="search")
    bad = b.message("assistant", "Orvo Tamsin founded it, I think.")
    a1 = b.message("assistant", "Let me check the founder.",
                   tool_calls=[{"id": "tc1", "name": "search", "arguments": {"query": "alder founder"}}])
    t1 = b.message("tool", "Search results: Alder Works was founded by Mira Quell.", tool_call_id="tc1",
                   name="search")
    a2 = b.message("assistant", "Mira Quell founded Alder Works.")
    b.call([s, u], a0)
    b.call([s, u, a0, t0], bad)
    b.call([s, u, a0, t0], a1)
    b.call([s, u, a0, t0, a1, t1], a2)
    traj = with_rollout_logprobs(model, renderer, b.build())
    n = [len(rc.targets) for rc in renderer.render(traj).calls]
    rep = gap_report(model, renderer, [traj], ["tree-mask", "dfs"], drift=False)
    dfs = rep["dfs"]
    assert dfs["floor"]["logprob_abs_diff"] < 1e-5
    assert dfs["by_branches"]["1"]["logprob_abs_diff"] > 1e-3
    for m in rep.values():
        assert m["floor"]["targets"] == m["by_branches"]["0"]["targets"] == n[0] + n[1]
        assert m["by_branches"]["1"]["targets"] == n[2] + n[3]
        assert m["by_branches"]["2"]["targets"] == m["by_branches"]["3+"]["targets"] == m["heavy"]["targets"] == 0
        assert m["by_evictions"]["0"]["targets"] == m["overall"]["targets"] == sum(n)
    assert rep["tree-mask"]["overall"]["logprob_abs_diff"] < 1e-5


def test_trajectories_sampled_at_a_temperature_are_compared_at_that_temperature(kit, tokenizer):
    """The hf sampler at T = 0.5 records log softmax(logits / 0.5); gap divides the trainer's logits by the
    temperature the trajectory records, so the exact methods sit at the floor. Read as untempered (the
    recorded temperature removed), the same episodes show the distance between the two distributions."""
    from memorywalker.samplers.hf import HFPolicy

    policy = HFPolicy(str(kit[1]), temperature=0.5, max_new_tokens=16, top_k=3)
    trajs, _ = rollout(WebSearchEnv(), policy, tokenizer, HarnessConfig("claude-code", budget=600, watermark=1.0,
                                                                       max_steps=3), suite="chain", n=1, seed=1)
    assert trajs[0].evictions
    renderer = Renderer(tokenizer, RenderOptions(truncated="prefix"))  # the random model's calls hit the limit
    rep = gap_report(policy.model, renderer, trajs, ["per-call", "tree-mask"], drift=False)
    assert rep["tree-mask"]["by_branches"]["1"]["targets"] > 0
    assert all(rep[m]["overall"]["logprob_abs_diff"] < 1e-5 for m in ("per-call", "tree-mask"))
    untempered = [t.model_copy(update={"meta": {**t.meta, "policy": {**t.meta["policy"], "temperature": 1.0}}})
                  for t in trajs]
    assert gap_report(policy.model, renderer, untempered, ["tree-mask"], drift=False)["tree-mask"]["overall"][
        "logprob_abs_diff"] > 1e-2


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
    assert set(out["methods"]["dfs"]) == {"overall", "heavy", "floor", "by_branches", "by_evictions"}
    table = CliRunner().invoke(app, ["gap", "--model", str(kit[1]), "--data", str(data), "--method", "dfs",
                                     "--no-drift"])
    assert table.exit_code == 0, table.output
    assert "by branches B before the call" in " ".join(table.output.split()) and "B=3+" in table.output
    bad = CliRunner().invoke(app, ["gap", "--model", str(kit[1]), "--data", str(data), "--method", "nope"])
    assert bad.exit_code != 0 and "valid" in bad.output


def test_against_per_call_equals_the_gap_against_an_independent_plain_forward(recorded, tokenizer):
    """``against="per-call"`` on the episodes with their rollout logprobs removed (an imported log of
    another model has none) reports what the recorded ones do: those were written by a plain causal forward
    of each call's own S_t, the same conditioning; so every metric agrees within fp32 rounding."""
    model, trajs = recorded
    bare = [t.model_copy(update={"calls": [c.model_copy(update={"rollout_logprobs": None}) for c in t.calls]})
            for t in trajs]
    methods = ["tree-mask", "dfs", "rightmost"]
    want = gap_report(model, Renderer(tokenizer), trajs, methods, drift=False)
    got = gap_report(model, Renderer(tokenizer), bare, methods, drift=False, against="per-call")
    assert got["dfs"]["by_branches"]["1"]["logprob_abs_diff"] > 1e-3  # not vacuous: dfs is off after a branch
    for m in methods:
        for view in ("overall", "floor", "heavy"):
            for k in ("targets", "logprob_abs_diff", "k3_kl"):
                w, g = want[m][view][k], got[m][view][k]
                assert (w is None and g is None) or abs(w - g) <= 1e-5, (m, view, k)
    with pytest.raises(ValueError, match="valid: \\['recorded', 'per-call'\\]"):
        gap_report(model, Renderer(tokenizer), bare, methods, against="sampler")


def test_gap_says_a_truncated_response_was_left_out_and_prefix_measures_it(kit, tokenizer, tmp_path):
    """The issue's case: one call whose response was cut at the length limit (``finish_reason: length``, its
    first 6 response tokens and their logprobs recorded, no terminator). By default it gives no target and
    gap says why, in the table's last line and in --json (``calls.left_out``); ``--truncated prefix``
    compares its 6 tokens (targets 6). A trajectory without rollout logprobs is counted too."""
    import torch

    from memorywalker.cli.main import app

    model = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    renderer = Renderer(tokenizer)
    b = TrajectoryBuilder("cut")
    s, u = b.message("system", "sys"), b.message("user", "Say a long thing.")
    a = b.message("assistant", "A long thing that goes on and on and on.")
    b.call([s, u], a, finish_reason="length")
    traj = b.build()
    rc = renderer.render(traj).calls[0]
    prompt, resp = rc.tokens[:rc.prompt_len], rc.tokens[rc.prompt_len:rc.prompt_len + 6]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + resp])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor((prompt + resp)[1:])[:, None])[:, 0]
    traj.calls[0] = traj.calls[0].model_copy(update={"context_tokens": prompt, "response_tokens": resp,
                                                      "rollout_logprobs": lp[len(prompt) - 1:].tolist()})
    plain = TrajectoryBuilder("plain")
    p_s, p_u, p_a = plain.message("system", "sys"), plain.message("user", "Hi."), plain.message("assistant", "Hello.")
    plain.call([p_s, p_u], p_a)
    data = tmp_path / "cut.jsonl"
    with TrajectoryWriter(data) as w:
        w.write(traj)
        w.write(plain.build())
    args = ["gap", "--model", str(kit[1]), "--data", str(data), "--method", "tree-mask", "--no-drift"]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.output
    assert ("calls left out: 2 of 2 (no rollout logprobs 1, truncated 1); truncated: cut at the length limit "
            "(truncated=prefix keeps their tokens)") in " ".join(table.output.split())
    out = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    assert out["calls"] == {"total": 2, "left_out": {"no rollout logprobs": 1, "truncated": 1}}
    assert out["methods"]["tree-mask"]["overall"]["targets"] == 0
    out = json.loads(CliRunner().invoke(app, [*args, "--json", "--truncated", "prefix", "--chat-template", "chatml"]).output)
    assert out["calls"]["left_out"] == {"no rollout logprobs": 1}  # chatml: the kit's own template, named
    assert out["methods"]["tree-mask"]["overall"]["targets"] == 6
    assert out["methods"]["tree-mask"]["overall"]["logprob_abs_diff"] < 1e-5


def test_gap_names_a_chat_template_it_cannot_read_in_one_line(kit, tmp_path):
    from memorywalker.cli.main import app

    data = tmp_path / "d.jsonl"
    b = TrajectoryBuilder("t")
    s, u, a = b.message("system", "sys"), b.message("user", "Hi."), b.message("assistant", "Hello.")
    b.call([s, u], a)
    with TrajectoryWriter(data) as w:
        w.write(b.build())
    res = CliRunner().invoke(app, ["gap", "--model", str(kit[1]), "--data", str(data), "--chat-template", "llama9"])
    assert res.exit_code == 2 and "--chat-template llama9: not a file, nor a shipped template" in res.output
