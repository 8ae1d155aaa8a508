"""The tables ``scripts/chapter_effects.py`` prints and writes to ``OUT/tables.md``, from its ``results.json``.

    python scripts/chapter_tables.py runs/chapter/results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _diff(p: dict) -> str:
    return f"{p['difference']:+.3f} [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]"


def _holds(ps: list[dict]) -> str:
    """Seeds whose interval lies above 0 / below 0, of all."""
    up = sum(p["ci"][0] > 0 for p in ps)
    down = sum(p["ci"][1] < 0 for p in ps)
    return f"above 0 on {up}, below 0 on {down}, of {len(ps)} seeds"


def tables(results: dict) -> str:
    lines = []
    seeds = sorted(results["seeds"], key=int)
    got = [s for s in seeds if "dagger" in results["seeds"][s]]
    if got:
        lines += ["### DAgger against behaviour cloning on the same verified labels", "",
                  "| seed | labels | warm start | BC | DAgger | DAgger − BC reward [95 %] | act calls | tokens | "
                  "malformed share | learner-state disagreement per round |", "|---|---|---|---|---|---|---|---|---|---|"]
        for s in got:
            d = results["seeds"][s]["dagger"]
            p = d["paired"]
            dis = ", ".join("-" if r["learner_state_disagreement"] is None else f"{r['learner_state_disagreement']:.2f}"
                            for r in d["rounds"])
            lines.append(f"| {s} | {d['labels']} | {d['reward']['warm']:.3f} | {d['reward']['bc']:.3f} | "
                         f"{d['reward']['dagger']:.3f} | {_diff(p['acceptance'])} | {_diff(p['turns'])} | "
                         f"{_diff(p['tokens'])} | {_diff(p['malformed'])} | {dis} |")
        lines += ["", f"DAgger − BC reward: {_holds([results['seeds'][s]['dagger']['paired']['acceptance'] for s in got])}.", ""]
    got = [s for s in seeds if "augment" in results["seeds"][s]]
    if got:
        lines += ["### Schema augmentation", "",
                  "| seed | regime | reward sft / +aug | SFA sft / +aug | PRE sft / +aug | +aug − sft reward [95 %] | "
                  "+aug − sft SFA [95 %] |", "|---|---|---|---|---|---|---|"]
        for s in got:
            for regime, r in results["seeds"][s]["augment"]["regimes"].items():
                a, b = r["sft"], r["sft+aug"]
                lines.append(f"| {s} | {regime} | {a['acceptance']:.3f} / {b['acceptance']:.3f} | {a['sfa']:.3f} / "
                             f"{b['sfa']:.3f} | {a['pre']:.3f} / {b['pre']:.3f} | {_diff(r['paired']['acceptance'])} | "
                             f"{_diff(r['paired']['sfa'])} |")
        regimes = results["seeds"][got[0]]["augment"]["regimes"]
        lines.append("")
        for regime in regimes:
            ps = [results["seeds"][s]["augment"]["regimes"][regime]["paired"] for s in got]
            lines.append(f"* {regime}: reward {_holds([p['acceptance'] for p in ps])}; SFA {_holds([p['sfa'] for p in ps])}.")
        lines.append("")
    got = [s for s in seeds if "distill" in results["seeds"][s]]
    if got:
        lines += ["### Distillation: a smaller student on the GRPO teacher's verified episodes against the expert's", "",
                  "| seed | episodes each (verified: teacher / expert) | identical on shared tasks | teacher | student: "
                  "from teacher / from expert / expert unfiltered | teacher − expert data, reward [95 %] | tokens | "
                  "verified − unfiltered expert, reward [95 %] |", "|---|---|---|---|---|---|---|---|"]
        for s in got:
            d = results["seeds"][s]["distill"]
            head = f"| {s} | {d['episodes']} ({d['teacher_verified']} / {d['expert_verified']}) | {d['identical_on_shared']} of {d['shared_tasks']} |"
            if "skipped" in d:
                lines.append(f"{head} {d['skipped']} |||||")
                continue
            a, p, f = d["acceptance"], d["paired"], d["paired_filter"]
            lines.append(f"{head} {a['teacher']:.3f} | {a['from-teacher']:.3f} / {a['from-expert']:.3f} / "
                         f"{a['from-expert-unfiltered']:.3f} | {_diff(p['acceptance'])} | {_diff(p['tokens'])} | "
                         f"{_diff(f['acceptance'])} |")
        done = [results["seeds"][s]["distill"] for s in got if "paired" in results["seeds"][s]["distill"]]
        lines += ["", f"Teacher − expert data: {_holds([d['paired']['acceptance'] for d in done])}; verified − unfiltered: "
                  f"{_holds([d['paired_filter']['acceptance'] for d in done])}.", ""]
    got = [s for s in seeds if "acc" in results["seeds"][s]]
    if got:
        lines += ["### ACC: compiled QA trained in, against the same steps without it", "",
                  "| seed | compiled / held-out QA | QA sft / +acc | +acc − sft QA [95 %] | reward sft / +acc | "
                  "+acc − sft reward [95 %] | act calls | tokens |", "|---|---|---|---|---|---|---|---|"]
        for s in got:
            d = results["seeds"][s]["acc"]
            q, a, p = d["qa_accuracy"], d["acceptance"], d["paired"]
            lines.append(f"| {s} | {d['compiled']} / {d['heldout_qa']} | {q['sft']:.3f} / {q['sft+acc']:.3f} | {_diff(p['qa'])} | "
                         f"{a['sft']:.3f} / {a['sft+acc']:.3f} | {_diff(p['acceptance'])} | {_diff(p['turns'])} | "
                         f"{_diff(p['tokens'])} |")
        ps = [results["seeds"][s]["acc"]["paired"] for s in got]
        lines += ["", f"+acc − sft: QA {_holds([p['qa'] for p in ps])}; reward {_holds([p['acceptance'] for p in ps])}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(tables(json.loads(Path(sys.argv[1]).read_text())))
