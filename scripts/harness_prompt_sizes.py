"""How many positions the real harnesses' prompts take under other tokenizers than the kit's.

    python scripts/harness_prompt_sizes.py --records runs/harness --kit-tok runs/harness/kit/tok \
        --tokenizer kit=runs/harness/kit/tok --tokenizer smollm2=MODEL_DIR --out prompt_sizes.json

Reads what ``scripts/harness_sessions.py`` recorded (``RECORDS/<harness>/trajectories.jsonl``, token
ids in the kit's toy vocabulary), decodes every call's ``context_tokens`` and ``response_tokens`` with
the kit tokenizer (special tokens kept, so the kit's chat template with its rendered tools stays in the
text) and counts the same text under each ``--tokenizer NAME=DIR`` (no special tokens added). Per
harness session and tokenizer: the first prompt of the main line, the largest prompt of the session
(side calls included), the largest prompt before the first summarization call (what the harness's
compaction saw), the summarization call's own prompt, and the largest prompt + response (the positions a
model needs). The decode is checked to round-trip (kit(decoded) == recorded ids) for every call.
Prints a markdown table and writes the numbers to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FIELDS = [("first_prompt", "first prompt"), ("largest_prompt", "largest prompt"),
          ("prompt_at_compaction", "prompt before compaction"), ("summarize_prompt", "summarization prompt"),
          ("largest_context_response", "largest prompt + response")]


def sessions(trajs: list) -> list[tuple]:
    """(main line, [its side trajectories]) per session of one records file, in file order."""
    mains = [t for t in trajs if t.lineage.relation != "side"]
    return [(m, [t for t in trajs if t.lineage.relation == "side" and t.lineage.parent == m.id]) for m in mains]


def measure(main, sides: list, kit, toks: dict) -> dict:
    """The session's prompt sizes under each tokenizer in ``toks``, and the kit decode's round-trip check."""
    def text(ids: list[int]) -> str:
        return kit.decode(ids, skip_special_tokens=False)

    calls = [(c, False) for c in main.calls] + [(c, True) for t in sides for c in t.calls]
    texts = [(text(c.context_tokens or []), text(c.response_tokens or [])) for c, _ in calls]
    exact = [kit.encode(ctx, add_special_tokens=False) == (c.context_tokens or [])
             and kit.encode(resp, add_special_tokens=False) == (c.response_tokens or [])
             for (c, _), (ctx, resp) in zip(calls, texts, strict=True)]
    bad = [f"{'side ' if side else ''}{c.id}" for (c, side), ok in zip(calls, exact, strict=True) if not ok]
    first_summary = next((i for i, c in enumerate(main.calls) if c.purpose == "summarize"), None)
    out = {"main_calls": len(main.calls), "side_calls": len(calls) - len(main.calls),
           "summarization_calls": sum(c.purpose == "summarize" for c in main.calls),
           "round_trip": {"ok": not bad, "first_call_ok": exact[0] if exact else None,
                          "mismatched_calls": bad},
           "chars": {"largest_prompt": max(len(ctx) for ctx, _ in texts)}, "tokens": {}}
    cache: dict[tuple[str, str], int] = {}

    def n(name: str, s: str) -> int:
        if (name, s) not in cache:
            cache[name, s] = len(toks[name](s, add_special_tokens=False)["input_ids"])
        return cache[name, s]

    for name in toks:
        ctx = [n(name, c) for c, _ in texts]
        both = [n(name, c) + n(name, r) for c, r in texts]
        main_ctx = ctx[:len(main.calls)]
        out["tokens"][name] = {
            "first_prompt": main_ctx[0] if main_ctx else None,
            "largest_prompt": max(ctx, default=None),
            "prompt_at_compaction": (max(main_ctx[:first_summary], default=None)
                                     if first_summary is not None else None),
            "summarize_prompt": main_ctx[first_summary] if first_summary is not None else None,
            "largest_context_response": max(both, default=None),
            "prompts": main_ctx,
        }
    return out


def render(results: dict, names: list[str]) -> str:
    lines = ["| harness | tokenizer | " + " | ".join(label for _, label in FIELDS) + " |",
             "|---|---|" + "---:|" * len(FIELDS)]
    for session, r in results.items():
        for name in names:
            t = r["tokens"][name]
            cells = ["-" if t[k] is None else f"{t[k]:,}" for k, _ in FIELDS]
            lines.append(f"| {session} | {name} | " + " | ".join(cells) + " |")
    bad = {s: r["round_trip"]["mismatched_calls"] for s, r in results.items() if not r["round_trip"]["ok"]}
    lines += ["", "kit decode round-trip: " + ("exact on every call" if not bad else f"MISMATCH {bad}")]
    return "\n".join(lines) + "\n"


def main() -> None:
    from transformers import AutoTokenizer

    from memorywalker.records import read_trajectories

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=Path, required=True,
                    help="the --out of scripts/harness_sessions.py (one <harness>/trajectories.jsonl each)")
    ap.add_argument("--kit-tok", type=Path, help="the tokenizer the records were made with (RECORDS/kit/tok)")
    ap.add_argument("--tokenizer", action="append", default=[], metavar="NAME=DIR",
                    help="a Hugging Face tokenizer directory to count with (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("harness-prompt-sizes.json"))
    args = ap.parse_args()
    specs = [s.partition("=") for s in args.tokenizer]
    if not specs or any(not name or not d for name, _, d in specs):
        ap.error("give at least one --tokenizer NAME=DIR")
    def load(d):
        return AutoTokenizer.from_pretrained(str(d), local_files_only=True)

    kit = load(args.kit_tok or args.records / "kit" / "tok")
    toks = {name: load(d) for name, _, d in specs}
    results = {}
    for path in sorted(args.records.glob("*/trajectories.jsonl")):
        found = sessions(read_trajectories(path))
        for i, (main_line, sides) in enumerate(found):
            key = path.parent.name if len(found) == 1 else f"{path.parent.name}#{i + 1}"
            results[key] = {"records": str(path), "session": main_line.id,
                            **measure(main_line, sides, kit, toks)}
    if not results:
        ap.error(f"no */trajectories.jsonl under {args.records}")
    report = {"tokenizers": {name: {"dir": d, "vocab": len(toks[name])} for name, _, d in specs},
              "sessions": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(render(results, list(toks)), end="")


if __name__ == "__main__":
    main()
