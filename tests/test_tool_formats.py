"""Each model family's tool-call format round-trips exactly under its chat template.

The templates are memorywalker's own (``memorywalker/data/chat-templates/``), written in each family's
documented form: Qwen3-Coder's XML parameters, Llama 3.1's JSON with ``parameters``, Mistral's
``[TOOL_CALLS]NAME[ARGS]``, GLM-4.5's ``<arg_key>``/``<arg_value>``, DeepSeek-V3's ``<｜tool▁calls▁begin｜>``
blocks, and Hermes' ``<tool_call>{json}`` (the kit's ChatML). For each, assistant messages of several
shapes are rendered by the template (what a model of that family samples), parsed by the family's
parser with the gateway's exactness rule, and must come back as the same message, re-rendering to the
same text. A response a few characters off the template's form is served as text, with the reason.
(vLLM's own parsers are compared on the same texts in test_tool_formats_vllm.py.)
"""

from __future__ import annotations

from importlib import resources

import pytest

from memorywalker.records.schema import Message, ToolCall, ToolSchema
from memorywalker.render import Renderer
from memorywalker.render.tool_formats import FORMATS, exact_parse, format_for
from memorywalker.render.types import schemas_to_hf

# family -> (template file, added special tokens, end-of-turn token)
FAMILIES = {
    "qwen3_coder": ("qwen3-coder", [], "<|im_end|>"),
    "llama3_json": ("llama3-json", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                    "<|python_tag|>"], "<|eot_id|>"),
    "mistral": ("mistral", ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]",
                            "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                            "[/SYSTEM_PROMPT]"], "</s>"),
    "glm45": ("glm45", ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"], "<|user|>"),
    "deepseek_v3": ("deepseek-v3", ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                                    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                                    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
                                    "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"],
                    "<｜end▁of▁sentence｜>"),
    "harmony": ("harmony", ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                            "<|constrain|>"], "<|return|>"),
    "hermes": (None, [], "<|im_end|>"),
}
TOOLS = [ToolSchema(name="read", description="Read a file.", parameters={
    "type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}}}),
         ToolSchema(name="write", description="Write a file.", parameters={
    "type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"},
                                     "opts": {"type": "object"}}})]
CONTEXT = [Message(id="s", role="system", content="You are terse."), Message(id="u", role="user", content="Go.")]
SHAPES = {  # name -> (content, [(tool, arguments)])
    "one call": ("", [("read", {"path": "/tmp/a b.txt"})]),
    "text first": ("Reading it.", [("read", {"path": "notes.txt", "lines": 20})]),
    "two calls": ("", [("read", {"path": "a"}), ("write", {"path": "b", "text": "x"})]),
    "nested and escaped": ("", [("write", {"path": "c.json", "text": 'line 1\nline "2" ünï\t{}',
                                           "opts": {"mode": [1, 2], "deep": {"k": None}}})]),
    "no arguments": ("", [("read", {})]),
}
# Llama 3.1's template writes no text beside a call; Qwen3-Coder's writes a value that is not an object or a
# list with Jinja's `string` (20 -> "20", which parses back as 20).


def family_tokenizer(tokenizer, family: str):
    """The kit tokenizer with the family's template, its markers as special tokens and its end-of-turn token."""
    import copy

    name, specials, eot = FAMILIES[family]
    tok = copy.deepcopy(tokenizer)
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials})
    if name is not None:
        tok.chat_template = resources.files("memorywalker.data").joinpath(f"chat-templates/{name}.jinja").read_text()
    tok.eos_token = eot
    return tok


@pytest.fixture(scope="module")
def renderers(tokenizer):
    return {f: Renderer(family_tokenizer(tokenizer, f)) for f in FAMILIES}


