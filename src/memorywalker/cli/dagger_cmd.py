"""``memorywalker dagger``: DAgger rounds in an environment (memorywalker.recipes.dagger).

    memorywalker dagger --model kit --suite lookup --rounds 2 --n 8 --compressor claude-code -o runs/dagger

Writes ``OUT/rollouts-k.jsonl`` (the mixed-policy episodes), ``OUT/labels-k.jsonl`` (verified labels as
derived records), ``OUT/sft-k/`` (the retrained learner), ``OUT/eval-round-k.jsonl`` and ``OUT/report.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from memorywalker.cli import renamed
from memorywalker.rollout import ENVIRONMENTS
from memorywalker.rollout.compressors import COMPRESSORS  # the compressor registry (light: no model code)


def register(app: typer.Typer) -> None:
    app.command("dagger")(dagger_cmd)


def dagger_cmd(
    model: str = typer.Option("kit", "--model", help="learner model dir, or kit (the offline tiny model)"),
    output: Path = typer.Option(..., "-o", "--output", help="run directory (must be new or empty)"),
    env: str = typer.Option("websearch", "--env", help="environment: " + " | ".join(ENVIRONMENTS)),
    suite: str = typer.Option("lookup", "--suite", help="the environment's suite"),
    rounds: int = typer.Option(2, "--rounds", min=1, help="DAgger rounds"),
    n: int = typer.Option(8, "--n", min=1, help="training tasks rolled out per round"),
    betas: str = typer.Option("1,0", "--betas", help="beta_k per round, comma-separated (last repeats): "
                              "P(execute the labeler's action)"),
    labeler: str = typer.Option("expert", "--labeler", help="expert | hf:DIR | openai:URL"),
    expert_forget: float = typer.Option(0.0, "--expert-forget", min=0.0, max=1.0,
                                        help="vault: share of the expert's episodes with careless summaries"),
    compressor: str = renamed.option("--compressor", "claude-code", "compression policy: " + " | ".join(COMPRESSORS)),
    harness: str = renamed.old_option("--compressor"),
    budget: int = typer.Option(1024, "--budget", help="context budget in prompt tokens the compressor keeps to"),
    max_steps: int = typer.Option(8, "--max-steps", help="act calls per episode"),
    eval_n: int = typer.Option(8, "--eval-n", min=1, help="held-out tasks evaluated each round"),
    sft_steps: int = typer.Option(20, "--sft-steps", min=1, help="SFT steps per retraining"),
    sft_lr: float = typer.Option(3e-3, "--sft-lr", help="SFT learning rate"),
    world_size: str = typer.Option("", "--world-size", help="e.g. n_cities=2,n_companies=3 (default: full world)"),
    seed: int = typer.Option(0, "--seed", help="run seed"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Roll out the learner, label its states with a verified labeler, aggregate, retrain; per round."""
    from memorywalker.recipes.dagger import DaggerConfig, run_dagger  # lazy: the command's machinery

    if env not in ENVIRONMENTS:
        raise typer.BadParameter(f"unknown env {env!r}; valid: {', '.join(ENVIRONMENTS)}")
    if suite not in ENVIRONMENTS[env].suites:
        raise typer.BadParameter(f"unknown suite {suite!r} of env {env}; valid: {', '.join(ENVIRONMENTS[env].suites)}")
    compressor = renamed.value("--compressor", compressor, harness, "claude-code", "memorywalker dagger")
    if compressor not in COMPRESSORS:
        raise typer.BadParameter(f"unknown compressor {compressor!r}; valid: {', '.join(COMPRESSORS)}")
    try:
        beta_list = tuple(float(b) for b in betas.split(","))
        size = {k: int(v) for k, v in (kv.split("=") for kv in world_size.split(",") if kv)}
    except ValueError:
        raise typer.BadParameter(f"--betas {betas!r} / --world-size {world_size!r}: expected numbers") from None
    if not all(0 <= b <= 1 for b in beta_list):
        raise typer.BadParameter(f"--betas must lie in [0, 1], got {betas!r}")
    if output.exists() and any(output.iterdir()):
        raise typer.BadParameter(f"{output} is not empty; use a new run directory")
    cfg = DaggerConfig(env=env, suite=suite, expert_forget=expert_forget, rounds=rounds, n=n, betas=beta_list,
                       labeler=labeler, compressor=compressor, budget=budget, max_steps=max_steps, eval_n=eval_n,
                       sft_steps=sft_steps, sft_lr=sft_lr, world_size=size, seed=seed)  # judged before any model loads
    tokenizer_dir = None
    if model == "kit":
        from memorywalker.modelkit import default_kit  # lazy: as above

        tok_dir, model_dir = default_kit()
        model, tokenizer_dir = str(model_dir), str(tok_dir)
    report = run_dagger(cfg, model, output, tokenizer_dir=tokenizer_dir, progress=progress)
    print(f"held-out reward before: {report['held_out_reward_before']:.3f}")
    for r in report["rounds"]:
        print(json.dumps({k: r[k] for k in ("round", "beta", "admitted", "learner_states",
                                            "learner_state_disagreement", "dataset", "held_out_reward",
                                            "paired_vs_previous")})
              + f" expansion={r['tokens']['expansion']:.3f}")
    print(f"report: {output / 'report.json'}")
