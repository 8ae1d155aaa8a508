"""``memorywalker export FILE --format trl|openai|parquet -o OUT``: ``OUT/calls.{jsonl,parquet}`` (one
example per call: its delivered context and its response) and ``OUT/trajectories.{jsonl,parquet}``
(one tree record per trajectory: calls in order, segments, junctions, evictions)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from memorywalker.errors import InputError
from memorywalker.records import TrajectoryReader


def register(app: typer.Typer) -> None:
    app.command()(export)


def export(
    data: Path = typer.Argument(..., exists=True, dir_okay=False, help="trajectory JSONL"),
    format: str = typer.Option(..., "--format", help="trl | openai | parquet"),
    output: Path = typer.Option(..., "-o", "--output", file_okay=False, help="output directory"),
    rejects: Path | None = typer.Option(None, help="write rejected input lines with their reasons here (JSONL)"),
) -> None:
    """Export trajectories as datasets trainers read (see `memorywalker.export`)."""
    from memorywalker.export import (  # lazy: the command's machinery, only when it runs
        FORMATS,
        examples,
        trajectory_record,
        write_parquet,
    )

    if format not in FORMATS:
        raise typer.BadParameter(f"unknown format {format!r}; valid: {', '.join(FORMATS)}")
    reader = TrajectoryReader(data, rejects_path=rejects)
    calls, trajs = [], []
    for traj in reader:
        calls.extend(examples(traj, format))
        trajs.append(trajectory_record(traj))
    if not trajs:
        raise InputError(f"{data}: no trajectory to export ({reader.summary})")
    output.mkdir(parents=True, exist_ok=True)
    if format == "parquet":
        write_parquet(output / "calls.parquet", calls)
        write_parquet(output / "trajectories.parquet",
                      [{**t, "evictions": json.dumps(t["evictions"], ensure_ascii=False)} for t in trajs])
        names = ("calls.parquet", "trajectories.parquet")
    else:
        for name, rows in (("calls.jsonl", calls), ("trajectories.jsonl", trajs)):
            with open(output / name, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        names = ("calls.jsonl", "trajectories.jsonl")
    typer.echo(f"{reader.summary}; wrote {len(calls)} call examples and {len(trajs)} trajectory records "
               f"({format}) to {output}/{{{','.join(names)}}}")
