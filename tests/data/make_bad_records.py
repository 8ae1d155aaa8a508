"""Regenerate the bad-input corpus: one file per reject reason, named after its reason code.

    python tests/data/make_bad_records.py

Each file holds exactly one bad line; the valid base record is `base()`. Line-level damage (encoding,
truncation) is written as raw bytes.
"""

import copy
import json
from pathlib import Path

OUT = Path(__file__).parent / "bad_records"


def base():
    return {
        "schema": "memorywalker.trajectory/v1",
        "id": "bad-0",
        "messages": [
            {"id": "m0", "role": "system", "content": "sys"},
            {"id": "m1", "role": "user", "content": "question"},
            {"id": "m2", "role": "assistant", "content": "",
             "tool_calls": [{"id": "c0", "name": "search", "arguments": {"query": "q"}}]},
            {"id": "m3", "role": "tool", "content": "result", "tool_call_id": "c0", "name": "search"},
            {"id": "m4", "role": "assistant", "content": "answer"},
        ],
        "tools": [{"name": "search"}],
        "calls": [
            {"id": "k0", "context": ["m0", "m1"], "response": "m2", "finish_reason": "tool_calls",
             "context_tokens": [5, 6, 7], "response_tokens": [8, 9], "rollout_logprobs": [-0.5, -0.1]},
            {"id": "k1", "context": ["m0", "m1", "m2", "m3"], "response": "m4"},
        ],
        "evictions": [],
    }


def edit(fn):
    rec = copy.deepcopy(base())
    fn(rec)
    return (json.dumps(rec) + "\n").encode()


def main():
    cases = {
        "empty_line": b"   \n",
        "non_utf8": b'{"schema": "memorywalker.trajectory/v1", "id": "\xff\xfe"}\n',
        "bad_json": b'{"schema": "memorywalker.trajectory/v1", "id": }\n',
        "truncated_line": json.dumps(base()).encode()[:120],
        "not_an_object": b"[1, 2, 3]\n",
        "schema_version": edit(lambda r: r.update(schema="memorywalker.trajectory/v0")),
        "missing_field": edit(lambda r: r.pop("calls")),
        "wrong_type": edit(lambda r: r["messages"][0].update(role="robot")),
        "unknown_field": edit(lambda r: r.update(colour="blue")),
        "no_calls": edit(lambda r: r.update(calls=[])),
        "duplicate_message_id": edit(lambda r: r["messages"][1].update(id="m0")),
        "duplicate_call_id": edit(lambda r: r["calls"][1].update(id="k0")),
        "duplicate_tool_call_id": edit(lambda r: r["messages"][4].update(
            tool_calls=[{"id": "c0", "name": "search", "arguments": {}}])),
        "unknown_message_id": edit(lambda r: r["calls"][1]["context"].append("m9")),
        "unknown_response_id": edit(lambda r: r["calls"][1].update(response="m9")),
        "unknown_tool": edit(lambda r: r["calls"][0].update(tools=["browse"])),
        "eviction_unknown_call": edit(lambda r: r["evictions"].append({"before_call": "k7", "kind": "summarize"})),
        "eviction_unknown_message": edit(lambda r: r["evictions"].append(
            {"before_call": "k1", "kind": "prune", "removed": ["m8"]})),
        "empty_context": edit(lambda r: r["calls"][1].update(context=[])),
        "duplicate_context_message": edit(lambda r: r["calls"][1].update(context=["m0", "m1", "m1"])),
        "response_not_assistant": edit(lambda r: r["calls"][1].update(response="m3", context=["m0", "m1", "m2"])),
        "response_in_context": edit(lambda r: r["calls"][1].update(response="m2")),
        "tool_result_missing_id": edit(lambda r: r["messages"][3].pop("tool_call_id")),
        "tool_result_without_call": edit(lambda r: r["calls"][1].update(context=["m0", "m1", "m3"])),
        "partial_tokens": edit(lambda r: r["calls"][0].pop("response_tokens")),
        "token_out_of_vocab": edit(lambda r: r["calls"][0].update(response_tokens=[8, 5000])),
        "logprob_length_mismatch": edit(lambda r: r["calls"][0].update(rollout_logprobs=[-0.5])),
        "top_logprobs_length_mismatch": edit(lambda r: r["calls"][0].update(rollout_top_logprobs=[[[8, -0.5]]])),
        "invalid_logprob": edit(lambda r: r["calls"][0].update(rollout_logprobs=[-0.5, 0.7])),
        # Read with RecordLimits(max_bytes=16384) by the tests; the other records are ~1 KB.
        "record_too_large": edit(lambda r: r["messages"][1].update(content="x" * 20000)),
        "too_deep": edit(lambda r: r["messages"][2]["tool_calls"][0].update(
            arguments={"query": json.loads("[" * 150 + "]" * 150)})),
        "invalid_reward": b'{"schema": "memorywalker.trajectory/v1", "id": "bad-0", "messages": [], '
                          b'"calls": [{"id": "k", "context": ["m"], "response": "m"}], "reward": NaN}\n',
    }
    OUT.mkdir(exist_ok=True)
    for code, raw in cases.items():
        (OUT / f"{code}.jsonl").write_bytes(raw)
    (OUT.parent / "valid_record.json").write_text(json.dumps(base()) + "\n")
    print(f"wrote {len(cases)} files to {OUT}")


if __name__ == "__main__":
    main()
