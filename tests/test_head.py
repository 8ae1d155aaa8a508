"""The LM head a chunk of targets at a time (engine/head.py): the same numbers and gradients as the whole
[targets, V] computation, memory that does not grow with the vocabulary, every head a user trains
(plain, tied, soft-capped and scaled, PEFT-wrapped), and the radix schedule's own activation
checkpointing and bf16 path against plain forwards."""

from __future__ import annotations

import math

import pytest
import torch

from engine_cases import grads, load_model, max_rel_grad_diff, one_thread, random_groups
from memorywalker.bench.memory import PeakMemory
from memorywalker.engine import EngineConfig, run
from memorywalker.engine.head import OutputHead, chunked_forward_kl, chunked_total_variation, target_logprobs
from memorywalker.layout import Batch
from memorywalker.objectives.losses import forward_kl


def test_a_logprob_derived_by_hand():
    """h = [1, 0], W rows [1, 0], [0, 0], [0, 0]: logits (1, 0, 0), so
    log p(0) = 1 − log(e + 2) = 1 − 1.551445 = −0.551445 and log p(1) = −1.551445;
    ∂ log p(0) / ∂z = e_0 − softmax(z) = (1 − e/(e+2), −1/(e+2), −1/(e+2)) = (0.423883, −0.211942, −0.211942),
    so ∂/∂W row 0 = 0.423883 · h = (0.423883, 0)."""
    lin = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    h = torch.tensor([[1.0, 0.0], [1.0, 0.0]], requires_grad=True)
    lp = target_logprobs(OutputHead(lin), h, torch.tensor([0, 1]), chunk=1)
    assert lp.tolist() == pytest.approx([1 - math.log(math.e + 2), -math.log(math.e + 2)], abs=1e-6)
    lp[0].backward()
    assert lin.weight.grad[:, 0].tolist() == pytest.approx([0.423883, -0.211942, -0.211942], abs=1e-6)
    assert lin.weight.grad[:, 1].abs().max().item() == 0.0


def _reference(lin, h, y, softcap=None, scale=1.0, temperature=1.0):
    """The whole [P, V] computation with autograd: log_softmax(transform(h W^T + b) / T)[y]."""
    z = lin(h).float() * scale
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    return torch.log_softmax(z / temperature, -1).gather(1, y[:, None])[:, 0]


def _lora_head(lin):
    """``lin`` wrapped by PEFT's LoRA (initialised non-zero, so the adapter changes the logits)."""
    from peft import LoraConfig, get_peft_model

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = lin

    peft = get_peft_model(Wrap(), LoraConfig(r=4, target_modules=["lm_head"], init_lora_weights=False))
    return peft.base_model.model.lm_head


@pytest.mark.parametrize("kind", ["linear", "bias", "lora"])
@pytest.mark.parametrize("softcap,scale,temperature", [(None, 1.0, 1.0), (30.0, 0.5, 0.7)], ids=["plain", "transformed"])
@pytest.mark.parametrize("chunk", [1, 7, 1000], ids=["rows-1", "rows-7", "one-chunk"])
def test_chunked_logprobs_equal_the_whole_computation(kind, softcap, scale, temperature, chunk):
    """Values within 1e-6 and every gradient (hidden states, weight, bias, LoRA A/B) within 1e-5 relative
    of the [P, V] reference, whatever the chunk; the plain Linear runs the fused function, the LoRA
    head the checkpointed chunks."""
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(16, 300, bias=kind == "bias")
    head_module = _lora_head(lin) if kind == "lora" else lin
    head = OutputHead(head_module, softcap, scale)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 300, (37,), generator=g)
    w = torch.randn(37, generator=g)
    params = [h] + [p for p in head_module.parameters() if p.requires_grad]
    lp = target_logprobs(head, h, y, temperature=temperature, chunk=chunk)
    got = torch.autograd.grad((lp * w).sum(), params)
    ref = _reference(head_module, h, y, softcap, scale, temperature)
    want = torch.autograd.grad((ref * w).sum(), params)
    assert (lp - ref).abs().max().item() <= 1e-6
    assert max_rel_grad_diff(list(got), list(want)) <= 1e-5


