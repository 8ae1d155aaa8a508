"""`memorywalker export`: every per-call example renders, through TRL's own chat-template function
(``trl.data_utils.apply_chat_template``, what its SFT/DPO trainers call on conversational data), to
exactly the tokens of the call's delivered context; the Parquet file loads with `datasets`.

Reference tokens are the renderer's ``S_t`` (``rc.tokens[:rc.prompt_len]`` is the delivered context
with the generation prompt; the response follows). The exported completion renders to the response
plus the template's delimiter after the end-of-turn token, which the renderer leaves out of ``S_t``.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.export import trajectory_record, trl_examples, trl_row_from_parquet
from memorywalker.importers import run_import
from memorywalker.records import read_trajectories, write_trajectories
from memorywalker.rollout import ExpertPolicy, HarnessConfig, WebSearchEnv, rollout
from memorywalker.tree import ConditioningTree

trl_data_utils = pytest.importorskip("trl.data_utils", reason="trl (dev extra) provides the chat-template path under test")


@pytest.fixture(scope="module")
def trajectories(harness_logs, tokenizer):
    """Real logs with tool calls, reasoning, a subagent and inferred placeholder evictions, and a demo
    episode with two summarize evictions."""
    out = []
    for fmt, path in [("claude-code", harness_logs / "claude-code" / "tool_heavy.jsonl"),
                      ("claude-code", harness_logs / "claude-code" / "subagent.jsonl"),
                      ("swe-agent", harness_logs / "swe-agent" / "marshmallow-1867__function_calling_replace_from_source.traj"),
                      ("swe-agent", harness_logs / "swe-agent" / "test-repo-i1__older_format.traj")]:
        result = run_import(fmt, [path])
        assert result.trajectories, path
        out += result.trajectories
    demo, _ = rollout(WebSearchEnv(), ExpertPolicy(), tokenizer, HarnessConfig(name="opencode", budget=700),
                      suite="lookup", n=1, seed=0)
    assert demo[0].evictions
    return out + demo


def _export(tmp_path, trajs, fmt):
    data = tmp_path / "in.jsonl"
    write_trajectories(data, trajs)
    r = CliRunner().invoke(app, ["export", str(data), "--format", fmt, "-o", str(tmp_path / fmt)])
    assert r.exit_code == 0, r.output
    return tmp_path / fmt


def _check_round_trip(tokenizer, rows, rendered) -> int:
    """Each row renders to its call's delivered context tokens (exactly) and its S_t (as a prefix)."""
    calls = [rc for rt in rendered for rc in rt.calls]
    assert len(rows) == len(calls)
    for row, rc in zip(rows, calls, strict=True):
        assert row["call_id"] == rc.call_id
        text = trl_data_utils.apply_chat_template(row, tokenizer, tools=row["tools"])
        prompt = tokenizer(text["prompt"], add_special_tokens=False)["input_ids"]
        assert prompt == rc.tokens[: rc.prompt_len], rc.call_id
        full = tokenizer(text["prompt"] + text["completion"], add_special_tokens=False)["input_ids"]
        assert full[: len(rc.tokens)] == rc.tokens, rc.call_id
        assert tokenizer.decode(full[len(rc.tokens):]).strip() == ""  # only the host delimiter is left
    return len(rows)


def test_trl_export_round_trips_to_the_delivered_tokens(trajectories, tokenizer, renderer, tmp_path):
    out = _export(tmp_path, trajectories, "trl")
    rows = [json.loads(x) for x in (out / "calls.jsonl").read_text().splitlines()]
    rendered = [renderer.render(t) for t in trajectories]
    assert _check_round_trip(tokenizer, rows, rendered) == sum(len(t.calls) for t in trajectories)
    # TRL format: arguments are objects, tool results are role "tool" with their call id.
    args = [tc["function"]["arguments"] for r in rows for m in r["prompt"] + r["completion"] for tc in m.get("tool_calls", [])]
    assert args and all(isinstance(a, dict) for a in args)
    assert any(m["role"] == "tool" and m["tool_call_id"] for r in rows for m in r["prompt"])
    # Assistant-only loss info: exactly one completion message, the response, flagged selected or not.
    assert all(len(r["completion"]) == 1 and r["completion"][0]["role"] == "assistant" for r in rows)


