"""The LM head and the input embedding sharded by rows, outside FSDP (``parallel = "fsdp"``).

At a real vocabulary their [V, H] matrices are a model's largest tensors (V = 151,936, H = 1,024: 594 MiB
each in fp32, with as much again for a gradient), and the engine applies the head outside the model's
forward, so they are sharded here and gathered whole only while a pass uses them; see
:class:`RowShards`. :func:`memorywalker.train.fsdp.shard_model` creates them,
:class:`memorywalker.train.sharded_step.StepSchedule` and :func:`memorywalker.train.fsdp.gathered` drive
them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from memorywalker.errors import InputError


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

    * the head (:class:`HeadShards`; tied: with the embedding's matrix):
      :class:`memorywalker.train.sharded_step.StepSchedule` calls :meth:`gather` at the first forward
      after a backward (an agreed pass) and :meth:`release` ``(reduce=True)`` at the backward's end;
      in between, the whole weight is freed once autograd has accumulated its gradient
      (:func:`_free_storage`: no node of that backward reads it again);
    * the untied embedding (:class:`EmbeddingShards`): gathered by a pre-hook on the embedding module (every
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
        self.world = dist.get_world_size(self.group)
        # every (module, name) holding one of these parameters (a tied head and embedding: both)
        self.slots = [[(m, n) for m in root.modules() for n, q in m._parameters.items() if q is p] for p in params]
        self.shards = [torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)]),
                                          requires_grad=p.requires_grad) for p in params]
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
                p.untyped_storage().resize_(rows * self.world * mine[0].nbytes)
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
    """The row-sharded parameters of a model :func:`memorywalker.train.fsdp.shard_model` sharded."""

    head: HeadShards
    embedding: EmbeddingShards | None  # None when tied (the head's unit holds its matrix)

    @property
    def units(self) -> list[RowShards]:
        return [u for u in (self.head, self.embedding) if u is not None]


_SHARDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine model -> its Sharded


def register(root: torch.nn.Module, sharded: Sharded) -> None:
    _SHARDED[root] = sharded


def row_shards(model: torch.nn.Module) -> Sharded | None:
    """The row-sharded head and embedding of a model :func:`~memorywalker.train.fsdp.shard_model`
    sharded, or of its PEFT wrapper (None otherwise)."""
    # not adapter.engine_model: PEFT marks the base model it adapted with peft_config too
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _SHARDED.get(base)
