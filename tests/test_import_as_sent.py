"""The Codex and OpenCode importers build each call as the harness sent it (hand-built logs in the
shapes the pinned versions write; the live check against real captures is test_importer_capture_live.py).

Codex 0.169.0: the compaction's summary call (history + Codex's compaction prompt, no tools), the history
after it from ``replacement_history`` behind the base instructions, the planning sections left out when
``update_plan`` is not offered, the records the generic key-field check used to reject, a rollback.
OpenCode 1.18: the summary call flattened under the compaction agent's prompt, with the prior summary
after a second compaction. ``--tools``: the shapes it reads and the errors it names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memorywalker.errors import InputError
from memorywalker.importers import ImportOptions, run_import
from memorywalker.importers.codex_sent import COMPACT_PROMPT, SUMMARY_PREFIX, without_planning
from memorywalker.importers.opencode_summary import SUMMARY_SYSTEM, SUMMARY_TEMPLATE, flatten, summary_prompt
from memorywalker.importers.tools import load_tool_set, tool_set_from_json

INSTRUCTIONS = "You are Codex.\n\n## Planning\nUse update_plan.\n\n### Examples\nx\n\n## Task execution\nDo it.\n"


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _item(payload: dict) -> dict:
    return {"type": "response_item", "payload": payload}


def _msg(role: str, text: str, **extra) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return _item({"type": "message", "role": role, "content": [{"type": kind, "text": text}], **extra})


def _tc(prompt: int, out: int, total: int) -> dict:
    usage = {"input_tokens": prompt, "output_tokens": out, "reasoning_output_tokens": 0}
    return {"type": "event_msg", "payload": {"type": "token_count", "info": {
        "last_token_usage": usage, "total_token_usage": {"total_tokens": total}}}}


def _codex_169(tmp_path: Path, tool: str = "exec_command") -> Path:
    """One tool call, Codex's compaction (its answer recorded before ``compacted``, as 0.169.0 does),
    one answer after it. Items copied into ``replacement_history`` carry new ids, as Codex writes them."""
    summary = "Ran ls; main.py is there."
    env = "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"
    return _write(tmp_path / "rollout.jsonl", [
        {"type": "session_meta", "payload": {"id": "s169", "cli_version": "0.169.0", "base_instructions":
                                             {"text": INSTRUCTIONS}, "source": {"subagent": "none"}}},
        {"type": "turn_context", "payload": {"model": "kit"}},
        _msg("user", env, id="m-env"), _msg("user", "list the files", id="m-user"),
        _item({"type": "function_call", "name": tool, "arguments": "{\"cmd\":\"ls\"}", "call_id": "c1"}),
        _tc(1000, 20, 1020),
        {"type": "token_usage_record", "payload": {"response_id": "r1", "usage": {"input_tokens": 1000}}},
        _item({"type": "function_call_output", "call_id": "c1", "output": "main.py"}),
        _msg("assistant", summary), _tc(900, 10, 1930),
        {"type": "compacted", "payload": {"message": f"{SUMMARY_PREFIX}\n{summary}", "replacement_history": [
            _msg("user", env, id="m-env-2")["payload"], _msg("user", "list the files", id="m-user-2")["payload"],
            _msg("user", f"{SUMMARY_PREFIX}\n{summary}", id="m-sum")["payload"]],
            "replacement_history_metadata": [{"retained_source": {"id": {"message_id": "m-user"}}}]}},
        {"type": "inter_agent_communication_metadata", "payload": {"agents": [{"id": {"path": "a"}}]}},
        _msg("assistant", "Done."), _tc(300, 5, 2235)])


def test_codex_169_compaction_imports_its_summary_call_and_the_history_codex_sent_after_it(tmp_path):
    """Calls: call-0 (the tool call); call-1 the summary call: call-0's context, its response, the tool
    result and Codex's compaction prompt, offering no tools, billed 900; call-2 after the compaction:
    [instructions, environment, prompt, summary], the first three the same messages as call-0's (Codex
    renewed only their ids). One ``summarize`` eviction, before call-2: removed the tool call and its
    result (the summary's answer never joined the history), inserted the summary message. 14 lines read
    = 8 imported (session_meta, 6 response items, compacted) + 6 skipped (turn_context, 3 token_count
    events, token_usage_record, inter_agent_communication_metadata) + 0 rejected."""
    result = run_import("codex", [_codex_169(tmp_path)])
    assert result.rejects == []
    (traj,) = result.trajectories
    table = traj.message_table()
    text = [[table[m].content for m in c.context] for c in traj.calls]
    assert [c.purpose for c in traj.calls] == ["act", "summarize", "act"]
    summary_call = traj.calls[1]
    assert summary_call.context[:-1] == [*traj.calls[0].context, traj.calls[0].response,
                                         next(m.id for m in traj.messages if m.role == "tool")]
    assert text[1][-1] == COMPACT_PROMPT and summary_call.tools == []
    assert table[summary_call.response].content == "Ran ls; main.py is there."
    assert summary_call.meta["response_from"] == "rollout" and summary_call.meta["billed_tokens"]["prompt"] == 900
    assert text[2] == [INSTRUCTIONS, text[0][1], "list the files", f"{SUMMARY_PREFIX}\nRan ls; main.py is there."]
    assert traj.calls[2].context[:3] == traj.calls[0].context[:3]  # the same messages: one shared prefix
    (ev,) = traj.evictions
    assert (ev.kind, ev.before_call) == ("summarize", "call-2")
    assert [table[m].role for m in ev.removed] == ["assistant", "tool"] and len(ev.inserted) == 1
    assert (result.read, result.imported, sum(result.skipped.values()), result.rejected) == (14, 8, 6, 0)
    assert result.skipped["inter_agent_communication_metadata"] == 1 and result.skipped["token_usage_record"] == 1
    assert traj.meta["tools"].startswith("unknown") and traj.meta["system_prompt_rule"].startswith("undecided")
    assert table[traj.calls[0].context[0]].content == INSTRUCTIONS  # kept whole: the rule is undecided


def test_codex_system_prompt_rule_follows_the_tools(tmp_path):
    """Given tools without ``update_plan``: the two planning sections go (``### Examples`` is inside "##
    Planning"); given with it, or called in the rollout: the instructions stay whole."""
    stripped = "You are Codex.\n\n## Task execution\nDo it.\n"
    assert without_planning(INSTRUCTIONS) == stripped
    rollout = _codex_169(tmp_path)
    exec_only = tool_set_from_json([{"name": "exec_command", "parameters": {"type": "object"}}], "t.json")
    (traj,) = run_import("codex", [rollout], ImportOptions(tools=exec_only)).trajectories
    assert traj.messages[0].content == stripped and traj.meta["system_prompt_rule"].startswith("applied: planning")
    assert [t.name for t in traj.tools] == ["exec_command"] and traj.calls[1].tools == []
    with_plan = tool_set_from_json([{"name": "exec_command"}, {"name": "update_plan"}], "t.json")
    (traj,) = run_import("codex", [rollout], ImportOptions(tools=with_plan)).trajectories
    assert traj.messages[0].content == INSTRUCTIONS
    (traj,) = run_import("codex", [_codex_169(tmp_path, tool="update_plan")]).trajectories
    assert traj.messages[0].content == INSTRUCTIONS and "update_plan called" in traj.meta["system_prompt_rule"]


def test_codex_records_the_generic_check_rejected_are_read(tmp_path):
    """A ``local_shell_call``'s ``action`` and a ``web_search_call``'s are objects; so is a subagent
    session's ``source``: read, not rejected (before: ``wrong_type`` "payload.action is not text"). A
    record whose ``payload.type`` is a list is still rejected: the replay reads that field."""
    rows = [{"type": "session_meta", "payload": {"id": "s", "source": {"subagent": {"parent": "p"}}}},
            _msg("user", "go"),
            _item({"type": "local_shell_call", "call_id": "c1", "action": {"type": "exec", "command": ["ls"]}}),
            _item({"type": "local_shell_call_output", "call_id": "c1", "output": "a"}),
            _item({"type": "web_search_call", "action": {"type": "search", "query": "x"}}),
            _msg("assistant", "done"),
            _item({"type": ["message"], "role": "user"})]
    result = run_import("codex", [_write(tmp_path / "r.jsonl", rows)])
    assert [(r.line, r.reason) for r in result.rejects] == [(7, "wrong_type")]
    (traj,) = result.trajectories
    assert [tc.arguments for tc in traj.messages[1].tool_calls] == [{"type": "exec", "command": ["ls"]}]
    assert len(traj.calls) == 2


def test_codex_rollback_branches_off_the_earlier_context(tmp_path):
    """Turns A → call-0, B → call-1, then ``thread_rolled_back`` 1 (B taken back), C → call-2: call-2's
    context is call-0's context + its answer + C, not B's turn; its billed prompt (1,050 < 1,200 + 10)
    is checked against call-0 (1,000 + 10 − 64 ≤ 1,050): verified, no inferred eviction."""
    rows = [{"type": "session_meta", "payload": {"id": "s"}}, {"type": "turn_context", "payload": {"model": "m"}},
            _msg("user", "A"), _msg("assistant", "a"), _tc(1000, 10, 1010),
            _msg("user", "B"), _msg("assistant", "b"), _tc(1200, 10, 2220),
            {"type": "event_msg", "payload": {"type": "thread_rolled_back", "num_turns": 1}},
            _msg("user", "C"), _msg("assistant", "c"), _tc(1050, 10, 3280)]
    result = run_import("codex", [_write(tmp_path / "r.jsonl", rows)])
    (traj,) = result.trajectories
    table = traj.message_table()
    assert [table[m].content for m in traj.calls[2].context] == ["A", "a", "C"]
    assert traj.evictions == [] and result.notes["rollbacks"] == 1
    assert [c.meta["context_check"] for c in traj.calls] == ["unchecked", "verified", "verified"]


def _oc_text(mid: str, pid: str, text: str) -> dict:
    return {"id": pid, "messageID": mid, "type": "text", "text": text}


def _oc_asst(mid: str, parent: str, t: int, parts: list[dict], **kw) -> dict:
    return {"info": {"id": mid, "role": "assistant", "parentID": parent, "time": {"created": t}, "modelID": "m",
                     "providerID": "p", "finish": "stop", **kw}, "parts": parts}


def _oc_user(mid: str, t: int, parts: list[dict]) -> dict:
    return {"info": {"id": mid, "role": "user", "time": {"created": t}}, "parts": parts}


def _opencode_two_compactions(tmp_path: Path, version: str | None = "1.18.33") -> Path:
    long = "x" * 2100
    tool = {"id": "p3", "messageID": "m2", "type": "tool", "callID": "c1", "tool": "bash", "state": {
        "status": "completed", "input": {"command": "ls", "description": "List"}, "output": long, "time": {"start": 1}}}
    msgs = [_oc_user("m1", 1, [_oc_text("m1", "p1", "list files")]),
            _oc_asst("m2", "m1", 2, [{"id": "p2", "messageID": "m2", "type": "step-start"}, tool]),
            _oc_asst("m3", "m1", 3, [_oc_text("m3", "p4", "two files")]),
            _oc_user("m4", 4, [{"id": "p5", "messageID": "m4", "type": "compaction", "auto": True}]),
            _oc_asst("m5", "m4", 5, [_oc_text("m5", "p6", "S1")], summary=True),
            _oc_user("m6", 6, [_oc_text("m6", "p7", "count them")]),
            _oc_asst("m7", "m6", 7, [_oc_text("m7", "p8", "2")]),
            _oc_user("m8", 8, [_oc_text("m8", "p9", "and sizes?")]),
            _oc_asst("m9", "m8", 9, [_oc_text("m9", "p10", "1 and 1")]),
            _oc_user("m10", 10, [{"id": "p11", "messageID": "m10", "type": "compaction", "auto": True,
                                  "tail_start_id": "m8"}]),
            _oc_asst("m11", "m10", 11, [_oc_text("m11", "p12", "S2")], summary=True),
            _oc_user("m12", 12, [_oc_text("m12", "p13", "thanks")]),
            _oc_asst("m13", "m12", 13, [_oc_text("m13", "p14", "ok")])]
    info = {"id": "ses_2", **({"version": version} if version else {})}
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"info": info, "messages": msgs}))
    return path


