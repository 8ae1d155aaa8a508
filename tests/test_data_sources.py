"""DAgger rounds, fault injection and distillation on the web-search world (tiny world, kit model)."""

from __future__ import annotations

import pytest

from memorywalker.recipes.dagger import DaggerConfig, run_dagger
from memorywalker.records import read_trajectories
from memorywalker.rollout import (
    ExpertPolicy,
    FaultConfig,
    FaultInjector,
    HarnessConfig,
    WebSearchEnv,
    run_episode,
)
from memorywalker.transforms.distill import WEBSEARCH_GUIDANCE, distill, filter_teacher, strip_guidance

TINY = {"n_cities": 2, "n_companies": 3, "n_people": 3, "n_distractors": 2}


# --- DAgger ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dagger_run(kit, tmp_path_factory):
    out = tmp_path_factory.mktemp("dagger")
    cfg = DaggerConfig(rounds=1, n=2, betas=(0.0,), max_steps=4, max_new_tokens=24, sft_steps=1, eval_n=2,
                       world_size=TINY, sft_batch_size=2)
    return cfg, out, run_dagger(cfg, str(kit[1]), out, tokenizer_dir=str(kit[0]))


def test_dagger_round_adds_learner_state_labels_that_all_verify(dagger_run, tokenizer):
    """With beta = 0 the learner acts everywhere: every state after the first is one its own action
    reached. Each admitted label is re-executed here in a fresh environment and the expert, replayed on
    the label record's own context, must continue from it to reward 1 — the verification, recomputed."""

    cfg, out, report = dagger_run
    labels = read_trajectories(out / "labels-1.jsonl")
    rollouts = {t.id: t for t in read_trajectories(out / "rollouts-1.jsonl")}
    r = report["rounds"][0]
    assert r["admitted"] == len(labels) > 0 and r["dataset"] == len(labels)
    learner_state = [t for t in labels if t.meta["dagger"]["learner_state"]]
    assert len(learner_state) == r["learner_states"] >= 1
    env = WebSearchEnv(cfg.world_seed, world_size=TINY)
    for t in labels:
        parent = rollouts[t.lineage.parent]
        assert t.lineage.transform == "dagger" and t.task.split == parent.task.split == "train"
        call = t.calls[0]
        assert call.context_tokens == parent.calls[int(t.id.rsplit("-", 1)[1])].context_tokens
        assert t.outcome["label_verified"] is True and 1 <= t.outcome["verify_steps"] <= cfg.max_steps
        # The label, executed again in a fresh environment, is a valid tool call of the environment.
        label = t.message_table()[call.response]
        env.reset(t.task)
        tc = label.tool_calls[0]
        assert not env.step(tc.name, dict(tc.arguments)).observation.startswith("Error"), t.id
    # The learner state disagreement is a fraction of learner-reached states; the untrained kit model
    # never proposes the expert's exact action.
    assert r["learner_state_disagreement"] == 1.0
    assert r["tokens"]["tokens_out"] == sum(len(c.context_tokens) + len(c.response_tokens)
                                            for t in labels for c in t.calls)


def test_dagger_in_the_vault_counts_the_learners_summaries_as_learner_states(kit, tmp_path):
    """env=vault (recall-2) under claude-code at the demo's budget 260, where every act call after the
    first compacts: after a compaction the context is the system prompt, the task and the summary, which
    enters as a new message the eviction inserts. With beta = 0 the learner writes every summary, so every
    label but each episode's first (before any learner output) is at a learner-reached state. The untrained
    kit learner never answers: 2 episodes x max_steps 6 = 12 act calls labeled, 2 of them first calls."""
    cfg = DaggerConfig(env="vault", suite="recall-2", compressor="claude-code", budget=260, max_steps=6, rounds=1,
                       n=2, betas=(0.0,), max_new_tokens=32, sft_steps=1, eval_n=2, sft_batch_size=2)
    report = run_dagger(cfg, str(kit[1]), tmp_path, tokenizer_dir=str(kit[0]))
    (r,) = report["rounds"]
    labels = read_trajectories(tmp_path / "labels-1.jsonl")
    assert r["states"] == 12 and r["admitted"] == len(labels) > 2
    first = [t for t in labels if t.meta["dagger"]["labeled_call"] == "call-0"]
    assert len(first) <= 2 and r["learner_states"] == len(labels) - len(first)
    assert all(t.meta["dagger"]["learner_state"] != (t in first) for t in labels)
    assert r["learner_state_disagreement"] == 1.0
    evaluated = read_trajectories(tmp_path / "eval-round-1.jsonl")
    assert {t.meta["env"]["name"] for t in evaluated} == {"vault"} and len(evaluated) == 2


