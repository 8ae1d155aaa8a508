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
  enters the backward as ``0 * logits.sum()``, or a backward through the empty forwards it ran since
  its last backward — and asks again. A rank that has finished keeps doing empty passes until every rank
  says done (:meth:`StepSchedule.finish`), as DDP's ``Join`` does for uneven inputs.

So between two backwards every rank ran the same number of forwards with grad, and every backward
covers all of them: each real forward's output is tied into the next backward as a zero-weight term
too, so a forward whose output reaches no target (a tree node with nothing to predict) still runs its
layers' backward hooks. Autograd runs a backward's nodes latest-first, so the layers' backward
collectives come forward by forward (the last first), each from the top layer down: the same sequence
on every rank. Each backward reduce-scatters (sums) its gradients into the sharded ``.grad``, each
forward's share after that forward's own backward (:func:`memorywalker.train.fsdp.reduce_per_forward`):
no layer's unsharded gradient outlives its backward.

Per step that is one tiny all-reduce per pass, plus, per forward with grad on the rank with the most: one
all-gather of each layer in forward, one in backward and one reduce-scatter — the FSDP price of a
micro-batch, paid per radix forward. The cached ancestor keys/values of the radix schedule are
activations of earlier forwards, not parameters: they hold no layer gathered. The root unit (embedding,
final norm, LM head) stays gathered from its first forward to the end of the backward, so the engine's
chunked head runs on whole weights.

The passes inside :func:`memorywalker.train.fsdp.gathered` (rollouts, the no-grad π_old pass) are a
different regime: every layer stays gathered and nothing communicates.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from memorywalker.train.fsdp import fsdp_modules, local_device

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

    # --- the block -------------------------------------------------------------------------------------

    def __enter__(self) -> StepSchedule:
        if self.active:
            self._hooks = [
                # prepend: before FSDP's own pre-hook on the root, which may all-gather the root unit
                self.root.register_forward_pre_hook(self._before_forward, prepend=True),
                self.root.register_forward_hook(self._after_forward),
            ]
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
        self._quiet = True  # a checkpointed layer recomputes its forward inside the backward
        try:
            torch.autograd.backward(roots)
        finally:
            self._quiet = False

    def _before_forward(self, module, args) -> None:
        if self._quiet:
            return
        grad = torch.is_grad_enabled()
        self._wait_for_turn(GRAD_FORWARD if grad else FORWARD)
        self.counts["grad_forwards" if grad else "forwards"] += 1

    def _after_forward(self, module, args, output) -> None:
        if self._quiet or not torch.is_grad_enabled():
            return
        logits = output.logits if hasattr(output, "logits") else output[0]
        if logits is not None and logits.requires_grad:
            self._anchors.append(logits.float().sum() * 0.0)

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
                out = self.root(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self._device), use_cache=False)
                if wish == GRAD_FORWARD:
                    self._anchors.append(out.logits.float().sum() * 0.0)
        finally:
            self._quiet = False

    def _wait_for_turn(self, wish: int) -> None:
        while True:
            agreed = torch.tensor([wish], dtype=torch.int64, device=self._device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.group)
            self.counts["rounds"] += 1
            turn = int(agreed.item())
            if turn == wish:
                return
            self._empty(turn)