def test_opencode_118_summary_calls_are_the_flattened_conversation_under_the_compaction_prompt(tmp_path):
    """First summary call: the three messages before the request, one block each; the tool result is cut
    at 2,000 characters and marked. Second: only what came after the first compaction and before the
    kept tail (``tail_start_id`` m8: "count them", "2"), with S1 as the prior summary. Both: the
    compaction agent's system prompt, no tools. After the second compaction the act call sees [request,
    S2, tail (m8, m9), m12]."""
    (traj,) = run_import("opencode", [_opencode_two_compactions(tmp_path)]).trajectories
    table = traj.message_table()
    first, second = [c for c in traj.calls if c.purpose == "summarize"]
    blocks = ["[User]: list files",
              '[Assistant tool call]: bash({"command":"ls","description":"List"})\n[Tool result]: '
              + "x" * 2000 + "\n[truncated]",
              "[Assistant]: two files"]
    for call, want in ((first, summary_prompt(blocks, None)),
                       (second, summary_prompt(["[User]: count them", "[Assistant]: 2"], "S1"))):
        system, prompt = (table[m] for m in call.context)
        assert (system.role, system.content, prompt.content, call.tools) == ("system", SUMMARY_SYSTEM, want, [])
    assert "<prior-summary>\nS1\n</prior-summary>" in table[second.context[1]].content
    assert table[first.context[1]].content.endswith(SUMMARY_TEMPLATE)
    last = traj.calls[-1]
    assert [table[m].content for m in last.context][1:] == ["S2", "and sizes?", "1 and 1", "thanks"]
    assert traj.meta["tools"].startswith("unknown")