class WrongAnswerer:
    """A labeler that always answers "nobody": no label of it can verify."""

    name = "wrong"

    def start(self, task):
        pass

    def config(self):
        return {"name": self.name}

    def __call__(self, request):
        from memorywalker.records.schema import Message, ToolCall
        from memorywalker.samplers.base import PolicyOutput

        return PolicyOutput(message=Message(id="", role="assistant", content="", author="model",
                                            tool_calls=[ToolCall(id="", name="answer", arguments={"text": "nobody"})]))


@pytest.mark.parametrize("learner_is_expert", [True, False])
def test_labels_are_admitted_only_when_verification_passes(tokenizer, renderer, learner_is_expert):
    """Expert labels at the wrong answerer's states verify (the expert solves lookup from any of them);
    the wrong answerer's labels at the expert's states never do (reward 0), so none is admitted."""
    from memorywalker.transforms.dagger import MixedPolicy, label_records

    env, verify_env = WebSearchEnv(0, world_size=TINY), WebSearchEnv(0, world_size=TINY)
    learner, labeler = (ExpertPolicy(), WrongAnswerer()) if learner_is_expert else (WrongAnswerer(), ExpertPolicy())
    mixed = MixedPolicy(learner, labeler, 0.0, tokenizer, verify_env, max_steps=6)
    task = env.task("lookup", 0)
    traj = run_episode(env, task, mixed, tokenizer, HarnessConfig("none", max_steps=6), seed=0)
    recs = label_records(traj, mixed.labels, renderer, round_k=1, beta=0.0)
    if learner_is_expert:
        assert traj.reward == 1.0 and len(mixed.labels) == len(traj.calls) >= 3 and recs == []
        assert not any(lab["verified"] for lab in mixed.labels)
    else:
        # The wrong answerer ends the episode on its first call: one state, labelled search(entity).
        assert traj.reward == 0.0 and len(mixed.labels) == 1 and len(recs) == 1
        assert recs[0].messages[-1].tool_calls[0].name == "search"
        assert not recs[0].meta["dagger"]["agree"]


def test_beta_one_executes_only_the_labeler(tokenizer):
    """beta = 1 (the default for round 1): every executed response is the labeler's."""
    from memorywalker.transforms.dagger import MixedPolicy

    env, verify_env = WebSearchEnv(0, world_size=TINY), WebSearchEnv(0, world_size=TINY)
    mixed = MixedPolicy(WrongAnswerer(), ExpertPolicy(), 1.0, tokenizer, verify_env, max_steps=6)
    traj = run_episode(env, env.task("lookup", 1), mixed, tokenizer, HarnessConfig("none", max_steps=6), seed=0)
    assert traj.reward == 1.0
    assert [c.meta["dagger_executed"] for c in traj.calls] == ["labeler"] * len(traj.calls)
    assert all(lab["verified"] for lab in mixed.labels)
    assert DaggerConfig().beta(1) == 1.0 and DaggerConfig().beta(2) == DaggerConfig().beta(5) == 0.0


# --- fault injection --------------------------------------------------------------------------------------

