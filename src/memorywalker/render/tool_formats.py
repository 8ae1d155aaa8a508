"""Tool-call formats of the model families people serve: each parses a sampled response into content and
tool calls, the way that family's chat template renders them.

* ``hermes``: ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`` (Hermes, Qwen2.5/3, the kit);
* ``qwen3_coder``: ``<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>``;
* ``llama3_json``: the response one JSON object ``{"name": ..., "parameters": {...}}`` (optionally after
  ``<|python_tag|>``; several joined by ``;``), Llama 3.1-3.3;
* ``mistral``: ``[TOOL_CALLS]NAME[ARGS]{...}`` per call (v11+), or ``[TOOL_CALLS][{"name", "arguments"}, ...]``;
* ``glm45``: ``<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>``;
* ``deepseek_v3``: ``<｜tool▁calls▁begin｜>``, then per call ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``
  and a ```` ```json ```` block closed by ``<｜tool▁call▁end｜>``, then ``<｜tool▁calls▁end｜>``;
* ``harmony`` (gpt-oss): messages on channels, ``<|channel|>analysis<|message|>REASONING<|end|>``, then
  ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`` (a call; the
  sampler stops at its ``<|call|>``) or ``...<|channel|>final<|message|>ANSWER``: the reasoning is the format's.

A parser is lenient about what it accepts; whether a parse is *exact* is decided by rendering it back
with the served template (:meth:`memorywalker.render.Renderer.response_text`): the gateway serves tool
calls only when the parsed message re-renders to the very text the model sampled, trying the
candidates a parser offers in order (values typed where the text is JSON, then as the raw text; the
content as sampled, then without the whitespace the template puts before the first call). A response
with no candidate that re-renders is served as text with the reason, so an echoed turn stays on the tree.

>>> [(c.content, c.tool_calls) for c in parse_qwen3_coder(
...     "Looking.\\n<tool_call>\\n<function=ls>\\n<parameter=path>\\n/tmp\\n</parameter>\\n</function>\\n</tool_call>")][:1]
[('Looking.\\n', [('ls', {'path': '/tmp'})])]
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from memorywalker.records.schema import Message, ToolCall
from memorywalker.render.toolcalls import CALL_FORMAT, ParsedResponse, arguments_from_text, parse_response

Candidates = list[ParsedResponse]


def _no_call(text: str, why: str = "no tool call") -> Candidates:
    return [ParsedResponse(text, [], why)]


def _malformed(text: str, pos: int) -> Candidates:
    return [ParsedResponse(text, [], f"malformed tool call at character {pos}")]


def _contents(content: str) -> list[str]:
    """The content as sampled, then without the whitespace a template writes before the first call."""
    out = [content]
    for cut in ("\n\n", "\n", " "):
        if content.endswith(cut) and content[:-len(cut)] not in out:
            out.append(content[:-len(cut)])
    stripped = content.strip()
    if stripped not in out:
        out.append(stripped)
    return out


def _typed(raw: str) -> Any:
    """A parameter value written as text: the JSON value when it is one, else the text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _expand(content: str, calls: list[tuple[str, list[dict[str, Any]]]], reasoning: str | None = None) -> Candidates:
    """One candidate per content variant x argument variant (each call's variants in order)."""
    n = max((len(v) for _, v in calls), default=1)
    variants = [[(name, v[min(k, len(v) - 1)]) for name, v in calls] for k in range(n)]
    return [ParsedResponse(c, list(v), None, reasoning) for c in _contents(content) for v in variants]


def parse_hermes(text: str) -> Candidates:
    parsed = parse_response(text)
    if parsed.error:
        return [parsed]
    # arguments json.dumps would write otherwise: the object first, then the text as written (a template that
    # writes a string argument verbatim re-renders it; the re-render decides)
    calls = []
    for name, args in parsed.tool_calls:
        obj = arguments_from_text(args) if isinstance(args, str) else args
        calls.append((name, [obj, args] if isinstance(args, str) and isinstance(obj, dict) else [args]))
    return _expand(parsed.content, calls)


_QWEN_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\s*(.*?)\s*</function>\s*</tool_call>\s*", re.S)
_QWEN_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*", re.S)


