"""Black-box context reconstruction: a trajectory from the contexts a harness delivered, and nothing else.

A black-box log (a logging proxy's request/response pairs, a SWE-agent replay, the requests a harness
sent) holds each call's context as a list of messages, with no ids and no record of what the harness
compressed. Two pieces rebuild what the records need:

* :class:`ContentTable` — message identity by content: equal messages at the same occurrence in a
  context share an id, so identical prefixes of different calls share ids and form one tree.
* :func:`infer_evictions` — wherever a call's context does not extend the previous call's context and
  response, an eviction (``meta.inferred``): what the new context lacks was removed, what it holds new
  before its last retained message was inserted.

>>> from memorywalker.records.builder import TrajectoryBuilder
>>> b = TrajectoryBuilder("t")
>>> table = ContentTable(b)
>>> sys_, task, obs = ({"role": "system", "content": "s"}, {"role": "user", "content": "task"},
...                   {"role": "tool", "content": "long output", "tool_call_id": "c1"})
>>> act = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "read", "arguments": {}}]}
>>> first = table.context([sys_, task])
>>> _ = b.call(first, table.get("act", 0, act))
>>> summary = {"role": "user", "content": "summary: read the file"}
>>> second = table.context([sys_, summary])  # the harness compacted: task and the act are gone
>>> _ = b.call(second, table.get("done", 0, {"role": "assistant", "content": "done"}))
>>> second[0] == first[0]  # the system message is one message of the tree
True
>>> infer_evictions(b, "summarize", artifact_ids={second[1]})
>>> ev = b.evictions[0]
>>> (ev.kind, len(ev.removed), ev.inserted == [second[1]], ev.meta)
('summarize', 2, True, {'inferred': True})
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

from memorywalker.records.builder import TrajectoryBuilder


class ContentTable:
    """Black-box message identity: equal messages at the same occurrence in a context share an id.

    A context that repeats a message verbatim keeps both copies (occurrence 0 and 1), so contexts
    never list an id twice and identical prefixes of different calls share ids.
    """

    def __init__(self, builder: TrajectoryBuilder):
        self.builder = builder
        self.ids: dict[tuple[str, int], str] = {}

    def context(self, messages: list[dict]) -> list[str]:
        seen: Counter = Counter()
        out = []
        for m in unique_tool_call_ids(messages):
            key = json.dumps(m, sort_keys=True, ensure_ascii=False)
            out.append(self.get(key, seen[key], m))
            seen[key] += 1
        return out

    def get(self, key: str, occurrence: int, fields: dict) -> str:
        mid = self.ids.get((key, occurrence))
        if mid is None:
            digest = hashlib.sha1(key.encode()).hexdigest()[:10]
            mid = self.builder.message(id=f"m{len(self.builder.messages)}-{digest}", **fields)
            self.ids[(key, occurrence)] = mid
        return mid


def unique_tool_call_ids(messages: list[dict]) -> list[dict]:
    """Rename tool-call ids that an earlier assistant message of the list already used (``id#2``).

    Some harnesses reuse ids (SWE-agent replays, proxies that number calls per request); schema v1
    needs them unique per trajectory. Renaming depends only on the order of the list, so every
    context that contains the same history gets the same ids. Tool results follow the latest use.
    """
    seen: dict[str, int] = {}
    current: dict[str, str] = {}
    out = []
    for m in messages:
        if m.get("tool_calls"):
            tcs = []
            for tc in m["tool_calls"]:
                n = seen.get(tc["id"], 0)
                seen[tc["id"]] = n + 1
                current[tc["id"]] = tc["id"] if n == 0 else f"{tc['id']}#{n + 1}"
                tcs.append({**tc, "id": current[tc["id"]]})
            m = {**m, "tool_calls": tcs}
        elif m.get("role") == "tool" and m.get("tool_call_id") in current:
            m = {**m, "tool_call_id": current[m["tool_call_id"]]}
        out.append(m)
    return out


def infer_evictions(builder: TrajectoryBuilder, kind: str, artifact_ids: set[str] | None = None) -> None:
    """Black-box evictions: wherever a call's context does not extend the previous call's sequence.

    ``removed`` = messages of the previous context + response that the new context lacks;
    ``inserted`` = new messages placed before the last retained one (replacements such as
    placeholders), or the harness artifacts among the new ones. Marked ``meta.inferred``.
    """
    artifact_ids = artifact_ids or set()
    for prev, call in zip(builder.calls, builder.calls[1:], strict=False):
        before = [*prev.context, prev.response]
        if call.context[: len(before)] == before:
            continue
        now = set(call.context)
        removed = [m for m in before if m not in now]
        old = set(before)
        last_kept = max((i for i, m in enumerate(call.context) if m in old), default=-1)
        inserted = [m for i, m in enumerate(call.context) if m not in old and (i < last_kept or m in artifact_ids)]
        builder.eviction(call.id, kind, removed, inserted, meta={"inferred": True})