def test_faults_are_seeded_masked_and_recovered_from(tokenizer, renderer):
    """At rate 0.5 the expert meets faults and still answers right: each faulted observation is a tool
    message tagged meta.fault (context, never a target), followed by a response (the recovery) whose
    tokens are targets. The same seed gives the same faults; another seed other ones."""
    env = FaultInjector(WebSearchEnv(0, world_size=TINY), FaultConfig(rate=0.5, seed=3))
    task = env.task("bridge", 0)
    traj = run_episode(env, task, ExpertPolicy(), tokenizer, HarnessConfig("none"), seed=0)
    faults = [m for m in traj.messages if m.meta.get("fault")]
    assert len(faults) == len(env.injected) >= 1 and traj.reward == 1.0
    assert {m.meta["fault"] for m in faults} <= {"error", "timeout", "stale"}
    rendered = renderer.render(traj)
    for m in faults:
        i = next(i for i, c in enumerate(traj.calls) if c.context[-1] == m.id)  # the call right after it
        rc = rendered.calls[i]
        assert rc.targets == list(range(rc.prompt_len, len(rc.tokens)))  # targets: the recovery only
        obs = tokenizer(m.content, add_special_tokens=False)["input_ids"]
        prompt = rc.tokens[: rc.prompt_len]
        assert any(prompt[j:j + len(obs)] == obs for j in range(len(prompt)))  # the fault sits in context
    again = FaultInjector(WebSearchEnv(0, world_size=TINY), FaultConfig(rate=0.5, seed=3))
    run_episode(again, task, ExpertPolicy(), tokenizer, HarnessConfig("none"), seed=0)
    assert again.injected == env.injected
    other = FaultInjector(WebSearchEnv(0, world_size=TINY), FaultConfig(rate=0.5, seed=4))
    run_episode(other, task, ExpertPolicy(), tokenizer, HarnessConfig("none"), seed=0)
    assert other.injected != env.injected


def test_no_faults_leaves_episodes_unchanged(tokenizer):
    """Rate 0: the same messages and calls as the plain environment (only meta.env names the faults)."""
    plain = WebSearchEnv(0, world_size=TINY)
    task = plain.task("chain", 2)
    a = run_episode(plain, task, ExpertPolicy(), tokenizer, HarnessConfig("claude-code"), seed=0)
    b = run_episode(FaultInjector(WebSearchEnv(0, world_size=TINY), FaultConfig(rate=0.0)), task, ExpertPolicy(),
                    tokenizer, HarnessConfig("claude-code"), seed=0)
    assert a.messages == b.messages and a.calls == b.calls and "faults" not in a.meta["env"]
    with pytest.raises(ValueError, match="valid: error, timeout, stale"):
        FaultConfig(kinds=("flaky",))


# --- distillation ------------------------------------------------------------------------------------------

def _guided_episodes(tokenizer, n=3):
    env = WebSearchEnv(0, world_size=TINY)
    env.system_prompt = env.system_prompt + WEBSEARCH_GUIDANCE
    return [run_episode(env, env.task("bridge", i), ExpertPolicy(), tokenizer, HarnessConfig("none"), seed=i)
            for i in range(n)]


def test_strip_guidance_keeps_targets_token_identical(tokenizer, renderer):
    """Both versions rendered with the kit tokenizer: every call's target tokens are the same ids, the
    prompt is shorter by the guidance, only the system message changed, and lineage keeps both prompts."""
    parents = _guided_episodes(tokenizer)
    # A dynamic observation (the task prompt) that quotes the guidance is never stripped.
    parents[0].messages[1].content += WEBSEARCH_GUIDANCE
    parents[0].calls = [c.model_copy(update={"context_tokens": None, "response_tokens": None})
                        for c in parents[0].calls]  # its recorded ids no longer match the edited prompt
    children, stats = distill(parents, "strip-guidance", guidance=WEBSEARCH_GUIDANCE, renderer=renderer)
    assert len(children) == 3 and stats.tokens_out < stats.tokens_in and 0 < stats.expansion < 1
    guidance_len = len(tokenizer(WEBSEARCH_GUIDANCE, add_special_tokens=False)["input_ids"])
    for p, c in zip(parents, children, strict=True):
        rp, rc = renderer.render(p), renderer.render(c)
        for a, b in zip(rp.calls, rc.calls, strict=True):
            assert a.targets and [a.tokens[i] for i in a.targets] == [b.tokens[i] for i in b.targets]
            assert a.prompt_len - b.prompt_len == pytest.approx(guidance_len, abs=2)
            assert b.reason is None and not b.warnings
        changed = [m.id for m, n in zip(p.messages, c.messages, strict=True) if m.content != n.content]
        assert changed == [p.messages[0].id] and p.messages[0].role == "system"
        assert c.meta["distill"]["prompt_before"][0].endswith(WEBSEARCH_GUIDANCE)
        assert WEBSEARCH_GUIDANCE not in c.meta["distill"]["prompt_after"][0]
        assert c.lineage.parent == p.id and c.lineage.transform == "strip-guidance"
    assert children[0].messages[1].content.endswith(WEBSEARCH_GUIDANCE)
    with pytest.raises(ValueError, match="no system message contains"):
        strip_guidance(children[0], WEBSEARCH_GUIDANCE, renderer)


