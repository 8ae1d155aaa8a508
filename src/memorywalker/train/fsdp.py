"""Sharded training (``parallel = "fsdp"``): FSDP2 ``fully_shard`` per decoder layer and on the root,
sharded DCP checkpoints, a consolidated Hugging Face export.

    torchrun --nproc-per-node 2 -m memorywalker.recipes.sft --config configs/sft_tiny.toml parallel=fsdp
    accelerate launch --config_file configs/accelerate_fsdp.yaml -m memorywalker.recipes.sft \
        --config configs/sft_tiny.toml parallel=fsdp

**Equal collectives.** FSDP issues collectives from inside the model: an all-gather of a layer's
parameters in its forward (and again in backward once resharded), a reduce-scatter of its gradients in
backward. The engine's number of forwards and backwards per micro-batch depends on the trees a rank
holds (``radix``: one forward per tree level; ``per-call``: one forward and backward per call;
``sdcc``: one student per junction; RL rollouts: one forward per sampled token), so letting FSDP
communicate per pass would pair up different collectives on different ranks: a hang, or silently
mixed-up tensors. The recipes therefore run every step as a fixed sequence, whatever the data:

1. :func:`gathered` — every FSDP module all-gathers its parameters once (in module order); the engine
   then runs all of this rank's micro-batches (any number of forwards and backwards) with resharding
   and gradient sync off (``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)``):
   no collectives at all, gradients accumulate unsharded. Leaving the block reshards (local).
2. :func:`sync_gradients` — one **zero-weight pass** (a one-token forward whose loss is 0·logits)
   with gradient sync on: its backward reduce-scatters (sums) the accumulated gradients of every
   parameter group, once, and reshards.
3. ``clip_grad_norm_`` (one all-reduce of the norm) and AdamW on the local shards.

So the collectives per optimizer step are: one all-gather per FSDP module, one pass of all-gathers and
reduce-scatters, one norm all-reduce, plus the engine's denominator all-reduces (one per step): equal
on every rank by construction, independent of method, trees and ``grad_accum``. The price: during the
compute block the parameters (in ``mixed_precision`` dtype) and their gradients are whole on every rank
(the DDP footprint of a bf16 model); what stays sharded across the step is the fp32 master weights,
the reduced fp32 gradients and AdamW's moments. If a rank fails or diverges anyway, the collective
timeout (``collective_timeout`` seconds, the process group's) turns the hang into an error naming it.

**Checkpoints.** ``save_sharded`` writes the model and optimizer with torch.distributed.checkpoint
(``dcp/``: one ``.distcp`` file per rank plus ``.metadata``, keyed by parameter name, so a checkpoint
loads on any world size, or into an unsharded model on one process) next to ``rng.pt`` and
``state.json``, in a temporary folder sealed by the same manifest as the single-file checkpoints
(:func:`memorywalker.train.checkpoint.seal_checkpoint`). ``export_final`` gathers the full weights
once and writes ``run_dir/final`` with ``save_pretrained``.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from memorywalker.attention.masks import attention_implementation
from memorywalker.train.checkpoint import (
    DCP_DIR,
    save_checkpoint,
    save_final,
    seal_checkpoint,
    state_dicts,
    write_extras,
)
from memorywalker.train.config import ConfigError
from memorywalker.train.distributed import barrier


class CollectiveError(RuntimeError):
    """A collective failed or timed out: another rank died or issued a different collective."""


# --- sharding ----------------------------------------------------------------------------------------


def fsdp_modules(model: torch.nn.Module) -> list:
    """The modules ``fully_shard`` was applied to, in module order (the same on every rank)."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    return bool(fsdp_modules(model))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model: instances of its ``_no_split_modules`` classes."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard "
                         f"(_no_split_modules = {sorted(names)})")
    return layers


