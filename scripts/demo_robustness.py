"""Do the demo's conclusions hold on every seed and thread count? Run it and check each one.

    python scripts/demo_robustness.py --seeds 0,1,2,3,4 --threads default,1 --out runs/robustness [--size full|reduced|quick]

Each (seed, threads) is a separate ``memorywalker demo`` run in its own process, one after another (per
seed, each thread setting); ``threads=1`` sets ``OMP_NUM_THREADS=1`` (and MKL's) for the whole run, ``default`` leaves the machine's
(the method jobs run with one torch thread each in both: ``recipes/demo.py``). What differs between the
two is stages 1-3 (kit, pretraining, warm start), where a different reduction order changes the
floating-point trajectory. Per run: the pretraining's and the warm start's copy accuracy and every
conclusion :func:`memorywalker.metrics.report.claims` checks. Writes ``OUT/robustness.md`` (one row per
run, one column per conclusion, with its evidence), ``OUT/per-seed.md`` (per run: checks, verdicts, mean
rewards, wall), ``OUT/robustness.json`` (rewritten after every run), ``OUT/seeds.json`` and
``OUT/seeds.md`` (the README's headline over the runs, :func:`memorywalker.metrics.seeds.headline`,
and each run judged by ``--check-readme``'s rule against the headline of the others); ``--record FILE``
keeps the runs' summaries under the size's name (``docs/demo-seeds.json``, what the README's headline is
generated from). A run whose ``results.json`` is already in ``OUT`` with the same configuration is read,
not run again. Exits 1 when any conclusion fails in any run.

``--size full`` is ``memorywalker demo`` itself (what the README's command 1 runs); ``reduced`` is the
same pipeline at the smaller sizes below, for a shorter check (not run yet: docs/demo-robustness.md has
full-size runs only); ``quick`` is
``memorywalker demo --quick`` (8 held-out tasks: its intervals are too wide for the conclusions, so it is
a smoke run, not a check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from memorywalker.metrics.report import claims, markdown_table
from memorywalker.metrics.seeds import check_run, headline, run_summary
from memorywalker.recipes.demo import FULL, QUICK, DemoConfig

REDUCED = replace(FULL, warm_episodes=1200, warm_summaries=600, sft_episodes=240, sft_steps=40, rl_steps=12,
                  rl_prompts=3, eval_tasks=48)
SIZES = {"full": FULL, "reduced": REDUCED, "quick": QUICK}


def run_one(cfg: DemoConfig, out: Path, threads: str) -> dict:
    """One demo run in a fresh process (thread settings apply from its start); returns its results."""
    env = dict(os.environ)
    if threads != "default":
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    code = ("import json, sys; from memorywalker.recipes.demo import DemoConfig, run_demo; "
            "cfg = DemoConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(sys.argv[1]).items()}); "
            "run_demo(cfg, sys.argv[2], progress=False)")
    subprocess.run([sys.executable, "-c", code, json.dumps(asdict(cfg)), str(out)], env=env, check=True)
    return json.loads((out / "results.json").read_text())


def row(seed: int, threads: str, doc: dict) -> dict:
    return {"seed": seed, "threads": threads, "seconds": doc["seconds_total"],
            "pretrain_steps": doc.get("pretrain_steps", doc["config"]["pretrain_steps"]),
            "pretrain_copy_accuracy": doc["pretrain_copy_accuracy"], "warm_steps": doc["warm_steps"],
            "pretrain_near": (doc.get("pretrain_near_checks") or [None])[-1],
            "warm_check": (doc.get("warm_copy_checks") or [None])[-1],
            "reward": {stage: {h: {m: v[stage][0] for m, v in ms.items() if stage in v}
                               for h, ms in doc["summary"].items()} for stage in ("sft", "rl")},
            "claims": claims(doc)}


def table(rows: list[dict]) -> str:
    names = [c["claim"] for c in rows[0]["claims"]]
    head = ["seed", "threads", "pretraining steps", "warm steps", *names, "wall"]
    body = [[str(r["seed"]), r["threads"], str(r["pretrain_steps"]), str(r["warm_steps"]),
             *(("holds: " if c["holds"] else "**fails**: ") + c["evidence"] for c in r["claims"]),
             f"{r['seconds'] / 60:.1f} min"] for r in rows]
    held = sum(all(c["holds"] for c in r["claims"]) for r in rows)
    return markdown_table(head, body) + f"\n\nEvery conclusion holds in {held} of {len(rows)} runs."


def per_seed_table(rows: list[dict]) -> str:
    """The README's per-seed table: each run's checks, its verdicts and its mean rewards."""
    def rewards(r, stage, h, methods=("tree-mask", "dfs", "rightmost")):
        return " / ".join(f"{r['reward'][stage][h][m]:.3f}" for m in methods if m in r["reward"][stage][h])

    head = ["seed", "threads", "pretraining: near steps (check); far rows", "warm start: act calls / summaries",
            *(c["claim"] for c in rows[0]["claims"]), "SFT under `claude-code`: tree-mask / dfs / rightmost",
            "after RL under `claude-code`: tree-mask / rightmost", "SFT under `opencode`: tree-mask / dfs / rightmost", "wall"]
    body = []
    for r in rows:
        step, acc = r["pretrain_near"]
        body.append([str(r["seed"]), r["threads"], f"{step} ({acc:.3f}); {r['pretrain_copy_accuracy']:.3f} far",
                     " / ".join(f"{a:.3f}" for a in r["warm_check"][1:]),
                     *("holds" if c["holds"] else "**fails**" for c in r["claims"]),
                     rewards(r, "sft", "claude-code"), rewards(r, "rl", "claude-code", ("tree-mask", "rightmost")),
                     rewards(r, "sft", "opencode"), f"{r['seconds'] / 60:.1f} min"])
    return markdown_table(head, body)


def leave_one_out(runs: list[dict]) -> str:
    """Each run judged by ``memorywalker demo --check-readme``'s rule against the headline of the others:
    how the rule treats a run it has not seen (another seed, or this one on another CPU)."""
    if len(runs) < 3:
        return "Leave-one-out: needs 3 runs or more."
    lines = []
    for k, r in enumerate(runs):
        differences = check_run(headline(runs[:k] + runs[k + 1:]), r)
        lines.append(f"* seed {r['seed']}: " + ("passes" if not differences else "; ".join(differences)))
    held = sum(line.endswith("passes") for line in lines)
    return f"Leave-one-out: {held} of {len(runs)} runs pass against the other runs' headline.\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--threads", default="default,1", help="comma-separated: default and/or thread counts")
    p.add_argument("--size", choices=sorted(SIZES), default="full")
    p.add_argument("--out", type=Path, default=Path("runs/robustness"))
    p.add_argument("--record", type=Path, help="also write the runs' summaries under --size in this JSON file "
                   "(docs/demo-seeds.json: what the README's headline and tests/test_demo_seeds.py read)")
    a = p.parse_args(argv)
    rows, docs = [], []
    a.out.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in a.seeds.split(",")):
        for threads in a.threads.split(","):
            out = a.out / f"seed-{seed}-threads-{threads}"
            t0 = time.perf_counter()
            cfg = replace(SIZES[a.size], seed=seed)
            done = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
            if done is not None and done["config"] == json.loads(json.dumps(asdict(cfg))):
                doc = done  # this run, done before: not run again
            else:
                doc = run_one(cfg, out, threads)
            docs.append(doc)
            rows.append(row(seed, threads, doc))
            verdict = ", ".join(("holds" if c["holds"] else "FAILS") for c in rows[-1]["claims"])
            print(f"seed {seed} threads {threads}: {verdict} ({time.perf_counter() - t0:.0f} s)", flush=True)
            # after every run, so an interrupted sweep keeps what it measured
            (a.out / "robustness.json").write_text(json.dumps({"size": a.size, "runs": rows}, indent=2))
            (a.out / "robustness.md").write_text(table(rows) + "\n")
            (a.out / "per-seed.md").write_text(per_seed_table(rows) + "\n")
    print(table(rows))
    summaries = [run_summary(d) for d in docs]
    (a.out / "seeds.json").write_text(json.dumps({"runs": summaries}, indent=2))
    text = headline(summaries) + "\n\n" + leave_one_out(summaries)
    (a.out / "seeds.md").write_text(text + "\n")
    print("\n" + text)
    if a.record is not None:
        record = json.loads(a.record.read_text()) if a.record.exists() else {}
        record[a.size] = {"command": "python scripts/demo_robustness.py " + " ".join(sys.argv[1:] if argv is None else argv),
                          "runs": summaries}
        a.record.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all(c["holds"] for r in rows for c in r["claims"]) else 1


if __name__ == "__main__":
    sys.exit(main())