def test_chunked_kl_and_drift_equal_the_whole_distributions():
    """KL(teacher ‖ student) per row, its gradient to the student's hidden states and the head, and the
    total variation, against the same quantities on whole [J, V] distributions."""
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(8, 50)
    head = OutputHead(lin)
    t, s = torch.randn(11, 8, generator=g), torch.randn(11, 8, generator=g, requires_grad=True)
    kl = chunked_forward_kl(head, t, s, temperature=0.8, chunk=3)
    ref = forward_kl(lin(t).detach() / 0.8, lin(s) / 0.8)
    assert (kl - ref).abs().max().item() <= 1e-6
    got = torch.autograd.grad(kl.sum(), [s, lin.weight, lin.bias])
    want = torch.autograd.grad(ref.sum(), [s, lin.weight, lin.bias])
    assert max_rel_grad_diff(list(got), list(want)) <= 1e-5
    tv = chunked_total_variation(head, t, s.detach(), chunk=4)
    want_tv = 0.5 * (torch.softmax(lin(t), -1) - torch.softmax(lin(s), -1)).abs().sum(-1)
    assert (tv - want_tv).abs().max().item() <= 1e-6


def _peak_of_a_step(vocab: int, targets: int, rows: int) -> float:
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(16, vocab, bias=False)
    h = torch.randn(targets, 16, generator=g, requires_grad=True)
    y = torch.randint(0, vocab, (targets,), generator=g)
    with one_thread(), PeakMemory(torch.device("cpu")) as mem:
        target_logprobs(OutputHead(lin), h, y, chunk=rows).sum().backward()
    return mem.peak_mib


def test_peak_memory_does_not_grow_with_the_vocabulary_beyond_one_chunk():
    """2,000 targets, 64 rows per chunk. At V = 50,000 a whole [2000, V] fp32 logits tensor alone is
    381 MiB (autograd holds several). Chunked, the step's peak above V = 782's is bounded by what must
    grow with V: one chunk's logits and their gradient (2 × 64 × 50,000 × 4 B = 24.4 MiB) plus the
    weight gradient and its fp32 accumulator (2 × 50,000 × 16 × 4 B = 6.1 MiB): 30.5 MiB, with 50 %
    slack for the allocator. And 4x the targets at V = 50,000 adds at most that slack again: the peak
    does not grow with the number of targets either."""
    small = _peak_of_a_step(782, 2000, 64)
    large = _peak_of_a_step(50_000, 2000, 64)
    more_targets = _peak_of_a_step(50_000, 8000, 64)
    bound = (2 * 64 * 50_000 * 4 + 2 * 50_000 * 16 * 4) / 2**20
    assert large - small <= 1.5 * bound, (small, large)
    assert more_targets - large <= 0.5 * bound, (large, more_targets)
    assert large < 381 / 4


def _plain_per_call(model, groups):
    """Per-target logprobs (batch order) from one plain model(input_ids=S_t) forward per call, and the
    gradient of their token-mean NLL."""
    model.zero_grad(set_to_none=True)
    out = []
    for group in groups:
        for rt in group:
            for rc in rt.calls:
                if rc.targets:
                    logits = model(input_ids=torch.tensor([rc.tokens])).logits[0].float()
                    idx = torch.tensor(rc.targets)
                    out.append(torch.log_softmax(logits, -1)[idx - 1, torch.tensor(rc.tokens)[idx]])
    ref = torch.cat(out)
    (-ref.sum() / len(ref)).backward()
    return ref.detach(), [g.float() for g in grads(model)]


