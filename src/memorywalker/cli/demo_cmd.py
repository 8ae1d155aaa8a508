"""``memorywalker demo``: the embedded default (see memorywalker.recipes.demo)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import typer

from memorywalker.errors import InputError


def demo(
    quick: bool = typer.Option(False, "--quick", help="A smaller run (under 4 minutes on 2 CPU cores)."),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Output directory."),
    seed: int = typer.Option(0, help="Seed of everything (model, data, sampling); the first of --seeds."),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Run N seeds; report on how many runs each conclusion "
                              "holds and each method's reward over runs (the README's headline)."),
    check_readme: Path | None = typer.Option(None, "--check-readme", exists=True, dir_okay=False,
                                             help="After the run, judge it against the headline over seeds this "
                                             "file quotes (README.md; docs/demo.md for --quick): exit 1 when a "
                                             "conclusion that holds on every run there fails here, or a mean "
                                             "reward is out of reach (metrics/seeds.py)."),
    results: Path | None = typer.Option(None, "--results", exists=True, help="With --check-readme: judge this "
                                        "finished run (its directory or results.json) instead of running one."),
    methods: str | None = typer.Option(None, "--methods", help="Comma-separated methods to train (default: the "
                                       "reference exact method and every non-exact one; the other exact methods "
                                       "train what it trains)."),
    rl_methods: str | None = typer.Option(None, "--rl-methods", help="Comma-separated methods that also get GRPO "
                                          "after SFT (default: tree-mask,rightmost; SDCC's and dfs's collapse)."),
):
    """Build a tiny model offline, SFT it once per method on expert episodes under compression, GRPO the
    methods that show something under it from their SFT checkpoints, and compare held-out reward (with
    intervals) and the train/rollout gap."""
    from memorywalker.engine.methods import parse_methods  # lazy: the machinery (torch), only when it runs
    from memorywalker.metrics.report import results_table, times_table  # lazy: as above
    from memorywalker.metrics.seeds import check_run, headline, readme_block, run_summary  # lazy: as above
    from memorywalker.recipes.demo import FULL, QUICK, run_demo, run_seeds  # lazy: as above

    name = "quick" if quick else "full"
    if seeds > 1 and check_readme is not None:
        raise typer.BadParameter("--check-readme judges a single run against the README; drop --seeds")
    if results is not None and check_readme is None:
        raise typer.BadParameter("--results names a run for --check-readme to judge; add --check-readme README.md")
    cfg = replace(QUICK if quick else FULL, seed=seed)
    for option, field, given in (("--methods", "methods", methods), ("--rl-methods", "rl_methods", rl_methods)):
        if given is None:
            continue
        try:
            chosen = parse_methods(given, reference=False)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint=option) from None
        if check_readme is not None and chosen != getattr(cfg, field):
            raise typer.BadParameter(f"--check-readme compares the default methods with the README; drop {option}")
        cfg = replace(cfg, **{field: chosen})
    if rl_methods is None:  # the default's GRPO methods among those trained
        cfg = replace(cfg, rl_methods=tuple(m for m in cfg.rl_methods if m in cfg.methods))
    elif not set(cfg.rl_methods) <= set(cfg.methods):
        raise typer.BadParameter(f"--rl-methods names methods --methods does not train: "
                                 f"{', '.join(m for m in cfg.rl_methods if m not in cfg.methods)}")
    quoted = None
    if check_readme is not None:  # before the run: a README without the block fails before a 15-minute run
        try:
            quoted = readme_block(check_readme.read_text(encoding="utf-8"), name)
        except InputError as e:
            hint = " (the quick demo's headline is in docs/demo.md)" if name == "quick" else ""
            raise InputError(f"{check_readme}: {e}{hint}") from None
    log = lambda s: print(s, flush=True)  # noqa: E731
    if results is not None:
        doc = _read_results(results)
    elif seeds > 1:
        runs = [run_summary(d) for d in run_seeds(cfg, out, seeds, progress=sys.stderr.isatty(), log=log)]
        print("\n" + headline(runs))
        print(f"\nwrote {out / 'seeds.json'}, {out / 'seeds.md'} and one directory per seed")
        return
    else:
        doc = run_demo(cfg, out, progress=sys.stderr.isatty(), log=log)
        print("\n" + results_table(doc))
        print(f"\nwrote {out / 'results.json'}, {out / 'table.md'}, {out / 'index.html'}")
        print("\nTime per stage (wall; the methods run side by side, each line its own worker):\n\n" + times_table(doc))
    if quoted is not None:
        differences = check_run(quoted, run_summary(doc))
        for d in differences:
            print(f"  {d}")
        if differences:
            typer.echo(f"memorywalker demo: error: {check_readme}: {len(differences)} differences from the {name} "
                       f"demo's headline over seeds", err=True)
            raise typer.Exit(1)
        print(f"{check_readme}: every conclusion that holds on every run there holds here, and every mean reward "
              f"is within the {name} headline's reach")


def _read_results(path: Path) -> dict:
    path = path / "results.json" if path.is_dir() else path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a demo's results.json ({e})") from None


def register(app: typer.Typer) -> None:
    app.command()(demo)