def _keyed_blocks(text: str, call: re.Pattern, arg: re.Pattern) -> Candidates:
    """Calls written as ``<tool_call>`` blocks matching ``call`` (group 1 the name, group 2 the body) whose
    body is a run of ``arg`` matches (group 1 a key, group 2 its value as text): Qwen3-Coder's and GLM-4.5's."""
    start = text.find("<tool_call>")
    if start < 0:
        return _no_call(text)
    pos, calls = start, []
    while pos < len(text):
        m = call.match(text, pos)
        if m is None:
            return _malformed(text, pos)
        body, args, at = m.group(2), [], 0
        while at < len(body):
            a = arg.match(body, at)
            if a is None:
                return _malformed(text, m.start(2) + at)
            args.append((a.group(1), a.group(2)))
            at = a.end()
        typed, raw = {k: _typed(v) for k, v in args}, dict(args)
        calls.append((m.group(1).strip(), [typed, raw] if typed != raw else [raw]))
        pos = m.end()
    return _expand(text[:start], calls)


def parse_qwen3_coder(text: str) -> Candidates:
    return _keyed_blocks(text, _QWEN_CALL, _QWEN_PARAM)


_GLM_CALL = re.compile(r"<tool_call>([^\n<]+)\n?(.*?)</tool_call>\s*", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.S)


def parse_glm45(text: str) -> Candidates:
    return _keyed_blocks(text, _GLM_CALL, _GLM_ARG)


_DECODER = json.JSONDecoder()


def _json_at(text: str, pos: int) -> tuple[Any, int] | None:
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError:
        return None


_PYTHON_TAG = "<|python_tag|>"


def parse_llama3_json(text: str) -> Candidates:
    body = text.strip()
    offset = len(text) - len(text.lstrip())
    if body.startswith(_PYTHON_TAG):
        body, offset = body[len(_PYTHON_TAG):], offset + len(_PYTHON_TAG)
    if not body.startswith("{"):
        return _no_call(text)
    calls, pos = [], 0
    while pos < len(body):
        got = _json_at(body, pos)
        if got is None or not isinstance(got[0], dict) or not isinstance(got[0].get("name"), str):
            return _malformed(text, offset + pos) if calls or got is not None else _no_call(text)
        obj, pos = got
        args = obj.get("parameters", obj.get("arguments", {}))
        calls.append((obj["name"], [args if isinstance(args, dict) else json.dumps(args)]))
        rest = body[pos:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        pos = len(body) - len(rest)
    return _expand("", calls)


_MISTRAL_CALL = re.compile(r"\[TOOL_CALLS\]([^\[]+)\[ARGS\]")


def parse_mistral(text: str) -> Candidates:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return _no_call(text)
    calls: list[tuple[str, list]] = []
    rest = text[start:]
    if rest.startswith("[TOOL_CALLS]["):  # the older form: one JSON list of {"name", "arguments"}
        got = _json_at(rest, len("[TOOL_CALLS]"))
        if got is None or rest[got[1]:].strip() or not isinstance(got[0], list):
            return _malformed(text, start)
        for obj in got[0]:
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return _malformed(text, start)
            calls.append((obj["name"], [obj.get("arguments", {})]))
        return _expand(text[:start], calls)
    pos = 0
    while pos < len(rest):
        m = _MISTRAL_CALL.match(rest, pos)
        if m is None:
            return _malformed(text, start + pos)
        got = _json_at(rest, m.end())
        if got is None or not isinstance(got[0], dict):
            return _malformed(text, start + m.end())
        calls.append((m.group(1), [got[0]]))
        pos = got[1]
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
    return _expand(text[:start], calls)


_DS_BEGIN, _DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(?:function)?<｜tool▁sep｜>([^\n]+)\n```json\n(.*?)\n```<｜tool▁call▁end｜>\s*",
                      re.S)


def parse_deepseek_v3(text: str) -> Candidates:
    start = text.find(_DS_BEGIN)
    if start < 0:
        return _no_call(text)
    pos, calls = start + len(_DS_BEGIN), []
    end = text.find(_DS_END, pos)
    if end < 0 or text[end + len(_DS_END):].strip():
        return _malformed(text, start)
    while pos < end:
        m = _DS_CALL.match(text, pos)
        if m is None:
            return _malformed(text, pos)
        calls.append((m.group(1), [arguments_from_text(m.group(2))]))
        pos = m.end()
    return _expand(text[:start], calls)


