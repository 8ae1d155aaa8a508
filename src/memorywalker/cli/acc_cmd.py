"""``memorywalker compile-acc``: trajectories compiled into long-context QA records (docs/data-sources.md).

    memorywalker compile-acc episodes.jsonl -o acc.jsonl --budget 1024 --seed 0

Train the output with the SFT recipe (``memorywalker sft ... data=acc.jsonl``).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.errors import InputError


def register(app: typer.Typer) -> None:
    app.command("compile-acc")(compile_acc_cmd)


def compile_acc_cmd(
    src: Path = typer.Argument(..., exists=True, dir_okay=False, help="websearch, corpus or vault episodes (JSONL, schema v1)"),
    output: Path = typer.Option(..., "-o", "--output", help="compiled QA records (JSONL)"),
    budget: int = typer.Option(1024, "--budget", min=64, help="token budget B of the context (documents + question)"),
    seed: int = typer.Option(0, "--seed", help="seed of the distractor choice and the document order"),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="tokenizer dir (default: the kit's)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Opened documents (gold) + unvisited ones (distractors), shuffled and packed to B; question; answer."""
    from memorywalker.transforms.acc import compile_file  # lazy: the command's machinery, only when it runs

    summary = compile_file(src, output, load_tokenizer(tokenizer), budget=budget, seed=seed, progress=progress)
    typer.echo(json.dumps(summary))
    if not summary["written"]:
        raise InputError(f"{src}: no record compiled ({summary['rejected']})")
