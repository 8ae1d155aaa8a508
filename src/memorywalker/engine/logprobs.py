"""Differentiable per-target log-probabilities: the engine as a function another trainer can call.

    from memorywalker.engine import Batch, EngineConfig, logprobs, loss

    batch = Batch.from_token_ids([[TokenCall(ids, response_start=k), ...], ...])   # or Batch.from_groups
    out = logprobs(model, batch, EngineConfig(method="radix"))   # out.values: [N], with the graph
    my_loss = my_objective(out.values, out.targets)              # anything differentiable
    my_loss.backward()

:func:`logprobs` runs ``cfg.method``'s forwards under the caller's grad mode and returns the exact
per-target log-probabilities (``values``, aligned to ``batch.targets``) with their graph, the target
table beside them (trajectory, call, weight, rollout logprob, advantage) and, for ``sdcc``, the KL of
each student row. :func:`loss` builds an engine objective on it (the per-target inputs — advantages,
weights, old logprobs — are arguments, never mutations of the batch). :func:`memorywalker.engine.run`
is the same computation streamed: each buffer's objective is backpropagated before the next buffer
runs, which holds one buffer's graph at a time instead of the micro-batch's.

The model's attention implementation is switched for a masked method only inside the call and
restored after it (:func:`memorywalker.attention.masks.use_backend`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from memorywalker.attention.masks import Backend, use_backend
from memorywalker.engine.config import Denominators, EngineConfig
from memorywalker.engine.forward import forward_layout, model_device
from memorywalker.engine.head import OutputHead, chunked_forward_kl
from memorywalker.engine.methods import get_method
from memorywalker.engine.objective import Columns, Objective, apply_rollout_correction, get_objective
from memorywalker.errors import InputError
from memorywalker.layout.batch import Batch
from memorywalker.layout.layouts import Layout
from memorywalker.objectives.normalize import aggregate, normalize, reduce_denominator
from memorywalker.tree.tree import Targets


@dataclass
class BufferLogprobs:
    """What one buffer of a layout gives: its targets' logprobs and (sdcc students) KL rows."""

    rows: torch.Tensor  # int64 [M] rows of batch.targets
    logprob: torch.Tensor  # float32 [M] log p(label), with the graph under grad mode
    kl_rows: torch.Tensor | None  # int64 [j] KL pairing rows (a student buffer of sdcc), else None
    kl: torch.Tensor | None  # float32 [j] KL(teacher ‖ student) per row, with the graph
    forwards: int
    tokens: int


def stream(model, batch: Batch, layout: Layout, cfg: EngineConfig, backend: Backend | None
           ) -> Iterator[BufferLogprobs]:
    """Every buffer of ``layout`` in order (the caller may backpropagate each before the next runs).

    SDCC: the teacher buffers (full views) come first; their hidden states at the KL rows are kept,
    detached, and each student row's KL(teacher ‖ student) is computed a chunk of rows at a time."""
    method = get_method(cfg.method)
    device = model_device(model)
    head = OutputHead.of(model)
    teacher: torch.Tensor | None = None  # [K, H] detached teacher hidden states (sdcc)
    outputs = forward_layout(model, layout, torch.from_numpy(batch.targets.label), method, cfg.max_tokens,
                             backend, cfg.temperature, cfg.checkpoint_chunks)
    for b, out in enumerate(outputs):
        kl_rows = kl = None
        if out.kl_hidden is not None:
            k_idx = torch.from_numpy(out.buffer.kl_row).to(device)
            if b < layout.teacher_buffers:
                if teacher is None:
                    teacher = out.kl_hidden.new_empty(len(layout.kl_call), out.kl_hidden.shape[-1])
                teacher[k_idx] = out.kl_hidden.detach()  # stop-gradient; its distribution is recomputed per chunk
            else:
                kl_rows = k_idx
                kl = chunked_forward_kl(head, teacher[k_idx], out.kl_hidden, temperature=cfg.temperature)
        yield BufferLogprobs(torch.from_numpy(out.buffer.target_row).to(device), out.logprob, kl_rows, kl,
                             out.forwards, out.tokens)


