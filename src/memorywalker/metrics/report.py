"""The demo's report: statistics over held-out tasks and seeds, the Markdown tables the README quotes,
PNG plots and an HTML page. Pure functions of the results dict ``recipes/demo.py`` writes.

>>> _ci((0.25, 0.1, 0.4)), _ci((-0.05, -0.2, 0.1))
('0.250 [0.100, 0.400]', '-0.050 [-0.200, +0.100]')
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np

from memorywalker.metrics.gap import fmt_metric as _fmt
from memorywalker.metrics.stats import paired_bootstrap

REFERENCE = "tree-mask"  # paired differences are against this exact method
STAGES = ("sft", "rl")


def summarize(doc: dict) -> dict:
    """Per harness and method: mean reward with a bootstrap 95 % interval over tasks after SFT and after
    RL, the paired difference against ``tree-mask`` (each stage) and of RL against SFT. A method without
    GRPO (``DemoConfig.rl_methods``) has the SFT entries only."""
    methods = doc["methods"]
    out: dict[str, dict] = {}
    for h in doc["config"]["harnesses"]:
        rows = {}
        for m, r in methods.items():
            row = {}
            for stage in (s for s in STAGES if s in r):
                x = r[stage][h]["rewards"]
                row[stage] = paired_bootstrap(x)  # the mean and its interval (tasks resampled)
                if m != REFERENCE and stage in methods.get(REFERENCE, {}):
                    ref = methods[REFERENCE][stage][h]["rewards"]
                    row[f"{stage}_vs_{REFERENCE}"] = paired_bootstrap(np.subtract(x, ref))
            if "rl" in r:
                row["rl_minus_sft"] = paired_bootstrap(np.subtract(r["rl"][h]["rewards"], r["sft"][h]["rewards"]))
            rows[m] = row
        out[h] = rows
    return out


CLAIM_HARNESS = "claude-code"  # the summarizing harness, where conditioning on unseen text costs most
VERDICT = {True: "holds", False: "**does not hold**"}  # a conclusion's cell in the table (and read back)


def claims(doc: dict) -> list[dict]:
    """The demo's conclusions, each checked on this run: ``{"claim", "holds", "evidence"}``.

    * the pretraining learns to copy (its last check on held-out copy rows reached
      ``pretrain_copy_target``), measured again on rows at transcript positions;
    * the warm start copies (its last copy check met :func:`warm_copies`' targets on the act calls of
      uncompressed episodes and on summaries): without it the model cannot carry a code and nothing
      below is about conditioning;
    * under ``claude-code`` after SFT, ``tree-mask`` above ``dfs`` (trained to read text its contexts no
      longer held): the paired interval of (dfs − tree-mask) lies below 0;
    * not ``rightmost``: it trains the last path of each episode, the answer in the context it was given,
      and drops the calls before the last compaction; whether that costs reward is a property of the
      task and, here, of the seed: below tree-mask on three seeds of five, level or above on two, after
      SFT and after GRPO alike (README, docs/demo-robustness.md); the headline reports its paired
      difference over seeds;
    * RL − SFT for ``tree-mask`` under ``claude-code`` is ≥ 0 (its mean).

    >>> doc = {"config": {"warm_copy_target": 0.9, "warm_summary_target": 0.5},
    ...        "warm_copy_checks": [[100, 0.5, 0.2], [200, 0.95, 0.62]],
    ...        "summary": {"claude-code": {"tree-mask": {"rl_minus_sft": (0.05, -0.02, 0.1)},
    ...                                    "dfs": {"sft_vs_tree-mask": (-0.4, -0.5, -0.3)}}}}
    >>> [(c["holds"], c["evidence"]) for c in claims(doc)]
    [(True, 'copy accuracy 0.950 in act calls (target 0.90), 0.620 in summaries (target 0.50) at step 200'), (True, 'dfs − tree-mask -0.400 [-0.500, -0.300]'), (True, 'RL − SFT +0.050 [-0.020, +0.100]')]
    """
    out = []
    near = doc.get("pretrain_near_checks") or []
    if near:
        step, acc = near[-1]
        target = doc["config"]["pretrain_copy_target"]
        out.append({"claim": "the pretraining learns to copy", "holds": acc >= target,
                    "evidence": f"held-out copy rows {acc:.3f} at step {step} (target {target:.2f}); "
                                f"{doc['pretrain_copy_accuracy']:.3f} up to "
                                f"{doc['config']['pretrain_max_offset']} tokens in"})
    checks = doc.get("warm_copy_checks") or []
    if checks:
        step, *acc = checks[-1]
        targets = _warm_targets(doc["config"])
        where = ", ".join(f"{a:.3f} in {s} (target {t:.2f})"
                          for a, s, t in zip(acc, ("act calls", "summaries"), targets, strict=False))
        out.append({"claim": "the warm start copies", "holds": warm_copies(doc["config"], checks[-1]),
                    "evidence": f"copy accuracy {where} at step {step}"})
    rows = doc["summary"].get(CLAIM_HARNESS, {})
    d = rows.get("dfs", {}).get(f"sft_vs_{REFERENCE}")
    if d is not None:
        out.append({"claim": f"`{REFERENCE}` above `dfs` after SFT under `{CLAIM_HARNESS}`", "holds": d[2] < 0,
                    "evidence": f"dfs − {REFERENCE} {_ci(d)}"})
    if "rl_minus_sft" in rows.get(REFERENCE, {}):
        d = rows[REFERENCE]["rl_minus_sft"]
        out.append({"claim": f"RL − SFT ≥ 0 for `{REFERENCE}` under `{CLAIM_HARNESS}`", "holds": d[0] >= 0,
                    "evidence": f"RL − SFT {_ci(d)}"})
    return out


def warm_copies(config: dict, check: list) -> bool:
    """Whether a warm-start copy check ``[step, act calls, summaries]`` meets the targets of ``config``
    (``[step, act calls]``: a run without summaries, or one from before 2026-12-04 that checked codes only).

    >>> warm_copies({"warm_copy_target": 0.85, "warm_summary_target": 0.5}, [1200, 0.99, 0.45])
    False
    """
    return all(a >= t for a, t in zip(check[1:], _warm_targets(config), strict=False))


def _warm_targets(config: dict) -> tuple[float, float]:
    return config["warm_copy_target"], config.get("warm_summary_target", 0.0)


def claims_table(doc: dict) -> str:
    """:func:`claims` as a Markdown table."""
    return markdown_table(["conclusion", "this run", "evidence"],
                          [[c["claim"], VERDICT[c["holds"]], c["evidence"]]
                           for c in claims(doc)])


def last_stage(result: dict) -> str:
    """``"rl"`` for a method that had GRPO, else ``"sft"``."""
    return "rl" if "rl" in result else "sft"


def number(v) -> float:
    if v is None:
        return float("nan")
    return float(v.item()) if hasattr(v, "item") else float(v)


def _ci(t) -> str:
    mean, low, high = t
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]" if low < 0 or mean < 0 else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of string cells.

    >>> print(markdown_table(["a", "b"], [["1", "2"]]))
    | a | b |
    |---|---|
    | 1 | 2 |
    """
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(r) + " |" for r in rows)])


