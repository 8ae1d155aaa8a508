"""The full view of a trajectory: the uncompressed chronological transcript (DESIGN.md, SDCC).

Every message in order of first appearance across the calls' contexts and responses, compression
artifacts (``author == "harness"``) removed, each response placed once, rendered as one conversation.
Each selected response is then located in it, so a call's targets can be read off the full view.

Only responses the history went on with are placed: a response is kept when a later call's context
holds it or an eviction removes it (it was in the history when the harness took it out), and the last
act call's response is kept (nothing comes after it). Any other response was **abandoned** — a
retry's first attempt, a refused proposal — and no later call saw it, so placing it would condition
every later target on text the agent never had. An abandoned call with targets gets its own short
sequence instead: the full view up to its context, then its response.

>>> messages = full_view_messages(traj)                       # doctest: +SKIP
>>> view = renderer.render(traj, full_view=True).full_view    # doctest: +SKIP
>>> view.response_start[3]   # full-view position of call 3's first response token   # doctest: +SKIP
517
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from memorywalker.records.schema import Message, Trajectory
from memorywalker.render.types import RenderedCall, RenderedTrajectory, tools_to_hf

if TYPE_CHECKING:
    from memorywalker.render.render import Renderer


@dataclass
class FullView:
    token_ids: np.ndarray  # int64 [F]
    response_start: dict[int, int]  # call index -> full-view position of its first response token
    unmatched: list[int] = field(default_factory=list)  # call indices whose response was not found
    # Harness-side calls (a summarization request, a fold): the uncompressed history has no
    # counterpart for them, so they keep their own S_t.
    harness_calls: list[int] = field(default_factory=list)
    # Abandoned calls with targets: call index -> (token ids [F_i] of the full view up to its context
    # followed by its response, position of its first response token there).
    abandoned: dict[int, tuple[np.ndarray, int]] = field(default_factory=dict)


def answers_harness(traj: Trajectory, index: int) -> bool:
    """True when call ``index`` is a harness-side call (``purpose`` summarize/fold/other): its prompt
    is a harness request and its response is itself a compression artifact."""
    return traj.calls[index].purpose != "act"


def abandoned_calls(traj: Trajectory) -> list[int]:
    """Act calls whose response no later call's context holds and no eviction removes (the last act
    call excepted: nothing comes after it). Their responses are not in the full view.

    >>> from memorywalker.records import TrajectoryBuilder
    >>> b = TrajectoryBuilder("t"); s = b.message("system", "s"); u = b.message("user", "u")
    >>> a0, retry, a1 = (b.message("assistant", x) for x in ("a0", "a0 again", "a1"))
    >>> _ = b.call([s, u], a0); _ = b.call([s, u], retry); _ = b.call([s, u, retry], a1)
    >>> abandoned_calls(b.build())
    [0]
    """
    last = max((i for i in range(len(traj.calls)) if not answers_harness(traj, i)), default=-1)
    held = {mid for ev in traj.evictions for mid in ev.removed}  # in the history when an eviction took it out
    out: list[int] = []
    for i in reversed(range(len(traj.calls))):
        call = traj.calls[i]
        if i != last and not answers_harness(traj, i) and call.response not in held:
            out.append(i)
        held.update(call.context)  # a later context, for every call before this one
    return out[::-1]


def full_view_messages(traj: Trajectory, *, artifacts: bool = False) -> list[Message]:
    """Messages in order of first appearance, artifacts removed (``artifacts``: kept where they first
    appear), each kept response once.

    Responses to harness prompts (summaries the model was asked to write) are compression artifacts
    too and are left out (the artifact a harness inserts with their text is what ``artifacts`` keeps),
    and so are abandoned responses (:func:`abandoned_calls`).
    """
    return _full_view_messages(traj, artifacts)[0]


def _full_view_messages(traj: Trajectory, artifacts: bool = False) -> tuple[list[Message], dict[int, int]]:
    """The full view's messages and, per abandoned call, how many of them its context has seen (the
    uncompressed history it was sampled on is that prefix)."""
    table = traj.message_table()
    abandoned = set(abandoned_calls(traj))
    seen: set[str] = set()
    out: list[Message] = []
    prefix: dict[int, int] = {}
    for i, call in enumerate(traj.calls):
        answer = () if answers_harness(traj, i) or i in abandoned else (call.response,)
        for mid in (*call.context, *answer):
            m = table[mid]
            if mid in seen or (m.is_artifact and not artifacts):
                continue
            seen.add(mid)
            out.append(m)
        if i in abandoned:
            prefix[i] = len(out)
    return out, prefix


def build_full_view(rt: RenderedTrajectory, renderer: Renderer) -> FullView:
    """Render the full view and find where each call with targets has its response tokens.

    A response is located as the exact run of its rendered tokens inside its message's token span
    (so the labels are identical in ``S_t`` and in the full view); a call whose response renders
    differently there (e.g. a template that drops reasoning of earlier turns) is listed as unmatched.
    An abandoned call is located the same way in its own sequence (the full view up to its context,
    then its response).
    """
    traj = rt.trajectory
    messages, prefix = _full_view_messages(traj, renderer.options.full_view_artifacts)
    tools = tools_to_hf(traj, None)
    ids, spans = _render(rt, renderer, messages, tools)
    span_of = {m.id: s for m, s in zip(messages, spans, strict=True)}
    view = FullView(ids, {}, harness_calls=[rc.index for rc in rt.calls
                                            if rc.targets and answers_harness(traj, rc.index)])
    table = traj.message_table()
    for rc in rt.calls:
        if not rc.targets or rc.index in view.harness_calls:
            continue
        response = traj.calls[rc.index].response
        if rc.index in prefix:  # abandoned: the full view up to its context, then its response
            own_ids, own_spans = _render(rt, renderer, [*messages[: prefix[rc.index]], table[response]], tools)
            start = _locate(rc, own_ids, own_spans[-1])
            if start is not None:
                view.abandoned[rc.index] = (own_ids, start)
        else:
            start = _locate(rc, ids, span_of[response])
            if start is not None:
                view.response_start[rc.index] = start
        if start is None:
            view.unmatched.append(rc.index)
    return view


def _render(rt: RenderedTrajectory, renderer: Renderer, messages: list[Message],
            tools) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Tokens (int64 [F]) and per-message token spans of ``messages`` as one conversation, with each
    response's recorded tokens spliced in."""
    ids, _, spans = renderer.render_messages(messages, tools)
    ids, spans = _splice_recorded_responses(rt, renderer, messages, ids, spans)
    return np.asarray(ids, dtype=np.int64), spans