def test_tied_embeddings_radix_equals_plain_forwards(kit, renderer):
    """A kit model with tied input/output embeddings: the head's weight is the embedding matrix, whose
    gradient gets both uses; radix equals plain per-call forwards (1e-5, gradients 1e-4 relative)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(kit[1])
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.train()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    groups = random_groups(renderer, seed=3)
    with one_thread():
        ref, ref_grads = _plain_per_call(model, groups)
        model.zero_grad(set_to_none=True)
        res = run(model, Batch.from_groups(groups), EngineConfig(method="radix", max_tokens=48))
    assert (res.logprobs - ref).abs().max().item() <= 1e-5
    assert max_rel_grad_diff(grads(model), ref_grads) <= 1e-4


def test_a_logits_transform_the_head_does_not_know_fails_loudly(kit, renderer):
    """A model whose forward rescales its logits in a way OutputHead does not reproduce: the first run
    raises (once-per-model check of the head against the model's own logits) instead of training on
    wrong log-probabilities."""
    model = load_model(kit[1])
    forward = model.forward

    def rescaled(*args, **kwargs):  # what e.g. Granite's forward does after its head (logits / scaling)
        out = forward(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out

    model.forward = rescaled
    with one_thread(), pytest.raises(ValueError, match="does not reproduce"):
        run(model, Batch.from_groups(random_groups(renderer, seed=4)), EngineConfig(method="radix"), backward=False)


def test_checkpointed_radix_gives_the_same_logprobs_and_gradients(kit, renderer):
    """checkpoint_chunks recomputes each forward's layers in the backward from the cached keys/values:
    the same operations, so the same logprobs and gradients (fp32, 1e-5 relative), chunked trees
    (max_tokens 48) and sdcc's students included."""
    model = load_model(kit[1])
    groups = random_groups(renderer, seed=5)
    with one_thread():
        for method in ("radix", "sdcc"):
            out = []
            for ckpt in (False, True):
                model.zero_grad(set_to_none=True)
                res = run(model, Batch.from_groups(groups), EngineConfig(method=method, max_tokens=48,
                                                                         checkpoint_chunks=ckpt))
                out.append((res.logprobs, res.loss, grads(model)))
            (lp0, l0, g0), (lp1, l1, g1) = out
            assert torch.equal(torch.isnan(lp0), torch.isnan(lp1))
            assert torch.nan_to_num(lp0 - lp1).abs().max().item() <= 1e-6
            assert abs(l0.item() - l1.item()) <= 1e-6
            assert max_rel_grad_diff(g1, g0) <= 1e-5


# Measured on the kit model (tests/test_head.py, seeds 0-2, whole and chunked): bf16 radix, tree-mask and
# logit-tree against plain bf16 per-call forwards differ by at most 2.9e-3 nats per target and 1.8e-2
# relative in the gradient (fp32: 9.5e-7 and 2.2e-7). The tolerances below leave ~3x margin.
BF16_LOGPROB_TOL = 1e-2
BF16_GRAD_TOL = 5e-2


@pytest.mark.parametrize("max_tokens", [8192, 48], ids=["whole", "chunked"])
def test_bf16_radix_equals_plain_bf16_forwards(kit, renderer, max_tokens):
    """Weights in bf16, logits and log-sum-exp in fp32 per chunk: radix against a plain bf16
    model(input_ids=S_t) forward per call, within the measured bf16 tolerance."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(kit[1], dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    groups = random_groups(renderer, seed=0)
    with one_thread():
        ref, ref_grads = _plain_per_call(model, groups)
        model.zero_grad(set_to_none=True)
        res = run(model, Batch.from_groups(groups), EngineConfig(method="radix", max_tokens=max_tokens))
    diff = (res.logprobs - ref).abs().max().item()
    assert 0 < diff <= BF16_LOGPROB_TOL  # not 0: bf16 rounding differs between the schedules
    assert max_rel_grad_diff([g.float() for g in grads(model)], ref_grads) <= BF16_GRAD_TOL
