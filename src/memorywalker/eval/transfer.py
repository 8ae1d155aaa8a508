"""Transfer evaluation: closed-loop evaluation (``memorywalker.eval.evaluate``) in three regimes.

* ``new-tasks`` — held-out (test split) tasks on the familiar schema;
* ``renamed-schema`` — familiar (train split) tasks on a renamed and reordered schema (a schema map whose
  seed no augmented training record used);
* ``unfamiliar-tools`` — held-out tasks on a renamed interface padded with distractor tools and a
  different naming draw. Each environment has one tool family (web search: search / open / answer), so this
  regime is an approximation: an unfamiliar *interface*, not a different family of tools.

Each regime reports SFA, PRE and reward (acceptance) separately, from the same trial rows as ``eval``;
:func:`paired` compares two candidates per regime (per-task paired bootstrap).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from memorywalker.eval.evaluate import Candidate, EvalConfig, make_env, run_suite
from memorywalker.metrics.closed_loop import per_task_acceptance, summarize
from memorywalker.metrics.stats import paired_bootstrap, paired_differences, z_of
from memorywalker.rollout import HarnessConfig
from memorywalker.transforms.augment import AugmentedEnv, make_schema_map

HELD_OUT_SCHEMA_SEED = 10_000  # schema maps of augmented training data use seeds < 10_000


def regimes(env, schema_seed: int = HELD_OUT_SCHEMA_SEED) -> dict[str, tuple[Any, str]]:
    """regime -> (environment, split)."""
    renamed = make_schema_map(env.tools(), schema_seed, distractors=0)
    unfamiliar = make_schema_map(env.tools(), schema_seed + 1, distractors=4)
    return {"new-tasks": (env, "test"), "renamed-schema": (AugmentedEnv(env, renamed), "train"),
            "unfamiliar-tools": (AugmentedEnv(env, unfamiliar), "test")}


def transfer_rows(cand: Candidate, cfg: EvalConfig, out: str | Path) -> dict[str, dict[str, list[dict]]]:
    """Trial rows per regime and suite (episodes written to ``out/<label>-<regime>-<suite>.jsonl``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    harness = HarnessConfig(cfg.compressor, budget=cfg.budget, max_steps=cfg.max_steps, max_context=cfg.max_context)
    env = make_env(cfg)
    rows: dict[str, dict[str, list[dict]]] = {}
    for regime, (renv, split) in regimes(env).items():
        c = replace(cfg, split=split)
        rows[regime] = {s: run_suite(renv, cand, harness, c, s, out / f"{cand.label}-{regime}-{s}.jsonl")
                        for s in cfg.suites}
    return rows


def report(rows: dict[str, dict[str, list[dict]]], alpha: float = 0.05) -> dict[str, dict[str, Any]]:
    """Per regime (suites pooled): reward, SFA, PRE as ``summarize`` computes them."""
    return {r: summarize([x for s in by.values() for x in s], z=z_of(alpha)) for r, by in rows.items()}


def per_task_sfa(rows: list[dict]) -> dict[str, float]:
    """Schema-following accuracy per task (followed proposals / proposals; a task without one: 0)."""
    out: dict[str, list[int]] = {}
    for r in rows:
        f, p = out.setdefault(r["task"], [0, 0])
        out[r["task"]] = [f + r["sfa_followed"], p + sum(r["validity"].values())]
    return {t: (f / p if p else 0.0) for t, (f, p) in sorted(out.items())}


def paired(a: list[dict], b: list[dict], *, alpha: float, seed: int = 0) -> dict[str, Any]:
    """Paired per-task differences a - b of acceptance and SFA with bootstrap intervals at level 1 - alpha."""
    res = {}
    for name, fn in (("reward", per_task_acceptance), ("sfa", per_task_sfa)):
        d = paired_differences(fn(a), fn(b))
        mean, lo, hi = paired_bootstrap(d, alpha=alpha, resamples=10_000, seed=seed)
        res[name] = {"tasks": len(d), "difference": mean, "ci": [lo, hi]}
    return res