def shard_model(model: torch.nn.Module, *, mixed_precision: str | None = None,
                activation_checkpointing: bool = False) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root, over a 1-D mesh of every rank (in place).

    ``mixed_precision`` (e.g. ``"bfloat16"``): parameters are all-gathered and computed in that dtype,
    gradients reduced in float32; the sharded master weights keep the model's dtype.
    ``activation_checkpointing``: each decoder layer recomputes its activations in backward.
    """
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, mixed_precision), reduce_dtype=torch.float32) \
        if mixed_precision else MixedPrecisionPolicy()
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    for m in fsdp_modules(model):
        # Sum, not average: the engine already divides every loss by the step's global denominator.
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
        m.set_reduce_scatter_unused_params(True)
        m.set_requires_gradient_sync(False, recurse=False)
    return model


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Each decoder layer keeps only its inputs and recomputes its activations in backward
    (non-reentrant ``torch.utils.checkpoint`` through the model's own hook).

    The recomputation replays the attention implementation the forward ran under: the radix schedule
    switches ``config._attn_implementation`` to its prefix kernel only while it runs its forwards, and
    the backward comes later (a layer recomputed under SDPA would save other tensors and fail)."""
    config = model.config

    def context_fn():
        impl = config._attn_implementation  # read when the layer runs forward
        return nullcontext(), attention_implementation(config, impl)

    kwargs = {"use_reentrant": False, "context_fn": context_fn}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers before the rename
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# --- the fixed collective schedule ---------------------------------------------------------------------


@contextmanager
def gathered(model: torch.nn.Module):
    """Run a block (engine micro-batches, rollouts) on whole parameters with no collectives inside it.

    Every FSDP module all-gathers once on entry; resharding after backward and gradient sync are off
    inside, so any number of forwards and backwards issues nothing; the exit reshards locally. A
    no-op for an unsharded model.
    """
    mods = fsdp_modules(model)
    for m in mods:
        m.set_reshard_after_backward(False, recurse=False)
        m.set_requires_gradient_sync(False, recurse=False)
    for m in mods:
        m.unshard()
    try:
        yield model
    finally:
        for m in mods:
            m.reshard()


def sync_gradients(model: torch.nn.Module) -> None:
    """Reduce-scatter (sum over ranks) the gradients accumulated in :func:`gathered` blocks: one
    zero-weight pass — a one-token forward, loss 0·Σlogits — whose backward carries gradient sync."""
    mods = fsdp_modules(model)
    if not mods:
        return
    for m in mods:
        m.set_reshard_after_backward(True, recurse=False)
        m.set_requires_gradient_sync(True, recurse=False)
    try:
        device = _local_device(model)
        with torch.enable_grad():
            out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False)
            (out.logits.float().sum() * 0.0).backward()  # adds exact zeros to every accumulated gradient
    finally:
        for m in mods:
            m.set_requires_gradient_sync(False, recurse=False)


def _local_device(model) -> torch.device:
    p = next(model.parameters())
    return p.to_local().device if hasattr(p, "to_local") else p.device


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm from ``clip_grad_norm_`` as a plain tensor (a DTensor over sharded gradients)."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def check_agreement(**values: int) -> None:
    """Raise on every rank when ranks disagree on a count that fixes their collectives (one all-reduce).

    >>> check_agreement(micro_batches=2)   # a no-op without torch.distributed
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    names = sorted(values)
    mine = torch.tensor([[values[k], -values[k]] for k in names], dtype=torch.float64)
    both = mine.clone()
    dist.all_reduce(both, op=dist.ReduceOp.MAX)  # [max, -min] per name
    bad = [f"{k} from {-both[i, 1]:.0f} to {both[i, 0]:.0f}" for i, k in enumerate(names)
           if both[i, 0] != -both[i, 1]]
    if bad:
        raise CollectiveError(f"ranks disagree on {', '.join(bad)} (this rank: "
                              f"{', '.join(f'{k}={values[k]}' for k in names)}); their collectives would not pair up")


@contextmanager
def collective_guard(where: str, timeout_s: float):
    """Turn a collective's failure or timeout into one error naming the likely cause."""
    try:
        yield
    except (RuntimeError, dist.DistError) as e:
        if isinstance(e, CollectiveError) or not dist.is_initialized():
            raise
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "timed out" in text.lower() or "timeout" in text.lower() or "connection" in text.lower() \
                or isinstance(e, dist.DistError):
            raise CollectiveError(
                f"rank {dist.get_rank()}: a collective in {where} failed or waited more than "
                f"collective_timeout={timeout_s:g}s: another rank crashed, stalled, or ran a different "
                f"number of collectives ({text})") from e
        raise


