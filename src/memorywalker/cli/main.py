"""The ``memorywalker`` command line. Each subcommand lives in its own module and imports heavy
libraries (torch, transformers) only when it runs."""

from __future__ import annotations

import sys

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

# What `memorywalker --help` shows: the commands grouped by what a person is doing, one plain line each,
# in this order; the detail stays in each command's own --help. tests/test_cli_help.py checks that every
# registered command is here exactly once.
PANELS: dict[str, dict[str, str]] = {
    "Get data": {
        "import": "Your harness's logs (Claude Code, Codex, …) as trajectories.",
        "gateway": "Serve a model to real harnesses; record every call.",
        "harness": "Run one real harness session through the gateway.",
        "rollout": "Roll out tasks under a simulated harness's compression.",
    },
    "Train": {
        "sft": "Supervised fine-tuning, exact under compression.",
        "dpo": "Preference training on pairs that branch from one context.",
        "rl": "GRPO, in the simulated environments or inside a real harness.",
        "dagger": "DAgger rounds: label the learner's own states, retrain.",
        "distill": "Records for distillation (a teacher's, without guidance).",
        "augment": "Schema augmentation: renamed tools and arguments, distractors.",
        "compile-acc": "Compile trajectories into long-context QA (ACC).",
    },
    "Measure": {
        "gap": "Trainer vs rollout logprobs per method, by branches.",
        "inspect": "Calls, evictions, tree sizes and targets of trajectory files.",
        "eval": "Closed-loop evaluation of a checkpoint against a baseline.",
        "bench": "Benchmarks: engines at real shapes, rollouts.",
        "inventory": "Parameter-state memory of full vs adapter training.",
    },
    "Look and share": {
        "view": "One offline HTML page per trajectory: tree, contexts, gap.",
        "export": "Trajectories as TRL, OpenAI or Parquet datasets.",
    },
    "Reference and the kit": {
        "demo": "The offline demo: a tiny agent per method, compared.",
        "models": "Real models that install offline (SmolLM2-135M).",
        "methods": "The training methods: exactness and schedules.",
        "schema": "The JSON Schema of trajectory records.",
        "validate": "Check records: each line accepted or rejected, with a reason.",
        "reasons": "The reject reason codes and what they mean.",
    },
}


def _arrange(app: typer.Typer) -> None:
    """Each command and group into its panel with its one line, in PANELS' order."""
    order = [name for panel in PANELS.values() for name in panel]
    where = {name: (title, line) for title, panel in PANELS.items() for name, line in panel.items()}

    def name_of(info) -> str:
        return info.name or info.callback.__name__.replace("_", "-")

    for info in [*app.registered_commands, *app.registered_groups]:
        info.rich_help_panel, info.short_help = where[name_of(info)]
    app.registered_commands.sort(key=lambda i: order.index(name_of(i)))
    app.registered_groups.sort(key=lambda i: order.index(name_of(i)))


_arrange(app)


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="show the traceback of a failure (allowed "
                                        "anywhere on the command line)")) -> None:
    """Train LLM agents on the contexts they actually saw."""


def main() -> None:  # pragma: no cover
    try:
        app()
    except SystemExit as done:
        if not done.code and "torch.distributed" in sys.modules:  # a rank that finished under torchrun
            from memorywalker.train.distributed import end_distributed

            end_distributed()
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
