"""RL recipe: GRPO with PPO-clip ratios against the rollout logprobs, on episodes run under compression.

    memorywalker rl --config configs/rl_tiny.toml --method sdcc [--resume] [key=value ...]
    torchrun --nproc-per-node 2 -m memorywalker.recipes.rl --config configs/rl_tiny.toml

Each step:

1. **Collect.** The next ``prompts_per_step`` tasks of ``suite`` (``split``), ``group_size`` episodes
   each, sampled from the model being trained (temperature ``temperature``) in the offline web-search
   world under the ``compressor`` compression policy with context ``budget``. With ``tasks=FILE``,
   each episode is instead a session of a real harness (``harness=``: a name of
   :data:`memorywalker.gateway.harnesses.PINNED`, or ``cmd:CMD``) through a gateway serving the weights
   being trained, scored by the task's verifier
   (:mod:`memorywalker.recipes.rl_harness`, docs/harness-rl.md). Every call records its
   context tokens, response tokens and the sampler's logprobs. Ranks roll out disjoint tasks; a
   micro-batch's episodes run in lockstep, one batched forward per sampled token
   (:mod:`memorywalker.rollout.episodes.lockstep`).
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
``rollout_engine=vllm-server`` samples every rank's episodes from a fleet of ``vllm serve`` processes
(given by URL or started here) and pushes the weights to every server after each update, proving they
arrived (:mod:`memorywalker.recipes.rl_servers`; docs/harness-rl.md, "At scale").

**One step off-policy** (``off_policy_steps=1``, with ``vllm-server``): step k+1's sessions run on the
servers while step k trains (a thread of this process drives them; nothing in it talks to the other
ranks), from the weights before step k's update; the servers get the new weights once those sessions
have ended. Each step logs its ``staleness`` (updates between sampling and training: 1, the first step
0); the PPO ratio is against the rollout logprobs, and ``rollout_is=sequence`` corrects the staleness
as it corrects the engine mismatch. A checkpoint does not hold the next step's sessions: a resumed run
collects that step again, from the checkpoint's weights.

**Ranks.** Under torchrun each rank rolls out its contiguous share of the step's tasks (harness
sessions through a gateway of its own on its loopback: a task's whole GRPO group runs and trains on
one rank, so its advantage sees every session of it) and trains its share; rank 0 writes the step's
records for the whole run.

The model stays in eval mode (no dropout) for rollouts and updates alike: ratios compare the same
function. Checkpoints hold weights, optimizer, RNG and the task cursor; episode seeds derive from the
run seed, the step and the task, so a resumed run collects exactly what an uninterrupted one collects.

Programmatic use (what ``memorywalker demo`` does)::

    from memorywalker.recipes.rl import RLConfig, train
    result = train(RLConfig(model="runs/sft/final", run_dir="runs/rl-sdcc", method="sdcc", steps=10))
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack, nullcontext

import torch
from tqdm import tqdm

from memorywalker.engine import Batch, get_method, run, step_denominators
from memorywalker.errors import InputError
from memorywalker.recipes.rl_config import RLConfig
from memorywalker.recipes.rl_servers import RolloutServers
from memorywalker.records.schema import Trajectory
from memorywalker.render import Renderer
from memorywalker.render.chat_templates import use_chat_template
from memorywalker.render.render import eot_ids
from memorywalker.render.types import calls_left_out
from memorywalker.rollout import ENVIRONMENTS, EpisodeJob, HarnessConfig, next_tasks, run_episodes
from memorywalker.rollout.episodes.harness import call_seed
from memorywalker.samplers.hf import HFPolicy
from memorywalker.samplers.vllm import VLLMPolicy
from memorywalker.train.adapter import (
    engine_model,
    merged_state_dict,
)
from memorywalker.train.checkpoint import restore
from memorywalker.train.distributed import DistInfo, device_for, gather_objects
from memorywalker.train.fsdp import gathered, save_step
from memorywalker.train.logging import MetricsLogger, wandb_options
from memorywalker.train.model import load_model
from memorywalker.train.recipe import begin, finish
from memorywalker.train.refcache import weights_hash
from memorywalker.train.rundir import check_resumed, input_hashes, owned_run_dir, record_config
from memorywalker.train.sharded_step import StepSchedule
from memorywalker.train.step import (
    TrainResult,
    check_divisible,
    optimizer_step,
    prepare_training,
    rank_micro_batches,
    reduce_step_metrics,
    warmup_lr,
)


def train(cfg: RLConfig, *, progress: bool = True, env=None,
          reward_fn: Callable[[Trajectory], float] | None = None) -> TrainResult:
    """Run the recipe. ``env`` replaces the configured environment (any
    :class:`~memorywalker.rollout.Environment`); ``reward_fn`` replaces the environment's reward. The
    run dir is this process's until the run ends (a second process on it is refused)."""
    with owned_run_dir(cfg, "rl"), ExitStack() as closing:  # closing: stops a vllm engine however we leave
        return _train(cfg, progress=progress, env=env, reward_fn=reward_fn, closing=closing)


