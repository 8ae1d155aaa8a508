"""The ``openai:URL`` policy against a real ``vllm serve`` that the test starts on 127.0.0.1 (completions
API with token-id prompts): ids + logprobs equal a plain HF forward within 1e-5, episodes recorded by
``memorywalker rollout``, and the server stopped by the test — after which a request fails in one line.
Bounded: the server has 300 s to come up. Run in the vLLM venv (``.ci/run``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from memorywalker.samplers.base import PolicyRequest  # noqa: E402
from memorywalker.samplers.openai import EndpointError, OpenAIPolicy  # noqa: E402
from vllm_serve import vllm_serve  # noqa: E402


@pytest.fixture(scope="module")
def served(kit, tmp_path_factory):
    from memorywalker.modelkit import build_model

    return build_model(tmp_path_factory.mktemp("served") / "m", kit[0], hidden_size=128, num_heads=2,
                       num_kv_heads=1, max_positions=2048)


@pytest.fixture(scope="module")
def server(served, tmp_path_factory):
    """``vllm serve`` with the flags docs/rollouts.md gives, on a free loopback port; yields its URL."""
    with vllm_serve(served, tmp_path_factory.mktemp("serve") / "server.log") as (url, proc):
        yield url, proc


def test_openai_policy_against_vllm_serve_equals_hf_and_records_episodes(server, served, kit, tmp_path):
    """A token-id prompt: the returned ids' logprobs and top-5 equal the HF forward of prompt + response
    within 1e-5. Then ``memorywalker rollout --sampler openai:URL`` records 4 episodes whose every call's
    rollout logprobs equal the HF forward of its recorded context + response within 1e-5."""
    from transformers import AutoModelForCausalLM

    url, _ = server
    hf = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval()

    def forward(prompt, response):
        with torch.no_grad():
            lp = torch.log_softmax(hf(input_ids=torch.tensor([prompt + response])).logits[0].float(), -1)
        return lp[len(prompt) - 1:len(prompt) + len(response) - 1]

    policy = OpenAIPolicy(url, model="kit", temperature=1.0, max_new_tokens=10, top_k=5, timeout=60, retries=0)
    prompt = list(range(20, 80))
    out = policy(PolicyRequest(prompt, [], [], "act", 0, seed=3))
    assert out.token_ids and len(out.logprobs) == len(out.token_ids) == len(out.top_logprobs)
    ref = forward(prompt, out.token_ids)
    assert float((ref[torch.arange(len(out.token_ids)), out.token_ids] - torch.tensor(out.logprobs)).abs().max()) < 1e-5
    for row, tops in zip(ref, out.top_logprobs, strict=True):
        assert torch.allclose(torch.topk(row, 5).values, torch.tensor([v for _, v in tops[:5]]), atol=1e-5)

    data = tmp_path / "ep.jsonl"
    proc = subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "rollout", "--env", "vault", "--suite", "recall-2",
                           "--sampler", f"openai:{url}", "--model", "kit", "--tokenizer", str(served), "--n", "2",
                           "--samples", "2", "--max-steps", "2", "--max-new-tokens", "8", "--max-context", "900",
                           "--no-progress", "-o", str(data)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trajs = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(trajs) == 4
    worst = 0.0
    for t in trajs:
        for c in t["calls"]:
            ref = forward(c["context_tokens"], c["response_tokens"])
            got = torch.tensor(c["rollout_logprobs"])
            worst = max(worst, float((ref[torch.arange(len(got)), c["response_tokens"]] - got).abs().max()))
    assert worst < 1e-5, worst


def test_a_stopped_server_fails_in_one_line(server):
    """Runs last: the test stops the server; the next request is refused and reported in one line."""
    url, proc = server
    os.killpg(proc.pid, 15)
    proc.wait(60)
    policy = OpenAIPolicy(url, model="kit", max_new_tokens=4, timeout=10, retries=1, backoff=0.1)
    with pytest.raises(EndpointError, match=r"127\.0\.0\.1.*after 2 attempts") as e:
        policy(PolicyRequest([5, 6, 7], [], [], "act", 0, seed=0))
    assert "\n" not in str(e.value)
