"""``memorywalker harness run``: one real harness session (Claude Code, Codex CLI, OpenCode) through the
gateway, in a fresh workdir, recorded token for token."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from memorywalker.cli.gateway_cmd import build_gateway
from memorywalker.gateway.harnesses import PINNED, capture  # stdlib only: cheap at CLI start

console = Console(stderr=True)
harness_app = typer.Typer(help="Run real harnesses against the recording gateway.", no_args_is_help=True)


@harness_app.command("run")
def run(
    harness: str = typer.Argument(..., help=" | ".join(PINNED)),
    prompt: str = typer.Option(..., help="The task, as the harness's non-interactive prompt."),
    model: str = typer.Option(..., help="The served model: a local Hugging Face dir."),
    out: Path = typer.Option(..., help="The gateway's record directory (trajectories.jsonl, sessions/)."),
    backend: str = typer.Option("hf", help="hf | vllm | openai:URL | scripted:FILE (see memorywalker gateway)."),
    file: list[str] = typer.Option(None, help="NAME=PATH: a file to place in the fresh workdir (repeatable)."),
    compact_at: int | None = typer.Option(None, help="Make the harness's own auto-compaction trigger once a "
                                                     "prompt passes about this many tokens (its own setting)."),
    deadline: float = typer.Option(600.0, help="Seconds before the harness is killed (recorded as failed)."),
    bin_dir: str | None = typer.Option(None, "--bin", help="Where the harness binary is (default: "
                                                           "$MEMORYWALKER_HARNESS_BIN, then PATH)."),
    tokenizer: str | None = typer.Option(None, help="Tokenizer dir (default: the model's)."),
    chat_template: str | None = typer.Option(None, help="Render with this template instead of the model's (a "
                                             "Jinja file or a shipped name: see memorywalker gateway --help)."),
    tool_parser: str | None = typer.Option(None, help="The tool-call format (default: the template's)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    max_new_tokens: int = typer.Option(512, help="Cap on each response."),
):
    """Start the gateway, run HARNESS on PROMPT in a fresh workdir against it, and name the records it made."""
    if harness not in PINNED:
        raise typer.BadParameter(f"unknown harness {harness!r}; valid: {sorted(PINNED)}")
    files = {}
    for spec in file or []:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"--file {spec!r}: NAME=PATH")
        files[name] = Path(path).read_text(encoding="utf-8")
    gw = build_gateway(model, backend, out, tokenizer=tokenizer, temperature=temperature,
                       max_new_tokens=max_new_tokens, harness=harness, chat_template=chat_template,
                       tool_parser=tool_parser)
    s = capture(harness, prompt, gw, model=Path(model).name, files=files, deadline_s=deadline,
                compact_tokens=compact_at, bin_dir=bin_dir)
    state = "killed at the deadline" if s.run.returncode is None else f"exit {s.run.returncode}"
    console.print(f"{harness}: {state} after {s.run.seconds:.1f} s in {s.run.workdir}")
    if not s.run.ok:
        console.print(s.run.stderr[-2000:] or s.run.stdout[-2000:])
    for t in s.trajectories:
        branches = ", ".join(f"{k} {v}" for k, v in t.meta.get("branches", {}).items()) or "none"
        console.print(f"  {t.id}: {len(t.calls)} calls, branches: {branches}")
    sys.stdout.write(f"{s.records}\n")
    if not s.run.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(harness_app, name="harness")
