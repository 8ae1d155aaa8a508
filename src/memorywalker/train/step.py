"""Pieces of one optimizer step that both recipes share: who trains on what, the update, the metrics.

>>> rank_micro_batches(list(range(8)), DistInfo(rank=1, world_size=2), grad_accum=2)
[[4, 5], [6, 7]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from memorywalker.errors import InputError
from memorywalker.train.adapter import apply_adapter, trainable_parameters
from memorywalker.train.distributed import DistInfo, allreduce_gradients, gather_objects
from memorywalker.train.fsdp import full_norm, is_sharded, parallelize

T = TypeVar("T")

# Engine metrics that add up over micro-batches and ranks.
SUMMED = ("loss", "forwards", "backwards", "tokens", "processed_tokens", "buffers", "targets", "lost_targets",
          "students", "unmatched_calls", "trained_targets", "compared_targets", "compared_calls",
          "rollout_corr/targets", "rollout_corr/sequences",
          "empty_forwards", "empty_backwards")  # fsdp: the passes ranks ran to match another's (train/sharded_step.py)
# Means and the count each is over: a step's value is the count-weighted mean of its micro-batches'.
WEIGHTED = {"logprob_abs_diff": "compared_targets", "k3_kl": "compared_targets", "chi2_token": "compared_targets",
            "log_ppl_abs_diff": "compared_calls", "eps_kl_mean": "students", "mean_ratio": "trained_targets",
            "mean_clipped": "trained_targets", "mean_tis_weight": "trained_targets",
            "mean_rollout_is": "trained_targets", "mean_rollout_rs_masked": "trained_targets",
            # rollout correction (objectives/rollout_correction.py): token means, then sequence means; the
            # effective sample size is not a mean, so its step value is the micro-batches' weighted average
            **{f"rollout_corr/{k}": "rollout_corr/targets" for k in (
                "kl", "k3_kl", "chi2_token", "rollout_is_mean", "rollout_is_ratio_fraction_high",
                "rollout_is_ratio_fraction_low", "rollout_is_eff_sample_size")},
            **{f"rollout_corr/{k}": "rollout_corr/sequences" for k in (
                "chi2_seq", "training_ppl", "rollout_ppl", "log_ppl_abs_diff")}}
# Functions of a reduced mean or max, recomputed from it: Pinsker's bound sqrt(eps_kl / 2).
DERIVED = {"tv_bound": ("eps_kl_mean", lambda x: math.sqrt(x / 2)),
           "tv_bound_max": ("eps_kl_max", lambda x: math.sqrt(x / 2))}


@dataclass
class TrainResult:
    run_dir: Path
    final_dir: Path  # run_dir/final: a Hugging Face model dir (save_pretrained) with the tokenizer
    steps: int  # optimizer steps the run has taken in total (resumed ones included)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one row per step run by this process


def check_divisible(global_items: int, info: DistInfo, grad_accum: int, what: str) -> int:
    """Items per micro-batch; every rank runs ``grad_accum`` micro-batches of equal size (collectives)."""
    parts = info.world_size * grad_accum
    if global_items % parts:
        raise InputError(f"{what}={global_items} must be divisible by world_size × grad_accum = "
                         f"{info.world_size} × {grad_accum}")
    return global_items // parts


def rank_micro_batches(items: Sequence[T], info: DistInfo, grad_accum: int) -> list[list[T]]:
    """This rank's micro-batches of one step's global ``items``: contiguous, equal slices.

    Rank r takes slice r of ``world_size`` equal slices and cuts it into ``grad_accum`` micro-batches,
    so 1 rank × 2 micro-batches and 2 ranks × 1 micro-batch see the same partition.
    """
    size = check_divisible(len(items), info, grad_accum, "items per step")
    mine = list(items[info.rank * size * grad_accum:(info.rank + 1) * size * grad_accum])
    return [mine[i * size:(i + 1) * size] for i in range(grad_accum)]


def prepare_training(model: torch.nn.Module, cfg, info: DistInfo
                     ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model a recipe trains and its AdamW: the adapter applied first (``adapter.kind=lora``: only
    it trains), then sharded (``parallel=fsdp``) or given activation checkpointing, then the optimizer
    over the trainable parameters. Hash the base weights before calling this (the manifests pin them)."""
    model = apply_adapter(model, cfg.adapter)
    model = parallelize(model, cfg, info)  # fsdp: fully_shard per decoder layer + root (train/fsdp.py)
    params = trainable_parameters(model)
    # Fused: one kernel per parameter with no temporaries. The unfused CPU step allocates its square
    # roots and quotients per tensor, about 3 copies of the largest one at its peak (an embedding shard:
    # the largest transient of a sharded step at a real vocabulary; docs/benchmarks.md).
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay, fused=fused or None)
    return model, optimizer


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, lr: float,
                   grad_clip: float | None) -> torch.Tensor:
    """Sum gradients over ranks, clip their global norm, step, zero. Returns the pre-clip norm.

    A sharded model (``parallel="fsdp"``) has its gradients summed already: each backward of the step
    reduce-scattered them into the sharded ``.grad`` (:mod:`memorywalker.train.sharded_step`); a
    replicated one all-reduces them here, once."""
    if not is_sharded(model):
        allreduce_gradients(model)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # unused by every target of the step: a zero gradient, as under DDP
            p.grad = torch.zeros_like(p)
    norm = full_norm(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else math.inf))
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def reduce_step_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Combine the engine metrics of this rank's micro-batches with every other rank's, so that the
    result is what one engine call on the whole step would report, however the step is split.

    ``SUMMED`` keys add up; ``*_max`` keys take the max, ``*_min`` the min; a ``WEIGHTED`` mean is weighted by its count
    (micro-batch means m_i over n_i items: Σ n_i m_i / Σ n_i); a ``DERIVED`` key is recomputed from its
    reduced source; any other key averages over the micro-batches that report a finite value. Syncs
    tensors to floats once, here.

    Two micro-batches, one target with |Δlogp| 0.1 and three with mean 0.5: the step's mean is
    (1·0.1 + 3·0.5) / 4 = 0.4, not (0.1 + 0.5) / 2 = 0.3.

    >>> out = reduce_step_metrics([{"logprob_abs_diff": 0.1, "compared_targets": 1},
    ...                            {"logprob_abs_diff": 0.5, "compared_targets": 3}])
    >>> round(out["logprob_abs_diff"], 6), out["compared_targets"]
    (0.4, 4.0)
    """
    plain = [{k: float(v) for k, v in r.items()} for r in rows]
    every = [r for rank_rows in gather_objects(plain) for r in rank_rows]
    out: dict[str, float] = {}
    for key in sorted({k for r in every for k in r} - set(DERIVED)):
        vals = [r[key] for r in every if key in r and math.isfinite(r[key])]
        if key in SUMMED:
            out[key] = sum(vals)
        elif key.endswith("_max"):
            out[key] = max(vals) if vals else math.nan
        elif key.endswith("_min"):
            out[key] = min(vals) if vals else math.nan
        elif key in WEIGHTED and all(WEIGHTED[key] in r for r in every if key in r):
            pairs = [(r[WEIGHTED[key]], r[key]) for r in every if key in r and r[WEIGHTED[key]] > 0]
            n = sum(w for w, _ in pairs)
            out[key] = sum(w * v for w, v in pairs) / n if n else math.nan
        else:
            out[key] = sum(vals) / len(vals) if vals else math.nan
    for key, (source, fn) in DERIVED.items():
        if any(key in r for r in every):
            out[key] = fn(out[source]) if math.isfinite(out.get(source, math.nan)) else math.nan
    return out


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps`` optimizer steps, then constant.

    >>> [warmup_lr(1.0, s, 4) for s in range(5)]
    [0.25, 0.5, 0.75, 1.0, 1.0]
    """
    return lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else lr


def step_trajectories(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of the trajectories of optimizer step ``step`` (0-based): the data stream is one seeded
    permutation of ``range(n)`` per epoch, read ``batch_size`` at a time from position ``step × batch_size``.
    Pure, so a resumed run reads exactly what an uninterrupted one reads.

    >>> step_trajectories(5, 3, 0, seed=0) + step_trajectories(5, 3, 1, seed=0)[:2] == (
    ...     np.random.default_rng([0, 0]).permutation(5).tolist())
    True
    """
    pos, out = step * batch_size, []
    while len(out) < batch_size:
        epoch, i = divmod(pos, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        take = min(batch_size - len(out), n - i)
        out += perm[i:i + take].tolist()
        pos += take
    return out
