"""DPO recipe: trajectory preference pairs, exact on each pair's conditioning tree.

    memorywalker dpo --config configs/dpo_tiny.toml --method radix [--resume] [key=value ...]
    memorywalker dpo data=rollouts.jsonl rule=solved-then-fewer-tool-calls beta=0.1 adapter.kind=lora

Pairs come from ``pairs`` (a JSONL of ``{"chosen": ID, "rejected": ID}`` naming records of ``data``)
or, without it, from a preference ``rule`` over the rollouts of each task in ``data`` (e.g. the output
of ``memorywalker rollout --samples 4``). A pair is admitted only when both records branch from an
identical conditioning context (``memorywalker.tree.pairs.admit_pair``); every rejected pair is written
to ``run_dir/pair_rejects.jsonl`` with its reason. Each pair becomes one forest (the two records merged
at their shared prefix); the scored set is the divergent spans after the branch (``scored=divergent``)
or every target (``whole``).

Per step (``batch_size`` pairs, ``world_size × grad_accum`` micro-batches):

1. the engine's differentiable per-target logprobs (:func:`memorywalker.engine.logprobs`; any method,
   exact ones give a plain per-call forward's) are summed per pair side over the scored targets;
2. the loss ``−log σ(β[(logp_w − logp_ref_w) − (logp_l − logp_ref_l)])`` (``objectives/preference.py``,
   optional length normalization and SFT term), averaged over the step's pairs, is backpropagated
   through the sums: one forward pass per micro-batch, the graph held until its backward.

The reference sums (``ref_model``, default: the policy as loaded, before any update) are computed
once, before training, and kept in a cache keyed by weights, tokenizer, template, sequences, scored
indices and settings (``memorywalker.train.refcache``), so a resume reuses them.
"""

from __future__ import annotations

import json
import time
from typing import Literal

import torch
from pydantic import field_validator
from tqdm import tqdm

from memorywalker.engine import Batch, Denominators, EngineConfig, get_method, logprobs
from memorywalker.engine.logprobs import kl_term
from memorywalker.errors import InputError
from memorywalker.fileio import atomic_write
from memorywalker.objectives.normalize import reduce_denominator
from memorywalker.objectives.preference import dpo_loss
from memorywalker.render import Renderer
from memorywalker.render.chat_templates import use_chat_template
from memorywalker.render.types import calls_left_out, left_out_line
from memorywalker.train.adapter import (
    engine_model,
)
from memorywalker.train.checkpoint import restore
from memorywalker.train.config import ConfigError, TrainConfig, check_choice
from memorywalker.train.distributed import device_for
from memorywalker.train.fsdp import save_step
from memorywalker.train.inputs import FitsModel, model_positions, read_records
from memorywalker.train.logging import MetricsLogger, wandb_options
from memorywalker.train.manifest import record_rows
from memorywalker.train.model import load_model, load_tokenizer
from memorywalker.train.recipe import begin, finish
from memorywalker.train.refcache import RefCache, ref_settings, reference_sums, weights_hash
from memorywalker.train.rundir import check_resumed, input_hashes, owned_run_dir, record_config
from memorywalker.train.sharded_step import StepSchedule
from memorywalker.train.step import (
    TrainResult,
    check_divisible,
    optimizer_step,
    prepare_training,
    rank_micro_batches,
    reduce_step_metrics,
    step_trajectories,
    warmup_lr,
)
from memorywalker.tree.pairs import (
    SCORED_SETS,
    AdmittedPair,
    PairRejected,
    admit_pair,
    read_pairs,
    rule_pairs,
    scored_targets,
)


