"""vLLM's own tool parsers against memorywalker's, on the same sampled texts (a reference that shares no code).

For every family both know (``qwen3_coder``, ``llama3_json``, ``mistral``, ``glm45``, ``deepseek_v3``,
``hermes``: vLLM's ``--tool-call-parser`` names), each response shape of test_tool_formats.py is rendered
by the family's template, and the text is given to vLLM's parser (``ToolParserManager``, with a
ChatCompletionRequest offering the tools) and to ours: the same tool names and the same arguments, and
the same text beside them (vLLM strips it). gpt-oss's harmony is read by vLLM's ``HarmonyParser`` (the
``openai`` tool parser with the ``openai_gptoss`` reasoning parser, over openai_harmony's own parser and
o200k vocabulary): the same reasoning, content and calls. Runs in the vLLM venv (``pytest -m vllm``, .ci/run).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from memorywalker.records.schema import Message, ToolCall  # noqa: E402
from memorywalker.render import Renderer  # noqa: E402
from memorywalker.render.tool_formats import exact_parse  # noqa: E402
from memorywalker.render.types import schemas_to_hf  # noqa: E402
from test_tool_formats import CONTEXT, FAMILIES, SHAPES, TOOLS, family_tokenizer  # noqa: E402


def _vllm_parser(family: str, tok, request):
    from vllm.tool_parsers import ToolParserManager

    cls = ToolParserManager.get_tool_parser(family)
    try:
        return cls(tok, request.tools)
    except TypeError:  # parsers that take only the tokenizer
        return cls(tok)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "harmony"])  # harmony: its own test, below
def test_vllm_parses_the_same_calls_from_every_shape(tokenizer, family):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tok = family_tokenizer(tokenizer, family)
    renderer, tools = Renderer(tok), schemas_to_hf(TOOLS)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Go."}], tools=tools)
    compared = 0
    for content, calls in SHAPES.values():
        if family == "llama3_json" and content:
            continue  # its template writes no text beside a call
        message = Message(id="a", role="assistant", content=content,
                          tool_calls=[ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)])
        text = renderer.response_text(CONTEXT, tools, message)
        ours, our_content, _, error = exact_parse(renderer, family, CONTEXT, tools, text, lambda: "call_0")
        theirs = _vllm_parser(family, tok, request).extract_tool_calls(text, request)
        assert error is None and theirs.tools_called, text
        assert [(c.name, c.arguments) for c in ours] == [
            (c.function.name, json.loads(c.function.arguments)) for c in theirs.tool_calls], text
        assert our_content.strip() == (theirs.content or "").strip(), text
        compared += 1
    assert compared >= 4


def test_vllm_harmony_reads_the_same_reasoning_content_and_calls(tokenizer):
    """Each single-call shape, with and without reasoning, and a final answer with reasoning, rendered by the
    harmony template; vLLM is given the text encoded by harmony's own vocabulary with the stop token the
    sampler saw (<|call|> after a call, <|return|> after an answer; the gateway strips it before parsing)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.parser.harmony_utils import get_encoding
    from vllm.parser.parser_manager import ParserManager

    tok = family_tokenizer(tokenizer, "harmony")
    renderer, tools = Renderer(tok), schemas_to_hf(TOOLS)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Go."}], tools=tools)
    harmony = ParserManager.get_parser(tool_parser_name="openai", reasoning_parser_name="openai_gptoss",
                                       enable_auto_tools=True, is_harmony=True)
    shapes = [(c, k, r) for c, k in SHAPES.values() if len(k) == 1 for r in (None, "Read it first.")]
    shapes += [("The answer is 4.", [], "Two and two.")]
    for content, calls, reasoning in shapes:
        message = Message(id="a", role="assistant", content=content, reasoning=reasoning,
                          tool_calls=[ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)])
        text = renderer.response_text(CONTEXT, tools, message)
        ours, our_content, our_reasoning, error = exact_parse(renderer, "harmony", CONTEXT, tools, text, lambda: "c0")
        ids = get_encoding().encode(text + ("<|call|>" if calls else "<|return|>"), allowed_special="all")
        their_reasoning, their_content, theirs = harmony(tok, request.tools).parse(
            text, request, enable_auto_tools=True, model_output_token_ids=ids)
        assert error is None, text
        assert [(c.name, c.arguments) for c in ours] == [(c.name, json.loads(c.arguments)) for c in theirs or []], text
        assert (our_content or None, our_reasoning) == (their_content, their_reasoning), text
    assert len(shapes) == 9
