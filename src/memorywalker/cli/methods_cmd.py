"""``memorywalker methods``: the training methods, from the registry (``memorywalker.engine.METHODS``)."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.table import Table


def methods(as_json: bool = typer.Option(False, "--json", help="Print the registry as JSON.")):
    """List every training method: exactness, forward schedule, backward schedule, what it trains on."""
    from memorywalker.engine import METHODS  # lazy: the command's machinery (torch), only when it runs

    rows = [{"method": m.name, "exact": m.exactness, "schedule": m.schedule, "backward": m.backward,
             "kl": m.kl, "full_view": m.full_view, "summary": m.summary} for m in METHODS.values()]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title="training methods (--method NAME)")
    for col in ("method", "exact", "schedule", "backward", "what each forward sees"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["method"], r["exact"], r["schedule"], r["backward"], r["summary"])
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def register(app: typer.Typer) -> None:
    app.command()(methods)