def test_opencode_older_sessions_keep_the_structured_summary_context(tmp_path):
    (traj,) = run_import("opencode", [_opencode_two_compactions(tmp_path, version=None)]).trajectories
    first = next(c for c in traj.calls if c.purpose == "summarize")
    assert first.meta["summary_context"].startswith("structured") and first.tools is None
    assert [traj.message_table()[m].content for m in first.context][0] == "list files"


def test_opencode_flatten_names_errors_attachments_and_pruned_results():
    mi = {"role": "assistant"}
    parts = [{"type": "reasoning", "text": "think"},
             {"type": "tool", "tool": "read", "state": {"status": "error", "input": {"p": 1}, "error": "no such file"}},
             {"type": "tool", "tool": "read", "state": {"status": "completed", "input": {}, "output": "old",
                                                        "time": {"compacted": 5}}},
             {"type": "tool", "tool": "look", "state": {"status": "completed", "input": {}, "output": "img",
                                                        "attachments": [{"mime": "image/png", "filename": "a.png"}]}}]
    assert flatten(mi, parts, now=10) == (
        "[Assistant reasoning]: think\n[Assistant tool call]: read({\"p\":1})\n[Tool error]: no such file\n"
        "[Assistant tool call]: read({})\n[Tool result]: [Old tool result content cleared]\n"
        "[Assistant tool call]: look({})\n[Tool result]: img\n[Attached image/png: a.png]")
    assert flatten(mi, parts[2:3], now=4).endswith("[Tool result]: old")  # pruned after the summary call
    user = [{"type": "text", "text": "hi"}, {"type": "text", "text": "skip", "ignored": True},
            {"type": "file", "mime": "text/plain", "filename": "n.txt"}]
    assert flatten({"role": "user"}, user, now=0) == "[User]: hi\n[Attached text/plain: n.txt]"
    emoji = "😀" * 1001  # 2,002 UTF-16 units: JavaScript cuts inside the 1,001st
    assert flatten(mi, [{"type": "tool", "tool": "t", "state": {"status": "completed", "input": {},
                                                                 "output": emoji}}], now=0).endswith(
        "😀" * 1000 + "\n[truncated]")


