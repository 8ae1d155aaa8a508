"""Cline and Roo Code task folders, built by hand in the shapes their sources write:
cline/cline [791d238] src/core/context/context-management/ContextManager.ts (deleted range, context
history updates), src/core/task/message-state.ts (conversationHistoryIndex / DeletedRange on ui
messages); RooCodeInc/Roo-Code [cb83656] src/core/condense/index.ts (non-destructive condense,
getEffectiveApiHistory), src/core/context-management/index.ts (truncateConversation)."""

from __future__ import annotations

import json
from pathlib import Path

from memorywalker.importers import run_import
from memorywalker.records import check_trajectory
from memorywalker.render import Renderer
from memorywalker.tree import ConditioningTree

DUP = ("[[NOTE] This file read has been removed to save space in the context window. Refer to the latest file "
       "read for the most up to date version of this file.]")
TRUNC = ("[NOTE] Some previous conversation history with the user has been removed to maintain optimal context "
         "window length. The initial user task has been retained for continuity, while intermediate conversation "
         "history has been removed. Keep this in mind as you continue assisting the user. Pay special attention to "
         "the user's latest messages.")


def _segments(tokenizer, traj) -> int:
    return len(ConditioningTree.build([Renderer(tokenizer).render(traj)]).segments(0))


def _counts_add_up(res) -> None:
    assert res.read == res.imported + sum(res.skipped.values()) + res.rejected


def _t(text):
    return {"type": "text", "text": text}


def _use(tid, name="read_file"):
    return {"type": "tool_use", "id": tid, "name": name, "input": {"path": "a.py"}}


def _res(tid, text):
    return {"type": "tool_result", "tool_use_id": tid, "content": [_t(text)]}


def _cline_history() -> list[dict]:
    return [{"role": "user", "content": [_t("<task>fix a.py</task>")]},
            {"role": "assistant", "content": [_t("I'll read it."), _use("t1")]},
            {"role": "user", "content": [_res("t1", "x = 1"), _t("<environment_details>e1</environment_details>")]},
            {"role": "assistant", "content": [_t("Reading again."), _use("t2")]},
            {"role": "user", "content": [_res("t2", "x = 2"), _t("<environment_details>e2</environment_details>")]},
            {"role": "assistant", "content": [_t("Fixed.")]},
            {"role": "user", "content": [_t("now add a test")]},
            {"role": "assistant", "content": [_t("Test added.")]}]


def _ui(ts, index, say="text", rng=None, info=None) -> dict:
    m = {"ts": ts, "type": "say", "say": say, "conversationHistoryIndex": index}
    if info is not None:
        m["text"] = json.dumps(info)
    if rng is not None:
        m["conversationHistoryDeletedRange"] = rng
    return m


def _cline_task(tmp: Path, with_ui: bool = True) -> Path:
    task = tmp / "tasks" / "1760000000000"
    task.mkdir(parents=True)
    (task / "api_conversation_history.json").write_text(json.dumps(_cline_history()))
    if with_ui:
        ui = [_ui(100, 0, "api_req_started", info={"tokensIn": 10, "tokensOut": 50, "cacheWrites": 1000, "cacheReads": 0}),
              _ui(101, 0),
              _ui(200, 2, "api_req_started", info={"tokensIn": 5, "tokensOut": 40, "cacheWrites": 100, "cacheReads": 1010}),
              _ui(201, 2, "tool"),
              _ui(300, 4, "api_req_started", info={"tokensIn": 5, "tokensOut": 10, "cacheWrites": 185, "cacheReads": 1110}),
              _ui(301, 4),
              _ui(400, 6, "api_req_started", info={"tokensIn": 5, "tokensOut": 10, "cacheWrites": 900, "cacheReads": 0}),
              _ui(401, 6, rng=[2, 3])]
        (task / "ui_messages.json").write_text(json.dumps(ui))
    # message 2 block 0 (the first read) replaced at ts 200, message 1 block 0 by the truncation notice at 300:
    # each update carries the ts of the api request before the one that made it.
    updates = [[2, [2, [[0, [[200, "text", [DUP], []]]]]]], [1, [0, [[0, [[300, "text", [TRUNC], []]]]]]]]
    (task / "context_history.json").write_text(json.dumps(updates))
    return task


