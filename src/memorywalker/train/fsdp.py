"""Sharded training (``parallel = "fsdp"``): FSDP2 ``fully_shard`` per decoder layer and on the root,
sharded DCP checkpoints, a consolidated Hugging Face export.

    torchrun --nproc-per-node 2 -m memorywalker.recipes.sft --config configs/sft_tiny.toml parallel=fsdp
    accelerate launch --config_file configs/accelerate_fsdp.yaml -m memorywalker.recipes.sft \
        --config configs/sft_tiny.toml parallel=fsdp

**Per-layer sharding.** Each decoder layer is gathered for its forward and resharded after it, gathered
again for its backward and its gradient reduce-scattered (summed) after it, FSDP2's defaults. The input
embedding (untied) is a unit of its own, gathered for the lookup only (its backward needs no weights:
``set_unshard_in_backward(False)``), its gradient reduce-scattered at the end of each backward. The LM
head is a :class:`HeadShards` (with tied embeddings: the one matrix both use): the engine applies it
outside the model's forward, to the captured hidden states a chunk at a time, so the step schedule
gathers it for each forward-backward window, frees the whole weight once its gradient is in, and
reduce-scatters the gradient at the backward's end (tied: after the last lookup's). The root unit is
what is left (the final norm). Those collectives come from inside the model, once per pass, and the engine's number of passes
depends on the trees a rank holds, so the recipes run every step inside a
:class:`memorywalker.train.sharded_step.StepSchedule`: the ranks agree on each pass before it, and a rank
with less to do runs empty ones. A radix backward spans several forwards of each layer, so each forward
hands its gradient to FSDP at once (:func:`reduce_per_forward`) and it is reduce-scattered after that
forward's backward. Between steps a rank holds its shard of the parameters, gradients and AdamW
moments; during one, its shards plus the layer being computed, the head while a window uses it, the
embedding's gradient during a backward, and the activations.

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
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
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
    (:class:`RowShards`), then ``fully_shard`` the root (what is left: the final norm), over a 1-D mesh
    of every rank (in place).

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
    _SHARDED[root] = sharded
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


def _free_storage(p: torch.Tensor) -> None:
    """Free a gathered weight once its gradient is in: every node of the backward that read it has run
    (local; the gradient waits for :meth:`RowShards.release`, where every rank reduces it)."""
    p.untyped_storage().resize_(0)


# The reduce-scatter of a whole gradient runs in blocks of about this many bytes of input: the copies it
# needs (and gloo's own buffers) stay small beside a [V, H] gradient.
REDUCE_BLOCK_BYTES = 32 * 2**20


class RowShards:
    """Parameters sharded over the mesh by rows as DTensors — what the optimizer, the checkpoints and
    the state dicts see — and gathered whole only while a pass uses them: the LM head and the input
    embedding, whose [V, H] matrices are the largest tensors of a model with a real vocabulary.

    Not FSDP units: FSDP gathers a unit around its module's forward, and the engine applies the head
    outside the model's forward, to the captured hidden states of every forward of a buffer, a chunk of
    targets at a time (:mod:`memorywalker.engine.head`), a number of times that differs between ranks.
    So the gathers and reductions are placed where every rank is at the same point:

    * the head (:attr:`SHARDED` ``.head``; tied: with the embedding's matrix):
      :class:`memorywalker.train.sharded_step.StepSchedule` calls :meth:`gather` at the first forward
      after a backward (an agreed pass) and :meth:`release` ``(reduce=True)`` at the backward's end;
      in between, the whole weight is freed once autograd has accumulated its gradient
      (:func:`_free_storage`: no node of that backward reads it again);
    * the untied embedding (``.embedding``): gathered by a pre-hook on the embedding module (every
      forward, real or empty, runs one lookup) and freed right after the lookup (its backward reads the
      ids, not the weights), into the same storage each time, so the lookups of a window accumulate one
      gradient; released like the head.

    :func:`gathered` keeps both whole through its block. ``gather`` all-gathers each shard (in
    ``param_dtype`` under mixed precision) into a whole leaf parameter put in the modules' place;
    ``release`` reduce-scatters (sums, in float32 under mixed precision) its gradient into the shard's
    ``.grad`` in blocks of :data:`REDUCE_BLOCK_BYTES`, and puts the shards back. Rows not divisible by
    the world size are padded for the collectives (rank r holds ``torch.chunk``'s r-th block, as FSDP2
    does).
    """

    def __init__(self, root: torch.nn.Module, params: list[torch.nn.Parameter], mesh, param_dtype: torch.dtype | None):
        self.mesh, self.group, self.param_dtype = mesh, mesh.get_group(), param_dtype
        self.world, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        # every (module, name) holding one of these parameters (a tied head and embedding: both)
        self.slots = [[(m, n) for m in root.modules() for n, q in m._parameters.items() if q is p] for p in params]
        self.shards = [torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)]), requires_grad=p.requires_grad)
                       for p in params]
        self.full: list[torch.nn.Parameter] | None = None
        self.pinned = False  # inside gathered(): nothing is freed or communicated
        self._install(self.shards)

    @property
    def is_gathered(self) -> bool:
        """Whole parameters are in the modules' place (their weights possibly freed already)."""
        return self.full is not None

    @property
    def holds_weights(self) -> bool:
        return self.full is not None and all(p.untyped_storage().size() > 0 for p in self.full)

    def _install(self, params) -> None:
        for slots, p in zip(self.slots, params, strict=True):
            for module, name in slots:
                module._parameters[name] = p

    def _rows(self, shard: torch.Tensor) -> int:
        return -(-shard.shape[0] // self.world)  # rows per rank, the last ranks' padded

    @torch.no_grad()
    def gather(self) -> None:
        """All-gather every shard into a whole parameter in the modules (collective); into the same
        parameters again when their weights were freed; a no-op while they hold their weights."""
        if self.holds_weights:
            return
        first = self.full is None
        full = []
        for i, s in enumerate(self.shards):
            local, rows = s.to_local(), self._rows(s)
            dtype = self.param_dtype or s.dtype
            if len(local) == rows and local.dtype == dtype and local.is_contiguous():
                mine = local
            else:
                mine = local.new_zeros((rows, *s.shape[1:]), dtype=dtype)
                mine[: len(local)] = local
            if first:
                whole = local.new_empty((rows * self.world, *s.shape[1:]), dtype=dtype)
            else:  # the same storage as before: the window's lookups accumulate one gradient
                p = self.full[i]
                p.untyped_storage().resize_(p.untyped_storage().nbytes() or rows * self.world * mine[0].nbytes)
                whole = torch.empty(0, dtype=dtype, device=p.device).set_(
                    p.untyped_storage(), 0, (rows * self.world, *s.shape[1:]))
            dist.all_gather_single(whole, mine, group=self.group)
            if first:
                p = torch.nn.Parameter(whole[: s.shape[0]], requires_grad=s.requires_grad)
            full.append(p)
        if first:
            self.full = full
            self._install(full)

    def free(self) -> None:
        """Drop the whole weights, keeping the parameters (and their gradients) in place (local)."""
        if self.full is not None and not self.pinned:
            for p in self.full:
                _free_storage(p)

    @torch.no_grad()
    def release(self, *, reduce: bool) -> None:
        """Put the shards back; with ``reduce``, first add the whole gradient, summed over the ranks, to
        each shard's ``.grad`` (collective: every rank reduces, a missing gradient as zeros). No-op
        when not gathered."""
        if self.full is None:
            return
        full, self.full = self.full, None
        self._install(self.shards)
        for s, p in zip(self.shards, full, strict=True):
            grad, p.grad = p.grad, None
            _free_storage(p)
            if reduce and s.requires_grad:
                self._reduce_into(s, grad)
            del grad

    def _reduce_into(self, s: torch.nn.Parameter, grad: torch.Tensor | None) -> None:
        """``s.grad += `` this rank's rows of Σ_ranks ``grad`` (zeros where None), block by block."""
        rows, dtype = self._rows(s), torch.float32 if self.param_dtype else s.dtype
        tail = s.shape[1:]
        out = torch.empty((rows, *tail), dtype=dtype, device=s.device)
        n = max(1, REDUCE_BLOCK_BYTES // max(1, self.world * out[:1].nbytes))  # rows of a block, per rank
        buf = out.new_empty((self.world * min(n, rows), *tail))
        for b in range(0, rows, n):
            k = min(n, rows - b)
            block = buf[: self.world * k].view(self.world, k, *tail)
            block.zero_()
            for r in range(self.world):  # rank r's rows b..b+k of the whole gradient
                lo, hi = r * rows + b, min(r * rows + b + k, s.shape[0])
                if grad is not None and hi > lo:
                    block[r, : hi - lo] = grad[lo:hi]
            dist.reduce_scatter_single(out[b : b + k], buf[: self.world * k], op=dist.ReduceOp.SUM, group=self.group)
        grad = DTensor.from_local(out[: s.to_local().shape[0]].to(s.dtype), self.mesh, [Shard(0)],
                                  shape=s.shape, stride=s.stride())
        if s.grad is None:
            s.grad = grad
        else:
            s.grad.add_(grad)  # a later backward of the step


class HeadShards(RowShards):
    """The LM head's parameters (tied: the matrix the embedding shares) as :class:`RowShards`; freed
    in a backward as soon as its gradient is in."""

    def __init__(self, root: torch.nn.Module, mesh, param_dtype: torch.dtype | None):
        head = root.get_output_embeddings()
        if head is None:
            raise InputError(f"{type(root).__name__} has no output embeddings to shard: not a causal LM")
        params = [p for p in (getattr(head, "weight", None), getattr(head, "bias", None)) if p is not None]
        self.module = head
        self.tied = any(p is getattr(root.get_input_embeddings(), "weight", None) for p in params)
        super().__init__(root, params, mesh, param_dtype)

    def gather(self) -> None:
        fresh = self.full is None
        super().gather()
        if fresh:
            for p in self.full:
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda p: None if self.pinned else _free_storage(p))


class EmbeddingShards(RowShards):
    """The (untied) input embedding as :class:`RowShards`, gathered for each lookup and freed after it."""

    def __init__(self, root: torch.nn.Module, mesh, param_dtype: torch.dtype | None):
        self.module = root.get_input_embeddings()
        super().__init__(root, [self.module.weight], mesh, param_dtype)
        self.module.register_forward_pre_hook(lambda m, args: self.gather())
        self.module.register_forward_hook(lambda m, args, out: self.free())


@dataclass
class Sharded:
    """The row-sharded parameters of a model :func:`shard_model` sharded."""

    head: HeadShards
    embedding: EmbeddingShards | None  # None when tied (the head's unit holds its matrix)

    @property
    def units(self) -> list[RowShards]:
        return [u for u in (self.head, self.embedding) if u is not None]


_SHARDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine model -> its Sharded


def row_shards(model: torch.nn.Module) -> Sharded | None:
    """The row-sharded head and embedding of a model :func:`shard_model` sharded, or of its PEFT
    wrapper (None otherwise)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _SHARDED.get(base)


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
    block's forwards, and so do the head and the embedding (:class:`RowShards`); the exit reshards
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
