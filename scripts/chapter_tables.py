"""The tables ``scripts/chapter_effects.py`` prints and writes to ``OUT/tables.md``, from its ``results.json``.

    python scripts/chapter_tables.py runs/chapter/results.json

One function per section: given ``{seed: that section's result}``, its title, column names, rows and
the summary lines under the table.
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


def dagger(got: dict) -> tuple:
    rows = []
    for s, d in got.items():
        p = d["paired"]
        dis = ", ".join("-" if r["learner_state_disagreement"] is None else f"{r['learner_state_disagreement']:.2f}"
                        for r in d["rounds"])
        rows.append([s, d["labels"], f"{d['reward']['warm']:.3f}", f"{d['reward']['bc']:.3f}", f"{d['reward']['dagger']:.3f}",
                     _diff(p["acceptance"]), _diff(p["turns"]), _diff(p["tokens"]), _diff(p["malformed"]), dis])
    return ("DAgger against behaviour cloning on the same verified labels",
            ["seed", "labels", "warm start", "BC", "DAgger", "DAgger − BC reward [95 %]", "act calls", "tokens",
             "malformed share", "learner-state disagreement per round"], rows,
            [f"DAgger − BC reward: {_holds([d['paired']['acceptance'] for d in got.values()])}."])


def augment(got: dict) -> tuple:
    rows = []
    for s, d in got.items():
        for regime, r in d["regimes"].items():
            a, b = r["sft"], r["sft+aug"]
            rows.append([s, regime, f"{a['acceptance']:.3f} / {b['acceptance']:.3f}", f"{a['sfa']:.3f} / {b['sfa']:.3f}",
                         f"{a['pre']:.3f} / {b['pre']:.3f}", _diff(r["paired"]["acceptance"]), _diff(r["paired"]["sfa"])])
    regimes = next(iter(got.values()))["regimes"]
    summary = [f"* {regime}: reward {_holds([d['regimes'][regime]['paired']['acceptance'] for d in got.values()])}; "
               f"SFA {_holds([d['regimes'][regime]['paired']['sfa'] for d in got.values()])}." for regime in regimes]
    return ("Schema augmentation", ["seed", "regime", "reward sft / +aug", "SFA sft / +aug", "PRE sft / +aug",
                                    "+aug − sft reward [95 %]", "+aug − sft SFA [95 %]"], rows, summary)


def distill(got: dict) -> tuple:
    rows, done = [], []
    for s, d in got.items():
        head = [s, f"{d['episodes']} ({d['teacher_verified']} / {d['expert_verified']})",
                f"{d['identical_on_shared']} of {d['shared_tasks']}"]
        if "skipped" in d:
            rows.append(head + [d["skipped"], "", "", "", ""])
            continue
        done.append(d)
        a = d["acceptance"]
        rows.append(head + [f"{a['teacher']:.3f}", f"{a['from-teacher']:.3f} / {a['from-expert']:.3f} / "
                            f"{a['from-expert-unfiltered']:.3f}", _diff(d["paired"]["acceptance"]),
                            _diff(d["paired"]["tokens"]), _diff(d["paired_filter"]["acceptance"])])
    return ("Distillation: a smaller student on the GRPO teacher's verified episodes against the expert's",
            ["seed", "episodes each (verified: teacher / expert)", "identical on shared tasks", "teacher",
             "student: from teacher / from expert / expert unfiltered", "teacher − expert data, reward [95 %]", "tokens",
             "verified − unfiltered expert, reward [95 %]"], rows,
            [f"Teacher − expert data: {_holds([d['paired']['acceptance'] for d in done])}; verified − unfiltered: "
             f"{_holds([d['paired_filter']['acceptance'] for d in done])}."])


def acc(got: dict) -> tuple:
    rows = []
    for s, d in got.items():
        q, a, p = d["qa_accuracy"], d["acceptance"], d["paired"]
        rows.append([s, f"{d['compiled']} / {d['heldout_qa']}", f"{q['sft']:.3f} / {q['sft+acc']:.3f}", _diff(p["qa"]),
                     f"{a['sft']:.3f} / {a['sft+acc']:.3f}", _diff(p["acceptance"]), _diff(p["turns"]), _diff(p["tokens"])])
    ps = [d["paired"] for d in got.values()]
    return ("ACC: compiled QA trained in, against the same steps without it",
            ["seed", "compiled / held-out QA", "QA sft / +acc", "+acc − sft QA [95 %]", "reward sft / +acc",
             "+acc − sft reward [95 %]", "act calls", "tokens"], rows,
            [f"+acc − sft: QA {_holds([p['qa'] for p in ps])}; reward {_holds([p['acceptance'] for p in ps])}."])


SECTIONS = {"dagger": dagger, "augment": augment, "distill": distill, "acc": acc}


def tables(results: dict) -> str:
    lines = []
    seeds = sorted(results["seeds"], key=int)
    for name, section in SECTIONS.items():
        got = {s: results["seeds"][s][name] for s in seeds if name in results["seeds"][s]}
        if not got:
            continue
        title, columns, rows, summary = section(got)
        lines += [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                  *("| " + " | ".join(str(c) for c in row) + " |" for row in rows), "", *summary, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(tables(json.loads(Path(sys.argv[1]).read_text())))
