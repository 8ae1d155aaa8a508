"""Verified rendering: S_t, role labels and targets of each call."""

from __future__ import annotations

import pytest

from memorywalker.records import ToolSchema, TrajectoryBuilder
from memorywalker.render import ROLE_ID, ROLES, Renderer, RenderOptions
from memorywalker.tree import ConditioningTree

SEARCH = ToolSchema(name="search", description="Search the web.",
                    parameters={"type": "object", "properties": {"query": {"type": "string"}}})


def tool_conversation():
    """system, user, [tool call → result] ×2, final answer; a refused proposal and a cut-off reply."""
    b = TrajectoryBuilder("conv", tools=[SEARCH])
    s, u = b.message("system", "You are an agent."), b.message("user", "Who founded Alder Works?")
    a0 = b.message("assistant", "", tool_calls=[{"id": "c0", "name": "search", "arguments": {"query": "Alder"}}])
    b.call([s, u], a0, finish_reason="tool_calls")
    o0 = b.message("tool", "page-12: founded by Mira Quell.", tool_call_id="c0", name="search")
    refused = b.message("assistant", "rm -rf /")
    b.call([s, u, a0, o0], refused, selected=False, reason="refused proposal")
    cut = b.message("assistant", "It was Mira Qu")
    b.call([s, u, a0, o0, refused], cut, finish_reason="length")
    final = b.message("assistant", "Mira Quell")
    b.call([s, u, a0, o0, refused], final)
    return b.build()


def decode_targets(tok, rc):
    return tok.decode([rc.tokens[i] for i in rc.targets])


