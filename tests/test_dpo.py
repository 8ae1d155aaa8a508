"""Trajectory DPO: the hand-derived loss, pair admission, cancelling shared tokens, and exactness of the
tree-based step against plain per-call forwards (no engine code in the reference)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from engine_cases import grads, load_model, max_rel_grad_diff, one_thread
from memorywalker.engine import METHODS, EngineConfig
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
from memorywalker.objectives.preference import dpo_loss
from memorywalker.recipes.dpo import DPOConfig, pair_step
from memorywalker.tree.pairs import PairRejected, admit_pair, rule_pairs

EXACT = [m.name for m in METHODS.values() if m.exact]


def _t(*v):
    return torch.tensor(v, dtype=torch.float64)


@pytest.mark.parametrize("beta,margin,loss,coef", [(0.2, 0.6, 0.4375, 0.0709), (0.4, 1.2, 0.2633, 0.0926)])
def test_dpo_loss_hand_derived(beta, margin, loss, coef):
    """Policy sums −8 (chosen) / −11 (rejected), reference −10 / −10:
    m = β[(−8 + 10) − (−11 + 10)] = 3β  (0.6 at β=0.2, 1.2 at β=0.4);
    ℓ = −log σ(m) = log(1 + e^{−m})  (0.4375, 0.2633);
    dℓ/dlogp_w = −β σ(−m), dℓ/dlogp_l = +β σ(−m):  0.2·0.3543 = 0.0709,  0.4·0.2315 = 0.0926."""
    pw, pl = _t(-8.0).requires_grad_(), _t(-11.0).requires_grad_()
    out, st = dpo_loss(pw, pl, _t(-10.0), _t(-10.0), beta=beta)
    assert st["margin"].item() == pytest.approx(margin, abs=1e-12)
    assert out.item() == pytest.approx(loss, abs=5e-5)
    assert out.item() == pytest.approx(math.log1p(math.exp(-margin)), abs=1e-12)
    assert torch.sigmoid(-st["margin"]).item() == pytest.approx(1 / (1 + math.exp(margin)), abs=1e-12)
    assert st["coefficient"].item() == pytest.approx(coef, abs=5e-5)
    gw, gl = torch.autograd.grad(out.sum(), (pw, pl))
    assert gw.item() == pytest.approx(-coef, abs=5e-5) and gl.item() == pytest.approx(coef, abs=5e-5)
    if beta == 0.2:
        assert torch.sigmoid(-st["margin"]).item() == pytest.approx(0.354, abs=5e-4)


def test_dpo_length_normalization_and_sft_term():
    """4 chosen and 5 rejected scored tokens, β=0.2: m = 0.2[(−8/4 + 10/4) − (−11/5 + 10/5)] = 0.2·0.7 = 0.14;
    with sft_weight 0.5 the loss adds 0.5 · 8/4 = 1.0."""
    n_w, n_l = _t(4.0), _t(5.0)
    out, st = dpo_loss(_t(-8.0), _t(-11.0), _t(-10.0), _t(-10.0), beta=0.2, chosen_tokens=n_w,
                       rejected_tokens=n_l, length_normalize=True, sft_weight=0.5)
    assert st["margin"].item() == pytest.approx(0.14, abs=1e-12)
    assert out.item() == pytest.approx(math.log1p(math.exp(-0.14)) + 1.0, abs=1e-12)
    with pytest.raises(ValueError, match="need chosen_tokens"):
        dpo_loss(_t(-8.0), _t(-11.0), _t(-10.0), _t(-10.0), length_normalize=True)


# --- admission --------------------------------------------------------------------------------------


def _group(renderer, seed=0, size=2, evictions=2):
    return [renderer.render(t) for t in synthetic_group(SyntheticSpec(turns=4, evictions=evictions, words=5,
                                                                        seed=seed), f"g{seed}", size)]


def test_pair_of_two_rollouts_of_one_task_branches_inside_the_first_response(renderer):
    """Two rollouts of one task share the prompt and 3 words of the first response: the branch is
    call 0, after its prompt; 'divergent' scores the first response from the branch on and every
    later call, 'whole' every target."""
    w, lo = _group(renderer)
    pair = admit_pair(w, lo)
    assert pair.branch_call == 0
    assert pair.branch_token > w.calls[0].prompt_len  # the shared words come first
    assert w.calls[0].tokens[:pair.branch_token] == lo.calls[0].tokens[:pair.branch_token]
    assert w.calls[0].tokens[pair.branch_token] != lo.calls[0].tokens[pair.branch_token]
    assert pair.chosen_scored[0] == [t for t in w.calls[0].targets if t >= pair.branch_token]
    assert all(pair.chosen_scored[c.index] == c.targets for c in w.calls[1:] if c.targets)
    whole = admit_pair(w, lo, "whole")
    assert whole.num_scored(0) == sum(len(c.targets) for c in w.calls) > pair.num_scored(0)


def test_pair_whose_contexts_differ_before_the_branch_is_rejected_with_a_reason(renderer):
    a = renderer.render(synthetic_trajectory(SyntheticSpec(turns=3, evictions=0, words=5, seed=1), "a"))
    b = renderer.render(synthetic_trajectory(SyntheticSpec(turns=3, evictions=0, words=5, seed=1), "b"))
    with pytest.raises(PairRejected, match=r"contexts differ before the branch: call 0 .* from token \d+"):
        admit_pair(a, b)
    with pytest.raises(PairRejected, match="identical calls"):
        admit_pair(a, a)


def test_preference_rule_pairs_rollouts_of_one_task():
    """'reward' prefers the higher reward inside a task; equal tool calls give no 'fewer-tool-calls' pair."""
    from memorywalker.records.schema import Task

    g = synthetic_group(SyntheticSpec(turns=3, evictions=0, words=4), "task", 3)
    for t, r in zip(g, (1.0, 0.0, 1.0), strict=True):
        t.task, t.reward = Task(id="task-1"), r
    assert rule_pairs(g, "reward") == [(g[0].id, g[1].id), (g[2].id, g[1].id)]
    assert rule_pairs(g, "fewer-tool-calls") == []  # equal tool calls: no preference
    with pytest.raises(ValueError, match="valid"):
        rule_pairs(g, "longest")


# --- the step: cancelling shared tokens, exactness against plain per-call forwards ----------------------


@pytest.fixture(scope="module")
def models(kit):
    policy = load_model(kit[1])
    policy.eval()
    ref = copy.deepcopy(policy)
    with torch.no_grad():  # a reference that differs from the policy, so reference sums matter
        g = torch.Generator().manual_seed(0)
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return policy, ref


def plain_side_sum(model, rt, scored: dict[int, list[int]]) -> torch.Tensor:
    """Σ log p(S_t[i] | S_t[:i]) over the scored indices, one plain model(input_ids) forward per call."""
    total = torch.zeros((), dtype=torch.float64)
    for rc in rt.calls:
        if rc.index not in scored:
            continue
        logits = model(input_ids=torch.tensor([rc.tokens])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        idx = torch.tensor(scored[rc.index])
        total = total + logp[idx - 1, torch.tensor(rc.tokens)[idx]].double().sum()
    return total


def plain_dpo(policy, ref, pairs, cfg: DPOConfig) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Mean DPO loss over the pairs and its gradient, from plain per-call forwards only."""
    policy.zero_grad(set_to_none=True)
    with torch.no_grad():
        r = [[plain_side_sum(ref, p.chosen, p.chosen_scored), plain_side_sum(ref, p.rejected, p.rejected_scored)]
             for p in pairs]
    pw = torch.stack([plain_side_sum(policy, p.chosen, p.chosen_scored) for p in pairs])
    pl = torch.stack([plain_side_sum(policy, p.rejected, p.rejected_scored) for p in pairs])
    n = torch.tensor([[p.num_scored(0), p.num_scored(1)] for p in pairs], dtype=torch.float64)
    r = torch.tensor(r, dtype=torch.float64)
    loss, _ = dpo_loss(pw, pl, r[:, 0], r[:, 1], beta=cfg.beta, chosen_tokens=n[:, 0], rejected_tokens=n[:, 1],
                       length_normalize=cfg.length_normalize, sft_weight=cfg.sft_weight)
    loss = loss.mean()
    loss.backward()
    return loss.detach(), grads(policy), r


