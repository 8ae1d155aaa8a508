"""``memorywalker view FILE [--id ID] [--gap GAP.json] [--tokenizer DIR] -o DIR``: one offline HTML page
per trajectory (calls, segments, evictions, delivered contexts, target tokens, gap heat map)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.errors import InputError
from memorywalker.records import TrajectoryReader
from memorywalker.render import Renderer


def register(app: typer.Typer) -> None:
    app.command()(view)


def view(
    data: Path = typer.Argument(..., exists=True, dir_okay=False, help="trajectory JSONL"),
    output: Path = typer.Option(..., "-o", "--output", file_okay=False, help="directory for the HTML pages"),
    ids: list[str] = typer.Option(None, "--id", help="only these trajectory ids (repeat the option)"),
    gap: Path | None = typer.Option(None, "--gap", exists=True, dir_okay=False,
                                    help="per-token gap report (`memorywalker gap --json --per-token`); needs --tokenizer"),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", exists=True, file_okay=False,
                                          help="HF tokenizer dir: token counts, target tokens, token-level segments"),
) -> None:
    """Write a static HTML page per trajectory: no server needed, works offline."""
    from memorywalker.viewer import view_data, write_page  # lazy: the command's machinery, only when it runs

    if gap is not None and tokenizer is None:
        raise typer.BadParameter("--gap needs --tokenizer (the heat map is drawn on the response tokens)")
    renderer = None
    if tokenizer is not None:
        renderer = Renderer(load_tokenizer(tokenizer))
    report = json.loads(gap.read_text(encoding="utf-8")) if gap is not None else None
    # With a tokenizer, recorded ids it does not have are rejected before anything is rendered.
    reader = TrajectoryReader(data, vocab_size=len(renderer.tok) if renderer is not None else None)
    wanted = set(ids or [])
    written, found = [], set()
    for traj in reader:
        if wanted and traj.id not in wanted:
            continue
        found.add(traj.id)
        written.append(write_page(view_data(traj, renderer=renderer, gap=report), output))
        typer.echo(f"{traj.id}: {written[-1]}")
    missing = wanted - found
    if missing:
        raise InputError(f"{data}: trajectory id(s) not found: {', '.join(sorted(missing))}")
    if not written:
        raise InputError(f"{data}: no trajectory to view ({reader.summary})")
    typer.echo(f"wrote {len(written)} page(s) to {output}")
