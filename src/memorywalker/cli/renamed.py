"""Options renamed so that one word means one thing (docs/rollouts.md):

* ``--compressor`` (was ``--harness``): the simulated compression policy of our environments
  (``memorywalker.rollout.COMPRESSORS``). A *harness* is a real agent program (Claude Code, Codex,
  OpenCode: ``memorywalker harness``, ``rl tasks=... harness=...``).
* ``--sampler`` (was ``--policy``): who writes the responses (``expert``, ``hf:DIR``, ``vllm:DIR``,
  ``openai:URL``).

The old spellings still work on the commands that had them, with one line on stderr naming the new
one; both spellings at once are a usage error.
"""

from __future__ import annotations

import typer

WHY = {"--compressor": "it names the compression policy; a harness is a real agent program, see `memorywalker harness`",
       "--sampler": "it names who writes the responses; a compressor is the compression policy"}
OLD = {"--compressor": "--harness", "--sampler": "--policy"}


def option(new: str, default: str, help: str):
    """The option ``new`` (``--compressor`` or ``--sampler``); its value is resolved by :func:`value`."""
    return typer.Option(None, new, help=f"{help} (default: {default})")


def old_option(new: str):
    """The hidden old spelling of ``new``."""
    return typer.Option(None, OLD[new], hidden=True, help=f"old name of {new}")


def value(new: str, given: str | None, old_given: str | None, default: str, prog: str) -> str:
    """What option ``new`` was given: its own value, else the old spelling's (with a deprecation line on
    stderr), else ``default``."""
    old = OLD[new]
    if old_given is None:
        return given if given is not None else default
    if given is not None:
        raise typer.BadParameter(f"{old} is the old name of {new}: give {new} only")
    typer.echo(f"{prog}: warning: {old} is now {new} ({WHY[new]})", err=True)
    return old_given
