"""Lockstep episodes: batched sampling is the single-sequence sampler to float rounding, and episodes
run together are the episodes run one by one."""

from __future__ import annotations

import pytest
import torch

from memorywalker.rollout import EpisodeJob, HarnessConfig, WebSearchEnv, run_episode, run_episodes
from memorywalker.rollout.episodes.harness import call_seed
from memorywalker.rollout.episodes.lockstep import _Rounds
from memorywalker.samplers.hf import HFPolicy


def plain_logprobs(model, prompt, response, temperature=1.0):
    """log p(response_t | prompt, response_<t) of softmax(logits / T) from one uncached forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(response)]


@pytest.fixture(scope="module")
def policy(kit):
    return HFPolicy(str(kit[1]), temperature=0.7, max_new_tokens=10, top_k=3)


def test_batched_rows_are_plain_forwards_of_their_own_sequences(policy, tokenizer):
    """Prompts of 5, 17 and 40 tokens (left padding of 35, 23 and 0): each row's recorded logprobs are a
    plain forward of that row alone at T = 0.7 within 1e-5, and greedy rows are the single-sequence
    greedy tokens."""
    prompts = [list(range(3, 8)), list(range(20, 37)), list(range(50, 90))]
    outs = policy.generate_batch(prompts, seeds=[1, 2, 3])
    for p, o in zip(prompts, outs, strict=True):
        assert len(o.token_ids) == len(o.logprobs) == len(o.top_logprobs) and o.token_ids
        ref = plain_logprobs(policy.model, p, o.token_ids, temperature=0.7)
        assert max(abs(a - b) for a, b in zip(ref, o.logprobs, strict=True)) <= 1e-5
        assert o.finish_reason == ("stop" if o.token_ids[-1] in policy.stop_ids else "length")
        assert all(row[0][1] >= row[-1][1] for row in o.top_logprobs)
    greedy = HFPolicy.from_model(policy.model, tokenizer, temperature=0.0, max_new_tokens=10)
    batched = greedy.generate_batch(prompts, seeds=[0, 0, 0])
    for p, o in zip(prompts, batched, strict=True):
        greedy.start()
        assert o.token_ids == greedy.generate(p, seed=0).token_ids


def jobs_for(env, n_tasks=2, group=3):
    return [EpisodeJob(env.task("chain", i), call_seed(7, i, j), f"chain-{i}-r{j}", {"sample": j})
            for i in range(n_tasks) for j in range(group)]


def test_lockstep_episodes_are_the_sequential_episodes(kit, tokenizer, policy):
    """Greedy, every episode run in lockstep equals the one-by-one episode of the same task and seed,
    token for token (logprobs to 1e-5); sampled at T = 0.7 a rerun is identical and every call's
    logprobs are a plain forward of its own context."""
    env = WebSearchEnv()
    cfg = HarnessConfig("claude-code", budget=600, watermark=1.0, max_steps=3)
    greedy = HFPolicy(str(kit[1]), temperature=0.0, max_new_tokens=10, top_k=3)
    jobs = jobs_for(env)
    together = run_episodes(env, jobs, greedy, tokenizer, cfg)
    for job, t in zip(jobs, together, strict=True):
        alone = run_episode(env, job.task, greedy, tokenizer, cfg, seed=job.seed, episode_id=job.episode_id,
                            meta=job.meta)
        assert t.id == alone.id and t.meta == alone.meta and t.messages == alone.messages
        for a, b in zip(t.calls, alone.calls, strict=True):
            assert a.context_tokens == b.context_tokens and a.response_tokens == b.response_tokens
            assert max(abs(x - y) for x, y in zip(a.rollout_logprobs, b.rollout_logprobs, strict=True)) <= 1e-5

    sampled = run_episodes(env, jobs, policy, tokenizer, cfg)
    assert [t.to_json_dict() for t in sampled] == [t.to_json_dict() for t in run_episodes(env, jobs, policy, tokenizer, cfg)]
    assert any(t.evictions for t in sampled)
    for t in sampled:
        for c in t.calls:
            ref = plain_logprobs(policy.model, c.context_tokens, c.response_tokens, temperature=0.7)
            assert max(abs(a - b) for a, b in zip(ref, c.rollout_logprobs, strict=True)) <= 1e-5


def test_rounds_batch_every_unfinished_episode(policy):
    """Three episodes making 2, 1 and 3 calls: rounds of 3, 2 and 1 rows (an episode that ends leaves
    the next round smaller; nobody waits for it)."""
    import threading

    rounds = _Rounds(policy, 3)
    calls = [2, 1, 3]

    def body(i):
        from memorywalker.samplers.base import PolicyRequest

        with rounds.cond:
            for k in range(calls[i]):
                rounds.call(i, PolicyRequest(prompt_ids=[5, 6, 7 + k], messages=[], tools=[], purpose="act",
                                             call_index=k, seed=k))
            rounds.finished()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rounds.batches == [3, 2, 1]


class _Broken(WebSearchEnv):
    def reset(self, task):
        if task.id.endswith("1"):
            raise RuntimeError("reset failed for this task")
        return super().reset(task)


def test_an_error_in_one_episode_is_raised_after_the_others_finish(kit, tokenizer, policy):
    env = _Broken()
    jobs = [EpisodeJob(env.task("chain", i), i) for i in range(3)]
    assert any(j.task.id.endswith("1") for j in jobs)
    with pytest.raises(RuntimeError, match="reset failed"):
        run_episodes(env, jobs, policy, tokenizer, HarnessConfig("none", max_steps=2))


def test_a_failing_batched_call_fails_the_run_instead_of_hanging(kit, tokenizer):
    """The model call that fails is every waiting episode's call: all of them end with its error."""
    class Failing(HFPolicy):
        def generate_batch(self, prompts, **kw):
            raise RuntimeError("out of memory in the batched forward")

    env = WebSearchEnv()
    policy = Failing(str(kit[1]), temperature=1.0, max_new_tokens=4)
    with pytest.raises(RuntimeError, match="out of memory"):
        run_episodes(env, jobs_for(env, 1, 3), policy, tokenizer, HarnessConfig("none", max_steps=2))


