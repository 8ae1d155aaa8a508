"""Why SDCC loses under summarization: its variants after SFT, against the exact method, over seeds.

    python scripts/sdcc_sweep.py --seeds 0,1,2 --out runs/sdcc-sweep [--workers 2] [--quick] [--variants a,b]
                                 [--prepared runs/demo-seeds]

Per seed, the demo's stages 1-3 run once (kit, expert episodes, warm start: ``recipes/demo.py``
``prepare``); then every variant below is trained from that warm start with the demo's SFT and evaluated
greedily on the demo's 64 held-out tasks under both harnesses (``MethodJob(rl=False)``). With
``--prepared DIR`` (a ``memorywalker demo --seeds N --out DIR`` of the same sizes) each seed's stages 1-3
are read from ``DIR/seed-S`` instead of run again: the same config and seed give the same warm start.
Variants:

* ``tree-mask`` — the exact method (the reference of every paired difference);
* ``sdcc`` with λ ∈ {0, 1, 4, 16} (λ = 0: the full view's main loss and the summarization calls only);
* ``students=all`` — a student (KL row) for every selected call, not only the junctions;
* ``full-view+summaries`` — the full view keeps the harness's summaries where they first appear;
* ``compressed-main`` — a student's main loss on its own compressed S_t (what deployment shows), KL kept;
  with λ = 0 too.

Writes ``OUT/seed-S/...`` (every run and evaluated episode), ``OUT/sweep.json`` (per seed, variant and
harness: the rewards per task) and ``OUT/sweep.md`` (mean reward over tasks with its bootstrap 95 %
interval per seed, mean ± sd over seeds, and the paired difference against tree-mask pooled over seeds).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

VARIANTS: dict[str, tuple[str, dict]] = {  # label -> (method, DemoConfig fields)
    "tree-mask": ("tree-mask", {}),
    "sdcc λ=0": ("sdcc", {"sdcc_lambda": 0.0}),
    "sdcc λ=1 (default)": ("sdcc", {}),
    "sdcc λ=4": ("sdcc", {"sdcc_lambda": 4.0}),
    "sdcc λ=16": ("sdcc", {"sdcc_lambda": 16.0}),
    "sdcc students=all": ("sdcc", {"sdcc_students": "all"}),
    "sdcc full-view+summaries": ("sdcc", {"sdcc_full_view_artifacts": True}),
    "sdcc compressed-main": ("sdcc", {"sdcc_compressed_main": True}),
    "sdcc compressed-main λ=0": ("sdcc", {"sdcc_compressed_main": True, "sdcc_lambda": 0.0}),
}


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label).strip("-").replace("--", "-")


def prepared(src: Path, seed_out: Path, cfg) -> dict:
    """Stages 1-3 of a demo run in ``src`` (kit, expert episodes, warm start), linked into ``seed_out``;
    refused unless that run's config is ``cfg``."""
    from dataclasses import asdict

    doc = json.loads((src / "results.json").read_text())
    differ = sorted(k for k, v in json.loads(json.dumps(asdict(cfg))).items() if doc["config"].get(k) != v)
    if differ:
        raise SystemExit(f"{src}: a demo run with other settings ({', '.join(differ)}): run it without --prepared")
    seed_out.mkdir(parents=True, exist_ok=True)
    for name in ("kit", "expert.jsonl"):
        if not (seed_out / name).exists():
            (seed_out / name).symlink_to((src / name).resolve())
    return {"warm_dir": str((src / "warm" / "final").resolve()), "warm_loss": doc["warm_loss"]}


def run(seeds: list[int], out: Path, workers: int, quick: bool, variants: list[str], prepared_dir: Path | None = None
        ) -> dict:
    from memorywalker.recipes.demo import FULL, QUICK, MethodJob, map_jobs, prepare

    base = QUICK if quick else FULL
    doc: dict = {"config": {"seeds": seeds, "quick": quick, "variants": {v: VARIANTS[v] for v in variants}},
                 "runs": {}}
    for seed in seeds:
        cfg = replace(base, seed=seed)
        seed_out = out / f"seed-{seed}"
        t0 = time.perf_counter()
        if prepared_dir is None:
            prep = prepare(cfg, seed_out, progress=False)
        else:
            prep = prepared(prepared_dir / f"seed-{seed}", seed_out, cfg)
        jobs = [MethodJob(replace(cfg, **VARIANTS[v][1]), str(seed_out), VARIANTS[v][0], prep["warm_dir"], rl=False,
                          label=slug(v)) for v in variants]
        results = {}
        for v, (res, line) in zip(variants, map_jobs(jobs, workers), strict=True):
            results[v] = {h: r["rewards"] for h, r in res["sft"].items()}
            results[v]["gap"] = {h: r["gap"] for h, r in res["sft"].items()}
            print(f"seed {seed} {line}", flush=True)
        doc["runs"][str(seed)] = {"results": results, "seconds": round(time.perf_counter() - t0, 1),
                                  "warm_loss": prep["warm_loss"]}
        (out / "sweep.json").write_text(json.dumps(doc, indent=1))
    return doc


def table(doc: dict) -> str:
    from memorywalker.metrics.stats import paired_bootstrap

    seeds = list(doc["runs"])
    variants = list(doc["config"]["variants"])
    harnesses = [h for h in doc["runs"][seeds[0]]["results"][variants[0]] if h != "gap"]
    out = []
    for h in harnesses:
        head = ["variant", *(f"seed {s}" for s in seeds), "mean ± sd over seeds", "− tree-mask (paired, all seeds)"]
        rows = []
        for v in variants:
            per_seed = [doc["runs"][s]["results"][v][h] for s in seeds]
            cells = []
            for x in per_seed:
                m, lo, hi = paired_bootstrap(x)
                cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
            means = [float(np.mean(x)) for x in per_seed]
            sd = float(np.std(means, ddof=1)) if len(means) > 1 else float("nan")
            diff = "—"
            if v != "tree-mask":
                d = np.concatenate([np.subtract(doc["runs"][s]["results"][v][h], doc["runs"][s]["results"]["tree-mask"][h])
                                    for s in seeds])
                m, lo, hi = paired_bootstrap(d)
                diff = f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            rows.append([f"`{v}`", *cells, f"{np.mean(means):.3f} ± {sd:.3f}", diff])
        tasks = len(doc["runs"][seeds[0]]["results"][variants[0]][h])
        out.append(f"Held-out reward after SFT under `{h}` ({tasks} tasks per seed, mean [bootstrap 95 % interval]):\n\n"
                   + "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                                *("| " + " | ".join(r) + " |" for r in rows)]))
    return "\n\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="runs/sdcc-sweep")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the demo's quick sizes (checks the script, not SDCC)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated labels of VARIANTS")
    ap.add_argument("--prepared", type=Path, default=None, help="a demo --seeds output dir: reuse its stages 1-3")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "tree-mask" not in variants:
        raise SystemExit(f"unknown variants {unknown} (tree-mask is required); valid: {list(VARIANTS)}")
    doc = run([int(s) for s in args.seeds.split(",")], out, args.workers, args.quick, variants, args.prepared)
    text = table(doc)
    (out / "sweep.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
