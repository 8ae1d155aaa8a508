"""The demo over seeds: the README's headline, and the check of one run against it.

One run of the demo is one draw. Its intervals are a bootstrap over its 64 held-out tasks and say
nothing about the seed, and another CPU or thread count rounds the pretraining differently, after which
the trajectory is another seed's (docs/demo-robustness.md). So the README states what holds over seeds
(:func:`headline`: per conclusion on how many runs it holds, per method, harness and stage the mean over
runs with a t-interval, the range and the sd), and ``memorywalker demo --check-readme README.md`` judges
a run by what any machine can produce (:func:`check_run`):

* a conclusion the README says holds on every run must hold on this one; one that failed on some run is
  reported there, not checked;
* each mean reward must be within reach: the run's 95 % interval over tasks must meet the README's range
  over runs widened on each side by :data:`WIDEN` times the between-run sd pooled over every reward cell
  of the headline (the root mean of the cells' variances). Pooled, because one cell's sd over five runs
  says little: cells at the ceiling had sd 0.01 over four seeds and a fifth seed fell 0.4 below them;
  2.5, because with it each of the five recorded runs passes against the headline of the other four
  (leave-one-out: 5 of 5; 4 of 5 at 2, 2 of 5 with each cell's own sd × 1.5; docs/demo-robustness.md).
  With the pooled sd near 0.15 that is ±0.39 around the range: the check on rewards catches gross
  departures only, the conclusions are the sharp part.

A run is summarized by :func:`run_summary` (what ``docs/demo-seeds.json`` records per seed).

>>> _range(0.2, 0.7)
'0.200–0.700'
"""

from __future__ import annotations

import math
import os
import platform
import re
from collections import Counter
from pathlib import Path

from scipy import stats

from memorywalker.errors import InputError
from memorywalker.metrics.report import REFERENCE, STAGES, claims, markdown_table, mean_sd

WIDEN = 2.5  # pooled between-run sds added on each side of the README's range (module docstring)
BEGIN, END = "<!-- demo-seeds:{name} begin -->", "<!-- demo-seeds:{name} end -->"
_REWARD_HEAD = "Held-out reward under `"
_POOLED = "Between-run sd pooled over the"


def machine() -> dict:
    """The CPU, the cores this process may use and its torch threads: where a run's numbers came from."""
    import torch  # lazy: only when a run records its machine

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):  # not Linux: platform's word for it
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "torch_threads": torch.get_num_threads(), "torch": torch.__version__}


def run_summary(doc: dict) -> dict:
    """What the headline and the check read of one run (a ``results.json`` document): its seed, machine
    and wall time, its conclusions and, per harness, method and stage, ``[mean, low, high]`` of its
    held-out reward (bootstrap 95 % interval over tasks)."""
    return {"seed": doc["config"]["seed"], "machine": doc.get("machine"), "seconds": doc.get("seconds_total"),
            "stage_seconds": doc.get("stage_seconds"), "claims": claims(doc),
            "reward": _per_stage(doc["summary"], "{}"), "vs_reference": _per_stage(doc["summary"], "{}_vs_" + REFERENCE)}


def _per_stage(summary: dict, key: str) -> dict:
    """``{harness: {method: {stage: [mean, low, high]}}}`` of ``summary[h][m][key.format(stage)]``."""
    return {h: {m: {s: [float(x) for x in row[key.format(s)]] for s in STAGES if key.format(s) in row}
                for m, row in rows.items()} for h, rows in summary.items()}


