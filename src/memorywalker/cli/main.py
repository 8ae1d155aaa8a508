"""The ``memorywalker`` command line. Each subcommand lives in its own module and imports heavy
libraries (torch, transformers) only when it runs."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="memorywalker",
    help="Train LLM agents on the contexts they actually saw.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# --- subcommands (one module each; keep this list sorted) -------------------------------------------
from memorywalker.cli import (  # noqa: E402
    bench_cmd,
    demo_cmd,
    gap_cmd,
    import_cmd,
    methods_cmd,
    records_cmd,
    rollout_cmd,
    train_cmd,
)

bench_cmd.register(app)
demo_cmd.register(app)
gap_cmd.register(app)
import_cmd.register(app)
methods_cmd.register(app)
records_cmd.register(app)
rollout_cmd.register(app)
train_cmd.register(app)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
