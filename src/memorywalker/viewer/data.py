"""What the viewer page shows, as one JSON-ready dict per trajectory (pure; no HTML here).

Messages are stored once and calls refer to them by index, so a 218-call session whose contexts add
up to millions of tokens embeds only its message table (the unique text) plus a few integers per call.

* Without a tokenizer, segments are message-level (:func:`~memorywalker.tree.message_segments`) and a
  selected call's whole response is marked as its target.
* With a :class:`~memorywalker.render.Renderer`, every call is rendered: segments and junctions come
  from the :class:`~memorywalker.tree.ConditioningTree`, sizes are ``|S_t|`` in tokens, and each call's
  response is shown token by token with its target tokens marked.
* With a per-token gap report (``memorywalker gap --json --per-token``), each target token also carries
  ``|logp_train - logp_rollout|`` per method, drawn as a heat map.
"""

from __future__ import annotations

import json
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Message, Trajectory
from memorywalker.tree.segments import message_segments
from memorywalker.tree.tree import ConditioningTree


def message_text(m: Message) -> str:
    """The text a reader needs of one message: reasoning, content, then each tool call on its own line.

    >>> from memorywalker.records.schema import ToolCall
    >>> message_text(Message(id="m", role="assistant", content="ok",
    ...                      tool_calls=[ToolCall(id="c", name="ls", arguments={"path": "."})]))
    'ok\\n→ ls({"path": "."})'
    """
    parts = []
    if m.reasoning:
        parts.append(f"[reasoning] {m.reasoning}")
    if m.content:
        parts.append(m.content)
    for tc in m.tool_calls:
        args = tc.arguments if isinstance(tc.arguments, str) else json.dumps(tc.arguments, ensure_ascii=False)
        parts.append(f"→ {tc.name}({args})")
    return "\n".join(parts)


def view_data(traj: Trajectory, *, renderer=None, gap: dict | None = None) -> dict[str, Any]:
    """The page data of one trajectory; ``gap`` is the per-token report of ``memorywalker gap --per-token``."""
    index = {m.id: i for i, m in enumerate(traj.messages)}
    call_index = {c.id: i for i, c in enumerate(traj.calls)}
    messages = [{"role": m.role, "artifact": m.is_artifact, "text": message_text(m),
                 **({"name": m.name} if m.name else {})} for m in traj.messages]
    evictions = []
    eviction_at: dict[int, list[int]] = {}
    for k, ev in enumerate(traj.evictions):
        at = call_index[ev.before_call]
        eviction_at.setdefault(at, []).append(k)
        evictions.append({"call": at, "kind": ev.kind, "trigger": ev.trigger,
                          "removed": [index[m] for m in ev.removed if m in index],
                          "inserted": [index[m] for m in ev.inserted if m in index],
                          "tokens_before": ev.tokens_before, "tokens_after": ev.tokens_after,
                          "inferred": bool(ev.meta.get("inferred"))})

    calls = [{"id": c.id, "context": [index[m] for m in c.context], "response": index[c.response],
              "selected": c.selected, "reason": c.reason, "purpose": c.purpose, "finish": c.finish_reason,
              "chars": sum(len(messages[index[m]]["text"]) for m in c.context),
              "evictions": eviction_at.get(i, [])} for i, c in enumerate(traj.calls)]
    segments = message_segments(traj)
    tokens: dict[str, Any] | None = None
    if renderer is not None:
        segments, tokens = _token_view(traj, renderer, calls)
    for i, c in enumerate(calls):
        c["segment"] = segments[i]
        c["junction"] = i > 0 and segments[i] != segments[i - 1]

    out: dict[str, Any] = {
        "id": traj.id,
        "source": traj.lineage.source,
        "source_path": traj.lineage.source_path,
        "parent": traj.lineage.parent,
        "reconstructed": bool(traj.meta.get("reconstructed")),
        "messages": messages,
        "calls": calls,
        "evictions": evictions,
        "segments": (segments[-1] + 1) if segments else 0,
        "tokenized": tokens is not None,
    }
    if tokens is not None:
        out["tokenizer"] = tokens["tokenizer"]
    if gap is not None:
        out["gap"] = _gap_view(traj, gap, calls)
    return out


def _token_view(traj: Trajectory, renderer, calls: list[dict]) -> tuple[list[int], dict]:
    """Render every call; fill each call's sizes and response tokens; return token-level segments."""
    rt = renderer.render(traj)
    tree = ConditioningTree.build([rt])
    tok = renderer.tok
    for c, rc in zip(calls, rt.calls, strict=True):
        resp = rc.tokens[rc.prompt_len:]
        targets = set(rc.targets)
        c["tokens"] = len(rc.tokens)
        c["prompt_tokens"] = rc.prompt_len
        c["targets"] = len(rc.targets)
        c["render_reason"] = rc.reason
        c["resp_tokens"] = [tok.decode([t]) for t in resp]
        c["resp_target"] = [int(rc.prompt_len + j in targets) for j in range(len(resp))]
    segments = [row.segment for row in tree.calls]
    return segments, {"tokenizer": getattr(tok, "name_or_path", None), "unique_tokens": len(tree)}


def _gap_view(traj: Trajectory, gap: dict, calls: list[dict]) -> dict[str, Any]:
    """Per call: ``diff[method][j]`` = |logp_train - logp_rollout| of response token j (None where absent)."""
    per_traj = (gap.get("tokens") or {}).get(traj.id)
    if per_traj is None:
        raise InputError(f"the gap report has no per-token values for trajectory {traj.id!r} "
                         "(write it with `memorywalker gap --json --per-token`)")
    methods = sorted({m for rows in per_traj.values() for m in rows["logprob"]})
    out: dict[str, Any] = {"methods": methods, "calls": {}}
    for i, c in enumerate(calls):
        rows = per_traj.get(c["id"])
        if rows is None or "prompt_tokens" not in c:
            continue
        n = len(c["resp_tokens"])
        diff = {}
        for m in methods:
            d: list[float | None] = [None] * n
            for off, lp, ro in zip(rows["offset"], rows["logprob"][m], rows["rollout"], strict=True):
                j = off - c["prompt_tokens"]
                if 0 <= j < n and lp is not None and ro is not None:
                    d[j] = abs(lp - ro)
            diff[m] = d
        out["calls"][str(i)] = diff
    return out
