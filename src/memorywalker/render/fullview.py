"""The full view of a trajectory: the uncompressed chronological transcript (DESIGN.md, SDCC).

Every message in order of first appearance across the calls' contexts and responses, compression
artifacts (``author == "harness"``) removed, each response placed once, rendered as one conversation.
Each selected response is then located in it, so a call's targets can be read off the full view.

>>> messages = full_view_messages(traj)                       # doctest: +SKIP
>>> view = renderer.render(traj, full_view=True).full_view    # doctest: +SKIP
>>> view.response_start[3]   # full-view position of call 3's first response token   # doctest: +SKIP
517
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memorywalker.records.schema import Message, Trajectory
from memorywalker.render.render import RenderedTrajectory, Renderer, tools_to_hf


@dataclass
class FullView:
    token_ids: np.ndarray  # int64 [F]
    response_start: dict[int, int]  # call index -> full-view position of its first response token
    unmatched: list[int] = field(default_factory=list)  # call indices whose response was not found
    # Harness-side calls (a summarization request, a fold): the uncompressed history has no
    # counterpart for them, so they keep their own S_t.
    harness_calls: list[int] = field(default_factory=list)


def answers_harness(traj: Trajectory, index: int) -> bool:
    """True when call ``index`` is a harness-side call (``purpose`` summarize/fold/other): its prompt
    is a harness request and its response is itself a compression artifact."""
    return traj.calls[index].purpose != "act"


def full_view_messages(traj: Trajectory) -> list[Message]:
    """Messages in order of first appearance, artifacts removed, each response once.

    Responses to harness prompts (summaries the model was asked to write) are compression artifacts
    too and are left out.
    """
    table = traj.message_table()
    seen: set[str] = set()
    out: list[Message] = []
    for i, call in enumerate(traj.calls):
        answer = () if answers_harness(traj, i) else (call.response,)
        for mid in (*call.context, *answer):
            m = table[mid]
            if mid in seen or m.is_artifact:
                continue
            seen.add(mid)
            out.append(m)
    return out


def build_full_view(rt: RenderedTrajectory, renderer: Renderer) -> FullView:
    """Render the full view and find where each call with targets has its response tokens.

    A response is located as the exact run of its rendered tokens inside its message's token span
    (so the labels are identical in ``S_t`` and in the full view); a call whose response renders
    differently there (e.g. a template that drops reasoning of earlier turns) is listed as unmatched.
    """
    traj = rt.trajectory
    messages = full_view_messages(traj)
    ids, _, spans = renderer.render_messages(messages, tools_to_hf(traj, None))
    ids, spans = _splice_recorded_responses(rt, renderer, messages, ids, spans)
    ids = np.asarray(ids, dtype=np.int64)
    span_of = {m.id: s for m, s in zip(messages, spans, strict=True)}
    start: dict[int, int] = {}
    unmatched: list[int] = []
    harness_calls = [rc.index for rc in rt.calls if rc.targets and answers_harness(traj, rc.index)]
    for rc in rt.calls:
        if not rc.targets or rc.index in harness_calls:
            continue
        run = np.asarray(rc.tokens[rc.prompt_len: max(rc.targets) + 1], dtype=np.int64)
        a, b = span_of[traj.calls[rc.index].response]
        hit = find_run(ids[a: max(b, a + len(run))], run)
        if hit is None or a + hit == 0:
            unmatched.append(rc.index)
        else:
            start[rc.index] = a + hit
    return FullView(ids, start, unmatched, harness_calls)


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