def headline(runs: list[dict]) -> str:
    """The README's headline over ``runs`` (:func:`run_summary` dicts) in Markdown: the conclusions with on
    how many runs each holds, then per harness each method's mean reward over runs [t 95 % interval over
    runs], range and sd, after SFT and after RL, the between-run sd pooled over those cells (what the
    check widens by), and each method's paired difference against tree-mask over runs.

    >>> run = lambda seed, r, holds: {"seed": seed, "claims": [{"claim": "c", "holds": holds, "evidence": "e"}],
    ...                               "reward": {"h": {"m": {"sft": [r, r - 0.1, r + 0.1]}}}}
    >>> print(headline([run(0, 0.5, True), run(1, 0.7, False)]))  # doctest: +NORMALIZE_WHITESPACE
    Conclusions over 2 runs (seeds 0, 1; 2 on a machine not recorded):
    <BLANKLINE>
    | conclusion | holds on | `--check-readme` | where it fails |
    |---|---|---|---|
    | c | 1 of 2 runs | reported | seed 1: e |
    <BLANKLINE>
    Held-out reward under `h` over 2 runs (mean of the runs' means [t 95 % interval over runs]; range; sd):
    <BLANKLINE>
    | method | after SFT | SFT range | SFT sd | after RL | RL range | RL sd |
    |---|---|---|---|---|---|---|
    | `m` | 0.600 [-0.671, 1.871] | 0.500–0.700 | 0.141 | — | — | — |
    <BLANKLINE>
    Between-run sd pooled over the 1 reward cells: 0.141 (the root mean of their variances); `--check-readme` widens each range by 2.5 × 0.141 = 0.354 on each side.
    """
    where = Counter(f"{m['cpu']}, {m['cores']} cores" if (m := r.get("machine")) else "a machine not recorded"
                    for r in runs)
    out = [f"Conclusions over {len(runs)} runs (seeds {', '.join(str(r['seed']) for r in runs)}; "
           f"{', '.join(f'{k} on {w}' for w, k in where.items())}):\n\n" + _conclusions_table(runs)]
    cells = _cells(runs)
    out += [_reward_table(cells, runs, h) for h in runs[0]["reward"]]
    pooled = math.sqrt(sum(mean_sd(v)[1] ** 2 for v in cells.values()) / len(cells)) if len(runs) > 1 else 0.0
    out.append(f"{_POOLED} {len(cells)} reward cells: {pooled:.3f} (the root mean of their variances); "
               f"`--check-readme` widens each range by {WIDEN} × {pooled:.3f} = {WIDEN * pooled:.3f} on each side.")
    if any(r.get("vs_reference") for r in runs):
        out.append(_difference_table(runs))
    return "\n\n".join(out)


def _conclusions_table(runs: list[dict]) -> str:
    body = []
    for name in dict.fromkeys(c["claim"] for r in runs for c in r["claims"]):
        verdicts = [(r["seed"], next((c for c in r["claims"] if c["claim"] == name), None)) for r in runs]
        held = sum(c is not None and c["holds"] for _, c in verdicts)
        fails = "; ".join(f"seed {s}: " + (c["evidence"] if c else "not measured") for s, c in verdicts
                          if c is None or not c["holds"])
        body.append([name, f"{held} of {len(runs)} runs", "must hold" if held == len(runs) else "reported",
                     fails or "—"])
    return markdown_table(["conclusion", "holds on", "`--check-readme`", "where it fails"], body)


def _reward_table(cells: dict[tuple[str, str, str], list[float]], runs: list[dict], h: str) -> str:
    n, body = len(runs), []
    for m in runs[0]["reward"][h]:
        row = [f"`{m}`"]
        for s in STAGES:
            means = cells.get((h, m, s))
            if means is None:  # a stage some run lacks (no GRPO): not summarized
                row += ["—"] * 3
                continue
            sd = mean_sd(means)[1] if n > 1 else 0.0  # one run: no spread to widen by
            row += [_over_runs(means), _range(min(means), max(means)), f"{sd:.3f}"]
        body.append(row)
    head = ["method", *(f"{k}{s.upper()}{v}" for s in STAGES for k, v in (("after ", ""), ("", " range"), ("", " sd")))]
    return (f"{_REWARD_HEAD}{h}` over {n} runs (mean of the runs' means [t 95 % interval over runs]; range; sd):\n\n"
            + markdown_table(head, body))


def _cells(runs: list[dict]) -> dict[tuple[str, str, str], list[float]]:
    """Every (harness, method, stage) that each run measured: its mean reward per run."""
    return {(h, m, s): [r["reward"][h][m][s][0] for r in runs] for h in runs[0]["reward"]
            for m in runs[0]["reward"][h] for s in STAGES if all(s in r["reward"][h].get(m, {}) for r in runs)}


def _difference_table(runs: list[dict]) -> str:
    n = len(runs)
    cols = [(h, s) for h in runs[0]["reward"] for s in STAGES]
    body = []
    for m in (m for m in runs[0]["reward"][cols[0][0]] if m != REFERENCE):
        cells = [f"`{m}`"]
        for h, s in cols:
            d = [r["vs_reference"][h][m][s] for r in runs if s in r.get("vs_reference", {}).get(h, {}).get(m, {})]
            below, above = sum(high < 0 for _, _, high in d), sum(low > 0 for _, low, _ in d)
            cells.append(f"{_over_runs([x[0] for x in d])}; below 0 on {below}, above on {above}" if len(d) == n
                         else "—")
        body.append(cells)
    return (f"Paired difference against `{REFERENCE}` over {n} runs (mean of the runs' differences [t 95 % interval "
            f"over runs]; on how many runs the run's own paired interval lies below 0, and above):\n\n"
            + markdown_table([f"method − {REFERENCE}", *(f"`{h}` after {s.upper()}" for h, s in cols)], body))


