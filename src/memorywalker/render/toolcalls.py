"""Parse a sampled response into an assistant message with tool calls, or say why it cannot be parsed.

The kit chat template (and Qwen/Hermes-style templates) render a tool call as::

    <tool_call>
    {"name": "search", "arguments": {"query": "Velka Works"}}
    </tool_call>

A response is *well-formed* when it is ``content`` followed by zero or more such blocks and nothing
else. Arguments are kept as a dict when ``json.dumps`` reproduces the emitted text exactly (that is how
the template re-renders them), otherwise as the raw string, so the recorded message re-renders to the
very text the model sampled. A malformed response becomes a content-only message plus an error the
harness returns as an observation; parsing never raises.

>>> parse_response('Notes.\\n<tool_call>\\n{"name": "open", "arguments": {"page": "orvo"}}\\n</tool_call>')
ParsedResponse(content='Notes.\\n', tool_calls=[('open', {'page': 'orvo'})], error=None, reasoning=None)
>>> parse_response("I think it is 42.").error
'no tool call'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_BLOCK = re.compile(r'<tool_call>\n\{"name": "([^"\\]*)", "arguments": (.*?)\}\n</tool_call>', re.S)

CALL_FORMAT = '<tool_call>\n{"name": <tool name>, "arguments": {<arguments as JSON>}}\n</tool_call>'


@dataclass
class ParsedResponse:
    content: str
    # (name, arguments as recorded) per call: a dict, or the raw text when a dict would not re-render
    # byte-identically (or is not JSON at all).
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    error: str | None = None  # "no tool call" | "malformed tool call at ..." (then tool_calls is empty)
    reasoning: str | None = None  # what the format itself marks as reasoning (harmony's analysis channel)


def arguments_from_text(raw: str, loads: Callable[[str], Any] = json.loads) -> dict[str, Any] | str:
    """Tool-call arguments sent as JSON text: the dict when it is a JSON object, else the raw text
    (``loads`` may refuse hostile input with any ``ValueError``: the raw text too).

    >>> arguments_from_text('{"page": "orvo"}'), arguments_from_text('[1]'), arguments_from_text('{"page": ')
    ({'page': 'orvo'}, '[1]', '{"page": ')
    """
    try:
        value = loads(raw)
    except ValueError:  # json.JSONDecodeError is one
        return raw
    return value if isinstance(value, dict) else raw


def call_arguments(arguments: dict[str, Any] | str) -> dict[str, Any] | None:
    """The arguments to execute: the dict, the raw text parsed as a JSON object, or None if it is not one.

    >>> call_arguments('{"page":"orvo"}'), call_arguments('{"page": ')
    ({'page': 'orvo'}, None)
    """
    value = arguments if isinstance(arguments, dict) else arguments_from_text(arguments)
    return value if isinstance(value, dict) else None


def parse_response(text: str) -> ParsedResponse:
    """Split ``text`` (the response without its end-of-turn token) into content and tool calls."""
    start = text.find("<tool_call>")
    if start < 0:
        return ParsedResponse(text, [], "no tool call")
    content, pos, calls = text[:start], start, []
    while pos < len(text):
        m = _BLOCK.match(text, pos)
        if m is None:
            return ParsedResponse(text, [], f"malformed tool call at character {pos}")
        name, raw = m.group(1), m.group(2)
        calls.append((name, _arguments(raw)))
        pos = m.end()
    return ParsedResponse(content, calls, None)


def _arguments(raw: str) -> dict[str, Any] | str:
    # The template re-renders a dict with json.dumps; keep the dict only if that is byte-identical.
    value = arguments_from_text(raw)
    return value if isinstance(value, dict) and json.dumps(value, ensure_ascii=False) == raw else raw
