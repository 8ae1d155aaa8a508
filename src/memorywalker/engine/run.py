"""The engine entry point: run a method + objective on a model for one micro-batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from memorywalker.attention.masks import backend_of, use_backend
from memorywalker.engine.forward import forward_layout, model_device
from memorywalker.engine.head import OutputHead, chunked_forward_kl
from memorywalker.engine.methods import get_method
from memorywalker.layout.batch import Batch
from memorywalker.layout.layouts import Layout
from memorywalker.objectives.losses import (
    behaviour_logprob,
    grpo_advantages,
    nll,
    ppo_clip,
    weighted_logprob,
)
from memorywalker.objectives.metrics import gap_metrics
from memorywalker.objectives.normalize import aggregate, normalize, reduce_denominator
from memorywalker.objectives.rollout_correction import rollout_corr_metrics, rollout_correction_weight


@dataclass
class EngineConfig:
    method: str = "radix"  # a name in memorywalker.engine.methods.METHODS
    objective: str = "nll"  # one of OBJECTIVES
    normalization: str = "token"  # token | call | trajectory | sequence
    attention: str | None = None  # mask schedule: sdpa | eager | flex; None = the model's current one
    # Tokens per forward: the packed buffer size of the masked schedule, the chunk (and batch) size of
    # the radix schedule (a longer node runs in chunks of this many tokens against its cached prefix).
    max_tokens: int = 8192
    clip_low: float = 0.2  # PPO ε for ratios below 1
    clip_high: float = 0.2  # PPO ε for ratios above 1 (DAPO's clip-higher uses 0.28)
    tis_cap: float | None = None  # truncated importance sampling cap C (e.g. 2.0); None = off
    # Rollout correction (objectives/rollout_correction.py, verl's names), ρ = π_old / π_rollout at a level
    # of rollout_correction.LEVELS (token | call | sequence | geometric); needs batch.old_logprob.
    rollout_is: str | None = None  # TIS: the loss is weighted by min(ρ, rollout_is_threshold); None = off
    rollout_is_threshold: float = 2.0
    rollout_rs: str | None = None  # MIS: weight 0 where ρ leaves [lo, hi] = rollout_rs_threshold; None = off
    rollout_rs_threshold: tuple[float, float] = (0.5, 2.0)
    grpo_scale_by_std: bool = True  # False = Dr. GRPO (no division by the group std)
    sdcc_lambda: float = 1.0  # weight λ of the KL term
    sdcc_students: str = "junctions"  # junctions | all (one student per selected call)
    dp_size: int = 1  # data-parallel ranks whose gradients are averaged (DDP/FSDP); scales the loss
    # Logprobs (and SDCC's KL) are of logits / temperature: the sampling temperature of the rollouts, whose
    # recorded logprobs are of that distribution, so the PPO ratio is against the policy that sampled.
    temperature: float = 1.0
    # Radix schedule: recompute each forward's activations in the backward, keeping only the cached
    # keys/values (long chains in memory ~ U x K/V bytes per token + one forward's activations).
    checkpoint_chunks: bool = False


@dataclass
class Denominators:
    """What one optimizer step divides by, summed over its micro-batches and data-parallel ranks."""

    loss: torch.Tensor  # scalar: the normalization denominator D of the main loss
    kl: torch.Tensor  # scalar: number of SDCC students (the KL term is a mean over them)


@dataclass
class EngineResult:
    loss: torch.Tensor  # scalar, detached: the loss this call backpropagated (or would have)
    logprobs: torch.Tensor  # float32 [N] per batch target (batch.targets order); NaN where lost
    weight: torch.Tensor  # float32 [N] the weights trained with (0 where the method lost a target)
    metrics: dict[str, float | torch.Tensor]
    layout: Layout = field(repr=False)
    eps_kl: torch.Tensor | None = None  # sdcc: float32 [J] mean per-token KL of each student


# --- objectives ----------------------------------------------------------------------------------


@dataclass
class Columns:
    """Per-target inputs of an objective, on the model's device ([N] each)."""

    advantage: torch.Tensor
    rollout_logprob: torch.Tensor
    old_logprob: torch.Tensor | None
    correction: torch.Tensor | None = None  # rollout correction weight (TIS x MIS), detached

    def take(self, idx: torch.Tensor) -> Columns:
        return Columns(self.advantage[idx], self.rollout_logprob[idx],
                       None if self.old_logprob is None else self.old_logprob[idx],
                       None if self.correction is None else self.correction[idx])


