"""The ``memorywalker`` command line. Each subcommand lives in its own module and imports heavy
libraries (torch, transformers) only when it runs."""

from __future__ import annotations

import typer

from memorywalker.cli.errors import OneLineErrors

app = typer.Typer(
    cls=OneLineErrors,  # every failure: one line naming the input and the cause, exit 2 (--debug: traceback)
    name="memorywalker",
    help="Train LLM agents on the contexts they actually saw.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# --- subcommands (one module each; keep this list sorted) -------------------------------------------
from memorywalker.cli import (  # noqa: E402
    acc_cmd,
    augment_cmd,
    bench_cmd,
    dagger_cmd,
    demo_cmd,
    distill_cmd,
    eval_cmd,
    export_cmd,
    gap_cmd,
    gateway_cmd,
    harness_cmd,
    import_cmd,
    inventory_cmd,
    methods_cmd,
    models_cmd,
    records_cmd,
    rollout_cmd,
    train_cmd,
    view_cmd,
)

acc_cmd.register(app)
augment_cmd.register(app)
bench_cmd.register(app)
dagger_cmd.register(app)
demo_cmd.register(app)
distill_cmd.register(app)
eval_cmd.register(app)
export_cmd.register(app)
gap_cmd.register(app)
gateway_cmd.register(app)
harness_cmd.register(app)
import_cmd.register(app)
inventory_cmd.register(app)
methods_cmd.register(app)
models_cmd.register(app)
records_cmd.register(app)
rollout_cmd.register(app)
train_cmd.register(app)
view_cmd.register(app)


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="show the traceback of a failure (allowed "
                                        "anywhere on the command line)")) -> None:
    """Train LLM agents on the contexts they actually saw."""


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