def test_cline_deleted_range_and_context_updates(tmp_path, tokenizer):
    """Calls by hand (ids = history index, ``#k`` for a message's parts, ``@2`` a rewritten version):
    call-0 [0] · call-1 [0 1 2#0 2#1] (the update at ts 200 is not before its request at ts 200) ·
    call-2 [0 1 2@2#0 2@2#1 3 4#0 4#1] (the duplicate read replaced: a placeholder eviction) ·
    call-3 [0 1@2 4@2 5 6]: range [2, 3] cut messages 2-3, message 1 carries the truncation notice and
    message 4, the first kept, lost its tool_result (a truncate eviction). Billed: 1115 ≥ 1010 + 50 -
    64 (call-1), 1300 ≥ 1010 + 50 - 64 (call-2's prefix parent is call-0: message 2 changed), call-3 a
    junction. Segments 3."""
    _cline_task(tmp_path)
    res = run_import("cline", [tmp_path / "tasks"])
    (traj,) = res.trajectories
    assert check_trajectory(traj) is None
    assert [c.context for c in traj.calls] == [
        ["0"], ["0", "1", "2#0", "2#1"], ["0", "1", "2@2#0", "2@2#1", "3", "4#0", "4#1"], ["0", "1@2", "4@2", "5", "6"]]
    assert [c.response for c in traj.calls] == ["1", "3", "5", "7"]
    table = traj.message_table()
    assert table["2@2#0"].content == DUP and table["2@2#0"].tool_call_id == "t1"
    assert table["1@2"].content == TRUNC and table["4@2"].content == "<environment_details>e2</environment_details>"
    ph, cut = traj.evictions
    assert (ph.kind, ph.before_call, ph.removed, ph.inserted) == ("placeholder", "call-2", ["2#0", "2#1"],
                                                                  ["2@2#0", "2@2#1"])
    assert (cut.kind, cut.before_call, cut.meta["deleted_range"]) == ("truncate", "call-3", [2, 3])
    assert cut.removed == ["1", "2@2#0", "2@2#1", "3", "4#0", "4#1"] and cut.inserted == ["1@2", "4@2"]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified", "unchecked"]
    assert _segments(tokenizer, traj) == 3
    assert res.read == 11 and res.imported == 8 and res.rejects == []  # 8 messages, ui_messages, 2 updates
    _counts_add_up(res)


def test_cline_without_ui_messages_marks_ranges_unknown(tmp_path):
    """Without ui_messages.json Cline's deleted ranges and request times are unknown: the history is
    replayed whole (updates all applied) and every call says so."""
    res = run_import("cline", [_cline_task(tmp_path, with_ui=False)])
    (traj,) = res.trajectories
    assert traj.calls[-1].context[:2] == ["0", "1@2"] and "3" in traj.calls[-1].context
    assert all(c.meta["deleted_range"] == "unknown" for c in traj.calls)
    assert res.notes["deleted_ranges_unknown"] == 4
    _counts_add_up(res)


