"""The Codex importer over a folder of real rollouts: what imports, what is set aside, and why.

    python scripts/codex_corpus.py /work/data/codex-rollouts [--min-version 0.116] [--json out.json]

Each rollout file is imported on its own with the importer ``memorywalker import codex`` uses; the
counts are per file, then summed:

* files, files imported (at least one trajectory), calls (act, summarize);
* compactions the files record (``compacted`` lines) and the evictions the importer records: a file
  whose ``summarize`` evictions differ in number from its ``compacted`` lines, or which holds any other
  eviction (an ``other`` eviction inferred from a billed-token drop), counts as "evictions ≠ compactions";
* calls set aside (``selected: false``) by reason, ``context_unverified`` among them;
* rejected records by reason, with the most frequent messages;
* the system-prompt rule and the tool schemas, as the importer decided them per trajectory.

The corpus is not shipped (the rollouts belong to the people who committed them); ``--min-version`` keeps
the files whose ``session_meta.cli_version`` is at least that version.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from memorywalker.importers import ImportOptions, run_import


def version(path: Path) -> tuple[int, ...] | None:
    """``session_meta.cli_version`` of the file's first line as a tuple of ints (pre-release tags dropped)."""
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
        v = first.get("payload", {}).get("cli_version")
    except (OSError, ValueError, AttributeError):
        return None
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", str(v or ""))
    return tuple(int(x) for x in m.groups()) if m else None


def survey(files: list[Path], options: ImportOptions | None = None) -> dict[str, Any]:
    out: Counter = Counter()
    rejects: Counter = Counter()
    messages: Counter = Counter()
    unselected: Counter = Counter()
    rules: Counter = Counter()
    tools: Counter = Counter()
    mismatched: list[str] = []
    for f in files:
        out["files"] += 1
        compactions = sum('"type":"compacted"' in line.replace(" ", "") for line in f.open(encoding="utf-8"))
        out["compacted_lines"] += compactions
        out["files_with_compacted"] += compactions > 0
        result = run_import("codex", [f], options or ImportOptions())
        c = result.counts()
        out["files_imported"] += bool(result.trajectories)
        out["trajectories"] += c["trajectories"]
        for t in result.trajectories:
            purposes = Counter(call.purpose for call in t.calls)
            out["calls"] += len(t.calls)
            out["calls_summarize"] += purposes["summarize"]
            rules[str(t.meta.get("system_prompt_rule", "-")).split(":")[0]] += 1
            tools[str(t.meta.get("tools", "-")).split(" ")[0]] += 1
        summarize = sum(ev.kind == "summarize" for t in result.trajectories for ev in t.evictions)
        other = sum(ev.kind != "summarize" for t in result.trajectories for ev in t.evictions)
        out["evictions_summarize"] += summarize
        out["evictions_other"] += other
        out["evictions_inferred_from_billed"] += c["evictions_from_billed_drops"]
        if summarize != compactions or other:
            out["files_evictions_differ_from_compactions"] += 1
            mismatched.append(f"{f.name}: compacted {compactions}, summarize {summarize}, other {other}")
        for reason, n in c["unselected_by_reason"].items():
            unselected[reason] += n
        for r in result.rejects:
            rejects[r.reason] += 1
            messages[re.sub(r"^line \d+: ", "", r.message)[:90]] += 1
    return {"counts": dict(out), "unselected_by_reason": dict(unselected), "rejects_by_reason": dict(rejects),
            "top_reject_messages": messages.most_common(8), "system_prompt_rule": dict(rules),
            "tools": dict(tools), "files_evictions_differ": mismatched}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--min-version", default=None, help="keep files with cli_version >= this (e.g. 0.116)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    files = sorted(args.folder.rglob("*.jsonl"))
    if args.min_version:
        floor = tuple(int(x) for x in args.min_version.split("."))
        files = [f for f in files if (v := version(f)) is not None and v >= floor]
    report = survey(files)
    c = report["counts"]
    print(f"files {c['files']}, imported {c.get('files_imported', 0)}, trajectories {c.get('trajectories', 0)}, "
          f"calls {c.get('calls', 0)} (summarize {c.get('calls_summarize', 0)})")
    print(f"compacted lines {c.get('compacted_lines', 0)} in {c.get('files_with_compacted', 0)} files; evictions: "
          f"summarize {c.get('evictions_summarize', 0)}, other {c.get('evictions_other', 0)} (inferred from billed "
          f"drops {c.get('evictions_inferred_from_billed', 0)}); files whose evictions differ from their compactions: "
          f"{c.get('files_evictions_differ_from_compactions', 0)}")
    print(f"calls set aside: {report['unselected_by_reason']}")
    print(f"rejected records: {report['rejects_by_reason']}")
    for msg, n in report["top_reject_messages"]:
        print(f"  {n:6d}  {msg}")
    print(f"system prompt rule: {report['system_prompt_rule']}; tools: {report['tools']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
