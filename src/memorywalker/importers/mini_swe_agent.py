"""mini-swe-agent trajectories (``mini -o FILE``; ``<instance>.traj.json`` of its batch runs) → trajectories.

Input: one JSON document per file, ``{"trajectory_format": "mini-swe-agent-1.1", "info": {...},
"messages": [...]}`` (mini-swe-agent 2.x; 1.x wrote ``mini-swe-agent-1``). ``messages`` is the agent's
whole history in chat-completions form, each with an ``extra`` field the agent keeps for itself, and a
last ``{"role": "exit"}`` entry holding the outcome.

mini-swe-agent never compresses: each model call is sent every message before it, ``extra`` left out
(``LitellmModel._prepare_messages_for_api``), so call ``t``'s context is the history up to its assistant
message and the session is one path. Two action formats: tool calls (the default ``mini.yaml``: one
``bash`` tool, results as ``tool`` messages) and text (``mini_textbased.yaml``: the command in a fenced
block of the assistant's text, the observation as the next ``user`` message). The tool's schema is not in
the file: where the session offered it (its model class, ``info.config.model_type``, is not a text-based
one), the ``bash`` tool mini-swe-agent 2.x offers (:data:`BASH_TOOL`, checked against a gateway capture of
mini-swe-agent 2.4) is recorded, and the trajectory's ``meta.tools`` says it comes from the version, not
the file. A response the agent could not parse (a format error) is a call of its own whose response no
later context holds: the agent sends its error message instead. The prompt tokens the
provider billed (``extra.response.usage.prompt_tokens`` of each assistant message) are checked as for
the other logs (:mod:`memorywalker.importers.billed`). Messages in the Responses API's item form (the
``litellm_response`` model class) are not imported: the file is rejected saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memorywalker.importers import billed
from memorywalker.importers.base import (
    ImportOptions,
    ImportResult,
    carried,
    files_under,
    import_files,
    read_json,
)
from memorywalker.importers.openai_chat import is_mini_swe_agent, to_fields
from memorywalker.records import Lineage, Task, ToolSchema, TrajectoryBuilder
from memorywalker.records.blackbox import ContentTable

FORMAT = "mini-swe-agent"
BASH_TOOL = ToolSchema(name="bash", description="Execute a bash command",
                       parameters={"type": "object", "properties": {"command": {
                           "type": "string", "description": "The bash command to execute"}}, "required": ["command"]})
_SENT = {"system", "user", "assistant", "tool"}  # the roles that reach the model; "exit" is the agent's own
_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "length": "length", "content_filter": "content_filter"}


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    files = (f for path in paths for f in ([path] if path.is_file() else files_under([path], "*.traj.json")))
    return import_files(files, import_file)


def import_file(path: Path, result: ImportResult) -> None:
    data = read_json(path, result)
    if data is None:
        return
    if not is_mini_swe_agent(data) or not isinstance(data.get("messages"), list):
        result.reject(path, None, "bad_format", f"{path.name}: not a mini-swe-agent trajectory (no "
                      "'trajectory_format': 'mini-swe-agent-…' with a 'messages' list)")
        return
    if any(isinstance(m, dict) and "role" not in m and "type" in m for m in data["messages"]):
        result.reject(path, None, "bad_format", f"{path.name}: messages in the Responses API's item form "
                      "(mini-swe-agent's litellm_response model) are not imported")
        return
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    key = path.name.removesuffix(".json").removesuffix(".traj")
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    b = TrajectoryBuilder(key, task=Task(id=key), lineage=Lineage(source=FORMAT, source_path=str(path)),
                          meta={"trajectory_format": data["trajectory_format"],
                                "mini_swe_agent_version": info.get("mini_version"),
                                "model": model.get("model_name")})
    table = ContentTable(b)
    sent: list[dict] = []
    tools = _offers_tools(config, data["messages"])
    for i, m in enumerate(data["messages"]):
        result.read += 1
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            result.reject(path, i, "missing_field", f"message {i} has no role", detail=carried(m))
            continue
        if m["role"] not in _SENT:
            if m["role"] == "exit":
                extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
                b.meta["exit_status"] = extra.get("exit_status")
                result.skipped["exit"] += 1
            else:
                result.reject(path, i, "unknown_record_type", f"message {i}: role {m['role']!r}", detail=carried(m))
            continue
        extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
        response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
        fields = to_fields(m)
        if m["role"] == "assistant":
            _call(b, table, sent, fields, response, i, tools)
        elif extra.get("interrupt_type") == "FormatError" and _message(response) is not None:
            # the response the agent could not parse: a call of its own, never sent again (the error is)
            _call(b, table, sent, to_fields({**_message(response), "role": "assistant"}), response, i, tools)
        sent.append(fields)
        result.imported += 1
    if tools:
        b.tools = [BASH_TOOL]
        b.meta["tools"] = "mini-swe-agent 2.x's bash tool (the trajectory does not store the schema it was sent)"
    billed.check_billed(b, result)
    result.finish(b, path)


def _call(b: TrajectoryBuilder, table: ContentTable, sent: list[dict], reply: dict, response: dict, index: int,
          tools: bool) -> None:
    """The call answered by ``reply`` (message ``index``), its context everything sent before it."""
    ids = table.context([*sent, reply])
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    choices = response.get("choices") if isinstance(response.get("choices"), list) else []
    choice = next(iter(choices), {})
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    meta: dict[str, Any] = {"message": index}
    model = response.get("model") if isinstance(response.get("model"), str) else None
    counted = billed.billed(usage.get("prompt_tokens"), usage.get("completion_tokens"), model)
    if counted is not None:
        meta["billed_tokens"] = counted
    b.call(ids[:-1], ids[-1], meta=meta, tools=["bash"] if tools else None,
           finish_reason=_FINISH.get(finish if isinstance(finish, str) else "", "tool_calls" if reply.get("tool_calls")
                                     else "stop"))


def _message(response: dict) -> dict | None:
    """The assistant message of a recorded API response (``choices[0].message``)."""
    choices = response.get("choices") if isinstance(response.get("choices"), list) else []
    choice = next(iter(choices), None)
    message = choice.get("message") if isinstance(choice, dict) else None
    return message if isinstance(message, dict) else None


def _offers_tools(config: dict, messages: list) -> bool:
    """Whether the session's calls offered the bash tool: its model class (``info.config.model_type``) is
    not a text-based one; without a recorded class (1.x files), whether any response called a tool."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type:
        return "textbased" not in model_type.lower()
    for m in (m for m in messages if isinstance(m, dict)):
        extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
        reply = (_message(extra["response"]) if isinstance(extra.get("response"), dict) else None) or {}
        if (m.get("role") == "assistant" and m.get("tool_calls")) or reply.get("tool_calls"):
            return True
    return False
