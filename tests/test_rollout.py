"""Rollouts end to end: determinism, expert success under every policy, resume after a kill, the CLI,
and the hf / openai backends' recorded logprobs."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memorywalker.render import Renderer
from memorywalker.rollout import (
    COMPRESSORS,
    SUITES,
    ExpertPolicy,
    HarnessConfig,
    WebSearchEnv,
    replay_contexts,
    rollout,
    run_episode,
)
from memorywalker.samplers.hf import HFPolicy
from memorywalker.samplers.openai import OpenAIPolicy


@pytest.fixture(scope="module")
def env():
    return WebSearchEnv(world_seed=0)


def _success(env, tokenizer, harness: str, n: int) -> dict[str, float]:
    out = {}
    for suite in SUITES:
        _, summary = rollout(env, ExpertPolicy(), tokenizer, HarnessConfig(harness), suite=suite, n=n, seed=0)
        out[suite] = summary.success
    return out


@pytest.mark.parametrize("harness", list(COMPRESSORS))
def test_expert_solves_every_suite_under_every_policy(env, tokenizer, harness):
    """6 tasks per suite here (all must succeed); the slow test below runs 100 per suite (>= 99 %)."""
    assert _success(env, tokenizer, harness, 6) == {s: 1.0 for s in SUITES}


@pytest.mark.slow
@pytest.mark.parametrize("harness", list(COMPRESSORS))
def test_expert_success_at_least_99_percent(env, tokenizer, harness):
    rates = _success(env, tokenizer, harness, 100)
    assert min(rates.values()) >= 0.99, rates


def test_same_seed_gives_byte_identical_output(env, tokenizer, tmp_path):
    for harness in ("claude-code", "tc-rag"):
        a, b = tmp_path / f"{harness}-a.jsonl", tmp_path / f"{harness}-b.jsonl"
        for path in (a, b):
            rollout(env, ExpertPolicy(), tokenizer, HarnessConfig(harness), suite="chain", n=3, seed=7, out=path)
        assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 0


def test_resume_after_a_kill_neither_duplicates_nor_loses(env, tokenizer, tmp_path):
    cfg = HarnessConfig("opencode")
    full, cut = tmp_path / "full.jsonl", tmp_path / "cut.jsonl"
    rollout(env, ExpertPolicy(), tokenizer, cfg, suite="comparison", n=6, seed=1, out=full)
    lines = full.read_bytes().splitlines(keepends=True)
    assert len(lines) == 6
    # Simulated kill: three complete records, then half of the fourth without its newline.
    cut.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    _, summary = rollout(env, ExpertPolicy(), tokenizer, cfg, suite="comparison", n=6, seed=1, out=cut)
    assert (summary.skipped, summary.written) == (3, 3)
    assert cut.read_bytes() == full.read_bytes()
    _, again = rollout(env, ExpertPolicy(), tokenizer, cfg, suite="comparison", n=6, seed=1, out=cut)
    assert (again.skipped, again.written) == (6, 0) and cut.read_bytes() == full.read_bytes()
    with pytest.raises(ValueError, match="different run"):
        rollout(env, ExpertPolicy(), tokenizer, cfg, suite="comparison", n=6, seed=2, out=cut)


def test_cli_rollout_resumes(tmp_path, kit):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app
    from memorywalker.records import read_trajectories

    out = tmp_path / "r.jsonl"
    args = ["rollout", "--env", "websearch", "--suite", "navigation", "--compressor", "memex", "--sampler", "expert",
            "--n", "3", "--seed", "0", "-o", str(out), "--tokenizer", str(kit[0]), "--no-progress"]
    r1 = CliRunner().invoke(app, args)
    assert r1.exit_code == 0, r1.output
    r2 = CliRunner().invoke(app, [*args[:10], "4", *args[11:]])  # --n 4: one more episode appended
    assert r2.exit_code == 0, r2.output
    trajs = read_trajectories(out)
    assert [t.task.id for t in trajs] == [f"navigation-{i:05d}" for i in range(4)]
    bad = CliRunner().invoke(app, [*args[:4], "nonsense", *args[5:]])
    assert bad.exit_code != 0 and "valid" in bad.output


# --- hf backend ------------------------------------------------------------------------------------

def _full_forward_logprobs(model, context_tokens, response_tokens, temperature: float = 1.0):
    """log p(response_t | context, response_<t) from one forward over the whole sequence (no cache), of
    softmax(logits / temperature)."""
    import torch

    ids = torch.tensor([context_tokens + response_tokens])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1)
    n = len(context_tokens)
    return [float(lp[n - 1 + i, t]) for i, t in enumerate(response_tokens)]


@pytest.fixture(scope="module")
def hf_runs(env, tokenizer, kit):
    """A random tiny Llama under claude-code with a budget small enough to summarize twice."""
    policy = HFPolicy(str(kit[1]), temperature=1.0, max_new_tokens=24, top_k=3)
    cfg = HarnessConfig("claude-code", budget=600, watermark=1.0, max_steps=4)
    runs = [run_episode(env, env.task("chain", 0), policy, tokenizer, cfg, seed=3) for _ in range(2)]
    return policy, runs


def test_hf_logprobs_equal_a_fresh_full_forward(hf_runs):
    """The KV cache is reused while the context grows and cropped after an eviction; in fp32 the rollout
    logprobs equal a full forward of the same sequence within 1e-5 (the no-compression floor)."""
    policy, (traj, _) = hf_runs
    assert len(traj.evictions) >= 1 and policy.stats["rebuilds"] >= 2 and policy.stats["reused_tokens"] > 0
    worst = 0.0
    for call in traj.calls:
        ref = _full_forward_logprobs(policy.model, call.context_tokens, call.response_tokens)
        worst = max(worst, max(abs(a - b) for a, b in zip(ref, call.rollout_logprobs, strict=True)))
        assert len(call.rollout_top_logprobs) == len(call.response_tokens)
        assert all(len(row) == 3 and row[0][1] >= row[-1][1] for row in call.rollout_top_logprobs)
    assert worst <= 1e-5, worst


def test_hf_logprobs_at_a_temperature_are_of_the_distribution_sampled(env, tokenizer, kit):
    """At T = 0.5 the recorded logprobs are log softmax(logits / 0.5) of a plain full forward (within
    1e-5), not the untempered log softmax(logits): those differ by far more (the check can fail)."""
    policy = HFPolicy(str(kit[1]), temperature=0.5, max_new_tokens=12, top_k=3)
    traj = run_episode(env, env.task("chain", 0), policy, tokenizer, HarnessConfig("none", max_steps=2), seed=5)
    call = traj.calls[0]
    tempered = _full_forward_logprobs(policy.model, call.context_tokens, call.response_tokens, temperature=0.5)
    plain = _full_forward_logprobs(policy.model, call.context_tokens, call.response_tokens)
    assert max(abs(a - b) for a, b in zip(tempered, call.rollout_logprobs, strict=True)) <= 1e-5
    assert max(abs(a - b) for a, b in zip(plain, call.rollout_logprobs, strict=True)) > 1e-2
    assert traj.meta["policy"]["temperature"] == 0.5


def test_hf_rollouts_are_deterministic_and_render_exactly(hf_runs, tokenizer):
    _, (a, b) = hf_runs
    assert a.to_json_dict() == b.to_json_dict()
    assert replay_contexts(a) == [c.context for c in a.calls]
    renderer = Renderer(tokenizer)
    for i, call in enumerate(a.calls):
        rc = renderer.render_call(a, i)
        assert rc.tokens[: rc.prompt_len] == call.context_tokens
        assert "context_tokens do not decode" not in " ".join(rc.warnings)


# --- openai backend against a local server ----------------------------------------------------------

class _Server:
    """A vLLM-like /v1/completions endpoint on 127.0.0.1 serving the tiny model (prompt = token ids)."""

    def __init__(self, model_dir: str, *, with_token_ids: bool):
        self.policy = HFPolicy(model_dir, max_new_tokens=24, top_k=3)
        self.prompts: list[list[int]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.path == "/v1/completions"
                outer.prompts.append(body["prompt"])
                outer.policy.start()
                outer.policy.max_new_tokens, outer.policy.top_k = body["max_tokens"], body["logprobs"]
                out = outer.policy.generate(body["prompt"], seed=body["seed"])
                choice = {"index": 0, "text": "", "finish_reason": out.finish_reason,
                          "logprobs": {"tokens": [f"token_id:{t}" for t in out.token_ids],
                                       "token_logprobs": out.logprobs,
                                       "top_logprobs": [{f"token_id:{i}": v for i, v in row}
                                                        for row in out.top_logprobs]}}
                if with_token_ids:
                    choice["token_ids"] = out.token_ids
                data = json.dumps({"id": "cmpl-0", "object": "text_completion", "choices": [choice]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("with_token_ids", [True, False])
def test_openai_backend_records_what_the_server_was_sent_and_returned(env, tokenizer, kit, with_token_ids):
    server = _Server(str(kit[1]), with_token_ids=with_token_ids)
    try:
        policy = OpenAIPolicy(server.url, max_new_tokens=24, top_k=3)
        cfg = HarnessConfig("qwen-agent", budget=560, max_steps=4)
        traj = run_episode(env, env.task("lookup", 1), policy, tokenizer, cfg, seed=5)
    finally:
        server.close()
    assert [c.context_tokens for c in traj.calls] == server.prompts  # exactly what the server got
    assert len(traj.evictions) >= 1
    for call in traj.calls:
        ref = _full_forward_logprobs(server.policy.model, call.context_tokens, call.response_tokens)
        assert max(abs(a - b) for a, b in zip(ref, call.rollout_logprobs, strict=True)) <= 1e-5
    assert replay_contexts(traj) == [c.context for c in traj.calls]
