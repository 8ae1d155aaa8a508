"""``memorywalker distill``: context distillation and filtered teacher imitation (memorywalker.transforms.distill).

    memorywalker distill --strip-guidance --guidance-file guidance.txt guided.jsonl -o stripped.jsonl
    memorywalker distill --filter-teacher --teacher expert runs.jsonl -o verified.jsonl

``--strip-guidance`` without ``--guidance-file`` strips the web-search world's procedural guidance block
(``memorywalker.transforms.distill.WEBSEARCH_GUIDANCE``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.records import read_trajectories, write_trajectories
from memorywalker.render import Renderer


def register(app: typer.Typer) -> None:
    app.command("distill")(distill_cmd)


def distill_cmd(
    input: Path = typer.Argument(..., help="trajectory JSONL"),
    output: Path = typer.Option(..., "-o", "--output", help="derived records JSONL (overwritten)"),
    strip: bool = typer.Option(False, "--strip-guidance", help="remove the guidance from system prompts"),
    filter_: bool = typer.Option(False, "--filter-teacher", help="keep the teacher's verified successes"),
    guidance_file: Path = typer.Option(None, "--guidance-file", help="text file holding the guidance to strip"),
    teacher: str = typer.Option(None, "--teacher", help="filter-teacher: only this policy's episodes (meta.policy.name)"),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="HF tokenizer dir (default: the kit's)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Write derived records of INPUT (schema v1, lineage to each parent) and report the token expansion."""
    from tqdm import tqdm  # lazy: tqdm (~30 ms) loads only when the command runs

    from memorywalker.transforms.distill import (  # lazy: the command's machinery, only when it runs
        FILTER_TEACHER,
        STRIP_GUIDANCE,
        WEBSEARCH_GUIDANCE,
        distill,
    )

    if strip == filter_:
        raise typer.BadParameter("pass exactly one of --strip-guidance, --filter-teacher")
    trajs = read_trajectories(input)
    renderer, guidance = None, None
    if strip:
        renderer = Renderer(load_tokenizer(tokenizer))
        guidance = guidance_file.read_text() if guidance_file is not None else WEBSEARCH_GUIDANCE
    records = tqdm(trajs, desc="distill", unit="rec", disable=not progress)
    out, stats = distill(records, STRIP_GUIDANCE if strip else FILTER_TEACHER, guidance=guidance,
                         renderer=renderer, teacher=teacher)
    write_trajectories(output, out)
    print(f"{stats.records_out} of {stats.records_in} records -> {output}; tokens {stats.tokens_in} -> "
          f"{stats.tokens_out} (expansion {stats.expansion:.3f})")