def _ids():
    n = iter(range(1000))
    return lambda: f"call_{next(n)}"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_rendered_response_parses_back_to_the_same_message(renderers, family, shape):
    renderer = renderers[family]
    content, calls = SHAPES[shape]
    if family == "llama3_json" and content:
        pytest.skip("Llama 3.1's template renders a tool-call turn without its text")
    if family == "harmony" and len(calls) > 1:
        pytest.skip("harmony writes one call per message and the sampler stops at its <|call|>")
    message = Message(id="a", role="assistant", content=content,
                      tool_calls=[ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)])
    tools = schemas_to_hf(TOOLS)
    text = renderer.response_text(CONTEXT, tools, message)
    assert format_for(renderer.tok.chat_template) == family
    got, got_content, _, error = exact_parse(renderer, family, CONTEXT, tools, text, _ids())
    assert error is None, (text, error)
    assert got_content == content and [(c.name, c.arguments) for c in got] == calls, text
    again = Message(id="a", role="assistant", content=got_content, tool_calls=got)
    assert renderer.response_text(CONTEXT, tools, again) == text
    assert renderer.tok(text, add_special_tokens=False)["input_ids"] == renderer.tok(
        renderer.response_text(CONTEXT, tools, again), add_special_tokens=False)["input_ids"]


def test_harmony_ends_a_response_at_its_call_or_its_answer_not_at_a_message_end(tokenizer):
    """Under harmony <|end|> closes the analysis message inside a response: the end-of-turn set is the
    tokenizer's eos <|return|> plus <|call|> (and <|endoftext|>, which the kit has), never <|end|>; under
    ChatML the same tokenizer ends a turn at <|end|> too (KNOWN_EOT). So the response of a call with
    reasoning runs through both messages: analysis, then the call, its <|call|> stripped."""
    import copy

    harmony = Renderer(family_tokenizer(tokenizer, "harmony"))
    names = set(harmony.tok.convert_ids_to_tokens(sorted(harmony.eot_ids)))
    assert names == {"<|return|>", "<|call|>", "<|endoftext|>"}
    chatml = copy.deepcopy(harmony.tok)
    chatml.chat_template = tokenizer.chat_template
    assert "<|end|>" in chatml.convert_ids_to_tokens(sorted(Renderer(chatml).eot_ids))
    message = Message(id="a", role="assistant", content="", reasoning="Look first.",
                      tool_calls=[ToolCall(id="c", name="read", arguments={"path": "a"})])
    assert harmony.response_text(CONTEXT, schemas_to_hf(TOOLS), message) == (
        '<|channel|>analysis<|message|>Look first.<|end|><|start|>assistant<|channel|>commentary '
        'to=functions.read <|constrain|>json<|message|>{"path": "a"}')


def test_a_value_the_template_writes_as_text_stays_the_text_it_was():
    """Qwen3-Coder's template writes a boolean with Jinja's ``string``: ``True``. The parse that re-renders
    is the text "True" (a typed ``True`` would too, but JSON reads "True" as no value), so an echoed turn
    is the sampled one; a model that writes ``true`` gets the boolean (``true`` parses, and re-renders
    ``True``: not exact, so the text "true" is kept)."""
    from memorywalker.render.tool_formats import parse_qwen3_coder

    text = "<tool_call>\n<function=read>\n<parameter=path>\nx\n</parameter>\n<parameter=all>\ntrue\n</parameter>\n</function>\n</tool_call>"
    typed, raw = parse_qwen3_coder(text)[:2]
    assert typed.tool_calls == [("read", {"path": "x", "all": True})]
    assert raw.tool_calls == [("read", {"path": "x", "all": "true"})]


