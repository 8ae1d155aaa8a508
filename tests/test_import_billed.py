"""Contexts checked against billed prompt tokens (importers/billed.py): the growth rule by hand, the
real fixtures (every check recounted by independent code from the raw records), and a Claude Code
micro-compaction that names no ids but shows in the billed tokens (the numbers of issue 26)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memorywalker.importers import run_import
from memorywalker.importers.billed import (
    GROWTH_RULE,
    TURN_RULE,
    billed,
    check_billed,
    check_counts,
    prefix_parents,
)
from memorywalker.records import TrajectoryBuilder
from test_import_claude_code import _base, _counts_add_up, _write, boundary, user


def _chain(prompts: list[tuple[int, int]], model: str | None = None) -> TrajectoryBuilder:
    """u0 → a0 → u1 → a1 ...: call k sees [u0 a0 ... u_k]; its billed (prompt, response) from the list."""
    b = TrajectoryBuilder("t")
    ctx: list[str] = []
    for k, (p, r) in enumerate(prompts):
        ctx.append(b.message("user", f"u{k}"))
        a = b.message("assistant", f"a{k}")
        b.call(list(ctx), a, meta={"billed_tokens": billed(p, r, model)})
        ctx.append(a)
    return b


def test_growth_rule_by_hand():
    """tol = max(64, ceil(0.002 P)). After P=1000, R=50 the next prompt needs >= 1000 + 50 - 64 = 986:
    986 passes, 985 is a drop. After P=100,000, R=10: tol = 200, bound 99,810."""
    for nxt, want in ((986, "verified"), (985, "unverified")):
        b = _chain([(1000, 50), (nxt, 5)])
        check_billed(b)
        assert [c.meta["context_check"] for c in b.calls] == ["unchecked", want]
        assert len(b.evictions) == (want == "unverified")
    b = _chain([(100_000, 10), (99_810, 0), (99_609, 0)])  # 99,609 < 99,810 - 200
    check_billed(b)
    assert [c.meta["context_check"] for c in b.calls] == ["unchecked", "verified", "unverified"]
    (ev,) = b.evictions
    assert ev.meta["evidence"] == {"previous_call": "call-1", "billed_prompt_before": 99_810,
                                   "billed_prompt_after": 99_609, "response_tokens_before": 0,
                                   "reasoning_dropped": 0, "expected_at_least": 99_810, "tolerance": 200,
                                   "rule": GROWTH_RULE}
    assert b.calls[2].reason.startswith("context_unverified: the billed prompt fell from 99810 to 99609 tokens "
                                        "after call 'call-1' (expected at least 99810 - 200: P[t+1] >= P[t]")
    assert ev.removed == [] and ev.meta["inferred"] and not b.calls[2].selected


def test_no_count_other_model_or_no_prefix_is_unchecked():
    """A call without a count, after a call of another model, or whose context does not extend an
    earlier call (a junction) is unchecked, never unverified."""
    b = _chain([(1000, 10), (500, 10)])
    b.calls[1].meta["billed_tokens"] = None
    check_billed(b)
    assert [c.meta["context_check"] for c in b.calls] == ["unchecked", "unchecked"]
    b = _chain([(1000, 10), (500, 10)])
    b.calls[1].meta["billed_tokens"]["model"] = "other"
    check_billed(b)
    assert b.calls[1].meta["context_check"] == "unchecked" and b.evictions == []
    b = _chain([(1000, 10), (500, 10)])
    b.calls[1].context = b.calls[1].context[2:]  # drops u0 a0: no prefix parent
    check_billed(b)
    assert b.calls[1].meta["context_check"] == "unchecked" and b.calls[1].selected


def test_prefix_parents_match_brute_force():
    """The hashed search finds, for each call, the latest earlier call with the longest S that is a
    prefix of its context - the same answer as comparing every pair. Call 3 is rewritten to branch
    after call 1 (a rewind): its parent is 1, and call 4, whose context still extends call 2, has parent 2."""
    b = _chain([(1, 0)] * 5)
    b.calls[3].context = b.calls[1].context + [b.calls[1].response, b.message("user", "rewind")]
    calls = b.calls

    def brute(i):
        hits = [j for j in range(i) if calls[i].context[: len(calls[j].context) + 1] == [*calls[j].context, calls[j].response]]
        return max(hits, key=lambda j: (len(calls[j].context), j)) if hits else None

    assert prefix_parents(calls) == [brute(i) for i in range(len(calls))] == [None, 0, 1, 1, 2]


# --- real fixtures -----------------------------------------------------------------------------------

def _reference_checks(traj, usage_of) -> list[str]:
    """Independent recount: brute-force prefix parents, the rule P' >= P + R - max(64, ceil(P/500))."""
    out = []
    for i, c in enumerate(traj.calls):
        parents = [j for j in range(i) if c.context[: len(traj.calls[j].context) + 1]
                   == [*traj.calls[j].context, traj.calls[j].response]]
        now = usage_of(c)
        if not parents or now is None or c.purpose != "act":
            out.append("unchecked")
            continue
        p = traj.calls[max(parents, key=lambda j: (len(traj.calls[j].context), j))]
        before = usage_of(p)
        if before is None or p.purpose != "act" or before[2] != now[2]:
            out.append("unchecked")
            continue
        tol = max(64, -(-before[0] // 500))
        out.append("verified" if now[0] >= before[0] + before[1] - tol else "unverified")
    return out


def _claude_usage(path: Path):
    groups: dict[str, list[dict]] = {}
    for f in [path, *sorted((path.with_suffix("") / "subagents").glob("*.jsonl"))]:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("type") == "assistant":
                groups.setdefault(r["message"]["id"], []).append(r["message"])

    def usage_of(call):
        msgs = groups[call.meta["message_id"]]
        u = msgs[0].get("usage") or {}
        p = u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0) + u.get("cache_read_input_tokens", 0)
        thinking = any(b.get("type") == "thinking" for m in msgs for b in m["content"] if isinstance(b, dict))
        r = 0 if thinking else max((m.get("usage") or {}).get("output_tokens", 0) for m in msgs)
        return None if p <= 0 else (p, r, msgs[0].get("model"))
    return usage_of


CLAUDE_COUNTS = {  # per file: (verified, unverified, unchecked) as `memorywalker import` prints them
    "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl": (214, 0, 4),
    "agent-aac57f5.jsonl": (2, 0, 1),
    "ccviewer_1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl": (6, 0, 1),
    "ccviewer_5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl": (17, 0, 3),
    "ccviewer_fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl": (164, 0, 6),
    "short.jsonl": (0, 0, 1), "subagent.jsonl": (11, 0, 1), "tool_heavy.jsonl": (3, 0, 1),
}


def test_claude_code_fixtures_billed_checks(harness_logs):
    """Every call's check equals the independent recount from the raw message.usage. The pinned totals:
    no real session drops (0 unverified); unchecked = each trajectory's first call, plus in ae4a77f8 a
    call of another model (claude-haiku after claude-opus), the summarization call and the first call
    after the compaction (its context does not extend the previous one)."""
    root = harness_logs / "claude-code"
    res = run_import("claude-code", [root])
    for t in res.trajectories:
        main = Path(t.lineage.source_path)
        session = main if main.parent.name != "subagents" else main.parent.parent.with_suffix(".jsonl")
        assert [c.meta["context_check"] for c in t.calls] == _reference_checks(t, _claude_usage(session)), t.id
    counts = {Path(k).name: (v["verified"], v["unverified"], v["unchecked"])
              for k, v in check_counts(res.trajectories).items()}
    assert counts == CLAUDE_COUNTS
    assert all(c.selected for t in res.trajectories for c in t.calls if c.meta["context_check"] != "unverified")


@pytest.mark.parametrize("name", ["trajs_basic.json", "trajs_basic_gui_mode.json"])
def test_openhands_fixtures_billed_checks(harness_logs, name):
    """model_response.usage.prompt_tokens per response. trajs_basic: 3486 → 4646 ≥ 3486 + 1135 - 64:
    1 verified, 1 unchecked (the first). gui_mode: 3439 → 3601 (≥ +104), → 4769 (≥ +1142), → 5488
    (≥ +693): 3 verified; the first and the closing text message (no usage) unchecked."""
    res = run_import("openhands", [harness_logs / "openhands" / name])
    ((_, c),) = check_counts(res.trajectories).items()
    assert (c["verified"], c["unverified"], c["unchecked"]) == {"trajs_basic.json": (1, 0, 1),
                                                                "trajs_basic_gui_mode.json": (3, 0, 2)}[name]


# --- a micro-compaction without ids ---------------------------------------------------------------

def _billed_asst(uuid, parent, msg_id, tool, prompt, out):
    """An assistant record whose message.usage bills ``prompt`` = 3 + 1000 + (prompt - 1003) tokens."""
    row = _base(uuid, parent, "assistant", requestId=f"req_{msg_id}", message={
        "id": msg_id, "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": tool, "name": "Bash", "input": {"command": "ls"}}],
        "usage": {"input_tokens": 3, "cache_creation_input_tokens": 1000, "cache_read_input_tokens": prompt - 1003,
                  "output_tokens": out}})
    return row


