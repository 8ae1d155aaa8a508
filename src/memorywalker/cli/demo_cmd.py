"""``memorywalker demo``: the embedded default (see memorywalker.recipes.demo)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import typer


def demo(
    quick: bool = typer.Option(False, "--quick", help="A smaller run (under 4 minutes on 2 CPU cores)."),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Output directory."),
    seed: int = typer.Option(0, help="Seed of everything (model, data, sampling); the first of --seeds."),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Run N seeds; report mean and sd of each method's reward."),
    check_readme: Path | None = typer.Option(None, "--check-readme", help="After the run, compare its conclusions "
                                             "and mean rewards with the table this README quotes (exit 1 when a "
                                             "conclusion differs or a mean is more than 0.15 away)."),
    methods: str | None = typer.Option(None, "--methods", help="Comma-separated methods to train (default: the "
                                       "reference exact method and every non-exact one; the other exact methods "
                                       "train what it trains)."),
):
    """Build a tiny model offline, SFT it once per method on expert episodes under compression, GRPO each
    from its SFT checkpoint, and compare held-out reward (with intervals) and the train/rollout gap."""
    from memorywalker.metrics.report import (  # lazy: the command's machinery (torch), only when it runs
        READ_TOLERANCE,
        readme_differences,
        readme_table,
        results_table,
        seeds_table,
        times_table,
    )
    from memorywalker.recipes.demo import FULL, QUICK, run_demo, run_seeds  # lazy: as above

    if seeds > 1 and check_readme is not None:
        raise typer.BadParameter("--check-readme compares a single run with the README; drop --seeds")
    cfg = replace(QUICK if quick else FULL, seed=seed)
    if methods is not None:
        from memorywalker.engine.methods import parse_methods  # lazy: as above

        try:
            chosen = parse_methods(methods, reference=False)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--methods") from None
        if check_readme is not None and chosen != cfg.methods:
            raise typer.BadParameter("--check-readme compares the default methods with the README; drop --methods")
        cfg = replace(cfg, methods=chosen)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if seeds > 1:
        doc = run_seeds(cfg, out, seeds, progress=sys.stderr.isatty(), log=log)
        print()
        print(seeds_table(doc))
        print(f"\nwrote {out / 'seeds.json'} and one directory per seed")
        return
    doc = run_demo(cfg, out, progress=sys.stderr.isatty(), log=log)
    table = results_table(doc)
    print()
    print(table)
    print(f"\nwrote {out / 'results.json'}, {out / 'table.md'}, {out / 'index.html'}")
    print("\nTime per stage (wall; the methods run side by side, each line its own worker):\n\n" + times_table(doc))
    if check_readme is not None:
        name = "quick" if quick else "full"
        quoted = readme_table(check_readme.read_text(encoding="utf-8"), name)  # ValueError: one line, exit 2
        differences = readme_differences(quoted, doc)
        for d in differences:
            print(f"  {d}")
        if differences:
            typer.echo(f"memorywalker demo: error: {check_readme}: {len(differences)} differences from the {name} "
                       f"demo table ({out / 'table.md'})", err=True)
            raise typer.Exit(1)
        print(f"{check_readme}: this run's conclusions are the {name} demo table's, and every mean reward is "
              f"within {READ_TOLERANCE} of it")


def register(app: typer.Typer) -> None:
    app.command()(demo)