class DPOConfig(TrainConfig):
    """``memorywalker dpo`` (fields of :class:`~memorywalker.train.config.TrainConfig` plus these)."""

    data: str | None = None  # trajectory JSONL holding both records of every pair
    pairs: str | None = None  # JSONL of {"chosen": ID, "rejected": ID}; None = pairs from `rule`
    rule: str = "reward"  # without `pairs`: reward | fewer-tool-calls | solved-then-fewer-tool-calls
    max_pairs_per_task: int | None = None  # cap on the rule's pairs per task (None = all)
    scored: Literal["divergent", "whole"] = "divergent"  # targets after the branch, or every target
    beta: float = 0.1  # β of DPO (Rafailov et al. 2023)
    length_normalize: bool = False  # mean instead of sum of each side's logprobs
    sft_weight: float = 0.0  # weight of an NLL term (per token) on the preferred side's scored targets
    ref_model: str | None = None  # reference model dir; None = the policy as loaded, before training
    ref_cache: str | None = None  # reference logprob cache (JSON); None = run_dir/ref_logprobs.json
    batch_size: int = 4  # pairs per optimizer step, over all ranks and micro-batches
    normalization: str = "sequence"  # the loss is a mean over the step's pairs (DESIGN.md, "sequence")
    truncated: Literal["exclude", "prefix"] = "exclude"  # responses cut off by the length limit
    run_dir: str = "runs/dpo"
    lr: float = 1e-6

    @field_validator("normalization")
    @classmethod
    def _normalization(cls, v: str) -> str:
        if v != "sequence":
            raise ValueError(f"dpo normalizes per pair: normalization must be 'sequence', not {v!r}")
        return v

    @field_validator("scored")
    @classmethod
    def _scored(cls, v: str) -> str:
        return check_choice("scored set", v, SCORED_SETS)


def admit_pairs(rendered: dict, ids: list[tuple[str, str]], scored: str
                ) -> tuple[list[AdmittedPair], list[dict]]:
    """Admitted pairs, and ``{"chosen", "rejected", "reason"}`` for each rejected one (order kept)."""
    admitted, rejected = [], []
    for w, lo in ids:
        missing = [i for i in (w, lo) if i not in rendered]
        if missing:
            rejected.append({"chosen": w, "rejected": lo, "reason": f"no record with id {missing[0]} in data"})
            continue
        try:
            admitted.append(admit_pair(rendered[w], rendered[lo], scored))
        except PairRejected as e:
            rejected.append({"chosen": w, "rejected": lo, "reason": str(e)})
    return admitted, rejected


def pair_sums(model, pairs: list[AdmittedPair], engine: EngineConfig):
    """Each pair side's summed logprob over its scored targets, [P, 2] float64 with the graph (under the
    caller's grad mode), the scored-target counts [P, 2] and the logprobs (sdcc: its KL rows)."""
    batch = Batch.from_groups([[p.chosen, p.rejected] for p in pairs])  # one forest per pair
    scored, seq = scored_targets(batch, pairs)  # only the scored set counts; seq = 2·pair + side
    lp = logprobs(model, batch, engine)
    device = lp.values.device
    s_idx = torch.from_numpy(seq[scored]).to(device)
    sums = torch.zeros(2 * len(pairs), dtype=torch.float64, device=device).index_add(
        0, s_idx, lp.values[torch.from_numpy(scored).to(device)].double())
    counts = torch.zeros(2 * len(pairs), dtype=torch.float64, device=device).index_add_(
        0, s_idx, torch.ones(len(s_idx), dtype=torch.float64, device=device))
    return sums.view(-1, 2), counts.view(-1, 2), lp