def mean_sd(values) -> tuple[float, float]:
    """Mean and sample sd (ddof 1; NaN for one value) of per-seed numbers.

    >>> mean_sd([0.5, 1.0])[0], round(mean_sd([0.5, 1.0])[1], 4)
    (0.75, 0.3536)
    """
    x = np.asarray(values, dtype=np.float64)
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else float("nan")


def results_table(doc: dict) -> str:
    """The demo's tables in Markdown (what ``DIR/table.md`` holds and the README quotes)."""
    out = []
    if claims(doc):
        out.append("Conclusions, checked on this run:\n\n" + claims_table(doc))
    for h, rows in doc["summary"].items():
        head = ["method", "reward after SFT", "after RL", "RL − SFT (paired)", f"SFT − {REFERENCE}",
                f"RL − {REFERENCE}"]
        body = [[f"`{m}`", *(_ci(r[k]) if k in r else "—" for k in
                             ("sft", "rl", "rl_minus_sft", f"sft_vs_{REFERENCE}", f"rl_vs_{REFERENCE}"))]
                for m, r in rows.items()]
        out.append(f"Held-out reward under `{h}` ({len(doc['tasks'])} tasks, mean [bootstrap 95 % interval]; "
                   f"— : no GRPO):\n\n" + markdown_table(head, body))
    head = ["method", "model",
            *(f"{h}: {k}" for h in doc["config"]["harnesses"] for k in ("gap", "heavy", "floor", "targets"))]
    body = [[f"`{m}`", last.upper(),
             *(str(r[last][h][k]) if k == "targets" else _fmt(r[last][h]["gap" if k == "gap" else f"gap_{k}"])
               for h in doc["config"]["harnesses"] for k in ("gap", "heavy", "floor", "targets"))]
            for m, r in doc["methods"].items() for last in [last_stage(r)]]
    out.append("Train/rollout gap (mean |logp_train − logp_rollout| per target) of each method's last model (after "
               "RL, or after SFT without GRPO) on its own held-out episodes; heavy = 2+ branches before the call, "
               "floor = none:\n\n" + markdown_table(head, body))
    if "rl_steps" in doc["methods"].get("sdcc", {}):
        s = doc["methods"]["sdcc"]["rl_steps"]
        dfs = doc["methods"].get("dfs", {}).get("rl_steps", {}).get("logprob_abs_diff")
        head = ["RL step", "sdcc eps_kl", "sqrt(eps_kl/2)", "sdcc gap", *(["dfs gap"] if dfs else [])]
        body = [[str(i + 1), _fmt(e), _fmt(math.sqrt(e / 2) if e == e else None), _fmt(g), *([_fmt(dfs[i])] if dfs else [])]
                for i, (e, g) in enumerate(zip(s["eps_kl_mean"], s["logprob_abs_diff"], strict=True))]
        out.append("SDCC during RL (on each step's rollouts):\n\n" + markdown_table(head, body))
    return "\n\n".join(out)