def test_tool_sets_read_each_api_shape_and_name_what_is_wrong(tmp_path):
    """Chat Completions, Responses, Anthropic and plain entries; the shipped sets; errors."""
    entries = [{"type": "function", "function": {"name": "a", "description": "A", "parameters": {"type": "object"}}},
               {"type": "function", "name": "b", "parameters": {"type": "object", "properties": {"x": {}}}},
               {"name": "c", "input_schema": {"type": "object"}}, {"name": "d"}]
    f = tmp_path / "tools.json"
    f.write_text(json.dumps({"tools": entries}))
    got = load_tool_set(f)
    assert [(t.name, t.description, t.parameters.get("properties")) for t in got.tools] == [
        ("a", "A", None), ("b", "", {"x": {}}), ("c", "", None), ("d", "", {})]
    assert got.source == f"file {f}"
    assert len(load_tool_set("codex-0.169.0").tools) == 7 and len(load_tool_set("opencode-1.18.33").tools) == 10
    for doc, cause in (([], "non-empty list"), ([{"name": "a"}, {"name": "a"}], "appears twice: ['a']"),
                       ([{"description": "x"}], "no tool name"), ([3], "expected an object")):
        f.write_text(json.dumps(doc))
        with pytest.raises(InputError, match=cause.replace("[", r"\[").replace("]", r"\]")):
            load_tool_set(f)
    f.write_text("{")
    with pytest.raises(InputError, match="not a JSON document"):
        load_tool_set(f)
    with pytest.raises(InputError, match="not a file, nor a shipped tool set"):
        load_tool_set(tmp_path / "missing.json")


def test_cli_tools_is_refused_for_a_format_that_does_not_read_it_and_names_a_bad_set(tmp_path):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    log = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                         {"role": "assistant", "content": "yo"}]}])
    out = str(tmp_path / "out.jsonl")
    for args, cause in ((["openai-chat", str(log), "--tools", "codex-0.169.0"], "only the codex and opencode importers"),
                        (["codex", str(log), "--tools", "codex-9"], "--tools codex-9: not a file, nor a shipped")):
        r = CliRunner().invoke(app, ["import", *args, "-o", out])
        assert r.exit_code == 2 and r.output.count("\n") == 1 and cause in r.output, r.output
