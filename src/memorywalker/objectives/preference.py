"""Sequence-level preference losses: pure functions over per-pair log-probability sums. ``P`` pairs.

DPO (Rafailov et al. 2023, https://arxiv.org/abs/2305.18290) on trajectories: each side of a pair is
the sum of its scored targets' logprobs (the divergent spans after the branch, or the whole record),
computed exactly on the pair's conditioning tree by any exact method. The recipe turns the gradient of
this loss with respect to each sum into per-target coefficients (``d loss / d logp_i = d loss / d sum``
for every target ``i`` of that sum), so a non-decomposable sequence loss trains through the engine's
per-target backward.

>>> import torch
>>> loss, st = dpo_loss(torch.tensor([-8.]), torch.tensor([-11.]), torch.tensor([-10.]), torch.tensor([-10.]),
...                     beta=0.2)
>>> round(st["margin"].item(), 4), round(loss.item(), 4)
(0.6, 0.4375)
"""

from __future__ import annotations

import torch


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, *, beta: float = 0.1, chosen_tokens: torch.Tensor | None = None,
             rejected_tokens: torch.Tensor | None = None, length_normalize: bool = False,
             sft_weight: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO loss per pair [P] and stats ``margin``, ``coefficient`` (β·σ(−m)), ``chosen_reward``,
    ``rejected_reward``, ``sft`` (all [P], detached).

    ``policy_*``, ``ref_*``: [P] summed logprobs of each side's scored targets under the policy and
    the reference. ``*_tokens``: [P] number of scored targets per side, needed for
    ``length_normalize`` (sums become means, both policy and reference) and for ``sft_weight``
    (an NLL term on the preferred side, a mean per token: RPO, Pang et al. 2024,
    https://arxiv.org/abs/2404.19733).
    """
    if (length_normalize or sft_weight) and (chosen_tokens is None or rejected_tokens is None):
        raise ValueError("length_normalize and sft_weight need chosen_tokens and rejected_tokens")
    pw, pl, rw, rl = policy_chosen, policy_rejected, ref_chosen, ref_rejected
    if length_normalize:
        nw, nl = chosen_tokens.to(pw.dtype).clamp(min=1), rejected_tokens.to(pw.dtype).clamp(min=1)
        pw, rw, pl, rl = pw / nw, rw / nw, pl / nl, rl / nl  # mean logprob per scored token
    chosen_reward = beta * (pw - rw)  # β (log π_θ(y_w) − log π_ref(y_w))
    rejected_reward = beta * (pl - rl)  # β (log π_θ(y_l) − log π_ref(y_l))
    margin = chosen_reward - rejected_reward  # m = β[(logp_w − logp_ref_w) − (logp_l − logp_ref_l)]
    loss = -torch.nn.functional.logsigmoid(margin)  # ℓ = −log σ(m)
    sft = torch.zeros_like(loss)
    if sft_weight:
        sft = -policy_chosen / chosen_tokens.to(pw.dtype).clamp(min=1)  # NLL per token of the preferred side
        loss = loss + sft_weight * sft
    stats = {"margin": margin.detach(), "coefficient": (beta * torch.sigmoid(-margin)).detach(),  # |dℓ/dlogp| = β σ(−m)
             "chosen_reward": chosen_reward.detach(), "rejected_reward": rejected_reward.detach(),
             "sft": sft.detach()}
    return loss, stats
