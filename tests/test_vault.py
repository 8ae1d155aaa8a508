"""The vault environment: graded reward, the expert under every harness, what the observations evict."""

from __future__ import annotations

import pytest

from memorywalker.rollout import (
    COMPRESSORS,
    ENVIRONMENTS,
    Environment,
    FaultConfig,
    FaultInjector,
    HarnessConfig,
    make_policy,
    rollout,
)
from memorywalker.rollout.environments.vault.env import CODES, NAMES, VaultEnv, graded_reward
from memorywalker.rollout.environments.vault.expert import VaultExpert


def test_graded_reward_is_the_fraction_of_boxes_paired_with_their_code():
    """Gold kal amber, mor teal, tis rose. 'kal amber, mor rose, tis teal': kal right, mor and tis swapped
    -> 1/3; a missing box counts as wrong ('kal amber, mor teal' -> 2/3); order does not matter, case and
    punctuation are normalized; only a box's first mention counts ('kal teal, kal amber' -> 0); codes
    without names pair nothing ('amber teal rose' -> 0)."""
    boxes, codes = ["kal", "mor", "tis"], ["amber", "teal", "rose"]
    assert graded_reward("kal amber, mor rose, tis teal", boxes, codes) == pytest.approx(1 / 3)
    assert graded_reward("kal amber, mor teal", boxes, codes) == pytest.approx(2 / 3)
    assert graded_reward("TIS rose. Kal amber; mor teal", boxes, codes) == 1.0
    assert graded_reward("kal teal, kal amber", boxes, codes) == 0.0
    assert graded_reward("amber teal rose", boxes, codes) == 0.0


def test_tasks_are_deterministic_and_split_by_group():
    env = VaultEnv(0)
    a, b = env.task("recall-3", 7), env.task("recall-3", 7)
    assert a == b and len(a.meta["boxes"]) == 3 == len(set(a.meta["boxes"]))
    assert a.answer == ", ".join(f"{b} {c}" for b, c in zip(a.meta["boxes"], a.meta["codes"], strict=True))
    splits = {env.task("recall-3", i).split for i in range(200)}
    assert splits == {"train", "valid", "test"}
    with pytest.raises(ValueError, match="unknown suite"):
        env.task("lookup", 0)


def test_observations_and_errors():
    env = VaultEnv(0)
    assert env.step("answer", {"text": "x"}).observation.startswith("Error: no episode")
    task = env.task("recall-2", 0)
    env.reset(task)
    box, code = task.meta["boxes"][0], task.meta["codes"][0]
    obs = env.step("open", {"box": box}).observation
    assert obs.splitlines()[0] == f"The label reads: {box} {code}"
    assert env.step("open", {"box": "nosuchbox"}).observation.startswith("Error: no box")
    assert env.step("open", {"page": box}).observation.startswith("Error: open needs")
    assert env.step("search", {"query": box}).observation.startswith("Error: unknown tool")
    done = env.step("answer", {"text": f"{box} {code}, {task.meta['boxes'][1]} wrong"})
    assert done.done and done.reward == 0.5


@pytest.mark.parametrize("harness", sorted(COMPRESSORS))
def test_the_expert_solves_every_task_under_every_harness(tokenizer, harness):
    """The expert reads only its context, so it succeeds exactly when its notes survive compression."""
    tok = tokenizer
    env = VaultEnv(0)
    # The default kit tokenizer spends ~300 tokens on the first prompt (the demo's, trained on this
    # environment, ~240): at 260 claude-code compacts before every act call, at 600 opencode has room for
    # two steps before it prunes.
    budget = {"claude-code": 260}.get(harness, 600)
    episodes, summary = rollout(env, VaultExpert(), tok, HarnessConfig(harness, budget=budget), suite="recall-3",
                                n=12, seed=0, split="train")
    assert summary.success == 1.0
    if harness in ("claude-code", "opencode"):  # the demo's harnesses compress every episode
        assert all(len(t.evictions) >= 2 for t in episodes)
    if harness == "opencode":  # pruning first (the budget admits two steps), then summarizing
        assert all(t.evictions[0].kind == "placeholder" and "summarize" in {e.kind for e in t.evictions}
                   for t in episodes)