@pytest.mark.parametrize("family,text,why", [
    ("qwen3_coder", "Look.\n<tool_call>\n<function=read>\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>",
     "do not re-render"),  # the template writes a blank line between text and a call
    ("qwen3_coder", "<tool_call>\n<function=read>\n<parameter=path>\na\n</function>\n</tool_call>", "malformed"),
    ("hermes", '<tool_call>\n{"name": "read", "arguments": {"path":"a"}}\n</tool_call>', "do not re-render"),
    ("mistral", '[TOOL_CALLS]read[ARGS]{"path": "a"', "malformed"),
    ("glm45", "<tool_call>read\n<arg_key>path</arg_key>\n</tool_call>", "malformed"),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read\n{\"path\": \"a\"}"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "malformed"),
    ("llama3_json", '{"name": "read", "parameters": {"path": "a"}} and then', "malformed"),
    ("harmony", "<|channel|>commentary to=functions.read<|message|>{\"path\": \"a\"}", "do not re-render"),
    ("harmony", "<|channel|>final<|message|>4.<|end|><|start|>assistant<|channel|>", "malformed"),
    ("harmony", "<|channel|>commentary to=browser.open <|constrain|>json<|message|>{}", "malformed"),
])
def test_a_response_off_the_template_is_served_as_text_with_the_reason(renderers, family, text, why):
    calls, content, _, error = exact_parse(renderers[family], family, CONTEXT, schemas_to_hf(TOOLS), text, _ids())
    assert (calls, content) == ([], text) and why in error


@pytest.mark.parametrize("family", list(FAMILIES))
def test_plain_text_is_text_for_every_family(renderers, family):
    assert exact_parse(renderers[family], family, CONTEXT, None, "The answer is 4.", _ids()) == ([], "The answer is 4.", None, None)


def test_the_format_comes_from_the_template_or_is_named(tokenizer, tmp_path):
    from memorywalker.errors import InputError
    from memorywalker.gateway.core import Gateway

    renderer = Renderer(family_tokenizer(tokenizer, "glm45"))
    assert Gateway(renderer, None, tmp_path, model_name="m", max_positions=64).tool_parser == "glm45"
    assert Gateway(renderer, None, tmp_path, model_name="m", max_positions=64, tool_parser="hermes").tool_parser == "hermes"
    with pytest.raises(InputError, match="--tool-parser nope: not a known tool-call format"):
        Gateway(renderer, None, tmp_path, model_name="m", max_positions=64, tool_parser="nope")
    assert set(FORMATS) == {"qwen3_coder", "glm45", "mistral", "deepseek_v3", "llama3_json", "harmony", "hermes", "text"}


@pytest.mark.parametrize("template,family", [("qwen3-coder", "qwen3_coder"), ("glm45", "glm45")])
def test_the_gateway_serves_a_model_under_another_template_and_records_which(kit, tmp_path, template, family):
    """``--chat-template NAME`` on the kit model: the scripted reply (text + a call) is rendered by that
    template, sampled as those ids, parsed back by the family's parser and served to an OpenAI client as
    a tool call; the second call (the harness echoing the turn) extends the first with no branch; both
    the journal and the trajectory name the template (with its hash) and the parser. (Mistral's and
    DeepSeek's templates end a turn with their tokenizer's own end token, which the kit's lacks: they are
    checked with their tokens, above.)"""
    import openai

    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.records import read_trajectories

    script = tmp_path / "script.yaml"
    script.write_text('steps:\n  - text: "Reading."\n    tool_calls: [{name: read, arguments: {path: "a b.txt", lines: 3}}]\n'
                      '  - text: "Done."\n')
    gw = build_gateway(str(kit[1]), f"scripted:{script}", tmp_path / "out", tokenizer=str(kit[0]), chat_template=template)
    assert gw.tool_parser == family and gw.chat_template.startswith(f"{template} sha256:")
    tools = schemas_to_hf(TOOLS)
    with BackgroundServer(gw) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x")
        messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Go."}]
        r = client.chat.completions.create(model="kit", messages=messages, tools=tools, extra_headers={"x-session-id": "s"})
        (tc,) = r.choices[0].message.tool_calls
        assert (tc.function.name, tc.function.arguments) == ("read", '{"path": "a b.txt", "lines": 3}')
        messages += [{"role": "assistant", "content": r.choices[0].message.content, "tool_calls": [tc.model_dump()]},
                     {"role": "tool", "tool_call_id": tc.id, "content": "hello"}]
        r2 = client.chat.completions.create(model="kit", messages=messages, tools=tools, extra_headers={"x-session-id": "s"})
        assert r2.choices[0].message.content == "Done."
    (traj,) = read_trajectories(tmp_path / "out" / "trajectories.jsonl")
    assert traj.meta["chat_template"] == gw.chat_template and traj.meta["tool_parser"] == family
    assert traj.meta["branches"] == {} and len(traj.calls) == 2
    first, second = traj.calls
    assert second.context_tokens[:len(first.context_tokens) + len(first.response_tokens)] == \
        first.context_tokens + first.response_tokens