_HARMONY_HEADER = re.compile(r"<\|channel\|>(\w+)(?: to=([^\s<]+))? ?(?:<\|constrain\|>(\w+))?<\|message\|>")
_HARMONY_NEXT = "<|end|><|start|>assistant"


def parse_harmony(text: str) -> Candidates:
    """A harmony response (after the prompt's ``<|start|>assistant``, without its last ``<|call|>`` or
    ``<|return|>``): analysis messages are the reasoning, final and commentary messages without a recipient
    the content, a ``to=functions.NAME`` message a call with its body as the arguments.

    >>> [(c.reasoning, c.content, c.tool_calls) for c in parse_harmony(
    ...     '<|channel|>analysis<|message|>Look first.<|end|><|start|>assistant<|channel|>commentary '
    ...     'to=functions.ls <|constrain|>json<|message|>{"path": "/tmp"}')][:1]
    [('Look first.', '', [('ls', {'path': '/tmp'})])]
    """
    if not text.startswith("<|channel|>"):
        return _no_call(text)
    pos, reasoning, content, calls = 0, [], [], []
    while True:
        m = _HARMONY_HEADER.match(text, pos)
        if m is None or (m.group(2) and not m.group(2).startswith("functions.")):
            return _malformed(text, pos)
        end = text.find(_HARMONY_NEXT, m.end())
        body = text[m.end():end if end >= 0 else len(text)]
        if m.group(2):
            calls.append((m.group(2)[len("functions."):], [arguments_from_text(body)]))
        elif m.group(1) == "analysis":
            reasoning.append(body)
        elif m.group(1) in ("final", "commentary"):
            content.append(body)
        else:
            return _malformed(text, pos)
        if end < 0:
            break
        pos = end + len(_HARMONY_NEXT)
    return _expand("\n".join(content), calls, "\n".join(reasoning) if reasoning else None)


def parse_text(text: str) -> Candidates:
    """For templates with no tool-call syntax known here: the response is text."""
    return _no_call(text)


# name -> (parser, a string only that family's templates contain), most specific first
FORMATS: dict[str, tuple[Callable[[str], Candidates], str | None]] = {
    "harmony": (parse_harmony, "<|channel|>"),
    "qwen3_coder": (parse_qwen3_coder, "<function="),
    "glm45": (parse_glm45, "<arg_key>"),
    "mistral": (parse_mistral, "[TOOL_CALLS]"),
    "deepseek_v3": (parse_deepseek_v3, "tool▁calls▁begin"),
    "llama3_json": (parse_llama3_json, '"parameters": '),
    "hermes": (parse_hermes, "<tool_call>"),
    "text": (parse_text, None),
}


