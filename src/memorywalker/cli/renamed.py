"""Options renamed so that one word means one thing: ``--compressor`` is the simulated compression policy
of our environments (``memorywalker.rollout.COMPRESSORS``); a *harness* is a real agent program (Claude
Code, Codex, OpenCode: ``memorywalker harness``, ``rl tasks=... harness=...``). The old spelling
``--harness`` still works on the commands that had it, with one line on stderr naming the new one."""

from __future__ import annotations

import typer

COMPRESSOR_HELP = "compression policy of the simulated harness: {}"


def compressor_option(default: str, names: str):
    """``--compressor NAME`` (default ``default``; ``names``: the valid ones, for the help)."""
    return typer.Option(None, "--compressor", help=COMPRESSOR_HELP.format(names) + f" (default: {default})")


def old_harness_option():
    """The hidden old spelling of ``--compressor``."""
    return typer.Option(None, "--harness", hidden=True, help="old name of --compressor")


def compressor(new: str | None, old: str | None, default: str, prog: str) -> str:
    """The compressor a command was given: ``--compressor``, else the old ``--harness`` (with a deprecation
    line), else ``default``. Both at once is a usage error."""
    if old is None:
        return new if new is not None else default
    if new is not None:
        raise typer.BadParameter("--harness is the old name of --compressor: give --compressor only")
    typer.echo(f"{prog}: warning: --harness is now --compressor (it names the compression policy; a harness is "
               "a real agent program, see `memorywalker harness`)", err=True)
    return old