# --- checkpoints ---------------------------------------------------------------------------------------


def save_sharded(run_dir: str | Path, step: int, model, optimizer, state: dict[str, Any], *,
                 keep: int = 2) -> Path:
    """Every rank: write checkpoint ``step`` with DCP into a temporary folder; rank 0 seals it with
    the manifest (atomic, verified) and prunes old ones. Collective."""
    root = Path(run_dir) / "checkpoints"
    tmp = root / f".tmp-step-{step:06d}-dcp"
    rank0 = dist.get_rank() == 0
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    msd, osd = state_dicts(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / DCP_DIR))
    dist.barrier()  # every rank's shard is on disk
    final = root / f"step-{step:06d}"
    if rank0:
        write_extras(tmp, step, state)
        seal_checkpoint(run_dir, step, tmp, keep=keep, fmt="dcp")
    dist.barrier()
    return final


def export_final(run_dir: str | Path, model, tokenizer, provenance: dict[str, Any] | None = None) -> Path:
    """``run_dir/final`` from a sharded model: the full weights gathered once (collective), written by
    rank 0 with ``save_pretrained`` from an unsharded copy of the architecture."""
    from transformers import AutoModelForCausalLM  # lazy: transformers (~3 s) only for a sharded export

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    final = Path(run_dir) / "final"
    if dist.get_rank() == 0:
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(model.config)
        plain.load_state_dict(full, assign=True, strict=False)
        plain.tie_weights()
        missing = [k for k, p in plain.state_dict().items() if p.is_meta]
        if missing:
            raise RuntimeError(f"export: the gathered state dict lacks {missing}")
        save_final(run_dir, plain, tokenizer, provenance)
    dist.barrier()
    return final


# --- what the recipes call ------------------------------------------------------------------------------


def parallelize(model: torch.nn.Module, cfg, info) -> torch.nn.Module:
    """The model a recipe trains: sharded with FSDP2 when ``cfg.parallel == "fsdp"`` and several ranks
    run, else as loaded (``ddp``: replicated, gradients summed once per step by the recipe)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and cfg.parallel != "fsdp":
        raise ConfigError("accelerate launched this run with an FSDP config, but parallel="
                          f"{cfg.parallel!r}: pass parallel=fsdp (the recipe shards the model itself)")
    if cfg.parallel != "fsdp" or info.world_size == 1:
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model)
        return model
    return shard_model(model, mixed_precision=cfg.mixed_precision,
                       activation_checkpointing=cfg.activation_checkpointing)


def save_step(run_dir, step: int, model, optimizer, state: dict[str, Any], *, keep: int, info) -> None:
    """Checkpoint ``step`` on every rank: sharded (DCP, collective) or rank 0's single-file one."""
    if is_sharded(model):
        save_sharded(run_dir, step, model, optimizer, state, keep=keep)
        return
    if info.is_main:
        save_checkpoint(run_dir, step, model, optimizer, state, keep=keep)
    barrier()


def save_model(run_dir, model, tokenizer, provenance: dict[str, Any], info) -> None:
    """``run_dir/final`` on every rank: consolidated from the shards, or rank 0's copy."""
    if is_sharded(model):
        export_final(run_dir, model, tokenizer, provenance)
        return
    if info.is_main:
        save_final(run_dir, model, tokenizer, provenance)
    barrier()
