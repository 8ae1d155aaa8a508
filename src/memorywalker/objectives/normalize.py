"""Declared loss normalization (DESIGN.md, "Normalization"), one function for every mode.

``loss = Σ_i c_i ℓ_i / D`` where the coefficients ``c_i`` and the denominator ``D`` depend on the mode:

===========  ==================================  =========================================
mode         c_i                                 D
===========  ==================================  =========================================
token        w_i                                 Σ_i w_i
call         w_i / Σ_{j ∈ call(i)} w_j           number of calls with weight
trajectory   w_i / Σ_{j ∈ traj(i)} w_j           number of trajectories with weight
sequence     w_i (a sum per sequence, for DPO)   number of calls (sequences) with weight
===========  ==================================  =========================================

``c_i`` needs only the targets of one call or trajectory, which always sit in one tree and so in one
micro-batch. ``D`` is a sum over everything one optimizer step sees: :func:`reduce_denominator` adds the
micro-batches' denominators and all-reduces over data-parallel ranks before anything is divided. A
trajectory split into more segments or calls therefore gets no more weight under ``trajectory``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memorywalker.errors import InputError

NORMALIZATIONS = ("token", "call", "trajectory", "sequence")
# Per-target modes, for SFT and RL; ``sequence`` sums each sequence (DPO's pairs).
TARGET_NORMALIZATIONS = tuple(n for n in NORMALIZATIONS if n != "sequence")


def normalize(weight: torch.Tensor, call: torch.Tensor, trajectory: torch.Tensor, mode: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficients ``c`` [N] and this batch's denominator ``D`` (scalar) of ``mode``.

    ``weight`` float [N] (0 = not trained), ``call``/``trajectory`` int64 [N] group ids.
    """
    if mode not in NORMALIZATIONS:
        raise InputError(f"unknown normalization {mode!r}; valid: {list(NORMALIZATIONS)}")
    if mode == "token":
        return weight, weight.sum()  # c = w, D = Σ w
    ids = trajectory if mode == "trajectory" else call
    uniq, inv = torch.unique(ids, return_inverse=True)
    group_w = torch.zeros(len(uniq), dtype=weight.dtype, device=weight.device).index_add_(0, inv, weight)
    denom = (group_w > 0).sum().to(weight.dtype)  # groups that carry weight
    if mode == "sequence":
        return weight, denom  # c = w, D = number of sequences
    coef = weight / group_w[inv].clamp(min=torch.finfo(weight.dtype).tiny)  # c_i = w_i / Σ_{g(i)} w
    return coef, denom


def reduce_denominator(denominators: Sequence[torch.Tensor], group=None) -> torch.Tensor:
    """Sum of the micro-batches' denominators, all-reduced over data-parallel ranks when
    ``torch.distributed`` is initialized. Call it once per optimizer step, on every rank."""
    # a rank with nothing to train this step (its harness sessions all failed) still takes part in the sum
    total = torch.stack([torch.as_tensor(d, dtype=torch.float64) for d in denominators]).sum() if denominators \
        else torch.zeros((), dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=group)
    return total


def aggregate(per_target: torch.Tensor, coef: torch.Tensor, denominator: torch.Tensor, dp_size: int = 1) -> torch.Tensor:
    """``Σ_i c_i ℓ_i / D · dp_size`` (scalar). ``dp_size`` undoes the averaging of gradients over
    data-parallel ranks (DDP/FSDP average), so the summed step gradient is that of ``Σ c ℓ / D``."""
    return (coef * per_target).sum() / denominator.to(per_target.dtype) * dp_size