def rollout_policy(cfg: RLConfig, model, tokenizer, info, stop_ids: list[int] | None = None):
    """The sampler of the recipe: ``hf`` samples from the model being trained (nothing to sync); ``vllm``
    is an engine in this process started on ``cfg.model``, whose weights :meth:`~memorywalker.samplers.
    vllm.VLLMPolicy.sync_weights` replaces after every optimizer step. ``stop_ids``: end-of-turn ids (None:
    the tokenizer's)."""
    if cfg.rollout_engine == "hf":
        return HFPolicy.from_model(engine_model(model), tokenizer, temperature=cfg.temperature,
                                   max_new_tokens=cfg.max_new_tokens, stop_ids=stop_ids)
    if info.world_size > 1:
        raise InputError("rollout_engine=vllm runs beside one training process; with several ranks use "
                         "rollout_engine=hf (one engine per rank is not supported yet)")
    return VLLMPolicy(cfg.model, tokenizer=tokenizer, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                      dtype=cfg.dtype, max_model_len=cfg.vllm_max_model_len or (
                          positions_of(model) if cfg.tasks else cfg.max_context + cfg.max_new_tokens),
                      seed=cfg.seed, kv_cache_gib=cfg.vllm_kv_cache_gib, stop_ids=stop_ids,
                      gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)