def test_a_chat_template_is_a_shipped_name_or_a_jinja_file(tmp_path):
    from memorywalker.errors import InputError
    from memorywalker.render.chat_templates import NAMES, load_chat_template

    assert set(NAMES) == {"chatml", "qwen3", "qwen3-coder", "llama3-json", "mistral", "glm45", "deepseek-v3", "harmony"}
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0].content }}")
    text, label = load_chat_template(f)
    assert text == "{{ messages[0].content }}" and label.startswith(f"{f} sha256:")
    f.write_text("plain text")
    with pytest.raises(InputError, match="not a Jinja chat template"):
        load_chat_template(f)
    with pytest.raises(InputError, match="not a file, nor a shipped template"):
        load_chat_template("llama9")


REASONING_SCRIPT = ('steps:\n  - reasoning: "The notes first."\n    text: "Reading."\n'
                    '    tool_calls: [{name: read, arguments: {path: "notes.txt"}}]\n'
                    '  - reasoning: "It says hello."\n    text: "Done: hello."\n')


@pytest.fixture(params=["chatml", "harmony"])
def thinking_gateway(kit, tokenizer, tmp_path, request):
    """A model answering with a script whose steps carry reasoning: the kit model under ChatML (its template
    writes an assistant turn's reasoning as a leading <think> block: what a Qwen3-style model samples), and a
    kit model under the harmony template with harmony's special tokens (the analysis channel: gpt-oss)."""
    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.modelkit.build import build_model
    from memorywalker.records import read_trajectories

    script = tmp_path / "script.yaml"
    script.write_text(REASONING_SCRIPT)
    if request.param == "harmony":
        tok_dir, model_dir = tmp_path / "tok", tmp_path / "model"
        family_tokenizer(tokenizer, "harmony").save_pretrained(tok_dir)
        build_model(model_dir, tok_dir, max_positions=4096)
    else:
        tok_dir, model_dir = kit
    gw = build_gateway(str(model_dir), f"scripted:{script}", tmp_path / "out", tokenizer=str(tok_dir),
                       chat_template=request.param if request.param == "harmony" else None)
    assert gw.tool_parser == {"chatml": "hermes", "harmony": "harmony"}[request.param]
    server = BackgroundServer(gw)
    url = server.start()

    def stop():  # every session finalized: the trajectories, by session
        server.stop()
        return {t.meta["session"]: t for t in read_trajectories(tmp_path / "out" / "trajectories.jsonl")}

    yield url, stop
    server.stop()


def test_sampled_reasoning_reaches_claude_code_as_a_thinking_block_and_comes_back_on_the_tree(thinking_gateway):
    """Anthropic SDK, streaming and not: the sampled ``<think>`` block is a ``thinking`` block before the
    text and the tool_use; sent back in the next request (as Claude Code does), the assistant turn
    renders to the sampled ids: the second call extends the first, no branch."""
    import anthropic

    url, stop = thinking_gateway
    client = anthropic.Anthropic(base_url=url, api_key="x")
    tools = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in TOOLS]
    head = {"x-claude-code-session-id": "s"}
    messages = [{"role": "user", "content": "Go."}]
    with client.messages.stream(model="kit", max_tokens=300, messages=messages, tools=tools, extra_headers=head) as s:
        first = s.get_final_message()
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[0].thinking == "The notes first." and first.content[1].text == "Reading."
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[2].id,
                                               "content": "hello"}]}]
    second = client.messages.create(model="kit", max_tokens=300, messages=messages, tools=tools, extra_headers=head)
    assert [(b.type, getattr(b, "thinking", None)) for b in second.content][0] == ("thinking", "It says hello.")
    traj = stop()["s"]
    one, two = traj.calls
    assert traj.meta["branches"] == {} and traj.message_table()[one.response].reasoning == "The notes first."
    assert two.context_tokens[:len(one.context_tokens) + len(one.response_tokens)] == \
        one.context_tokens + one.response_tokens