def _result(uuid, parent, tool):
    return _base(uuid, parent, "user", message={"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool, "content": f"output of {tool}"}]})


def _micro(uuid, parent, pre):
    return _base(uuid, parent, "system", subtype="microcompact_boundary", content="Context microcompacted",
                 microcompactMetadata={"trigger": "auto", "preTokens": pre, "tokensSaved": 2000,
                                       "compactedToolIds": [], "clearedAttachmentUUIDs": []})


def _session_with_silent_micro() -> list[dict]:
    """u1 → a1 (40,003) → r1 → a2 (45,445) → r2 → mc1 (no ids) → a3 (44,348) → r3 → a4 (59,814) → r4 →
    mc2 (no ids) → a5 (59,379) → r5 → compaction cb/s → u6 → a6 (12,000) → r6 → a7 (12,600)."""
    return [user("u1", None, "fix it"),
            _billed_asst("a1", "u1", "m1", "t1", 40_003, 200), _result("r1", "a1", "t1"),
            _billed_asst("a2", "r1", "m2", "t2", 45_445, 120), _result("r2", "a2", "t2"),
            _micro("mc1", "r2", 9994),
            _billed_asst("a3", "mc1", "m3", "t3", 44_348, 90), _result("r3", "a3", "t3"),
            _billed_asst("a4", "r3", "m4", "t4", 59_814, 50), _result("r4", "a4", "t4"),
            _micro("mc2", "r4", 12_000),
            _billed_asst("a5", "mc2", "m5", "t5", 59_379, 40), _result("r5", "a5", "t5"),
            boundary("cb", "r5"), user("s", "cb", "Summary: fixed it.", isCompactSummary=True),
            user("u6", "s", "now test it"),
            _billed_asst("a6", "u6", "m6", "t6", 12_000, 30), _result("r6", "a6", "t6"),
            _billed_asst("a7", "r6", "m7", "t7", 12_600, 30)]


def test_microcompaction_without_ids_is_an_inferred_eviction(tmp_path):
    """The replayed contexts only grow across mc1 and mc2 (they name nothing), but the billed prompts
    fall: a3 44,348 < 45,445 + 120 - max(64, ceil(0.002·45,445) = 91) = 45,474, and a5 59,379 <
    59,814 + 50 - 120 = 59,744. Each drop is an inferred prune eviction (trigger, preTokens and
    tokensSaved of its boundary) before a3 / a5, and a3, a4, a5 - whose contexts hold what the
    unknown removals may have touched - are unselected (context_unverified). After the full compaction
    the context is [s, u6]: nothing from before, so a6 is unchecked (a junction) and selected, and a7
    (12,600 ≥ 12,000 + 30 - 64) verified."""
    res = run_import("claude-code", [_write(tmp_path, _session_with_silent_micro())])
    (traj,) = res.trajectories
    assert [c.meta["context_check"] for c in traj.calls] == [
        "unchecked", "verified", "unverified", "unverified", "unverified", "unchecked", "verified"]
    assert [c.selected for c in traj.calls] == [True, True, False, False, False, True, True]
    assert all(c.reason.startswith("context_unverified") for c in traj.calls[2:5])
    first, second, summ = traj.evictions
    for ev, call, boundary_uuid, pre, before, after in ((first, "call-2", "mc1", 9994, 45_445, 44_348),
                                                        (second, "call-4", "mc2", 12_000, 59_814, 59_379)):
        assert (ev.kind, ev.before_call, ev.removed, ev.inserted) == ("prune", call, [], [])
        assert (ev.trigger, ev.tokens_before, ev.meta["inferred"]) == ("auto", pre, True)
        assert ev.meta["microcompact_boundary"] == boundary_uuid and ev.meta["tokens_saved"] == 2000
        assert (ev.meta["evidence"]["billed_prompt_before"], ev.meta["evidence"]["billed_prompt_after"]) == (before, after)
    assert (summ.kind, summ.before_call) == ("summarize", "call-5")
    assert traj.calls[5].context == ["s", "u6"]
    assert res.notes["microcompactions_inferred"] == 2 and res.rejects == []
    _counts_add_up(res)


def test_microcompaction_without_ids_and_no_drop_changes_nothing(tmp_path):
    """A boundary naming nothing while the billed prompt keeps growing (45,445 → 46,000) is no
    eviction: all calls selected, the second verified."""
    rows = _session_with_silent_micro()[:7]
    rows[6] = _billed_asst("a3", "mc1", "m3", "t3", 46_000, 90)
    (traj,) = run_import("claude-code", [_write(tmp_path, rows)]).trajectories
    assert traj.evictions == [] and all(c.selected for c in traj.calls)
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified"]


# --- codex token_count ------------------------------------------------------------------------------

def _tc(inp, out, total, reasoning=0):
    last = {"input_tokens": inp, "cached_input_tokens": inp // 2, "output_tokens": out,
            "reasoning_output_tokens": reasoning, "total_tokens": inp + out}
    return {"type": "event_msg", "payload": {"type": "token_count", "info": {
        "total_token_usage": {"total_tokens": total}, "last_token_usage": last, "model_context_window": 272000}}}


def test_codex_token_counts(tmp_path):
    """Codex sends token_count when a sampling request completes (rollout/policy.rs persists it): each
    new one is the billed count of the call before it; a repeat (same total_token_usage) is ignored;
    one no call awaits, just before a ``compacted`` record, is the compaction's own request: the summary
    call built from ``compacted.message`` (this old-style rollout holds no answer item) gets it.
    call-0 5,000 · call-1 5,100 ≥ 5,000 + 50 - 64 → verified · call-2 4,000 < 5,100 + 20 - 64 with no
    compaction → an inferred eviction, unselected · call-3, the summary call (3,000, summarize: not
    checked for growth) holds "fix the bug" and "more", which were there when the unknown removal
    happened → unverified · call-4 after the compaction: no prefix parent, but Codex keeps the real user
    messages across a compaction, so its context still holds them → unverified too."""
    def item(p):
        return {"type": "response_item", "payload": p}

    def msg(role, text):
        return item({"type": "message", "role": role, "content": [
            {"type": "output_text" if role == "assistant" else "input_text", "text": text}]})

    rows = [{"type": "session_meta", "payload": {"id": "s-tc", "cli_version": "0.80.0"}},
            {"type": "turn_context", "payload": {"model": "gpt-5"}},
            msg("user", "fix the bug"),
            item({"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"}), _tc(5000, 50, 5050),
            item({"type": "function_call_output", "call_id": "c1", "output": "main.py"}),
            msg("assistant", "Found main.py"), _tc(5100, 20, 10170), _tc(5100, 20, 10170),
            msg("user", "more"), msg("assistant", "ok"), _tc(4000, 10, 14180),
            _tc(3000, 200, 17380), {"type": "compacted", "payload": {"message": "summary of it"}},
            msg("user", "go on"), msg("assistant", "done"), _tc(900, 5, 18285)]
    path = tmp_path / "rollout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_import("codex", [path])
    (traj,) = res.trajectories
    assert [c.meta.get("billed_tokens", {}).get("prompt") for c in traj.calls] == [5000, 5100, 4000, 3000, 900]
    assert [c.purpose for c in traj.calls] == ["act", "act", "act", "summarize", "act"]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "unverified", "unverified",
                                                           "unverified"]
    assert [c.selected for c in traj.calls] == [True, True, False, False, False]
    inferred = [e for e in traj.evictions if e.meta.get("inferred")]
    assert [(e.kind, e.before_call) for e in inferred] == [("other", "call-2")]
    assert [(e.kind, e.before_call) for e in traj.evictions] == [("other", "call-2"), ("summarize", "call-4")]
    assert res.notes["token_counts_unattributed"] == 0
    assert res.read == len(rows) == res.imported + sum(res.skipped.values()) + res.rejected


def _codex_two_turns(turn2_prompt: int, compaction: bool = False) -> list[dict]:
    """Turn 1 ("fix the bug"): call-0 reasoning + shell (billed 5,000; output 300 of which reasoning 250,
    so R = 50), call-1 reasoning + shell (5,400; 400 / 350), call-2 reasoning + "Fixed" (5,900; 420 /
    400). Then either turn 2 ("now add a test", no compaction): call-3 reasoning + shell
    (``turn2_prompt``; 200 / 180), call-4 "done" (+230); or (``compaction``) the compaction's own
    request (6,000, unattributed), ``compacted`` with a replacement history, "continue": call-3
    reasoning + shell (``turn2_prompt``), call-4 "done" (+230)."""
    def item(p):
        return {"type": "response_item", "payload": p}

    def msg(role, text):
        return item({"type": "message", "role": role, "content": [
            {"type": "output_text" if role == "assistant" else "input_text", "text": text}]})

    def think(n):
        return item({"type": "reasoning", "summary": [{"type": "summary_text", "text": f"step {n}"}],
                     "content": None, "encrypted_content": f"gAAA{n}"})

    def shell(cid):
        return item({"type": "function_call", "name": "shell", "arguments": "{\"command\": [\"ls\"]}", "call_id": cid})

    def out(cid):
        return item({"type": "function_call_output", "call_id": cid, "output": "ok"})

    rows = [{"type": "session_meta", "payload": {"id": "s-turns", "cli_version": "0.120.0"}},
            {"type": "turn_context", "payload": {"model": "gpt-5.2"}},
            msg("user", "fix the bug"),
            think(0), shell("c1"), _tc(5000, 300, 5300, 250), out("c1"),
            think(1), shell("c2"), _tc(5400, 400, 11100, 350), out("c2"),
            think(2), msg("assistant", "Fixed"), _tc(5900, 420, 17420, 400)]
    if compaction:
        rows += [_tc(6000, 500, 23920), {"type": "compacted", "payload": {"message": "", "replacement_history": [
            rows[2]["payload"], {"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": "SUMMARY: fixed it"}]}]}},
                 msg("user", "continue")]
    else:
        rows += [{"type": "turn_context", "payload": {"model": "gpt-5.2"}}, msg("user", "now add a test")]
    rows += [think(3), shell("c3"), _tc(turn2_prompt, 200, 30000, 180), out("c3"),
             msg("assistant", "done"), _tc(turn2_prompt + 230, 30, 40000)]
    return rows


