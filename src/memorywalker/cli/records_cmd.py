"""``memorywalker schema | validate | inspect``: the record-level commands."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import asdict
from importlib import resources
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.errors import InputError
from memorywalker.records import REASONS, TrajectoryReader, json_schema
from memorywalker.render import Renderer

# Tables are wide; keep them readable when stdout is a pipe or a CI log.
console = Console(width=None if sys.stdout.isatty() else 160)


def _example_path() -> Path:
    return Path(str(resources.files("memorywalker.data").joinpath("examples/websearch-compressed.jsonl")))


def schema(out: Path | None = typer.Option(None, "-o", "--out", help="Write to this file instead of stdout.")):
    """Print the JSON Schema of trajectory records (memorywalker.trajectory/v1)."""
    text = json.dumps(json_schema(), indent=2)
    if out:
        out.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


def validate(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="JSONL trajectory files."),
    rejects: Path | None = typer.Option(None, help="Write rejected lines with their reasons here (JSONL)."),
    tokenizer: Path | None = typer.Option(None, help="HF tokenizer dir: also check token ids against its vocab."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    strict: bool = typer.Option(False, "--strict", help="Exit 2 when any line is rejected."),
):
    """Check records against schema v1; every line is accepted or rejected with a reason code.
    Exits 2 when no line was accepted (or, with --strict, when any was rejected)."""
    vocab = len(load_tokenizer(tokenizer)) if tokenizer else None
    reader = TrajectoryReader(files, rejects_path=rejects, vocab_size=vocab)  # rejects streamed, not held
    for _ in reader:
        pass
    _print_read_summary(reader, as_json)
    if not as_json and reader.rejects:
        for r in reader.rejects[:20]:
            console.print(f"  {r.source}:{r.line} [red]{r.code}[/red] {r.message}")
    names = " ".join(str(f) for f in files)
    if reader.summary.accepted == 0:
        raise InputError(f"{names}: no valid trajectory ({reader.summary})")
    if strict and reader.summary.rejected:
        raise InputError(f"{names}: --strict and {reader.summary.rejected} of {reader.summary.read} lines rejected "
                         f"({reader.summary})")


def _print_read_summary(reader: TrajectoryReader, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(reader.summary.as_dict()) + "\n")
    else:
        console.print(str(reader.summary))


def inspect(
    file: Path | None = typer.Argument(None, exists=True, dir_okay=False,
                                       help="JSONL trajectory file (default: the bundled example)."),
    tokenizer: Path | None = typer.Option(None, help="HF tokenizer dir with a chat template "
                                          "(default: the offline kit tokenizer)."),
    max_length: int = typer.Option(4096, help="Row length for the padded vs packed occupancy."),
    rejects: Path | None = typer.Option(None, help="Write rejected lines with their reasons here (JSONL)."),
    as_json: bool = typer.Option(False, "--json", help="Stable JSON output (keys in docs/inspect.md)."),
):
    """Per trajectory and in total: calls, evictions, segments, U/P/L tokens, role shares, targets,
    dilution, rightmost-path losses and packing occupancy. Exits 2 when no line was accepted."""
    from tqdm import tqdm  # lazy: tqdm (~30 ms) loads only when the command runs

    from memorywalker.metrics.tree_stats import TreeStats, occupancy, tree_stats  # lazy: command machinery

    file = file or _example_path()
    tok = load_tokenizer(tokenizer)
    renderer = Renderer(tok)
    reader = TrajectoryReader(file, rejects_path=rejects, vocab_size=len(tok))
    per: list[TreeStats] = []
    total = TreeStats(id="total")
    checks = Counter({k: 0 for k in ("verified", "unverified", "unchecked")})  # importers/billed.py
    for traj in tqdm(reader, desc="inspect", unit="traj", disable=as_json or not sys.stderr.isatty()):
        checks.update(c.meta.get("context_check", "unchecked") for c in traj.calls)
        st = tree_stats(renderer.render(traj))
        per.append(st)
        total.add(st)
    if reader.summary.accepted == 0:  # an empty or binary file: nothing to inspect
        raise InputError(f"{file}: no valid trajectory ({reader.summary})")
    occ = occupancy([s.unique_tokens for s in per], max_length)

    if as_json:
        out = {"file": str(file), "read": reader.summary.as_dict(),
               "trajectories": [s.as_dict() for s in per], "total": total.as_dict(), "occupancy": asdict(occ),
               "context_check": dict(checks)}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    _print_inspect(per, total, occ, reader)
    console.print(f"calls checked against billed prompt tokens: verified {checks['verified']}, unverified "
                  f"{checks['unverified']}, unchecked {checks['unchecked']}")


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _print_inspect(per, total, occ, reader) -> None:
    table = Table(title="conditioning trees", show_lines=False)
    cols = ["trajectory", "T", "K", "seg", "U", "P", "L", "P/U", "L/U", "obs", "targets", "tgt/U",
            "dilution", "lost(rm)"]
    for c in cols:
        table.add_column(c, justify="left" if c == "trajectory" else "right")
    for s in [*per, total]:
        table.add_row(
            s.id, str(s.calls), str(s.evictions), str(s.segments), str(s.unique_tokens), str(s.per_call_tokens),
            str(s.logit_tree_tokens), _fmt(s.p_over_u), _fmt(s.l_over_u), _fmt(s.observation_share, ".1%"),
            str(s.targets), _fmt(s.target_share, ".1%"), _fmt(s.dilution, ".1f"), str(s.rightmost_lost_targets),
            end_section=s is per[-1] if per else False,
        )
    console.print(table)
    roles = ", ".join(f"{k} {v} ({v / total.unique_tokens:.1%})" for k, v in total.tokens_by_role.items()) \
        if total.unique_tokens else "-"
    console.print(f"stored tokens by role: {roles}")
    if total.zero_target_calls:
        console.print("calls with zero targets: " + ", ".join(f"{k}={v}" for k, v in total.zero_target_calls.items()))
    console.print(f"occupancy at max_length {occ.max_length}: padded {_fmt(occ.padded, '.1%')} "
                  f"({occ.padded_rows} rows), packed {_fmt(occ.packed, '.1%')} ({occ.packed_bins} bins), "
                  f"overlong {occ.overlong}")
    console.print(str(reader.summary))


def reasons():
    """List the reject reason codes with their meaning."""
    table = Table("code", "meaning")
    for code, text in REASONS.items():
        table.add_row(code, text)
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(schema)
    app.command()(validate)
    app.command()(inspect)
    app.command()(reasons)
