"""Shared cases for the layout / attention / engine tests: tiny models and random trees.

Imported by ``tests/test_layout*.py``, ``test_attention*.py``, ``test_engine*.py``, ``test_bench*.py``,
``test_gap.py`` and ``test_viewer.py``.
"""

from __future__ import annotations

import contextlib

import torch

from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
from memorywalker.layout import Batch
from memorywalker.render import Renderer


@contextlib.contextmanager
def one_thread():
    """The test machine's cores are shared: one intra-op thread is ~10x faster than two contending."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def load_model(model_dir, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn, dtype=torch.float32)
    model.train()  # dropout is 0 in the kit's configs; train mode is what a recipe runs
    return model


def random_groups(renderer: Renderer, seed: int = 0) -> list:
    """Rendered groups whose trees cover the exactness cases:

    * a trajectory with 6 evictions and a call re-issued with the same context (a branch right at a
      response start);
    * a GRPO group of 3 rollouts with evictions, merged into one forest at the shared prompt, their
      first responses sharing words (buffer positions carrying several targets);
    * a short trajectory without evictions.
    """
    long = synthetic_trajectory(SyntheticSpec(turns=9, evictions=6, words=5, retries=1, seed=seed), f"long-{seed}")
    group = synthetic_group(SyntheticSpec(turns=4, evictions=2, words=5, seed=seed), f"grp-{seed}", 3)
    short = synthetic_trajectory(SyntheticSpec(turns=3, evictions=0, words=5, seed=seed), f"short-{seed}")

    def render(t):
        return renderer.render(t, full_view=True)

    return [[render(long)], [render(t) for t in group], [render(short)]]


def random_batch(renderer: Renderer, seed: int = 0) -> Batch:
    return Batch.from_groups(random_groups(renderer, seed))


def no_eviction_batch(renderer: Renderer, seed: int = 0) -> Batch:
    trajs = [synthetic_trajectory(SyntheticSpec(turns=4, evictions=0, words=5, seed=seed + i), f"plain-{seed}-{i}")
             for i in range(2)]
    return Batch.from_groups([[renderer.render(t, full_view=True)] for t in trajs])


def grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def max_rel_grad_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """max over parameters of ||a − b|| / ||b||  (parameters with a zero reference gradient: ||a − b||)."""
    out = 0.0
    for x, y in zip(a, b, strict=True):
        ref = y.norm().item()
        out = max(out, (x - y).norm().item() / (ref if ref > 0 else 1.0))
    return out


def with_rollout_logprobs(model, renderer, traj):
    """``traj`` with each call's rollout logprobs from a plain causal forward of its own S_t."""
    rt = renderer.render(traj)
    calls = []
    for call, rc in zip(traj.calls, rt.calls, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([rc.tokens])).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(rc.tokens[1:])[:, None])[:, 0]
        calls.append(call.model_copy(update={
            "context_tokens": rc.tokens[: rc.prompt_len], "response_tokens": rc.tokens[rc.prompt_len:],
            "rollout_logprobs": lp[rc.prompt_len - 1:].tolist()}))
    return traj.model_copy(update={"calls": calls})
