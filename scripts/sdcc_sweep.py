"""Why SDCC loses under summarization: its variants against the exact method, over seeds, after SFT
and (for the variants named by ``--rl``) after GRPO.

    python scripts/sdcc_sweep.py --seeds 0,1,2 --out runs/sdcc-sweep [--workers 2] [--quick] [--variants a,b]
                                 [--rl a,b] [--prepared runs/demo-seeds]
    python scripts/sdcc_sweep.py --merge runs/sweep-a runs/sweep-b --out runs/sdcc-sweep

Per seed, the demo's stages 1-3 run once (kit, expert episodes, warm start: ``recipes/demo.py``
``prepare``); then every variant below is trained from that warm start with the demo's SFT and evaluated
greedily on the demo's 64 held-out tasks under both harnesses (``MethodJob(rl=False)``); a variant in
``--rl`` goes on to the demo's GRPO from its SFT checkpoint and is evaluated again (``MethodJob(rl=True)``).
All seeds' jobs share one pool of ``--workers`` processes.

With ``--prepared DIR`` (a ``memorywalker demo --seeds N --out DIR`` of the same sizes) each seed's
stages 1-3 are read from ``DIR/seed-S`` instead of run again: the same config and seed give the same
warm start. An ``--rl`` variant that is one of that demo's methods with its default settings
(``tree-mask``, ``sdcc λ=1 (default)``) takes its GRPO result from the demo's ``results.json`` instead
of training again, and only after this sweep's own SFT of it reproduced the demo's per-task SFT rewards
exactly (refused otherwise: the reuse would not be the same run).

Variants:

* ``tree-mask`` — the exact method (the reference of every paired difference);
* ``sdcc`` with λ ∈ {0, 0.1, 1, 4, 16} (λ = 0: the full view's main loss and the summarization calls only);
* ``students=all`` — a student (KL row) for every selected call, not only the junctions;
* ``full-view+summaries`` — the full view keeps the harness's summaries where they first appear;
* ``compressed-main`` — a student's main loss on its own compressed S_t (what deployment shows), KL kept;
  with λ = 0 too; with ``students=all`` every call's main loss is on its own S_t (the exact methods'
  main loss) and the KL to the full view is added on top; with λ = 0 as well that is the exact methods'
  loss computed through SDCC's layout (a control: it should track tree-mask).

Writes ``OUT/seed-S/...`` (every run and evaluated episode), ``OUT/sweep.json`` (per seed, variant and
harness: the rewards per task, and the GRPO steps' metrics) and ``OUT/sweep.md`` (mean reward over tasks
with its bootstrap 95 % interval per seed, mean ± sd over seeds, and the paired difference against
tree-mask pooled over seeds; after SFT, then after GRPO).
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
    "sdcc λ=0.1": ("sdcc", {"sdcc_lambda": 0.1}),
    "sdcc λ=1 (default)": ("sdcc", {}),
    "sdcc λ=4": ("sdcc", {"sdcc_lambda": 4.0}),
    "sdcc λ=16": ("sdcc", {"sdcc_lambda": 16.0}),
    "sdcc students=all": ("sdcc", {"sdcc_students": "all"}),
    "sdcc full-view+summaries": ("sdcc", {"sdcc_full_view_artifacts": True}),
    "sdcc compressed-main": ("sdcc", {"sdcc_compressed_main": True}),
    "sdcc compressed-main λ=0": ("sdcc", {"sdcc_compressed_main": True, "sdcc_lambda": 0.0}),
    "sdcc compressed-main students=all": ("sdcc", {"sdcc_compressed_main": True, "sdcc_students": "all"}),
    # its control: every call's main loss on its own S_t and no KL, the exact methods' loss
    "sdcc compressed-main students=all λ=0": ("sdcc", {"sdcc_compressed_main": True, "sdcc_students": "all",
                                                       "sdcc_lambda": 0.0}),
}
RL_STEP_KEYS = ("reward_mean", "groups_with_signal", "logprob_abs_diff", "eps_kl_mean")


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label).strip("-").replace("--", "-")


def prepared(src: Path, seed_out: Path, cfg) -> dict:
    """Stages 1-3 of a demo run in ``src`` (kit, expert episodes, warm start), linked into ``seed_out``,
    and the methods that run has GRPO results of; refused unless that run's config is ``cfg``."""
    from dataclasses import asdict

    doc = json.loads((src / "results.json").read_text())
    differ = sorted(k for k, v in json.loads(json.dumps(asdict(cfg))).items() if doc["config"].get(k) != v)
    if differ:
        raise SystemExit(f"{src}: a demo run with other settings ({', '.join(differ)}): run it without --prepared")
    seed_out.mkdir(parents=True, exist_ok=True)
    for name in ("kit", "expert.jsonl"):
        if not (seed_out / name).exists():
            (seed_out / name).symlink_to((src / name).resolve())
    return {"warm_dir": str((src / "warm" / "final").resolve()), "warm_loss": doc["warm_loss"],
            "methods": {m: r for m, r in doc["methods"].items() if "rl" in r}, "results": str(src / "results.json")}