def pair_loss(model, pairs: list[AdmittedPair], ref: torch.Tensor, engine: EngineConfig, cfg: DPOConfig,
              num_pairs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The DPO loss of a micro-batch of pairs, Σ over them / ``num_pairs`` of the step, with the graph
    (plus sdcc's KL term), and its stats. ``ref``: float64 [P, 2] reference sums.

    The engine's differentiable per-target logprobs (:func:`memorywalker.engine.logprobs`) are summed
    per pair side and the sequence-level loss is taken on the sums: one forward pass."""
    sums, counts, lp = pair_sums(model, pairs, engine)
    pw, pl = sums[:, 0], sums[:, 1]
    ref = ref.to(sums.device)
    losses, stats = dpo_loss(pw, pl, ref[:, 0], ref[:, 1], beta=cfg.beta, chosen_tokens=counts[:, 0],
                             rejected_tokens=counts[:, 1], length_normalize=cfg.length_normalize,
                             sft_weight=cfg.sft_weight)
    loss = losses.sum() / num_pairs.to(sums.device)  # mean over the step's pairs
    total = loss
    if lp.kl is not None:  # sdcc: λ · Σ_j eps_j, its KL term per micro-batch of pairs
        one = torch.ones((), dtype=torch.float64)
        total = total + kl_term(lp.eps_kl(), Denominators(loss=one, kl=one), engine)
    return total, {"loss": loss.detach(), "margin": stats["margin"], "coefficient": stats["coefficient"],
                   "chosen_reward": stats["chosen_reward"], "rejected_reward": stats["rejected_reward"],
                   "policy": sums.detach(), "tokens": counts.sum()}


def pair_step(model, pairs: list[AdmittedPair], ref: torch.Tensor, engine: EngineConfig, cfg: DPOConfig,
              num_pairs: torch.Tensor, *, backward: bool = True, schedule=None) -> dict[str, torch.Tensor]:
    """One micro-batch of pairs (:func:`pair_loss`) and, with ``backward``, its gradient accumulated
    into ``model`` (through ``schedule.backward`` when given: a sharded step's). Returns the stats."""
    with torch.enable_grad() if backward else torch.no_grad():
        total, stats = pair_loss(model, pairs, ref, engine, cfg, num_pairs)
        if backward and total.requires_grad:
            schedule.backward(total) if schedule is not None else total.backward()
    return stats


def train(cfg: DPOConfig, *, pairs: list[tuple[str, str]] | None = None, trajectories=None,
          progress: bool = True) -> TrainResult:
    """Run the recipe on ``cfg.data`` / ``cfg.pairs`` (or the given ``trajectories`` / ``pairs`` ids).
    The run dir is this process's until the run ends (a second process on it is refused)."""
    with owned_run_dir(cfg, "dpo"):
        return _train(cfg, pairs=pairs, trajectories=trajectories, progress=progress)


def _train(cfg: DPOConfig, *, pairs, trajectories, progress: bool) -> TrainResult:

    # --- setup: ranks, inputs (checked before the model loads) ----------------------------------------
    info, run_dir = begin(cfg)  # ranks; the run dir checked on every rank
    check_divisible(cfg.batch_size, info, cfg.grad_accum, "batch_size")
    if trajectories is None and cfg.data is None:
        raise ConfigError("dpo needs data=FILE (trajectory JSONL) or trajectories passed to train()")
    # The tokenizer first: out-of-vocabulary ids and over-long calls are set aside before the model loads.
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer)
    use_chat_template(tokenizer, cfg.chat_template)
    renderer = Renderer(tokenizer, cfg.render_options(truncated=cfg.truncated))
    fits = FitsModel(renderer, cfg.max_seq_len or model_positions(cfg.model),
                     full_view=get_method(cfg.method).full_view)  # as in sft/rl: sdcc trains on the full view
    trajectories = read_records("dpo", cfg.data, trajectories, tokenizer=tokenizer, check=fits,
                                rejects_path=run_dir / f"rejects.rank{info.rank}.jsonl", verbose=info.is_main)
    if pairs is None:
        pairs = read_pairs(cfg.pairs) if cfg.pairs else rule_pairs(trajectories, cfg.rule,
                                                                   max_pairs_per_task=cfg.max_pairs_per_task)
    torch.manual_seed(cfg.seed)
    model, _ = load_model(cfg.model, cfg.tokenizer, dtype=cfg.dtype, device=device_for(cfg.device, info))
    model.eval()  # no dropout: both engine passes of a step compute the same function
    base_hash = weights_hash(model)

    # --- pairs: admit (identical context before the branch), reject with a reason ----------------------
    rendered = fits.rendered  # by trajectory id, rendered while they were read
    admitted, rejected = admit_pairs(rendered, pairs, cfg.scored)
    if info.is_main:
        with atomic_write(run_dir / "pair_rejects.jsonl") as f:
            f.writelines(json.dumps(r) + "\n" for r in rejected)
        print(f"dpo: {len(pairs)} pairs: {len(admitted)} admitted, {len(rejected)} rejected"
              + (f" (reasons in {run_dir / 'pair_rejects.jsonl'})" if rejected else ""))
        print(f"dpo: {left_out_line(calls_left_out(rendered.values()), sum(len(r.calls) for r in rendered.values()), cfg.truncated)}",
              flush=True)
    if not admitted:
        raise InputError(f"dpo: no admitted pair among {len(pairs)}"
                         + (f"; first rejection: {rejected[0]['reason']}" if rejected else ""))

    # --- reference sums, once (before any update or resume), through the cache -------------------------
    engine = cfg.engine_config("nll")  # its logprobs feed pair_loss, normalized per pair ("sequence")
    ref_model = model
    if cfg.ref_model is not None:
        ref_model, _ = load_model(cfg.ref_model, cfg.tokenizer, dtype=cfg.dtype, device=device_for(cfg.device, info))
        ref_model.eval()
    cache = RefCache(cfg.ref_cache or run_dir / "ref_logprobs.json")
    settings = ref_settings(ref_model, tokenizer, method=cfg.method, attention=cfg.attention,
                            max_tokens=cfg.max_tokens, truncated=cfg.truncated)
    with torch.no_grad():
        ref = reference_sums(ref_model, admitted, settings, cache, engine)
    del ref_model

    # --- model: adapter, optimizer, resume ----------------------------------------------------------------
    model, optimizer = prepare_training(model, cfg, info)  # adapter, then fsdp sharding, then AdamW
    state = restore(run_dir, cfg.resume, model, optimizer, verbose=info.is_main, clean_up=info.is_main)
    start = state["step"] if state else 0
    inputs = input_hashes(tokenizer, trajectories, data=cfg.data, pairs=cfg.pairs)  # a resume compares them
    check_resumed(cfg, state, inputs)
    if info.is_main:
        record_config(cfg)
    logger = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, enabled=info.is_main, resume_step=start,
                           wandb=wandb_options(cfg))

    # --- loop -------------------------------------------------------------------------------------------
    history: list[dict] = []
    bar = tqdm(total=cfg.steps, initial=start, desc=f"dpo {cfg.method}", unit="step",
               disable=not (progress and info.is_main))
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        ids = step_trajectories(len(admitted), cfg.batch_size, step, cfg.seed)
        micro = rank_micro_batches(ids, info, cfg.grad_accum)
        num_pairs = reduce_denominator([torch.tensor(float(len(mb))) for mb in micro])  # Σ over ranks
        rows = []
        with StepSchedule(model) as schedule:  # fsdp: the ranks agree on every pass (a layer gathered at a time)
            for mb in micro:
                out = pair_step(engine_model(model), [admitted[i] for i in mb], ref[mb], engine, cfg, num_pairs,
                                schedule=schedule)
                rows.append({"loss": out["loss"], "margin": out["margin"].mean(),
                             "accuracy": (out["margin"] > 0).double().mean(),
                             "coefficient": out["coefficient"].mean(), "chosen_reward": out["chosen_reward"].mean(),
                             "rejected_reward": out["rejected_reward"].mean(), "tokens": out["tokens"]})
        lr = warmup_lr(cfg.lr, step, cfg.warmup_steps)
        grad_norm = optimizer_step(model, optimizer, lr=lr, grad_clip=cfg.grad_clip)
        metrics = reduce_step_metrics(rows + [schedule.metrics()])
        metrics.update(lr=lr, grad_norm=float(grad_norm), seconds=time.perf_counter() - t0)
        logger.log(step, metrics)
        history.append({"step": step, **metrics})
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}", margin=f"{metrics['margin']:.3f}")
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_step(run_dir, step + 1, model, optimizer, {"data_position": (step + 1) * cfg.batch_size,
                                                            "num_pairs": len(admitted), "inputs": inputs},
                      keep=cfg.keep_checkpoints, info=info)
    bar.close()
    logger.close()

    # --- final model, adapter manifest, training manifest ------------------------------------------------
    used = {t for p in admitted for t in (p.chosen.id, p.rejected.id)}
    finish(cfg, info, model, tokenizer, optimizer=optimizer, recipe="dpo", steps=cfg.steps, base_hash=base_hash,
           inputs=[p for p in (cfg.data, cfg.pairs) if p], records=record_rows([t for t in trajectories if t.id in used]),
           target_rule={"scored": cfg.scored, "truncated": cfg.truncated, "selected": "selected calls' responses"},
           extra={"pairs": [{"chosen": p.chosen.id, "rejected": p.rejected.id, "branch_call": p.branch_call,
                             "branch_token": p.branch_token} for p in admitted],
                  "rejected_pairs": rejected})
    return TrainResult(run_dir=run_dir, final_dir=run_dir / "final", steps=cfg.steps, metrics=history)


if __name__ == "__main__":  # torchrun / accelerate launch -m memorywalker.recipes.dpo ...
    from memorywalker.cli.train_cmd import recipe_main

    recipe_main("dpo")
