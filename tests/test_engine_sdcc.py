"""SDCC: one backward, students equal plain forwards of their own S_t, eps_kl = 0 without evictions, and
training on the KL lowers eps_kl."""

from __future__ import annotations

import pytest
import torch

from engine_cases import (
    grads,
    load_model,
    max_rel_grad_diff,
    no_eviction_batch,
    one_thread,
    random_batch,
    random_groups,
)
from memorywalker.engine import EngineConfig, run
from memorywalker.engine.forward import forward_layout
from memorywalker.engine.methods import get_method
from memorywalker.layout import Batch
from memorywalker.objectives.losses import forward_kl


def _count_backwards(model) -> list[int]:
    """A hook on the output embedding's weight fires once per backward pass that reaches it."""
    count = [0]
    model.get_output_embeddings().weight.register_hook(lambda g: count.__setitem__(0, count[0] + 1))
    return count


def test_sdcc_runs_exactly_one_backward(kit, renderer):
    model = load_model(kit[1])
    count = _count_backwards(model)
    batch = random_batch(renderer, seed=4)
    with one_thread():
        res = run(model, batch, EngineConfig(method="sdcc", sdcc_lambda=1.0))
    assert count[0] == 1 and res.metrics["backwards"] == 1
    n_students = sum(c.junction for c in batch.calls)
    assert res.metrics["students"] == n_students == len(res.eps_kl) >= 5
    views = sum(len(t.trajectory_ids) for t in batch.trees)
    # One full view per trajectory and one sequence per abandoned attempt (the retry's first try), packed;
    # then the students: each tree with a junction once (the long one and the group's; the short one has none).
    abandoned = sum(len(rt.full_view.abandoned) for g in batch.rendered for rt in g)
    assert abandoned == 1
    lay = res.layout
    assert sum(b.pieces for b in lay.buffers[:lay.teacher_buffers]) == views + abandoned
    assert sum(b.pieces for b in lay.buffers[lay.teacher_buffers:]) == len(batch.trees) - 1 == 2
    assert len(lay.buffers) == 2  # 8192 tokens hold every full view in one buffer, every tree in another
    assert res.metrics["unmatched_calls"] == 0 and res.metrics["lost_targets"] == 0
    assert (res.eps_kl > 0).all()
    assert torch.allclose(res.metrics["tv_bound"], torch.sqrt(res.eps_kl.mean() / 2))
    assert res.metrics["eps_kl_max"] == res.eps_kl.max()
    # The hook counts every backward: logit-tree runs one per segment.
    count[0] = 0
    model.zero_grad()
    with one_thread():
        lt = run(model, batch, EngineConfig(method="logit-tree"))
    assert count[0] == lt.metrics["backwards"] > 1


def test_sdcc_without_evictions_is_per_call(kit, renderer):
    """No eviction: no junction, so eps_kl is exactly 0; distilling every call anyway gives KL ≈ 0,
    and the full view's logprobs are the per-call ones (the full view is what every call saw)."""
    model = load_model(kit[1])
    batch = no_eviction_batch(renderer)
    with one_thread():
        res = run(model, batch, EngineConfig(method="sdcc"))
        ref = run(model, batch, EngineConfig(method="per-call"), backward=False)
        every = run(model, batch, EngineConfig(method="sdcc", sdcc_students="all"), backward=False)
    assert res.metrics["students"] == 0 and res.metrics["eps_kl_mean"] == 0 and res.metrics["eps_kl_max"] == 0
    assert (res.logprobs - ref.logprobs).abs().max().item() <= 1e-5
    assert every.metrics["students"] == sum(c.selected for c in batch.calls)
    assert every.eps_kl.max().item() <= 1e-6


def test_optimizer_steps_lower_eps_kl(kit, renderer):
    """Five Adam steps on SDCC's loss (λ = 10) lower eps_kl at every step and by more than half.

    The tiny random model is near-uniform (eps_kl ~ 1e-5, lost in the noise of the main loss), so its
    output layer is scaled by 10 first: sharper distributions whose conditioning matters.
    """
    model = load_model(kit[1])
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(10.0)
    batch = random_batch(renderer, seed=5)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    cfg = EngineConfig(method="sdcc", sdcc_lambda=10.0)
    history = []
    with one_thread():
        for _ in range(5):
            opt.zero_grad()
            res = run(model, batch, cfg)
            history.append(res.metrics["eps_kl_mean"].item())
            opt.step()
        history.append(run(model, batch, cfg, backward=False).metrics["eps_kl_mean"].item())
    assert all(b < a for a, b in zip(history, history[1:], strict=False)), history
    assert history[-1] < 0.5 * history[0], history