def _train(cfg: RLConfig, *, progress: bool, env, reward_fn, closing: ExitStack) -> TrainResult:

    # --- setup: ranks, model, optimizer, resume -------------------------------------------------------
    info, run_dir = begin(cfg)  # ranks; the run dir checked on every rank
    check_divisible(cfg.prompts_per_step, info, cfg.grad_accum, "prompts_per_step")
    torch.manual_seed(cfg.seed)  # before restore(): a resumed run takes the checkpoint's RNG instead
    model, tokenizer = load_model(cfg.model, cfg.tokenizer, dtype=cfg.dtype, device=device_for(cfg.device, info))
    template = use_chat_template(tokenizer, cfg.chat_template)  # before the inputs are hashed: a resume checks it
    model.eval()  # no dropout: the ratio compares the sampler's function with the trainer's
    base_hash = weights_hash(model)  # pinned by the training manifest (and the adapter's)
    model, optimizer = prepare_training(model, cfg, info)  # adapter, then fsdp sharding, then AdamW
    state = restore(run_dir, cfg.resume, model, optimizer, verbose=info.is_main, clean_up=info.is_main)
    start, cursor = (state["step"], state["task_cursor"]) if state else (0, 0)
    inputs = input_hashes(tokenizer)  # the same tokenizer and chat template on resume (or --override-config)
    check_resumed(cfg, state, inputs)
    if info.is_main:
        record_config(cfg)

    # --- rollout machinery: a world and compressor, or a task file and a real harness; a sampler over the live weights
    renderer = Renderer(tokenizer, cfg.render_options(truncated=cfg.truncated))
    stop_ids = sorted(renderer.eot_ids) if cfg.tasks else None
    servers = None
    log = print if info.is_main else (lambda *_: None)
    if cfg.rollout_engine == "vllm-server":  # every rank samples from one fleet; weights pushed before sampling
        servers = RolloutServers(cfg, tokenizer, info, run_dir, closing, positions=positions_of(model),
                                 stop_ids=stop_ids if stop_ids is not None else sorted(eot_ids(tokenizer)), log=log)
        servers.sync(model, start)  # the servers serve cfg.model (or the weights of a run before): now the trainer's
        policy = servers.fleet
    else:
        policy = rollout_policy(cfg, model, tokenizer, info, stop_ids=stop_ids)
    if cfg.rollout_engine == "vllm":
        closing.callback(policy.close)
        if state:  # resumed: the engine was started on cfg.model, the trainer holds the checkpoint's weights
            policy.sync_weights(merged_state_dict(model))
    if cfg.tasks is not None:
        from memorywalker.recipes.rl_harness import HarnessRollouts  # lazy: gateway (0.3 s), tasks= only

        sessions = HarnessRollouts(cfg, policy, renderer, run_dir, positions=positions_of(model), info=info, log=log,
                                   chat_template=template)
    else:
        sessions = None
        env = env if env is not None else ENVIRONMENTS[cfg.env](world_seed=cfg.world_seed)
        compressor = HarnessConfig(cfg.compressor, budget=cfg.budget, watermark=cfg.watermark,
                                   keep_recent=cfg.keep_recent, max_steps=cfg.max_steps, max_context=cfg.max_context,
                                   tool_parser=cfg.tool_parser)
    full_view = get_method(cfg.method).full_view  # sdcc trains on the uncompressed transcript
    engine = cfg.engine_config("grpo")  # clipping, rollout correction and temperature are engine fields too
    logger = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, enabled=info.is_main, resume_step=start,
                           wandb=wandb_options(cfg))

    # --- loop -------------------------------------------------------------------------------------------
    history: list[dict] = []
    collected: list[dict] = []  # episodes this process rolled out (ids go to the training manifest)
    bar = tqdm(total=cfg.steps, initial=start, desc=f"rl {cfg.method}", unit="step",
               disable=not (progress and info.is_main))
    ahead = None  # off_policy_steps=1: (the next step's sessions running in `background`, its cursor, weights)
    background = closing.enter_context(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rl-ahead"))
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()

        # 1. collect: this rank's tasks, group_size episodes each, with the current weights
        micro_groups: list[list[list[Trajectory]]] = []
        session_metrics: dict = {}
        if sessions is not None:  # real harness sessions through the gateway (recipes/rl_harness.py)
            if ahead is not None:  # off_policy_steps=1: collected while the last step trained, from older weights
                ran, cursor, sampled_with = ahead[0].result(), ahead[1], ahead[2]
                ahead = None
            else:
                tasks, cursor = sessions.next_tasks(cursor)
                sessions.prepare(step)
                with gathered(model) if servers is None else nullcontext():  # a fleet samples: nothing gathered here
                    ran = sessions.run(step, tasks)  # this rank's tasks' sessions
                sampled_with = step  # the weights after `step` updates
            groups, results, session_metrics = sessions.finish(step, ran)  # rank 0 writes every rank's records
            if servers is not None:
                servers.share_down()
                servers.check_alive()  # every server gone: one line, on every rank
                session_metrics["staleness"] = step - sampled_with  # updates between sampling and training
            if cfg.off_policy_steps and step + 1 < cfg.steps:  # the next step's sessions, from these weights
                upcoming, after = sessions.next_tasks(cursor)
                sessions.prepare(step + 1)  # collectives stay in this thread; the background one has none
                ahead = (background.submit(sessions.run, step + 1, upcoming), after, step)
            micro_groups = [[g for g in mb if g] for mb in rank_micro_batches(groups, DistInfo(), cfg.grad_accum)]
            rewards = [r.reward for r in results if r.failed is None]  # rank 0: every rank's sessions
        else:
            tasks, cursor = next_tasks(env, cfg.suite, cfg.prompts_per_step, split=cfg.split, start=cursor)
            with gathered(model):  # fsdp: sampling runs data-dependent forwards, so none may communicate
                for mb_tasks in rank_micro_batches(tasks, info, cfg.grad_accum):
                    # the micro-batch's episodes in lockstep: one batched forward per sampled token for all
                    jobs = [EpisodeJob(task, call_seed(cfg.seed, step, task.id, j), f"{task.id}-step{step}-r{j}",
                                       {"step": step, "sample": j}) for task in mb_tasks for j in range(cfg.group_size)]
                    trajs = run_episodes(env, jobs, policy, tokenizer, compressor)
                    if reward_fn is not None:
                        for traj in trajs:
                            traj.reward = float(reward_fn(traj))
                    micro_groups.append([trajs[i:i + cfg.group_size] for i in range(0, len(trajs), cfg.group_size)])
        t_rollout = time.perf_counter() - t0

        # 2. group: one forest per task; GRPO advantages come from the rewards inside each forest
        trees = [[[renderer.render(t, full_view=full_view) for t in g] for g in groups] for groups in micro_groups]
        micro = [Batch.from_groups(groups) for groups in trees if groups]
        left_out = calls_left_out(rt for groups in trees for g in groups for rt in g)  # this rank's, by reason
        episodes = [t for groups in micro_groups for g in groups for t in g]

        # 3. update: ppo_epochs optimizer steps. With tis_cap or a rollout correction, ratios are against the
        # collecting policy as the trainer computes it (old logprobs, recomputed once here) and the loss is
        # weighted by the correction of π_old/π_rollout; without, the ratio is against the rollout logprobs.
        if any(gather_objects(bool(micro))):  # a rank whose sessions all failed still takes part in the step
            metrics = _update(cfg, model, optimizer, micro, engine, step)
        else:  # harness rollouts whose every session failed on every rank: nothing to train, the weights stay
            metrics = {"loss": None, "lr": None}
        if cfg.rollout_engine == "vllm":  # the next step's rollouts sample from the weights just updated
            metrics["weight_sync_seconds"] = policy.sync_weights(merged_state_dict(model))
        elif servers is not None:  # pushed to every server and proven there before anything samples again
            if ahead is not None:
                concurrent.futures.wait([ahead[0]])  # the next step's sessions finish on the weights they began with
            metrics.update(servers.sync(model, step + 1))

        rows = [r for rank_rows in gather_objects([_episode_row(t) for t in episodes]) for r in rank_rows]
        collected += rows
        if sessions is None:
            rewards = [r["reward"] for r in rows]
            groups = [[r["reward"] for r in rows[i:i + cfg.group_size]] for i in range(0, len(rows), cfg.group_size)]
        else:  # rewards of the sessions that finished; groups of those trained, on every rank
            groups = [g for rank_groups in gather_objects([[t.reward for t in g] for mb in micro_groups for g in mb])
                      for g in rank_groups]
        metrics.update(
            reward_mean=statistics.fmean(rewards) if rewards else None,
            reward_std=statistics.pstdev(rewards) if rewards else None,
            success=statistics.fmean(r == 1.0 for r in rewards) if rewards else None, episodes=len(rows),
            # tasks whose episodes' rewards differ: GRPO learns from them
            groups_with_signal=statistics.fmean(len(set(g)) > 1 for g in groups) if groups else 0.0,
            evictions_mean=statistics.fmean(r["evictions"] for r in rows) if rows else None,
            calls_mean=statistics.fmean(r["calls"] for r in rows) if rows else None,
            response_tokens=sum(r["response_tokens"] for r in rows),
            # calls of the trained episodes that gave no target (truncated, unselected...), every rank's
            calls_left_out=dict(sorted(sum((Counter(d) for d in gather_objects(left_out)), Counter()).items())),
            **session_metrics, rollout_seconds=t_rollout, seconds=time.perf_counter() - t0)
        logger.log(step, metrics)
        history.append({"step": step, **metrics})
        bar.update(1)
        bar.set_postfix(reward=_fmt(metrics["reward_mean"]), loss=_fmt(metrics["loss"], ".4f"))

        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_step(run_dir, step + 1, model, optimizer, {"task_cursor": cursor, "inputs": inputs},
                      keep=cfg.keep_checkpoints, info=info)  # fsdp: sharded (DCP) on every rank
    bar.close()
    logger.close()

    # --- final model ------------------------------------------------------------------------------------
    finish(cfg, info, model, tokenizer, optimizer=optimizer, recipe="rl", steps=cfg.steps, base_hash=base_hash,
           records=[{"id": r["id"], "split": cfg.split, "parent": None} for r in collected],
           target_rule={"truncated": cfg.truncated, "selected": "act calls' responses"},
           extra={"tasks": cfg.tasks, "harness": cfg.harness} if cfg.tasks else
           {"env": cfg.env, "suite": cfg.suite, "compressor": cfg.compressor})
    return TrainResult(run_dir=run_dir, final_dir=run_dir / "final", steps=cfg.steps, metrics=history)


def _update(cfg: RLConfig, model, optimizer, micro: list[Batch], engine, step: int) -> dict:
    """``ppo_epochs`` optimizer steps over the step's micro-batches; the first epoch's metrics (its gap to
    the rollout logprobs is the train/rollout mismatch) with the last epoch's loss."""
    if cfg.corrects_rollouts:
        dens = step_denominators(micro, engine)
        with gathered(model):  # fsdp: no backward; every layer gathered once, nothing communicates inside
            for mb in micro:  # [N] per mb.targets row; NaN where the method lost a target (rollout used)
                mb.old_logprob = run(engine_model(model), mb, engine, backward=False,
                                     denominators=dens).logprobs.cpu().numpy()
    first = None
    for epoch in range(cfg.ppo_epochs):
        dens = step_denominators(micro, engine)  # Σ over micro-batches and ranks, before dividing
        with StepSchedule(model) as schedule:  # fsdp: the ranks agree on every pass (a layer gathered at a time)
            results = [run(engine_model(model), mb, engine, denominators=dens, schedule=schedule) for mb in micro]
        lr = warmup_lr(cfg.lr, step * cfg.ppo_epochs + epoch, cfg.warmup_steps)
        grad_norm = optimizer_step(model, optimizer, lr=lr, grad_clip=cfg.grad_clip)
        epoch_metrics = reduce_step_metrics([r.metrics for r in results] + [schedule.metrics()])
        first = first or {**epoch_metrics, "grad_norm": float(grad_norm)}
    return {**first, "loss_last_epoch": epoch_metrics["loss"], "lr": lr}


def positions_of(model) -> int:
    """The positions the model was built for (what a harness prompt must fit)."""
    return getattr(engine_model(model).config, "max_position_embeddings", None) or 8192


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _episode_row(traj: Trajectory) -> dict:
    return {"id": traj.id, "reward": float(traj.reward or 0.0), "evictions": len(traj.evictions), "calls": len(traj.calls),
            "response_tokens": sum(len(c.response_tokens or []) for c in traj.calls)}


if __name__ == "__main__":  # torchrun / accelerate launch -m memorywalker.recipes.rl ...
    from memorywalker.cli.train_cmd import recipe_main

    recipe_main("rl")