def test_sampled_reasoning_reaches_codex_as_a_reasoning_item_and_its_drop_is_a_branch(thinking_gateway):
    """OpenAI Responses SDK, streaming (as Codex calls it): the reasoning is a ``reasoning`` item (its
    summary the sampled text) before the message and the function call. Codex drops reasoning between
    turns: the next request without it renders the assistant turn without the <think> block, not the
    sampled ids, and the tree records that branch (``template-drift`` before call-1, DESIGN.md); Chat
    Completions gets ``reasoning_content``."""
    import openai

    url, stop = thinking_gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    tools = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
             for t in TOOLS]
    head = {"session-id": "codex-1"}
    items = [{"role": "user", "content": "Go."}]
    with client.responses.stream(model="kit", input=items, tools=tools, extra_headers=head) as s:
        first = s.get_final_response()
    assert [o.type for o in first.output] == ["reasoning", "message", "function_call"]
    assert first.output[0].summary[0].text == "The notes first."
    call = first.output[2]
    items += [first.output[1].model_dump(exclude_none=True), call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "hello"}]  # reasoning dropped
    second = client.responses.create(model="kit", input=items, tools=tools, extra_headers=head)
    assert second.output[0].type == "reasoning" and second.output[1].content[0].text == "Done: hello."
    chat = openai.OpenAI(base_url=url + "/v1", api_key="x").chat.completions.create(
        model="kit", messages=[{"role": "user", "content": "Go."}], tools=schemas_to_hf(TOOLS),
        extra_headers={"x-session-id": "chat-1"})
    assert chat.choices[0].message.model_extra["reasoning_content"] == "The notes first."
    traj = stop()["codex-1"]
    one, two = traj.calls
    assert two.context_tokens[:len(one.context_tokens)] == one.context_tokens  # the prompt is kept ...
    assert two.context_tokens[len(one.context_tokens):][:len(one.response_tokens)] != one.response_tokens  # not the think
    assert traj.meta["branches"] == {"template-drift": 1}  # the history re-rendered otherwise than sampled
    assert [(e.kind, e.before_call) for e in traj.evictions] == [("template-drift", "call-1")]


def test_a_simulated_rollout_parses_the_templates_format(tokenizer):
    """The simulated environments (``rollout``, ``rl`` without tasks=, ``eval``) parse a sampled response
    with the template's family too: under the Qwen3-Coder template an XML-parameter call is executed
    (the answer tool: reward 1), while a Hermes-style call is malformed there and the observation shows
    the model the template's own form; the format can be named (``HarnessConfig.tool_parser``)."""
    from memorywalker.errors import InputError
    from memorywalker.records import check_trajectory
    from memorywalker.rollout import HarnessConfig, WebSearchEnv, run_episode
    from test_harness import Scripted

    tok = family_tokenizer(tokenizer, "qwen3_coder")
    env = WebSearchEnv()
    task = env.task("lookup", 0)
    hermes = f'<tool_call>\n{{"name": "answer", "arguments": {{"text": "{task.answer}"}}}}\n</tool_call>'
    xml = f"<tool_call>\n<function=answer>\n<parameter=text>\n{task.answer}\n</parameter>\n</function>\n</tool_call>"
    traj = run_episode(env, task, Scripted(tok, [hermes, xml]), tok, HarnessConfig("none"), seed=0)
    check_trajectory(traj)
    table = traj.message_table()
    assert table[traj.calls[1].context[-1]].content.startswith("Error: malformed tool call at character 0. Call a "
                                                              "tool as <tool_call>\n<function=NAME>")
    assert table[traj.calls[1].response].tool_calls[0].arguments == {"text": task.answer}
    assert traj.reward == 1.0
    with pytest.raises(InputError, match="tool_parser=nope"):
        HarnessConfig("none", tool_parser="nope")
