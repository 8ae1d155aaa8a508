"""``memorywalker augment``: schema augmentation of recorded episodes (docs/data-sources.md).

    memorywalker augment expert.jsonl -o augmented.jsonl --copies 2 --seed 0 --distractors 2

Every record becomes ``--copies`` derived records, each under its own renamed and restructured tool
interface; a derived record in which an old identifier survives is rejected (counted, not written).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.errors import InputError


def register(app: typer.Typer) -> None:
    app.command("augment")(augment_cmd)


def augment_cmd(
    src: Path = typer.Argument(..., exists=True, dir_okay=False, help="trajectory JSONL (schema v1)"),
    output: Path = typer.Option(..., "-o", "--output", help="derived records (JSONL)"),
    copies: int = typer.Option(1, "--copies", min=1, help="augmented records per record (each its own schema)"),
    seed: int = typer.Option(0, "--seed", help="seed of the schema maps"),
    distractors: int = typer.Option(2, "--distractors", min=0, help="unused distractor tools added"),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="tokenizer dir for the token expansion ratio "
                                   "(default: the kit's)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Rename tools and arguments, reorder declarations and fields, add distractor tools, drop an optional
    argument — coherently across schemas, calls, observations and errors; report the token expansion."""
    from memorywalker.transforms.augment import augment_file  # lazy: the command's machinery

    summary = augment_file(src, output, copies=copies, seed=seed, distractors=distractors,
                           tokenizer=load_tokenizer(tokenizer), progress=progress)
    typer.echo(json.dumps(summary))
    if not summary["written"]:
        raise InputError(f"{src}: no record could be augmented ({summary['reasons'][:1]})")
