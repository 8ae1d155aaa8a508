"""The tools a harness offered, where its log does not record them (``import codex|opencode --tools SPEC``).

A Codex rollout and an OpenCode database record the model's calls and their results, not the tool schemas
the harness sent with each request, so an imported context lacks the tool definitions the model saw (about
2,100 kit tokens of a 15,600-token first prompt for Codex 0.169.0) unless they are given. ``SPEC`` is either

* the name of a set shipped here (:data:`SHIPPED`): the tools a pinned harness version offered, taken
  from a gateway capture of it (``memorywalker/data/tool-sets/<name>.json`` says which capture); or
* a JSON file: a list of tools, or an object with a ``tools`` list (a request body, a gateway trajectory
  line), each tool in any of the shapes the APIs use: Chat Completions ``{"type": "function",
  "function": {...}}``, Responses ``{"type": "function", "name": ...}``, Anthropic ``{"name": ...,
  "input_schema": ...}``, or memorywalker's ``{"name", "description", "parameters"}``.

>>> s = tool_set_from_json([{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
...                         {"name": "cat", "input_schema": {"type": "object", "properties": {}}}], "t.json")
>>> [t.name for t in s.tools], s.source
(['ls', 'cat'], 'file t.json')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records import ToolSchema

SHIPPED = ("codex-0.169.0", "opencode-1.18.33")  # data/tool-sets/<name>.json
READS_TOOLS = ("codex", "opencode")  # the importers that take --tools


@dataclass(frozen=True)
class ToolSet:
    tools: list[ToolSchema]
    source: str  # "file PATH" | "shipped NAME (what it was taken from)"

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.tools}


def load_tool_set(spec: str | Path) -> ToolSet:
    """The tool set named by ``spec`` (a shipped name or a JSON file); an InputError names what is wrong."""
    spec = str(spec)
    if spec in SHIPPED:
        doc = json.loads(resources.files("memorywalker.data").joinpath(f"tool-sets/{spec}.json").read_text())
        return ToolSet(tool_set_from_json(doc, spec).tools, f"shipped {spec} ({doc['taken_from']})")
    path = Path(spec)
    if not path.is_file():
        raise InputError(f"--tools {spec}: not a file, nor a shipped tool set ({', '.join(SHIPPED)})")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"--tools {spec}: not a JSON document ({e})") from None
    return tool_set_from_json(doc, spec)


def tool_set_from_json(doc: Any, where: str) -> ToolSet:
    entries = doc.get("tools") if isinstance(doc, dict) else doc
    if not isinstance(entries, list) or not entries:
        raise InputError(f"--tools {where}: expected a non-empty list of tools, or an object with one under 'tools'")
    tools = [_schema(e, f"{where}: tools[{i}]") for i, e in enumerate(entries)]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InputError(f"--tools {where}: a tool name appears twice: {sorted({n for n in names if names.count(n) > 1})}")
    return ToolSet(tools, f"file {where}")


def _schema(entry: Any, where: str) -> ToolSchema:
    if not isinstance(entry, dict):
        raise InputError(f"--tools {where}: expected an object, got {type(entry).__name__}")
    body = entry.get("function") if isinstance(entry.get("function"), dict) else entry  # Chat Completions nests it
    name, description = body.get("name"), body.get("description", "")
    parameters = body.get("parameters", body.get("input_schema", {"type": "object", "properties": {}}))
    if not isinstance(name, str) or not name:
        raise InputError(f"--tools {where}: no tool name")
    if not isinstance(description, str) or not isinstance(parameters, dict):
        raise InputError(f"--tools {where} ({name}): description must be text and parameters an object")
    return ToolSchema(name=name, description=description, parameters=parameters)
