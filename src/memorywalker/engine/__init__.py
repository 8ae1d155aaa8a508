"""Training engines: run a method + objective on a Hugging Face causal LM for one micro-batch.

API::

    from memorywalker.engine import Batch, EngineConfig, TokenCall, logprobs, loss, run, step_denominators

    batch = Batch.from_groups(groups)      # groups: list[list[RenderedTrajectory]] (sdcc: full_view=True)
    batch = Batch.from_token_ids([[TokenCall(ids, response_start), ...], ...])   # or from token ids
    cfg = EngineConfig(method="radix", objective="nll", normalization="token")

    out = logprobs(model, batch, cfg)      # differentiable per-target logprobs (out.values [N]) + target table
    my_loss(out.values, out.targets).backward()          # any loss of your trainer
    loss(model, batch, cfg).loss.backward()              # or the engine's objective, normalized as declared
    result = run(model, batch, cfg)        # the same, streamed: one backward per buffer, grads accumulated
    optimizer.step(); optimizer.zero_grad()

``logprobs(model, batch, cfg=None) -> TargetLogprobs`` (``engine/logprobs.py``): ``values`` float32 [N]
with the graph (NaN where the method lost a target), ``targets`` (position, label, call, trajectory,
weight, rollout_logprob, advantage), ``weight``, ``lost``, ``kl`` (sdcc: per KL row) and ``eps_kl()``.
``loss(model, batch, cfg=None, *, advantages=None, weights=None, old_logprobs=None, denominators=None)
-> LossOutput`` (``loss`` with the graph, ``logprobs``, per-target ``stats``); its gradient equals what
``run`` accumulates.

``run(model, batch, cfg=None, *, backward=True, denominators=None, advantages=None, weights=None,
old_logprobs=None) -> EngineResult`` with

* ``result.loss`` — scalar, detached: the loss whose gradient was accumulated;
* ``result.logprobs`` — float32 [N], per target of ``batch.targets`` (NaN where the method lost it);
* ``result.weight`` — float32 [N], the weights trained with (0 on lost targets);
* ``result.metrics`` — ``forwards``, ``backwards``, ``tokens`` (the layout's), ``processed_tokens``
  (what the forwards ran: a masked buffer padded to its backend's multiple), ``buffers``, ``targets``,
  ``lost_targets``, objective stats (``mean_ratio``, ``mean_clipped``, ``mean_tis_weight``, over
  ``trained_targets``), gap metrics against recorded rollout logprobs (``logprob_abs_diff``, ``k3_kl``,
  ``chi2_token`` over ``compared_targets``; ``log_ppl_abs_diff`` over ``compared_calls``) and for ``sdcc`` ``eps_kl_mean``, ``eps_kl_max``, ``tv_bound`` (= sqrt(eps_kl/2),
  Pinsker), ``tv_bound_max``, ``students``, ``unmatched_calls``. Tensors stay on the device: the
  recipe syncs and logs once.
* ``result.eps_kl`` — sdcc: [J] the mean per-token KL of each student.

Methods: one :class:`Method` each in the registry :data:`METHODS` (``engine/methods.py``: layout,
forward schedule, backward schedule, KL term, exactness). Objectives (:data:`OBJECTIVES`): ``nll``, ``ppo`` (PPO-clip on the targets' advantages,
ratio against ``batch.old_logprob``, else the rollout logprobs, else on-policy), ``grpo`` (PPO-clip with
group-relative advantages from trajectory rewards; a tree = a group), ``weighted`` (−c·log p with c the
targets' advantage column: how the DPO recipe trains a sequence-level loss, c = −dL/dΣlog p). Unknown names raise with the valid
ones. Methods on the ``mask`` schedule (``tree-mask``) run under ``cfg.attention`` = ``sdpa`` | ``eager``
| ``flex`` (None: the model's current implementation); the ``radix`` schedule uses its own attention
kernel (``attention/prefix.py``) and builds no mask.

Gradient accumulation and data parallelism: normalization divides by a denominator summed over the
whole optimizer step. Compute it once per step on every rank and pass it to every ``run``; keep the
model unwrapped and sum gradients across ranks once per step (what the recipes do)::

    dens = step_denominators(micro_batches, cfg)          # all-reduced when torch.distributed is up
    for mb in micro_batches:
        run(model, mb, cfg, denominators=dens)            # local gradients of Σ_rank-local loss / D_global
    allreduce_gradients(model)                            # memorywalker.train.distributed: Σ over ranks
    optimizer.step()

Methods whose backward schedule is ``each`` run one backward per buffer of their layout, a number that
depends on the trees a rank holds (``per-call``: one per call), so DDP's per-backward all-reduce would
issue unequal collectives across ranks; one explicit all-reduce per step avoids that. A model wrapped
in DDP anyway is still correct with ``dp_size = world_size`` (DDP averages), as long as every rank runs
the same number of backward passes. A micro-batch holds whole trees; ``radix`` runs each buffer (a
packed set of trees, or one tree longer than ``max_tokens``) in one backward.
"""

from memorywalker.engine.config import Denominators, EngineConfig
from memorywalker.engine.logprobs import LossOutput, TargetLogprobs, layout_for, logprobs, loss
from memorywalker.engine.methods import METHODS, Method, get_method, method_names, needs_full_view
from memorywalker.engine.objective import OBJECTIVES, Objective, get_objective
from memorywalker.engine.run import EngineResult, run, step_denominators
from memorywalker.layout.batch import Batch, TokenCall

__all__ = [
    "METHODS",
    "OBJECTIVES",
    "Batch",
    "Denominators",
    "EngineConfig",
    "EngineResult",
    "LossOutput",
    "Method",
    "Objective",
    "TargetLogprobs",
    "TokenCall",
    "get_method",
    "get_objective",
    "layout_for",
    "logprobs",
    "loss",
    "method_names",
    "needs_full_view",
    "run",
    "step_denominators",
]
