"""``memorywalker import FORMAT PATH... -o FILE``: harness logs → trajectory JSONL + rejects.

Exits 2 (one line, after writing the rejects file) when no trajectory was imported - an empty
directory, a binary file - and, with ``--strict``, when any record, file or trajectory was rejected.

The output and the rejects file are each written to a temporary file beside them and renamed into
place when complete: two imports to one ``-o`` leave one of the two complete outputs, never a mix; a
full disk leaves the previous file and says ``FILE: No space left on device`` (exit 2).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.errors import InputError
from memorywalker.fileio import atomic_write
from memorywalker.importers import IMPORTERS, ImportOptions, run_import
from memorywalker.importers.billed import check_counts
from memorywalker.importers.tools import READS_TOOLS, SHIPPED, load_tool_set
from memorywalker.records import write_trajectories


def register(app: typer.Typer) -> None:
    app.command("import")(import_logs)


def import_logs(
    ctx: typer.Context,
    format: str = typer.Argument(..., help=" | ".join(IMPORTERS)),
    paths: list[Path] = typer.Argument(..., exists=True, help="log files or directories"),
    output: Path = typer.Option(..., "-o", "--output", help="trajectory JSONL to write"),
    redact: bool = typer.Option(False, "--redact", help="replace secrets, credentials, e-mails, phone numbers, private IPs, home paths and "
                                "the user name by placeholders, everywhere (docs/importers.md)"),
    max_input_tokens: int = typer.Option(None, "--max-input-tokens", help="qwen-agent: replay its truncation at this budget"),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="qwen-agent: HF tokenizer dir used to count tokens"),
    tools: str = typer.Option(None, "--tools", help="codex, opencode: the tool schemas the harness offered, which their logs do not record: "
                              "a JSON file (a list of tools, or an object with 'tools') or a shipped set "
                              f"({', '.join(SHIPPED)}); decides the system-prompt rule too (docs/importers.md)"),
    strict: bool = typer.Option(False, "--strict", help="exit 2 when anything was rejected, not only when nothing was imported"),
) -> None:
    """Import harness logs as trajectories with the contexts each model call received."""
    if format not in IMPORTERS:
        raise typer.BadParameter(f"unknown format {format!r}; valid: {', '.join(sorted(IMPORTERS))}")
    count = None
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    if tools is not None and format not in READS_TOOLS:
        raise InputError(f"--tools: only the {' and '.join(READS_TOOLS)} importers read it (a {format} log records "
                         "its tools, or the format has none)")
    result = run_import(format, paths, ImportOptions(redact=redact, max_input_tokens=max_input_tokens,
                                                     count_tokens=count,
                                                     tools=load_tool_set(tools) if tools is not None else None))
    rejects_path = output.with_name(output.stem + ".rejects.jsonl")
    with atomic_write(rejects_path) as f:  # redacted too, with --redact (run_import)
        for r in result.rejects:
            f.write(json.dumps(r.as_dict(), ensure_ascii=False) + "\n")
    c = result.counts()
    reasons = ", ".join(f"{k}={v}" for k, v in {**c["rejects_by_reason"], **c["dropped_by_reason"]}.items())
    inputs = " ".join(str(p) for p in paths)
    if not result.trajectories:  # nothing to write: fail (no empty output file)
        only = result.rejects[0].message if len(result.rejects) == 1 else None  # one cause: say it on the line
        raise InputError(f"{inputs}: no {format} trajectory imported (read {c['read']} records, rejected "
                         f"{c['rejected']}{'; ' + reasons if reasons else ''}){': ' + only if only else ''}; "
                         f"reasons in {rejects_path}")
    write_trajectories(output, result.trajectories)  # atomically: a reader never sees half of it

    table = Table(title=f"memorywalker import {format}")
    table.add_column("what")
    table.add_column("count", justify="right")
    for key in ("read", "imported", "skipped", "rejected", "trajectories", "calls"):
        table.add_row(key, str(c[key]))
    table.add_row("calls selected", str(c["calls_selected"]))
    for reason, n in c["unselected_by_reason"].items():  # context_unverified: lost to the billed check
        table.add_row(f"calls unselected: {reason}", str(n))
    for kind, n in c["evictions"].items():
        table.add_row(f"evictions: {kind}", str(n))
    for key, label in (("tools_unknown", "trajectories without tool schemas (not in the log: --tools gives them)"),
                       ("system_prompt_rule_undecided", "system prompt kept whole: the rule is undecided without --tools")):
        if c["notes"].get(key):
            table.add_row(label, str(c["notes"][key]))
    if c["system_prompt_absent"]:  # meta.system_prompt = "absent" on each: the contexts start after it
        table.add_row("trajectories without the system prompt (not in the log)", str(c["system_prompt_absent"]))
    if c["evictions_inferred"]:
        table.add_row("evictions inferred (not recorded by the harness)", str(c["evictions_inferred"]))
        table.add_row("  of which from billed-token drops", str(c["evictions_from_billed_drops"]))
    for reason, n in c["rejects_by_reason"].items():
        table.add_row(f"rejects: {reason}", str(n))
    for reason, n in c["dropped_by_reason"].items():
        table.add_row(f"dropped (file/trajectory): {reason}", str(n))
    for reason, n in c["warnings_by_reason"].items():
        table.add_row(f"kept with a warning: {reason}", str(n))
    for kind, n in c["skipped_by_kind"].items():
        table.add_row(f"skipped: {kind}", str(n))
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    checks = Table(title="contexts checked against billed prompt tokens (docs/importers.md)")
    for col in ("file", "verified", "unverified", "unchecked", "unselected"):
        checks.add_column(col, justify="left" if col == "file" else "right")
    counts = check_counts(result.trajectories)
    common = os.path.commonpath([str(Path(p).parent) for p in counts]) if len(counts) > 1 else None
    for source, n in sorted(counts.items()):  # unselected: calls taken out of training as unverified
        checks.add_row(os.path.relpath(source, common) if common else source, str(n["verified"]),
                       str(n["unverified"]), str(n["unchecked"]), str(n["unselected"]))
    console.print(checks)
    if ctx.meta.get("memorywalker.debug"):  # what unknown records carried
        for r in result.rejects:
            if r.detail is not None:
                typer.echo(f"{r.source}:{r.line} {r.reason}: {r.message}\n  carried: {r.detail}")
    typer.echo(f"wrote {c['trajectories']} trajectories to {output}; {len(result.rejects)} rejects to {rejects_path}")
    if strict and (c["rejected"] or c["dropped_by_reason"]):
        raise InputError(f"{inputs}: --strict and {c['rejected']} records rejected"
                         f"{', ' + str(sum(c['dropped_by_reason'].values())) + ' files/trajectories dropped' if c['dropped_by_reason'] else ''}"
                         f" ({reasons}); reasons in {rejects_path}")
