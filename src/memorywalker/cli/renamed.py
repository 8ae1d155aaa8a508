"""Options renamed so that one word means one thing (docs/rollouts.md):

* ``--compressor`` (was ``--harness``): the simulated compression policy of our environments
  (``memorywalker.rollout.COMPRESSORS``). A *harness* is a real agent program (Claude Code, Codex,
  OpenCode: ``memorywalker harness``, ``rl tasks=... harness=...``).
* ``--sampler`` (was ``--policy``): who writes the responses (``expert``, ``hf:DIR``, ``vllm:DIR``,
  ``openai:URL``).
* ``--max-steps`` (was ``--max-turns`` on ``bench rollouts``): act calls per episode, as
  ``HarnessConfig.max_steps`` and the other commands name it.

The old spellings still work on the commands that had them, with one line on stderr naming the new
one; both spellings at once are a usage error.
"""

from __future__ import annotations

from typing import Any, TypeVar

import typer

T = TypeVar("T")

WHY = {"--compressor": "it names the compression policy; a harness is a real agent program, see `memorywalker harness`",
       "--sampler": "it names who writes the responses; a compressor is the compression policy",
       "--max-steps": "the other commands and HarnessConfig name the act calls per episode so"}
OLD = {"--compressor": "--harness", "--sampler": "--policy", "--max-steps": "--max-turns"}


def option(new: str, default: Any, help: str, **kwargs: Any):
    """The option ``new`` (a key of :data:`OLD`); its value is resolved by :func:`value`."""
    return typer.Option(None, new, help=f"{help} (default: {default})", **kwargs)


def old_option(new: str, **kwargs: Any):
    """The hidden old spelling of ``new``."""
    return typer.Option(None, OLD[new], hidden=True, help=f"old name of {new}", **kwargs)


def value(new: str, given: T | None, old_given: T | None, default: T, prog: str) -> T:
    """What option ``new`` was given: its own value, else the old spelling's (with a deprecation line on
    stderr), else ``default``."""
    old = OLD[new]
    if old_given is None:
        return given if given is not None else default
    if given is not None:
        raise typer.BadParameter(f"{old} is the old name of {new}: give {new} only")
    typer.echo(f"{prog}: warning: {old} is now {new} ({WHY[new]})", err=True)
    return old_given