def test_targets_are_exactly_the_selected_response_and_its_terminator(tokenizer):
    """Per call the decoded targets are the assistant turn's body + '<|im_end|>', nothing else:

    call 0: the tool call as the template writes it; call 1: refused (no targets, reason kept);
    call 2: cut off → excluded by default; call 3: 'Mira Quell<|im_end|>'. The host delimiter '\\n'
    after '<|im_end|>' is not part of S_t.
    """
    r = Renderer(tokenizer).render(tool_conversation())
    c0, c1, c2, c3 = r.calls
    assert decode_targets(tokenizer, c0) == (
        '<tool_call>\n{"name": "search", "arguments": {"query": "Alder"}}\n</tool_call><|im_end|>')
    assert c1.targets == [] and c1.reason == "not_selected: refused proposal" and not c1.selected
    assert c2.targets == [] and c2.reason == "truncated"
    assert decode_targets(tokenizer, c3) == "Mira Quell<|im_end|>"
    # Targets are exactly the response tokens: the tail of S_t from prompt_len on.
    for rc in (c0, c3):
        assert rc.targets == list(range(rc.prompt_len, len(rc.tokens)))
        assert rc.tokens[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert all(rc.roles[i] == ROLE_ID["assistant"] for i in rc.targets)
    assert r.zero_target_calls == [("call-1", "not_selected: refused proposal"), ("call-2", "truncated")]


def test_unselected_response_stays_context_and_observations_are_never_targets(tokenizer):
    r = Renderer(tokenizer).render(tool_conversation())
    c3 = r.calls[3]
    prompt = tokenizer.decode(c3.tokens[: c3.prompt_len])
    assert "rm -rf /" in prompt  # the refused proposal is context of the next call
    tool_text = tokenizer.decode([t for t, role in zip(c3.tokens, c3.roles, strict=False) if role == ROLE_ID["tool"]])
    assert "page-12: founded by Mira Quell." in tool_text
    for rc in r.calls:
        assert not any(rc.roles[i] == ROLE_ID["tool"] for i in rc.targets)
        assert all(i >= rc.prompt_len for i in rc.targets)


def test_truncated_prefix_option_supervises_without_terminator(tokenizer):
    r = Renderer(tokenizer, RenderOptions(truncated="prefix")).render(tool_conversation())
    assert decode_targets(tokenizer, r.calls[2]) == "It was Mira Qu"


def test_prompt_is_exactly_what_an_inference_server_tokenizes(tokenizer):
    traj = tool_conversation()
    r = Renderer(tokenizer).render(traj)
    from memorywalker.render import message_to_hf, tools_to_hf

    table = traj.message_table()
    for call, rc in zip(traj.calls, r.calls, strict=True):
        ids = tokenizer.apply_chat_template([message_to_hf(table[m]) for m in call.context],
                                            tools=tools_to_hf(traj, call.tools), add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        assert rc.tokens[: rc.prompt_len] == list(ids)


def test_role_labels_cover_messages_in_order(tokenizer):
    """Role runs of call 3 follow the context: system (with tools), user, assistant, tool, assistant,
    then the generation prompt ('template') and the response (assistant)."""
    rc = Renderer(tokenizer).render(tool_conversation()).calls[3]
    runs = [ROLES[rc.roles[0]]]
    for r in rc.roles[1:]:
        if ROLES[r] != runs[-1]:
            runs.append(ROLES[r])
    assert runs == ["system", "user", "assistant", "tool", "assistant", "template", "assistant"]
    assert rc.span_method == "incremental" and rc.warnings == []


def test_tool_results_keep_delivery_order(tokenizer):
    """Two parallel tool results delivered as (second, first) render in that order."""
    b = TrajectoryBuilder("par", tools=[SEARCH])
    s, u = b.message("system", "sys"), b.message("user", "q")
    a = b.message("assistant", "", tool_calls=[{"id": "x", "name": "search", "arguments": {"query": "1"}},
                                               {"id": "y", "name": "search", "arguments": {"query": "2"}}])
    b.call([s, u], a, finish_reason="tool_calls")
    rx = b.message("tool", "RESULT-X", tool_call_id="x", name="search")
    ry = b.message("tool", "RESULT-Y", tool_call_id="y", name="search")
    b.call([s, u, a, ry, rx], b.message("assistant", "done"))
    rc = Renderer(tokenizer).render(b.build()).calls[1]
    text = tokenizer.decode(rc.tokens[: rc.prompt_len])
    assert text.index("RESULT-Y") < text.index("RESULT-X")


def recorded(tokenizer, response_text="Mira Quell", finish_reason="stop"):
    b = TrajectoryBuilder("rec")
    s, u = b.message("system", "sys"), b.message("user", "who?")
    a = b.message("assistant", response_text)
    ctx_ids = tokenizer.apply_chat_template([{"role": "system", "content": "sys"}, {"role": "user", "content": "who?"}],
                                            add_generation_prompt=True, tokenize=True, return_dict=False)
    resp_ids = tokenizer("Mira Quell<|im_end|>", add_special_tokens=False)["input_ids"]
    b.call([s, u], a, context_tokens=list(ctx_ids), response_tokens=resp_ids,
           rollout_logprobs=[-0.25] * len(resp_ids), finish_reason=finish_reason)
    return b.build(), list(ctx_ids), resp_ids


def test_recorded_token_ids_win_and_carry_rollout_logprobs(tokenizer):
    traj, ctx_ids, resp_ids = recorded(tokenizer)
    rc = Renderer(tokenizer).render(traj).calls[0]
    assert rc.tokens == ctx_ids + resp_ids and rc.prompt_len == len(ctx_ids)
    assert rc.target_logprobs == [-0.25] * len(resp_ids) and rc.selected


def test_recorded_tokens_that_do_not_decode_to_the_text_are_unselected(tokenizer):
    traj, ctx_ids, resp_ids = recorded(tokenizer, response_text="Someone else")
    rc = Renderer(tokenizer).render(traj).calls[0]
    assert rc.tokens == ctx_ids + resp_ids  # recorded ids still win
    assert rc.reason == "recorded_tokens_mismatch" and rc.targets == []
    kept = Renderer(tokenizer, RenderOptions(recorded_mismatch="keep")).render(traj).calls[0]
    assert kept.selected and len(kept.targets) == len(resp_ids)


def test_template_that_rewrites_earlier_turns_branches_instead_of_failing(qwen3_tokenizer):
    """Qwen3-style templates drop the reasoning of assistant turns before the last user turn.

    Call 0's S_0 ends with '<think>..</think>' + answer; call 1 (after a new user turn) renders that
    turn without reasoning, so S_0 is not a prefix of S_1: two segments with zero evictions, and the
    branch starts right at call 0's response (the first token after '<|im_start|>assistant\\n').
    """
    b = TrajectoryBuilder("q3")
    s, u1 = b.message("system", "sys"), b.message("user", "first")
    a1 = b.message("assistant", "one", reasoning="thinking hard")
    b.call([s, u1], a1)
    u2 = b.message("user", "second")
    b.call([s, u1, a1, u2], b.message("assistant", "two"))
    r = Renderer(qwen3_tokenizer).render(b.build())
    assert all(rc.selected for rc in r.calls)
    tree = ConditioningTree.build([r])
    assert [c.segment for c in tree.calls] == [0, 1] and tree.calls[1].junction
    s0, s1 = r.calls[0].tokens, r.calls[1].tokens
    first_diff = next(i for i, (x, y) in enumerate(zip(s0, s1, strict=False)) if x != y)
    assert first_diff == r.calls[0].prompt_len


def test_tokenizer_without_chat_template_is_a_clear_error(tokenizer):
    import copy

    from memorywalker.render import RenderError

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(RenderError, match="no chat template"):
        Renderer(bare)


def test_recorded_response_may_end_on_another_end_of_turn_token(tokenizer):
    """A model that stopped on <|endoftext|> (also an end-of-turn id) instead of the template's
    <|im_end|>: the body matches, so the sampled tokens are targets, terminator included."""
    traj, ctx_ids, resp_ids = recorded(tokenizer)
    other = resp_ids[:-1] + [tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    call = traj.calls[0].model_copy(update={"response_tokens": other})
    traj = traj.model_copy(update={"calls": [call]})
    rc = Renderer(tokenizer).render(traj).calls[0]
    assert rc.selected and rc.tokens == ctx_ids + other and len(rc.targets) == len(other)
