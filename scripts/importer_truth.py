"""The importers checked against the truth: each call's imported context vs what the gateway captured.

    python scripts/importer_truth.py \\
        --case claude-code /tmp/imp/cc ~/.claude/projects/<slug>/<session>.jsonl \\
        --case codex /tmp/imp/codex $CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl \\
        --case opencode /tmp/imp/oc $HOME/.local/share/opencode/opencode.db \\
        [--tokenizer TOK] [--tools codex=codex-0.169.0 --tools opencode=opencode-1.18.33] \\
        [--json truth.json] [--details]

Each ``--case HARNESS OUT LOG`` names a gateway output dir (``OUT/trajectories.jsonl``, written by
``memorywalker harness run``) and the harness's OWN log of that same session. The log is imported
with the importer ``memorywalker import`` uses (:func:`memorywalker.importers.run_import`); the main
trajectory of each side (the gateway's without ``/side-``, the importer's without a lineage parent)
is compared call by call.

Matching: act calls (``purpose != "summarize"``) in order; summarization calls in order among
themselves (a compaction's summary request is its own call on both sides when the log has it).

Comparison is at the message level, on the semantics, not on either side's conventions. Both
contexts become a list of units, in order:

* ``text(role)``: user and system text. Consecutive texts of one role are joined with "\\n\\n" (the
  gateway makes one user message of a user turn's text blocks; an importer may write one message per
  record or attachment; the API merges consecutive user turns either way). Text is stripped of
  leading/trailing whitespace. The roles ``user`` and ``system`` are kept apart: Claude Code sends
  ``role: "system"`` turns and an importer that sends them as user text differs.
* ``assistant``: its stripped text and its tool calls as (name, parsed arguments); reasoning is left
  out (the scripted backend sends none, and not every log keeps it).
* ``tool``: the stripped result text (tool-call ids are not compared: each side keeps the harness's
  own ids or makes its own; the result's place after its call is compared).

A call is *equal* when the unit lists are equal, and *equal without the system prompt* when they are
equal once a leading ``text(system)`` unit is dropped from each side (logs that do not store the
system prompt). With ``--tokenizer`` each imported context is also rendered by that tokenizer's chat
template (with the tools the call offers, plain ``apply_chat_template``) and compared token for token
with the ids the gateway fed the model for the captured call (its recorded ``context_tokens``): *tokens
equal*; and, with a leading system message dropped from both, the captured context rendered the same
way: *tokens equal w/o system prompt*. ``--tools HARNESS=SPEC`` is that importer's ``--tools``
(``memorywalker import codex|opencode --tools``: the logs do not record the tool schemas). The first difference is classified: ``missing`` (a captured unit the import lacks),
``extra`` (an imported unit the capture lacks), ``text`` (same kind and role, other text),
``tool_call``, ``tool_result``, ``role`` and ``order`` (same units, other order).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from memorywalker.importers import ImportOptions, run_import
from memorywalker.records import Trajectory
from memorywalker.render.types import message_to_hf, tools_to_hf


def units(traj: Trajectory, context: list[str]) -> list[tuple]:
    """The comparable units of one context (see the module docstring)."""
    table = {m.id: m for m in traj.messages}
    out: list[tuple] = []
    for mid in context:
        m = table[mid]
        if m.role in ("user", "system"):
            text = m.content.strip()
            if not text:
                continue
            if out and out[-1][0] == "text" and out[-1][1] == m.role:
                out[-1] = ("text", m.role, out[-1][2] + "\n\n" + text)
            else:
                out.append(("text", m.role, text))
        elif m.role == "assistant":
            calls = tuple((tc.name, json.dumps(_args(tc.arguments), sort_keys=True)) for tc in m.tool_calls)
            out.append(("assistant", m.content.strip(), calls))
        else:
            out.append(("tool", m.content.strip()))
    return out


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def first_difference(want: list[tuple], got: list[tuple]) -> tuple[str, int, str] | None:
    """(kind, unit index, what) of the first difference; None when equal."""
    if want == got:
        return None
    if Counter(want) == Counter(got):
        i = next(k for k, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
        return "order", i, _show(want[i])
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a == b:
            continue
        if b in want[i + 1:] and a not in got[i + 1:]:
            return "missing", i, _show(a)
        if a in got[i + 1:] and b not in want[i + 1:]:
            return "extra", i, _show(b)
        if a[0] != b[0]:
            return ("missing" if b in want[i + 1:] else "extra"), i, f"{_show(a)} vs {_show(b)}"
        if a[0] == "text" and a[1] != b[1]:
            return "role", i, f"{a[1]} vs {b[1]}: {_show(a)}"
        if a[0] == "text":
            return "text", i, _text_diff(a[2], b[2])
        if a[0] == "assistant":
            return ("tool_call" if a[2] != b[2] else "text"), i, f"{_show(a)} vs {_show(b)}"
        return "tool_result", i, _text_diff(a[1], b[1])
    n = min(len(want), len(got))
    if len(want) > n:
        return "missing", n, _show(want[n])
    return "extra", n, _show(got[n])


def _show(u: tuple) -> str:
    if u[0] == "text":
        return f"{u[1]} text {u[2][:60]!r}"
    if u[0] == "assistant":
        return f"assistant {u[1][:40]!r} calls {[c[0] for c in u[2]]}"
    return f"tool result {u[1][:60]!r}"


def _text_diff(a: str, b: str) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at char {k}: captured {a[max(0, k - 20):k + 40]!r} vs imported {b[max(0, k - 20):k + 40]!r}"


def _strip_system(u: list[tuple]) -> list[tuple]:
    return u[1:] if u and u[0][:2] == ("text", "system") else u


def prompt_ids(tok, traj: Trajectory, index: int, without_system: bool = False) -> list[int]:
    """Call ``index``'s context rendered by ``tok``'s chat template, as a plain ``apply_chat_template``
    (without its leading system message, when asked)."""
    call, table = traj.calls[index], traj.message_table()
    messages = [table[m] for m in call.context]
    if without_system and messages and messages[0].role == "system":
        messages = messages[1:]
    text = tok.apply_chat_template([message_to_hf(m) for m in messages], tools=tools_to_hf(traj, call.tools),
                                   tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def token_check(tok, truth: Trajectory, want: int, imp: Trajectory, got: int, rerender: bool = False) -> dict[str, Any]:
    """The imported call's rendering against the ids the gateway fed the model (rendered, where it did not
    record them or ``rerender`` asks: a tokenizer other than the one the gateway served)."""
    sent = None if rerender else truth.calls[want].context_tokens
    sent = list(sent) if sent is not None else prompt_ids(tok, truth, want)
    mine = prompt_ids(tok, imp, got)
    first = next((k for k, (a, b) in enumerate(zip(sent, mine, strict=False)) if a != b), min(len(sent), len(mine)))
    return {"tokens_equal": sent == mine, "tokens_captured": len(sent), "tokens_imported": len(mine),
            "first_token_difference": None if sent == mine else first,
            "tokens_equal_without_system": prompt_ids(tok, truth, want, True) == prompt_ids(tok, imp, got, True)}


def compare(harness: str, out_dir: Path, log: Path, options: ImportOptions | None = None,
            tokenizer: Any = None, rerender: bool = False) -> dict[str, Any]:
    captured = [Trajectory.model_validate(json.loads(line))
                for line in (Path(out_dir) / "trajectories.jsonl").read_text().splitlines() if line.strip()]
    truth = next(t for t in captured if "/side-" not in t.id)
    result = run_import(harness, [Path(log)], options or ImportOptions())
    main = [t for t in result.trajectories if t.lineage.parent is None]
    counts = result.counts()
    row: dict[str, Any] = {
        "harness": harness, "log": str(log),
        "captured": dict(Counter(c.purpose for c in truth.calls)),
        "imported": dict(Counter(c.purpose for c in main[0].calls)) if main else {},
        "rejects_by_reason": counts["rejects_by_reason"], "warnings_by_reason": counts["warnings_by_reason"],
        "calls": [],
    }
    if not main:
        return row
    imp = main[0]
    for summarize in (False, True):
        want = [c for c in truth.calls if (c.purpose == "summarize") == summarize]
        got = [c for c in imp.calls if (c.purpose == "summarize") == summarize]
        for k, wc in enumerate(want):
            entry: dict[str, Any] = {"captured": wc.id, "purpose": wc.purpose, "index": k}
            if k >= len(got):
                missing = ("not_imported", None, "no imported call at this place")
                entry.update(imported=None, equal=False, equal_without_system=False,
                             difference=missing, difference_without_system=missing)
            else:
                a, b = units(truth, wc.context), units(imp, got[k].context)
                diff = first_difference(a, b)
                diff_ns = first_difference(_strip_system(a), _strip_system(b))
                entry.update(imported=got[k].id, equal=diff is None, equal_without_system=diff_ns is None,
                             difference=diff, difference_without_system=diff_ns,
                             captured_units=len(a), imported_units=len(b))
                if tokenizer is not None:
                    entry.update(token_check(tokenizer, truth, truth.calls.index(wc), imp, imp.calls.index(got[k]),
                                             rerender))
            row["calls"].append(entry)
        row.setdefault("unmatched_imported", 0)
        row["unmatched_imported"] += max(0, len(got) - len(want))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    tokens = any("tokens_equal" in c for r in rows for c in r["calls"])
    lines = ["| harness | calls captured | calls imported | equal | equal w/o system prompt | differing "
             "(first difference) | differing w/o system prompt |"
             + (" tokens equal | tokens equal w/o system prompt |" if tokens else "") + " rejected records by reason |",
             "|---|---|---|---|---|---|---|" + ("---|---|" if tokens else "") + "---|"]
    for r in rows:
        calls = r["calls"]
        diff = Counter(c["difference"][0] for c in calls if not c["equal"])
        diff_ns = Counter(c["difference_without_system"][0] for c in calls if not c["equal_without_system"])
        eq = sum(c["equal"] for c in calls)
        eq_ns = sum(c["equal_without_system"] for c in calls)
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"  # noqa: E731
        lines.append(f"| {r['harness']} | {len(calls)} ({fmt(r['captured'])}) | "
                     f"{sum(r['imported'].values())} ({fmt(r['imported'])}) | {eq} | {eq_ns} | "
                     f"{len(calls) - eq} ({fmt(diff)}) | {len(calls) - eq_ns} ({fmt(diff_ns)}) | "
                     + (f"{_tokens_cell(calls, 'tokens_equal')} | {_tokens_cell(calls, 'tokens_equal_without_system')} | "
                        if tokens else "") + f"{fmt(r['rejects_by_reason'])} |")
    return "\n".join(lines)


def _tokens_cell(calls: list[dict[str, Any]], key: str) -> str:
    """"k of n (act a of b)": calls whose imported context renders to the captured ids."""
    act = [c for c in calls if c["purpose"] != "summarize"]
    return (f"{sum(c.get(key, False) for c in calls)} of {len(calls)} "
            f"(act {sum(c.get(key, False) for c in act)} of {len(act)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", nargs=3, action="append", required=True, metavar=("HARNESS", "OUT", "LOG"),
                    help="importer name (claude-code, codex, opencode), gateway output dir, the harness's own log")
    ap.add_argument("--tokenizer", help="also compare token for token, rendered by this tokenizer's chat template "
                    "(the one the gateway served)")
    ap.add_argument("--chat-template", help="with --tokenizer: render with this template (a file or a shipped name)")
    ap.add_argument("--rerender", action="store_true", help="render the captured contexts too, with --tokenizer "
                    "(for a tokenizer other than the one the gateway served: a real vocabulary beside the kit's)")
    ap.add_argument("--tools", action="append", default=[], metavar="HARNESS=SPEC",
                    help="that importer's --tools (a shipped set's name or a JSON file)")
    ap.add_argument("--json", type=Path, help="write every row (with each call's first difference) here")
    ap.add_argument("--details", action="store_true", help="print each call's first difference")
    args = ap.parse_args()
    tok = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        from memorywalker.render.chat_templates import use_chat_template

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        use_chat_template(tok, args.chat_template)
    from memorywalker.importers.tools import load_tool_set
    options = {}
    for pair in args.tools:
        harness, _, spec = pair.partition("=")
        options[harness] = ImportOptions(tools=load_tool_set(spec))
    rows = [compare(h, Path(o), Path(log), options.get(h), tok, args.rerender) for h, o, log in args.case]
    print(table(rows))
    if args.details:
        for r in rows:
            for c in r["calls"]:
                d, ns = c["difference"], c["difference_without_system"]
                tokens = ("" if "tokens_equal" not in c else f" [tokens {c['tokens_captured']} captured, "
                          f"{c['tokens_imported']} imported" + (", equal]" if c["tokens_equal"]
                                                                 else f", first difference at {c['first_token_difference']}]"))
                print(f"{r['harness']} {c['captured']} ({c['purpose']}) -> {c['imported']}{tokens}: "
                      + ("equal" if d is None else f"{d[0]} at unit {d[1]}: {d[2]}")
                      + ("" if d is None or d == ns else " | w/o system prompt: "
                         + ("equal" if ns is None else f"{ns[0]} at unit {ns[1]}: {ns[2]}")))
            if r.get("warnings_by_reason"):
                print(f"{r['harness']} warnings: {r['warnings_by_reason']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