def test_filter_teacher_keeps_only_verified_successes(tokenizer):
    eps = _guided_episodes(tokenizer, n=2)
    failed = eps[1].model_copy(update={"id": "failed", "reward": 0.0})
    kept, stats = distill([eps[0], failed, eps[1]], "filter-teacher", teacher="expert")
    assert [t.lineage.parent for t in kept] == [eps[0].id, eps[1].id] and stats.records_out == 2
    assert filter_teacher(eps[0], teacher="hf") is None


# --- CLI -------------------------------------------------------------------------------------------------

def test_distill_cli_writes_derived_records_and_reports_expansion(tokenizer, kit, tmp_path):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app
    from memorywalker.records import write_trajectories

    eps = _guided_episodes(tokenizer, n=2)
    write_trajectories(tmp_path / "guided.jsonl", eps)
    res = CliRunner().invoke(app, ["distill", "--strip-guidance", str(tmp_path / "guided.jsonl"), "--tokenizer",
                                   str(kit[0]), "-o", str(tmp_path / "s.jsonl"), "--no-progress"])
    assert res.exit_code == 0, res.output
    out = read_trajectories(tmp_path / "s.jsonl")
    tin = sum(len(c.context_tokens) + len(c.response_tokens) for t in eps for c in t.calls)
    tout = sum(len(c.context_tokens) + len(c.response_tokens) for t in out for c in t.calls)
    assert "2 of 2 records" in res.output and f"expansion {tout / tin:.3f}" in res.output
    for args, needle in ((["distill", str(tmp_path / "guided.jsonl"), "-o", str(tmp_path / "x")], "exactly one of"),
                         (["dagger", "--suite", "nope", "-o", str(tmp_path / "d")], "unknown suite 'nope'"),
                         (["dagger", "--betas", "2", "-o", str(tmp_path / "d")], "--betas must lie in"),
                         (["dagger", "--expert-forget", "0.5", "--n", "1", "--rounds", "1", "--eval-n", "1", "-o",
                           str(tmp_path / "d")], "only the vault's expert forgets"),
                         (["dagger", "--env", "vault", "--suite", "lookup", "-o", str(tmp_path / "d")],
                          "unknown suite 'lookup' of env vault")):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and needle in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_rollout_cli_injects_faults_only_when_asked(tmp_path):
    """`rollout --fault-rate 0.5`: faulted tool messages are tagged meta.fault with a known kind and the
    recorded environment config names the faults; without the option no message is tagged; an unknown
    kind is one line with exit 2."""
    import json

    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    def run(path, *extra):
        return CliRunner().invoke(app, ["rollout", "--suite", "lookup", "--n", "3", "--no-progress",
                                        "-o", str(path), *extra])

    faulted, plain = tmp_path / "f.jsonl", tmp_path / "p.jsonl"
    assert run(faulted, "--fault-rate", "0.5", "--fault-kinds", "error").exit_code == 0
    assert run(plain).exit_code == 0
    kinds = [m["meta"]["fault"] for line in faulted.read_text().splitlines()
             for m in json.loads(line)["messages"] if (m.get("meta") or {}).get("fault")]
    assert kinds and set(kinds) == {"error"}
    assert not any((m.get("meta") or {}).get("fault") for line in plain.read_text().splitlines()
                   for m in json.loads(line)["messages"])
    bad = run(tmp_path / "b.jsonl", "--fault-rate", "0.5", "--fault-kinds", "boom")
    assert bad.exit_code == 2 and "unknown fault kinds ['boom']" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
