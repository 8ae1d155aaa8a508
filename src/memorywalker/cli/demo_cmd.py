"""``memorywalker demo``: the embedded default (see memorywalker.demo)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import typer


def demo(
    quick: bool = typer.Option(False, "--quick", help="A smaller run (about 4 minutes on 2 CPU cores)."),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Output directory."),
    seed: int = typer.Option(0, help="Seed of everything (world, model, data, sampling)."),
):
    """Build a tiny model offline, SFT it on expert episodes, RL it once per method under compression,
    and compare reward and the train/rollout gap on held-out tasks."""
    from memorywalker.demo import FULL, QUICK, results_table, run_demo

    cfg = replace(QUICK if quick else FULL, seed=seed)
    doc = run_demo(cfg, out, progress=sys.stderr.isatty(), log=lambda s: print(s, flush=True))
    print()
    print(results_table(doc))
    print(f"\nwrote {out / 'results.json'}, {out / 'index.html'} ({doc['seconds_total']:.0f} s)")


def register(app: typer.Typer) -> None:
    app.command()(demo)