def engine_dpo(policy, pairs, ref_sums, cfg: DPOConfig, method: str):
    policy.zero_grad(set_to_none=True)
    engine = EngineConfig(method=method, attention="sdpa", max_tokens=cfg.max_tokens)
    out = pair_step(policy, pairs, ref_sums, engine, cfg, torch.tensor(float(len(pairs))))
    return out["loss"], grads(policy)


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("variant", ["plain", "length-sft"])
def test_dpo_on_a_forest_of_two_rollouts_equals_per_call_dpo(renderer, models, method, variant):
    """Two pairs, each two rollouts of one task with 2 evictions (one forest per pair): the tree-based
    step's loss and gradients equal the per-call DPO of the same pairs within 1e-4 relative."""
    policy, ref = models
    pairs = [admit_pair(*_group(renderer, seed=s)) for s in (0, 1)]
    cfg = DPOConfig(beta=0.3, **({"length_normalize": True, "sft_weight": 0.5} if variant == "length-sft" else {}))
    with one_thread():
        want_loss, want_grads, ref_sums = plain_dpo(policy, ref, pairs, cfg)
        loss, got = engine_dpo(policy, pairs, ref_sums, cfg, method)
    assert abs(loss.item() - want_loss.item()) <= 1e-4 * abs(want_loss.item())
    assert max_rel_grad_diff(got, want_grads) <= 1e-4
    assert sum(g.norm().item() for g in want_grads) > 0


def test_identical_tokens_under_an_identical_prefix_cancel(renderer, models):
    """'whole' adds the shared prefix's targets to both sums: the same logprobs on both sides (same
    buffer positions of the forest), so the margin, the loss and the gradient equal 'divergent''s."""
    policy, ref = models
    w, lo = _group(renderer, seed=2)
    cfg = DPOConfig(beta=0.5)
    out = {}
    for scored in ("divergent", "whole"):
        pair = admit_pair(w, lo, scored)
        with one_thread():
            _, _, ref_sums = plain_dpo(policy, ref, [pair], cfg)
            out[scored] = engine_dpo(policy, [pair], ref_sums, cfg, "radix")
    assert admit_pair(w, lo, "whole").num_scored(0) > admit_pair(w, lo).num_scored(0)
    assert out["whole"][0].item() == pytest.approx(out["divergent"][0].item(), abs=1e-6)
    assert max_rel_grad_diff(out["whole"][1], out["divergent"][1]) <= 1e-4


def test_naive_conditioning_is_caught(renderer, models):
    """dfs conditions the calls after an eviction on evicted text: its DPO loss differs from the
    per-call one, so the exactness test above can fail."""
    policy, ref = models
    pairs = [admit_pair(*_group(renderer, seed=0))]
    cfg = DPOConfig(beta=0.3)
    with one_thread():
        want_loss, _, ref_sums = plain_dpo(policy, ref, pairs, cfg)
        loss, _ = engine_dpo(policy, pairs, ref_sums, cfg, "dfs")
    assert abs(loss.item() - want_loss.item()) > 1e-3
