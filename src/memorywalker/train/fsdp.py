"""Sharded training (``parallel = "fsdp"``): FSDP2 ``fully_shard`` per decoder layer and on the root,
sharded DCP checkpoints, a consolidated Hugging Face export.

    torchrun --nproc-per-node 2 -m memorywalker.recipes.sft --config configs/sft_tiny.toml parallel=fsdp
    accelerate launch --config_file configs/accelerate_fsdp.yaml -m memorywalker.recipes.sft \
        --config configs/sft_tiny.toml parallel=fsdp

**Per-layer sharding.** Each decoder layer is gathered for its forward and resharded after it, gathered
again for its backward and its gradient reduce-scattered (summed) after it, FSDP2's defaults. The input
embedding and the LM head are sharded by rows outside FSDP (:mod:`memorywalker.train.row_shards`), each
whole only while used; the root unit is what is left (the final norm). Those collectives come from
inside the model, once per pass, and the engine's number of passes depends on the trees a rank holds, so
the recipes run every step inside a :class:`memorywalker.train.sharded_step.StepSchedule`: the ranks
agree on each pass before it, and a rank with less to do runs empty ones. A radix backward spans several
forwards of each layer, so each forward hands its gradient to FSDP at once (:func:`reduce_per_forward`)
and it is reduce-scattered after that forward's backward. Between steps a rank holds its shard of the
parameters, gradients and AdamW moments; during one, its shards plus the layer being computed, the head
while a window uses it, the embedding's gradient during a backward, and the activations.

Passes with no backward and a data-dependent count that would make per-pass agreement costly (sampling
rollouts: one forward per token; the no-grad π_old pass) run inside :func:`gathered`: every layer
gathered once, nothing communicates inside, resharded on exit. If a rank fails or diverges anyway, the
collective timeout (``collective_timeout`` seconds, the process group's) turns the hang into an error
naming it.

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
from torch.nn.utils.stateless import (
    _reparametrize_module,  # what torch.func.functional_call runs, without re-entering the module's hooks
)

from memorywalker.attention.masks import attention_implementation
from memorywalker.errors import InputError
from memorywalker.train.adapter import engine_model, is_adapted, merged_state_dict
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
from memorywalker.train.row_shards import EmbeddingShards, HeadShards, Sharded, register, row_shards


class CollectiveError(RuntimeError):
    """A collective failed or timed out: another rank died or issued a different collective."""


# --- sharding ----------------------------------------------------------------------------------------


def fsdp_modules(model: torch.nn.Module) -> list:
    """The modules ``fully_shard`` was applied to, in module order (the same on every rank)."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    return bool(fsdp_modules(model))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model: instances of its ``_no_split_modules`` classes
    (``fully_shard`` subclasses them: FSDPLlamaDecoderLayer is a LlamaDecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]  # sharded too
    if not layers:
        raise InputError(f"{type(model).__name__}: no decoder layers found to shard "
                         f"(_no_split_modules = {sorted(names)})")
    return layers


