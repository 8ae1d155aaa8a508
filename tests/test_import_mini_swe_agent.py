"""mini-swe-agent's own trajectory files imported equal to what it sent, token for token.

``tests/data/mini-swe-agent/`` holds three sessions mini-swe-agent 2.4.0 ran through the gateway
(``scripts/capture_mini_swe_agent.py``): ``<mode>/traj.json`` is the file mini wrote (``-o``),
``<mode>/capture.jsonl`` what the gateway recorded of the same calls, each call's ``context_tokens``
being the ids the kit's template rendered from the request mini sent. The importer's calls, rendered by
the same template, must give those ids: the reference is the capture, not the importer's own rendering of
something else. Modes: ``tools`` (the bash tool), ``textbased`` (the command in a fenced block, the
observation as a user message), ``format-error`` (each response rejected by the agent, which sends an
error message instead of it, three times, then gives up).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memorywalker.importers import run_import
from memorywalker.records import read_trajectories

DATA = Path(__file__).resolve().parent / "data" / "mini-swe-agent"


@pytest.mark.parametrize("mode,tools,exit_status", [("tools", ["bash"], "Submitted"),
                                                     ("textbased", [], "Submitted"),
                                                     ("format-error", ["bash"], "RepeatedFormatError")])
def test_each_call_is_what_mini_swe_agent_sent_token_for_token(renderer, mode, tools, exit_status):
    result = run_import("mini-swe-agent", [DATA / mode / "traj.json"])
    (traj,) = result.trajectories
    captured = [c for t in read_trajectories(DATA / mode / "capture.jsonl") for c in t.calls]
    assert len(traj.calls) == len(captured) == 3
    for i, call in enumerate(captured):
        rendered = renderer.render_call(traj, i)
        assert rendered.tokens[: rendered.prompt_len] == list(call.context_tokens), (mode, i)
        assert traj.calls[i].meta["context_check"] in ("verified", "unchecked")
    assert [t.name for t in traj.tools] == tools and traj.meta["exit_status"] == exit_status
    c = result.counts()
    assert c["read"] == c["imported"] + c["skipped"] + c["rejected"] and c["skipped"] == 1  # the exit entry


def test_a_rejected_response_is_a_call_no_later_context_holds():
    """format-error: the agent sent its error message after each response it could not parse, never the
    response itself, so each call's context is the previous one's plus one error message (not its
    response): three calls, each a leaf of its own."""
    (traj,) = run_import("mini-swe-agent", [DATA / "format-error" / "traj.json"]).trajectories
    for earlier, later in zip(traj.calls, traj.calls[1:], strict=False):
        assert earlier.response not in later.context
        assert later.context[: len(earlier.context)] == earlier.context and len(later.context) == len(earlier.context) + 1


def test_bad_files_are_set_aside_with_their_reason_and_the_good_ones_kept(tmp_path):
    """Five files: the good one imports; a JSON Lines file, a Responses-item trajectory and a truncated file
    are each a file-level reject naming the cause; a message without a role is rejected and the rest of
    its file imported."""
    good = json.loads((DATA / "tools" / "traj.json").read_text())
    shutil.copy(DATA / "tools" / "traj.json", tmp_path / "good.traj.json")
    (tmp_path / "lines.traj.json").write_text('{"messages": []}\n{"messages": []}\n')
    items = dict(good, messages=[good["messages"][0], {"type": "function_call", "name": "bash", "arguments": "{}"}])
    (tmp_path / "items.traj.json").write_text(json.dumps(items))
    (tmp_path / "cut.traj.json").write_text(json.dumps(good)[:500])
    roleless = dict(good, messages=[*good["messages"][:2], {"content": "no role"}, *good["messages"][2:]])
    (tmp_path / "roleless.traj.json").write_text(json.dumps(roleless))
    result = run_import("mini-swe-agent", [tmp_path])
    assert sorted(t.lineage.source_path.rsplit("/", 1)[1] for t in result.trajectories) == [
        "good.traj.json", "roleless.traj.json"]
    why = {Path(r.source).name: (r.reason, r.message) for r in result.rejects}
    assert why["lines.traj.json"][0] == "bad_json"
    assert why["items.traj.json"] == ("bad_format", "items.traj.json: messages in the Responses API's item form "
                                      "(mini-swe-agent's litellm_response model) are not imported")
    assert why["cut.traj.json"][0] == "truncated_line"
    assert why["roleless.traj.json"] == ("missing_field", "message 2 has no role")
    c = result.counts()
    assert c["read"] == c["imported"] + c["skipped"] + c["rejected"] and c["rejected"] == 1


def test_openai_chat_points_a_mini_swe_agent_file_to_its_format_and_reads_one_conversation(tmp_path):
    """``openai-chat`` reads JSON Lines of request/response pairs. Given mini's trajectory (one JSON document)
    it says, in the reject, which format reads it (it used to report bad_json per line); given one JSON
    document holding a conversation it imports it, each assistant message a call (the tools run: 3)."""
    result = run_import("openai-chat", [DATA / "tools" / "traj.json"])
    (reject,) = result.rejects
    assert not result.trajectories and reject.reason == "bad_format" and "memorywalker import mini-swe-agent" in reject.message
    mini = json.loads((DATA / "tools" / "traj.json").read_text())
    conversation = {"messages": [{k: v for k, v in m.items() if k != "extra"} for m in mini["messages"]
                                 if m["role"] != "exit"]}
    (tmp_path / "conversation.json").write_text(json.dumps(conversation, indent=1))
    (traj,) = run_import("openai-chat", [tmp_path / "conversation.json"]).trajectories
    assert len(traj.calls) == 3 and [len(c.context) for c in traj.calls] == [2, 4, 6]


def test_odd_values_where_the_agent_keeps_its_own_records_do_not_stop_the_import(tmp_path):
    """The fields only the agent reads (``info.config.model``, each response's ``model``, ``usage``,
    ``choices``, ``finish_reason``) given the wrong types: the 3 calls import, without billed counts and with
    the finish reason from the message itself (tool calls)."""
    doc = json.loads((DATA / "tools" / "traj.json").read_text())
    doc["info"]["config"]["model"] = "a string"
    for m in doc["messages"]:
        if m["role"] == "assistant":
            m["extra"]["response"] |= {"model": ["m"], "usage": {"prompt_tokens": "12", "completion_tokens": [1]},
                                       "choices": [{"finish_reason": ["x"]}]}
    (tmp_path / "odd.traj.json").write_text(json.dumps(doc))
    result = run_import("mini-swe-agent", [tmp_path / "odd.traj.json"])
    (traj,) = result.trajectories
    assert [c.finish_reason for c in traj.calls] == ["tool_calls"] * 3 and not result.rejects
    assert all("billed_tokens" not in c.meta and c.meta["context_check"] == "unchecked" for c in traj.calls)
