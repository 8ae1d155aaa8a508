"""The ``vllm`` policy against a real vLLM engine (no fake): token-id prompts in, ids + logprobs out, equal
to a plain Hugging Face forward of the same weights; episodes in lockstep as batched requests; the weight
sync the RL recipe uses (full and LoRA-merged weights); an over-long prompt; a dying engine.

One engine for the module (engine start ≈ 30–60 s on 2 cores). Run in the vLLM venv: ``python -m pytest
-m vllm tests/test_vllm_policy.py`` (``.ci/run`` does); excluded from the default suite.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from memorywalker.samplers.vllm import EngineError, VLLMPolicy  # noqa: E402

TOL = 1e-5  # fp32: the exactness contract's tolerance


@pytest.fixture(scope="module")
def served(kit, tmp_path_factory):
    """A kit llama that vLLM's CPU attention serves: head_dim 128 / 2 = 64 (the default kit's 16 is refused)."""
    from memorywalker.modelkit import build_model

    return build_model(tmp_path_factory.mktemp("served") / "m", kit[0], hidden_size=128, num_heads=2,
                       num_kv_heads=1, max_positions=2048)


@pytest.fixture(scope="module")
def hf(served):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(served):
    policy = VLLMPolicy(served, temperature=1.0, max_new_tokens=12, top_k=5, max_model_len=1024, kv_cache_gib=0.25)
    yield policy
    policy.close()


def hf_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of each response token after ``prompt`` + the response before it: [len(response), V]."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:len(prompt) + len(response) - 1] / temperature, dim=-1)


def test_token_id_prompts_give_ids_and_logprobs_equal_to_hf(engine, hf, tokenizer):
    """Three prompts of different lengths sharing a prefix, one generate: every sampled token's logprob and
    the top-5 equal the HF forward of prompt + response within 1e-5; the same seed samples the same ids; a
    response that stopped ends with a stop id. At T = 0.7 the records are of softmax(logits / 0.7)."""
    base = tokenizer.apply_chat_template([{"role": "user", "content": "where is the vault key?"}],
                                         add_generation_prompt=True, tokenize=True)
    base = list(base["input_ids"] if isinstance(base, dict) or hasattr(base, "keys") else base)
    prompts = [base, base[:-3] + base[-2:], list(range(40, 90)) + base]
    outs = engine.generate_batch(prompts, seeds=[1, 2, 3])
    assert len(outs) == 3
    worst = 0.0
    for p, o in zip(prompts, outs, strict=True):
        assert o.token_ids and len(o.logprobs) == len(o.token_ids) == len(o.top_logprobs)
        ref = hf_logprobs(hf, p, o.token_ids)
        got = torch.tensor(o.logprobs)
        worst = max(worst, float((ref[torch.arange(len(o.token_ids)), o.token_ids] - got).abs().max()))
        for row, tops in zip(ref, o.top_logprobs, strict=True):
            values, ids = torch.topk(row, 5)
            assert torch.allclose(values, torch.tensor([v for _, v in tops]), atol=TOL)
        if o.finish_reason == "stop":
            assert o.token_ids[-1] in engine.stop_ids
        else:
            assert len(o.token_ids) == 12
    assert worst < TOL, worst
    again = engine.generate_batch(prompts[:1], seeds=[1])[0]
    assert again.token_ids == outs[0].token_ids
    engine.temperature = 0.7
    try:
        hot = engine.generate_batch(prompts[:1], seeds=[5])[0]
    finally:
        engine.temperature = 1.0
    ref = hf_logprobs(hf, prompts[0], hot.token_ids, temperature=0.7)
    assert float((ref[torch.arange(len(hot.token_ids)), hot.token_ids] - torch.tensor(hot.logprobs)).abs().max()) < TOL


def test_a_batch_over_the_token_budget_with_seeds_is_served(engine, hf, tokenizer):
    """Twelve seeded prompts of 900 tokens (10,800 > the 8,192 tokens a step schedules): vLLM 0.32's CPU
    runner crashed on this with chunked prefill (a seeded request's generator cannot rewind), so the
    policy schedules whole prompts; each output's logprobs still equal the HF forward within 1e-5."""
    span = len(tokenizer) - 40  # ids 40 .. len(tokenizer) - 1: past the kit's special tokens, inside its vocabulary
    prompts = [[(7 * i + j) % span + 40 for j in range(900)] for i in range(12)]
    outs = engine.generate_batch(prompts, seeds=list(range(12)), max_new_tokens=4)
    assert [len(o.token_ids) > 0 for o in outs] == [True] * 12
    for p, o in [(prompts[0], outs[0]), (prompts[-1], outs[-1])]:
        ref = hf_logprobs(hf, p, o.token_ids)
        assert float((ref[torch.arange(len(o.token_ids)), o.token_ids] - torch.tensor(o.logprobs)).abs().max()) < TOL


def test_lockstep_episodes_are_batched_requests_recorded_exactly(engine, hf, tokenizer):
    """Four vault episodes in lockstep: each round of calls is one generate (fewer batches than calls);
    every call's recorded context is what was sent, and its rollout logprobs equal the HF forward of
    context + response within 1e-5."""
    from memorywalker.rollout import EpisodeJob, HarnessConfig, VaultEnv, run_episodes

    env = VaultEnv(0)
    jobs = [EpisodeJob(env.task("recall-2", i // 2), 10 + i, f"ep{i}") for i in range(4)]
    before = dict(engine.stats)
    trajs = run_episodes(env, jobs, engine, tokenizer, HarnessConfig("claude-code", budget=260, max_steps=3))
    calls = [c for t in trajs for c in t.calls]
    batches = engine.stats["batches"] - before["batches"]
    assert engine.stats["requests"] - before["requests"] == len(calls) and batches < len(calls)
    worst = 0.0
    for c in calls:
        ref = hf_logprobs(hf, c.context_tokens, c.response_tokens)
        got = torch.tensor(c.rollout_logprobs)
        worst = max(worst, float((ref[torch.arange(len(got)), c.response_tokens] - got).abs().max()))
    assert worst < TOL, worst
    assert all(t.meta["policy"]["name"] == "vllm" for t in trajs)


def test_weight_sync_reaches_the_engine_full_and_lora_merged(engine, hf, served):
    """After sync_weights(perturbed state dict), vLLM's prompt logprobs of a fixed prompt equal the
    perturbed HF model's within 1e-5 (before the sync they differ by more than 1e-3: the check is not
    vacuous, and the prefix cache holding the old keys/values was reset). Then a LoRA model with B ≠ 0:
    its merged weights give the PEFT model's logprobs. Last, the original weights go back."""
    from transformers import AutoModelForCausalLM

    from memorywalker.train.adapter import apply_adapter, merged_state_dict
    from memorywalker.train.config import AdapterConfig

    prompt = list(range(10, 70))
    original = {k: v.clone() for k, v in hf.state_dict().items()}

    def trainer_logprobs(model) -> torch.Tensor:
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0].float(), -1)
        return lp[torch.arange(len(prompt) - 1), prompt[1:]]

    served_before = torch.tensor(engine.prompt_logprobs(prompt))
    assert float((served_before - trainer_logprobs(hf)).abs().max()) < TOL
    gen = torch.Generator().manual_seed(0)
    moved = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval()
    moved.load_state_dict({k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in original.items()})
    want = trainer_logprobs(moved)
    assert float((served_before - want).abs().max()) > 1e-3
    seconds = engine.sync_weights(merged_state_dict(moved))
    assert seconds > 0 and float((torch.tensor(engine.prompt_logprobs(prompt)) - want).abs().max()) < TOL

    lora = apply_adapter(AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval(),
                         AdapterConfig(kind="lora", rank=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05, generator=gen)
    lora.eval()
    engine.sync_weights(merged_state_dict(lora))
    got = torch.tensor(engine.prompt_logprobs(prompt))
    assert float((got - trainer_logprobs(lora)).abs().max()) < TOL
    assert float((got - trainer_logprobs(hf)).abs().max()) > 1e-3
    engine.sync_weights(original)
    assert float((torch.tensor(engine.prompt_logprobs(prompt)) - trainer_logprobs(hf)).abs().max()) < TOL


def test_over_long_prompt_is_one_line_and_the_engine_keeps_serving(engine):
    with pytest.raises(EngineError, match="a prompt of 1024 tokens does not fit vLLM's max_model_len 1024") as e:
        engine.generate_batch([list(range(1024))], seeds=[0])
    assert "\n" not in str(e.value)
    assert engine.generate_batch([list(range(10, 30))], seeds=[0])[0].token_ids


class KillsEngineAt:
    """A vault environment that kills the engine's processes when its ``n``-th episode starts (the
    counter is shared by the shallow copies lockstep episodes run on)."""

    def __init__(self, env, n: int):
        self.env, self.n, self.resets = env, n, [0]

    def __getattr__(self, name):
        return getattr(self.env, name)

    def __copy__(self):
        import copy

        out = KillsEngineAt(copy.copy(self.env), self.n)
        out.resets = self.resets
        return out

    def reset(self, task):
        self.resets[0] += 1
        if self.resets[0] == self.n:
            for child in psutil.Process().children(recursive=True):
                child.kill()
        return self.env.reset(task)


def test_dying_engine_is_one_line_and_episodes_are_written_whole(engine, tokenizer, tmp_path):
    """Runs last (it kills the module's engine). Four episodes in lockstep groups of two; the engine dies
    when the third starts: the first group's two episodes are in the file, whole; the second group's are
    not; the error is one line naming the engine."""
    from memorywalker.rollout import HarnessConfig, VaultEnv, rollout

    out = tmp_path / "ep.jsonl"
    env = KillsEngineAt(VaultEnv(0), 3)
    with pytest.raises(EngineError, match="vllm engine .* failed") as e:
        rollout(env, engine, tokenizer, HarnessConfig("none", max_steps=2), suite="recall-2", n=2, samples=2,
                out=out, batch=2)
    assert "\n" not in str(e.value)
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and [json.loads(x)["id"].endswith(("r0", "r1")) for x in lines] == [True, True]
    assert all(len(json.loads(x)["calls"]) >= 1 for x in lines)


def rollout_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "rollout", "--env", "vault", "--suite",
                           "recall-2", "--n", "1", "--no-progress", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_refuses_what_the_engine_cannot_do_in_one_line(kit, tmp_path):
    """A model vLLM cannot serve (the default kit's head_dim 16, refused by vLLM's CPU attention) and a
    window smaller than the harness's context: each one line naming the cause, exit 2, no output file."""
    out = tmp_path / "x.jsonl"
    res = rollout_cli("--sampler", f"vllm:{kit[1]}", "-o", str(out))
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and "rollout: error: " in last, res.stderr[-2000:]
    assert f"{kit[1]}: vLLM's CPU attention cannot serve head_dim 16" in last and not out.exists()
    res = rollout_cli("--sampler", f"vllm:{kit[1]}", "--max-model-len", "512", "-o", str(out))
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and "--max-context 8192 + --max-new-tokens 256 exceeds --max-model-len 512" in last
    assert not out.exists()
