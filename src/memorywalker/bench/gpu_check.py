"""The GPU check's plan, trees, time budget, ratios and table (``python scripts/gpu_check.py --out DIR``).

One prepared command for the minutes a lent GPU gives: the ``gpu``-marked tests, then
:func:`memorywalker.bench.engines.bench_groups` on a random model of a real shape, in fp32 and bf16,
on synthetic trees of given sizes (unique tokens U) and per-call/unique ratios (P/U), and on a real
Claude Code session from the shared fixtures. ``--tiny`` runs the same code at a tiny size on any
device, so the command keeps working between draws (``tests/test_gpu_check.py``).

Synthetic trees are calibrated, not guessed: one eviction (so the tree branches), the number of calls
found by bisection on P/U at short messages (P/U barely depends on their length), then the words per
message scaled until U is reached.

>>> ratios([{"method": "radix", "exact": "exact", "time_per_tree_s": 2.0},
...         {"method": "tree-mask", "exact": "exact", "time_per_tree_s": 3.0},
...         {"method": "per-call", "exact": "exact (reference)", "time_per_tree_s": 30.0},
...         {"method": "plain-causal", "exact": "limit", "time_per_tree_s": 1.0}])
{'best_exact': 'radix', 'best_vs_plain_causal': 2.0, 'per_call_vs_best': 15.0, 'tree_mask_vs_best': 1.5}
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from memorywalker.engine.methods import get_method, method_names
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.layout import Batch

BASELINE = "dfs"  # the naive baseline over the same unique tokens: how far from exact it is


def best_candidates() -> list[str]:
    """The exact methods a ratio may call "best": every registered exact one but the reference (per-call,
    extrapolated when sampled)."""
    return [m for m in method_names() if get_method(m).exactness == "exact"]


def methods() -> list[str]:
    """The timed methods, cheapest first so the time budget cuts the expensive ones: the exact ones,
    the baseline, then the reference (plain-causal is timed after them by the bench)."""
    reference = [m for m in method_names() if get_method(m).exactness == "exact (reference)"]
    return [*best_candidates(), BASELINE, *reference]


@dataclass(frozen=True)
class Plan:
    """What one run measures. ``full`` is sized for about 8 minutes on one H100; ``tiny`` for a CPU test."""

    shape: str  # a memorywalker.bench.shapes name; random weights, the kit tokenizer
    fields: dict  # config fields overridden (positions for long trees, fewer layers for tiny)
    dtypes: tuple[str, ...]
    sizes: tuple[int, ...]  # unique tokens of each synthetic tree
    ratios: tuple[float, ...]  # P/U of each synthetic tree
    fixture: str  # a Claude Code session under harness-logs/claude-code/
    fixture_calls: int | None  # its first N calls (None: all)
    sample_calls: int | None  # reference and per-call on this many calls, per-call extrapolated (None: all)
    max_tokens: int  # tokens per forward: radix chunk, tree-mask's packed buffer (longer trees fall back to radix)
    checkpoint_above: int  # radix recomputes chunk activations (checkpoint_chunks) when U exceeds this
    repeats: int
    warmup: int
    budget_s: float  # the benchmark part (tests and model building excluded)
    tolerance: dict = field(default_factory=dict)  # max |Δ logprob| of an exact method, per dtype


PLANS = {
    "full": Plan(shape="qwen2.5-0.5b", fields={"max_position_embeddings": 262144}, dtypes=("float32", "bfloat16"),
                 sizes=(8192, 32768, 131072), ratios=(14.0, 50.0),
                 fixture="ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl", fixture_calls=None, sample_calls=8,
                 max_tokens=32768, checkpoint_above=16384, repeats=2, warmup=1, budget_s=330.0,
                 # the CUDA tests' tolerances (tests/test_radix.py): kernels differ more than CPU ones
                 tolerance={"float32": 1e-4, "bfloat16": 5e-2}),
    "tiny": Plan(shape="kit", fields={}, dtypes=("float32", "bfloat16"), sizes=(1024,), ratios=(3.0, 6.0),
                 fixture="tool_heavy.jsonl", fixture_calls=3, sample_calls=None, max_tokens=2048,
                 checkpoint_above=1040, repeats=1, warmup=1, budget_s=600.0,
                 # DESIGN.md's fp32 contract; bf16 as tests/test_head.py
                 tolerance={"float32": 1e-5, "bfloat16": 1e-2}),
}


def _measure(renderer, turns: int, words: int, seed: int):
    """(rendered trajectory, U, P) of one synthetic episode with one eviction."""
    spec = SyntheticSpec(turns=turns, evictions=1, words=words, seed=seed)
    rt = renderer.render(synthetic_trajectory(spec, f"synthetic-{seed}"))
    unique = len(Batch.from_groups([[rt]]).trees[0])
    return rt, unique, sum(len(c.tokens) for c in rt.calls if c.targets)


def turns_for(renderer, ratio: float, seed: int = 0) -> int:
    """The calls of a one-eviction synthetic episode whose P/U first reaches ``ratio`` (bisection at one
    word per message: P/U grows with the calls, about calls / 3.4, and barely with the words)."""
    lo, hi = 2, int(4 * ratio) + 8
    while hi - lo > 1:
        mid = (lo + hi) // 2
        _, u, p = _measure(renderer, mid, 1, seed)
        lo, hi = (mid, hi) if p / u < ratio else (lo, mid)
    return hi


def synthetic_tree(renderer, unique: int, turns: int, seed: int = 0):
    """(rendered trajectory, words): a one-eviction synthetic episode of ``turns`` calls with about
    ``unique`` unique tokens, the closest of a few secant steps on U = a + b * words (roughly: the
    eviction's kind draws from the same random stream as the words). At one word per message U is the
    template's floor: a tree asked for fewer tokens comes out at the floor (the bench reports U)."""
    rt, u = _measure(renderer, turns, 1, seed)[:2]
    best, tried = (abs(u - unique), 1, rt), {1: u}
    w = max(2, round(unique / u))
    for _ in range(5):
        if u >= unique or best[0] <= 0.05 * unique or w in tried:
            break
        rt, tried[w] = _measure(renderer, turns, w, seed)[:2]
        best = min(best, (abs(tried[w] - unique), w, rt), key=lambda b: b[0])
        (w0, u0), (w1, u1) = sorted(tried.items(), key=lambda kv: abs(kv[1] - unique))[:2]
        w = w1 if u1 == u0 else max(1, round(w1 + (unique - u1) * (w1 - w0) / (u1 - u0)))
    return best[2], best[1]


class Budget:
    """The run's time budget as a ``skip`` hook of :func:`bench_groups`: a method is skipped when the
    run is past its deadline, or when its cost on the previous case of the same dtype, scaled by
    (U / previous U)^1.5, would overrun this case's share (the time left / the cases left). The wall
    time between two calls of the hook is what the previous method cost (warm-up and reference
    included)."""

    def __init__(self, seconds: float, cases: int):
        self.deadline = time.monotonic() + seconds
        self.cases_left = cases
        self.cost: dict[tuple[str, str], tuple[int, float]] = {}  # (dtype, method) -> (U, seconds)

    def case(self, dtype: str, unique: int):
        """The hook for the next case (call once per case, before its bench)."""
        now = time.monotonic()
        share = max(0.0, self.deadline - now) / max(1, self.cases_left)
        self.cases_left -= 1
        case_end = now + share
        last: list = [None, now]  # the method running and since when

        def skip(method: str, rows) -> str | None:
            t = time.monotonic()
            if last[0] is not None and rows and "skipped" not in rows[-1]:
                self.cost[(dtype, last[0])] = (unique, t - last[1])
            last[:] = [method, t]
            if t >= self.deadline:
                return "budget (the run's time is spent)"
            if (dtype, method) in self.cost:
                u0, s0 = self.cost[(dtype, method)]
                predicted = s0 * (unique / u0) ** 1.5
                if t + predicted > case_end:
                    return f"budget (predicted {predicted:.0f} s, {max(0.0, case_end - t):.0f} s left for this case)"
            return None

        return skip


def ratios(rows: list[dict]) -> dict:
    """Time ratios of the fastest exact method (of :func:`best_candidates`) against plain causal (how far
    from the limit), per-call and the tree mask (how much faster); None where a row is missing."""
    t = {r["method"]: r["time_per_tree_s"] for r in rows if "skipped" not in r}
    measured = [m for m in best_candidates() if m in t]
    if not measured:
        return {"best_exact": None, "best_vs_plain_causal": None, "per_call_vs_best": None, "tree_mask_vs_best": None}
    best = min(measured, key=t.get)

    def over(a, b):
        return round(t[a] / t[b], 3) if a in t and b in t else None

    return {"best_exact": best, "best_vs_plain_causal": over(best, "plain-causal"),
            "per_call_vs_best": over("per-call", best), "tree_mask_vs_best": over("tree-mask", best)}


def violations(case: dict, tolerance: dict) -> list[str]:
    """Exact methods whose max |Δ logprob| against plain per-call forwards exceeds the dtype's tolerance."""
    tol = tolerance[case["dtype"]]
    return [f"{case['name']} {case['dtype']} {r['method']}: max |Δ logprob| {r['max_abs_logprob_diff']:.2e} > {tol:g}"
            for r in case["rows"] if "skipped" not in r and r["exact"].startswith("exact")
            and r["max_abs_logprob_diff"] is not None and r["max_abs_logprob_diff"] > tol]


def markdown(result: dict) -> str:
    """The run as Markdown: the tests, then one row per case and method, then the ratios per case."""
    lines = [f"# GPU check: {result['device']}, {result['date']}", "",
             f"`{result['command']}` — model: {result['model']} ({result['model_shape']['parameters']:,} parameters, "
             f"V = {result['model_shape']['vocab_size']:,}); tree-mask attention: {result['tree_mask_attention']}; "
             f"exactness against plain per-call forwards, tolerance {result['tolerance']}.", "",
             f"Tests (`pytest -m gpu`): {result['tests']['summary']}", ""]
    lines += [f"* `{t['test']}`: {t['outcome']}" + (f" ({t['message']})" if t.get("message") else "")
              for t in result["tests"]["tests"]]
    lines += ["", "| case | dtype | U | P/U | method | fwd/bwd | ms/tree | tokens/s | peak MiB | max abs Δlogp | note |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        head = f"| {c['name']} | {c['dtype']} | {c.get('unique_tokens', '-')} | {c.get('p_over_u', '-')} "
        if "skipped" in c:
            lines.append(head + f"| - | | | | | | skipped: {c['skipped']} |")
            continue
        for r in c["rows"]:
            if "skipped" in r:
                lines.append(head + f"| {r['method']} | | | | | | skipped: {r['skipped']} |")
                continue
            diff = "-" if r["max_abs_logprob_diff"] is None else f"{r['max_abs_logprob_diff']:.1e}"
            note = ", ".join(n for n in (r.get("extrapolated") and f"per-call on {c['reference_calls']} of "
                                         f"{c['calls']} calls, scaled", r.get("fallback")) if n)
            lines.append(head + f"| {r['method']} | {r['forwards']}/{r['backwards']} | {1000 * r['time_per_tree_s']:.1f} "
                         f"| {r['tokens_per_s']:,.0f} | {r['peak_memory_mib']:.0f} | {diff} | {note} |")
    lines += ["", "| case | dtype | best exact | best / plain causal | per-call / best | tree-mask / best |",
              "|---|---|---|---|---|---|"]
    for c in result["cases"]:
        if "ratios" in c:
            q = c["ratios"]
            lines.append(f"| {c['name']} | {c['dtype']} | {q['best_exact'] or '-'} | {q['best_vs_plain_causal'] or '-'} "
                         f"| {q['per_call_vs_best'] or '-'} | {q['tree_mask_vs_best'] or '-'} |")
    lines += ["", f"Exactness violations: {len(result['violations'])}"] + [f"* {v}" for v in result["violations"]]
    return "\n".join(lines) + "\n"
