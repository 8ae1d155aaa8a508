"""SWE-agent ``.traj`` files → trajectories (black-box: contexts are the recorded messages).

A step stores ``query`` (newer versions: the exact messages sent for that step) or ``messages``
(older versions: the history *after* the step, processed by the history processors). In the second
form the messages sent for step ``i`` are the messages recorded after step ``i-1`` (the processors
are a function of the history, which did not change in between); the first step's context is the
recorded messages minus its own action and observation. The response of step ``i`` is the
assistant message the step appended. Identical messages share ids, so the tree follows from the
contexts alone; where a context stops extending the previous sequence (e.g. an old observation
replaced by "Old environment output: (N lines omitted)") an inferred ``placeholder`` eviction is
recorded.
"""

from __future__ import annotations

from pathlib import Path

from memorywalker.importers.base import ContentTable, ImportOptions, ImportResult, infer_evictions, read_json
from memorywalker.importers.openai_chat import to_fields
from memorywalker.records import Lineage, Task, TrajectoryBuilder

FORMAT = "swe-agent"


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    result = ImportResult()
    for path in paths:
        for f in sorted(path.rglob("*.traj")) if path.is_dir() else [path]:
            import_file(f, result)
    return result


def delivered_contexts(steps: list[dict]) -> list[tuple[list[dict], dict]]:
    """(messages sent, response message) per step, from the recorded step messages."""
    out = []
    for i, step in enumerate(steps):
        if "query" in step:
            sent = step["query"]
            recorded = step.get("messages") or [*sent, {"role": "assistant", "content": step.get("response", "")}]
            response = recorded[len(sent)] if len(recorded) > len(sent) else {"role": "assistant",
                                                                               "content": step.get("response", "")}
        else:
            msgs = step["messages"]
            k = max(j for j, m in enumerate(msgs) if m.get("role") == "assistant")
            response = msgs[k]
            sent = steps[i - 1]["messages"] if i else msgs[:k]
        out.append((sent, response))
    return out


def import_file(path: Path, result: ImportResult) -> None:
    data = read_json(path, result)
    if data is None:
        return
    steps = data.get("trajectory") if isinstance(data, dict) else None
    if not isinstance(steps, list):
        result.read += 1
        result.reject(path, None, "bad_format", f"{path.name}: no 'trajectory' list")
        return
    info = data.get("info") or {}
    b = TrajectoryBuilder(path.stem, task=Task(id=path.stem.split("__function")[0]),
                          lineage=Lineage(source=FORMAT, source_path=str(path)),
                          meta={"exit_status": info.get("exit_status")} if info.get("exit_status") else {})
    table = ContentTable(b)
    good = []
    for i, step in enumerate(steps):
        result.read += 1
        if not isinstance(step, dict) or not (isinstance(step.get("query"), list) or isinstance(step.get("messages"), list)):
            result.reject(path, i, "missing_field", f"step {i} records neither 'query' nor 'messages'")
            continue
        if "query" not in step and not any(m.get("role") == "assistant" for m in step["messages"]):
            result.reject(path, i, "missing_field", f"step {i} has no assistant message")
            continue
        if "query" not in step and good and good[-1][0] != i - 1:
            result.reject(path, i, "missing_parent", f"step {i}: step {i - 1} is unusable, so its sent messages are unknown")
            continue
        good.append((i, step))
    pairs = delivered_contexts([s for _, s in good])
    for (i, _step), (sent, response) in zip(good, pairs, strict=True):
        context = table.context([to_fields(m) for m in sent])
        resp = to_fields(response)
        rid = table.context([*[to_fields(m) for m in sent], resp])[-1]
        b.call(context, rid, finish_reason="tool_calls" if resp.get("tool_calls") else "stop",
               meta={"step": i})
        result.imported += 1
    elided = {m.id for m in b.messages if m.content.startswith("Old environment output")}
    for m in b.messages:
        if m.id in elided:
            m.author = "harness"
    infer_evictions(b, "placeholder", elided)
    result.finish(b, path)
