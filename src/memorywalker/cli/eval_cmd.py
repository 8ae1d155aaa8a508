"""``memorywalker eval``: closed-loop evaluation of a checkpoint, optionally paired against a baseline.

    memorywalker eval --model runs/demo/rl-sdcc/final --baseline runs/demo/sft-sdcc/final --env vault \\
        --suites recall-2,recall-3 --compressor claude-code --budget 260 --max-steps 6 --max-new-tokens 64 --n 16 -o eval/

Writes ``DIR/report.json`` and the episodes (``DIR/model-<suite>.jsonl``, ``DIR/baseline-<suite>.jsonl``)
and prints the tables. docs/eval.md defines every number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from memorywalker.cli import renamed
from memorywalker.cli.harness_options import harness_option
from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.rollout import ENVIRONMENTS
from memorywalker.rollout.compressors import COMPRESSORS  # the compressor registry (light: no model code)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)


def parse_world_size(text: str | None) -> dict[str, int]:
    """``"n_cities=2,n_people=3"`` -> ``{"n_cities": 2, "n_people": 3}``.

    >>> parse_world_size("n_cities=2,n_people=3")
    {'n_cities': 2, 'n_people': 3}
    """
    valid = ("n_cities", "n_companies", "n_people", "n_distractors")
    out: dict[str, int] = {}
    for part in filter(None, (text or "").split(",")):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in valid or not value.strip().isdigit():
            raise typer.BadParameter(f"--world-size: bad entry {part!r}; use KEY=INT with KEY in {', '.join(valid)}")
        out[key.strip()] = int(value)
    return out


def eval_cmd(
    model: str = typer.Option(..., "--model", help="model dir, adapter dir (with adapter_manifest.json) or expert"),
    baseline: str = typer.Option(None, "--baseline", help="model dir, adapter dir or expert: paired comparison"),
    suite: str = typer.Option(..., "--suite", "--suites", help="suite or comma-separated suites (each reported)"),
    compressor: str = renamed.option("--compressor", "none", "compression policy: " + " | ".join(COMPRESSORS)),
    harness: str = renamed.old_option("--compressor"),
    output: Path = typer.Option(..., "-o", "--output", help="directory for report.json and the episodes"),
    n: int = typer.Option(16, "--n", min=1, help="tasks per suite"),
    samples: int = typer.Option(1, "--samples", min=1, help="episodes per task"),
    seed: int = typer.Option(0, "--seed", help="run seed (episode seeds and the bootstrap derive from it)"),
    split: str = typer.Option("test", "--split", help="train | valid | test | all"),
    budget: int = harness_option("budget"),
    max_steps: int = harness_option("max_steps", more=" (running out = failure)", min=1),
    max_context: int = harness_option("max_context", more=" (overflowing it = failure)", min=1),
    env: str = typer.Option("websearch", "--env", help="environment: websearch | vault"),
    world_seed: int = typer.Option(0, "--world-seed", help="seed of the generated world"),
    world_size: str = typer.Option(None, "--world-size", help="e.g. n_cities=2,n_companies=3,n_people=3,n_distractors=2"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="sampling temperature (0 = greedy)"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1, help="response length limit"),
    alpha: float = typer.Option(0.05, "--alpha", min=1e-6, max=0.5, help="family-wise error level"),
    resamples: int = typer.Option(10_000, "--resamples", min=100, help="paired bootstrap resamples"),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="tokenizer dir (default: the model's; needed for expert vs expert)"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    as_json: bool = typer.Option(False, "--json", help="print report.json instead of the tables"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Run a checkpoint (and a baseline) on suites under a compressor; report acceptance, call validity, cost."""
    from memorywalker.eval.evaluate import (  # lazy: the command's machinery, only when it runs
        EvalConfig,
        evaluate,
        load_candidate,
        report_tables,
    )

    if env not in ENVIRONMENTS:
        raise typer.BadParameter(f"unknown env {env!r}; valid: {', '.join(ENVIRONMENTS)}")
    valid = ENVIRONMENTS[env].suites
    suites = tuple(s.strip() for s in suite.split(",") if s.strip())
    unknown = [s for s in suites if s not in valid]
    if not suites or unknown:
        raise typer.BadParameter(f"unknown suite {unknown[0] if unknown else suite!r} of env {env}; "
                                 f"valid: {', '.join(valid)}")
    if world_size and env != "websearch":
        raise typer.BadParameter(f"--world-size applies to --env websearch only, not {env}")
    if len(set(suites)) != len(suites):
        raise typer.BadParameter(f"--suites lists a suite twice: {suite}")
    compressor = renamed.value("--compressor", compressor, harness, "none", "memorywalker eval")
    if compressor not in COMPRESSORS:
        raise typer.BadParameter(f"unknown compressor {compressor!r}; valid: {', '.join(COMPRESSORS)}")
    if split not in ("train", "valid", "test", "all"):
        raise typer.BadParameter(f"unknown split {split!r}; valid: train, valid, test, all")
    cfg = EvalConfig(suites=suites, compressor=compressor, budget=budget, max_steps=max_steps, max_context=max_context,
                     n=n, samples=samples, seed=seed, split=None if split == "all" else split, env=env, world_seed=world_seed,
                     world_size=parse_world_size(world_size), temperature=temperature,
                     max_new_tokens=max_new_tokens, alpha=alpha, resamples=resamples, device=device)
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    # The episodes of both sides must be rendered by one tokenizer: the model's is shared with an expert side.
    a = load_candidate(model, "model", cfg, tokenizer=tok) if model != "expert" or tok is not None else None
    b = load_candidate(baseline, "baseline", cfg, tokenizer=tok or (a.tokenizer if a else None)) if baseline else None
    if a is None:
        a = load_candidate(model, "model", cfg, tokenizer=b.tokenizer if b else None)
    report = evaluate(cfg, a, output, b, progress=progress)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    console = Console(width=None if sys.stdout.isatty() else 200)
    for table in report_tables(report):
        console.print(table)
    typer.echo(f"{output / 'report.json'}")
