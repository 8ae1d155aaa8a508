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

**Older format** (steps hold ``action``/``observation``/``response``/``thought`` and no ``query`` or
``messages``; the top-level ``history`` is the message list): calls are reconstructed from
``history``. Each assistant entry of the main agent is a call; its context is the history before it,
passed through the run's history processors (read from the run's config beside the file:
``<name>.args.yaml`` or ``args.yaml``; ``default`` and ``last_n_observations`` are known, any other
rejects the file), reduced to ``role`` and ``content`` as the model API received them. Such
trajectories are marked ``meta.reconstructed = "history"``: black-box contexts, not a recorded input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memorywalker.errors import InputError
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    carried,
    content_text,
    files_under,
    import_files,
    read_json,
    wrong_key_field,
)
from memorywalker.importers.openai_chat import to_fields
from memorywalker.records import Lineage, Task, TrajectoryBuilder
from memorywalker.records.blackbox import ContentTable, infer_evictions

FORMAT = "swe-agent"


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    return import_files(files_under(paths, "*.traj"), import_file)


def _dict_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(m, dict) for m in x)


def delivered_contexts(steps: list[dict]) -> list[tuple[list[dict], dict]]:
    """(messages sent, response message) per step, from the recorded step messages."""
    out = []
    for i, step in enumerate(steps):
        if "query" in step:
            sent = step["query"]
            recorded = step.get("messages") if isinstance(step.get("messages"), list) else []
            recorded = recorded or [*sent, {"role": "assistant", "content": step.get("response", "")}]
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
        result.reject(path, None, "bad_format", f"{path.name}: no 'trajectory' list")
        return
    if steps and isinstance(data.get("history"), list) and all(
            isinstance(s, dict) and "query" not in s and "messages" not in s for s in steps):
        import_history(path, data, result)
        return
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    b = TrajectoryBuilder(path.stem, task=Task(id=path.stem.split("__function")[0]),
                          lineage=Lineage(source=FORMAT, source_path=str(path)),
                          meta={"exit_status": info.get("exit_status")} if info.get("exit_status") else {})
    table = ContentTable(b)
    good = []
    for i, step in enumerate(steps):
        result.read += 1
        if not isinstance(step, dict) or not (_dict_list(step.get("query")) or _dict_list(step.get("messages"))):
            result.reject(path, i, "missing_field", f"step {i} records neither 'query' nor 'messages' (lists of "
                          "message objects)", detail=carried(step))
            continue
        if wrong_key_field(step) is not None:
            result.reject(path, i, "wrong_type", f"step {i}: {wrong_key_field(step)} is not text", detail=carried(step))
            continue
        if "query" in step and not _dict_list(step["query"]):
            step = {k: v for k, v in step.items() if k != "query"}  # a query that is no message list: use messages
        if "query" not in step and not any(m.get("role") == "assistant" for m in step["messages"]):
            result.reject(path, i, "missing_field", f"step {i} has no assistant message")
            continue
        if "query" not in step and good and (good[-1][0] != i - 1 or not _dict_list(good[-1][1].get("messages"))):
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
    _finish_with_placeholders(b, result, path)


# --- older format: calls reconstructed from ``history`` ---------------------------------------------

def run_config(path: Path) -> tuple[dict | None, Path | None]:
    """The run's config (``args.yaml``) beside a ``.traj`` file, if there is one."""
    import yaml  # lazy: only the older format reads YAML (importers load at CLI start)

    for cfg in (path.with_name(path.stem + ".args.yaml"), path.parent / "args.yaml"):
        if cfg.is_file():
            return yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}, cfg
    return None, None


def history_processors(config: dict | None) -> list[dict]:
    """The processors a config states, each as ``{"type": ..., **args}`` (none when there is no config)."""
    if not config:
        return []
    agent = config.get("agent") or {}
    raw = (agent.get("config") or {}).get("history_processors", agent.get("history_processors")) or []
    out = []
    for p in raw:
        p = {"type": p} if isinstance(p, str) else dict(p)
        p["type"] = {"DefaultHistoryProcessor": "default", "LastNObservations": "last_n_observations"}.get(p["type"], p["type"])
        out.append(p)
    return out