@pytest.mark.parametrize("max_tokens", [8192, 48], ids=["whole", "chunked"])
def test_sdcc_students_equal_plain_forwards_of_their_contexts(kit, renderer, max_tokens):
    """Each student distribution — read off its tree, sharing prefixes with the other students — equals
    log_softmax of a plain ``model(input_ids=S_t)`` forward of that call alone (the reference: the
    rendered call's tokens, default positions, no memorywalker buffer or mask), at every response token;
    and the KL term's gradient equals the gradient of Σ_j mean_i KL(teacher ‖ plain student) / J.

    The KL term's engine gradient is the difference of two runs, λ = 1 minus λ = 0 (the main loss is the
    same in both). Teachers are the engine's full-view logits, detached: constants of the loss.
    """
    model = load_model(kit[1])
    groups = random_groups(renderer, seed=6)
    batch = Batch.from_groups(groups)
    rendered = [rc for g in groups for rt in g for rc in rt.calls]
    assert len(rendered) == len(batch.calls)
    cfg = EngineConfig(method="sdcc", max_tokens=max_tokens)
    with one_thread():
        with torch.no_grad():
            outs = list(forward_layout(model, get_method("sdcc").build_layout(batch, cfg),
                                       torch.from_numpy(batch.targets.label), get_method("sdcc"), max_tokens))
        lay = get_method("sdcc").build_layout(batch, cfg)
        hidden = {"teacher": torch.empty(len(lay.kl_call), model.config.hidden_size)}
        hidden["student"] = torch.empty_like(hidden["teacher"])
        for b, out in enumerate(outs):
            if out.kl_hidden is not None:  # max_tokens 48: a buffer per full view, some without a junction
                side = "teacher" if b < lay.teacher_buffers else "student"
                hidden[side][torch.from_numpy(out.buffer.kl_row)] = out.kl_hidden
        with torch.no_grad():  # the distributions the engine's hidden states give, through the model's own head
            teacher, student = (model.lm_head(hidden[k]) for k in ("teacher", "student"))
        # The reference: one plain forward per junction call; its KL rows are its targets in order.
        model.zero_grad(set_to_none=True)
        students = sorted(set(lay.kl_call.tolist()))
        assert len(students) == sum(c.junction for c in batch.calls) >= 5
        total = torch.zeros(())
        for g in students:
            rc = rendered[g]
            logits = model(input_ids=torch.tensor([rc.tokens])).logits[0].float()
            plain = logits[torch.tensor(rc.targets) - 1]
            rows = torch.from_numpy((lay.kl_call == g).nonzero()[0])
            assert len(rows) == len(rc.targets)
            diff = (torch.log_softmax(student[rows], -1) - torch.log_softmax(plain.detach(), -1)).abs().max()
            assert diff.item() <= 1e-5, (g, diff.item())
            total = total + forward_kl(teacher[rows], plain).mean()
        (total / len(students)).backward()
        ref = grads(model)
        engine = []
        for lam in (1.0, 0.0):
            model.zero_grad(set_to_none=True)
            run(model, batch, EngineConfig(method="sdcc", max_tokens=max_tokens, sdcc_lambda=lam))
            engine.append(grads(model))
    kl_grad = [a - b for a, b in zip(*engine, strict=True)]
    assert max_rel_grad_diff(kl_grad, ref) <= 1e-3


def test_compressed_main_trains_students_on_their_delivered_context(kit, renderer):
    """sdcc_compressed_main: a junction call's main-loss logprobs are those of a plain forward of its own
    S_t (1e-5), the other calls' are the full view's (unchanged from the default), and the KL rows and
    eps_kl are the same as without the option."""
    model = load_model(kit[1])
    groups = random_groups(renderer, seed=11)
    batch = Batch.from_groups(groups)
    rendered = [rc for g in groups for rt in g for rc in rt.calls]
    with one_thread():
        base = run(model, batch, EngineConfig(method="sdcc"), backward=False)
        comp = run(model, batch, EngineConfig(method="sdcc", sdcc_compressed_main=True), backward=False)
        junction = torch.tensor([batch.calls[c].junction for c in batch.targets.call])
        assert junction.any() and (~junction).any()
        plain = []
        for rc in rendered:
            if rc.targets:
                logits = model(input_ids=torch.tensor([rc.tokens])).logits[0].float()
                idx = torch.tensor(rc.targets)
                plain.append(torch.log_softmax(logits, -1)[idx - 1, torch.tensor(rc.tokens)[idx]])
    plain = torch.cat(plain)
    assert (comp.logprobs[junction] - plain[junction]).abs().max().item() <= 1e-5
    assert (comp.logprobs[junction] - base.logprobs[junction]).abs().max().item() > 1e-3  # the full view differs
    assert torch.nan_to_num(comp.logprobs[~junction] - base.logprobs[~junction]).abs().max().item() <= 1e-6
    assert (comp.eps_kl - base.eps_kl).abs().max().item() <= 1e-6


def test_full_view_with_the_harness_artifacts(renderer):
    """RenderOptions(full_view_artifacts=True): the summary a harness inserted appears in the full view
    (its tokens are a run inside it); without the option it does not."""
    from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
    from memorywalker.render import Renderer, RenderOptions

    traj = synthetic_trajectory(SyntheticSpec(turns=5, evictions=2, words=6, seed=3), "arts")
    artifacts = [m for m in traj.messages if m.is_artifact and m.content]
    assert artifacts
    text = artifacts[0].content
    plain = renderer.render(traj, full_view=True).full_view
    kept = Renderer(renderer.tok, RenderOptions(full_view_artifacts=True)).render(traj, full_view=True).full_view
    decode = renderer.tok.decode
    assert text in decode(kept.token_ids.tolist()) and text not in decode(plain.token_ids.tolist())
    assert len(kept.token_ids) > len(plain.token_ids)
