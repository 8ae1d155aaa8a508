"""The RL recipe with ``rollout_engine=vllm`` against a real vLLM engine: after every optimizer step the
trainer's weights reach the engine, so the next step's rollouts come from them (checked by logprobs),
for full fine-tuning and for LoRA (merged weights; marked slow as well: it starts a second engine, and
``-m "vllm and not slow"`` in ``.ci/run`` leaves it out; the policy-level LoRA sync is in
test_vllm_policy.py). Run in the vLLM venv (``.ci/run``)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from memorywalker.recipes.rl import RLConfig, train  # noqa: E402


def token_id_reward(traj) -> float:
    """A stand-in reward that differs between any two different samples (the untrained model never
    answers, so the environment's reward is 0 for all): the mean sampled token id, scaled to [0, 1)."""
    ids = [t for c in traj.calls for t in (c.response_tokens or [])]
    return sum(ids) / max(1, len(ids)) / 1024


@pytest.fixture(scope="module")
def served(kit, tmp_path_factory):
    """A kit llama vLLM's CPU attention serves (head_dim 64)."""
    from memorywalker.modelkit import build_model

    return build_model(tmp_path_factory.mktemp("served") / "m", kit[0], hidden_size=128, num_heads=2,
                       num_kv_heads=1, max_positions=2048)


def logprobs_under(model_dir, trajs) -> tuple[float, int]:
    """Mean |log p_model − recorded rollout logprob| over every response token of ``trajs`` (the model
    loaded from ``model_dir``, plain forward of each call's context + response), and the token count."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    diffs = []
    with torch.no_grad():
        for t in trajs:
            for c in t.calls:
                ids = c.context_tokens + c.response_tokens
                lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
                n = len(c.context_tokens)
                got = lp[torch.arange(n - 1, len(ids) - 1), c.response_tokens]
                diffs.append((got - torch.tensor(c.rollout_logprobs)).abs())
    d = torch.cat(diffs)
    return float(d.mean()), len(d)


def run_two_steps(served, kit, run_dir, **kw):
    """Two GRPO steps sampled by vLLM; returns the result and the episodes each step collected."""
    seen: dict[int, list] = {0: [], 1: []}

    def reward(traj) -> float:
        seen[traj.meta["step"]].append(traj)
        return token_id_reward(traj)

    base = dict(model=str(served), tokenizer=str(kit[0]), run_dir=str(run_dir), rollout_engine="vllm",
                prompts_per_step=1, group_size=2, max_steps=2, max_new_tokens=8, budget=1024, max_context=1024,
                lr=3e-3, steps=2, vllm_kv_cache_gib=0.25)
    cfg = RLConfig(**{**base, **kw})
    return train(cfg, reward_fn=reward, progress=False), seen


@pytest.mark.parametrize("adapter", ["none", pytest.param("lora", marks=pytest.mark.slow)])  # lora: a 2nd engine
def test_second_step_rollouts_come_from_the_updated_weights(served, kit, tmp_path, adapter):
    """Step 0 samples from the initial weights; the trainer's exact (radix) logprobs of them equal vLLM's
    records within 1e-5. The step's update is large enough to see: under the *initial* weights, step 1's
    records are > 1e-3 away. Yet the trainer at step 1 (holding the updated weights) reproduces step 1's
    records within 1e-5: the engine sampled from the synced weights (LoRA: its merged weights)."""
    extra = {"adapter": {"kind": "lora", "rank": 4, "target_modules": ["q_proj", "v_proj"]}, "lr": 3e-2} \
        if adapter == "lora" else {}
    result, seen = run_two_steps(served, kit, tmp_path, **extra)
    m0, m1 = result.metrics
    samples = [[c.response_tokens for c in t.calls] for t in seen[0]]
    assert m0["groups_with_signal"] == 1.0 and m0["compared_targets"] > 0, (m0, samples)
    assert m0["logprob_abs_diff"] < 1e-5 and m1["logprob_abs_diff"] < 1e-5, (m0["logprob_abs_diff"], m1["logprob_abs_diff"])
    assert m0["weight_sync_seconds"] > 0 and m1["weight_sync_seconds"] > 0
    initial_gap, n = logprobs_under(served, seen[1])
    assert n > 0 and initial_gap > 1e-3, initial_gap
    step0_gap, _ = logprobs_under(served, seen[0])
    assert step0_gap < 1e-5


def test_harness_sessions_sampled_by_vllm_are_the_forward_of_the_synced_weights(served, kit, tmp_path):
    """``tasks=`` with ``rollout_engine=vllm``: the gateway serves the in-process engine, and after step
    0's update the engine holds the new weights — step 1's rollout logprobs equal a plain forward of the
    checkpoint after step 0 (max ≤ 1e-5), not of the weights before it."""
    from test_harness_rl import AGENT, CRC, plain_gap, write_tasks

    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "one", "prompt": "Say something.", "verifier": CRC},
                                                   {"id": "two", "prompt": "Say more.", "verifier": CRC}])
    run = tmp_path / "run"
    result = train(RLConfig(model=str(served), tokenizer=str(kit[0]), run_dir=str(run), tasks=str(tasks), harness=AGENT,
                            rollout_engine="vllm", prompts_per_step=2, group_size=2, steps=2, lr=1e-2,
                            max_new_tokens=24, save_every=1, keep_checkpoints=5, deadline=120), progress=False)
    assert [m["sessions_failed"] for m in result.metrics] == [0, 0]
    assert all(m["groups_with_signal"] == 1.0 for m in result.metrics)
    gap0, n0 = plain_gap(served, None, run / "rollouts" / "step-0.jsonl")
    gap1, n1 = plain_gap(served, run / "checkpoints" / "step-000001", run / "rollouts" / "step-1.jsonl")
    stale, _ = plain_gap(served, None, run / "rollouts" / "step-1.jsonl")
    assert n0 > 0 and n1 > 0 and gap0 <= 1e-5 and gap1 <= 1e-5, (gap0, gap1)
    assert stale > 1e-3, stale