def times_table(doc: dict) -> str:
    """Wall seconds per stage of a run (Markdown): kit, pretraining, expert episodes, warm start, the
    methods side by side (and each method's SFT, evaluation, GRPO, evaluation in its own worker), report.

    >>> doc = {"stage_seconds": {"pretraining": 200.0, "methods (side by side)": 50.0}, "seconds_total": 260.0,
    ...        "methods": {"m": {"seconds": {"SFT": 30.0, "SFT eval": 20.0}}}}
    >>> print(times_table(doc))
    | stage | seconds |
    |---|---|
    | pretraining | 200 |
    | methods (side by side) | 50 |
    | `m`: SFT / SFT eval | 30 / 20 |
    | total | 260 (4.3 min) |
    """
    rows = []
    for stage, sec in doc.get("stage_seconds", {}).items():
        rows.append([stage, f"{sec:.0f}"])
        if stage.startswith("methods"):
            rows += [[f"`{m}`: " + " / ".join(r["seconds"]), " / ".join(f"{v:.0f}" for v in r["seconds"].values())]
                     for m, r in doc["methods"].items() if "seconds" in r]
    rows.append(["total", f"{doc['seconds_total']:.0f} ({doc['seconds_total'] / 60:.1f} min)"])
    return markdown_table(["stage", "seconds"], rows)