def shard_model(model: torch.nn.Module, *, mixed_precision: str | None = None,
                activation_checkpointing: bool = False) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, shard the LM head and the input embedding by rows
    (:mod:`~memorywalker.train.row_shards`), then ``fully_shard`` the root (what is left: the final
    norm), over a 1-D mesh of every rank (in place).

    ``mixed_precision`` (e.g. ``"bfloat16"``): parameters are all-gathered and computed in that dtype,
    gradients reduced in float32; the sharded master weights keep the model's dtype.
    ``activation_checkpointing``: each decoder layer recomputes its activations in backward.
    """
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    param_dtype = getattr(torch, mixed_precision) if mixed_precision else None
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) \
        if mixed_precision else MixedPrecisionPolicy()
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    root = engine_model(model)  # under PEFT: the base model, which the engine calls
    layers = decoder_layers(root)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)  # resharded after forward and after backward
    head = HeadShards(root, mesh, param_dtype)
    sharded = Sharded(head, None if head.tied else EmbeddingShards(root, mesh, param_dtype))
    register(root, sharded)
    fully_shard(root, mesh=mesh, mp_policy=policy, ignored_params={p for u in sharded.units for p in u.shards})
    # Backward prefetch named per layer, not FSDP's default (the forward order recorded since the last
    # backward, which counts a gathered() block's no-grad passes: a different length on each rank). On a
    # GPU the root prefetches the top layer and each layer the one below, so a gather overlaps the layer's
    # compute; on the CPU collectives do not overlap and a prefetch would only hold two layers at once, so
    # every unit names the root, gathered already through the backward (a no-op).
    chain = device.type != "cpu"
    root.set_modules_to_backward_prefetch([layers[-1]] if chain else [root])
    for below, layer in zip([root, *layers[:-1]], layers, strict=True):
        layer.set_modules_to_backward_prefetch([below] if chain else [root])
    for layer in layers:
        reduce_per_forward(layer)
    for m in fsdp_modules(model):
        # Sum, not average: the engine already divides every loss by the step's global denominator.
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
        m.set_reduce_scatter_unused_params(True)
    return model


class _GradientNow(torch.autograd.Function):
    """Identity on a parameter; its backward adds the gradient to ``param.grad`` right away and hands
    nothing to autograd's accumulation."""

    @staticmethod
    def forward(ctx, param):
        ctx.param = param
        return param.view_as(param)

    @staticmethod
    def backward(ctx, grad):
        p = ctx.param
        if p.grad is None:
            p.grad = grad.detach().contiguous()
        else:
            p.grad += grad
        return None