def check_run(block: str, run: dict, *, partial: bool = False) -> list[str]:
    """How ``run`` (a :func:`run_summary` dict) disagrees with a README headline (``block``, what
    :func:`headline` wrote): a conclusion that holds on every run there and not here, and a mean reward
    whose interval misses the range widened by :data:`WIDEN` pooled sds (module docstring). Without ``partial``
    the run must also measure everything the headline states, and state nothing it lacks; with it (numbers
    quoted from a log or an issue) only what the run has is judged. Empty when they agree.
    """
    conclusions, ranges, pooled = parse_headline(block)
    out = []
    mine = {c["claim"]: c for c in run["claims"]}
    for name, (held, n) in conclusions.items():
        c = mine.get(name)
        if c is None:
            if not partial:
                out.append(f"{name}: not measured by this run")
        elif held == n and not c["holds"]:
            out.append(f"{name}: does not hold here ({c['evidence']}); it held on all {n} runs in the README")
    out += [f"{name}: not in the README" for name in mine if name not in conclusions and not partial]
    widen = WIDEN * pooled
    for (h, m, s), (low, high, _) in ranges.items():
        have = run["reward"].get(h, {}).get(m, {}).get(s)
        if have is None:
            if not partial:
                out.append(f"{h}, {m} after {s.upper()}: not measured by this run")
            continue
        mean, lo, hi = have
        a, b = low - widen, high + widen
        if hi < a or lo > b:
            out.append(f"{h}, {m} after {s.upper()}: {mean:.3f} [{lo:.3f}, {hi:.3f}] here, outside the README's "
                       f"range {_range(low, high)} widened by {WIDEN} × {pooled:.3f} to {_range(a, b)}")
    if not partial:
        out += [f"{h}, {m} after {s.upper()}: not in the README" for h, rows in run["reward"].items()
                for m, row in rows.items() for s in row if (h, m, s) not in ranges]
    return out


def parse_headline(block: str) -> tuple[dict[str, tuple[int, int]], dict[tuple[str, str, str], tuple[float, ...]], float]:
    """Read back what :func:`headline` wrote: ``{conclusion: (held, runs)}``, ``{(harness, method, stage):
    (low, high, sd)}`` and the pooled between-run sd."""
    conclusions, ranges, harness, pooled = {}, {}, None, None
    for line in block.splitlines():
        if line.startswith(_REWARD_HEAD):
            harness = line.split("`")[1]
        elif line.startswith(_POOLED):
            pooled = float(re.search(r"reward cells: ([0-9.]+)", line).group(1))
        elif line.strip() and not line.startswith("|"):
            harness = None  # another table's heading (the paired differences): its rows are not rewards
        if not line.startswith("| ") or line.startswith(("| conclusion", "| method")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if harness is None and len(cells) == 4 and cells[1].endswith(" runs"):
            held, _, n, _ = cells[1].split()
            conclusions[cells[0]] = (int(held), int(n))
        elif harness is not None and len(cells) == 1 + 3 * len(STAGES):
            for k, s in enumerate(STAGES):
                spread, sd = cells[2 + 3 * k], cells[3 + 3 * k]
                if spread != "—":
                    low, high = (float(x) for x in spread.split("–"))
                    ranges[(harness, cells[0].strip("`"), s)] = (low, high, float(sd))
    if not conclusions or not ranges or pooled is None:
        raise InputError("the README's demo headline lacks its conclusions, its reward tables or its pooled sd")
    return conclusions, ranges, pooled


def readme_block(readme: str, name: str) -> str:
    """The headline a document quotes between its ``demo-seeds:NAME`` markers (``full``: README.md,
    ``quick``: docs/demo.md)."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if begin not in readme or end not in readme:
        raise InputError(f"no {begin} ... {end} block in the file given")
    return readme.split(begin, 1)[1].split(end, 1)[0].strip()


def _over_runs(values: list[float]) -> str:
    """The mean of per-run numbers with a t 95 % interval over runs (none for one run).

    >>> _over_runs([0.2, 0.4, 0.6]), _over_runs([0.5])
    ('0.400 [-0.097, 0.897]', '0.500')
    """
    n = len(values)
    mean, sd = mean_sd(values)
    if n < 2:
        return f"{mean:.3f}"
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def _range(low: float, high: float) -> str:
    return f"{low:.3f}–{high:.3f}"
