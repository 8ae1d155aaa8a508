"""The passes of one sharded training step, agreed across ranks: FSDP2 gathers each decoder layer for its
compute and reshards it after, while the trees decide how many forwards and backwards each rank runs.

    with StepSchedule(model) as schedule:          # every rank, around its micro-batches
        for mb in micro:
            run(engine_model(model), mb, engine, denominators=dens, schedule=schedule)
    optimizer_step(model, optimizer, ...)          # the gradients are already reduce-scattered

**Why agree.** Under ``fully_shard`` each decoder layer all-gathers its parameters before its forward and
reshards after it (``reshard_after_forward=True``, FSDP2's default), all-gathers them again before its
backward, and reduce-scatters its gradient after it. Those collectives come from inside the model, once
per forward and backward, so two ranks pair them up only if they run the same number of forwards, in the
same order relative to their backwards. The engine's passes depend on the trees (``radix``: one forward
per tree level, ``per-call``: one forward and backward per call, RL: however many buffers a rank's
rollouts fill), so ranks differ — and since every decoder layer has the same shapes, a mismatch would not
even fail: rank 0's layer 3 would be gathered with rank 1's layer 2.

**How.** Before each forward and before each backward, the ranks all-reduce (max) what they want to do
next — a forward with grad, a forward without, a backward, or nothing (the step is done):

* the largest wish wins; the ranks that wished it do their real pass;
* every other rank does an *empty* pass of that kind instead — a one-token forward whose output only
  enters the backward as a zero-weight term (``0 * h.sum()`` of the head's input ``h``), or a backward
  through the empty forwards it ran since its last backward — and asks again. A rank that has finished
  keeps doing empty passes until every rank says done (:meth:`StepSchedule.finish`), as DDP's ``Join``
  does for uneven inputs.

So between two backwards every rank ran the same number of forwards with grad, and every backward
covers all of them: each real forward's output is tied into the next backward as a zero-weight term
too, so a forward whose output reaches no target (a tree node with nothing to predict) still runs its
layers' backward hooks. Autograd runs a backward's nodes latest-first, so the layers' backward
collectives come forward by forward (the last first), each from the top layer down: the same sequence
on every rank. Each backward reduce-scatters (sums) its gradients into the sharded ``.grad``, each
forward's share after that forward's own backward (:func:`memorywalker.train.fsdp.reduce_per_forward`):
no layer's unsharded gradient outlives its backward.

Per step that is one tiny all-reduce per pass, plus, per forward with grad on the rank with the most: one
all-gather of each layer in forward, one in backward and one reduce-scatter, and one all-gather of the
input embedding — the FSDP price of a micro-batch, paid per radix forward. The cached ancestor
keys/values of the radix schedule are activations of earlier forwards, not parameters: they hold no
layer gathered.

**The LM head and the embedding** (:class:`memorywalker.train.row_shards.RowShards`) are sharded by rows
outside FSDP. The engine applies the head outside the model's forward, to the hidden states every forward
of a buffer captured, a chunk of targets at a time — a number of uses that differs between ranks. So it
is gathered at the first forward of each window (the forwards between two backwards: an agreed pass)
and stays whole while the window's forwards and the engine's chunked loss use it. In the backward, its
whole weight is freed on each rank as soon as its gradient has been accumulated (every node that read it
has run; local), and the gradient is reduce-scattered at the backward's end, where every rank is at the
same point (:class:`_Release`). Where in a backward the head's gradient is complete differs between
ranks — a rank that ran empty forwards after its chunked loss backpropagates those first — so an
earlier reduction would not pair up. The model's own call of the head inside its forward (one row, whose
logits only :func:`memorywalker.engine.head.check_head_logits` reads) runs without grad, so no autograd
node keeps the whole head for later, and each forward's zero-weight term is taken from the head's input
instead. The embedding is gathered for each lookup (every forward, real or empty, runs one) and freed
right after it; its gradient is reduced with the head's.

The passes inside :func:`memorywalker.train.fsdp.gathered` (rollouts, the no-grad π_old pass) are a
different regime: every layer and the head stay gathered and nothing communicates.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch.autograd import Variable

from memorywalker.engine.head import mark_transparent
from memorywalker.train.fsdp import fsdp_modules, local_device
from memorywalker.train.row_shards import row_shards

DONE, BACKWARD, FORWARD, GRAD_FORWARD = 0, 1, 2, 3  # what a rank wishes next; the largest wish runs


class StepSchedule:
    """Agree every forward and backward of one optimizer step across the ranks of a sharded model.

    Use as a context manager around the step's passes; route every backward through :meth:`backward`
    (``engine.run(..., schedule=...)`` does). Forwards are seen by a pre-hook on the root module. Leaving
    the block runs :meth:`finish`. ``counts`` holds this rank's real and empty passes (``forwards``,
    ``grad_forwards``, ``backwards``, ``empty_forwards``, ``empty_backwards``, ``rounds``).

    On an unsharded model (ddp, one process) it is inert: no hooks, no collectives, plain backwards.
    """

    def __init__(self, model: torch.nn.Module, group=None):
        units = fsdp_modules(model)
        self.root = units[0] if units else model  # the outermost unit, which the engine calls (under PEFT: the base)
        self.group = group
        self.active = bool(units) and dist.is_initialized() and dist.get_world_size(group) > 1
        self.counts: Counter = Counter()
        self._anchors: list[torch.Tensor] = []  # zero-weight terms of this rank's forwards since its last backward
        self._quiet = False  # inside our own pass (an empty forward, a backward's recomputation): no wishes
        self._hooks: list = []
        self._device = local_device(self.root) if self.active else None
        self.sharded = row_shards(self.root) if self.active else None
        self.head = self.sharded.head if self.sharded is not None else None
        self._in_model = False  # inside the model's own forward (where its head call is only looked at)
        self._head_input = None  # the head's input in the model's last forward
        self._grad_mode: list[bool] = []

    # --- the block -------------------------------------------------------------------------------------

    def __enter__(self) -> StepSchedule:
        if self.active:
            self._hooks = [
                # prepend: before FSDP's own pre-hook on the root, which may all-gather the root unit
                self.root.register_forward_pre_hook(self._before_forward, prepend=True),
                self.root.register_forward_hook(self._after_forward),
            ]
            if self.head is not None:
                head = self.head.module
                own = [head.register_forward_pre_hook(self._before_head, prepend=True),
                       head.register_forward_hook(self._after_head, always_call=True)]
                mark_transparent(head, *own)
                self._hooks += own
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            for h in self._hooks:
                h.remove()
            self._hooks = []
            self._anchors = []
            for unit in self.sharded.units if self.sharded is not None else []:
                unit.release(reduce=False)  # a block of no-grad passes, or an error: nothing to reduce

    def finish(self) -> None:
        """Run empty passes until every rank is done. Collective; called on leaving the block."""
        if not self.active:
            return
        if self._anchors:
            # Forwards with grad whose loss needed no backward (a buffer without a trained target). Every
            # rank holds as many since the last backward (each forward with grad, real or empty, leaves
            # one), so every rank wishes this backward: it runs the layers' backward hooks FSDP armed.
            self._wait_for_turn(BACKWARD)
            self.counts["empty_backwards"] += 1
            self._backward([])
        self._wait_for_turn(DONE)

    def metrics(self) -> dict[str, int]:
        """This rank's empty passes (summed over ranks in a step's metrics); nothing when inert."""
        if not self.active:
            return {}
        return {"empty_forwards": self.counts["empty_forwards"], "empty_backwards": self.counts["empty_backwards"]}

    # --- passes ----------------------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, once every rank has agreed to backward (the others run empty forwards
        first, or an empty backward)."""
        if not self.active:
            loss.backward()
            return
        self._wait_for_turn(BACKWARD)
        self.counts["backwards"] += 1
        self._backward([loss])

    def _backward(self, roots: list[torch.Tensor]) -> None:
        roots = roots + self._anchors
        self._anchors = []
        if not roots:
            return
        if self.sharded is not None:
            roots.append(_Release.apply(torch.zeros((), device=self._device, requires_grad=True), self.sharded))
        self._quiet = True  # a checkpointed layer recomputes its forward inside the backward
        try:
            torch.autograd.backward(roots)
        finally:
            self._quiet = False
        for unit in self.sharded.units if self.sharded is not None else []:
            unit.release(reduce=True)  # (a no-op: released by _Release's callback)

    def _before_forward(self, module, args) -> None:
        if not self._quiet:
            grad = torch.is_grad_enabled()
            self._wait_for_turn(GRAD_FORWARD if grad else FORWARD)
            self.counts["grad_forwards" if grad else "forwards"] += 1
        self._in_model, self._head_input = True, None

    def _after_forward(self, module, args, output) -> None:
        self._in_model = False
        if self._quiet or not torch.is_grad_enabled():
            return
        self._anchor()

    def _anchor(self) -> None:
        """Tie this forward into the next backward with a zero-weight term: through the head's input,
        which every use of the head's output flows back through (the whole network below it)."""
        h = self._head_input
        if h is not None and h.requires_grad:
            self._anchors.append(h.float().sum() * 0.0)
        self._head_input = None

    def _before_head(self, module, args) -> None:
        """The model's own head call: record its input and compute the call without grad (its one row
        of logits is only looked at), so no autograd node keeps the whole head for a later backward."""
        if not self._in_model:
            return  # the engine's own use of the head (the chunked loss)
        self._head_input = args[0]
        self._grad_mode.append(torch.is_grad_enabled())
        torch.set_grad_enabled(False)

    def _after_head(self, module, args, output) -> None:
        if self._in_model and self._grad_mode:
            torch.set_grad_enabled(self._grad_mode.pop())

    def _empty(self, wish: int) -> None:
        """This rank's stand-in for a pass another rank runs."""
        if wish == BACKWARD:
            self.counts["empty_backwards"] += 1
            self._backward([])
            return
        self.counts["empty_forwards"] += 1
        self._quiet = True
        try:
            with torch.set_grad_enabled(wish == GRAD_FORWARD):
                self.root(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self._device), use_cache=False)
                if wish == GRAD_FORWARD:
                    self._anchor()
        finally:
            self._quiet = False

    def _wait_for_turn(self, wish: int) -> None:
        while True:
            agreed = torch.tensor([wish], dtype=torch.int64, device=self._device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.group)
            self.counts["rounds"] += 1
            turn = int(agreed.item())
            if turn in (FORWARD, GRAD_FORWARD) and self.head is not None:
                self.head.gather()  # the first forward of a window (a no-op after that)
            if turn == wish:
                return
            self._empty(turn)


class _Release(torch.autograd.Function):
    """A zero-weight root added to every backward of a sharded step. Created last, it runs first, and
    queues the release of the head and the embedding (their gradients reduce-scattered, summed over the
    ranks) as a callback of the backward's end, where every rank is at the same point, before FSDP's own
    end-of-backward callback (the root's and any late layer's reductions)."""

    @staticmethod
    def forward(ctx, zero, sharded):
        ctx.sharded = sharded
        return zero * 0.0

    @staticmethod
    def backward(ctx, grad):
        units = ctx.sharded.units
        Variable._execution_engine.queue_callback(lambda: [u.release(reduce=True) for u in units])
        return None, None