def run(seeds: list[int], out: Path, workers: int, quick: bool, variants: list[str],
        rl_variants: tuple[str, ...] | list[str] = (), prepared_dir: Path | None = None) -> dict:
    from memorywalker.recipes.demo import FULL, QUICK, MethodJob, map_jobs, prepare

    base = QUICK if quick else FULL
    doc: dict = {"config": {"seeds": seeds, "quick": quick, "variants": {v: VARIANTS[v] for v in variants},
                            "rl": list(rl_variants), "prepared": None if prepared_dir is None else str(prepared_dir)},
                 "runs": {}}
    jobs, keys, reused = [], [], {}  # keys[i] = (seed, variant) of jobs[i]; reused[(seed, v)] = (demo result, its file)
    t0 = time.perf_counter()
    for seed in seeds:
        cfg = replace(base, seed=seed)
        seed_out = out / f"seed-{seed}"
        if prepared_dir is None:
            prep = prepare(cfg, seed_out, progress=False)
        else:
            prep = prepared(prepared_dir / f"seed-{seed}", seed_out, cfg)
        doc["runs"][str(seed)] = {"results": {}, "warm_loss": prep["warm_loss"]}
        for v in variants:
            method, fields = VARIANTS[v]
            rl = v in rl_variants
            if rl and prepared_dir is not None and not fields and method in prep["methods"]:
                reused[(seed, v)], rl = (prep["methods"][method], prep["results"]), False
            jobs.append(MethodJob(replace(cfg, **fields), str(seed_out), method, prep["warm_dir"], rl=rl, label=slug(v)))
            keys.append((seed, v))
    order = sorted(range(len(jobs)), key=lambda i: not jobs[i].rl)  # the long GRPO jobs first
    for i, (res, line) in zip(order, map_jobs([jobs[i] for i in order], workers), strict=True):
        seed, v = keys[i]
        entry = {"sft": _per_harness(res["sft"]), "sft_seconds": res["sft_seconds"]}
        if (seed, v) in reused:
            demo, source = reused[(seed, v)]
            if _per_harness(demo["sft"])["rewards"] != entry["sft"]["rewards"]:
                raise SystemExit(f"seed {seed} {v}: this SFT did not reproduce the demo's per-task rewards in "
                                 f"{source}: its GRPO result is not this run's; rerun without --prepared")
            res = {**res, "rl": demo["rl"], "rl_steps": demo["rl_steps"], "rl_seconds": demo["rl_seconds"]}
            entry["rl_from"] = source
        if "rl" in res:
            entry.update(rl=_per_harness(res["rl"]), rl_seconds=res["rl_seconds"],
                         rl_steps={k: res["rl_steps"].get(k) for k in RL_STEP_KEYS})
        doc["runs"][str(seed)]["results"][v] = entry
        print(f"seed {seed} {line}" + (" (GRPO: the demo's, SFT reproduced)" if (seed, v) in reused else ""), flush=True)
        (out / "sweep.json").write_text(json.dumps(doc, indent=1))
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "sweep.json").write_text(json.dumps(doc, indent=1))
    return doc


def _per_harness(evaluation: dict) -> dict:
    """{"rewards": {harness: [reward per task]}, "gap": {harness: nats/token}} of one evaluation."""
    return {"rewards": {h: r["rewards"] for h, r in evaluation.items()}, "gap": {h: r["gap"] for h, r in evaluation.items()}}


def table(doc: dict, stage: str = "sft") -> str:
    """Per harness: each variant's mean reward over tasks [bootstrap 95 % interval] per seed, the mean ±
    sd of those means over seeds, and its paired difference against tree-mask, the tasks of every seed
    pooled. ``stage``: "sft" or "rl" (the variants that have it; tree-mask must be one of them)."""
    from memorywalker.metrics.report import markdown_table, mean_sd
    from memorywalker.metrics.stats import paired_bootstrap

    seeds = list(doc["runs"])
    results = {v: [doc["runs"][s]["results"].get(v, {}).get(stage) for s in seeds] for v in doc["config"]["variants"]}
    variants = [v for v, per_seed in results.items() if all(per_seed)]
    if "tree-mask" not in variants:
        return ""
    harnesses = list(results["tree-mask"][0]["rewards"])
    after = {"sft": "SFT", "rl": "GRPO"}[stage]
    out = []
    for h in harnesses:
        head = ["variant", *(f"seed {s}" for s in seeds), "mean ± sd over seeds", "− tree-mask (paired, all seeds)"]
        rows = []
        for v in variants:
            per_seed = [r["rewards"][h] for r in results[v]]
            cells = []
            for x in per_seed:
                m, lo, hi = paired_bootstrap(x)
                cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
            mean, sd = mean_sd([np.mean(x) for x in per_seed])
            diff = "—"
            if v != "tree-mask":
                d = np.concatenate([np.subtract(x, ref["rewards"][h]) for x, ref in zip(per_seed, results["tree-mask"],
                                                                                         strict=True)])
                m, lo, hi = paired_bootstrap(d)
                diff = f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            rows.append([f"`{v}`", *cells, f"{mean:.3f} ± {sd:.3f}", diff])
        tasks = len(results["tree-mask"][0]["rewards"][h])
        out.append(f"Held-out reward after {after} under `{h}` ({tasks} tasks per seed, mean [bootstrap 95 % interval]):"
                   "\n\n" + markdown_table(head, rows))
    return "\n\n".join(out)