def _locate(rc: RenderedCall, ids: np.ndarray, span: tuple[int, int]) -> int | None:
    """Position of the first response token of call ``rc`` inside its message's ``span`` of ``ids``."""
    run = np.asarray(rc.tokens[rc.prompt_len: max(rc.targets) + 1], dtype=np.int64)
    a, b = span
    hit = find_run(ids[a: max(b, a + len(run))], run)
    return None if hit is None or a + hit == 0 else a + hit


def _splice_recorded_responses(rt: RenderedTrajectory, renderer: Renderer, messages: list[Message],
                               ids: list[int], spans: list[tuple[int, int]]):
    """Put each response's recorded (sampled) tokens where the re-rendered text has its canonical
    tokenization, so the full view conditions on exactly the tokens the model produced."""
    recorded = {}
    for rc in rt.calls:
        rec = rc.tokens[rc.prompt_len:]
        if rc.rendered_response is not None and rc.rendered_response != rec:
            call = rt.trajectory.calls[rc.index]
            canon = rc.rendered_response
            # A cut-off response has no terminator; the template's stays after it.
            body = renderer.strip_eot(canon) if call.finish_reason == "length" else canon
            recorded[call.response] = (body, rec)
    if not recorded:
        return ids, spans
    out: list[int] = list(ids[: spans[0][0]]) if spans else []
    new_spans: list[tuple[int, int]] = []
    for m, (a, b) in zip(messages, spans, strict=True):
        piece = ids[a:b]
        if m.id in recorded:
            body, rec = recorded[m.id]
            hit = find_run(np.asarray(piece, dtype=np.int64), np.asarray(body, dtype=np.int64))
            if hit is not None:
                piece = piece[:hit] + list(rec) + piece[hit + len(body):]
        new_spans.append((len(out), len(out) + len(piece)))
        out.extend(piece)
    if spans:
        out.extend(ids[spans[-1][1]:])  # anything the template writes after the last message
    return out, new_spans


def find_run(hay: np.ndarray, run: np.ndarray, allowed: np.ndarray | None = None) -> int | None:
    """First index ``i`` with ``hay[i:i+len(run)] == run`` (and ``allowed`` true on the whole window)."""
    m = len(run)
    if m == 0 or len(hay) < m:
        return None
    win = np.lib.stride_tricks.sliding_window_view(hay, m)
    ok = (win == run[None, :]).all(axis=1)
    if allowed is not None:
        ok &= np.lib.stride_tricks.sliding_window_view(allowed, m).all(axis=1)
    hits = np.flatnonzero(ok)
    return int(hits[0]) if len(hits) else None