def reduce_per_forward(layer: torch.nn.Module) -> None:
    """Let FSDP reduce-scatter a layer's gradient after each forward's backward, not after the last.

    A backward that spans several forwards of one layer (a radix tree: one forward per tree level) lets
    autograd hold each parameter's gradient until its last use has run: the whole unsharded gradient of
    every layer, kept from the first forward's backward to the last (``scripts/fsdp2_multi_forward_memory.py``
    shows it on plain FSDP2). FSDP's post-backward of the earlier uses then finds no gradient. Here each
    forward of ``layer`` uses its trainable parameters through :class:`_GradientNow`, whose backward
    writes the gradient into ``param.grad`` at once (its node, created after FSDP's post-backward node,
    runs before it), so every post-backward reduce-scatters what that forward contributed."""
    forward = layer.forward

    def forward_reducing_per_use(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        params = {n: _GradientNow.apply(p) for n, p in layer.named_parameters() if p.requires_grad}
        with _reparametrize_module(layer, params):
            return forward(*args, **kwargs)

    layer.forward = forward_reducing_per_use


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Each decoder layer keeps only its inputs and recomputes its activations in backward
    (non-reentrant ``torch.utils.checkpoint`` through the model's own hook), in eval mode too.

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
    # Transformers checkpoints a layer only while the layer is in training mode, and rl/dpo (and the HF
    # sampler) keep the model in eval mode so that no dropout fires. Before every forward of the model,
    # each decoder layer alone (not its submodules: attention and MLP stay in eval, no dropout) is put
    # in training mode while grad is on, so the flag means the same in every recipe.
    layers = decoder_layers(model)

    def with_grad_checkpointing(module, args):
        for layer in layers:
            layer.training = torch.is_grad_enabled()

    engine_model(model).register_forward_pre_hook(with_grad_checkpointing)


# --- passes without backward ----------------------------------------------------------------------------


@contextmanager
def gathered(model: torch.nn.Module):
    """Run a block of passes without backward (rollouts, π_old) on whole parameters, nothing
    communicating inside it: every FSDP module all-gathers once on entry and stays gathered across the
    block's forwards, and so do the head and the embedding (``row_shards``); the exit reshards
    (local). A no-op for an unsharded model."""
    mods = fsdp_modules(model)
    layers = mods[1:]  # the root keeps FSDP's own rule (gathered until the backward)
    sharded = row_shards(model)
    units = sharded.units if sharded is not None else []
    for m in layers:
        m.set_reshard_after_forward(False, recurse=False)
    for m in mods:
        m.unshard()
    opened = [u for u in units if not u.is_gathered]
    for u in units:
        u.gather()
        u.pinned = True
    try:
        yield model
    finally:
        for u in units:
            u.pinned = False
        for u in opened:
            u.release(reduce=False)
        for m in layers:
            m.set_reshard_after_forward(True, recurse=False)
        for m in mods:
            m.reshard()


def local_device(model) -> torch.device:
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
    rank 0 with ``save_pretrained`` from an unsharded copy of the architecture (under PEFT: of the
    adapted model, so what is written is the adapter, as without sharding)."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    final = Path(run_dir) / "final"
    if dist.get_rank() == 0:
        save_final(run_dir, _unsharded_copy(model, full), tokenizer, provenance)
    dist.barrier()
    return final


def _unsharded_copy(model, full: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``model``'s architecture (and adapter) built on the meta device, holding ``full``'s tensors."""
    from transformers import AutoModelForCausalLM  # lazy: transformers (~3 s) only for a sharded export

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(engine_model(model).config)
    if is_adapted(model):
        from peft import get_peft_model  # lazy: peft loads transformers; only LoRA runs need it

        plain = get_peft_model(plain, model.peft_config[model.active_adapter])
    plain.load_state_dict(full, assign=True, strict=False)
    engine_model(plain).tie_weights()
    missing = [k for k, p in plain.state_dict().items() if p.is_meta]
    if missing:
        raise RuntimeError(f"export: the gathered state dict lacks {missing}")
    return plain


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


def main_rank_weights(model: torch.nn.Module, *, is_main: bool) -> dict[str, torch.Tensor] | None:
    """The weights ``model`` computes with, whole, in the base checkpoint's names, on rank 0's CPU only
    (None on the other ranks): what a rollout server loads after each update. Call on every rank.

    Unsharded: :func:`~memorywalker.train.adapter.merged_state_dict`. Sharded: one tensor at a time is
    all-gathered (every rank takes part) and only rank 0 keeps a CPU copy, so no rank ever holds the whole
    model gathered on its device and the others hold nothing extra; a LoRA layer's ``W + scale·B·A`` is
    merged on rank 0 from the gathered tensors (PEFT's plain LoRA; DoRA is refused)."""
    if not is_sharded(model):
        return merged_state_dict(model) if is_main else None
    base = engine_model(model)
    full: dict[str, torch.Tensor] = {}
    for name, t in base.state_dict().items():  # the same names in the same order on every rank
        whole = t.full_tensor() if hasattr(t, "full_tensor") else t  # an all-gather for a sharded DTensor
        if is_main:
            full[name] = whole.detach().to("cpu", copy=True)
        del whole
    if not is_main:
        return None
    if not is_adapted(model):
        return full
    out = {k.replace(".base_layer.", "."): v for k, v in full.items() if ".lora_" not in k}
    for name, module in base.named_modules():
        if not (hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")):
            continue
        weight = full[f"{name}.base_layer.weight"]
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            if getattr(module, "use_dora", {}).get(adapter):
                raise InputError("syncing a sharded DoRA adapter to rollout servers is not supported: use plain LoRA")
            a, b = full[f"{name}.lora_A.{adapter}.weight"], full[f"{name}.lora_B.{adapter}.weight"]
            delta = (b.float() @ a.float()) * module.scaling[adapter]  # PEFT's get_delta_weight: (α/r)·B·A
            weight = weight + (delta.T if getattr(module, "fan_in_fan_out", False) else delta).to(weight.dtype)
        out[f"{name}.weight"] = weight
    return out
