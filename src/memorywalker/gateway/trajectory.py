"""Captured calls → schema-v1 trajectories: lines of a session, and what each branch was.

A session (one harness session id) holds a **main line** — the calls with the agent's system prompt
and tools, and the compaction calls the harness made for it — and **side lines**: calls with another
system prompt or tool set (titles, subagents), each a trajectory of its own with lineage
``relation="side"`` to the main one.

Between consecutive calls of a line, a call whose ``context_tokens`` do not extend its predecessor's
``context_tokens + response_tokens`` is a branch, classified (:func:`classify_branch`):

* ``template-drift`` — the messages extend the predecessor's (its context and its response) under the
  same tools, but the ids do not: the harness sent an earlier response back as text that renders to
  other ids (stripped whitespace or reasoning, re-serialized tool-call JSON), or the template rewrote
  an earlier turn (the same messages under another tool set are ``other``);
* ``summarize`` — the context holds the response of an earlier summarization call of the line (its
  messages become compression artifacts, ``author="harness"``);
* ``placeholder`` — tool results were replaced by other text for the same tool call (pruned output);
* ``prune`` — messages were removed and nothing took their place;
* ``other`` — anything else, among it the branch into a summarization request (usually built from an
  earlier state, under another prompt or tool set; ``trigger="summarization-request"``).

Each branch is an :class:`~memorywalker.records.schema.Eviction` before the call; the per-kind counts
are in ``trajectory.meta["branches"]``.

>>> from memorywalker.records.schema import Message
>>> m = lambda i, role, text="": Message(id=i, role=role, content=text)
>>> prev = {"context": ["s", "u"], "response": "a"}
>>> table = {"s": m("s", "system"), "u": m("u", "user", "go"), "a": m("a", "assistant", "Ok "),
...          "a2": m("a2", "assistant", "Ok")}
>>> classify_branch(prev, {"context": ["s", "u", "a2"]}, table, summaries=[])
('template-drift', ['a'], ['a2'])
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from memorywalker.records.schema import Call, Eviction, Lineage, Message, ToolSchema, Trajectory

SIDE = "side"


def line_key(record: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """What makes calls one line: the first system message and the names of the tools offered."""
    msgs = record["messages"]
    system = msgs[0]["id"] if msgs and msgs[0]["role"] == "system" else None
    return system, tuple(sorted(t["name"] for t in record.get("tools") or []))


def split_lines(records: list[dict[str, Any]]) -> tuple[list[dict], list[list[dict]]]:
    """(main line, side lines) of one session's call records, in call order.

    The main line's key is that of the first call offering tools (the agent), else of the first call;
    summarization calls join the main line whatever their prompt.
    """
    if not records:
        return [], []
    agent = next((r for r in records if r.get("tools")), records[0])
    main_key = line_key(agent)
    main: list[dict] = []
    sides: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("purpose") == "summarize" or line_key(r) == main_key:
            main.append(r)
        else:
            sides.setdefault(line_key(r), []).append(r)
    return main, list(sides.values())


def _extends(prev: dict[str, Any], cur: dict[str, Any]) -> bool:
    seq = prev["context_tokens"] + prev["response_tokens"]
    return cur["context_tokens"][: len(seq)] == seq


def classify_branch(prev: dict[str, Any], cur: dict[str, Any], table: dict[str, Message],
                    summaries: list[str]) -> tuple[str, list[str], list[str]]:
    """(kind, removed ids, inserted ids) of the branch from call ``prev`` to call ``cur``.

    ``summaries`` are the responses of the line's summarization calls so far (their text).
    """
    before = [*prev["context"], prev["response"]]
    after = cur["context"]
    lcp = 0
    while lcp < min(len(before), len(after)) and before[lcp] == after[lcp]:
        lcp += 1
    removed = [i for i in before[lcp:] if i not in set(after)]
    inserted = [i for i in after[lcp:] if i not in set(before)]
    if lcp == len(before):
        if prev.get("tools") != cur.get("tools"):
            return "other", [], []  # the same messages under another tool set (a compaction request offers none)
        return "template-drift", [], []  # the same messages, other ids: the template rewrote them
    if lcp == len(before) - 1 and after[lcp:] and table[after[lcp]].role == "assistant":
        return "template-drift", [before[-1]], [after[lcp]]  # the response came back changed
    if cur.get("purpose") == "summarize":
        return "other", removed, inserted  # the compaction request itself: built from an earlier state
    lines = {line for s in summaries for line in summary_lines(s)}
    # Right after a summarization call, the restart may repeat an earlier compacted context word for
    # word (the same summary): any carrier of it counts, not only the rewritten tail.
    scope = after if prev.get("purpose") == "summarize" else after[lcp:]
    carriers = [i for i in scope if any(line in table[i].content for line in lines)]
    if carriers:
        return "summarize", removed, list(dict.fromkeys([*carriers, *inserted]))
    old_results = {table[i].tool_call_id for i in removed if table[i].role == "tool"}
    if any(table[i].role == "tool" and table[i].tool_call_id in old_results for i in inserted):
        return "placeholder", removed, inserted
    if removed and not inserted:
        return "prune", removed, []
    return "other", removed, inserted


def summary_lines(summary: str, shortest: int = 16) -> list[str]:
    """The lines of a summary a harness carries into the next context, whatever it wraps them in.

    Harnesses reformat the summary they asked for (Claude Code drops ``<analysis>`` and unwraps
    ``<summary>``), so a context carries it when it contains one of its lines of some length.

    >>> summary_lines("<analysis>x</analysis>\\n<summary>Read notes.txt and ran ls.</summary>")
    ['Read notes.txt and ran ls.']
    """
    text = re.sub(r"<analysis>.*?</analysis>", "", summary, flags=re.S)
    text = re.sub(r"</?summary>", "\n", text)
    return [line.strip() for line in text.splitlines() if len(line.strip()) >= shortest]


def build_line(calls: list[dict[str, Any]], trajectory_id: str, *, lineage: Lineage | None = None) -> Trajectory:
    """One trajectory from a line's call records (journal dicts, in call order)."""
    table: dict[str, Message] = {}
    tools: dict[str, ToolSchema] = {}
    out_calls: list[Call] = []
    evictions: list[Eviction] = []
    summaries: list[str] = []
    counts: Counter[str] = Counter()
    for k, r in enumerate(calls):
        for d in [*r["messages"], r["response"]]:
            table.setdefault(d["id"], Message.model_validate(d))
        for t in r.get("tools") or []:
            tools.setdefault(t["name"], ToolSchema.model_validate(t))
        if k and not _extends(calls[k - 1], r):
            p = calls[k - 1]
            prev = {"context": [m["id"] for m in p["messages"]], "response": p["response"]["id"],
                    "purpose": p.get("purpose"), "tools": [t["name"] for t in p.get("tools") or []]}
            cur = {"context": [m["id"] for m in r["messages"]], "tools": [t["name"] for t in r.get("tools") or []],
                   "purpose": r.get("purpose")}
            kind, removed, inserted = classify_branch(prev, cur, table, summaries)
            counts[kind] += 1
            if kind == "summarize":
                for i in inserted:
                    table[i].author = "harness"
            # A summarization request is usually built from an earlier state (its predecessor's response
            # dropped): its branch is the compaction starting, named by its trigger.
            trigger = "summarization-request" if r.get("purpose") == "summarize" else "harness"
            evictions.append(Eviction(before_call=r["id"], kind=kind, removed=removed, inserted=inserted,
                                      trigger=trigger, tokens_before=len(calls[k - 1]["context_tokens"]),
                                      tokens_after=len(r["context_tokens"])))
        if r.get("purpose") == "summarize":
            summaries.append(r["response"]["content"])
        meta = {key: r[key] for key in ("dialect", "time", "latency_s", "sample_s", "parse_error", "ignored",
                                                    "undelivered", "redacted")
                if r.get(key) not in (None, [], "")}
        out_calls.append(Call(
            id=r["id"], context=[m["id"] for m in r["messages"]], response=r["response"]["id"],
            tools=[t["name"] for t in r.get("tools") or []], context_tokens=r["context_tokens"],
            response_tokens=r["response_tokens"], rollout_logprobs=r.get("rollout_logprobs"),
            finish_reason=r["finish_reason"], purpose=r.get("purpose", "act"), meta=meta))
    for m in table.values():
        if m.author is None:
            m.author = {"system": "system", "user": "user", "assistant": "model", "tool": "environment"}[m.role]
    first = calls[0] if calls else {}
    return Trajectory(
        id=trajectory_id, messages=list(table.values()), calls=out_calls, evictions=evictions,
        tools=list(tools.values()), lineage=lineage or Lineage(source="gateway"),
        meta={"session": first.get("session"), "model": first.get("model"), "harness": first.get("harness"),
              "policy": {"name": first.get("backend"), "temperature": first.get("temperature", 1.0)},
              **{k: first[k] for k in ("chat_template", "tool_parser") if first.get(k)},
              "branches": dict(counts), "template_drift": counts["template-drift"]})


def build_session(records: list[dict[str, Any]], session: str) -> list[Trajectory]:
    """The main trajectory of a session and one per side line; ``undelivered`` events are folded into their calls."""
    undelivered = {r["call"]: r.get("reason") for r in records if r.get("kind") == "undelivered"}
    calls = sorted((r for r in records if r.get("kind") == "call"), key=lambda r: r["seq"])
    for r in calls:
        if r["id"] in undelivered:
            r["undelivered"] = undelivered[r["id"]]
    main, sides = split_lines(calls)
    out = [build_line(main, session)] if main else []
    for k, line in enumerate(sides):
        out.append(build_line(line, f"{session}/{SIDE}-{k}",
                              lineage=Lineage(parent=session if main else None, relation=SIDE, source="gateway")))
    return out
