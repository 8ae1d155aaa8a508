"""Closed-loop evaluation: run a checkpoint (and a baseline) on suites, count every trial, compare paired.

    memorywalker eval --model runs/demo/rl-sdcc/final --baseline runs/demo/sft/final \\
        --suites lookup,bridge --compressor claude-code --n 16 --split test -o eval/

Every planned episode is a trial: the same tasks with the same per-episode seeds for the model and the
baseline (the plan of :func:`memorywalker.rollout.plan`), each written to ``DIR/<label>-<suite>.jsonl``.
The report (``DIR/report.json``) is computed from those episodes only
(:mod:`memorywalker.metrics.closed_loop`), so a test can recompute it; it pins what was evaluated (weights,
base, tokenizer and template hashes, decoding, compressor, environment). docs/eval.md defines every number.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table
from tqdm import tqdm

from memorywalker.errors import InputError
from memorywalker.metrics.closed_loop import (
    PAIRED_METRICS,
    failed_trial_row,
    paired_metric,
    summarize,
    trial_row,
)
from memorywalker.metrics.stats import bonferroni, z_of
from memorywalker.records import write_trajectories
from memorywalker.render import Renderer, RenderOptions
from memorywalker.rollout import (
    ENVIRONMENTS,
    EpisodeJob,
    HarnessConfig,
    WebSearchEnv,
    plan,
    run_episode,
    run_episodes,
)
from memorywalker.rollout.episodes.harness import call_seed
from memorywalker.samplers.hf import HFPolicy
from memorywalker.train.manifest import MANIFEST_NAME


@dataclass
class EvalConfig:
    """What is evaluated and how; every field lands in the report."""

    suites: tuple[str, ...] = ("lookup",)  # each is evaluated separately (retention: suites not trained on)
    compressor: str = "none"  # compression policy of the episodes (HarnessConfig.name; was `harness`)
    budget: int = HarnessConfig.budget  # context budget in prompt tokens the compressor keeps to
    max_steps: int = HarnessConfig.max_steps  # act calls per episode: running out is a failure (budget exhaustion)
    max_context: int = HarnessConfig.max_context  # hard context window: overflowing it is a failure
    n: int = 16  # tasks per suite
    samples: int = 1  # episodes per task (each its own seed)
    seed: int = 0  # run seed: the per-episode seeds derive from it, identically for model and baseline
    split: str | None = "test"  # task split evaluated (None: all)
    env: str = "websearch"  # environment (memorywalker.rollout.ENVIRONMENTS): websearch | vault
    world_seed: int = 0
    world_size: dict[str, int] = field(default_factory=dict)  # websearch only: World.generate's sizes
    temperature: float = 0.0  # decoding: 0 = greedy
    max_new_tokens: int = 128  # decoding: response length limit (hitting it = a truncated proposal)
    alpha: float = 0.05  # family-wise error level of the intervals
    resamples: int = 10_000  # paired bootstrap resamples
    device: str = "cpu"


@dataclass
class Candidate:
    """A policy to evaluate, its tokenizer, and the hashes that pin it."""

    label: str
    policy: Any
    tokenizer: Any
    pins: dict[str, Any]
    trained_suites: list[str] | None = None  # from the training manifest, when one is found


def load_candidate(spec: str, label: str, cfg: EvalConfig, *, tokenizer=None) -> Candidate:
    """``expert`` (the scripted solver; needs ``tokenizer``), a model directory, or an adapter directory
    (``adapter_manifest.json`` inside: its base is loaded from the manifest and checked by hash)."""
    if spec == "expert":
        if tokenizer is None:
            raise InputError("--model/--baseline expert needs --tokenizer DIR (or a model to take it from)")
        return Candidate(label, make_env(cfg).expert(), tokenizer, {"policy": "expert", **_tokenizer_pins(tokenizer)})
    import torch  # lazy: only to load a model (cli eval imports this before its checks)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: as torch

    from memorywalker.train.adapter import ADAPTER_MANIFEST, load_adapter  # lazy: pulls torch
    from memorywalker.train.refcache import weights_hash  # lazy: pulls torch

    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(2, "No such model directory", str(path))
    manifest_path = path / ADAPTER_MANIFEST
    pins: dict[str, Any] = {"policy": "hf", "path": str(path)}
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        base = AutoModelForCausalLM.from_pretrained(manifest["base_model"], dtype=torch.float32)
        model = load_adapter(base, path)  # refuses a base whose weights hash differs from the manifest's
        pins.update(adapter=str(path), base_model=manifest["base_model"], base_hash=manifest["base_model_hash"])
        tok_dir = path if (path / "tokenizer_config.json").is_file() else manifest["base_model"]
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok_dir = path
    model = model.to(cfg.device).eval()
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(tok_dir)
    pins["weights_hash"] = weights_hash(model)  # with an adapter: base + adapter tensors as evaluated
    pins.update(_tokenizer_pins(tok))
    policy = HFPolicy.from_model(model, tok, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    return Candidate(label, policy, tok, pins, _trained_suites(path))


def make_env(cfg: EvalConfig):
    """The environment ``cfg`` names (``world_size`` applies to the web-search world only)."""
    if cfg.env not in ENVIRONMENTS:
        raise InputError(f"unknown env {cfg.env!r}; valid: {', '.join(ENVIRONMENTS)}")
    if cfg.env == "websearch":
        return WebSearchEnv(cfg.world_seed, world_size=cfg.world_size or None)
    if cfg.world_size:
        raise InputError(f"world_size applies to env websearch only, not {cfg.env}")
    return ENVIRONMENTS[cfg.env](world_seed=cfg.world_seed)


def _tokenizer_pins(tok) -> dict[str, str]:
    from memorywalker.train.refcache import template_hash, tokenizer_hash  # lazy: pulls torch

    return {"tokenizer_hash": tokenizer_hash(tok), "template_hash": template_hash(tok)}


def _trained_suites(model_dir: Path) -> list[str] | None:
    """The suite an RL run trained on, from ``<run>/training_manifest.json`` next to ``<run>/final``."""
    path = model_dir.parent / MANIFEST_NAME
    if not path.is_file():
        return None
    suite = (json.loads(path.read_text()).get("config") or {}).get("suite")
    return [suite] if suite else []


# --- running --------------------------------------------------------------------------------------------

def play(env, jobs: list, policy, tokenizer, harness, *, lockstep: bool = False) -> list:
    """The episodes of ``jobs`` (:class:`~memorywalker.rollout.EpisodeJob`) under ``harness``, in job order.

    ``lockstep``: all episodes at once with batched model calls (:func:`memorywalker.rollout.run_episodes`;
    an HF policy), an error in any raised after the others end. Otherwise one by one, and an episode
    whose policy backend fails for good (an endpoint timeout or dropped connection) is that error in the
    list instead of a trajectory: a failed trial, never dropped."""
    if lockstep:
        return run_episodes(env, jobs, policy, tokenizer, harness)
    out = []
    for job in jobs:
        try:
            out.append(run_episode(env, job.task, policy, tokenizer, harness, seed=job.seed,
                                   episode_id=job.episode_id, meta=job.meta))
        except (ConnectionError, TimeoutError) as err:  # EndpointError is a ConnectionError
            out.append(err)
    return out


def run_suite(env, cand: Candidate, harness, cfg: EvalConfig, suite: str, out: Path) -> list[dict[str, Any]]:
    """Run every planned episode of ``suite``; write the finished ones to ``out``; return one row per trial
    (a failed trial too, :func:`play`)."""
    episodes = plan(env, suite, cfg.n, seed=cfg.seed, harness=harness.name, split=cfg.split, samples=cfg.samples)
    jobs = [e.with_meta({"run_seed": cfg.seed, "sample": e.sample, "eval": cand.label}) for e in episodes]
    rows, trajs = [], []
    for e, result in zip(episodes, play(env, jobs, cand.policy, cand.tokenizer, harness), strict=True):
        if isinstance(result, BaseException):
            rows.append(failed_trial_row(e.episode_id, e.task.id, e.sample, f"{type(result).__name__}: {result}"))
            continue
        trajs.append(result)
        rows.append(trial_row(result))
    write_trajectories(out, trajs)
    return rows


def heldout(model, tokenizer, env, harnesses: dict, tasks: list, method: str, *, seed: int, max_new_tokens: int,
            out: Path) -> dict[str, dict]:
    """Greedy episodes of ``tasks`` under each harness (in lockstep), written to ``OUT-<harness>.jsonl``
    (``memorywalker gap`` re-measures them): the reward per task, the mean evictions, and ``method``'s
    train/rollout gap on them (overall, heavy, floor, by branches) and the calls it left out, by reason.
    The demo's evaluation."""
    from memorywalker.metrics.gap import gap_report  # lazy: pulls torch

    renderer = Renderer(tokenizer, RenderOptions(truncated="prefix"))
    policy = HFPolicy.from_model(model, tokenizer, temperature=0.0, max_new_tokens=max_new_tokens)
    result: dict[str, dict] = {}
    for name, h in harnesses.items():
        jobs = [EpisodeJob(t, call_seed(seed + 1, t.id), f"{t.id}-{name}") for t in tasks]
        episodes = play(env, jobs, policy, tokenizer, h, lockstep=True)
        write_trajectories(out.with_name(f"{out.name}-{name}.jsonl"), episodes)
        left_out = Counter()
        gap = gap_report(model, renderer, episodes, [method], drift=False, left_out=left_out)[method]
        result[name] = {
            "rewards": [float(t.reward or 0.0) for t in episodes],
            "evictions": float(np.mean([len(t.evictions) for t in episodes])),
            "gap": gap["overall"]["logprob_abs_diff"], "gap_heavy": gap["heavy"]["logprob_abs_diff"],
            "gap_floor": gap["floor"]["logprob_abs_diff"], "targets": gap["overall"]["targets"],
            "gap_by_branches": {k: v["logprob_abs_diff"] for k, v in gap["by_branches"].items()},
            "calls_left_out": dict(sorted(left_out.items())),
        }
    return result