def test_bench_rollouts_reports_both_side_by_side(kit):
    """Greedy, the lockstep episodes are the one-by-one episodes: 2 of 2 the same, logprobs to 1e-5."""
    import json

    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    res = CliRunner().invoke(app, ["bench", "rollouts", "--model", str(kit[1]), "--tokenizer", str(kit[0]), "--env",
                                   "websearch", "--suite", "chain", "--budget", "600", "--tasks", "1", "--group", "2",
                                   "--temperature", "0", "--max-turns", "2", "--max-new-tokens", "8", "--json", "-"])
    assert res.exit_code == 0, res.output
    assert "--max-turns is now --max-steps" in res.output  # the old spelling still works, with one line
    r = json.loads(res.output[res.output.index("{"):])
    assert r["config"]["max_steps"] == 2
    assert r["episodes"] == 2 == r["same_episodes"] and r["max_abs_logprob_diff"] <= 1e-5
    assert r["sequential_s"] > 0 and r["lockstep_s"] > 0 and r["speedup"] == r["sequential_s"] / r["lockstep_s"]


def test_bench_rollouts_runs_the_corpus_environment(kit):
    """``--env corpus`` builds the shipped tiny corpus with ``world_seed`` = ``--seed`` (the seed once
    landed in the corpus-path argument and every run failed): 1 task x 2 greedy episodes, the same in
    lockstep and one by one, and the config records the environment."""
    import json

    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    res = CliRunner().invoke(app, ["bench", "rollouts", "--model", str(kit[1]), "--tokenizer", str(kit[0]), "--env",
                                   "corpus", "--suite", "all", "--budget", "600", "--tasks", "1", "--group", "2",
                                   "--temperature", "0", "--max-steps", "2", "--max-new-tokens", "8", "--seed", "3",
                                   "--json", "-"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output[res.output.index("{"):])
    assert r["config"]["env"] == "corpus" and r["config"]["seed"] == 3
    assert r["episodes"] == 2 == r["same_episodes"] and r["max_abs_logprob_diff"] <= 1e-5