def test_tree_records_match_the_conditioning_tree(trajectories, renderer, tmp_path):
    """Per trajectory: call order, segment of each call and junctions equal the token tree's."""
    out = _export(tmp_path, trajectories, "trl")
    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [t.id for t in trajectories]
    for rec, traj in zip(records, trajectories, strict=True):
        tree = ConditioningTree.build([renderer.render(traj)])
        assert rec["call_ids"] == [c.id for c in traj.calls]
        assert rec["call_segment"] == [row.segment for row in tree.calls]
        assert rec["junctions"] == [row.call_id for row in tree.junctions(0)]
        assert len(rec["evictions"]) == len(traj.evictions)
    assert sum(r["num_segments"] > 1 for r in records) >= 2  # the demo episode and the elided SWE-agent run


def test_openai_export(trajectories, tokenizer, renderer, tmp_path):
    """Arguments as JSON strings; weight 1 on the response of a selected call, 0 on every earlier
    assistant turn; parsed back, rows without reasoning render to the delivered tokens exactly."""
    out = _export(tmp_path, trajectories, "openai")
    rows = [json.loads(x) for x in (out / "calls.jsonl").read_text().splitlines()]
    calls = [c for t in trajectories for c in t.calls]
    assert len(rows) == len(calls)
    for row, call in zip(rows, calls, strict=True):
        *ctx, resp = row["messages"]
        assert set(row) <= {"messages", "tools"}
        assert resp["role"] == "assistant" and resp["weight"] == int(call.selected)
        assert all(m["weight"] == 0 for m in ctx if m["role"] == "assistant")
        for m in row["messages"]:
            for tc in m.get("tool_calls", []):
                assert isinstance(tc["function"]["arguments"], str)
    # No reasoning in the OpenAI format: round-trip the trajectories that have none.
    plain = [t for t in trajectories if not any(m.reasoning for m in t.messages)]
    assert len(plain) >= 3
    start = {t.id: sum(len(u.calls) for u in trajectories[:i]) for i, t in enumerate(trajectories)}
    for traj in plain:
        rt = renderer.render(traj)
        for k, rc in enumerate(rt.calls):
            row = rows[start[traj.id] + k]
            msgs = [{key: v for key, v in m.items() if key != "weight"} for m in row["messages"]]
            for m in msgs:
                for tc in m.get("tool_calls", []):
                    tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
            text = tokenizer.apply_chat_template(msgs[:-1], tools=row.get("tools"), tokenize=False,
                                                 add_generation_prompt=True)
            assert tokenizer(text, add_special_tokens=False)["input_ids"] == rc.tokens[: rc.prompt_len]


def test_parquet_loads_with_datasets_and_round_trips(trajectories, tokenizer, renderer, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = _export(tmp_path, trajectories, "parquet")
    ds = datasets.load_dataset("parquet", data_files=str(out / "calls.parquet"), split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    assert len(ds) == sum(len(t.calls) for t in trajectories)
    assert {"prompt", "completion", "tools", "trajectory_id", "call_id", "segment", "selected"} <= set(ds.column_names)
    rows = [trl_row_from_parquet(r) for r in ds]
    # The loaded rows are the trl examples again, then render exactly like them.
    assert [r["prompt"] for r in rows] == [e["prompt"] for t in trajectories for e in trl_examples(t)]
    _check_round_trip(tokenizer, rows, [renderer.render(t) for t in trajectories])
    trees = datasets.load_dataset("parquet", data_files=str(out / "trajectories.parquet"), split="train",
                                  cache_dir=str(tmp_path / "hf-cache"))
    assert trees["id"] == [t.id for t in trajectories]
    assert [json.loads(e) for e in trees["evictions"]] == [trajectory_record(t)["evictions"] for t in trajectories]


def test_export_errors_are_one_line(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("")
    r = CliRunner().invoke(app, ["export", str(data), "--format", "csv", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "valid: openai, parquet, trl" in r.output
    r = CliRunner().invoke(app, ["export", str(data), "--format", "trl", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no trajectory to export" in r.output


@pytest.mark.slow
def test_trl_round_trip_on_the_218_call_session(harness_logs, tokenizer, renderer, tmp_path):
    session = "ae4a77f8-aedd-4bc1-888f-c94edc91af04"
    trajs = run_import("claude-code", [harness_logs / "claude-code" / f"{session}.jsonl"]).trajectories
    out = _export(tmp_path, trajs, "trl")
    rows = [json.loads(x) for x in (out / "calls.jsonl").read_text().splitlines()]
    assert _check_round_trip(tokenizer, rows, [renderer.render(t) for t in read_trajectories(tmp_path / "in.jsonl")]) == 221