@dataclass
class TargetLogprobs:
    """Per-target log-probabilities of a batch under a method, with their graph."""

    values: torch.Tensor  # float32 [N] log p(label) per batch target (batch.targets order); NaN where lost
    targets: Targets  # the batch's target table: position, label, call, trajectory, weight, rollout logprob, advantage
    weight: torch.Tensor  # float32 [N] the weights the method trains with (0 where it lost a target)
    lost: torch.Tensor  # bool [N] targets the method cannot supervise (rightmost: evicted responses)
    layout: Layout = field(repr=False)
    kl: torch.Tensor | None = None  # sdcc: float32 [K] KL(teacher ‖ student) per KL row, with the graph
    kl_call: np.ndarray | None = None  # sdcc: int64 [K] batch call of each KL row (its student)
    forwards: int = 0
    tokens: int = 0  # tokens the forwards processed

    def eps_kl(self) -> torch.Tensor:
        """sdcc: [J] the mean per-token KL of each student (DESIGN.md's eps_kl), with the graph."""
        return student_means(self.kl, self.kl_call)


def student_means(kl: torch.Tensor, kl_call: np.ndarray) -> torch.Tensor:
    """Mean KL per student (rows grouped by their call): [K], [K] -> [J] in order of the call ids."""
    if not len(kl_call):
        return kl.new_zeros(0)
    uniq, inv = np.unique(kl_call, return_inverse=True)
    inv = torch.from_numpy(inv).to(kl.device)
    counts = torch.zeros(len(uniq), device=kl.device).index_add_(0, inv, torch.ones_like(kl))
    return torch.zeros(len(uniq), device=kl.device).index_add(0, inv, kl) / counts


def layout_for(batch: Batch, cfg: EngineConfig) -> Layout:
    return get_method(cfg.method).build_layout(batch, cfg)


def _check_backend(backend: Backend | None, model) -> None:
    if backend is not None and backend.name == "flex" and torch.is_grad_enabled() and model_device(model).type != "cuda":
        raise InputError("FlexAttention has no backward on CPU: train with attention='sdpa' or 'eager' here, "
                         "or run flex under torch.no_grad()")


def logprobs(model, batch: Batch, cfg: EngineConfig | None = None) -> TargetLogprobs:
    """Exact (or the method's) log p(label) of every target of ``batch``, differentiable.

    Runs under the caller's grad mode: inside ``torch.no_grad()`` nothing is kept for a backward. The
    whole micro-batch's graph is held until the caller's backward (``run`` streams buffer by buffer
    instead)."""
    cfg = cfg or EngineConfig()
    method = get_method(cfg.method)
    layout = layout_for(batch, cfg)
    device = model_device(model)
    n = len(batch.targets)
    values = torch.full((n,), float("nan"), device=device)
    kl = torch.zeros(len(layout.kl_call), device=device) if method.kl else None
    forwards = tokens = 0
    with use_backend(model, cfg.attention if method.schedule == "mask" else None) as backend:
        backend = backend if method.schedule == "mask" else None
        _check_backend(backend, model)
        for out in stream(model, batch, layout, cfg, backend):
            values = values.index_put((out.rows,), out.logprob)
            if out.kl is not None:
                kl = kl.index_put((out.kl_rows,), out.kl, accumulate=True)
            forwards += out.forwards
            tokens += out.tokens
    return TargetLogprobs(values, batch.targets, torch.from_numpy(layout.weight).to(device),
                          torch.from_numpy(layout.lost).to(device), layout, kl,
                          layout.kl_call if method.kl else None, forwards, tokens)


# --- the engine's objectives on them ---------------------------------------------------------------