def test_cline_malformed_context_history_items_are_rejected_one_by_one(tmp_path):
    """context_history.json of five items: the two good updates of ``_cline_task`` (applied as before:
    call-3's context is ``0 1@2 4@2 5 6``), then a bare number, an item whose block list is not a list
    and one with a good change of message 6's text beside one that is not ``[ts, type, [text], meta]``.
    Each bad item is one ``bad_format`` reject naming its index, none of its updates applied (message 6
    is as sent); counts: read = 8 history + 1 ui + 5 items = 14 = imported 8 + skipped 1 ui + 2 items
    + rejected 3."""
    task = _cline_task(tmp_path)
    updates = json.loads((task / "context_history.json").read_text())
    updates += [7, [3, [0, "not a list"]], [6, [0, [[0, [[50, "text", ["rewritten"], []], "not a change"]]]]]]
    (task / "context_history.json").write_text(json.dumps(updates))
    res = run_import("cline", [tmp_path / "tasks"])
    (traj,) = res.trajectories
    assert traj.calls[-1].context == ["0", "1@2", "4@2", "5", "6"]
    assert traj.message_table()["6"].content == "now add a test"
    assert [(r.line, r.reason, r.kept) for r in res.rejects] == [(2, "bad_format", False), (3, "bad_format", False),
                                                                (4, "bad_format", False)]
    assert all(r.source.endswith("context_history.json") and f"#{r.line}" in r.message for r in res.rejects)
    assert (res.read, res.imported, res.skipped["ui_messages"], res.skipped["context_history"], res.rejected) == \
        (14, 8, 1, 2, 3)
    _counts_add_up(res)


# --- roo code ---------------------------------------------------------------------------------------

def _roo_task(tmp: Path, name: str, history: list[dict], ui: list[dict] | None) -> Path:
    task = tmp / "tasks" / name
    task.mkdir(parents=True)
    (task / "api_conversation_history.json").write_text(json.dumps(history))
    if ui is not None:
        (task / "ui_messages.json").write_text(json.dumps(ui))
    return task


def _req(ts, tokens_in, tokens_out=20):
    return {"ts": ts, "type": "say", "say": "api_req_started",
            "text": json.dumps({"apiProtocol": "anthropic", "tokensIn": tokens_in, "tokensOut": tokens_out,
                                "cacheWrites": 0, "cacheReads": tokens_in - 10, "cost": 0})}


def test_roo_code_non_destructive_condense(tmp_path, tokenizer):
    """Messages 0-6 tagged condenseParent C1 and the summary 7 appended (summarizeConversation): the
    responses before it were sampled without it - call-0 [0] · call-1 [0 1 2] · call-2 [0 1 2 3 4] -
    and from then on the request starts at the summary (getEffectiveApiHistory: fresh start):
    call-3 [7] · call-4 [7 8 9]. One summarize eviction before call-3 (removed 0-5, inserted the
    summary, a harness artifact). Billed (tokensIn is the total input): 1100 ≥ 1000 + 20 - 64,
    1200 ≥ 1100 + 20 - 64, 400 ≥ 300 + 20 - 64: verified; call-0 and the junction call-3 unchecked."""
    c = {"condenseParent": "C1"}
    history = [
        {"role": "user", "content": [_t("<task>fix a.py</task>")], "ts": 1, **c},
        {"role": "assistant", "content": [_t("reading"), _use("r1")], "ts": 10, **c},
        {"role": "user", "content": [_res("r1", "x = 1")], "ts": 11, **c},
        {"role": "assistant", "content": [_t("editing"), _use("r2", "apply_diff")], "ts": 20, **c},
        {"role": "user", "content": [_res("r2", "ok")], "ts": 21, **c},
        {"role": "assistant", "content": [_t("done")], "ts": 30, **c},
        {"role": "user", "content": [_t("and the tests")], "ts": 31, **c},
        {"role": "user", "content": [_t("## Conversation Summary\nFixed a.py; tests next.")], "ts": 32,
         "isSummary": True, "condenseId": "C1"},
        {"role": "assistant", "content": [_t("continuing"), _use("r3", "execute_command")], "ts": 40},
        {"role": "user", "content": [_res("r3", "2 passed")], "ts": 41},
        {"role": "assistant", "content": [_t("all green")], "ts": 50},
    ]
    ui = [_req(5, 1000), _req(15, 1100), _req(25, 1200),
          {"ts": 33, "type": "say", "say": "condense_context", "contextCondense": {"condenseId": "C1", "cost": 0,
                                                                                  "prevContextTokens": 1300,
                                                                                  "newContextTokens": 280}},
          _req(35, 300), _req(45, 400)]
    res = run_import("roo-code", [_roo_task(tmp_path, "t-condense", history, ui)])
    (traj,) = res.trajectories
    assert [c.context for c in traj.calls] == [["0"], ["0", "1", "2"], ["0", "1", "2", "3", "4"], ["7"], ["7", "8", "9"]]
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.removed, ev.inserted) == ("summarize", "call-3", ["0", "1", "2", "3", "4", "5"],
                                                                  ["7"])
    assert traj.message_table()["7"].is_artifact
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified", "unchecked", "verified"]
    assert _segments(tokenizer, traj) == 2
    assert res.read == 12 and res.rejects == []
    _counts_add_up(res)