def _nll(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    return nll(logprob), {}


def _ppo(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    old = behaviour_logprob(logprob, cols.old_logprob, cols.rollout_logprob)
    loss, stats = ppo_clip(logprob, old, cols.advantage, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                           rollout_logprob=cols.rollout_logprob, tis_cap=cfg.tis_cap)
    if cols.correction is not None:
        loss = loss * cols.correction  # ℓ_i · w_i, w = min(ρ, C) · 1[lo ≤ ρ ≤ hi] (rollout correction)
    return loss, stats


def _weighted(logprob: torch.Tensor, cols: Columns, cfg: EngineConfig):
    return weighted_logprob(logprob, cols.advantage), {}


def _batch_advantage(batch: Batch, cfg: EngineConfig) -> np.ndarray:
    return batch.targets.advantage


def _grpo_advantage(batch: Batch, cfg: EngineConfig) -> np.ndarray:
    if np.isnan(batch.reward).any():
        raise ValueError("grpo needs a reward on every trajectory (Trajectory.reward)")
    adv = grpo_advantages(torch.from_numpy(batch.reward), torch.from_numpy(batch.group),
                          scale_by_std=cfg.grpo_scale_by_std)
    return adv.numpy()[batch.targets.trajectory]


@dataclass(frozen=True)
class Objective:
    per_target: Callable  # (logprob [M], Columns, EngineConfig) -> (loss [M], stats {name: [M]})
    advantage: Callable[[Batch, EngineConfig], np.ndarray] = _batch_advantage
    # Each target's loss is its advantage times a finite factor: with every advantage 0 (GRPO groups whose
    # rewards are all equal) the loss and its gradient are exactly 0, and the backward can be skipped.
    scaled_by_advantage: bool = False


OBJECTIVES: dict[str, Objective] = {
    "nll": Objective(_nll),  # SFT: masked negative log-likelihood
    "ppo": Objective(_ppo, scaled_by_advantage=True),  # PPO-clip with the advantages on the targets table
    # PPO-clip with group-relative advantages from rewards
    "grpo": Objective(_ppo, _grpo_advantage, scaled_by_advantage=True),
    # −c_i·log p_i with c = the targets' advantage column: sequence-level losses (DPO) set c = −dL/dΣlogp
    "weighted": Objective(_weighted, scaled_by_advantage=True),
}


def _lookup(table: dict, name: str, what: str):
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; valid: {sorted(table)}") from None


def get_objective(name: str) -> Objective:
    return _lookup(OBJECTIVES, name, "objective")


# --- denominators ----------------------------------------------------------------------------------


def layout_for(batch: Batch, cfg: EngineConfig) -> Layout:
    return get_method(cfg.method).build_layout(batch, cfg)


def _local_denominators(batch: Batch, layout: Layout, cfg: EngineConfig):
    tg = batch.targets
    coef, d = normalize(torch.from_numpy(layout.weight), torch.from_numpy(tg.call), torch.from_numpy(tg.trajectory),
                        cfg.normalization)
    return coef, d, torch.tensor(float(len(np.unique(layout.kl_call))))


def step_denominators(batches: Sequence[Batch], cfg: EngineConfig, group=None) -> Denominators:
    """Denominators of one optimizer step: every micro-batch this rank runs, all-reduced over ranks.

    Call on every rank with its own micro-batches, then pass the result to each :func:`run`.
    """
    loss, kl = [], []
    for b in batches:
        _, d, k = _local_denominators(b, layout_for(b, cfg), cfg)
        loss.append(d)
        kl.append(k)
    return Denominators(reduce_denominator(loss, group), reduce_denominator(kl, group))


# --- the entry point --------------------------------------------------------------------------------


def run(model, batch: Batch, cfg: EngineConfig | None = None, *, backward: bool = True,
        denominators: Denominators | None = None) -> EngineResult:
    """Run ``cfg.method`` + ``cfg.objective`` on ``model`` for ``batch``.

    With ``backward=True`` gradients are accumulated into ``model``'s parameters (``.grad``), by one
    backward per forward (methods with ``backward="each"``) or one in all (``sdcc``); the optimizer
    step is the caller's. A batch whose loss is 0 by construction — an objective scaled by the advantage,
    every advantage 0, no KL term — accumulates nothing and runs no backward. With ``backward=False``
    nothing is differentiated (evaluation).
    ``denominators`` come from :func:`step_denominators` over every micro-batch of the step; when
    omitted, this batch is the whole step (all-reduced over ranks when torch.distributed is up).
    """
    cfg = cfg or EngineConfig()
    method, objective = get_method(cfg.method), get_objective(cfg.objective)
    backend = None
    if method.schedule == "mask":
        backend = use_backend(model, cfg.attention) if cfg.attention else backend_of(model)
    layout = layout_for(batch, cfg)
    device = model_device(model)
    head = OutputHead.of(model)
    if backend is not None and backend.name == "flex" and backward and device.type != "cuda":
        raise ValueError("FlexAttention has no backward on CPU: train with attention='sdpa' or 'eager' here, "
                         "or run flex with backward=False")
    tg = batch.targets
    n = len(tg)

    coef, d_local, k_local = _local_denominators(batch, layout, cfg)
    if denominators is None:
        denominators = Denominators(reduce_denominator([d_local]), reduce_denominator([k_local]))
    coef = coef.to(device)
    den = denominators.loss.to(device)
    cols = Columns(
        advantage=torch.from_numpy(np.asarray(objective.advantage(batch, cfg), dtype=np.float32)).to(device),
        rollout_logprob=torch.from_numpy(tg.rollout_logprob).to(device),
        old_logprob=None if batch.old_logprob is None else torch.from_numpy(batch.old_logprob).float().to(device),
    )

    stats: dict[str, torch.Tensor] = {}
    corr_metrics: dict[str, torch.Tensor] = {}
    if cfg.rollout_is is not None or cfg.rollout_rs is not None:
        if batch.old_logprob is not None:
            cols.correction, stats, corr_metrics = _rollout_correction(batch, cfg, device)
        elif backward:  # without backward this is the pass that computes π_old (or an evaluation)
            raise ValueError("rollout_is / rollout_rs need batch.old_logprob: the trainer's logprobs of the "
                             "collecting policy (the RL recipe recomputes them once per step)")

    if backward and objective.scaled_by_advantage and not method.kl and not cols.advantage.any():
        # No target has an advantage (every GRPO group of the batch had equal rewards): the gradient is
        # exactly 0, so the forwards run for the logprobs and metrics only. The optimizer step is the same:
        # optimizer_step treats a missing gradient as zeros; no collective happens inside the engine.
        backward = False
    logprobs = torch.full((n,), float("nan"), device=device)
    total = torch.zeros((), device=device)
    pending = torch.zeros((), device=device)  # graph of a one-backward method
    teacher: torch.Tensor | None = None  # [J, H] detached teacher hidden states (sdcc)
    kl_rows = torch.zeros(len(layout.kl_call), device=device)
    passes = {"forwards": 0, "tokens": 0, "backwards": 0}
    grad = torch.enable_grad() if backward else torch.no_grad()
    with grad:
        outputs = forward_layout(model, layout, torch.from_numpy(tg.label), method, cfg.max_tokens, backend,
                                 cfg.temperature, cfg.checkpoint_chunks)
        for b, out in enumerate(outputs):
            buf, logprob, kl_hidden = out.buffer, out.logprob, out.kl_hidden
            passes["forwards"] += out.forwards
            passes["tokens"] += out.tokens
            rows = torch.from_numpy(buf.target_row).to(device)
            logprobs[rows] = logprob.detach()
            chunk = torch.zeros((), device=device)
            if len(rows):
                per_target, st = objective.per_target(logprob, cols.take(rows), cfg)
                chunk = aggregate(per_target, coef[rows], den, cfg.dp_size)
                for k, v in st.items():
                    stats.setdefault(k, torch.full((n,), float("nan"), device=device))[rows] = v.detach()
            if kl_hidden is not None:
                k_idx = torch.from_numpy(buf.kl_row).to(device)
                if b < layout.teacher_buffers:
                    if teacher is None:
                        teacher = kl_hidden.new_empty(len(layout.kl_call), kl_hidden.shape[-1])
                    teacher[k_idx] = kl_hidden.detach()  # stop-gradient; its distribution is recomputed per chunk
                else:
                    kl = chunked_forward_kl(head, teacher[k_idx], kl_hidden, temperature=cfg.temperature)  # [j]
                    kl_rows = kl_rows.index_put((k_idx,), kl, accumulate=True)
            if method.backward == "each":
                if backward and chunk.requires_grad:
                    chunk.backward()
                    passes["backwards"] += 1
                total = total + chunk.detach()
            else:
                pending = pending + chunk

        eps_kl = None
        if method.kl:
            eps_kl, kl_term = _kl_term(layout, kl_rows, denominators, cfg, device)
            pending = pending + kl_term
        if method.backward == "once":
            if backward and pending.requires_grad:
                pending.backward()
                passes["backwards"] += 1
            total = pending.detach()

    metrics = _metrics(batch, layout, passes, logprobs, stats, eps_kl)
    metrics.update(corr_metrics)
    metrics["loss"] = total
    return EngineResult(total, logprobs, torch.from_numpy(layout.weight), metrics, layout, eps_kl)


def _rollout_correction(batch: Batch, cfg: EngineConfig, device):
    """Per-target rollout correction weight [N], its stats [N] and the ``rollout_corr/*`` metrics, from
    the trainer's recomputation of the collecting policy (``batch.old_logprob``) against the records."""
    if cfg.tis_cap is not None and cfg.rollout_is is not None:
        raise ValueError("tis_cap and rollout_is are both truncated importance sampling: set one")
    tg = batch.targets
    old = torch.from_numpy(batch.old_logprob).float().to(device)
    rollout = torch.from_numpy(tg.rollout_logprob).float().to(device)
    call, seq = torch.from_numpy(tg.call).to(device), torch.from_numpy(tg.trajectory).to(device)
    weight, stats = rollout_correction_weight(old, rollout, call, seq, rollout_is=cfg.rollout_is,
                                              rollout_is_threshold=cfg.rollout_is_threshold,
                                              rollout_rs=cfg.rollout_rs,
                                              rollout_rs_threshold=tuple(cfg.rollout_rs_threshold))
    return weight, stats, rollout_corr_metrics(old, rollout, seq, threshold=cfg.rollout_is_threshold)


def _kl_term(layout: Layout, kl_rows: torch.Tensor, den: Denominators, cfg: EngineConfig, device):
    """eps_kl per student (mean per-token KL) and the loss term λ · Σ_j eps_j / J · dp_size."""
    if not len(layout.kl_call):
        return torch.zeros(0, device=device), torch.zeros((), device=device)
    uniq, inv = np.unique(layout.kl_call, return_inverse=True)
    inv = torch.from_numpy(inv).to(device)
    counts = torch.zeros(len(uniq), device=device).index_add_(0, inv, torch.ones_like(kl_rows))
    eps = torch.zeros(len(uniq), device=device).index_add(0, inv, kl_rows) / counts  # mean KL per student
    term = cfg.sdcc_lambda * eps.sum() / den.kl.to(device=device, dtype=eps.dtype).clamp(min=1) * cfg.dp_size  # λ · mean_j KL_j
    return eps.detach(), term


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
