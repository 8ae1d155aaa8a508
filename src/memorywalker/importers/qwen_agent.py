"""Qwen-Agent message lists → trajectories, replaying its input truncation.

Input: a JSON list of Qwen-Agent messages (``role`` system/user/assistant/function, ``content`` a
string or a list of ``{"text": ...}`` items, ``function_call`` {name, arguments}, optional
``reasoning_content``), a JSON list of such lists, or JSONL with one list (or ``{"messages": [...]}``)
per line. Each run of consecutive assistant messages is one call (parallel function calls are
several assistant messages of one response). Qwen-Agent prepends its default system message when
there is none and truncates every input with ``_truncate_input_messages_roughly(messages,
max_input_tokens)`` without logging it: whole turns (a user message and what follows it) are kept
newest-first while the token count fits, always keeping the system message and the latest turn.
That replay gives each call's delivered context; dropped turns are a ``truncate`` eviction.
Token counts use ``ImportOptions.count_tokens`` (Qwen-Agent uses its Qwen tokenizer; the default
here is ``len(utf-8 bytes) // 4``, so pass the real tokenizer for exact replay).
"""

from __future__ import annotations

from pathlib import Path

from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    as_text,
    content_text,
    opt_str,
    parse_arguments,
    read_json,
    read_jsonl,
    wrong_key_field,
)
from memorywalker.records import Lineage, Task, TrajectoryBuilder

FORMAT = "qwen-agent"
DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."  # qwen_agent.llm.schema
_ROLES = {"system", "user", "assistant", "function"}


def default_count_tokens(text: str) -> int:
    return len(text.encode("utf-8")) // 4


def truncate_roughly(messages: list[dict], max_tokens: int, count) -> list[int]:
    """Indices of ``messages`` kept by Qwen-Agent's ``_truncate_input_messages_roughly``.

    ``messages[0]`` is the system message. Returns the kept indices in order.
    """
    turns: list[list[int]] = []
    for i, m in enumerate(messages[1:], 1):
        if m["role"] == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    cnt = count(content_text(messages[0].get("content")))
    kept: list[int] = []
    for n, turn in enumerate(reversed(turns)):
        cost = sum(count(content_text(messages[i].get("content"))) for i in turn)
        if n == 0 or cnt + cost <= max_tokens:
            kept = turn + kept
            cnt += cost
        else:
            break
    return [0, *kept]


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    options = options or ImportOptions()
    result = ImportResult()
    for path in paths:
        for f in sorted([*path.glob("*.json"), *path.glob("*.jsonl")]) if path.is_dir() else [path]:
            if f.suffix == ".jsonl":
                lists = [(line, obj.get("messages")) for line, obj in read_jsonl(f, result)]
            else:
                data = read_json(f, result)
                if data is None:
                    continue
                if not isinstance(data, list):
                    result.reject(f, None, "bad_format", f"{f.name}: not a message list (or a list of them)")
                    continue
                lists = [(1, data)] if data and isinstance(data[0], dict) else list(enumerate(data, 1))
                result.read += len(lists)
            for k, (line, messages) in enumerate(lists):
                import_messages(messages, f, line, f"{f.stem}" + (f"-{k}" if len(lists) > 1 else ""), options, result)
    return result


def import_messages(messages, path: Path, line, traj_id: str, options: ImportOptions, result: ImportResult) -> None:
    if not isinstance(messages, list) or not all(isinstance(m, dict) and wrong_key_field(m) is None
                                                 and m.get("role") in _ROLES for m in messages):
        result.reject(path, line, "bad_format", f"{traj_id}: not a list of Qwen-Agent messages")
        return
    result.imported += 1
    count = options.count_tokens or default_count_tokens
    if not messages or messages[0]["role"] != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM_MESSAGE}, *messages]
    b = TrajectoryBuilder(traj_id, task=Task(id=traj_id), lineage=Lineage(source=FORMAT, source_path=str(path)),
                          meta={"max_input_tokens": options.max_input_tokens})
    ids: list[str] = []
    pending_calls: list[str] = []  # tool-call ids waiting for their function results
    i = 0
    prev_dropped: set[int] = set()
    while i < len(messages):
        m = messages[i]
        if m["role"] != "assistant":
            if m["role"] == "function":
                tcid = pending_calls.pop(0) if pending_calls else None
                if tcid is None:
                    result.notes["orphan_tool_results_dropped"] += 1
                    ids.append("")
                else:
                    ids.append(b.message("tool", content_text(m.get("content")), tool_call_id=tcid,
                                         name=opt_str(m.get("name")), author="environment"))
            else:
                ids.append(b.message(m["role"], content_text(m.get("content")),
                                     author="system" if m["role"] == "system" else "user"))
            i += 1
            continue
        j = i
        while j < len(messages) and messages[j]["role"] == "assistant":
            j += 1
        run = messages[i:j]
        calls = [{"id": f"{traj_id}-fc{i + k}", "name": as_text(r["function_call"].get("name")),
                  "arguments": parse_arguments(r["function_call"].get("arguments"))}
                 for k, r in enumerate(run) if isinstance(r.get("function_call"), dict)]
        resp = b.message("assistant", "".join(content_text(r.get("content")) for r in run),
                         reasoning="".join(as_text(r.get("reasoning_content")) for r in run) or None,
                         tool_calls=calls, author="model")
        kept = list(range(i))
        if options.max_input_tokens:
            kept = truncate_roughly(messages[:i], options.max_input_tokens, count)
        context = [ids[k] for k in kept if ids[k]]
        cid = b.call(context, resp, finish_reason="tool_calls" if calls else "stop")
        dropped = set(range(i)) - set(kept)
        if dropped - prev_dropped:
            b.eviction(cid, "truncate", [ids[k] for k in sorted(dropped - prev_dropped) if ids[k]],
                       trigger="budget", meta={"max_input_tokens": options.max_input_tokens, "inferred": True})
        prev_dropped = dropped
        ids += [resp] + [""] * (len(run) - 1)
        pending_calls = [c["id"] for c in calls]
        i = j
    _drop_orphans(b)
    result.finish(b, path)


def _drop_orphans(b: TrajectoryBuilder) -> None:
    """A truncated turn can start with function results whose call was cut: leave those out."""
    table = {m.id: m for m in b.messages}
    for call in b.calls:
        issued, ctx = set(), []
        for mid in call.context:
            m = table[mid]
            if m.role == "tool" and m.tool_call_id not in issued:
                continue
            issued.update(tc.id for tc in m.tool_calls)
            ctx.append(mid)
        call.context = ctx
