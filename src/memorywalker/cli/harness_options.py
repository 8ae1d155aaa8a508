"""The options of :class:`~memorywalker.rollout.HarnessConfig`'s fields on the commands that run episodes
(``rollout``, ``eval``): ``--budget`` for ``budget``, ``--max-steps`` for ``max_steps``, ... Each option's
default is the field's own, so a default is typed once, in ``HarnessConfig``."""

from __future__ import annotations

from typing import Any

import typer

from memorywalker.rollout import HarnessConfig

HELP = {
    "budget": "context budget in prompt tokens the compressor keeps the history under",
    "watermark": "compress above watermark * budget",
    "keep_recent": "recent steps protected from pruning/folding",
    "max_steps": "act calls per episode",
    "max_context": "hard context window in tokens",
}


def harness_option(name: str, *, more: str = "", **kwargs: Any) -> Any:
    """The typer option of ``HarnessConfig.<name>``, with its default; ``more`` ends its help.

    >>> harness_option("max_steps").default == HarnessConfig.max_steps
    True
    """
    return typer.Option(getattr(HarnessConfig, name), "--" + name.replace("_", "-"), help=HELP[name] + more, **kwargs)
