"""Reconstructed contexts checked against the prompt tokens the provider billed for each call.

Many logs record, per model call, the prompt token count the provider billed (Claude Code
``message.usage``, Codex ``token_count`` events, OpenCode step ``tokens``, OpenHands
``model_response.usage``, Pi ``usage``). A replayed context can be wrong in a way the log does not
say - the harness removed content without writing an eviction record - and then every later call
would be trained on text the model never saw. The provider's tokenizer is not the one a user trains
with, so counts are never compared with re-tokenized text; only what a different tokenizer cannot
break is checked:

* **growth inside a segment.** When call ``t+1``'s context extends call ``t``'s context and response
  (call ``t`` is its *prefix parent*), the billed prompt must grow by at least the response:
  ``P[t+1] >= P[t] + R[t] - tol`` with ``tol = max(ABS_TOLERANCE, REL_TOLERANCE * P[t])`` for cache
  accounting and token merges at message boundaries. ``R[t]`` is a lower bound on the response tokens
  that reach the next prompt: the visible output, 0 when the response carries reasoning (providers
  may drop reasoning from later prompts).
* **a new user turn** (a user message between call ``t``'s response and call ``t+1``): OpenAI's
  Responses API keeps a reasoning item in the prompt only until the next user message ("reasoning
  items from turn 1 are ignored and removed" in turn 2: openai-cookbook
  ``examples/responses_api/reasoning_items.ipynb``), so ``P[t]`` held the reasoning of the earlier
  calls of ``t``'s turn and ``P[t+1]`` does not. Where the log
  counts each call's reasoning tokens (``billed_tokens.reasoning``: Codex ``reasoning_output_tokens``)
  the bound is ``P[t+1] >= P[t] + R[t] - D - tol``, ``D`` = the reasoning of the calls of ``t``'s turn
  before ``t`` (``t``'s own reasoning never entered a prompt). ``D`` is an upper bound on what left the
  prompt; a drop beyond it is still flagged. Without reasoning counts ``D = 0``.
* **a drop** below that bound while the replayed context only grew is an eviction the log did not
  record. It is recorded as an *inferred* eviction (``meta.inferred``; ``meta.evidence`` holds the
  numbers and the rule broken; what was removed is unknown, so ``removed`` is empty) and the call is left
  unselected with reason ``context_unverified``, as is every later call whose context still holds a
  message that was in that call's context (the unknown removal may have touched any of them).

Each call gets ``meta.context_check`` = ``verified`` | ``unverified`` | ``unchecked`` (no billed count,
no prefix parent with one, a different model, or a harness-side call such as a compaction summary).

>>> from memorywalker.records import TrajectoryBuilder
>>> b = TrajectoryBuilder("t")
>>> u, a1, r, a2 = (b.message("user", "go"), b.message("assistant", "x"), b.message("user", "more"),
...                 b.message("assistant", "y"))
>>> _ = b.call([u], a1, meta={"billed_tokens": billed(1000, 50)})
>>> _ = b.call([u, a1, r], a2, meta={"billed_tokens": billed(900, 10)})   # 900 < 1000 + 50 - 64
>>> check_billed(b)
>>> [c.meta["context_check"] for c in b.calls], b.calls[1].reason.split(":")[0], b.evictions[0].meta["inferred"]
(['unchecked', 'unverified'], 'context_unverified', True)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from memorywalker.records import Call, Trajectory, TrajectoryBuilder

ABS_TOLERANCE = 64  # tokens: cache accounting and merges at message boundaries (real sessions: <= 27)
REL_TOLERANCE = 0.002  # of the earlier prompt
VERIFIED, UNVERIFIED, UNCHECKED = "verified", "unverified", "unchecked"
CHECKS = (VERIFIED, UNVERIFIED, UNCHECKED)

# hint(parent call, call) -> eviction fields (kind, trigger, tokens_before, meta) for an inferred drop
Hint = Callable[[Call, Call], dict[str, Any]]


GROWTH_RULE = "P[t+1] >= P[t] + R[t] - tol (the context extends call t's context and response)"
TURN_RULE = ("P[t+1] >= P[t] + R[t] - D - tol (a new user turn: the provider dropped D reasoning tokens "
             "of the earlier calls of call t's turn)")


def billed(prompt: Any, response: Any = 0, model: str | None = None, cache_read: Any = None,
           reasoning: Any = None) -> dict[str, Any] | None:
    """The ``meta.billed_tokens`` record of one call, or None when the log has no usable count.
    ``cache_read`` (the prompt's cached prefix, where the log has it) is evidence only: a drop with a
    cache miss means the prefix changed - an early message, or the system prompt or tools, which no
    log here records. ``reasoning`` (the call's reasoning output tokens, where the log counts them)
    is what a new user turn may drop from later prompts (module docstring)."""
    if not isinstance(prompt, int | float) or isinstance(prompt, bool) or not math.isfinite(prompt) or prompt <= 0:
        return None
    r = response if isinstance(response, int | float) and not isinstance(response, bool) and math.isfinite(response) else 0
    out: dict[str, Any] = {"prompt": int(prompt), "response": max(0, int(r))}
    if model:
        out["model"] = model
    if isinstance(cache_read, int) and not isinstance(cache_read, bool) and cache_read >= 0:
        out["cache_read"] = cache_read
    if isinstance(reasoning, int) and not isinstance(reasoning, bool) and reasoning >= 0:
        out["reasoning"] = reasoning
    return out


def tolerance(prompt: int) -> int:
    return max(ABS_TOLERANCE, math.ceil(REL_TOLERANCE * prompt))


def prefix_parents(calls: list[Call]) -> list[int | None]:
    """Per call, the index of the latest earlier call whose context + response is a prefix of its
    context (the longest such sequence), or None. Prefix hashes make it linear in context length."""
    seen: dict[int, list[int]] = {}
    out: list[int | None] = []
    for i, call in enumerate(calls):
        h, best = 0, None
        for k, mid in enumerate(call.context, 1):
            h = hash((h, mid))
            for j in seen.get(h, ()):
                s = calls[j]
                if len(s.context) + 1 == k and [*s.context, s.response] == call.context[:k]:
                    best = j
        out.append(best)
        seen.setdefault(hash((h, call.response)), []).append(i)
    return out


def check_billed(builder: TrajectoryBuilder, result: Any = None, hint: Hint | None = None) -> None:
    """Set ``meta.context_check`` on every call of ``builder``; record inferred evictions for drops and
    unselect the calls they make unverifiable (module docstring). ``result`` (an ImportResult) counts
    the outcome in its notes."""
    calls = builder.calls
    if not calls:
        return
    parents = prefix_parents(calls)
    artifacts = {m.id for m in builder.messages if m.author == "harness"}
    dropped = reasoning_dropped(calls, parents, {m.id for m in builder.messages if m.role == "user"})
    exposed: set[str] = set()  # messages present when an unrecorded eviction happened
    first_drop: str | None = None
    for i, call in enumerate(calls):
        status, drop = _check(calls, i, parents[i], dropped[i])
        if drop is not None:
            fields = {"kind": "other", "meta": {}}
            if hint is not None:
                fields.update(hint(calls[parents[i]], call))
            meta = {**fields.pop("meta"), "inferred": True, "evidence": drop}
            builder.eviction(call.id, fields.pop("kind"), [], [], meta=meta, **fields)
            exposed |= set(call.context) - artifacts
            first_drop = first_drop or call.id
            _unselect(call, f"context_unverified: the billed prompt fell from {drop['billed_prompt_before']} to "
                            f"{drop['billed_prompt_after']} tokens after call {drop['previous_call']!r} (expected at "
                            f"least {drop['expected_at_least']} - {drop['tolerance']}: {drop['rule']}) with no "
                            "recorded eviction; what was removed is unknown")
        elif exposed and exposed & set(call.context):
            status = UNVERIFIED
            _unselect(call, f"context_unverified: its context holds messages that an unrecorded eviction (first "
                            f"before call {first_drop!r}) may have changed")
        call.meta["context_check"] = status
        if result is not None:
            result.notes[f"context_check:{status}"] += 1
    if first_drop is not None:  # keep evictions in call order
        order = {c.id: i for i, c in enumerate(calls)}
        builder.evictions.sort(key=lambda ev: order.get(ev.before_call, len(order)))


def reasoning_dropped(calls: list[Call], parents: list[int | None], users: set[str]) -> list[int | None]:
    """Per call, the reasoning tokens its prompt lost against its prefix parent's prompt: at a new user
    turn (a message of ``users`` after the parent's response) the reasoning of the earlier calls of
    the parent's turn, else 0; None with no prefix parent. A call without a reasoning count adds 0.

    >>> from memorywalker.records import Call
    >>> c = [Call(id=f"c{i}", context=ctx, response=r, meta={"billed_tokens": {"reasoning": 100 * (i + 1)}})
    ...      for i, (ctx, r) in enumerate([(["u"], "a"), (["u", "a", "t"], "b"), (["u", "a", "t", "b", "v"], "c")])]
    >>> reasoning_dropped(c, [None, 0, 1], users={"u", "v"})   # c2 starts a turn: c0's 100 leave the prompt
    [None, 0, 100]
    """
    held: list[int] = []  # reasoning tokens in each call's prompt (earlier calls of its turn)
    out: list[int | None] = []
    for call, p in zip(calls, parents, strict=True):
        if p is None:
            held.append(0)
            out.append(None)
            continue
        parent = calls[p]
        new_turn = any(m in users for m in call.context[len(parent.context) + 1:])
        out.append(held[p] if new_turn else 0)
        own = (parent.meta.get("billed_tokens") or {}).get("reasoning", 0)
        held.append(0 if new_turn else held[p] + own)
    return out


def _check(calls: list[Call], i: int, parent: int | None, dropped: int | None) -> tuple[str, dict | None]:
    call = calls[i]
    now = call.meta.get("billed_tokens")
    if not now or call.purpose != "act" or parent is None:
        return UNCHECKED, None
    prev = calls[parent]
    before = prev.meta.get("billed_tokens")
    if not before or prev.purpose != "act" or before.get("model") != now.get("model"):
        return UNCHECKED, None
    tol = tolerance(before["prompt"])
    expected = before["prompt"] + before["response"] - (dropped or 0)
    if now["prompt"] >= expected - tol:
        return VERIFIED, None
    evidence = {"previous_call": prev.id, "billed_prompt_before": before["prompt"],
                "billed_prompt_after": now["prompt"], "response_tokens_before": before["response"],
                "reasoning_dropped": dropped or 0, "expected_at_least": expected, "tolerance": tol,
                "rule": TURN_RULE if dropped else GROWTH_RULE}
    if "cache_read" in now:
        evidence["cache_read_after"] = now["cache_read"]
    return UNVERIFIED, evidence


def _unselect(call: Call, reason: str) -> None:
    if call.selected:
        call.selected, call.reason = False, reason
    else:
        call.meta["context_unverified"] = reason


def lost_to_check(call: Call) -> bool:
    """Whether ``call`` is left unselected because its context is unverified (and for nothing else)."""
    return not call.selected and (call.reason or "").startswith("context_unverified")


def check_counts(trajectories: Iterable[Trajectory]) -> dict[str, Counter]:
    """Per source file: calls verified / unverified / unchecked (calls without the key: unchecked), and
    ``unselected``: the unverified calls the check took out of training (:func:`lost_to_check`)."""
    out: dict[str, Counter] = {}
    for t in trajectories:
        c = out.setdefault(t.lineage.source_path or t.id, Counter({k: 0 for k in (*CHECKS, "unselected")}))
        for call in t.calls:
            c[call.meta.get("context_check", UNCHECKED)] += 1
            c["unselected"] += lost_to_check(call)
    return out