def _write_rollout(tmp_path, rows) -> Path:
    path = tmp_path / "rollout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_codex_new_turn_drops_the_reasoning_not_the_context(tmp_path):
    """Issue 34: the first call of a new user turn is billed less than the previous prompt + response,
    because the Responses API drops the previous turn's reasoning items from the prompt. By hand
    (tol = 64 throughout): call-1 5,400 >= 5,000 + 50 - 64; call-2 5,900 >= 5,400 + 20 - 64; the prompt
    of call-2 held the reasoning of call-0 and call-1, D = 250 + 350 = 600 (call-2's own 400 never
    entered a prompt); call-3 at 5,330 needs >= 5,900 + 20 - 600 - 64 = 5,256 - the old rule wanted
    5,856 and inferred an eviction; call-4 5,560 >= 5,330 + 20 - 64. No eviction, every call with a
    prefix parent verified, all selected."""
    res = run_import("codex", [_write_rollout(tmp_path, _codex_two_turns(5330))])
    (traj,) = res.trajectories
    assert [c.meta["billed_tokens"].get("reasoning") for c in traj.calls] == [250, 350, 400, 180, 0]
    assert [c.meta["billed_tokens"]["response"] for c in traj.calls] == [50, 50, 20, 20, 30]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified", "verified", "verified"]
    assert traj.evictions == [] and all(c.selected for c in traj.calls)
    c = res.counts()
    assert (c["calls"], c["calls_selected"], c["unselected_by_reason"], c["evictions_inferred"]) == (5, 5, {}, 0)
    assert c["evictions_from_billed_drops"] == 0