def write_report(doc: dict, out: Path) -> None:
    """PNG plots (reward with intervals for SFT and RL, gap by branches, SDCC over steps), index.html and
    table.md."""
    import matplotlib  # lazy: only for the plots; Agg is set here, before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg")

    def save(fig, name: str) -> None:  # lay out, write and close one figure
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)

    methods = list(doc["methods"])
    harnesses = doc["config"]["harnesses"]
    x = np.arange(len(methods))

    fig, axes = plt.subplots(1, len(harnesses), figsize=(5.5 * len(harnesses), 3.8), squeeze=False)
    for ax, h in zip(axes[0], harnesses, strict=True):
        for k, (stage, color) in enumerate((("sft", "tab:blue"), ("rl", "tab:green"))):
            nan = (math.nan,) * 3  # a method without GRPO: no RL bar
            stats = [doc["summary"][h][m].get(stage, nan) for m in methods]
            mean = np.array([s[0] for s in stats])
            err = np.array([[s[0] - s[1] for s in stats], [s[2] - s[0] for s in stats]])
            ax.bar(x + (k - 0.5) * 0.38, mean, 0.38, yerr=err, capsize=3, color=color, label=stage.upper())
        ax.set_xticks(x, methods, rotation=20)
        ax.set_ylim(0, 1)
        ax.set_ylabel("held-out reward (95 % bootstrap interval)")
        ax.set_title(f"reward under {h}")
        ax.legend(fontsize=8)
    save(fig, "reward.png")

    buckets = ["0", "1", "2", "3+"]
    fig, axes = plt.subplots(1, len(harnesses), figsize=(5.5 * len(harnesses), 3.8), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    for ax, h in zip(axes[0], harnesses, strict=True):
        for i, m in enumerate(methods):
            r = doc["methods"][m]
            vals = [r[last_stage(r)][h]["gap_by_branches"].get(b) for b in buckets]
            ax.bar(np.arange(4) + i * width, [np.nan if v is None else max(v, 1e-9) for v in vals], width, label=m)
        ax.set_xticks(np.arange(4) + width * (len(methods) - 1) / 2, [f"{b} branches" for b in buckets])
        ax.set_yscale("log")
        ax.set_ylabel("mean |logp_train − logp_rollout|")
        ax.set_title(f"gap by branches before the call ({h}; last model)")
        ax.legend(fontsize=7)
    save(fig, "gap_by_branches.png")

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for m in (m for m in methods if "rl_steps" in doc["methods"][m]):
        ys = [max(v, 1e-9) for v in doc["methods"][m]["rl_steps"]["logprob_abs_diff"]]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{m} gap")
    if "rl_steps" in doc["methods"].get("sdcc", {}):
        eps = doc["methods"]["sdcc"]["rl_steps"]["eps_kl_mean"]
        ax.plot(range(1, len(eps) + 1), eps, "k--", label="sdcc eps_kl")
        ax.plot(range(1, len(eps) + 1), [math.sqrt(e / 2) for e in eps], "k:", label="sqrt(eps_kl/2)")
    ax.set_yscale("log")
    ax.set_xlabel("RL step")
    ax.set_title("gap on each step's rollouts; SDCC's eps_kl")
    ax.legend(fontsize=7)
    save(fig, "gap_over_steps.png")

    table = results_table(doc)
    (out / "table.md").write_text(table + "\n")
    (out / "index.html").write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>memorywalker demo</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} pre{{background:#f4f4f4;padding:1em}}</style>
</head><body>
<h1>memorywalker demo</h1>
<p>One tiny model per method: SFT from a shared warm start on expert episodes under
{", ".join(harnesses)}, then GRPO from that checkpoint; evaluated on the same held-out tasks. Total
{doc.get('seconds_total', 0)} s.</p>
<pre>{html.escape(table)}</pre>
<h2>Reward</h2><img src="reward.png" alt="reward per method">
<h2>Gap by branches</h2><img src="gap_by_branches.png" alt="gap by branches">
<h2>Gap over RL steps</h2><img src="gap_over_steps.png" alt="gap over steps">
<p>Raw numbers: <a href="results.json">results.json</a>.</p>
</body></html>
""")
