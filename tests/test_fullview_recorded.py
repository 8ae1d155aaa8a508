"""SDCC's full view with recorded (sampled) tokens that tokenize the text non-canonically."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from memorywalker.engine import EngineConfig, layout_for, run
from memorywalker.layout.batch import Batch
from memorywalker.records import TrajectoryBuilder
from memorywalker.render import Renderer, message_to_hf


def char_ids(tokenizer, text):
    """A non-canonical tokenization: one token per character (byte-level BPE has them all)."""
    return [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]


def sampled_episode(tokenizer):
    """Two calls and a summarize eviction; call 0's response was sampled character by character."""
    b = TrajectoryBuilder("sampled")
    s, u = b.message("system", "sys"), b.message("user", "Who founded it?")
    a0 = b.message("assistant", "Mira Quell")
    hf = [message_to_hf(m) for m in b.messages]

    def prompt(msgs):
        return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))

    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    r0 = char_ids(tokenizer, "Mira Quell") + [eot]
    b.call([s, u], a0, context_tokens=prompt(hf[:2]), response_tokens=r0, rollout_logprobs=[-1.0] * len(r0))
    summ = b.message("user", "Summary: asked who founded it.", author="harness")
    a1 = b.message("assistant", "Done")
    msgs1 = [hf[0], hf[1], message_to_hf(b.messages[3])]
    r1 = tokenizer("Done<|im_end|>", add_special_tokens=False)["input_ids"]
    b.call([s, u, summ], a1, context_tokens=prompt(msgs1), response_tokens=r1, rollout_logprobs=[-1.0] * len(r1))
    b.eviction("call-1", "summarize", removed=[a0], inserted=[summ])
    return b.build(), r0


def test_full_view_holds_the_sampled_tokens_and_matches_every_call(tokenizer):
    traj, r0 = sampled_episode(tokenizer)
    renderer = Renderer(tokenizer)
    rt = renderer.render(traj, full_view=True)
    assert rt.calls[0].rendered_response != r0  # the sample is not the canonical tokenization
    view = rt.full_view
    assert view.unmatched == [] and set(view.response_start) == {0, 1}
    start = view.response_start[0]
    assert view.token_ids[start: start + len(r0)].tolist() == r0
    layout = layout_for(Batch.from_groups([[rt]]), EngineConfig(method="sdcc"))
    assert not layout.lost.any() and len(layout.kl_call) == len(rt.calls[1].targets)


def test_first_call_in_the_full_view_equals_per_call(kit, tokenizer):
    """Before the eviction the full view is exactly S_0, so SDCC's main logprobs of call 0 equal
    the per-call ones."""
    model = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    traj, r0 = sampled_episode(tokenizer)
    renderer = Renderer(tokenizer)
    batch = Batch.from_groups([[renderer.render(traj, full_view=True)]])
    first = torch.from_numpy(batch.targets.call == 0)
    ref = run(model, batch, EngineConfig(method="per-call"), backward=False).logprobs
    got = run(model, batch, EngineConfig(method="sdcc"), backward=False).logprobs
    assert torch.allclose(got[first], ref[first], atol=1e-5)


def test_harness_side_calls_keep_their_own_context(kit, tokenizer):
    """A summarization call (purpose="summarize") has no place in the uncompressed history: it is
    absent from the full view, SDCC trains it on its own S_t (= per-call logprobs) and gives it no
    student; the act call after the eviction still gets one."""
    b = TrajectoryBuilder("compaction")
    s, u = b.message("system", "sys"), b.message("user", "Who founded Alder Works?")
    a0 = b.message("assistant", "Let me think.")
    b.call([s, u], a0)
    req = b.message("user", "Summarize the conversation so far.", author="harness")
    summary = b.message("assistant", "The user asks who founded Alder Works.")
    b.call([s, u, a0, req], summary, purpose="summarize")
    inserted = b.message("user", "Summary: the user asks who founded Alder Works.", author="harness")
    b.eviction("call-2", "summarize", removed=[a0], inserted=[inserted])
    b.call([s, u, inserted], b.message("assistant", "Mira Quell"))
    traj = b.build()

    renderer = Renderer(tokenizer)
    rt = renderer.render(traj, full_view=True)
    view = rt.full_view
    assert view.harness_calls == [1] and set(view.response_start) == {0, 2}
    assert "The user asks" not in tokenizer.decode(view.token_ids.tolist())
    batch = Batch.from_groups([[rt]])
    layout = layout_for(batch, EngineConfig(method="sdcc"))
    assert not layout.lost.any() and set(layout.kl_call.tolist()) == {2}
    model = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    ref = run(model, batch, EngineConfig(method="per-call"), backward=False).logprobs
    got = run(model, batch, EngineConfig(method="sdcc"), backward=False).logprobs
    early = torch.from_numpy(batch.targets.call <= 1)
    assert torch.allclose(got[early], ref[early], atol=1e-5)
    # The summarization call against a plain forward of its own tokens (no engine code): log p(S_t[i] | S_t[:i]).
    rc = rt.calls[1]
    with torch.no_grad():
        plain = torch.log_softmax(model(input_ids=torch.tensor([rc.tokens])).logits[0].float(), -1)
    idx = torch.tensor(rc.targets)
    expected = plain[idx - 1, torch.tensor(rc.tokens)[idx]]
    assert torch.allclose(got[torch.from_numpy(batch.targets.call == 1)], expected, atol=1e-5)