def test_a_careless_expert_summarizes_only_the_newest_label_and_answers_from_its_summary(tokenizer):
    """recall-2 under claude-code compacts before each act call after the first. A careless episode's
    second summary keeps only the second box's label (no Next line: nothing left to open), so the act
    call after it answers that pair alone: reward 1/2. Under opencode nothing is summarized, so every
    episode is right. forget=0.5 makes about half the episodes careless, drawn per task: 40 episodes
    give mean reward 1 − (careless share)/2, and the same tasks get the same draws under every harness."""
    env = VaultEnv(0)
    cc = HarnessConfig("claude-code", budget=260)
    (careless,), s1 = rollout(env, VaultExpert(forget=1.0), tokenizer, cc, suite="recall-2", n=1, seed=0, split="train")
    boxes, codes = careless.task.meta["boxes"], careless.task.meta["codes"]
    summaries = [m.content for m in careless.messages if m.role == "assistant" and not m.tool_calls]
    assert summaries == [f"Notes: {boxes[0]} {codes[0]}\nNext: open {boxes[1]}", f"Notes: {boxes[1]} {codes[1]}"]
    assert careless.outcome["answer"] == f"{boxes[1]} {codes[1]}" and careless.reward == 0.5
    half, _ = rollout(env, VaultExpert(forget=0.5), tokenizer, cc, suite="recall-2", n=40, seed=0, split="train")
    share = sum(t.reward == 0.5 for t in half) / 40
    assert 0.3 < share < 0.7 and sum(t.reward for t in half) / 40 == pytest.approx(1 - share / 2)
    assert all(t.reward in (0.5, 1.0) for t in half)
    pruned, s2 = rollout(env, VaultExpert(forget=1.0), tokenizer, HarnessConfig("opencode", budget=600),
                         suite="recall-2", n=8, seed=0, split="train")
    assert s2.success == 1.0
    assert VaultExpert(forget=0.5).config() == {"name": "expert", "env": "vault", "forget": 0.5}
    with pytest.raises(ValueError, match="fraction"):
        VaultExpert(forget=1.5)


def test_make_policy_expert_follows_the_environment():
    assert isinstance(make_policy("expert", env=VaultEnv(0)), VaultExpert)
    assert ENVIRONMENTS["vault"] is VaultEnv


def test_make_policy_expert_is_never_another_environments():
    """An environment without an expert of its own raises instead of getting the web-search expert; a
    wrapped environment (fault injection) keeps its own; ``expert`` without an environment raises."""

    class NoExpert(VaultEnv):
        name = "no-expert"
        expert = Environment.expert

    with pytest.raises(ValueError, match="env 'no-expert' has no scripted expert"):
        make_policy("expert", env=NoExpert(0))
    assert isinstance(make_policy("expert", env=FaultInjector(VaultEnv(0), FaultConfig())), VaultExpert)
    with pytest.raises(ValueError, match="an environment's"):
        make_policy("expert")


def test_names_and_codes_are_single_tokens_for_a_tokenizer_trained_on_the_corpus(tmp_path):
    from transformers import AutoTokenizer

    from memorywalker.modelkit import build_tokenizer, bundled_corpus

    tok = AutoTokenizer.from_pretrained(build_tokenizer(tmp_path, bundled_corpus() + VaultEnv(0).corpus(), vocab_size=1024))
    for word in NAMES + CODES:
        assert len(tok.tokenize(" " + word)) == 1, word


def test_the_expert_reads_boxes_and_codes_from_the_context_only():
    """No ``start(task)`` state: the boxes come from the question in the context, the codes from a
    summary's notes (bel) and a label still in the context (fen), in the question's order."""
    from memorywalker.records.schema import Message
    from memorywalker.samplers.base import PolicyRequest

    def ask(*messages, purpose="act"):
        msgs = [Message(id=f"m{i}", role=role, content=text, author=author)
                for i, (role, author, text) in enumerate(messages)]
        return VaultExpert()(PolicyRequest(prompt_ids=[], messages=msgs, tools=["open", "answer"], purpose=purpose,
                                           call_index=0, seed=0)).message

    question = ("user", "user", "Report the codes of boxes fen, bel.")
    first = ask(question)
    assert first.content == "" and first.tool_calls[0].arguments == {"box": "fen"}
    summary = ("user", "harness", "Summary:\nNotes: bel rose")
    label = ("tool", "environment", "The label reads: fen sand\nIt smells of oil and old paper.")
    done = ask(question, summary, label)
    assert done.content == "Notes: fen sand, bel rose"
    assert done.tool_calls[0].name == "answer" and done.tool_calls[0].arguments == {"text": "fen sand, bel rose"}
    assert ask(question, summary, label, purpose="summarize").content == "Notes: fen sand, bel rose"
    assert ask(question, label, purpose="summarize").content == "Notes: fen sand\nNext: open bel"
    # A context without the question: nothing to open, so it answers with nothing.
    assert ask(summary).tool_calls[0].arguments == {"text": ""}