# How each format writes a call: the hint a simulated environment returns after a response it could not parse.
CALL_HINTS = {
    "hermes": CALL_FORMAT,
    "qwen3_coder": "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>",
    "mistral": "[TOOL_CALLS]NAME[ARGS]{<arguments as JSON>}",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{<arguments as JSON>}\n```"
                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "llama3_json": '{"name": NAME, "parameters": {<arguments as JSON>}}',
    "harmony": "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{<arguments as JSON>}",
    "text": CALL_FORMAT,
}


def format_for(chat_template: str | None) -> str:
    """The tool-call format a chat template writes (:data:`FORMATS` key), ``text`` when none is known.

    >>> format_for("{{ '<tool_call>' + tc.name + '\\n<arg_key>' }}"), format_for("{{ m.content }}")
    ('glm45', 'text')
    """
    for name, (_, marker) in FORMATS.items():
        if marker is not None and chat_template and marker in chat_template:
            return name
    return "text"


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def by_schema(candidates: Candidates, tools: list[dict[str, Any]] | None) -> Candidates:
    """``candidates`` with those whose argument values have the types the offered tools' schemas declare
    first (stably), after any whose arguments are all objects: "83700" for a string parameter, 83700 for
    an integer one.

    >>> tools = [{"function": {"name": "f", "parameters": {"properties": {"x": {"type": "string"}}}}}]
    >>> [c.tool_calls for c in by_schema([ParsedResponse("", [("f", {"x": 1})]), ParsedResponse("", [("f", {"x": "1"})])], tools)]
    [[('f', {'x': '1'})], [('f', {'x': 1})]]
    """
    props = {}
    for t in tools or []:
        fn = t.get("function", t)
        props[fn.get("name")] = (fn.get("parameters") or {}).get("properties") or {}

    def misfits(c: ParsedResponse) -> int:
        n = 0
        for name, args in c.tool_calls:
            for k, v in args.items() if isinstance(args, dict) else ():
                want = _JSON_TYPES.get((props.get(name, {}).get(k) or {}).get("type"))
                n += want is not None and (not isinstance(v, want) or (want is int and isinstance(v, bool)))
        return n

    return sorted(candidates, key=lambda c: (sum(not isinstance(a, dict) for _, a in c.tool_calls), misfits(c)))


def reasoning_splits(text: str) -> list[tuple[str, str]]:
    """(reasoning, the rest) for a response that opens with a ``<think>`` block (Qwen3, DeepSeek-R1, the kit
    templates): the variants a template may have written around it, most literal first; [] without one.

    >>> [r for r in reasoning_splits("<think>\\nplan\\n</think>\\n\\nDone.") if r[0] == "plan"]
    [('plan', '\\n\\nDone.'), ('plan', 'Done.')]
    """
    body = text.lstrip()
    end = body.find("</think>")
    if not body.startswith("<think>") or end < 0:
        return []
    inner, rest = body[len("<think>"):end], body[end + len("</think>"):]
    out: list[tuple[str, str]] = []
    for r in dict.fromkeys((inner, inner.strip("\n"), inner.strip())):
        for c in dict.fromkeys((rest, rest.lstrip("\n"), rest.lstrip())):
            out.append((r, c))
    return out


def exact_parse(renderer, fmt: str, messages: list[Message], tools: list[dict[str, Any]] | None, text: str,
                new_id: Callable[[], str], prompt: str | None = None) -> tuple[list[ToolCall], str, str | None, str | None]:
    """(tool calls, content, reasoning, error) of a sampled ``text`` after ``messages``: the first reading —
    a leading ``<think>`` block as reasoning (:func:`reasoning_splits`), then a candidate of format ``fmt``
    for the rest (with its own reasoning where the format marks one: harmony) — whose message ``renderer``
    re-renders to ``text`` exactly; else no calls, the text, no reasoning, and why (None when the response
    holds no tool call). ``prompt``: the context rendered with the generation prompt, if the caller has it."""
    rendered: Callable[[Message], str | None] | None = None  # the context's prompt, rendered once when needed

    def exact(content: str, reasoning: str | None, calls: list[ToolCall]) -> bool:
        nonlocal rendered
        rendered = rendered or renderer.response_texts(messages, tools, prompt)
        return rendered(Message(id="", role="assistant", content=content, reasoning=reasoning, tool_calls=calls)) == text

    for reasoning, rest in [*reasoning_splits(text), (None, text)]:
        candidates = by_schema(FORMATS[fmt][0](rest), tools)
        if candidates[0].error is not None:  # no tool call (or a malformed one): text, with the reasoning apart
            if reasoning is None:
                return [], text, None, None if candidates[0].error == "no tool call" else candidates[0].error
            if candidates[0].error == "no tool call" and exact(rest, reasoning, []):
                return [], rest, reasoning, None
            continue
        usable = [c for c in candidates if all(isinstance(a, dict) for _, a in c.tool_calls)]
        for c in usable:
            calls = [ToolCall(id=new_id(), name=n, arguments=a) for n, a in c.tool_calls]
            said = c.reasoning if c.reasoning is not None else reasoning
            if exact(c.content, said, calls):
                return calls, c.content, said, None
        if reasoning is None:
            if not usable:
                return [], text, None, "tool-call arguments are not a JSON object"
            what = "tool calls" if candidates[0].tool_calls else "messages"
            return [], text, None, (f"the {fmt} {what} parsed from the response do not re-render to the "
                                    "sampled text under the served template")
    raise AssertionError("unreachable: the reading without reasoning always returns")