def test_codex_drop_beyond_the_dropped_reasoning_is_an_eviction(tmp_path):
    """One token under the bound above (5,255 < 5,256): the drop exceeds what the dropped reasoning
    explains, so it is an inferred eviction naming its numbers and the turn rule; call-3 and call-4
    (whose context holds the same messages) are unselected - the summary counts 2 calls lost."""
    res = run_import("codex", [_write_rollout(tmp_path, _codex_two_turns(5255))])
    (traj,) = res.trajectories
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call, ev.removed, ev.meta["inferred"]) == ("other", "call-3", [], True)
    assert ev.meta["evidence"] == {"previous_call": "call-2", "billed_prompt_before": 5900, "billed_prompt_after": 5255,
                                   "response_tokens_before": 20, "reasoning_dropped": 600,
                                   "expected_at_least": 5320, "tolerance": 64, "rule": TURN_RULE}
    assert [c.meta["context_check"] for c in traj.calls][3:] == ["unverified", "unverified"]
    assert "(expected at least 5320 - 64: P[t+1] >= P[t] + R[t] - D - tol" in traj.calls[3].reason
    c = res.counts()
    assert (c["calls_selected"], c["unselected_by_reason"], c["evictions_from_billed_drops"]) == (
        3, {"context_unverified": 2}, 1)
    assert check_counts(res.trajectories)[str(tmp_path / "rollout.jsonl")]["unselected"] == 2