def evaluate(cfg: EvalConfig, model: Candidate, out: str | Path, baseline: Candidate | None = None,
             *, progress: bool = False) -> dict[str, Any]:
    """Run ``model`` (and ``baseline``) on every suite; write episodes and ``report.json``; return the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    harness = HarnessConfig.of(cfg)
    env = make_env(cfg)
    cands = [c for c in (model, baseline) if c is not None]
    rows: dict[str, dict[str, list]] = {c.label: {} for c in cands}
    bar = None
    if progress:
        bar = tqdm(total=len(cands) * len(cfg.suites), desc="eval", unit="suite")
    for suite in cfg.suites:
        for c in cands:
            rows[c.label][suite] = run_suite(env, c, harness, cfg, suite, out / f"{c.label}-{suite}.jsonl")
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    report = build_report(cfg, rows, {c.label: c for c in cands}, env_config=env.config(),
                          harness_config=asdict(harness))
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


# --- the report (pure over trial rows) --------------------------------------------------------------------

def build_report(cfg: EvalConfig, rows: dict[str, dict[str, list[dict]]], cands: dict[str, Candidate], *,
                 env_config: dict, harness_config: dict) -> dict[str, Any]:
    """Per model and suite: the summary numbers; with a baseline, the paired difference per suite at the
    Bonferroni level alpha / (number of suites): of acceptance, and beside it of cost (act calls, tokens)
    and validity (the share of malformed proposals) per trial, at the same level (not corrected across
    metrics: acceptance is the test, the others say at what price). Seeds within a task are resampled
    too where a task has several (:func:`~memorywalker.metrics.stats.paired_bootstrap_nested`)."""
    labels = list(rows)
    m = len(cfg.suites)
    alpha_each = bonferroni(cfg.alpha, m)
    models = {}
    for label in labels:
        c = cands[label]
        trained = c.trained_suites
        models[label] = {
            "pins": c.pins,
            "decoding": c.policy.config(),
            "trained_suites": trained,
            "suites": {s: {**summarize(rows[label][s], z=z_of(cfg.alpha)),
                           "held_out": None if trained is None else s not in trained,
                           "trials_detail": rows[label][s]}
                       for s in cfg.suites},
        }
    report: dict[str, Any] = {
        "config": asdict(cfg),
        "environment": env_config,
        "compressor": harness_config,
        "models": models,
    }
    if len(labels) == 2:
        a, b = labels
        paired = {metric: {s: paired_metric(rows[a][s], rows[b][s], metric, alpha=alpha_each,
                                            resamples=cfg.resamples, seed=cfg.seed) for s in cfg.suites}
                  for metric in PAIRED_METRICS}
        report["paired"] = {"model": a, "baseline": b, "metric": "acceptance", "comparisons": m,
                            "alpha_family": cfg.alpha, "alpha_each": alpha_each,
                            "level": 1 - alpha_each, "suites": paired.pop("acceptance"), "secondary": paired}
    return report


def report_tables(report: dict[str, Any]):
    """The report as rich tables: per model and suite, then the paired comparison."""
    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    def cost(x: float | None, total: int) -> str:
        return f"{x:.1f}" if x is not None else f"0 accepted, total {total}"

    t = Table(title=f"memorywalker eval · compressor {report['compressor']['name']} · "
                    f"{int(100 * (1 - report['config']['alpha']))}% intervals")
    for col in ("model", "suite", "held out", "accepted", "acceptance [CI]", "valid", "malformed", "schema",
                "undeclared", "truncated", "exec err", "SFA", "PRE", "tokens/accepted", "turns/accepted"):
        t.add_column(col, justify="left" if col in ("model", "suite") else "right")
    for label, mod in report["models"].items():
        for suite, r in mod["suites"].items():
            v = r["validity_rate"]
            lo, hi = r["acceptance_ci"]
            held = "?" if r["held_out"] is None else ("yes" if r["held_out"] else "no")
            t.add_row(label, suite, held, f"{r['accepted']}/{r['trials']}",
                      f"{pct(r['acceptance'])} [{pct(lo)}, {pct(hi)}]",
                      *(pct(v[c]) for c in ("valid", "malformed_output", "schema_violation", "undeclared_tool",
                                           "truncated_proposal", "tool_execution_error")),
                      pct(r["sfa"]), pct(r["pre"]), cost(r["tokens_per_accepted"], r["tokens_total"]),
                      cost(r["turns_per_accepted"], r["turns_total"]))
    tables = [t]
    if "paired" in report:
        p = report["paired"]
        pt = Table(title=f"paired: {p['model']} - {p['baseline']} (acceptance, same tasks and seeds; "
                         f"{100 * p['level']:.2f}% = Bonferroni {p['alpha_family']}/{p['comparisons']})")
        for col in ("suite", "metric", "tasks", "seeds", "difference", "interval", "excludes 0"):
            pt.add_column(col, justify="left" if col in ("suite", "metric") else "right")
        rows = {"acceptance": p["suites"], **p.get("secondary", {})}
        for suite in p["suites"]:
            for metric, by_suite in rows.items():
                c = by_suite[suite]
                pct_of = metric in ("acceptance", "malformed")
                fmt = (lambda x: f"{100 * x:+.1f} pts") if pct_of else (lambda x: f"{x:+.1f}")
                pt.add_row(suite, metric, str(c["tasks"]), str(c.get("seeds", c["tasks"])), fmt(c["difference"]),
                           f"[{fmt(c['ci'][0])}, {fmt(c['ci'][1])}]", "yes" if c["significant"] else "no")
        tables.append(pt)
    return tables
