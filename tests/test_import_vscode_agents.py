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
    assert res.read == 10 and res.imported == 8 and res.rejects == []
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
