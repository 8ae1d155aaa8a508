"""SFT recipe: masked NLL on the responses of recorded episodes, conditioned the way ``--method`` says.

    memorywalker sft --config configs/sft_tiny.toml --method tree-mask [--resume] [key=value ...]
    torchrun --nproc-per-node 2 -m memorywalker.recipes.sft --config configs/sft_tiny.toml

Every trajectory of ``data`` is rendered with the tokenizer's chat template and becomes one
ConditioningTree. An optimizer step takes ``batch_size`` whole trajectories (a seeded permutation per
epoch), splits them into ``world_size × grad_accum`` equal micro-batches, runs the engine on each
(gradients accumulate, losses divided by the step's global denominator), sums gradients over ranks,
clips and steps AdamW. Checkpoints restore weights, optimizer, RNG and the data position exactly.

Programmatic use (what ``memorywalker demo`` does)::

    from memorywalker.recipes.sft import SFTConfig, train
    result = train(SFTConfig(model="kit", data="expert.jsonl", run_dir="runs/sft", steps=50, lr=3e-3))
    result.final_dir   # a Hugging Face model dir
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import torch
from tqdm import tqdm

from memorywalker.engine import Batch, get_method, run, step_denominators
from memorywalker.errors import InputError
from memorywalker.records.schema import Trajectory
from memorywalker.render import Renderer
from memorywalker.render.chat_templates import use_chat_template
from memorywalker.render.types import calls_left_out, left_out_line
from memorywalker.train.adapter import (
    engine_model,
)
from memorywalker.train.checkpoint import restore
from memorywalker.train.config import ConfigError, TrainConfig
from memorywalker.train.distributed import device_for
from memorywalker.train.fsdp import save_step
from memorywalker.train.inputs import FitsModel, model_positions, read_records
from memorywalker.train.logging import MetricsLogger, wandb_options
from memorywalker.train.manifest import record_rows
from memorywalker.train.model import load_model, load_tokenizer
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
    step_trajectories,
    warmup_lr,
)


class SFTConfig(TrainConfig):
    """``memorywalker sft`` (fields of :class:`~memorywalker.train.config.TrainConfig` plus these)."""

    data: str | None = None  # trajectory JSONL (ignored when train() is given trajectories)
    batch_size: int = 8  # trajectories per optimizer step, over all ranks and micro-batches
    truncated: Literal["exclude", "prefix"] = "exclude"  # responses cut off by the length limit
    run_dir: str = "runs/sft"


def train(cfg: SFTConfig, *, trajectories: list[Trajectory] | None = None, progress: bool = True,
          until: Callable[[torch.nn.Module, int], bool] | None = None) -> TrainResult:
    """Run the recipe on ``cfg.data``, or on ``trajectories`` when given. The run dir is this process's
    until the run ends (a second process on it is refused).

    ``until(model, step)``, when given, is called after each checkpoint (every ``save_every`` steps and
    the last); when it returns True the run ends there, ``steps`` being the cap (the demo's warm start
    measures its copy checks with it). One process only (ranks would each decide alone)."""
    with owned_run_dir(cfg, "sft"):
        return _train(cfg, trajectories=trajectories, progress=progress, until=until)


def _train(cfg: SFTConfig, *, trajectories: list[Trajectory] | None, progress: bool,
           until: Callable[[torch.nn.Module, int], bool] | None = None) -> TrainResult:

    # --- setup: ranks, inputs (checked before the model loads), model, optimizer, resume --------------
    info, run_dir = begin(cfg)  # ranks; the run dir checked on every rank
    check_divisible(cfg.batch_size, info, cfg.grad_accum, "batch_size")
    if trajectories is None and cfg.data is None:
        raise ConfigError("sft needs data=FILE (a trajectory JSONL) or trajectories passed to train()")
    # The tokenizer first: recorded ids it does not have, and calls longer than the model's positions,
    # are set aside with their reason (rejects file) before anything else is written or run.
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer)
    use_chat_template(tokenizer, cfg.chat_template)
    renderer = Renderer(tokenizer, cfg.render_options(truncated=cfg.truncated))
    fits = FitsModel(renderer, cfg.max_seq_len or model_positions(cfg.model),
                     full_view=get_method(cfg.method).full_view)  # sdcc trains on the uncompressed transcript
    trajectories = read_records("sft", cfg.data, trajectories, tokenizer=tokenizer, check=fits,
                                rejects_path=run_dir / f"rejects.rank{info.rank}.jsonl", verbose=info.is_main)
    torch.manual_seed(cfg.seed)  # before restore(): a resumed run takes the checkpoint's RNG instead
    model, _ = load_model(cfg.model, cfg.tokenizer, dtype=cfg.dtype, device=device_for(cfg.device, info))
    model.train()
    base_hash = weights_hash(model)  # pinned by the training manifest (and the adapter's)
    model, optimizer = prepare_training(model, cfg, info)  # adapter, then fsdp sharding, then AdamW
    state = restore(run_dir, cfg.resume, model, optimizer, verbose=info.is_main, clean_up=info.is_main)
    start = state["step"] if state else 0
    inputs = input_hashes(tokenizer, trajectories, data=cfg.data)  # in every checkpoint; a resume compares
    check_resumed(cfg, state, inputs)  # never rewound; the same data and tokenizer (or --override-config)

    # --- data: keep the trajectories that have targets (rendered while they were read) ---------------------
    rendered = [fits.rendered[t.id] for t in trajectories]
    data = [r for r in rendered if any(c.selected and c.targets for c in r.calls)]
    if info.is_main and len(data) < len(rendered):
        print(f"sft: {len(rendered) - len(data)} of {len(rendered)} trajectories have no selected target")
    if not data:
        raise InputError("sft: no trajectory has a selected target")
    if state and state.get("num_trajectories") != len(data):
        raise InputError(f"resume: the checkpoint was trained on {state.get('num_trajectories')} trajectories, "
                         f"the data now has {len(data)}")
    if info.is_main:
        record_config(cfg)
        # flushed: an error later in the run stays the last line
        print(f"sft: {left_out_line(calls_left_out(rendered), sum(len(r.calls) for r in rendered), cfg.truncated)}",
              flush=True)
    engine = cfg.engine_config("nll")
    logger = MetricsLogger(run_dir, tensorboard=cfg.tensorboard, enabled=info.is_main, resume_step=start,
                           wandb=wandb_options(cfg))

    # --- loop -------------------------------------------------------------------------------------------
    if until is not None and info.world_size > 1:
        raise ConfigError("sft: until= runs in one process (each rank would decide alone)")
    history: list[dict] = []
    done = cfg.steps
    bar = tqdm(total=cfg.steps, initial=start, desc=f"sft {cfg.method}", unit="step",
               disable=not (progress and info.is_main))
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        ids = step_trajectories(len(data), cfg.batch_size, step, cfg.seed)
        micro = [Batch.from_groups([[data[i]] for i in mb])  # one tree per trajectory
                 for mb in rank_micro_batches(ids, info, cfg.grad_accum)]
        dens = step_denominators(micro, engine)  # Σ over micro-batches and ranks, before dividing
        with StepSchedule(model) as schedule:  # fsdp: the ranks agree on every pass (a layer gathered at a time)
            results = [run(engine_model(model), mb, engine, denominators=dens, schedule=schedule) for mb in micro]
        lr = warmup_lr(cfg.lr, step, cfg.warmup_steps)
        grad_norm = optimizer_step(model, optimizer, lr=lr, grad_clip=cfg.grad_clip)

        metrics = reduce_step_metrics([r.metrics for r in results] + [schedule.metrics()])
        metrics.update(lr=lr, grad_norm=float(grad_norm), seconds=time.perf_counter() - t0,
                       epoch=(step + 1) * cfg.batch_size / len(data))
        logger.log(step, metrics)
        history.append({"step": step, **metrics})
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}")

        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_step(run_dir, step + 1, model, optimizer, {  # fsdp: sharded (DCP) on every rank
                "data_position": (step + 1) * cfg.batch_size, "num_trajectories": len(data), "inputs": inputs},
                keep=cfg.keep_checkpoints, info=info)
            if until is not None and until(model, step + 1):
                done = step + 1
                break
    bar.close()
    logger.close()

    # --- final model ------------------------------------------------------------------------------------
    finish(cfg, info, model, tokenizer, optimizer=optimizer, recipe="sft", steps=done, base_hash=base_hash,
           inputs=[cfg.data] if cfg.data else [], records=record_rows(trajectories),
           target_rule={"truncated": cfg.truncated, "selected": "selected calls' responses"})
    return TrainResult(run_dir=run_dir, final_dir=run_dir / "final", steps=done, metrics=history)


if __name__ == "__main__":  # torchrun / accelerate launch -m memorywalker.recipes.sft ...
    from memorywalker.cli.train_cmd import recipe_main

    recipe_main("sft")