def _roo_truncated() -> list[dict]:
    """truncateConversation(fraction 0.5) before the request after u6: of the 7 visible messages,
    floor(6 · 0.5) = 3 → 2 (even) are hidden - indices 1 and 2, tagged truncationParent T1 - and the
    marker goes before the first kept message (a3), ts = a3.ts - 1."""
    t = {"truncationParent": "T1"}
    return [{"role": "user", "content": [_t("task")], "ts": 1},
            {"role": "assistant", "content": [_t("a1")], "ts": 10, **t},
            {"role": "user", "content": [_t("u2")], "ts": 11, **t},
            {"role": "user", "content": "[Sliding window truncation: 2 messages hidden to reduce context]", "ts": 19,
             "isTruncationMarker": True, "truncationId": "T1"},
            {"role": "assistant", "content": [_t("a3")], "ts": 20},
            {"role": "user", "content": [_t("u4")], "ts": 21},
            {"role": "assistant", "content": [_t("a5")], "ts": 30},
            {"role": "user", "content": [_t("u6")], "ts": 31},
            {"role": "assistant", "content": [_t("a7")], "ts": 40},
            {"role": "user", "content": [_t("u8")], "ts": 41},
            {"role": "assistant", "content": [_t("a9")], "ts": 50}]


def test_roo_code_sliding_window_truncation(tmp_path, tokenizer):
    """The marker sits mid-history but existed only from its ui event (ts 35): a3 and a5, kept but
    sampled before it, saw [0 1 2] and [0 1 2 4 5] (no marker); a7 and a9 see [0 3 4 5 6 7] and
    [.. 8 9] (1 and 2 hidden, the marker in their place). One truncate eviction before a7 (removed 1 2,
    inserted the marker); 2 segments. Without ui_messages.json the marker counts for every later
    response (marked ``truncation_time: inferred``)."""
    ui = [{"ts": 35, "type": "say", "say": "sliding_window_truncation",
           "contextTruncation": {"truncationId": "T1", "messagesRemoved": 2, "prevContextTokens": 900,
                                 "newContextTokens": 500}}]
    res = run_import("roo-code", [_roo_task(tmp_path, "t-trunc", _roo_truncated(), ui)])
    (traj,) = res.trajectories
    assert [c.context for c in traj.calls] == [
        ["0"], ["0", "1", "2"], ["0", "1", "2", "4", "5"], ["0", "3", "4", "5", "6", "7"], ["0", "3", "4", "5", "6", "7", "8", "9"]]
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.removed, ev.inserted) == ("truncate", "call-3", ["1", "2"], ["3"])
    assert _segments(tokenizer, traj) == 2
    _counts_add_up(res)
    blind = run_import("roo-code", [_roo_task(tmp_path / "b", "t-trunc", _roo_truncated(), None)])
    (traj,) = blind.trajectories
    assert traj.calls[1].context == ["0", "3"] and traj.calls[1].meta["truncation_time"] == "inferred"
