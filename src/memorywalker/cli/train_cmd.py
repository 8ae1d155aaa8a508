"""``memorywalker sft``, ``rl`` and ``dpo``: run a training recipe from a config file.

    memorywalker sft --config configs/sft_tiny.toml --method tree-mask steps=20 lr=3e-3
    memorywalker rl --config configs/rl_tiny.toml --method sdcc --resume

Trailing ``key=value`` arguments override the file (dotted keys for sections); an unknown key fails
with the valid ones. The same commands run data-parallel under torchrun or accelerate::

    torchrun --nproc-per-node 4 -m memorywalker.recipes.sft --config configs/sft_tiny.toml
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import typer

from memorywalker.cli.errors import run_single
from memorywalker.gateway.harnesses import PINNED  # stdlib only: cheap at CLI start

RECIPES = {"sft": ("memorywalker.recipes.sft", "SFTConfig"), "rl": ("memorywalker.recipes.rl", "RLConfig"),
           "dpo": ("memorywalker.recipes.dpo", "DPOConfig")}
HELP = {
    "sft": "Supervised fine-tuning on recorded episodes (masked NLL), with any registered method.",
    "rl": "GRPO with PPO-clip ratios against the rollout logprobs, on episodes collected under compression: in a "
          "simulated environment, or as sessions of a real harness (tasks=FILE harness=" + "|".join(PINNED)
          + "|cmd:CMD; docs/harness-rl.md).",
    "dpo": "Trajectory DPO on preference pairs that branch from an identical context, exact on each pair's tree.",
}


def _command(recipe: str):
    def command(
        overrides: list[str] = typer.Argument(None, help="key=value config overrides", show_default=False),
        config: Path = typer.Option(None, "--config", "-c", help="TOML config file", exists=True, dir_okay=False),
        method: str = typer.Option(None, "--method", "-m",
                                   help="a training method (`memorywalker methods` lists them)"),
        resume: bool = typer.Option(False, "--resume", help="continue from run_dir's newest checkpoint that verifies"),
        override_config: bool = typer.Option(False, "--override-config",
                                             help="with --resume: accept result-changing config changes"),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
    ) -> None:
        from memorywalker.train.config import load_config  # lazy: the command's machinery (torch)

        module_name, cls_name = RECIPES[recipe]
        module = importlib.import_module(module_name)
        extra = list(overrides or [])
        if method is not None:
            extra.append(f"method={method}")
        if resume:
            extra.append("resume=true")
        if override_config:
            extra.append("override_config=true")
        cfg = load_config(getattr(module, cls_name), config, extra)  # a ConfigError is one line, exit 2
        from memorywalker.train.fsdp import collective_guard  # lazy: as above

        with collective_guard(f"memorywalker {recipe}", cfg.collective_timeout):  # a stalled peer: one line
            result = module.train(cfg, progress=progress)
        if int(os.environ.get("RANK", "0")) != 0:
            return  # the summary once per run, from rank 0 (every rank holds the same metrics)
        last = result.metrics[-1] if result.metrics else {}
        summary = ", ".join(f"{k}={last[k]:.4g}" for k in ("loss", "reward_mean", "margin") if k in last)
        typer.echo(f"{recipe}: {result.steps} steps{'; last ' + summary if summary else ''}; "
                   f"model: {result.final_dir}")

    command.__doc__ = HELP[recipe]
    return command


def register(app: typer.Typer) -> None:
    for recipe in RECIPES:
        app.command(recipe)(_command(recipe))


def recipe_main(recipe: str) -> None:
    """Entry point of ``python -m memorywalker.recipes.<recipe>`` (what torchrun/accelerate launch)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(recipe)(_command(recipe))
    run_single(app, f"memorywalker {recipe}")