def steps_table(doc: dict) -> str:
    """The GRPO variants' training rollouts: each step's metric, mean over seeds, first and last steps."""
    from memorywalker.metrics.report import markdown_table

    seeds = list(doc["runs"])
    rows = []
    for v in doc["config"]["variants"]:
        per_seed = [doc["runs"][s]["results"].get(v, {}).get("rl_steps") for s in seeds]
        if not all(per_seed):
            continue
        cells = []
        for k in RL_STEP_KEYS:
            series = np.array([[np.nan if x is None else x for x in st[k]] for st in per_seed], dtype=float)
            if np.isnan(series).all():
                cells.append("—")
                continue
            mean = np.nanmean(series, axis=0)
            cells.append(f"{mean[0]:.3f} → {mean[-1]:.3f} (min {np.nanmin(mean):.3f}, max {np.nanmax(mean):.3f})")
        rows.append([f"`{v}`", *cells])
    if not rows:
        return ""
    head = ["variant", "rollout reward", "groups with reward variance", "train/rollout gap (nats/token)",
            "eps_kl (junction mean)"]
    return "GRPO's own rollouts (first step → last step, each the mean over seeds):\n\n" + markdown_table(head, rows)


def merge(docs: list[dict]) -> dict:
    """Several sweeps of the same seeds as one (variants in ``VARIANTS`` order). A variant in more than
    one of them must have the same per-task SFT rewards in each (the runs are deterministic: a difference
    means they were not the same configuration); its entry with GRPO results is kept."""
    seeds = [list(d["runs"]) for d in docs]
    if any(s != seeds[0] for s in seeds) or len({d["config"]["quick"] for d in docs}) != 1:
        raise SystemExit(f"sweeps of different seeds or sizes: {seeds}")
    names = {v for d in docs for v in d["config"]["variants"]}
    doc = {"config": {"seeds": [int(s) for s in seeds[0]], "quick": docs[0]["config"]["quick"],
                      "variants": {v: VARIANTS[v] for v in VARIANTS if v in names},
                      "rl": [v for v in VARIANTS if any(v in d["config"]["rl"] for d in docs)],
                      "merged": len(docs)}, "runs": {}}
    for s in seeds[0]:
        results: dict = {}
        for d in docs:
            for v, entry in d["runs"][s]["results"].items():
                if v in results and results[v]["sft"]["rewards"] != entry["sft"]["rewards"]:
                    raise SystemExit(f"seed {s} {v}: the sweeps' SFT rewards differ: not the same configuration")
                if v not in results or ("rl" in entry and "rl" not in results[v]):
                    results[v] = entry
        doc["runs"][s] = {"results": results, "warm_loss": docs[0]["runs"][s]["warm_loss"]}
    return doc


def tables(doc: dict) -> str:
    return "\n\n".join(t for t in (table(doc, "sft"), table(doc, "rl"), steps_table(doc)) if t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="runs/sdcc-sweep")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the demo's quick sizes (checks the script, not SDCC)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated labels of VARIANTS")
    ap.add_argument("--rl", default="", help="comma-separated labels of variants that go on to GRPO")
    ap.add_argument("--prepared", type=Path, default=None, help="a demo --seeds output dir: reuse its stages 1-3")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="SWEEP_DIR",
                    help="train nothing: merge these sweeps' sweep.json into OUT's sweep.json and sweep.md")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        doc = merge([json.loads((d / "sweep.json").read_text()) for d in args.merge])
        (out / "sweep.json").write_text(json.dumps(doc, indent=1))
        (out / "sweep.md").write_text(tables(doc) + "\n")
        print(tables(doc))
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    rl_variants = [v.strip() for v in args.rl.split(",") if v.strip()]
    unknown = [v for v in variants + rl_variants if v not in VARIANTS]
    if unknown or "tree-mask" not in variants:
        raise SystemExit(f"unknown variants {unknown} (tree-mask is required); valid: {list(VARIANTS)}")
    variants += [v for v in rl_variants if v not in variants]
    if rl_variants and "tree-mask" not in rl_variants:
        rl_variants.insert(0, "tree-mask")  # the reference of the paired differences after GRPO
    doc = run([int(s) for s in args.seeds.split(",")], out, args.workers, args.quick, variants, rl_variants,
              args.prepared)
    text = tables(doc)
    (out / "sweep.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
