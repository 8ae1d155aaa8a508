"""Trajectories as the datasets trainers read: one example per call, plus one tree record per trajectory.

Per-call examples are the call's delivered context and its response, so a trainer that only supports
linear sequences still conditions every response on exactly what the model saw (the ``per-call``
method); the loss belongs on the response alone.

* ``trl`` — TRL's conversational *prompt-completion* format: ``prompt`` = the delivered context,
  ``completion`` = ``[response]``, ``tools`` = the tool schemas offered to the call. Messages are the
  dicts Hugging Face chat templates take (:func:`~memorywalker.render.message_to_hf`, the same the
  renderer uses), tool-call arguments as objects. TRL trains on the completion only (its default for
  prompt-completion data).
* ``openai`` — OpenAI's chat fine-tuning format: ``messages`` = context + response with tool-call
  arguments as JSON strings, and ``weight`` on assistant messages (1 on the response of a selected
  call, 0 elsewhere), ``tools``. Nothing else is in a row; row ``k`` of the file is the call listed
  ``k``-th in the trajectory records' ``call_ids``.
* ``parquet`` — the ``trl`` rows in Parquet. Arrow needs one type per column, and the argument
  objects of different tools (and the tool schemas) have different keys, so those two are stored as
  JSON text; :func:`trl_row_from_parquet` turns a loaded row back into the ``trl`` row.

Every example also carries (``trl``/``parquet``) its ``trajectory_id``, ``call_id``, ``call_index``,
``segment``, ``junction``, ``selected``, ``reason``, ``purpose`` and ``finish_reason``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Message, Trajectory
from memorywalker.render.toolcalls import call_arguments
from memorywalker.render.types import message_to_hf, tools_to_hf
from memorywalker.tree.segments import message_segments

FORMATS = ("openai", "parquet", "trl")


def trl_examples(traj: Trajectory) -> Iterator[dict[str, Any]]:
    """One TRL prompt-completion example per call of ``traj``."""
    table = traj.message_table()
    segments = message_segments(traj)
    for i, call in enumerate(traj.calls):
        yield {
            "prompt": [message_to_hf(table[m]) for m in call.context],
            "completion": [message_to_hf(table[call.response])],
            "tools": tools_to_hf(traj, call.tools),
            **_call_fields(traj, i, segments),
        }


def openai_examples(traj: Trajectory) -> Iterator[dict[str, Any]]:
    """One OpenAI fine-tuning example per call of ``traj``."""
    table = traj.message_table()
    for call in traj.calls:
        messages = [openai_message(table[m], weight=0) for m in call.context]
        messages.append(openai_message(table[call.response], weight=int(call.selected)))
        row: dict[str, Any] = {"messages": messages}
        tools = tools_to_hf(traj, call.tools)
        if tools:
            row["tools"] = tools
        yield row


def openai_message(m: Message, *, weight: int) -> dict[str, Any]:
    """One message in OpenAI's chat format: arguments as JSON strings, ``weight`` on assistant turns.

    >>> from memorywalker.records.schema import ToolCall
    >>> openai_message(Message(id="m", role="assistant", tool_calls=[ToolCall(id="c", name="ls",
    ...                        arguments={"path": "."})]), weight=1)["tool_calls"][0]["function"]
    {'name': 'ls', 'arguments': '{"path": "."}'}
    """
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [{"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": _args_text(tc.arguments)}}
                           for tc in m.tool_calls]
    if m.role == "tool":
        d["tool_call_id"] = m.tool_call_id
        if m.name:
            d["name"] = m.name
    if m.role == "assistant":
        d["weight"] = weight
    return d


def parquet_rows(traj: Trajectory) -> Iterator[dict[str, Any]]:
    """The ``trl`` examples with tool-call arguments and tool schemas as JSON text (one Arrow type each)."""
    for ex in trl_examples(traj):
        yield {**ex, "prompt": [_args_as_text(m) for m in ex["prompt"]],
               "completion": [_args_as_text(m) for m in ex["completion"]],
               "tools": None if ex["tools"] is None else json.dumps(ex["tools"], ensure_ascii=False)}


def trl_row_from_parquet(row: dict[str, Any]) -> dict[str, Any]:
    """A row loaded from the Parquet export back as the ``trl`` example it was written from.

    Arrow fills keys a message lacks with None (``tool_calls``, ``tool_call_id``, ...); chat templates
    test ``is defined``, so those keys are dropped again, and the JSON text is parsed back.
    """
    def message(m: dict) -> dict:
        m = {k: v for k, v in m.items() if v is not None}
        if "tool_calls" in m:
            m["tool_calls"] = [{**tc, "function": {**tc["function"], "arguments": _args_value(tc["function"]["arguments"])}}
                               for tc in m["tool_calls"]]
        return m

    return {**row, "prompt": [message(m) for m in row["prompt"]], "completion": [message(m) for m in row["completion"]],
            "tools": None if row.get("tools") is None else json.loads(row["tools"])}


def trajectory_record(traj: Trajectory) -> dict[str, Any]:
    """The tree metadata of one trajectory: its calls in order, their segments, junctions and evictions."""
    segments = message_segments(traj)
    return {
        "id": traj.id,
        "source": traj.lineage.source,
        "parent": traj.lineage.parent,
        "parent_call": traj.lineage.parent_call,
        "relation": traj.lineage.relation,
        "reconstructed": bool(traj.meta.get("reconstructed")),
        "reward": traj.reward,
        "num_calls": len(traj.calls),
        "num_segments": (segments[-1] + 1) if segments else 0,
        "call_ids": [c.id for c in traj.calls],
        "call_segment": segments,
        "junctions": [c.id for i, c in enumerate(traj.calls) if i and segments[i] != segments[i - 1]],
        "evictions": [ev.model_dump(mode="json", exclude_none=True) for ev in traj.evictions],
    }


def examples(traj: Trajectory, format: str) -> Iterator[dict[str, Any]]:
    if format == "trl":
        return trl_examples(traj)
    if format == "openai":
        return openai_examples(traj)
    if format == "parquet":
        return parquet_rows(traj)
    raise InputError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")


def write_parquet(path, rows: Iterable[dict[str, Any]]) -> int:
    import pyarrow as pa  # lazy: optional dependency (the parquet extra)
    import pyarrow.parquet as pq  # lazy: optional dependency (the parquet extra)

    rows = list(rows)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)


# --- helpers ----------------------------------------------------------------------------------------

def _call_fields(traj: Trajectory, i: int, segments: list[int]) -> dict[str, Any]:
    call = traj.calls[i]
    return {"trajectory_id": traj.id, "call_id": call.id, "call_index": i, "segment": segments[i],
            "junction": bool(i and segments[i] != segments[i - 1]), "selected": call.selected,
            "reason": call.reason, "purpose": call.purpose, "finish_reason": call.finish_reason}


def _args_text(args: dict | str) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _args_value(text: str) -> dict | str:
    """Inverse of :func:`_args_text` for schema-v1 arguments (a JSON object, or a string that is not one)."""
    value = call_arguments(text)
    return text if value is None else value


def _args_as_text(m: dict) -> dict:
    if not m.get("tool_calls"):
        return m
    return {**m, "tool_calls": [{**tc, "function": {**tc["function"], "arguments": _args_text(tc["function"]["arguments"])}}
                                for tc in m["tool_calls"]]}