def columns(batch: Batch, objective: Objective, cfg: EngineConfig, device, *, advantages=None,
            old_logprobs=None) -> Columns:
    """Per-target objective inputs: ``advantages`` [N] (default: the objective's — GRPO's from rewards,
    else the targets table's), the recorded rollout logprobs, ``old_logprobs`` [N] (default: the batch's)."""
    adv = objective.advantage(batch, cfg) if advantages is None else advantages
    old = batch.old_logprob if old_logprobs is None else old_logprobs
    return Columns(
        advantage=torch.as_tensor(np.asarray(adv, dtype=np.float32) if not torch.is_tensor(adv) else adv,
                                  dtype=torch.float32).to(device),
        rollout_logprob=torch.from_numpy(batch.targets.rollout_logprob).to(device),
        old_logprob=None if old is None else torch.as_tensor(old, dtype=torch.float32).to(device),
    )


def weights_of(layout: Layout, weights=None) -> np.ndarray:
    """The weights trained with: ``weights`` [N] (default: the targets table's), 0 where the layout lost a target."""
    if weights is None:
        return layout.weight
    w = weights.detach().cpu().numpy() if torch.is_tensor(weights) else np.asarray(weights)
    return np.where(layout.lost, 0.0, w).astype(np.float32)


def denominators_of(batch: Batch, layout: Layout, cfg: EngineConfig, weight: np.ndarray):
    """This batch's normalization coefficients [N], loss denominator and number of SDCC students."""
    tg = batch.targets
    coef, d = normalize(torch.from_numpy(weight), torch.from_numpy(tg.call), torch.from_numpy(tg.trajectory),
                        cfg.normalization)
    return coef, d, torch.tensor(float(len(np.unique(layout.kl_call))))


def kl_term(eps: torch.Tensor, den: Denominators, cfg: EngineConfig) -> torch.Tensor:
    """λ · Σ_j eps_j / J · dp_size: SDCC's KL term, J the step's students (all ranks)."""
    if not len(eps):
        return eps.new_zeros(())
    return cfg.sdcc_lambda * eps.sum() / den.kl.to(device=eps.device, dtype=eps.dtype).clamp(min=1) * cfg.dp_size


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar with the graph: Σ_i c_i ℓ_i / D (+ λ · mean KL for sdcc)
    logprobs: TargetLogprobs
    stats: dict[str, torch.Tensor]  # per-target objective stats ([N], NaN where not trained)


def loss(model, batch: Batch, cfg: EngineConfig | None = None, *, advantages=None, weights=None,
         old_logprobs=None, denominators: Denominators | None = None) -> LossOutput:
    """``cfg.objective`` over :func:`logprobs`, normalized as declared, with the KL term for ``sdcc``.

    ``advantages``, ``weights``, ``old_logprobs``: per-target [N] inputs overriding the batch's (the
    objective's advantages: GRPO's from the rewards). ``denominators``: the optimizer step's (see
    :func:`memorywalker.engine.step_denominators`); default this batch alone. Call ``.backward()`` on
    ``.loss``; the gradient equals what :func:`memorywalker.engine.run` accumulates."""
    cfg = cfg or EngineConfig()
    objective = get_objective(cfg.objective)
    lp = logprobs(model, batch, cfg)
    device = lp.values.device
    weight = weights_of(lp.layout, weights)
    coef, d_local, k_local = denominators_of(batch, lp.layout, cfg, weight)
    den = denominators or Denominators(reduce_denominator([d_local]), reduce_denominator([k_local]))
    cols = columns(batch, objective, cfg, device, advantages=advantages, old_logprobs=old_logprobs)
    stats, _ = apply_rollout_correction(cols, batch, cfg, required=True)
    rows = torch.from_numpy(np.flatnonzero(~lp.layout.lost)).to(device)
    total = torch.zeros((), device=device)
    if len(rows):
        per_target, st = objective.per_target(lp.values[rows], cols.take(rows), cfg)
        total = aggregate(per_target, coef.to(device)[rows], den.loss.to(device), cfg.dp_size)
        for k, v in st.items():
            stats[k] = torch.full((len(lp.values),), float("nan"), device=device).index_put((rows,), v.detach())
    if lp.kl is not None:
        total = total + kl_term(lp.eps_kl(), den, cfg)
    return LossOutput(total, lp, stats)
