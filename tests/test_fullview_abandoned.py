"""SDCC's full view leaves out abandoned responses (issue 10 a): a retry's first attempt, a refused
proposal, any response that no later context holds and no eviction removes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from memorywalker.engine import EngineConfig, layout_for, run
from memorywalker.layout.batch import Batch
from memorywalker.records import TrajectoryBuilder
from memorywalker.render import Renderer

ABANDONED = "Orvo Tamsin founded it, I think."


def retried(evicted: bool):
    """A trajectory with one retry, and its uncompressed twin (same messages, every context uncompressed).

    Calls (``bad`` is the abandoned attempt: call 2 is re-issued on call 1's context ``C``)::

        call-0  [s, u]                   -> a0   "Let me think about it."
        call-1  C = [s, u, a0, n0]        -> bad
        call-2  C                        -> a1   (search)
        call-3  C + [a1, t1]             -> a2   (the answer)

    With ``evicted`` a summarize eviction before call 1 replaces ``a0`` by a harness summary, ``C = [s,
    u, summary, n0]``: then no later context holds ``a0`` either, but the eviction removes it, so it
    stays. The full view is ``s, u, a0, n0, a1, t1, a2`` in both cases; the twin's contexts are its
    prefixes, with ``bad`` where it was sampled.
    """
    def build(compress: bool):
        b = TrajectoryBuilder("retry")
        s, u = b.message("system", "sys"), b.message("user", "Who founded Alder Works?")
        a0 = b.message("assistant", "Let me think about it.")
        n0 = b.message("user", "Go on, search for it.")
        bad = b.message("assistant", ABANDONED)
        a1 = b.message("assistant", "Let me check the founder.",
                       tool_calls=[{"id": "tc1", "name": "search", "arguments": {"query": "alder founder"}}])
        t1 = b.message("tool", "Search results: Alder Works was founded by Mira Quell.", tool_call_id="tc1",
                       name="search")
        a2 = b.message("assistant", "Mira Quell founded Alder Works.")
        b.call([s, u], a0)
        ctx = [s, u, a0, n0]
        if compress:
            summary = b.message("user", "Summary: the user asked who founded Alder Works.", author="harness")
            ctx = [s, u, summary, n0]
            b.eviction("call-1", "summarize", removed=[a0], inserted=[summary])
        b.call(ctx, bad)
        b.call(ctx, a1)
        b.call([*ctx, a1, t1], a2)
        return b.build()

    return build(evicted), build(False)


@pytest.mark.parametrize("evicted", [False, True])
def test_abandoned_response_is_not_in_the_full_view(tokenizer, evicted):
    traj, _ = retried(evicted)
    view = Renderer(tokenizer).render(traj, full_view=True).full_view
    text = tokenizer.decode(view.token_ids.tolist())
    assert ABANDONED not in text
    for kept in ("Let me think about it.", "Go on, search", "Let me check the founder.",
                 "Mira Quell founded Alder Works."):
        assert text.count(kept) == 1, kept
    assert "Summary:" not in text  # the artifact, as before
    assert set(view.response_start) == {0, 2, 3} and set(view.abandoned) == {1} and view.unmatched == []
    # The abandoned attempt gets its own uncompressed sequence: the full view up to its context, then it.
    ids, start = view.abandoned[1]
    assert tokenizer.decode(ids[start:].tolist()).startswith(ABANDONED)
    assert ids[:start].tolist() == view.token_ids[:view.response_start[2]].tolist()


@pytest.mark.parametrize("evicted", [False, True])
def test_sdcc_main_loss_is_per_call_on_the_uncompressed_twin(kit, tokenizer, evicted):
    """SDCC's main logprobs condition each call on its uncompressed history, which here is exactly what
    the twin's calls were sent: per-call logprobs of the twin, call by call (<= 1e-5), the abandoned
    attempt included and none lost. With ``bad`` in the full view, calls 2 and 3 would see it."""
    model = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    traj, twin = retried(evicted)
    renderer = Renderer(tokenizer)
    batch = Batch.from_groups([[renderer.render(traj, full_view=True)]])
    ref_batch = Batch.from_groups([[renderer.render(twin)]])
    assert batch.targets.call.tolist() == ref_batch.targets.call.tolist()
    ref = run(model, ref_batch, EngineConfig(method="per-call"), backward=False).logprobs
    res = run(model, batch, EngineConfig(method="sdcc"), backward=False)
    assert res.metrics["lost_targets"] == 0 and res.metrics["unmatched_calls"] == 0
    assert (res.logprobs - ref).abs().max().item() <= 1e-5
    # The same logprobs with the abandoned response spliced in would differ: the check has teeth.
    later = torch.from_numpy(batch.targets.call >= 2)
    dfs = run(model, ref_batch, EngineConfig(method="dfs"), backward=False).logprobs
    assert (dfs[later] - ref[later]).abs().max().item() > 1e-3
    # One student per junction: call 2 (the retry) always, call 1 too when an eviction precedes it.
    layout = layout_for(batch, EngineConfig(method="sdcc"))
    assert set(layout.kl_call.tolist()) == ({1, 2} if evicted else {2})
    assert [c.junction for c in batch.calls] == [False, evicted, True, False]
