"""The engine entry point: run a method + objective on a model for one micro-batch, backward included."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from memorywalker.attention.masks import use_backend
from memorywalker.engine.config import Denominators, EngineConfig
from memorywalker.engine.forward import model_device
from memorywalker.engine.logprobs import (
    _check_backend,
    columns,
    denominators_of,
    kl_term,
    layout_for,
    stream,
    student_means,
    weights_of,
)
from memorywalker.engine.methods import get_method
from memorywalker.engine.objective import apply_rollout_correction, get_objective
from memorywalker.layout.batch import Batch
from memorywalker.layout.layouts import Layout
from memorywalker.objectives.metrics import gap_metrics
from memorywalker.objectives.normalize import aggregate, reduce_denominator


@dataclass
class EngineResult:
    loss: torch.Tensor  # scalar, detached: the loss this call backpropagated (or would have)
    logprobs: torch.Tensor  # float32 [N] per batch target (batch.targets order); NaN where lost
    weight: torch.Tensor  # float32 [N] the weights trained with (0 where the method lost a target)
    metrics: dict[str, float | torch.Tensor]
    layout: Layout = field(repr=False)
    eps_kl: torch.Tensor | None = None  # sdcc: float32 [J] mean per-token KL of each student


def step_denominators(batches: Sequence[Batch], cfg: EngineConfig, group=None) -> Denominators:
    """Denominators of one optimizer step: every micro-batch this rank runs, all-reduced over ranks.

    Call on every rank with its own micro-batches, then pass the result to each :func:`run`.
    """
    loss, kl = [], []
    for b in batches:
        layout = layout_for(b, cfg)
        _, d, k = denominators_of(b, layout, cfg, layout.weight)
        loss.append(d)
        kl.append(k)
    return Denominators(reduce_denominator(loss, group), reduce_denominator(kl, group))


def run(model, batch: Batch, cfg: EngineConfig | None = None, *, backward: bool = True,
        denominators: Denominators | None = None, advantages=None, weights=None,
        old_logprobs=None, schedule=None) -> EngineResult:
    """Run ``cfg.method`` + ``cfg.objective`` on ``model`` for ``batch``: :func:`~memorywalker.engine.loss`,
    streamed buffer by buffer.

    With ``backward=True`` gradients are accumulated into ``model``'s parameters (``.grad``), by one
    backward per buffer (methods with ``backward="each"``: one buffer's graph alive at a time) or one in
    all (``sdcc``); the optimizer step is the caller's. A batch whose loss is 0 by construction — an
    objective scaled by the advantage, every advantage 0, no KL term — accumulates nothing and runs no
    backward. With ``backward=False`` nothing is differentiated (evaluation).
    ``denominators`` come from :func:`step_denominators` over every micro-batch of the step; when
    omitted, this batch is the whole step (all-reduced over ranks when torch.distributed is up).
    ``advantages``, ``weights``, ``old_logprobs``: per-target [N] inputs overriding the batch's.
    ``schedule``: what runs each backward, ``schedule.backward(loss)`` — a sharded step's
    (:class:`memorywalker.train.sharded_step.StepSchedule`: the ranks agree on every pass); default
    ``loss.backward()``.
    """
    cfg = cfg or EngineConfig()
    backward_of = schedule.backward if schedule is not None else torch.Tensor.backward
    method, objective = get_method(cfg.method), get_objective(cfg.objective)
    layout = layout_for(batch, cfg)
    device = model_device(model)
    n = len(batch.targets)
    weight = weights_of(layout, weights)
    coef, d_local, k_local = denominators_of(batch, layout, cfg, weight)
    if denominators is None:
        denominators = Denominators(reduce_denominator([d_local]), reduce_denominator([k_local]))
    coef = coef.to(device)
    den = denominators.loss.to(device)
    cols = columns(batch, objective, cfg, device, advantages=advantages, old_logprobs=old_logprobs)
    # without backward this may be the pass that computes π_old (or an evaluation): no correction needed
    correction_stats, correction_metrics = apply_rollout_correction(cols, batch, cfg, required=backward)

    if backward and objective.scaled_by_advantage and not method.kl and not cols.advantage.any():
        # No target has an advantage (every GRPO group of the batch had equal rewards): the gradient is
        # exactly 0, so the forwards run for the logprobs and metrics only. The optimizer step is the same:
        # optimizer_step treats a missing gradient as zeros; no collective happens inside the engine.
        backward = False
    logprobs = torch.full((n,), float("nan"), device=device)
    stats: dict[str, torch.Tensor] = dict(correction_stats)
    total = torch.zeros((), device=device)
    pending = torch.zeros((), device=device)  # graph of a one-backward method
    kl_rows = torch.zeros(len(layout.kl_call), device=device)
    passes = {"forwards": 0, "tokens": 0, "backwards": 0}
    grad = torch.enable_grad() if backward else torch.no_grad()
    with grad, use_backend(model, cfg.attention if method.schedule == "mask" else None) as backend:
        backend = backend if method.schedule == "mask" else None
        _check_backend(backend, model)
        for out in stream(model, batch, layout, cfg, backend):
            passes["forwards"] += out.forwards
            passes["tokens"] += out.tokens
            rows = out.rows
            logprobs[rows] = out.logprob.detach()
            chunk = torch.zeros((), device=device)
            if len(rows):
                per_target, st = objective.per_target(out.logprob, cols.take(rows), cfg)
                chunk = aggregate(per_target, coef[rows], den, cfg.dp_size)
                for k, v in st.items():
                    stats.setdefault(k, torch.full((n,), float("nan"), device=device))[rows] = v.detach()
            if out.kl is not None:
                kl_rows = kl_rows.index_put((out.kl_rows,), out.kl, accumulate=True)
            if method.backward == "each":
                if backward and chunk.requires_grad:
                    backward_of(chunk)
                    passes["backwards"] += 1
                total = total + chunk.detach()
            else:
                pending = pending + chunk

        eps_kl = None
        if method.kl:
            eps_kl = student_means(kl_rows, layout.kl_call)
            pending = pending + kl_term(eps_kl, denominators, cfg)
            eps_kl = eps_kl.detach()
        if method.backward == "once":
            if backward and pending.requires_grad:
                backward_of(pending)
                passes["backwards"] += 1
            total = pending.detach()

    metrics = _metrics(batch, layout, passes, logprobs, stats, eps_kl)
    metrics.update(correction_metrics)
    metrics["loss"] = total
    return EngineResult(total, logprobs, torch.from_numpy(weight), metrics, layout, eps_kl)


def _metrics(batch: Batch, layout: Layout, passes: dict[str, int], logprobs: torch.Tensor,
             stats: dict[str, torch.Tensor], eps_kl: torch.Tensor | None) -> dict:
    out: dict = {
        "forwards": passes["forwards"],
        "backwards": passes["backwards"],
        "tokens": layout.tokens,  # the layout's tokens (what the forwards see)
        "processed_tokens": passes["tokens"],  # what the forwards ran: masked buffers padded to the backend's multiple
        "buffers": len(layout.buffers),
        "targets": len(batch.targets),
        "lost_targets": int(layout.lost.sum()),
    }
    # Each mean comes with the count it is over, so a step's micro-batches combine by weighting with it
    # (train/step.py ``reduce_step_metrics``): trained_targets for mean_*, compared_* for the gap metrics.
    trained = torch.from_numpy(layout.weight > 0).to(logprobs.device)
    for k, v in stats.items():
        ok = trained & torch.isfinite(v)  # every objective stat is set on the same trained targets
        out[f"mean_{k}"] = torch.where(ok, v, torch.zeros_like(v)).sum() / ok.sum()
    if stats:
        out["trained_targets"] = ok.sum()
    if np.isfinite(batch.targets.rollout_logprob).any():
        rollout = torch.from_numpy(batch.targets.rollout_logprob).to(logprobs.device)
        call = torch.from_numpy(batch.targets.call).to(logprobs.device)
        out.update(gap_metrics(logprobs, rollout, call))
        compared = torch.isfinite(logprobs) & torch.isfinite(rollout)
        out["compared_targets"] = compared.sum()
        out["compared_calls"] = torch.unique(call[compared]).numel()
    if eps_kl is not None:
        out["students"] = len(eps_kl)
        out["unmatched_calls"] = len(layout.unmatched_calls)
        if len(eps_kl):
            mean, mx = eps_kl.mean(), eps_kl.max()
            out.update(eps_kl_mean=mean, eps_kl_max=mx, tv_bound=torch.sqrt(mean / 2), tv_bound_max=torch.sqrt(mx / 2))
        else:
            zero = torch.zeros((), device=eps_kl.device)
            out.update(eps_kl_mean=zero, eps_kl_max=zero, tv_bound=zero, tv_bound_max=zero)
    return out