def test_codex_real_compaction_is_exactly_its_eviction(tmp_path):
    """A real ``compacted`` after turn 1: one summarize eviction before call-3 and nothing inferred.
    call-3 (1,200) has no prefix parent (the history was replaced) → unchecked; call-4 1,430 >=
    1,200 + 20 - 64 → verified; the compaction's own request is ``token_counts_unattributed``."""
    res = run_import("codex", [_write_rollout(tmp_path, _codex_two_turns(1200, compaction=True))])
    (traj,) = res.trajectories
    assert [(e.kind, e.before_call, bool(e.meta.get("inferred"))) for e in traj.evictions] == [
        ("summarize", "call-3", False)]
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified", "unchecked", "verified"]
    assert all(c.selected for c in traj.calls) and res.notes["token_counts_unattributed"] == 1
    c = res.counts()
    assert (c["evictions"], c["evictions_inferred"], c["unselected_by_reason"]) == ({"summarize": 1}, 0, {})


def test_cli_import_prints_and_inspect_shows_the_checks(harness_logs, tmp_path, kit):
    """`import` prints verified / unverified / unchecked per file; `inspect` totals them from the
    written records (trajs_basic 1/0/1 + trajs_basic_gui_mode 3/0/2 = 4/0/3)."""
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    out = tmp_path / "oh.jsonl"
    res = CliRunner().invoke(app, ["import", "openhands", str(harness_logs / "openhands"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): [x.strip() for x in line.split("│")[2:6]]
            for line in res.output.splitlines() if line.count("│") == 6 and ".json" in line}
    assert rows == {"trajs_basic.json": ["1", "0", "1", "0"], "trajs_basic_gui_mode.json": ["3", "0", "2", "0"]}
    res = CliRunner().invoke(app, ["inspect", str(out), "--tokenizer", str(kit[0]), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["context_check"] == {"verified": 4, "unverified": 0, "unchecked": 3}


def test_cli_import_counts_the_calls_lost_to_the_check(tmp_path):
    """The CLI summary of the rollout above whose turn-2 drop is beyond its dropped reasoning: 5 calls,
    3 selected + 2 unselected context_unverified (= 5), 1 inferred eviction from a billed drop; the
    file's check row: verified 2 (call-1, call-2), unverified 2 (call-3, call-4), unchecked 1 (call-0),
    unselected 2."""
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    path = _write_rollout(tmp_path, _codex_two_turns(5255))
    res = CliRunner().invoke(app, ["import", "codex", str(path), "-o", str(tmp_path / "out.jsonl")])
    assert res.exit_code == 0, res.output
    rows = {cells[0]: cells[1:] for line in res.output.splitlines() if "│" in line
            for cells in [[x.strip() for x in line.strip().strip("│").split("│")]]}
    assert rows["calls"] == ["5"] and rows["calls selected"] == ["3"]
    assert rows["calls unselected: context_unverified"] == ["2"]
    assert rows["evictions: other"] == ["1"] and rows["of which from billed-token drops"] == ["1"]
    assert rows[str(path)] == ["2", "2", "1", "2"]