def last_n_observations(history: list[dict], n: int, polling: int = 1,
                        remove_tags: frozenset = frozenset({"remove_output"}),
                        keep_tags: frozenset = frozenset({"keep_output"})) -> list[dict]:
    """SWE-agent's ``LastNObservations``: elide every observation but the first (the instance
    template) and the last ``n`` (counted in steps of ``polling``).

    >>> h = [{"role": "user", "content": f"obs {i}\\nline"} for i in range(4)]
    >>> [m["content"] for m in last_n_observations(h, 1)]
    ['obs 0\\nline', 'Old environment output: (2 lines omitted)', 'Old environment output: (2 lines omitted)', 'obs 3\\nline']
    """
    if n <= 0:
        raise InputError("last_n_observations: n must be a positive integer")
    obs = [i for i, m in enumerate(history)
           if (m.get("message_type") == "observation" if "message_type" in m else m.get("role") == "user")
           and not m.get("is_demo")]
    omit = set(obs[1:max(0, (len(obs) // polling) * polling - n)])
    out = []
    for i, m in enumerate(history):
        tags = set(m.get("tags") or [])
        if (i not in omit or tags & keep_tags) and not tags & remove_tags:
            out.append(m)
        else:
            text = content_text(m.get("content"))
            out.append({**m, "content": f"Old environment output: ({len(text.splitlines())} lines omitted)"})
    return out


def apply_processors(history: list[dict], processors: list[dict]) -> list[dict]:
    for p in processors:
        if p["type"] == "default":
            continue
        if p["type"] == "last_n_observations":
            history = last_n_observations(history, int(p["n"]), int(p.get("polling", 1)),
                                          frozenset(p.get("always_remove_output_for_tags", {"remove_output"})),
                                          frozenset(p.get("always_keep_output_for_tags", {"keep_output"})))
            continue
        raise InputError(f"history processor {p['type']!r} is not known")
    return history


def import_history(path: Path, data: dict, result: ImportResult) -> None:
    """An older-format trajectory: one call per assistant entry of the main agent's ``history``."""
    steps, history = data["trajectory"], data["history"]
    result.read += len(steps)
    config, config_path = run_config(path)
    processors = history_processors(config)
    agents = [m.get("agent") for m in history if isinstance(m, dict)]
    main = "primary" if "primary" in agents else max(set(agents), key=agents.count, default=None)
    entries = [m for m in history if isinstance(m, dict) and m.get("agent", main) == main]
    bad = next((i for i, m in enumerate(entries) if m.get("role") not in ("system", "user", "assistant")
                or not isinstance(m.get("content", ""), str | list)), None)
    if bad is not None:
        result.reject(path, None, "bad_format", f"{path.name}: history entry {bad} has no role/content")
        return
    assistant = [i for i, m in enumerate(entries) if m["role"] == "assistant"]
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    meta = {"reconstructed": "history", "history_processors": [p["type"] for p in processors]}
    if config_path is None:
        meta["history_processors"] = "unknown: no args.yaml beside the file"
    if info.get("exit_status"):
        meta["exit_status"] = info["exit_status"]
    b = TrajectoryBuilder(path.stem, task=Task(id=path.stem.split("__")[0]),
                          lineage=Lineage(source=FORMAT, source_path=str(path)), meta=meta)
    table = ContentTable(b)
    try:
        for k, i in enumerate(assistant):
            sent = [{"role": m["role"], "content": content_text(m.get("content"))}
                    for m in apply_processors(entries[:i], processors)]
            response = {"role": "assistant", "content": content_text(entries[i].get("content"))}
            ids = table.context([*sent, response])
            b.call(ids[:-1], ids[-1], meta={"step": k})
    except (ValueError, KeyError, TypeError) as e:
        result.reject(path, None, "bad_format", f"{path.name}: {e} ({config_path})")
        return
    if len(assistant) == len(steps):
        result.imported += len(steps)
    else:  # history and steps disagree: the steps are still counted, as unusable
        result.imported += min(len(steps), len(assistant))
        for j in range(len(assistant), len(steps)):
            result.reject(path, j, "missing_field", f"step {j} has no assistant entry in 'history'")
    _finish_with_placeholders(b, result, path)


def _finish_with_placeholders(b, result, path) -> None:
    """SWE-agent's history processors replace old observations with "Old environment output: ..."
    placeholders: those messages are harness artifacts, and each first replacement is an eviction."""
    elided = {m.id for m in b.messages if m.content.startswith("Old environment output")}
    for m in b.messages:
        if m.id in elided:
            m.author = "harness"
    infer_evictions(b, "placeholder", elided)
    result.finish(b, path)
