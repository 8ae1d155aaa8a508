"""The production path once: real Codex CLI → the gateway → a real ``vllm serve`` (``--backend openai:URL``).

The gateway sends each rendered prompt to vLLM as token ids and records vLLM's own response ids and
logprobs; ``radix`` on the captured trajectory must reproduce them within the fp32 cross-engine floor
(≤ 1e-5 per token, as for the ``openai:`` sampler in test_vllm_serve.py). The served kit Llama is
random, so the session is one answer; what is checked is the path, not the agent. Run in the vLLM
venv (``.ci/run``) with ``MEMORYWALKER_HARNESS_BIN`` set; skipped without the codex binary.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from memorywalker.gateway.harnesses import capture, find_binary  # noqa: E402
from vllm_serve import vllm_serve  # noqa: E402


def test_codex_through_the_gateway_to_vllm_serve_is_reproduced_by_radix(kit, tmp_path):
    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.metrics.gap import gap_report
    from memorywalker.modelkit import build_model
    from memorywalker.render import Renderer
    from memorywalker.train.model import load_model

    try:
        find_binary("codex")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    # head_dim 64 (vLLM's CPU attention rejects 16) and room for Codex's ~16K-token prompt
    model = build_model(tmp_path / "m", kit[0], hidden_size=128, num_heads=2, num_kv_heads=1, max_positions=32768)
    with vllm_serve(model, tmp_path / "server.log", max_model_len=24576, kv_cache_bytes=536870912) as (url, _):
        gw = build_gateway(str(model), f"openai:{url}", tmp_path / "out", tokenizer=str(kit[0]), max_new_tokens=6000,
                           harness="codex", upstream_model="kit")  # vllm_serve's --served-model-name
        s = capture("codex", "Read notes.txt and say what it says.", gw, files={"notes.txt": "hello\n"},
                    deadline_s=300)
    (traj,) = s.trajectories
    calls = [c for c in traj.calls if c.finish_reason != "length"]
    assert calls, "vLLM's answer never ended within 6,000 tokens"
    assert all(len(c.context_tokens) > 10000 and c.rollout_logprobs for c in calls)
    lm, tok = load_model(str(model), str(kit[0]), dtype="float32", device=torch.device("cpu"))
    tokens: dict = {}
    report = gap_report(lm, Renderer(tok), [traj], ["radix"], drift=False, tokens=tokens)
    assert report["radix"]["overall"]["targets"] == sum(len(c.response_tokens) for c in calls)
    diffs = [abs(a - b) for per_call in tokens[traj.id].values()
             for a, b in zip(per_call["logprob"]["radix"], per_call["rollout"], strict=True) if a is not None]
    assert diffs and max(diffs) <= 1e-5, max(diffs)


def test_in_process_vllm_backend_records_what_vllm_sampled(kit, tmp_path):
    """``--backend vllm``: vLLM in the gateway's process. Two chat calls of one session (the second
    extends the first); ``radix`` reproduces the recorded logprobs within 1e-5."""
    import httpx

    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.metrics.gap import gap_report
    from memorywalker.modelkit import build_model
    from memorywalker.records import read_trajectories
    from memorywalker.render import Renderer
    from memorywalker.render.render import RenderOptions
    from memorywalker.train.model import load_model

    model = build_model(tmp_path / "m", kit[0], hidden_size=128, num_heads=2, num_kv_heads=1, max_positions=2048)
    gw = build_gateway(str(model), "vllm", tmp_path / "out", tokenizer=str(kit[0]), max_new_tokens=64)
    messages = [{"role": "user", "content": "Say something."}]
    with BackgroundServer(gw) as url:
        for _ in range(2):
            r = httpx.post(url + "/v1/chat/completions", json={"model": "kit", "messages": messages},
                           headers={"x-session-id": "v"}, timeout=300)
            assert r.status_code == 200, r.text
            messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""},
                         {"role": "user", "content": "Go on."}]
    gw.backend.policy.close()
    (traj,) = read_trajectories(tmp_path / "out" / "trajectories.jsonl")
    assert len(traj.calls) == 2
    lm, tok = load_model(str(model), str(kit[0]), dtype="float32", device=torch.device("cpu"))
    tokens: dict = {}
    # a random model rarely ends within 64 tokens: its cut-off responses are compared as prefixes
    gap_report(lm, Renderer(tok, RenderOptions(truncated="prefix")), [traj], ["radix"], drift=False, tokens=tokens)
    diffs = [abs(a - b) for per_call in tokens[traj.id].values()
             for a, b in zip(per_call["logprob"]["radix"], per_call["rollout"], strict=True)
             if a is not None and b is not None]
    assert diffs and max(diffs) <= 1e-5, max(diffs)
